"""Helpers of ``scripts/wheelhouse-engine.sh`` (the engine bundles, ``.whl-engine/``): what a whole
real engine of one release needs on the GPU image, as installed trees packed into ``tar.xz`` layers
that are unpacked side by side into one folder (no pip on the GPU box):

    python scripts/engine_bundle.py engine-pins WHEEL                      the release's ``==`` pins
    python scripts/engine_bundle.py engine-deps [--no-deps]                the light dependencies
    python scripts/engine_bundle.py engine-layer OUT.tar.xz KIND:WHEEL ... one layer
    python scripts/engine_bundle.py engine-check DIR [--limit MIB]    sizes; does each fit?
    python scripts/engine_bundle.py skip                                   left out of the bundles

Layers: ``release-<V>`` (the sglang wheel without its ``.so`` files, the slim sglang-kernel,
FlashInfer's Python files and the JIT sources its norm kernel needs), ``transformers-<T>`` (the
release's pinned transformers) and ``common`` (the light dependencies every release shares).
``bundles.json`` names each release's layers.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import re
import sys
import tarfile
import zipfile
from pathlib import Path

from sglab.sglang.releases import pins

# Dependencies left out of the bundles: IPython's completion engine (jedi, and parso under it),
# which IPython imports only when it completes code; SGLang imports ``IPython.display`` only.
WHEEL_SKIP = ("jedi", "parso")

# -- engine bundles --------------------------------------------------------------------------------
# Files of each wheel that a whole engine on one Hopper GPU never loads (patterns on the wheel
# member names). sglang: its compiled files are gRPC / Rust bindings that srt does not import.
SGLANG_DROP = (r"\.so(\.\d+)*$",)
# sglang-kernel: flash_ops (1 GB unpacked; SGLang imports it inside try blocks and only uses it for
# FA3 attention, never chosen with --attention-backend triton), the sm100 build (Blackwell), mscclpp
# and its headers / static libraries (only with --enable-mscclpp), the CUTLASS / CuTe headers of
# DeepGEMM's JIT (FP8 models only). Kept: every Python file, the sm90 build, the small op libraries
# (flashmla_ops, spatial_ops, deep_gemm_cpp) and DeepGEMM's own headers
# (deep_gemm/include/deep_gemm: sgl-kernel 0.4.2 lists that folder at start-up and fails without
# it; 0.3 MiB).
KERNEL_DROP = (r"^sgl_kernel/flash_ops\.", r"^sgl_kernel/sm100/", r"^lib/", r"^lib64/",
               r"^include/", r"^_mscclpp", r"^deep_gemm/include/(?!deep_gemm/)")
# FlashInfer: CUTLASS and CCCL sources are for its GEMM / MoE / communication JIT modules; the norm
# kernel that the first CUDA-graph capture JIT-builds needs data/include, data/csrc and data/spdlog
# only. ``full`` keeps them (the all-reduce fusion's trtllm_comm module needs the whole package).
FLASHINFER_DROP = (r"^flashinfer/data/cutlass/", r"^flashinfer/data/cccl/", r"^build_backend\.py$",
                   r"^flashinfer/data/build_backend\.py$")
LAYER_KINDS = ("sglang", "kernel", "flashinfer", "flashinfer-full", "plain")
# Never in a layer: the image's own torch stack and numpy.
NEVER = re.compile(r"^(torch|triton|numpy|nvidia_.*|torchvision|torchaudio)(-[^/]*\.dist-info)?/")
# The light dependencies a release needs at import beyond the image (the same set for 0.5.11 to
# 0.5.13; measured on the GPU image, see the facts of real SGLang engines). fastapi < 0.142: later
# ones import opentelemetry. jsonschema and soundfile: the server's OpenAI entrypoints import them
# at module level, and python-multipart is what FastAPI asks for when the server declares its
# upload routes (serve tool); the offline engine and bench_one_batch never need them.
ENGINE_DEPS = ("pyzmq", "fastapi<0.142", "starlette", "uvicorn", "IPython", "traitlets",
               "pydantic==2.14.3", "pydantic-core==2.50.4", "annotated-types", "typing-inspection",
               "openai==2.6.1", "distro", "sniffio", "orjson", "pybase64", "msgspec",
               "setproctitle", "dill", "partial-json-parser", "loguru", "gguf",
               "apache-tvm-ffi==0.1.9", "cuda-tile", "jsonschema", "soundfile", "python-multipart")
ENGINE_DEPS_NO_DEPS = ("compressed-tensors==0.18.0",)
LIMIT_MIB = 40.0  # one release's layers: small enough to copy to a GPU box with the checkout


def dropped(name: str, kind: str) -> bool:
    """Whether wheel member ``name`` stays out of a layer of ``kind`` (see the *_DROP lists)."""
    if NEVER.match(name):
        return True
    pats = {
        "sglang": SGLANG_DROP, "kernel": KERNEL_DROP, "flashinfer": FLASHINFER_DROP,
        "flashinfer-full": (r"^build_backend\.py$", r"^flashinfer/data/build_backend\.py$"),
        "plain": ()
    }[kind]
    return any(re.search(p, name) for p in pats)


def _installed_name(name: str) -> str | None:
    """Where a wheel member lands in an installed tree: ``*.data/purelib|platlib/x`` -> ``x``;
    scripts, headers and data of ``*.data/`` are not needed by an import (None)."""
    m = re.match(r"^[^/]+\.data/(purelib|platlib)/(.+)$", name)
    if m:
        return m.group(2)
    if re.match(r"^[^/]+\.data/", name):
        return None
    return name


def wheel_pins(wheel: Path) -> dict[str, str]:
    """``{normalized name: version}`` of the ``==`` pins a wheel's METADATA declares for Linux
    x86_64 (:func:`sglab.sglang.releases.pins`)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return pins(z.read(meta).decode())


