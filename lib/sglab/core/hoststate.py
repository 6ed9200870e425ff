"""What the host did while one engine start ran: the machine's CPU time by kind (``/proc/stat``)
and the CPU time and preemptions of the processes it waited for (``getrusage``).

Engine starts of the same flags fall into fast and slow ones as a whole. These figures, recorded
per start, tell whether a slow start shared its machine: ``steal`` is CPU time the hypervisor gave
to another guest while this one wanted it, ``busy`` how loaded every CPU was, ``preempted`` how
often the engine's own processes were switched out against their will. On the lent H100 guests
steal stayed near 0% in slow starts too: the slowdown there is the host's own, invisible to these
counters (see :mod:`sglab.core.hostprobe`).

    window = hoststate.begin()
    ...  # start the engine and wait for it
    figures = hoststate.end(window)   # {"steal_pct", "busy_pct", "engine_cpu_s", "preempted"}
"""

from __future__ import annotations

import resource
from pathlib import Path


KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks(stat: Path = Path("/proc/stat")) -> dict | None:
    """The machine's CPU time so far by kind (clock ticks, every CPU summed); None where the file
    is not there (not Linux)."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    return dict(zip(KINDS, (int(x) for x in first[1:1 + len(KINDS)])))


def begin(stat: Path = Path("/proc/stat")) -> tuple:
    """Open a window: the machine's ticks and the waited-for children's usage, now."""
    return cpu_ticks(stat), resource.getrusage(resource.RUSAGE_CHILDREN)


def end(window: tuple, stat: Path = Path("/proc/stat")) -> dict:
    """Close a window opened by :func:`begin`: the share of the machine's CPU time stolen by the
    hypervisor and the share busy (both in %, over every CPU), and the CPU seconds and involuntary
    context switches of the children waited for in between (an engine and what it waited for)."""
    (a, ra), b = window, cpu_ticks(stat)
    rb = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {
        "engine_cpu_s": round(rb.ru_utime + rb.ru_stime - ra.ru_utime - ra.ru_stime, 2),
        "preempted": int(rb.ru_nivcsw - ra.ru_nivcsw)
    }
    if a and b:
        d = {k: b[k] - a[k] for k in KINDS}
        total = sum(d.values())
        if total > 0:
            out["steal_pct"] = round(100 * d["steal"] / total, 2)
            out["busy_pct"] = round(100 * (total - d["idle"] - d["iowait"] - d["steal"]) / total, 1)
    return out
