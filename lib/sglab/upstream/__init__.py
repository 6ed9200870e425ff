"""The installed SGLang, read as source text — never imported (its import pulls a heavy GPU stack).

Each fix has a check in :mod:`sglab.upstream.checks`: given a ``read(relpath)`` function over the installed package's files, say
whether this SGLang contains the fix ("fix"), a later replacement of it ("later"), or neither ("neither").
Without SGLang installed every check answers "not-installed".
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STATUSES = ("fix", "later", "neither", "unknown", "not-installed")


@dataclass(frozen=True)
class Installed:
    version: str
    root: Path  # the folder of the ``sglang`` package


@dataclass(frozen=True)
class Verdict:
    status: str
    detail: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


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
    if root is None:
        inst = installed()
        if inst is None:
            return None
        root = inst.root
    path = Path(root) / relpath
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


_REGISTRY: dict[str, tuple[str, Callable[[Callable[[str], str | None]], Verdict]]] = {}


def register(key: str, title: str):
    """Decorator: register ``fn(read) -> Verdict`` as the upstream check for ``key``."""

    def deco(fn):
        _REGISTRY[key] = (title, fn)
        return fn

    return deco


def registered() -> dict[str, str]:
    return {k: t for k, (t, _) in _REGISTRY.items()}


def check(key: str, *, root: Path | None = None) -> Verdict:
    """Run the check registered for ``key`` against the installed SGLang (or a source tree at ``root``)."""
    if key not in _REGISTRY:
        raise KeyError(f"no upstream check registered for {key!r}; known: {sorted(_REGISTRY)}")
    if root is None and installed() is None:
        return Verdict("not-installed", "SGLang is not installed here (pip install 'sglab[sglang]' to compare)")
    _, fn = _REGISTRY[key]
    try:
        return fn(lambda rel: read(rel, root=root))
    except Exception as e:  # noqa: BLE001 - a broken check must not break a notebook
        return Verdict("unknown", f"check failed: {type(e).__name__}: {e}")


def check_all(*, root: Path | None = None):
    import pandas as pd

    inst = installed() if root is None else None
    rows = []
    for key, (title, _) in sorted(_REGISTRY.items()):
        v = check(key, root=root)
        rows.append({"check": key, "title": title, "status": v.status, "detail": v.detail,
                     "sglang": inst.version if inst else (str(root) if root else None)})
    return pd.DataFrame(rows, columns=["check", "title", "status", "detail", "sglang"])


from . import checks  # noqa: E402,F401  (registers the checks of every fix)
