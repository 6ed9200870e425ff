"""Helpers of ``scripts/wheelhouse-sglang.sh`` (the offline GPU carry): requirement lists and wheel
repacking.

    python -m sglab.sglang.wheelhouse requirements SET [--no-deps]   one requirement a line (GPU lists)
    python -m sglab.sglang.wheelhouse releases                         the releases the GPU carry holds
    python -m sglab.sglang.wheelhouse skip                             dependencies left out of the carry
    python -m sglab.sglang.wheelhouse repack WHEEL                     drop REPACK_DROP files, fix RECORD, in place

Repacking keeps the wheel installable by pip: the dropped files leave the archive and their RECORD
lines go with them (RECORD lists every file with its hash; pip checks what it installs against it).
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

from sglab.sglang.releases import GPU_DEP_SETS, GPU_RELEASES, GPU_WHEEL_SKIP, REPACK_DROP


def repack(wheel: Path, drop=REPACK_DROP) -> tuple[int, int]:
    """Rewrite ``wheel`` without the members matching ``drop``; (files dropped, bytes saved on
    disk)."""
    pats = [re.compile(p) for p in drop]
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED,
                                                        compresslevel=9) as dst:
        for info in src.infolist():
            name = info.filename
            if any(p.search(name) for p in pats):
                dropped += 1
                continue
            data = src.read(name)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if not any(p.search(ln.split(",",
                        1)[0]) for p in pats)).encode()
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data, compresslevel=9)
    tmp.replace(wheel)
    return dropped, before - wheel.stat().st_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglab.sglang.wheelhouse")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("requirements")
    p.add_argument("set", choices=sorted(GPU_DEP_SETS))
    p.add_argument("--no-deps", action="store_true", help="the list installed without dependencies")
    sub.add_parser("releases")
    sub.add_parser("skip")
    p = sub.add_parser("repack")
    p.add_argument("wheel", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "requirements":
        print("\n".join(GPU_DEP_SETS[args.set][1 if args.no_deps else 0]))
    elif args.cmd == "releases":
        print("\n".join(GPU_RELEASES))
    elif args.cmd == "skip":
        print("\n".join(GPU_WHEEL_SKIP))
    else:
        n, saved = repack(args.wheel)
        print(f"{args.wheel.name}: dropped {n} files, {saved / 2**20:.1f} MiB smaller")
    return 0


if __name__ == "__main__":
    sys.exit(main())
