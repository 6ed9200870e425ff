"""The release machinery without SGLang: pins, failure reporting, shims, subprocess hygiene."""

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sglab.sglang import install, releases
from sglab.sglang.bootstrap import shims_needed
from sglab.sglang.releases import PINNED
from sglab.sglang.runner import run_probe
from sglab.sglang.bootstrap import plan
from sglab.sglang.releases import worker_env as _env
from sglab.sglang.runner import _spawn
from tests.sglang import TRITON_STUB


REPO = Path(__file__).resolve().parents[2]


def test_makefile_installs_exactly_the_pinned_releases():
    text = (REPO / "Makefile").read_text()
    listed = re.search(r"^SGLANG_RELEASES\s*:=\s*(.+)$", text, re.M).group(1).split()
    assert tuple(listed) == PINNED


def test_cpu_constraints_pin_torch():
    lines = [
        ln.strip() for ln in (REPO / "constraints" / "cpu.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines == ["torch==2.13.0"]


def test_every_pinned_release_has_a_dependency_set():
    for v in PINNED:
        assert v in releases.DEP_SETS[releases.dep_set(v)][0]
    assert releases.parse_version("0.5.12.post1") > releases.parse_version("0.5.12")
    with pytest.raises(ValueError, match="not a release version"):
        releases.parse_version("0.5.x")


def test_parse_version_compares_releases_and_refuses_other_forms():
    from packaging.version import Version

    got = sorted(["0.5.10", "0.5.9", "0.5.10.post1", "1.0.0"], key=releases.parse_version)
    assert got == ["0.5.9", "0.5.10", "0.5.10.post1", "1.0.0"]
    assert releases.parse_version("0.5.20") == Version("0.5.20")
    for bad in ("0.5.12rc1", "0.5.12.dev0", "0.5.12+cu130", "v0.5.12", "0.5", "0.5.12-post1", "x"):
        with pytest.raises(ValueError, match=re.escape(f"not a release version: '{bad}'")):
            releases.parse_version(bad)
    assert releases.dep_set("0.5.19") == "0.5.1x" and releases.dep_set("0.5.21") == "0.5.2x"


METADATA = """Name: sglang
Version: 0.5.17
Requires-Dist: apache-tvm-ffi==0.1.11
Requires-Dist: av==16.1.0; sys_platform == "linux" and (platform_machine == "aarch64" or \
platform_machine == "arm64" or platform_machine == "armv7l")
Requires-Dist: flashinfer_python[cu13]==0.6.15.post1
Requires-Dist: torchcodec==0.11.1; sys_platform != "linux" or (sys_platform == "linux" and \
platform_machine != "aarch64" and platform_machine != "arm64" and platform_machine != "armv7l")
Requires-Dist: numpy
Requires-Dist: Pillow>=10,<12
Requires-Dist: pytest==8.0; extra == "test"
Requires-Dist: torch==2.11.0
"""


def test_pins_evaluate_markers_for_linux_x86_64():
    """0.5.17 pins av on ARM only: it is not a pin of the GPU image's platform."""
    assert releases.pins(METADATA) == {
        "apache-tvm-ffi": "0.1.11", "flashinfer-python": "0.6.15.post1", "torchcodec": "0.11.1",
        "torch": "2.11.0"
    }
    arm = {**releases.LINUX_X86_64, "platform_machine": "aarch64"}
    assert set(releases.pins(METADATA,
                             arm)) == {"apache-tvm-ffi", "flashinfer-python", "av", "torch"}


def test_a_release_pins_read_from_its_dist_info(tmp_path):
    from sglab.sglang.engine.release import ReleaseEnv, release_pins

    info = tmp_path / "sglang-0.5.17.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(METADATA)
    pins = release_pins(ReleaseEnv("0.5.17", (tmp_path,)))
    assert "av" not in pins and pins["torchcodec"] == "0.11.1"


def test_release_that_is_not_installed_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path))
    r = run_probe("0.5.11", "sglab.pcg_gate.sglang:probe")
    assert r.status == "not-run" and not r.ok
    assert r.reason == "sglang 0.5.11: not installed (run `sglab real install --releases 0.5.11`)"
    assert r.rows.empty


def _pip_fails(monkeypatch):
    """pip writes a file into its target, then fails with its own error line."""

    def pip_install(target, requirements, **_):
        (Path(target) / "half.py").write_text("")
        raise install.PipError(f"ERROR: No matching distribution found for {list(requirements)[0]}")

    monkeypatch.setattr(install, "pip_install", pip_install)


