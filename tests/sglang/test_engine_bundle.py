"""The engine bundles' file selection (scripts/engine_bundle.py) on small stand-in wheels, and the
size check."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import engine_bundle as wh  # noqa: E402


pytestmark = pytest.mark.long(60)


def _wheel(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def _members(tar_xz: Path) -> dict:
    with lzma.open(tar_xz) as xz, tarfile.open(fileobj=xz) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers()}


KERNEL = {
    "sgl_kernel/__init__.py": b"x",
    "sgl_kernel/load_utils.py": b"x",
    "sgl_kernel/quantization/gguf.py": b"x",
    "sgl_kernel/flash_ops.abi3.so": b"big",
    "sgl_kernel/sm100/common_ops.abi3.so": b"blackwell",
    "sgl_kernel/sm90/common_ops.abi3.so": b"hopper",
    "sgl_kernel/flashmla_ops.abi3.so": b"small",
    "sgl_kernel/spatial_ops.abi3.so": b"small",
    "lib/mscclpp.so.0.6.0": b"x",
    "lib/libmscclpp_static.a": b"x",
    "lib64/cmake/dlpack/dlpackConfig.cmake": b"x",
    "include/mscclpp/core.hpp": b"x",
    "_mscclpp.cpython-310-x86_64-linux-gnu.so": b"x",
    "deep_gemm/__init__.py": b"x",
    "deep_gemm/deep_gemm_cpp.abi3.so": b"x",
    "deep_gemm/include/cute/arch/mma_sm90.hpp": b"x",
    "triton_kernels/matmul_ogs.py": b"x",
    "sglang_kernel-0.4.3.dist-info/METADATA": b"Name: sglang-kernel\n",
}
FLASHINFER = {
    "flashinfer/__init__.py": b"x",
    "flashinfer/norm/__init__.py": b"x",
    "flashinfer/data/include/a.cuh": b"x",
    "flashinfer/data/csrc/norm.cu": b"x",
    "flashinfer/data/spdlog/include/spdlog.h": b"x",
    "flashinfer/data/cutlass/include/cutlass.h": b"x",
    "flashinfer/data/cccl/cub/cub.cuh": b"x",
    "build_backend.py": b"x",
    "flashinfer_python-0.6.12.dist-info/METADATA": b"Name: flashinfer-python\n",
}
SGLANG = {
    "sglang/__init__.py": b"x",
    "sglang/srt/server_args.py": b"x",
    "sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so": b"x",
    "sglang/srt/x.so.1": b"x",
    "sglang-0.5.13.dist-info/METADATA": (
        b"Name: sglang\nVersion: 0.5.13\nRequires-Dist: torch==2.11.0\nRequires-Dist: "
        b"sglang-kernel==0.4.3\n"
        b"Requires-Dist: flashinfer_python[cu13]==0.6.12\nRequires-Dist: transformers==5.8.1\n"
        b'Requires-Dist: numpy\nRequires-Dist: pytest==8.0; extra == "test"\n'
        # 0.5.17's platform pins: av on ARM only, torchcodec elsewhere
        b'Requires-Dist: av==16.1.0; sys_platform == "linux" and (platform_machine == "aarch64" or '
        b'platform_machine == "arm64")\nRequires-Dist: torchcodec==0.11.1; sys_platform != "linux" '
        b'or (sys_platform == "linux" and platform_machine != "aarch64")\n'),
}


def test_kernel_layer_keeps_python_sm90_and_small_ops(tmp_path):
    out = tmp_path / "k.tar.xz"
    n, _ = wh.layer(out, [("kernel", _wheel(tmp_path / "k.whl", KERNEL))])
    got = set(_members(out))
    assert got == {
        "sgl_kernel/__init__.py",
        "sgl_kernel/load_utils.py",
        "sgl_kernel/quantization/gguf.py",
        "sgl_kernel/sm90/common_ops.abi3.so",
        "sgl_kernel/flashmla_ops.abi3.so",
        "sgl_kernel/spatial_ops.abi3.so",
        "deep_gemm/__init__.py",
        "deep_gemm/deep_gemm_cpp.abi3.so",
        "triton_kernels/matmul_ogs.py",
        "sglang_kernel-0.4.3.dist-info/METADATA",
    }
    assert n == len(got)


def test_flashinfer_layer_keeps_the_norm_jit_sources(tmp_path):
    slim, full = tmp_path / "f.tar.xz", tmp_path / "full.tar.xz"
    w = _wheel(tmp_path / "f.whl", FLASHINFER)
    wh.layer(slim, [("flashinfer", w)])
    wh.layer(full, [("flashinfer-full", w)])
    got = set(_members(slim))
    assert {
        "flashinfer/data/include/a.cuh",
        "flashinfer/data/csrc/norm.cu",
        "flashinfer/data/spdlog/include/spdlog.h",
        "flashinfer/norm/__init__.py",
    } <= got
    assert not any("cutlass" in n or "cccl" in n or n == "build_backend.py" for n in got)
    assert {"flashinfer/data/cutlass/include/cutlass.h",
            "flashinfer/data/cccl/cub/cub.cuh"} <= set(_members(full))


def test_release_layer_drops_sglangs_compiled_files_and_reads_its_pins(tmp_path):
    sg = _wheel(tmp_path / "sglang-0.5.13-cp312-cp312-manylinux_2_34_x86_64.whl", SGLANG)
    assert wh.wheel_pins(sg) == {
        "torch": "2.11.0",
        "sglang-kernel": "0.4.3",
        "flashinfer-python": "0.6.12",
        "transformers": "5.8.1",
        "torchcodec": "0.11.1",
    }
    out = tmp_path / "release.tar.xz"
    wh.layer(
        out,
        [
            ("sglang", sg),
            ("kernel", _wheel(tmp_path / "k.whl", KERNEL)),
            ("flashinfer", _wheel(tmp_path / "f.whl", FLASHINFER)),
        ],
    )
    got = _members(out)
    assert "sglang/srt/server_args.py" in got and "sglang-0.5.13.dist-info/METADATA" in got
    assert not any(n.startswith("sglang/") and ".so" in n for n in got)
    assert "sgl_kernel/sm90/common_ops.abi3.so" in got and "flashinfer/data/csrc/norm.cu" in got


def test_plain_layer_never_carries_the_images_torch_stack(tmp_path):
    w = _wheel(
        tmp_path / "d.whl",
        {
            "numpy/__init__.py": b"x",
            "torch/__init__.py": b"x",
            "orjson/__init__.py": b"x",
            "pkg-1.0.data/purelib/pkg/__init__.py": b"x",
            "pkg-1.0.data/scripts/tool": b"x",
        },
    )
    out = tmp_path / "d.tar.xz"
    wh.layer(out, [("plain", w)])
    assert set(_members(out)) == {"orjson/__init__.py", "pkg/__init__.py"}
    with pytest.raises(ValueError, match="unknown layer kind"):
        wh.layer(out, [("nope", w)])


def test_layers_are_reproducible(tmp_path):
    w = _wheel(tmp_path / "k.whl", KERNEL)
    a, b = tmp_path / "a.tar.xz", tmp_path / "b.tar.xz"
    wh.layer(a, [("kernel", w)])
    wh.layer(b, [("kernel", w)])
    assert a.read_bytes() == b.read_bytes()


def test_size_check_fails_when_a_release_does_not_fit_beside_the_checkout(tmp_path):
    for name, mib in (("release-A.tar.xz", 20), ("release-B.tar.xz", 21), ("common.tar.xz", 8),
                      ("transformers-1.tar.xz", 3), ("transformers-2.tar.xz", 3)):
        (tmp_path / name).write_bytes(b"\0" * (mib * 2**20))
    (tmp_path / "bundles.json").write_text(
        json.dumps({
            "A": ["release-A.tar.xz", "transformers-1.tar.xz", "common.tar.xz"],
            "B": ["release-B.tar.xz", "transformers-2.tar.xz", "common.tar.xz"]
        }))
    lines, ok = wh.check_bundles(tmp_path, 32)
    assert ok and "sglang A + B: 55.0 MiB together" in lines
    assert "sglang A: 31.0 MiB (release-A.tar.xz + transformers-1.tar.xz + common.tar.xz)" in lines
    lines, ok = wh.check_bundles(tmp_path, 31.5)
    assert not ok and [ln for ln in lines if "DOES NOT FIT" in ln] == [
        "sglang B: 32.0 MiB (release-B.tar.xz + transformers-2.tar.xz + common.tar.xz) DOES NOT "
        "FIT (31.5 MiB)"
    ]


def test_the_bundle_script_runs_as_the_shell_script_calls_it():
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "scripts/engine_bundle.py", "skip"], cwd=root,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == ["jedi", "parso"], p.stderr


def test_the_script_names_the_pieces_and_the_limit():
    text = (Path(__file__).resolve().parents[2] / "scripts" / "wheelhouse-engine.sh").read_text()
    assert "engine-layer" in text and "engine-check" in text and "LIMIT_MIB" in text
    assert "fastapi<0.142" in wh.ENGINE_DEPS and "apache-tvm-ffi==0.1.9" in wh.ENGINE_DEPS


@pytest.mark.parametrize("plan, rc, says", [
    ("04", 0, "sglab verify --live --against engine_swa_loc"),
    ("06", 0, "sglab verify --live --against engine_capture_sizes"),
    ("07", 2, "no engine experiment with claims in plan 07"),
])
def test_the_gpu_script_verifies_a_plans_engine_experiments(tmp_path, plan, rc, says):
    import os
    import subprocess
    import sys

    (tmp_path / "bundles.json").write_text("{}")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ, "PYTHON": sys.executable, "BUNDLES": str(tmp_path),
        "OUT": str(tmp_path / "out")
    }
    p = subprocess.run(
        ["bash",
         str(root / "scripts" / "engine_gpu.sh"), "--dry-run", "--verify", "--plan", plan], env=env,
        capture_output=True, text=True, timeout=120)
    assert p.returncode == rc and says in p.stdout + p.stderr


def test_the_gpu_script_verifies_what_named_scenarios_record(tmp_path):
    """`--verify --scenario S`: S runs (recording), then its runs are verified against the record;
    the plan's live verify is not started."""
    import os
    import subprocess
    import sys

    (tmp_path / "bundles.json").write_text("{}")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ, "PYTHON": sys.executable, "BUNDLES": str(tmp_path),
        "OUT": str(tmp_path / "out")
    }
    p = subprocess.run([
        "bash",
        str(root / "scripts" / "engine_gpu.sh"), "--dry-run", "--verify", "--scenario",
        "01-kimi-pcg", "--release", "0.5.13"
    ], env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.index("=== 01-kimi-pcg:") < out.index("=== verify: sglab verify RUN --against")
    assert "--live" not in out


def test_a_plan_runs_only_what_this_machines_gpus_allow():
    """`--plan 05` on a 2-GPU machine runs the TP-2 scenario and skips the TP-4 and TP-8 ones
    with one line each; a dry run lists all three."""
    from sglab.tools import fixes

    picked, skipped = fixes.plan_for("05", 2)
    assert [s.name for s in picked] == ["05-grid-thw"]
    assert skipped == [
        "skipped 05-grid-thw-tp4 needs 4 GPUs, this machine has 2",
        "skipped 05-grid-thw-tp8 needs 8 GPUs, this machine has 2"
    ]
    assert [s.name for s in fixes.plan_for("05", None)[0]
            ] == ["05-grid-thw", "05-grid-thw-tp4", "05-grid-thw-tp8"]
    assert fixes.plan_for("06", 0)[0] == []


def test_the_gpu_scripts_dry_plan_lists_every_scenario(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "bundles.json").write_text("{}")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ, "PYTHON": sys.executable, "BUNDLES": str(tmp_path),
        "OUT": str(tmp_path / "out")
    }
    p = subprocess.run(
        ["bash", str(root / "scripts" / "engine_gpu.sh"), "--dry-run", "--plan", "06"], env=env,
        capture_output=True, text=True, timeout=300)
    assert all(f"=== 06-dense-tp{n}:" in p.stdout for n in (1, 4, 8)), p.stdout[-2000:]


