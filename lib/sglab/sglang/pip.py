"""pip, called the one way this project allows: into a target folder, under constraints, never touching torch.

``pip install --target`` ignores what the interpreter already has and installs the whole dependency closure
into the folder. Two measures keep that closure light and consistent with the interpreter:

- every call passes the committed ``constraints/cpu.txt`` (``torch==2.13.0``) on a CPU interpreter, and a
  constraints file pinning every distribution the interpreter already has to its installed version, so a
  package resolved into the folder agrees with what the interpreter would import;
- afterwards the distributions that the interpreter already provides at the same version are deleted from the
  folder (their files are identical; the interpreter's copy is the one that gets imported), and their names
  go into the folder's stamp, so a later change of the interpreter can be noticed.
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional

PIP_TIMEOUT_S = 1200
# Never installed into a release or dependency folder: the interpreter's torch stack is the one used.
FORBIDDEN = re.compile(r"^(torch|triton|nvidia-.*|torchvision|torchaudio|sglang-kernel|sgl-kernel)$")


class PipError(RuntimeError):
    """pip failed; the message is pip's own error line."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def interpreter_dists() -> dict[str, str]:
    """{normalized name: version} of every distribution importable by this interpreter."""
    out = {}
    for d in md.distributions():
        name = d.metadata.get("Name")
        if name:
            out.setdefault(normalize(name), d.version)
    return out


def torch_is_cpu_build() -> bool:
    """True when the interpreter's torch is a CPU build or absent (the case the committed constraints are for)."""
    try:
        version = md.version("torch")
    except md.PackageNotFoundError:
        return True
    return "+cu" not in version and "+rocm" not in version


def constraint_files(repo: Path, workdir: Path) -> list[Path]:
    """The committed CPU constraints (on a CPU interpreter) plus the interpreter's own pins."""
    pins = workdir / "interpreter-pins.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(interpreter_dists().items())))
    files = [pins]
    if torch_is_cpu_build():
        files.insert(0, repo / "constraints" / "cpu.txt")
    return files


def _error_line(stderr: str) -> str:
    """pip's most telling line: the last ``ERROR:`` line, else the last non-empty one."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors[-1] if errors else (lines[-1] if lines else "pip failed without a message"))[:300]


def pip_install(target: Path, requirements: Iterable[str], *, constraints: Iterable[Path] = (),
                no_deps: bool = False, find_links: Iterable[Path] = (), no_index: bool = False,
                timeout: float = PIP_TIMEOUT_S) -> None:
    """``pip install --target`` one batch of requirements (names, pins or wheel paths); raises :class:`PipError`."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-warn-script-location",
           "--no-input", "--no-compile", "--upgrade", "--target", str(target)]
    for c in constraints:
        cmd += ["-c", str(c)]
    for f in find_links:
        cmd += ["--find-links", str(f)]
    if no_deps:
        cmd.append("--no-deps")
    if no_index:
        cmd.append("--no-index")
    cmd += [str(r) for r in requirements]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PipError(f"pip did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise PipError(_error_line(proc.stderr))


def installed_in(folder: Path) -> dict[str, tuple[str, Path]]:
    """{normalized name: (version, dist-info folder)} of the distributions installed into ``folder``."""
    out = {}
    for info in folder.glob("*.dist-info"):
        try:
            meta = md.PathDistribution(info).metadata
            out[normalize(meta["Name"])] = (meta["Version"], info)
        except (KeyError, OSError, TypeError):
            continue
    return out


def _remove_dist(folder: Path, info: Path) -> None:
    """Delete one distribution's files (as listed in its RECORD) and its dist-info folder."""
    record = info / "RECORD"
    if record.exists():
        with record.open(newline="") as fh:
            for row in csv.reader(fh):
                if not row:
                    continue
                p = (folder / row[0]).resolve()
                if folder.resolve() in p.parents and p.is_file():
                    p.unlink()
    shutil.rmtree(info, ignore_errors=True)


def prune_provided(folder: Path) -> list[str]:
    """Delete from ``folder`` what the interpreter provides at the same version; return ``name==version`` of those."""
    have = interpreter_dists()
    pruned = []
    for name, (version, info) in sorted(installed_in(folder).items()):
        if have.get(name) == version:
            _remove_dist(folder, info)
            pruned.append(f"{name}=={version}")
    for d in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return pruned


def check_no_forbidden(folder: Path) -> None:
    """Raise :class:`PipError` when a torch-stack distribution landed in ``folder``."""
    bad = sorted(n for n in installed_in(folder) if FORBIDDEN.match(n))
    if bad:
        raise PipError(f"refusing to keep {', '.join(bad)} in {folder.name}: "
                       "the interpreter's torch stack must be used")


def missing_provided(pins: Iterable[str]) -> list[str]:
    """Pins (``name==version``) that the interpreter no longer provides at that version."""
    have = interpreter_dists()
    out = []
    for pin in pins:
        name, _, version = pin.partition("==")
        if have.get(name) != version:
            out.append(pin)
    return out


def fresh_tmp(parent: Path, prefix: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def replace_dir(src: Path, dst: Path) -> None:
    """Move a finished install into place (removing what was there)."""
    if dst.exists():
        shutil.rmtree(dst)
    src.rename(dst)


def dir_size_mib(path: Path) -> float:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total / 2**20


def wheel_of(folder: Path, name: str = "sglang") -> Optional[str]:
    """``name-version`` of the dist-info installed into ``folder``."""
    got = installed_in(folder).get(normalize(name))
    return f"{name}-{got[0]}" if got else None