def test_failed_install_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path / "home"))
    _pip_fails(monkeypatch)
    lines = []
    outcomes = install.install(["0.5.11"], echo=lines.append)
    assert [o.status for o in outcomes] == ["failed", "failed"]  # its dependency set, the release
    assert lines[1] == ("sglang 0.5.11: install failed: ERROR: No matching distribution found for "
                        "sglang==0.5.11")
    assert "\n" not in "".join(lines)
    assert not releases.release_dir("0.5.11").exists()
    # no half-installed temporary folder
    assert not any((tmp_path / "home" / "releases").iterdir())


def test_sglab_real_install_says_a_failure_on_stderr_and_exits_1(tmp_path, monkeypatch, capsys):
    from sglab.tools import cli

    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path / "home"))
    _pip_fails(monkeypatch)
    code = cli.main(["real", "install", "--releases", "9.9.9"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "sglang 9.9.9: install failed: ERROR: No matching distribution found for sglang==9.9.9" \
        in err
    assert "install failed" not in out and ", 2 failed;" in out  # its dependency set and itself


def _fake_release(home: Path, version: str, init: str) -> None:
    """A stamped release whose sglang package runs ``init``, and a stamped dependency set."""
    pkg = home / "releases" / version / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    (pkg.parent / releases.STAMP).write_text("{}")
    deps = home / "deps" / releases.dep_set(version)
    deps.mkdir(parents=True)
    (deps / releases.STAMP).write_text("{}")


def test_release_that_does_not_import_is_not_run_with_the_cause(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path))
    _fake_release(tmp_path, "9.9.9", "import sglang_missing_dependency\n")
    (tmp_path / "releases" / "9.9.9" / "sglang" / "_triton_stub.py").write_text(TRITON_STUB)
    r = run_probe("9.9.9", "sglab.swa_loc.sglang:probe", timeout=120)
    assert r.status == "not-run"
    assert r.reason.startswith("sglang 9.9.9: import sglang.srt.mem_cache.swa_memory_pool failed: "
                               "ModuleNotFoundError: No module named 'sglang_missing_dependency'")


def test_plan_per_machine():
    cpu = {
        "triton": "not installed", "torchvision": "ModuleNotFoundError",
        "sgl_kernel": "ModuleNotFoundError", "cuda": False
    }
    assert plan("0.5.10.post1", cpu) == ["triton", "torchvision", "sgl_kernel.kvcacheio"]
    assert plan("0.5.11", cpu) == ["triton", "torchvision"]
    gpu = {
        "triton": None, "torchvision": None, "sgl_kernel": "ImportError: undefined symbol",
        "cuda": True
    }
    assert plan("0.5.10.post1", gpu) == plan("0.5.23", gpu) == ["sgl_kernel"]
    assert plan("0.5.23", {**gpu, "sgl_kernel": None}) == []


def test_shims_needed_here_match_a_fresh_interpreter():
    import importlib.util

    names = shims_needed("0.5.11")
    assert ("triton" in names) == (importlib.util.find_spec("triton") is None)


def test_the_machine_facts_are_asked_once_until_a_package_folder_changes(tmp_path, monkeypatch):
    """A fresh interpreter imports torch to answer; the answer is kept beside the releases and
    asked again only when what it rests on changes (here: a package added to a folder it imports
    from)."""
    import os

    from sglab.sglang import bootstrap

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(bootstrap, "home", lambda: tmp_path / "home")
    monkeypatch.setattr("site.getsitepackages", lambda: [str(site)])
    asked = []
    monkeypatch.setattr(bootstrap, "facts_in_subprocess",
                        lambda: asked.append(1) or {"triton": None, "cuda": False})

    def facts():
        bootstrap._facts.cache_clear()
        return bootstrap._facts()

    assert facts() == facts() == {"triton": None, "cuda": False}
    assert len(asked) == 1 and (tmp_path / "home" / bootstrap.FACTS_FILE).is_file()
    (site / "torchvision").mkdir()
    os.utime(site, ns=(0, os.stat(site).st_mtime_ns + 10**9))  # (coarse clocks)
    facts()
    assert len(asked) == 2
    (tmp_path / "home" / bootstrap.FACTS_FILE).write_text("{half written")
    assert facts() == {"triton": None, "cuda": False} and len(asked) == 3
    bootstrap._facts.cache_clear()


def test_a_machine_without_gpu_device_files_answers_without_importing_torch():
    """Each release worker asks these facts first: where no GPU device file exists, CUDA is
    answered absent without the second or more that importing torch costs."""
    got = _in_subprocess("""
import json, sys
from sglab.core import hardware
hardware.no_gpu_device = lambda dev="/dev": True
from sglab.sglang import bootstrap
facts = bootstrap.machine_facts()
print(json.dumps({"cuda": facts["cuda"], "torch": "torch" in sys.modules}))
""")
    assert got == {"cuda": False, "torch": False}


def _in_subprocess(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sgl_kernel_stub_raises_when_called_and_weak_ref_returns_its_argument():
    got = _in_subprocess("""
import json, torch
from sglab.sglang import bootstrap as shims
shims.install_sgl_kernel_stub("ImportError: test")
from sgl_kernel import weak_ref_tensor, rmsnorm
from sgl_kernel.kvcacheio import transfer_kv_all_layer
t = torch.ones(2)
out = {"same": weak_ref_tensor(t) is t}
for name, fn in (("rmsnorm", rmsnorm), ("kvcacheio", transfer_kv_all_layer)):
    try:
        fn(t); out[name] = "returned"
    except shims.StubCalled as e:
        out[name] = str(e)
try:
    import sgl_kernel.scalar_type; out["scalar_type"] = "served"
except ImportError:
    out["scalar_type"] = "ImportError"
print(json.dumps(out))
""")
    assert got["same"] is True
    assert got["rmsnorm"].startswith("sgl_kernel.rmsnorm is a stub installed by "
                                     "sglab.sglang.bootstrap")
    assert "ImportError: test" in got["kvcacheio"]
    assert got["scalar_type"] == "ImportError"


def test_kvcacheio_stub_serves_only_kvcacheio():
    got = _in_subprocess("""
import json
from sglab.sglang import bootstrap as shims
shims.install_kvcacheio_stub("ModuleNotFoundError: test")
from sgl_kernel.kvcacheio import transfer_kv_per_layer
out = {}
for name in ("sgl_kernel.elementwise", "sgl_kernel.scalar_type"):
    try:
        __import__(name); out[name] = "served"
    except ImportError:
        out[name] = "ImportError"
try:
    from sgl_kernel import rmsnorm; out["rmsnorm"] = "served"
except ImportError:
    out["rmsnorm"] = "ImportError"
print(json.dumps(out))
""")
    assert got == {
        "sgl_kernel.elementwise": "ImportError", "sgl_kernel.scalar_type": "ImportError",
        "rmsnorm": "ImportError"
    }


def test_torchvision_stand_in_has_constants_and_raises_on_use():
    got = _in_subprocess("""
import json
from sglab.sglang import bootstrap as shims
shims.install_torchvision_absent("ModuleNotFoundError: test")
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.io import decode_jpeg
out = {"version": torchvision.__version__, "constant": repr(InterpolationMode.BILINEAR)}
for name, fn in (("decode_jpeg", lambda: decode_jpeg(b"")), ("class", lambda: InterpolationMode())):
    try:
        fn(); out[name] = "returned"
    except shims.StubCalled:
        out[name] = "StubCalled"
print(json.dumps(out))
""")
    assert got == {
        "version": "0.0+sglab.stub",
        "constant": "<stub torchvision.transforms.InterpolationMode.BILINEAR>",
        "decode_jpeg": "StubCalled", "class": "StubCalled"
    }


def test_timeout_kills_the_whole_process_group():
    mark = f"sglab-group-{uuid.uuid4().hex}"  # other tests' sleepers run beside this one
    t0 = time.perf_counter()
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import "
            f"time; time.sleep(60)  # {mark}']); time.sleep(60)  # {mark}")
    rc, _ = _spawn([sys.executable, "-c", f"import sys; sys.stderr.write('x'); {code}"], timeout=3)
    assert rc is None and time.perf_counter() - t0 < 20
    left = ["?"]
    for _ in range(50):  # a killed process leaves the table a moment after the signal
        left = subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert left == []


def test_sglab_real_gpu_is_retired_in_one_line(capsys):
    from sglab.tools import cli

    assert cli.main(["real", "gpu", "--fix", "swa_loc"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("sglab real gpu: retired; the real engine") and "sglab engine" in err