def _gpu_script(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    """scripts/engine_gpu.sh ``argv`` with its bundles folder (``tmp_path``, as given) and $OUT
    (``tmp_path / "out"``) here."""
    import os

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ, "PYTHON": sys.executable, "BUNDLES": str(tmp_path),
        "OUT": str(tmp_path / "out")
    }
    return subprocess.run(["bash", str(root / "scripts" / "engine_gpu.sh"), *argv], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flag, example", [("--scenario", "01-kimi-pcg"), ("--plan", "03"),
                                           ("--release", "0.5.13"), ("--cpus", "auto"),
                                           ("--cases", "'w512-*'")])
def test_a_gpu_script_flag_without_its_value_is_one_line_and_starts_nothing(
        tmp_path, flag, example):
    """Last on the line, or followed by another flag: said in one line, exit 2, nothing written."""
    (tmp_path / "bundles.json").write_text("{}")
    for argv in ([flag], ["--dry-run", flag], [flag, "--dry-run"]):
        p = _gpu_script(tmp_path, *argv)
        assert (p.returncode, p.stdout) == (2, ""), p.stderr
        assert p.stderr.startswith(f"engine_gpu.sh: {flag} needs a value (e.g. {flag} {example}; ")
        assert p.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_an_interpreter_without_the_harness_modules_is_one_line_and_starts_nothing(tmp_path):
    """A python3 without pandas or psutil (a bare system one): said in one line naming them and
    the way out, exit 2, nothing written; the same with no interpreter at all."""
    import os

    bare = tmp_path / "python3"  # this interpreter without its site-packages
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    root = Path(__file__).resolve().parents[2]
    for py, says in ((bare, "lacks numpy pandas psutil (pip install numpy pandas psutil, or "),
                     (tmp_path / "none", "does not run (PYTHON names the interpreter; ")):
        env = {
            **os.environ, "PYTHON": str(py), "BUNDLES": str(tmp_path), "OUT": str(tmp_path / "o")
        }
        p = subprocess.run(
            ["bash", str(root / "scripts" / "engine_gpu.sh"), "--dry-run", "--plan", "03"], env=env,
            capture_output=True, text=True, timeout=60)
        assert (p.returncode, p.stdout, p.stderr.count("\n")) == (2, "", 1), p.stderr
        assert p.stderr.startswith(f"engine_gpu.sh: {py} {says}")
        assert not (tmp_path / "o").exists()


def test_a_dry_run_prints_the_plans_commands_without_the_bundles_and_a_real_run_refuses(tmp_path):
    """--dry-run unpacks nothing, so it reads no bundle: it says they are absent (a real run needs
    them), prints the plan's commands and writes nothing under $OUT; the same call without
    --dry-run is refused in one line."""
    p = _gpu_script(tmp_path, "--dry-run", "--plan", "03")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (tmp_path / "out").exists()
    lines = p.stdout.splitlines()
    assert lines[0] == (f"engine_gpu.sh: no {tmp_path}/bundles.json: a dry run needs none, a real "
                        "run needs the bundles (`make wheelhouse-engine`)")
    assert lines[1] == "=== 03-bcg-requests: sglab engine --scenario 03-bcg-requests --dry-run"
    assert any(ln.startswith("# sglang 0.5.11+bcg") for ln in lines), p.stdout[-2000:]
    p = _gpu_script(tmp_path, "--plan", "03")
    assert (p.returncode, p.stdout, p.stderr.count("\n")) == (2, "", 1)
    assert p.stderr.startswith(f"engine_gpu.sh: {tmp_path}/bundles.json not found (build the ")
