"""What GPUs are here, and whether a notebook's needs are met: from NVML where available (it
creates no CUDA context), otherwise from torch."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import platform
import sys
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    uuid: str
    memory_mib: int


def _nvml():
    """Return the initialised ``pynvml`` module, or None when NVML is not usable here."""
    try:
        import pynvml  # provided by nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _visible_indices(total: int) -> list[int]:
    """Physical indices CUDA_VISIBLE_DEVICES lists (all, for a UUID or MIG spec)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    tokens = [t.strip() for t in (env or "").split(",") if t.strip()]
    if env is None or not all(t.isdigit() for t in tokens):
        return list(range(total))
    return [int(t) for t in tokens if int(t) < total]


@lru_cache(maxsize=1)
def gpus() -> tuple[GPU, ...]:
    """The GPUs this process can use, in CUDA order (empty without CUDA)."""
    nv = _nvml()
    if nv is not None:
        with suppress(Exception):
            visible = _visible_indices(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in visible]
            return tuple(
                GPU(i, _text(nv.nvmlDeviceGetName(h)), _text(nv.nvmlDeviceGetUUID(h)),
                    int(nv.nvmlDeviceGetMemoryInfo(h).total // 2**20))
                for i, h in enumerate(handles))
    try:
        import torch
    except ImportError:
        return ()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    return tuple(
        GPU(i, p.name, str(getattr(p, "uuid", "")), int(p.total_memory // 2**20))
        for i, p in enumerate(props))


def gpu_count() -> int:
    return len(gpus())


DEVICE_FILES = ("nvidia[0-9]*", "dxg")  # a GPU's device files (Linux; WSL)


def no_gpu_device(dev: str = "/dev") -> bool:
    """True where no GPU device file exists: answered without importing torch or NVML."""
    return not any(next(Path(dev).glob(g), None) for g in DEVICE_FILES)


def has_cuda() -> bool:
    """True when torch can use a CUDA device here; without a GPU device file, False at once."""
    if no_gpu_device():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def meets(n_gpus: int) -> tuple[bool, str]:
    """Whether ``n_gpus`` GPUs are available, with a sentence saying why or why not."""
    if n_gpus < 0:
        raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
    if n_gpus == 0:
        return True, "needs no GPU"
    have = gpu_count() if has_cuda() else 0
    if have >= n_gpus:
        names = sorted({g.name for g in gpus()})
        return True, f"{have} GPU(s) here ({', '.join(names)}); needs {n_gpus}"
    if have == 0:
        return False, f"no CUDA GPU here; needs {n_gpus}"
    return False, f"only {have} GPU(s) here; needs {n_gpus}"


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``; ValueError with the bad part named."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
            if first < 0 or last < first:
                raise ValueError
        except ValueError:
            raise ValueError(f"not a CPU list: {text!r} (at {part!r}; want e.g. 0-7,16)") from None
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def cpu_text(cpus) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``0-3,8``."""
    # consecutive CPUs lie the same distance from their place in the sorted list
    groups = itertools.groupby(enumerate(sorted(set(cpus))), key=lambda ic: ic[1] - ic[0])
    runs_ = [[c for _, c in g] for _, g in groups]
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs_)


def gpu_local_cpus(cuda_index: int = 0) -> tuple[int, ...]:
    """This process's CPUs on GPU ``cuda_index``'s NUMA node (NVML); ValueError where unknown."""
    nv = _nvml()
    if nv is None:
        raise ValueError("NVML is not usable here: give the CPUs as a list (e.g. 0-7)")
    try:
        phys = _visible_indices(nv.nvmlDeviceGetCount())[cuda_index]
        words = nv.nvmlDeviceGetCpuAffinity(nv.nvmlDeviceGetHandleByIndex(phys), 64)
    except Exception as exc:  # noqa: BLE001 - an NVML error or no such GPU
        raise ValueError(f"NVML gives no CPU affinity for GPU {cuda_index} ({exc})") from None
    local = {i * 64 + b for i, w in enumerate(words) for b in range(64) if int(w) >> b & 1}
    mine = local & os.sched_getaffinity(0)
    if not mine:
        raise ValueError(f"none of GPU {cuda_index}'s local CPUs is allowed to this process")
    return tuple(sorted(mine))


def software() -> dict:
    """Versions for every run manifest."""
    version, cuda = _torch_version()
    nv, driver = _nvml(), None
    with suppress(Exception):
        driver = _text(nv.nvmlSystemGetDriverVersion()) if nv is not None else None
    return {"python": platform.python_version(), "torch": version, "cuda": cuda, "driver": driver}


def _torch_version() -> tuple:
    """torch's version and CUDA, from its ``version.py`` where torch is not imported (2 s)."""
    if sys.modules.get("torch") is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None, None
        path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
        if path.is_file():  # else a build without the generated file: ask torch itself
            return _read_version_file(path)
    import torch

    return torch.__version__, torch.version.cuda


def _read_version_file(path: Path) -> tuple:
    """``(__version__, cuda)`` assigned in torch's ``version.py`` (plain or annotated literals)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id in ("__version__", "cuda") and node.value:
            found[target.id] = ast.literal_eval(node.value)
    return found.get("__version__"), found.get("cuda")
