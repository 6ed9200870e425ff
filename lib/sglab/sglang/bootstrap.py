"""Make one installed SGLang release importable in this process, with only the shims this machine needs.

Call :func:`prepare` once, first thing in a fresh process (the worker does), before anything imports
``sglang``, ``triton``, ``torchvision`` or ``sgl_kernel``. It puts the release and its dependency set on
``sys.path``, decides each shim from what this machine has (see :mod:`sglab.sglang.shims` for the reasons), and
returns what it applied. Nothing here is reversible: one process, one release.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sglab.sglang import shims
from sglab.sglang.releases import (
    dep_set, deps_dir, package_dir, parse_version, release_dir, release_installed,
)


class NotRunnable(RuntimeError):
    """The release cannot be imported here; the message is one line naming the release and the cause."""


@dataclass
class Prepared:
    release: str
    root: Path
    shims: list = field(default_factory=list)   # [shims.Shim]

    def shim_names(self) -> list[str]:
        return [s.name for s in self.shims]


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:240]


def _try_import(name: str) -> str | None:
    """None when ``name`` imports; else the cause in one line (and nothing of it left in ``sys.modules``)."""
    try:
        importlib.import_module(name)
        return None
    except Exception as exc:  # noqa: BLE001 - any failure to load counts (ImportError, OSError, RuntimeError)
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        return _cause(exc)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _put_on_path(release: str) -> Path:
    if "sglang" in sys.modules:
        raise NotRunnable(f"sglang {release}: another sglang is already imported in this process")
    if not release_installed(release):
        raise NotRunnable(f"sglang {release}: not installed (run `sglab real install --releases {release}`)")
    root = release_dir(release)
    sys.path[:0] = [str(root), str(deps_dir(dep_set(release)))]
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("sglang")
    found = Path(spec.origin).parent if spec and spec.origin else None
    if found is None or found.resolve() != package_dir(release).resolve():
        raise NotRunnable(f"sglang {release}: `import sglang` resolves to {found}, not {package_dir(release)}")
    return root


def machine_facts() -> dict:
    """What this process can import: for each stand-in, None when the real thing loads, else the cause.
    Importing ``torchvision`` / ``sgl_kernel`` to find out is the only reliable test (a wheel built for another
    torch is found but fails to load); nothing of a failed import is left in ``sys.modules``."""
    return {"triton": None if importlib.util.find_spec("triton") is not None else "not installed",
            "torchvision": _try_import("torchvision"),
            "sgl_kernel": _try_import("sgl_kernel"),
            "cuda": _cuda_available()}


def plan(release: str, facts: dict) -> list[str]:
    """Names of the shims ``release`` needs on a machine with ``facts`` (see :mod:`sglab.sglang.shims`)."""
    names = []
    if facts["triton"] is not None:
        names.append("triton")
    if facts["torchvision"] is not None:
        names.append("torchvision")
    if facts["sgl_kernel"] is not None:
        if facts["cuda"]:
            names.append("sgl_kernel")
        elif parse_version(release) < (0, 5, 11):
            names.append("sgl_kernel.kvcacheio")
    return names


def needed_shims(release: str, root: Path) -> list[shims.Shim]:
    """Decide and install the shims, in the order they must go in."""
    facts = machine_facts()
    installers = {
        "triton": lambda: shims.install_triton_stub(root),
        "torchvision": lambda: shims.install_torchvision_absent(facts["torchvision"]),
        "sgl_kernel": lambda: shims.install_sgl_kernel_stub(facts["sgl_kernel"]),
        "sgl_kernel.kvcacheio": lambda: shims.install_kvcacheio_stub(facts["sgl_kernel"]),
    }
    return [installers[name]() for name in plan(release, facts)]


def facts_in_subprocess(timeout: float = 120.0) -> dict:
    """:func:`machine_facts` of a fresh interpreter (what a worker will see), without importing anything here."""
    import json
    import subprocess

    code = "import json; from sglab.sglang.bootstrap import machine_facts; print(json.dumps(machine_facts()))"
    from sglab.sglang.runner import _env

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=_env(),
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"could not inspect this machine: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(release: str) -> Prepared:
    """Put ``release`` on ``sys.path`` and apply its shims; raises :class:`NotRunnable` with a one-line reason."""
    root = _put_on_path(release)
    try:
        applied = needed_shims(release, root)
    except Exception as exc:  # noqa: BLE001
        raise NotRunnable(f"sglang {release}: a shim failed: {_cause(exc)}") from exc
    return Prepared(release, root, applied)


def import_release_module(prepared: Prepared, module: str):
    """Import ``module`` (e.g. ``sglang.srt.mem_cache.swa_memory_pool``) of the prepared release; one-line
    :class:`NotRunnable` on failure naming the release, the module and the cause."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001
        missing = getattr(exc, "name", None)
        extra = f" (missing module {missing})" if isinstance(exc, ImportError) and missing else ""
        raise NotRunnable(f"sglang {prepared.release}: import {module} failed: {_cause(exc)}{extra}") from exc
