"""Install the pinned SGLang releases side by side (``sglab real install``): a ``pip install
--no-deps --target`` per release and the light dependencies once per dependency set, in parallel,
each moved into place only when complete; a release that cannot be installed is one line."""

from __future__ import annotations

import argparse
import csv
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from packaging.utils import canonicalize_name

from sglab.core.runs import repo_root
from sglab.sglang.releases import (DEP_SETS, PINNED, STAMP, dep_set, deps_dir, home, package_dir,
                                   parse_version, read_stamp, release_dir)


JOBS = 3


@dataclass
class Outcome:
    """One release or dependency set: ``installed``, ``present`` or ``failed`` (``reason``)."""

    kind: str  # "release" | "deps"
    name: str
    status: str
    seconds: float = 0.0
    reason: str = ""

    def line(self) -> str:
        what = f"sglang {self.name}" if self.kind == "release" else f"dependencies {self.name}"
        said = {"failed": f"install failed: {self.reason}", "present": "already installed"}
        return f"{what}: " + said.get(self.status, f"installed in {self.seconds:.1f} s")


def _deps_spec(name: str) -> dict:
    _, reqs, nodeps = DEP_SETS[name]
    return {"requirements": list(reqs), "no_deps": list(nodeps)}


def _install_into(kind: str, name: str, dest: Path, fill: Callable[[Path], dict]) -> Outcome:
    """``fill(tmp)`` (pip; the stamp's fields), then the stamped folder replaces ``dest``."""
    t0 = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        fields = fill(tmp)
        seconds = time.perf_counter() - t0
        stamp = {**fields, "python": sys.version.split()[0], "seconds": round(seconds, 1)}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
        return Outcome(kind, name, "installed", seconds)
    except PipError as exc:
        return Outcome(kind, name, "failed", time.perf_counter() - t0, str(exc))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def install_deps(name: str) -> Outcome:
    stamp = read_stamp(deps_dir(name)) or {}
    if {k: stamp.get(k) for k in ("requirements", "no_deps")} == _deps_spec(name):
        have, pins = interpreter_dists(), stamp.get("provided_by_interpreter", [])
        # installed as required, the interpreter's part still there
        if all(have.get(n) == v for n, _, v in (pin.partition("==") for pin in pins)):
            return Outcome("deps", name, "present")

    def fill(tmp: Path) -> dict:
        _, reqs, nodeps = DEP_SETS[name]
        with tempfile.TemporaryDirectory() as work:
            constraints = constraint_files(Path(work))
            pip_install(tmp, reqs, constraints=constraints)
            if nodeps:
                pip_install(tmp, nodeps, constraints=constraints, no_deps=True)
        bad = sorted(n for n in installed_in(tmp) if FORBIDDEN.match(n))
        if bad:
            raise PipError(f"refusing to keep {', '.join(bad)} in {tmp.name}: "
                           "the interpreter's torch stack must be used")
        return dict(**_deps_spec(name), set=name, provided_by_interpreter=prune_provided(tmp),
                    source="index")

    home().mkdir(parents=True, exist_ok=True)
    return _install_into("deps", name, deps_dir(name), fill)


def install_release(version: str) -> Outcome:
    if (read_stamp(release_dir(version)) is not None
            and (package_dir(version) / "__init__.py").exists()):
        return Outcome("release", version, "present")

    def fill(tmp: Path) -> dict:
        cache = home() / "wheels"  # wheels another part of the project downloaded for reading
        with tempfile.TemporaryDirectory() as work:
            pip_install(tmp, [f"sglang=={version}"], constraints=constraint_files(Path(work)),
                        no_deps=True, find_links=[cache] if cache.is_dir() else [])
        if not (tmp / "sglang" / "__init__.py").exists():
            raise PipError("the wheel has no sglang/__init__.py")
        got = installed_in(tmp).get("sglang")
        wheel = f"sglang-{got[0]}" if got else None
        return dict(version=version, wheel=wheel, deps=dep_set(version), source="index")

    return _install_into("release", version, release_dir(version), fill)


