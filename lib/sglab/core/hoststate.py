"""What the host did while one engine start ran: CPU time stolen by the hypervisor and every CPU's
busy share (psutil), and the CPU time and involuntary context switches of the processes it waited
for (``getrusage``): ``end(begin())`` -> ``{"steal_pct", "busy_pct", "engine_cpu_s", "preempted"}``.
"""

from __future__ import annotations

import resource
from typing import Callable, Optional

import psutil


KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict:
    """The machine's CPU seconds so far by kind, every CPU summed (0 for a kind not counted)."""
    t = psutil.cpu_times()
    return {k: float(getattr(t, k, 0.0)) for k in KINDS}


def begin(read: Callable[[], Optional[dict]] = cpu_times) -> tuple:
    """Open a window: the machine's CPU times and the waited-for children's usage, now."""
    return read(), resource.getrusage(resource.RUSAGE_CHILDREN)


def end(window: tuple, read: Callable[[], Optional[dict]] = cpu_times) -> dict:
    """Close a :func:`begin` window: CPU stolen and busy (%), the children's CPU s and switches."""
    (a, ra), b = window, read()
    rb = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = dict(engine_cpu_s=round(rb.ru_utime + rb.ru_stime - ra.ru_utime - ra.ru_stime, 2),
               preempted=int(rb.ru_nivcsw - ra.ru_nivcsw))
    if a and b:
        d = {k: b[k] - a[k] for k in KINDS}
        total = sum(d.values())
        if total > 0:
            out["steal_pct"] = round(100 * d["steal"] / total, 2)
            out["busy_pct"] = round(100 * (total - d["idle"] - d["iowait"] - d["steal"]) / total, 1)
    return out
