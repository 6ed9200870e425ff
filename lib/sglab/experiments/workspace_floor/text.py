"""The sentences notebook 02 prints between its tables: each computed from a run or the simulation, so the text
and the numbers cannot disagree."""

from __future__ import annotations

from sglab.experiments.workspace_floor import analysis
from sglab.experiments.workspace_floor.profile import COST_VARIANT
from sglab.experiments.workspace_floor.simulation import MiB

NO_TRACE = ("this run predates profiler traces (method version {mv}, no `events` sidecar); a new recording "
            "(`sglab record workspace_floor`) adds the traced pass")


def floor_effect(sim, world_sizes=(2, 4)) -> list[str]:
    """Per world size and trace: what x.shape[0] and the 2048 floor cost in re-creations and MiB (simulated)."""
    out = []
    for W in world_sizes:
        c = analysis.counts_table(sim, world_size=W)
        for name in sorted(set(c.index.get_level_values("trace"))):
            a, b = c.loc[(name, "cold", "floor_0")], c.loc[(name, "cold", "floor_2048")]
            p = c.loc[(name, "preinit_2048", "floor_0")]
            out.append(f"W={W} {name:>10}: x.shape[0] -> {a.recreations:.0f} re-creations at {a.peak_workspace:.0f} "
                       f"MiB/rank; floor 2048 -> {b.recreations:.0f} at {b.peak_workspace:.0f} MiB/rank (removes "
                       f"{a.recreations - b.recreations:.0f}, costs {b.peak_workspace - a.peak_workspace:+.0f} "
                       f"MiB/rank); with the 2048 pre-init x.shape[0] already gives {p.recreations:.0f}")
    return out


def consistency(run) -> str:
    t = analysis.consistency_table(run)
    same = ((t.recreations == t.recreations_simulated).all()
            and (t.peak_workspace == t.peak_workspace_simulated).all())
    extra = sorted(float(x) for x in t["measured - computed MiB"].unique())
    return (f"W={analysis.run_world_size(run)}: GPU re-creations == simulation in {len(t)} (trace, policy) cells: "
            f"{bool(same)}; measured - computed peak per rank: {extra} MiB (the int64 pointer table's "
            "caching-allocator segment)")


def policies(run) -> list[str]:
    t, W = analysis.policy_stats(run), analysis.run_world_size(run)
    out = []
    for name in sorted(set(t.index.get_level_values("trace"))):
        a, b = t.loc[(name, "floor_0")], t.loc[(name, "floor_2048")]
        out.append(f"W={W} {name:>10}: x.shape[0]: {a.recreations:.0f} re-creations, {a.recreate_time_total:.1f} ms "
                   f"host-blocking (slowest rank), {a.peak_workspace:.0f} MiB/rank; max(x.shape[0], 2048): "
                   f"{b.recreations:.0f}, {b.recreate_time_total:.1f} ms, {b.peak_workspace:.0f} MiB/rank")
    return out


def cost_step(run) -> str:
    s = analysis.cost_step(run)
    return (f"W={analysis.run_world_size(run)}: creation {s['create_below']:.1f} ms with Lamport buffers <= 336 MiB, "
            f"{s['create_above']:.1f} ms with >= 672 MiB ({s['create_above'] / s['create_below']:.1f}×); the IPC-open "
            f"phase {s['open_below']:.1f} -> {s['open_above']:.1f} ms")


def leak(table, n_runs: int) -> str:
    bad = (table.fillna(0).abs() > 0).any(axis=1)
    if not bad.any():
        return (f"leak check: every rank back to 0 MiB on its GPU and on the others, no rank process left, in all "
                f"{n_runs} runs")
    return f"leak check FAILED for {list(table.index[bad])}"


def trace_step(events, *, world_size: int, hidden_dim: int) -> list[str]:
    """Where the creation cost steps up, read from the traced cost sizes: which phase and call grow, by how much,
    whether the growth follows the bytes or the size of one allocation, and what the trace rules out."""
    from sglab.fixes import workspace_floor as wf

    from sglab.experiments.workspace_floor.profile_figures import phase_frame

    r = analysis.creation_ranges(events)
    cost = r[r.variant == COST_VARIANT].groupby("tokens").ms.max()
    ob, ph = analysis.open_by_buffer(events), phase_frame(events)
    lam = {int(T): wf.workspace_sizes(world_size, int(T), hidden_dim)["aligned"][2] / MiB for T in cost.index}
    lo, hi = [T for T in cost.index if lam[int(T)] <= 336], [T for T in cost.index if lam[int(T)] >= 672]
    if not lo or not hi:
        return ["the traced sizes do not straddle the 336 -> 672 MiB Lamport step"]
    a, b, top = max(lo), min(hi), max(cost.index)
    step = cost[b] - cost[a]
    grow = (ph.loc[b] - ph.loc[a]).sort_values(ascending=False)
    small = [k for k, v in grow.items() if v < 0.1 * step]
    data_mib = wf.workspace_sizes(world_size, int(top), hidden_dim)["aligned"][0] / MiB
    return [
        f"traced creation T={int(a)} (Lamport {lam[int(a)]:.0f} MiB): {cost[a]:.1f} ms; T={int(b)} "
        f"({lam[int(b)]:.0f} MiB): {cost[b]:.1f} ms ({cost[b] / cost[a]:.1f}×, +{step:.1f} ms)",
        f"largest growth: '{grow.index[0]}' +{grow.iloc[0]:.1f} ms; one cudaIpcOpenMemHandle of the Lamport buffer "
        f"{ob.loc[a, 'lamport']:.2f} -> {ob.loc[b, 'lamport']:.2f} ms, and {ob.loc[top, 'lamport']:.2f} ms at "
        f"T={int(top)} ({lam[int(top)]:.0f} MiB)",
        f"one open of the data buffer: {ob['data'].min():.2f}-{ob['data'].max():.2f} ms at every traced size, "
        f"{data_mib:.0f} MiB (T={int(top)}) included; flags buffer {ob['flags'].median():.2f} ms",
        f"each grew by less than a tenth of the step (ruled out as its cause): {', '.join(small)}",
        *long_calls(events, int(b)),
    ]


def long_calls(events, tokens: int, min_ms: float = 1.0) -> list[str]:
    """Per rank, the CUDA calls over ``min_ms`` inside the traced creation of size ``tokens``, in order: shows
    whether the ranks' slow calls overlap or one rank waits in an unrelated call while the other works."""
    d = events[(events.variant == COST_VARIANT) & (events.tokens == tokens) & (events.category == "runtime")
               & (events.dur_us >= min_ms * 1e3)].sort_values("start_us")
    return [f"rank {int(rank)}, T={tokens}, calls over {min_ms:g} ms: " + ", ".join(
        f"{r.name} in '{r.phase}' {r.dur_us / 1e3:.1f} ms" for r in g.itertuples()) for rank, g in d.groupby("rank")]


def first_open(events) -> str:
    """Along the replay: the first IPC open of every creation (the data buffer) against the two after it."""
    d = events[(events.category == "runtime") & events.name.str.contains("IpcOpenMemHandle")
               & (events.variant != COST_VARIANT)]
    if d.empty:
        return "no IPC opens in the trace"
    by = d.groupby(d.phase.str.replace("ipc open ", "", regex=False)).dur_us.median() / 1e3
    return (f"along the replay, one IPC open takes {by.get('data', float('nan')):.2f} ms for the data buffer (the "
            f"first of each creation) and {by.get('flags', float('nan')):.2f} / {by.get('lamport', float('nan')):.2f}"
            f" ms for the flags / Lamport buffers opened right after it (medians, {len(d)} opens)")
