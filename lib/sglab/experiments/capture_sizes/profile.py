"""The traced pass: the piecewise capture loop once more under torch.profiler, before and after the PR's filter.

It runs after the measured passes of :mod:`.run` and reports no rows, so profiling never changes what the claims
read from the tidy run. Per rank, inside one profiler session:

- ``before``: the raw (PR-era) list in the runner's order; each size in a ``warmup n`` / ``capture n`` range. A
  size with unequal shards raises :class:`~sglab.fixes.capture_sizes.UnequalShards` before any collective and is
  marked with a ``refused n`` range where the error is caught. Unlike the server (and the ``before`` rows), the
  traced loop goes on after a refusal, so that every refused size shows in one picture.
- ``after``: the PR-filtered list, the same loop: every size is captured.

The reduction keeps what the timeline and the claims need (a few thousand rows per run): the phase ranges, the
boundary's collective calls on the host (the ``c10d::`` reduce-scatter and all-gather ops), device activity
(kernels, memcpy, memset) and the CUDA-graph capture calls of the runtime (begin/end capture, instantiate). Kernel
launches, barriers and other host ops are dropped.
"""

from __future__ import annotations

from sglab.core import trace

TRACED = (("before", "before", True), ("after", "pr_filter", False))  # (variant, size list, keep going)
EVENT_COLUMNS = [*trace.COLUMNS, "variant", "rank"]
COLLECTIVE_OP = r"^c10d::.*(?:reduce_scatter|allgather|all_gather)"  # the boundary's two (not barriers)
CAPTURE_RUNTIME = r"BeginCapture|EndCapture|GraphInstantiate"
DEVICE = ("kernel", "memcpy", "memset")


def traced_pass(work, *, perfetto=None):
    """Run the ``before`` and ``after`` loops of :data:`TRACED` on ``work`` (a :class:`.run.RankWork`) under one
    :class:`sglab.core.trace.Recorder`; return the reduced event table of this rank."""
    import contextlib
    import time

    from sglab.core import timing as phases

    with contextlib.ExitStack() as stack:
        with phases.phase("profile: start"):  # the profiler's own warm-up session, then this one
            rec = stack.enter_context(trace.Recorder(perfetto=perfetto, keep_ops=True, cuda=work.use_graphs))
        with phases.phase("profile: traced loops"):
            for variant, key, keep_going in TRACED:
                with trace.phase(variant):
                    graphs = work.capture_all(variant, work.lists[key], record=False, traced=True,
                                              keep_going=keep_going)
                work.release(graphs)
        t0 = time.perf_counter()
    phases.add("profile: collect", time.perf_counter() - t0)  # torch's event list and the Perfetto file
    with phases.phase("profile: reduce"):
        return reduce_events(rec.events, rank=work.rank)


def reduce_events(events, *, rank: int, variants=tuple(v for v, _, _ in TRACED)):
    """The rows of :data:`EVENT_COLUMNS` the pictures and claims use, each tagged with its variant (the top-level
    ``variant`` range it falls in, by start time: each size ends with a device synchronisation, so a variant's
    device work ends before the next variant starts) and ``rank``; times re-zeroed to each variant's start."""
    import pandas as pd

    ev = events
    device_lane = ev.lane.str.startswith("stream") | (ev.lane == "device")
    names = ev.name.str.replace(trace.PHASE_PREFIX, "", regex=False)
    is_range = (ev.category == "range") & ev.name.str.startswith(trace.PHASE_PREFIX)
    tops = ev[is_range & ~device_lane & names.isin(variants)]
    starts = sorted((float(r.start_us), names[i]) for i, r in tops.iterrows())
    if not starts:
        return pd.DataFrame(columns=EVENT_COLUMNS)
    keep = ((is_range & ~names.isin(variants))
            | ((ev.category == "op") & ev.name.str.contains(COLLECTIVE_OP))
            | ev.category.isin(DEVICE)
            | ((ev.category == "runtime") & ev.name.str.contains(CAPTURE_RUNTIME)))
    out = ev[keep].copy()
    out["variant"] = ""
    for t0, variant in starts:  # later variants overwrite: each event gets the last variant started before it
        out.loc[out.start_us >= t0, "variant"] = variant
    out = out[out.variant != ""]
    for t0, variant in starts:
        out.loc[out.variant == variant, "start_us"] -= t0
    out["rank"] = int(rank)
    return out[EVENT_COLUMNS].sort_values(["variant", "start_us"], kind="stable").reset_index(drop=True)
