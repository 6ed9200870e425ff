"""Claims read off the profiler trace (the run's ``events`` sidecar, method version 2 on).

The trace is a second, independent witness of the mechanism: the manager opens one ``recreate workspace`` range
per creation and the creator's CUDA calls happen inside it, so counting ranges and calls checks the replay
without trusting its own bookkeeping.
"""

from __future__ import annotations

from sglab.core.claims import Claim, holds

from sglab.experiments.workspace_floor import analysis
from sglab.experiments.workspace_floor.profile import COST_VARIANT
from sglab.experiments.workspace_floor.simulation import recreations

TRACE_METHODS = (2, None)


def _events(run):
    ev = run.sidecar("events")
    if ev is None:
        raise LookupError("the run has no events sidecar")
    return ev


def _applies(run):
    if run.manifest.get("params", {}).get("profile") is False:
        return "the run was recorded without the traced pass (profile=False)"
    if (run.manifest.get("sidecars") or {}).get("events") is None:
        return "the run has no profiler events (recorded before traces)"
    return None


def _profiled(run):
    p = run.manifest.get("params", {})
    return p.get("profile_trace", "short_ramp"), list(p.get("profile_policies", []))


def _ranges_equal_simulation(run):
    ev = _events(run)
    trace, policies = _profiled(run)
    W = analysis.run_world_size(run)
    r = analysis.creation_ranges(ev)
    r = r[r.variant != COST_VARIANT]
    got = r.groupby(["variant", "rank"]).size()
    problems, value = [], {}
    for n in policies:
        sim = recreations(trace, n, W, analysis.run_hidden(run))  # the traced replay: whole trace, cold start
        value[n] = sim
        for rank in range(W):
            have = int(got.get((n, rank), 0))
            if have != sim:
                problems.append(f"{n} rank {rank}: {have} ranges vs {sim}")
    text = (", ".join(f"{n}: {v} range{'s' if v != 1 else ''}" for n, v in value.items()) + f" on each of {W} ranks"
            if not problems else "; ".join(problems[:3]))
    return holds(bool(value) and not problems, text, value)


def _ipc_calls(run):
    W = analysis.run_world_size(run)
    t = analysis.ipc_calls_per_creation(_events(run))
    want = {"ipc get handle": 3, "ipc open": 3 * (W - 1)}
    bad = [f"{k}: {dict(zip(want, row))}" for k, row in
           zip(t.index, t.reindex(columns=list(want), fill_value=0).itertuples(index=False))
           if tuple(row) != tuple(want.values())]
    text = (f"{len(t)} traced creations (all ranks): each 3 handle exports, {3 * (W - 1)} opens" if not bad
            else f"{len(bad)} of {len(t)} creations differ, e.g. {bad[0]}")
    return holds(len(t) > 0 and not bad, text,
                 {"creations": len(t), "differ": len(bad)})


def _time_in_recreation(run):
    t = analysis.trace_recreation_table(_events(run))
    shape, floor = float(t.loc["floor_0", "total_ms"]), float(t.loc["floor_2048", "total_ms"])
    return holds(floor < shape, f"x.shape[0] {shape:.1f} ms, floor 2048 {floor:.1f} ms in 'recreate workspace' "
                                "(slowest rank)", {"floor_0 ms": shape, "floor_2048 ms": floor})


def _both_profiled(run):
    why = _applies(run)
    if why:
        return why
    _, policies = _profiled(run)
    return None if {"floor_0", "floor_2048"} <= set(policies) else "the traced pass lacks floor_0 or floor_2048"


TRACE_CLAIMS = [
    Claim("workspace_floor.trace_ranges_equal_simulation",
          "In the profiler trace every rank shows one 'recreate workspace' range per re-creation the simulation "
          "predicts, for each profiled policy", "== simulation per policy and rank (exact)",
          _ranges_equal_simulation, methods=TRACE_METHODS, applies=_applies),
    Claim("workspace_floor.trace_ipc_calls_per_creation",
          "Every traced creation exports 3 CUDA IPC handles and opens 3·(W-1), one per buffer and peer",
          "3 exports, 3(W-1) opens per creation and rank (exact)", _ipc_calls, methods=TRACE_METHODS,
          applies=_applies),
    Claim("workspace_floor.trace_time_in_recreation",
          "Time in 'recreate workspace' ranges, read from the trace: the floor spends less than x.shape[0] "
          "(slowest rank)", "floor 2048 < x.shape[0] (ms drift ±50%)", _time_in_recreation, methods=TRACE_METHODS,
          applies=_both_profiled, drift=0.5),
]
