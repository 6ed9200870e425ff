"""GPU memory per process and per GPU, read from NVML.

``nvmlDeviceGetComputeRunningProcesses`` lists, for each GPU, the processes holding a CUDA context there and
the memory each uses. A process that merely unpickles a ``cuda:0`` tensor shows up on GPU 0 here, which is
exactly what some notebooks need to see. NVML reports host pids on bare metal and in most VMs; inside a
container with its own pid namespace it may report pids that do not match ``os.getpid()`` — then
:func:`process_gpu_memory` finds nothing for the pids asked about, and :func:`explain_no_match` says so.
"""

from __future__ import annotations

import os
from typing import Iterable

COLUMNS = ["pid", "gpu", "gpu_name", "used_mib"]


def _nvml(nvml=None):
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError as e:
        raise RuntimeError("NVML is not available: pip install nvidia-ml-py (extra 'gpu')") from e
    pynvml.nvmlInit()
    return pynvml


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def all_processes(*, nvml=None) -> list[dict]:
    """Every compute process NVML reports, one dict per (pid, GPU)."""
    nv = _nvml(nvml)
    rows = []
    for gpu in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(gpu)
        name = _text(nv.nvmlDeviceGetName(h))
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            used = p.usedGpuMemory
            if used is None:  # NVML_VALUE_NOT_AVAILABLE on some setups
                used = 0
            rows.append({"pid": int(p.pid), "gpu": gpu, "gpu_name": name, "used_mib": float(used) / 2**20})
    return rows


def process_gpu_memory(pids: Iterable[int] | None = None, *, nvml=None):
    """A DataFrame (``pid, gpu, gpu_name, used_mib``) of NVML-reported memory, restricted to ``pids``
    (default: this process). GPU indices are NVML's (physical) indices."""
    import pandas as pd

    wanted = {os.getpid()} if pids is None else {int(p) for p in pids}
    rows = [r for r in all_processes(nvml=nvml) if r["pid"] in wanted]
    return pd.DataFrame(rows, columns=COLUMNS)


def explain_no_match(pids: Iterable[int], *, nvml=None) -> str:
    """A sentence for when :func:`process_gpu_memory` finds none of ``pids``."""
    seen = sorted({r["pid"] for r in all_processes(nvml=nvml)})
    wanted = sorted(int(p) for p in pids)
    if not seen:
        return (f"NVML lists no compute process on any GPU (looked for pids {wanted}); the processes may not "
                "have created a CUDA context yet.")
    return (f"NVML lists pids {seen} but none of {wanted}: NVML may be reporting pids from another pid namespace "
            "(containers); match by memory deltas instead.")


def memory_matrix(df, labels: dict[int, str] | None = None, gpus: Iterable[int] | None = None):
    """Pivot a :func:`process_gpu_memory` frame into label × GPU MiB (0 where a process holds nothing).
    ``labels`` maps pid → row label (e.g. "rank 1"); ``gpus`` fixes the columns (default: those seen)."""
    labels = labels or {}
    frame = df.copy()
    frame["who"] = [labels.get(int(p), f"pid {int(p)}") for p in frame["pid"]]
    table = frame.pivot_table(index="who", columns="gpu", values="used_mib", aggfunc="sum", fill_value=0.0)
    if gpus is not None:
        table = table.reindex(columns=list(gpus), fill_value=0.0)
    if labels:  # every labelled process gets a row, in the order given, even if it holds nothing
        table = table.reindex(list(dict.fromkeys(labels.values())), fill_value=0.0)
    table.columns = [f"GPU {c}" for c in table.columns]
    table.index.name = None
    return table
