"""GPU memory per process and per GPU from NVML (a process that merely unpickles a ``cuda:0``
tensor shows up on GPU 0); :class:`Sampler` follows it over time in a background thread, and
:func:`step_series` keeps the moments a value changed."""

from __future__ import annotations

import os
import threading
import time
from typing import Iterable

from sglab.core import hardware


COLUMNS = ["pid", "gpu", "gpu_name", "used_mib"]


def _nvml(nvml=None) -> tuple:
    """NVML (``nvml``, else ``pynvml`` initialised) and a handle per GPU."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as e:
            raise RuntimeError(
                "NVML is not available: pip install nvidia-ml-py (extra 'gpu')") from e
        nvml.nvmlInit()
    return nvml, [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


def _read(nv, handles) -> list[tuple]:
    """``(pid, GPU, MiB)`` of every compute process on ``handles`` (unknown memory: 0)."""
    return [(int(p.pid), gpu, float(p.usedGpuMemory or 0) / 2**20) for gpu, h in enumerate(handles)
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]


def all_processes(*, nvml=None) -> list[dict]:
    """Every compute process NVML reports, one dict per (pid, GPU)."""
    nv, handles = _nvml(nvml)
    names = [hardware._text(nv.nvmlDeviceGetName(h)) for h in handles]
    return [dict(zip(COLUMNS, (pid, gpu, names[gpu], mib))) for pid, gpu, mib in _read(nv, handles)]


def process_gpu_memory(pids: Iterable[int] | None = None, *, nvml=None):
    """NVML's memory per (pid, GPU) of ``pids`` (default: this process), physical indices."""
    import pandas as pd

    wanted = {os.getpid()} if pids is None else {int(p) for p in pids}
    rows = [r for r in all_processes(nvml=nvml) if r["pid"] in wanted]
    return pd.DataFrame(rows, columns=COLUMNS)


# -- memory over time ------------------------------------------------------------------------------
SAMPLE_COLUMNS = ["t", "pid", "gpu", "used_mib"]


class Sampler:
    """Per-process memory of every GPU, read from NVML ``hz`` times a second in a daemon thread."""

    def __init__(self, hz: float = 100.0, *, nvml=None):
        if hz <= 0:
            raise ValueError(f"hz must be positive, got {hz}")
        self.hz, self._nv = float(hz), nvml
        self.ticks: list[float] = []
        self._rows: list[tuple] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Sampler":
        if self._thread is not None:
            raise RuntimeError("a Sampler is started once")
        self._nv, self._handles = _nvml(self._nv)
        self._thread = threading.Thread(target=self._loop, name="sglab-nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        try:
            rows = _read(self._nv, self._handles)
        except Exception:  # noqa: BLE001 - one bad read must not end the series
            self.errors += 1
            return
        t = time.monotonic()
        self.ticks.append(t)
        self._rows.extend((t, *r) for r in rows)

    def _loop(self) -> None:
        start, period, n = time.monotonic(), 1.0 / self.hz, 0
        while not self._stop.is_set() and time.monotonic() - start < 600.0:
            self._tick()
            n += 1
            self._stop.wait(max(0.0, start + n * period - time.monotonic()))

    def stop(self) -> None:
        """Stop the thread (it ends within one period) and take one last reading."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._tick()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def achieved_hz(self) -> float:
        """Ticks per second over the sampled span (0 with fewer than two ticks)."""
        if len(self.ticks) < 2 or self.ticks[-1] <= self.ticks[0]:
            return 0.0
        return (len(self.ticks) - 1) / (self.ticks[-1] - self.ticks[0])

    def samples(self):
        import pandas as pd

        return pd.DataFrame(self._rows, columns=SAMPLE_COLUMNS)


def step_series(samples, ticks: Iterable[float], pids: Iterable[int] | None = None):
    """Samples reduced to change points (absence = 0 MiB): drawn as steps, the series exactly."""
    import pandas as pd

    ticks = sorted({float(t) for t in ticks})
    d = samples if pids is None else samples[samples.pid.isin({int(p) for p in pids})]
    d = d[d.t.isin(ticks)]  # only the ticks asked for (e.g. one group's window)
    if not ticks or d.empty:
        return pd.DataFrame(columns=["pid", "gpu", "t", "used_mib"])
    wide = d.pivot_table(index="t", columns=["pid", "gpu"], values="used_mib",
                         aggfunc="last").reindex(ticks).fillna(0.0)
    keep = wide.ne(wide.shift())
    keep.iloc[-1] = True
    return wide.where(keep).unstack().dropna().rename("used_mib").reset_index()
