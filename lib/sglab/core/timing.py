"""Time device work with CUDA events and host work with a synchronised clock: each warms up,
repeats and keeps every sample in a :class:`Timing` (median, p10, p90)."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Callable

import numpy as np


@dataclass
class Timing:
    """Samples in milliseconds and their summary."""

    samples_ms: list[float] = field(default_factory=list)
    clock: str = "cuda-events"

    @property
    def n(self) -> int:
        return len(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p10_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 10))

    @property
    def p90_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 90))

    def rows(self, **labels) -> list[dict]:
        """Tidy rows (metric time_median / time_p10 / time_p90, unit ms) carrying ``labels``."""
        return [{**labels, "metric": f"time_{k}", "value": getattr(self, f"{k}_ms"), "unit": "ms"}
                for k in ("median", "p10", "p90")]


def _check_counts(warmup: int, repeat: int) -> None:
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")


def cuda_time(fn: Callable[[], object], *, warmup: int = 10, repeat: int = 50,
              device=None) -> Timing:
    """Time ``fn`` with a pair of CUDA events around each call, after ``warmup`` discarded calls."""
    import torch

    _check_counts(warmup, repeat)
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_time needs a CUDA device; use host_time for host-side work")
    dev = torch.device("cuda",
                       torch.cuda.current_device()) if device is None else torch.device(device)
    with torch.cuda.device(dev):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(dev)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(dev)
        return Timing([s.elapsed_time(e) for s, e in zip(starts, ends)], clock="cuda-events")


def host_time(fn: Callable[[], object], *, warmup: int = 3, repeat: int = 20,
              sync: bool = True) -> Timing:
    """Time ``fn`` with ``time.perf_counter``; ``sync``: the device synchronised around each."""
    _check_counts(warmup, repeat)
    synchronize = _sync if sync else (lambda: None)
    for _ in range(warmup):
        fn()
    synchronize()
    samples = []
    for _ in range(repeat):
        synchronize()
        t0 = time.perf_counter()
        fn()
        synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(samples, clock="host-perf-counter" + ("+sync" if sync else ""))


def _sync() -> None:
    """Synchronise CUDA where this process has initialised it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleaved(fns: "dict[str, Callable[[], object]]", *, rounds: int = 3, warmup: int = 10,
                repeat: int = 60,
                timer: "Callable[..., Timing] | None" = None) -> "dict[str, Timing]":
    """Time variants in alternating rounds (A B C, A B C, ...) so drift lands on every variant."""
    if not fns:
        raise ValueError("interleaved needs at least one variant")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    _check_counts(warmup, repeat)
    timer = timer or cuda_time
    per_round = max(1, repeat // rounds)
    pooled: dict[str, Timing] = {}
    for r in range(rounds):
        for name, fn in fns.items():
            t = timer(fn, warmup=warmup if r == 0 else 0, repeat=per_round)
            pooled.setdefault(name, Timing([], clock=t.clock + f", {rounds} interleaved rounds"))
            pooled[name].samples_ms.extend(t.samples_ms)
    return pooled


# -- phases: where live time goes, wall seconds per named phase of a run ---------------------------
_totals: dict[str, float] = {}


@contextmanager
def phase(name: str):
    """Add the wall time of the block to phase ``name`` (nested phases are counted in both)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - t0)


def add(name: str, seconds: float) -> None:
    _totals[name] = _totals.get(name, 0.0) + float(seconds)


def merge(other: dict, prefix: str = "") -> None:
    """Fold another process's phases (e.g. a rank's) into this one's, under ``prefix``."""
    for k, v in (other or {}).items():
        add(prefix + k, v)


def take() -> dict:
    """The phases since the last take(), rounded to ms; resets the clock."""
    out = {k: round(v, 3) for k, v in _totals.items()}
    _totals.clear()
    return out


# -- the host's per-launch cost --------------------------------------------------------------------
class Burst:
    """``n`` tiny kernels launched back to back, synchronised once; times in :attr:`host_ms`."""

    def __init__(self, device, n: int):
        import torch

        self.x, self.n, self.host_ms = torch.zeros(1, device=device), int(n), []
        cuda = torch.device(device).type == "cuda"
        self.sync = torch.cuda.synchronize if cuda else (lambda: None)

    def __call__(self) -> None:
        self.sync()
        t0 = time.perf_counter()
        for _ in range(self.n):
            self.x.add_(1)
        self.sync()
        self.host_ms.append((time.perf_counter() - t0) * 1e3)

    def per_launch_us(self, warmup: int) -> dict:
        """µs per launch over the calls after ``warmup``: median, p10, p90."""
        t = Timing(self.host_ms[warmup:], clock="host-perf-counter")
        return {k: getattr(t, f"{k}_ms") * 1e3 / self.n for k in ("median", "p10", "p90")}


def launch_cost_us(device: str = "cuda:0", *, n: int = 1000, warmup: int = 5,
                   repeat: int = 30) -> dict:
    """The host's per-launch cost on ``device`` (:class:`Burst`): median, p10, p90 (µs), sizes."""
    _check_counts(warmup, repeat)
    burst = Burst(device, n)
    for _ in range(warmup + repeat):
        burst()
    cost = {k: round(v, 3) for k, v in burst.per_launch_us(warmup).items()}
    return {**cost, "launches_per_burst": n, "bursts": repeat, "device": str(device)}
