"""SGLang read as source text, never imported: each fix's check (``Fix.check``) turns
``read(relpath)`` over an SGLang package (installed, a checkout, a released wheel) into a
:class:`Verdict`, one state of :data:`STATES` and a one-line reason."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


Reader = Callable[[str], "str | None"]

STATES = {  # the states a fix can be in, in a given SGLang (the legend's order)
    "absent": "the feature the fix belongs to is not in this SGLang yet",
    "before": "the feature is there, the fix is not", "pr-era": "the fix as the PR merged it",
    "changed": "later code replaced the PR's, and it still fixes the problem",
    "regressed": "the fix is gone and the problem can come back",
    "unknown": "the check could not decide; the reason says why",
    "not-installed": "no SGLang here to read"
}
# the states a fix can have in a release (not-installed only describes this machine)
RELEASE_STATES = tuple(s for s in STATES if s != "not-installed")


@dataclass(frozen=True)
class Installed:
    version: str
    root: Path  # the folder of the ``sglang`` package


@dataclass(frozen=True)
class Verdict:
    """A fix's state in one SGLang, and the one-line reason read from its source."""

    status: str
    detail: str

    def __post_init__(self):
        if self.status not in STATES:
            raise ValueError(f"status must be one of {tuple(STATES)}, got {self.status!r}")
        if not self.detail or not self.detail.strip() or "\n" in self.detail:
            raise ValueError(f"a {self.status!r} verdict needs a one-line reason, got "
                             f"{self.detail!r}")

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}"


def data_dir() -> Path:
    """``data/upstream`` of the checkout (or ``$SGLAB_DATA/upstream``)."""
    base = os.environ.get("SGLAB_DATA")
    if base:
        return Path(base) / "upstream"
    from sglab.core import runs

    return runs.repo_root() / "data" / "upstream"


def installed() -> Installed | None:
    """Version and package folder of the installed ``sglang``, found without importing it."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("sglang")  # a top-level find_spec does not execute the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Installed(version, Path(list(spec.submodule_search_locations)[0]))


def read(relpath: str, *, root: Path | None = None) -> str | None:
    """Text of ``sglang/<relpath>`` (e.g. ``"srt/models/kimi_k25.py"``), or None if absent."""
    inst = installed() if root is None else None
    root = inst.root if inst else root
    if root is None:
        return None
    try:
        return (Path(root) / relpath).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def run_check(fix, read_fn: Reader) -> Verdict:
    """``fix.check`` on one reader; a check that raises answers "unknown"."""
    try:
        return fix.check(read_fn)
    except Exception as e:  # noqa: BLE001 - a broken check must not break a notebook or a table
        return Verdict("unknown", f"check failed: {type(e).__name__}: {e}".replace("\n", " "))


def classify(fixes, read_fn: Reader) -> dict[str, Verdict]:
    """Every fix's check on one reader: ``{fix name: Verdict}``."""
    return {f.name: run_check(f, read_fn) for f in fixes}


def check(fix, *, root: Path | None = None) -> Verdict:
    """The fix's check against the installed SGLang (or a source tree at ``root``)."""
    if root is None and installed() is None:
        return Verdict(
            "not-installed", "SGLang is not installed here (pip install --no-deps sglang to "
            "compare: it is read as source, so none of its dependencies, torch among them, are "
            "needed)")
    if root is not None and not (Path(root) / "srt").is_dir():
        return Verdict("unknown", f"{root} is not an SGLang package folder (no srt/ in it)")
    return run_check(fix, lambda rel: read(rel, root=root))


def check_all(fixes, *, root: Path | None = None):
    import pandas as pd

    inst = installed() if root is None else None
    where = inst.version if inst else (str(root) if root else None)
    verdicts = [(f, check(f, root=root)) for f in fixes]
    rows = [(f.name, f.title, v.status, v.detail, where) for f, v in verdicts]
    return pd.DataFrame(rows, columns=["check", "title", "status", "detail", "sglang"])
