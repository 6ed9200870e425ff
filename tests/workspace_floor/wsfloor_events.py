"""A small, made-up profiler event table of the workspace_floor traced pass (the shape
profile.reduce_events returns), for CPU tests of the analysis, the figures and the trace claims."""

import pandas as pd

from sglab.core.trace import COLUMNS
from sglab.workspace_floor import measure as profile
from sglab.workspace_floor.rebuild import RECREATE_RANGE


BUFFERS = ("data", "flags", "lamport")


def _creation(rows, *, variant, rank, k, step, tokens, t0, world_size, open_ms, with_destroy):
    """One creation: its outer range, sub-ranges and the CUDA calls inside them; returns its end
    time (µs)."""
    outer = profile.COST_RANGE if variant == profile.COST_VARIANT else RECREATE_RANGE
    lab = {"variant": variant, "rank": rank, "creation": k, "step": step, "tokens": tokens}
    t, start = t0 + 5.0, t0

    def add(lane, name, cat, s, d, phase):
        rows.append({
            "lane": lane, "name": name, "category": cat, "start_us": s, "dur_us": d, "phase": phase,
            **lab
        })

    if with_destroy:
        add("host", "phase::destroy old workspace", "range", t, 300.0, "destroy old workspace")
        for i in range(3 * (world_size - 1)):
            add("runtime", "cudaIpcCloseMemHandle", "runtime", t + 10 + 20 * i, 10.0,
                "destroy old workspace")
        t += 310.0
    for b in BUFFERS:
        add("host", f"phase::alloc {b}", "range", t, 100.0, "alloc")
        add("runtime", "cudaMalloc", "runtime", t + 5, 90.0, "alloc")
        t += 110.0
        add("host", f"phase::ipc get handle {b}", "range", t, 20.0, "ipc get handle")
        add("runtime", "cudaIpcGetMemHandle", "runtime", t + 2, 10.0, "ipc get handle")
        t += 25.0
        add("host", f"phase::exchange handles {b}", "range", t, 900.0, f"exchange handles {b}")
        t += 905.0
        d = open_ms[b] * 1e3
        add("host", f"phase::ipc open {b}", "range", t, d * (world_size - 1) + 10, f"ipc open {b}")
        for p in range(world_size - 1):
            add("runtime", "cudaIpcOpenMemHandle", "runtime", t + 2 + p * d, d, f"ipc open {b}")
        t += d * (world_size - 1) + 15
    add("host", "phase::lamport fill", "range", t, 50.0, "lamport fill")
    add("stream 7", "Memset (Device)", "memset", t + 10, 30.0, "lamport fill")
    t += 55.0
    add("host", "phase::barrier", "range", t, 300.0, "barrier")
    t += 305.0
    rows.append({
        "lane": "host", "name": f"phase::{outer}", "category": "range", "start_us": start,
        "dur_us": t - start, "phase": outer, **lab
    })
    return t


def events(world_size=2, counts=None, cost_tokens=(4096, 8192), step_tokens=8192, ranks=None):
    """``counts``: creations per profiled policy (default: the short_ramp cold start, 9 and 1); the
    cost sizes at or above ``step_tokens`` get a slow Lamport open (17 ms) as the traced H200 runs
    show."""
    counts = counts or {"floor_0": 9, "floor_2048": 1}
    rows = []
    for rank in (ranks if ranks is not None else range(world_size)):
        t = 0.0
        for variant, n in counts.items():
            for k in range(n):
                t = _creation(rows, variant=variant, rank=rank, k=k, step=10 * k,
                              tokens=64 * (k + 1), t0=t, world_size=world_size, open_ms={
                                  "data": 2.0, "flags": 0.1, "lamport": 0.1
                              }, with_destroy=k > 0) + 1000.0
        for k, T in enumerate(cost_tokens):
            slow = 17.0 if T >= step_tokens else 0.12
            t = _creation(rows, variant=profile.COST_VARIANT, rank=rank, k=k, step=-1, tokens=T,
                          t0=t, world_size=world_size, open_ms={
                              "data": 2.0, "flags": 0.1, "lamport": slow
                          }, with_destroy=False) + 1000.0
    df = pd.DataFrame(rows, columns=COLUMNS + profile.EXTRA_COLUMNS)
    return df.sort_values(["rank", "start_us"], kind="stable").reset_index(drop=True)
