"""A private bytecode cache (``~/.cache/sglab/pycache``) for machines where every new Python process
would compile its imports again; ``SGLAB_PYCACHE=off`` leaves the interpreter as it was,
``=/some/dir`` picks the folder."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


ENV = "SGLAB_PYCACHE"


def needed() -> str | None:
    """Why a private cache is needed here, or None where Python already keeps its bytecode."""
    if os.environ.get(ENV, "").lower() in {"off", "0", "no"}:
        return None
    if sys.pycache_prefix and os.environ.get("PYTHONPYCACHEPREFIX"):
        return None  # already directed somewhere (by the user or an enable() upstream)
    if sys.dont_write_bytecode:
        return "PYTHONDONTWRITEBYTECODE is set"
    spec = importlib.util.find_spec("torch")
    folder = Path(spec.origin).parent if spec is not None and spec.origin else None
    if folder and not (folder / "__pycache__").is_dir() and not os.access(folder, os.W_OK):
        return "torch's folder is read-only and has no __pycache__"
    return None


def enable() -> str | None:
    """Turn the private cache on where :func:`needed` says so: a one-line description, else None."""
    if (why := needed()) is None:
        return None
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    folder = Path(os.environ.get(ENV) or Path(cache) / "sglab" / "pycache")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"bytecode cache not enabled ({why}; cannot create {folder}: {e.strerror})"
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return f"bytecode cache: {folder} ({why}; {ENV}=off to leave it)"


def describe() -> str:
    """Where this process keeps its bytecode, in a few words (for ``sglab env``)."""
    if sys.pycache_prefix:
        return f"cache in {sys.pycache_prefix}"
    return ("not written (PYTHONDONTWRITEBYTECODE)"
            if sys.dont_write_bytecode else "written beside the sources")