def install(releases: Iterable[str] = PINNED, *, jobs: int = JOBS, echo=print,
            warn=None) -> list[Outcome]:
    """Install what is missing of ``releases`` and their dependency sets; one outcome each."""
    releases = list(dict.fromkeys(releases))
    sets = list(dict.fromkeys(dep_set(v) for v in releases))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(install_deps, s) for s in sets]
        futures += [pool.submit(install_release, v) for v in releases]
        outcomes = []
        for f in futures:
            out = f.result()
            (warn or echo if out.status == "failed" else echo)(out.line())
            outcomes.append(out)
    return outcomes


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="sglab real install",
        description="install the pinned SGLang releases side by side (.sglang/releases/<V>/); "
        "a release already installed is left alone")
    ap.add_argument("--releases", nargs="+", default=list(PINNED), metavar="V",
                    help=f"releases to install (default: {' '.join(PINNED)})")
    ap.add_argument("--jobs", type=int, default=JOBS, help="parallel pip processes")
    args = ap.parse_args(argv)
    try:
        for v in args.releases:
            parse_version(v)
    except ValueError as exc:
        print(f"sglab real install: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    outcomes = install(args.releases, jobs=args.jobs,
                       warn=lambda line: print(line, file=sys.stderr))
    failed = [o for o in outcomes if o.status == "failed"]
    done = sum(o.status == "installed" for o in outcomes)
    size = sum(p.stat().st_size for p in home().rglob("*") if p.is_file() and not p.is_symlink())
    print(f"sglang releases: {done} installed, {len(outcomes) - done - len(failed)} already there, "
          f"{len(failed)} failed; {time.perf_counter() - t0:.1f} s; {home()} holds "
          f"{size / 2**20:.0f} MiB")
    return 1 if failed else 0


PIP_TIMEOUT_S = 1200
# never installed into a release or dependency folder: the interpreter's torch stack is the one used
FORBIDDEN = re.compile(r"^(torch|triton|nvidia-.*|torchvision|torchaudio|sglang-kernel|"
                       r"sgl-kernel)$")


class PipError(RuntimeError):
    """pip failed; the message is pip's own error line."""


def interpreter_dists() -> dict[str, str]:
    """{normalized name: version} of every distribution importable by this interpreter."""
    dists = [(d.metadata.get("Name"), d.version) for d in md.distributions()]
    return {canonicalize_name(n): v for n, v in reversed(dists) if n}  # the first on the path wins


def constraint_files(workdir: Path) -> list[Path]:
    """The committed CPU constraints (unless torch is a GPU build) and the interpreter's pins."""
    dists = interpreter_dists()
    pins = workdir / "interpreter-pins.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(dists.items())))
    torch = dists.get("torch", "")
    cpu = "+cu" not in torch and "+rocm" not in torch
    return [repo_root() / "constraints" / "cpu.txt", pins] if cpu else [pins]


def pip_install(target: Path, requirements: Iterable[str], *, constraints: Iterable[Path] = (),
                no_deps: bool = False, find_links: Iterable[Path] = ()) -> None:
    """``pip install --target`` one batch; :class:`PipError` with pip's most telling line."""
    cmd = [
        sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "--no-warn-script-location", "--no-input", "--no-compile", "--upgrade", "--target",
        str(target)
    ]
    cmd += [a for c in constraints for a in ("-c", str(c))]
    cmd += [a for f in find_links for a in ("--find-links", str(f))]
    if no_deps:
        cmd.append("--no-deps")
    cmd += [str(r) for r in requirements]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PipError(f"pip did not finish in {PIP_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("WARNING: Location")]
        lines = [ln.strip() for ln in lines if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR:")]
        raise PipError((errors or lines or ["pip failed without a message"])[-1][:300])


def installed_in(folder: Path) -> dict[str, tuple[str, Path]]:
    """{normalized name: (version, dist-info folder)} of the distributions in ``folder``."""
    out = {}
    for info in folder.glob("*.dist-info"):
        try:
            meta = md.PathDistribution(info).metadata
            out[canonicalize_name(meta["Name"])] = (meta["Version"], info)
        except (KeyError, OSError, TypeError):
            continue
    return out


def prune_provided(folder: Path) -> list[str]:
    """Delete from ``folder`` what the interpreter provides at the same version (``n==v``)."""
    have = interpreter_dists()
    pruned = []
    for name, (version, info) in sorted(installed_in(folder).items()):
        if have.get(name) != version:
            continue
        if (info / "RECORD").exists():
            with (info / "RECORD").open(newline="") as fh:
                for p in ((folder / row[0]).resolve() for row in csv.reader(fh) if row):
                    if folder.resolve() in p.parents and p.is_file():
                        p.unlink()
        shutil.rmtree(info, ignore_errors=True)
        pruned.append(f"{name}=={version}")
    for d in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return pruned


if __name__ == "__main__":
    sys.exit(main())
