"""The set-up as a reader meets it: every path the scripts and the docs name is in the checkout."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
# what the scripts run and the docs point at
NAMING = ("Makefile", ".ci/run", "README.md", "scripts/*.sh", "docs/*.md")
# a repository path: one of the checkout's top folders, then the rest of the path
PATH = re.compile(r"(?<![\w./-])((?:tests|scripts|lib|data|notebooks|docs|constraints|\.ci)/"
                  r"[\w./<>*{}$…-]*)")
# placeholders: `tests/<fix>/`, `data/upstream/*/`, `data/runs/$e`, `notebooks/NN_<fix>.py`
PLACEHOLDER = re.compile(r"[<>*{}$…]|NN_")
GENERATED = ("data/runs",)  # written by a run, git-ignored
ELSEWHERE = ("data/include", "data/csrc", "data/spdlog")  # FlashInfer's data folders, not ours


def _named(text: str) -> set[str]:
    """The repository paths a text names, less placeholders and trailing punctuation."""
    out = set()
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".,:;")
        if not PLACEHOLDER.search(p):
            out.add(p)
    return out


def _missing(root: Path = ROOT) -> list[str]:
    """``file: path`` for every path a script or doc names that the checkout does not have."""
    out = []
    for pattern in NAMING:
        for f in sorted(root.glob(pattern)):
            for p in sorted(_named(f.read_text(encoding="utf-8"))):
                p = p.rstrip("/")
                if p in ELSEWHERE or p.startswith(GENERATED) or (root / p).exists():
                    continue
                out.append(f"{f.relative_to(root)}: {p}")
    return out


def test_every_path_the_scripts_and_docs_name_exists():
    assert _missing() == []


def test_a_moved_path_is_found(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tests" / "sglang").mkdir(parents=True)
    (tmp_path / "tests" / "sglang" / "test_gpu.py").write_text("")
    (tmp_path / "scripts" / "a.sh").write_text(
        "pytest -m gpu tests/test_real_gpu.py tests/sglang/test_gpu.py\n"
        "ls tests/<fix>/ data/runs/x.csv data/upstream/*/pr*.json $OUT/tests/x\n")
    assert _missing(tmp_path) == ["scripts/a.sh: tests/test_real_gpu.py"]
    assert _named("see `lib/sglab/core/kernels.py`.") == {"lib/sglab/core/kernels.py"}


def _extras() -> dict[str, list[str]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def test_no_extra_brings_another_torch():
    """No extra names torch or SGLang (whose dependencies pin a CUDA torch), and the ``gpu`` extra,
    which ``make lab`` installs beside any torch, names nothing a CUDA build of torch pins."""
    extras = _extras()
    assert "sglang" not in extras
    named = {e: {_name(r) for r in reqs} for e, reqs in extras.items()}
    assert not [e for e, names in named.items() if names & {"torch", "sglang"}]
    # CUDA builds of torch pin cuda-toolkit's libraries (nvidia-cuda-cupti, nvidia-cublas, ...)
    pinned = ("cuda-toolkit", "nvidia-cu", "nvidia-nccl", "nvidia-nv")
    assert not [n for n in named["gpu"] if n.startswith(pinned)], named["gpu"]


def test_the_cupti_extra_brings_nsight_pythons_cupti_backend():
    extras = _extras()
    assert "nsight-python>=1.1" in extras["gpu"]  # the first release with the CUPTI backend
    assert {
        "sglab[gpu]", "nsight-python[cupti]>=1.1", "cupti-python>=13.4", "nvidia-cuda-cupti>=13.4"
    } <= set(extras["cupti"])


def _dry_run(*args: str, tmp: Path, target: str = "") -> str:
    """``make -n -B`` of ``target`` (default: the package's stamp) in a venv under ``tmp``: every
    recipe line the set-up would run, none run (without uv unless ``args`` name one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    venv = tmp / "venv"
    p = subprocess.run([
        "make", "-n", "-B", f"VENV={venv}", f"SGLANG_HOME={tmp}/sglang", "UV=", *args, target
        or f"{venv}/.sglab-exec-test"
    ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_package_installs_with_the_venvs_torch_pinned(tmp_path):
    out = _dry_run(tmp=tmp_path)
    pin = f"{tmp_path}/venv/torch-pin.txt"
    assert f"> {pin}" in out
    assert f'pip install -q -c {pin} -e ".[exec,test]"' in out


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_the_cpu_build_of_torch_comes_from_torch_index(tmp_path):
    """Where the venv has no torch: the CPU build from ``TORCH_INDEX`` (PyTorch's CPU index unless
    set) where it answers, else pip as configured, with a line that says so; ``TORCH_INDEX=`` asks
    no index."""
    for index in (CPU_INDEX, "https://mirror.example/whl/cpu"):
        out = _dry_run(*([] if index == CPU_INDEX else [f"TORCH_INDEX={index}"]), tmp=tmp_path)
        assert f'scripts/index_reachable.py "{index}"' in out
        assert f'pip install -q --index-url "{index}" "torch==2.13.0"' in out
        assert f"{index} does not answer here ($why)" in out
    out = _dry_run("TORCH_INDEX=", tmp=tmp_path)
    assert "--index-url" not in out and "index_reachable" not in out
    assert "TORCH_INDEX is empty: torch==2.13.0 as pip is configured" in out


@pytest.fixture
def index():
    """A package index on 127.0.0.1 with a page for torch only; yields its address."""
    import http.server
    import threading

    class Pages(http.server.BaseHTTPRequestHandler):

        def do_GET(self):
            self.send_response(200 if self.path == "/simple/torch/" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/index_reachable.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


def test_the_probe_says_whether_an_index_serves_torch(index, tmp_path):
    assert _probe(f"{index}/simple").returncode == 0
    assert _probe(f"{index}/simple/").returncode == 0
    p = _probe(f"{index}/other")
    assert (p.returncode, p.stdout) == (1, f"{index}/other/torch/ answered HTTP 404\n")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    p = _probe(f"http://127.0.0.1:{closed}/simple")
    assert p.returncode == 1 and p.stdout.strip() == "Connection refused"
    (tmp_path / "torch").mkdir()
    assert _probe(tmp_path.as_uri()).returncode == 0
    assert _probe((tmp_path / "torch").as_uri()).returncode == 1
    p = _probe("pypi")
    assert p.returncode == 2 and p.stderr.startswith("usage: index_reachable.py URL")


def _stages(out: str) -> list[str]:
    """The set-up's stage lines, as ``make -n`` prints the ``echo`` commands that write them."""
    return re.findall(r'echo "set-up: ([\w\[\], ]+?):', out)


def test_each_set_up_stage_says_what_it_does(tmp_path):
    out = _dry_run("UV=", tmp=tmp_path, target="test")
    # a stage of each stamp (`make test` installs the browser's extra beside the package's)
    assert list(dict.fromkeys(_stages(out))) == [
        "venv", "torch", "sglab[exec,test,browser]", "sglab[exec,test]", "SGLang releases",
        "hunk wheels"
    ]
    assert f"set-up: venv: {tmp_path}/venv from python3 (python -m venv)" in out


def test_uv_makes_the_venv_and_installs_the_package_where_it_is(tmp_path):
    venv, pin = tmp_path / "venv", tmp_path / "venv" / "torch-pin.txt"
    plain = _dry_run("UV=", tmp=tmp_path)
    assert "uv venv" not in plain and "uv pip" not in plain
    assert f"python3 -m venv {venv}" in plain
    assert f"{venv}/bin/python -m pip install -q --upgrade pip" in plain
    out = _dry_run("UV=/opt/uv/bin/uv", tmp=tmp_path)
    assert f"/opt/uv/bin/uv venv -q --seed --allow-existing --python python3 {venv}" in out
    assert "--upgrade pip" not in out  # uv seeds a current pip
    # torch still through pip (uv sees neither pip's find-links nor the system's torch) ...
    assert f'{venv}/bin/python -m pip install -q "torch==2.13.0"' in out
    # ... the package through uv, with the venv's torch pinned, unless the venv sees the system's
    assert (f"/opt/uv/bin/uv pip install -q --python {venv}/bin/python -c {pin} "
            f'-e ".[exec,test]"') in out
    assert f'grep -q "^include-system-site-packages = true" {venv}/pyvenv.cfg' in out
    assert "the package and its extras (pip: uv does not see the system's torch)" in out