def layer(out: Path, parts: list[tuple[str, Path]]) -> tuple[int, int]:
    """Write ``out`` (tar.xz) holding the installed files of each ``(kind, wheel)`` minus what
    ``kind`` drops; (files, bytes unpacked). Members are sorted and stamped with time 0, so the same
    wheels give the same layer."""
    members: dict[str, bytes] = {}
    for kind, wheel in parts:
        if kind not in LAYER_KINDS:
            raise ValueError(f"unknown layer kind {kind!r} (known: {', '.join(LAYER_KINDS)})")
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if info.is_dir() or dropped(info.filename, kind):
                    continue
                target = _installed_name(info.filename)
                if target is not None:
                    members[target] = z.read(info)
    tmp = out.with_name(out.name + ".tmp")
    with (lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz,
          tarfile.open(fileobj=xz, mode="w") as tar):
        for name in sorted(members):
            data = members[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = (len(data), 0,
                                                0o755 if name.endswith(".so") else 0o644)
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return len(members), sum(len(v) for v in members.values())


def check_bundles(folder: Path, limit_mib: float = LIMIT_MIB) -> tuple[list[str], bool]:
    """Lines of sizes from ``folder/bundles.json`` (each release's layers; each pair of releases
    together, which fits a call only where the checkout leaves room) and whether every release
    fits ``limit_mib``."""
    plan = json.loads((folder / "bundles.json").read_text())
    size = {p.name: p.stat().st_size / 2**20 for p in folder.glob("*.tar.xz")}
    lines, ok = [f"  {size[name]:6.1f} MiB  {name}" for name in sorted(size)], True
    releases = sorted(plan)
    for v in releases:
        total = sum(size[f] for f in plan[v])
        ok &= total <= limit_mib
        lines.append(f"sglang {v}: {total:.1f} MiB ({' + '.join(plan[v])})"
                     f"{'' if total <= limit_mib else f' DOES NOT FIT ({limit_mib:g} MiB)'}")
    for i, a in enumerate(releases):
        for b in releases[i + 1:]:
            total = sum(size[f] for f in set(plan[a]) | set(plan[b]))
            lines.append(f"sglang {a} + {b}: {total:.1f} MiB together")
    return lines, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/engine_bundle.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("skip")
    p = sub.add_parser("engine-pins")
    p.add_argument("wheel", type=Path)
    p = sub.add_parser("engine-deps")
    p.add_argument("--no-deps", action="store_true")
    p = sub.add_parser("engine-layer")
    p.add_argument("out", type=Path)
    p.add_argument("parts", nargs="+", metavar="KIND:WHEEL",
                   help=f"KIND one of {', '.join(LAYER_KINDS)}")
    p = sub.add_parser("engine-check")
    p.add_argument("folder", type=Path)
    p.add_argument("--limit", type=float, default=LIMIT_MIB)
    args = ap.parse_args(argv)
    if args.cmd == "skip":
        print("\n".join(WHEEL_SKIP))
    elif args.cmd == "engine-pins":
        print("\n".join(f"{k}=={v}" for k, v in sorted(wheel_pins(args.wheel).items())))
    elif args.cmd == "engine-deps":
        print("\n".join(ENGINE_DEPS_NO_DEPS if args.no_deps else ENGINE_DEPS))
    elif args.cmd == "engine-layer":
        parts = [(part.split(":", 1)[0], Path(part.split(":", 1)[1])) for part in args.parts]
        n, unpacked = layer(args.out, parts)
        print(f"{args.out.name}: {n} files, {unpacked / 2**20:.1f} MiB unpacked, "
              f"{args.out.stat().st_size / 2**20:.1f} MiB packed")
    else:
        lines, ok = check_bundles(args.folder, args.limit)
        print("\n".join(lines))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
