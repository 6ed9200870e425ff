"""Tables and figures of notebook 02, from the simulation (CPU) or a run (recorded or live), and
"your own setup".

- the slide: :func:`mechanism`, the workspace each policy holds along the short-prompt cold start;
- the simulation: :func:`simulation` (re-creations per policy along both traces, memory against
  re-creations);
- GPU sections, each taking the run (or a NoRun, then printing its one line): :func:`replay` (the
  replay per policy), :func:`cost` (what one creation costs, its repeatability), :func:`leaks`,
  :func:`profiler` (the re-creations in the profiler trace and why the cost steps up);
- the real engine at TP 2 and 4 beside the rebuild: :func:`engine`, :func:`beside`.

Your own traffic (``sglab workspace``, the notebook's last cell) lives in :mod:`.traffic`.

Times are host wall-clock ms per rank; tables take the slowest rank (``max`` over ranks), since a
re-creation blocks every rank until the last one is done.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
from typing import Optional

import numpy as np
import pandas as pd

from sglab.core import notebook, plots, runs
from sglab.core.trace import PHASE_PREFIX
from sglab.sglang import engine as eng
from sglab.core import engine_view
from sglab.workspace_floor import measure, rebuild
from sglab.workspace_floor.measure import COST_VARIANT, EXPERIMENT, run_hidden, run_world_size
from sglab.workspace_floor.rebuild import MiB
from sglab.workspace_floor.traffic import your_setup  # noqa: F401 (the notebook's last cell)


POLICY_ORDER = list(rebuild.POLICIES)
LABEL = {"floor_0": "x.shape[0]", "floor_2048": "max(x.shape[0], 2048)"}
SHORT = {"before_pr": "before PR", "shape_no_hwm": "shape, no hwm", "floor_0": "shape"}
NO_TRACE = ("this run predates profiler traces (method version {mv}, no `events` sidecar); a new "
            "recording (`sglab record workspace_floor`) adds the traced pass")


def every_run(run) -> list:
    """Every run of this session: the live ones, else every recorded run (older repeats too)."""
    return list(run.shown) if run.live else runs.load_all_recorded(EXPERIMENT)


def _ticks():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}")


# --------------------------------------------------------------------------------------------------
# tables of a run
# --------------------------------------------------------------------------------------------------
def policy_stats(run) -> pd.DataFrame:
    """Per (trace, policy) of the GPU replay: re-creations, ms (median per creation, totals) and
    peak MiB, slowest rank."""
    d = run.df[(run.df.source == "gpu") & run.df.variant.isin(POLICY_ORDER)]
    t = d.pivot_table(index=["trace", "variant"], columns="metric", values="value", aggfunc="max")
    return t[[
        c for c in ("recreations", "create_time_median", "create_time_total", "recreate_time_total",
                    "peak_workspace", "peak_workspace_measured", "refused_calls") if c in t.columns
    ]]


def consistency(run) -> str:
    """The GPU replay against the simulation stored with the run, in one line."""
    d = run.df
    sim = d[(d.source == "simulated") & (d.scenario == "cold")].pivot_table(
        index=["trace", "variant"], columns="metric", values="value", aggfunc="max")
    t = policy_stats(run).join(sim.add_suffix("_simulated"))
    same = ((t.recreations == t.recreations_simulated)
            & (t.peak_workspace == t.peak_workspace_simulated)).all()
    extra = sorted(set((t.peak_workspace_measured - t.peak_workspace).round(3)))
    gap = f"{extra[0]:g}" if len(extra) == 1 else f"{extra[0]:g} to {extra[-1]:g}"
    return (f"W={run_world_size(run)}: GPU re-creations and sizes == simulation in {len(t)} "
            f"(trace, policy) cells: {'yes' if same else 'no'}; measured − computed peak per rank: "
            f"{gap} MiB (the int64 pointer table's caching-allocator segment)")


def gpu_event_frame(df, trace_name: str) -> pd.DataFrame:
    """Per policy and creation along a trace: step, size and ms to destroy the old + create the
    new workspace, slowest rank."""
    ev = df[df.metric.isin(["event_create", "event_destroy"]) & (df.trace == trace_name)]
    ev = ev.groupby(["variant", "step", "tokens", "rank"], as_index=False)["value"].sum()
    return ev.groupby(["variant", "step", "tokens"], as_index=False)["value"].max()


def leak_table(runs_: list) -> pd.DataFrame:
    """Per run and rank: MiB above the baseline (after each policy, at the end: cudaMemGetInfo and
    NVML, own GPU and others), then the rank processes and their memory left."""
    rows = []
    for r in runs_:
        d = r.df[r.df.source == "gpu"]
        lk = d[d.variant == "leak_check"]
        left = lk[lk["rank"].isna()].set_index("metric")["value"]
        for rank, g in d[d["rank"].notna()].groupby("rank"):
            m = g[g.variant == "leak_check"].set_index("metric")["value"]
            rows.append({
                "run": r.path.stem, "W": run_world_size(r), "rank": int(rank),
                "one-time driver setup": m.get("one_time_driver_setup"),
                "after each policy (max)": g[g.metric == "mem_after_cleanup"]["value"].abs().max(),
                "end, cudaMemGetInfo": m.get("rank_mem_delta_cudart"),
                "end, NVML own GPU": m.get("rank_mem_delta_nvml"),
                "end, NVML other GPUs": m.get("rank_nvml_other_gpus_end"),
                "rank processes left": left.get("rank_processes_left"),
                "their GPU MiB left": left.get("gpu_mem_of_rank_pids_after")
            })
    return pd.DataFrame(rows).set_index(["run", "W", "rank"])


def cost_frame(df) -> pd.DataFrame:
    """Median and p10 / p90 creation (and per-phase) ms per T, slowest rank (GPU cost sweep)."""
    d = df[(df.variant == "cost_sweep") & df.metric.isin(["time_median", "time_p10", "time_p90"])]
    return d.pivot_table(index=["tokens", "phase"], columns="metric", values="value", aggfunc="max")


def phase_table(run) -> pd.DataFrame:
    """Median ms per creation phase and T (slowest rank), with the per-rank sizes that drive
    them."""
    W, H = run_world_size(run), run_hidden(run)
    t = cost_frame(run.df)["time_median"].unstack("phase")
    t.insert(0, "Lamport MiB",
             [rebuild.workspace_sizes(W, int(T), H)["aligned"][2] / MiB for T in t.index])
    t.insert(1, "workspace MiB",
             [rebuild.workspace_bytes_per_rank(W, int(T), H) / MiB for T in t.index])
    t.index = t.index.astype(int)
    return t


def cost_step(run, below_mib: float = 336, above_mib: float = 672) -> str:
    """Median creation and IPC-open ms with Lamport buffers <= ``below_mib`` against >=
    ``above_mib``, in one line."""
    p = phase_table(run)
    lo, hi = p[p["Lamport MiB"] <= below_mib], p[p["Lamport MiB"] >= above_mib]
    a, b = lo.create.median(), hi.create.median()
    return (f"W={run_world_size(run)}: creation {a:.1f} ms with Lamport buffers <= {below_mib} "
            f"MiB, {b:.1f} ms with >= {above_mib} MiB ({b / a:.1f}×); the IPC-open phase "
            f"{lo.open.median():.1f} -> {hi.open.median():.1f} ms")


def repeatability_table(runs_: list, world_size: int) -> pd.DataFrame:
    """Runs of one world size side by side: creation ms per T and per-policy totals, the ratio
    newest / oldest, and a ``note`` where a run has no such cell (its sweep did not measure that
    size: the cell stays blank instead of a bare NaN)."""
    same = sorted((r for r in runs_ if run_world_size(r) == world_size),
                  key=lambda r: str(r.manifest.created_utc))
    cost = pd.DataFrame({
        r.path.stem: cost_frame(r.df).xs("create", level="phase")["time_median"]
        for r in same
    })
    cost.index = [f"create T={int(t)}" for t in cost.index]
    tot = pd.DataFrame({r.path.stem: policy_stats(r)["recreate_time_total"] for r in same})
    tot.index = [f"{a} {b} total" for a, b in tot.index]
    t = pd.concat([cost, tot])
    if len(same) >= 2:
        t["ratio newest/oldest"] = t.iloc[:, -1] / t.iloc[:, 0]
    lacking = t.iloc[:, :len(same)].isna()
    t["note"] = [
        "; ".join(_not_measured(label, r) for r in same if lacking.at[label, r.path.stem])
        for label in t.index
    ]
    return t


def _not_measured(label: str, run) -> str:
    p = run.manifest.params
    if label.startswith("create T="):
        return (f"{run.path.stem[:16]}: its cost sweep has no {label[7:]} (sizes "
                f"{p.get('cost_tokens')})")
    return f"{run.path.stem[:16]}: not replayed (traces {p.get('traces')})"


# --------------------------------------------------------------------------------------------------
# tables of the profiler trace (the run's ``events`` sidecar)
# --------------------------------------------------------------------------------------------------
CALLS = {  # each creation's CUDA runtime or driver calls (cuda.bindings may reach either name)
    "alloc": r"^(cudaMalloc|cuMemAlloc)", "free": r"^(cudaFree|cuMemFree)",
    "ipc get handle": r"^cu(da)?IpcGetMemHandle", "ipc open": r"^cu(da)?IpcOpenMemHandle",
    "ipc close": r"^cu(da)?IpcCloseMemHandle", "lamport fill": r"^cuMemsetD16",
    "synchronize": r"Synchronize"
}
PHASE_ORDER = [
    "destroy old workspace", "preflight", "alloc", "ipc get handle", "exchange handles",
    "ipc open data", "ipc open flags", "ipc open lamport", "lamport fill", "metadata", "barrier"
]
PHASE_COLORS = [
    "#bdc3c7", "#7f8c8d", "#2471a3", "#76d7c4", "#a9cce3", "#f5b041", "#dc7633", "#a04000",
    "#229954", "#7d3c98", "#34495e"
]


def call_group(name: str) -> str:
    return next((g for g, rx in CALLS.items() if re.search(rx, name)), "")


def creation_ranges(events) -> pd.DataFrame:
    """One row per traced creation: variant, rank, creation, step, tokens and its ms."""
    r = events[(events.category == "range")
               & events.name.str.endswith((rebuild.RECREATE_RANGE, measure.COST_RANGE))
               & ~events.lane.str.startswith(("stream", "device"))]
    out = r[["variant", "rank", "creation", "step", "tokens"]].assign(ms=r.dur_us / 1e3)
    return out.sort_values(["variant", "rank", "creation"]).reset_index(drop=True)


def trace_recreation_table(events) -> pd.DataFrame:
    """Per profiled policy: re-creation ranges per rank (they must agree) and the time in them,
    slowest rank."""
    r = creation_ranges(events)
    per_rank = r[r.variant != COST_VARIANT].groupby(["variant",
                                                     "rank"]).agg(ranges=("ms", "size"),
                                                                  total_ms=("ms", "sum"))
    t = per_rank.groupby("variant").agg(ranges_min=("ranges", "min"), ranges_max=("ranges", "max"),
                                        total_ms=("total_ms", "max"))
    return t.reindex([v for v in POLICY_ORDER if v in t.index])


def _calls(events, groups=None) -> pd.DataFrame:
    d = events[events.category == "runtime"]
    d = d.assign(call=d.name.map(call_group))
    return d[d.call.isin(groups) if groups else d.call != ""]


def call_table(events, rank: int = 0) -> pd.DataFrame:
    """The CUDA calls inside one rank's creations: per variant and call, calls per creation, median
    µs per call, total ms."""
    d = _calls(events[events["rank"] == rank])
    n = events[events["rank"] == rank].groupby("variant").creation.nunique()
    t = d.groupby(["variant", "call",
                   "name"]).agg(calls=("dur_us", "size"), median_us=("dur_us", "median"),
                                total_ms=("dur_us", lambda s: s.sum() / 1e3))
    t["per creation"] = t.calls / n.reindex(t.index.get_level_values("variant")).to_numpy()
    return t[["per creation", "median_us", "total_ms"]]


def open_by_buffer(events) -> pd.DataFrame:
    """Cost sizes: median ms of one IPC open per buffer and workspace T (slowest rank)."""
    d = _calls(events[events.variant == COST_VARIANT], ["ipc open"])
    d = d.assign(buffer=d.phase.str.replace("ipc open ", "", regex=False))
    t = d.groupby(["tokens", "buffer", "rank"]).dur_us.median().groupby(["tokens", "buffer"]).max()
    return (t / 1e3).unstack("buffer")


def ipc_calls_per_creation(events) -> pd.DataFrame:
    """Per (variant, rank, creation): IPC handle gets and opens (3 and 3(W-1) expected)."""
    d = _calls(events, ["ipc get handle", "ipc open"])
    keys = creation_ranges(events)[["variant", "rank", "creation"]]
    c = d.groupby(["variant", "rank", "creation", "call"]).size().unstack("call", fill_value=0)
    return keys.set_index(["variant", "rank", "creation"]).join(c).fillna(0).astype(int)


def phase_frame(events) -> pd.DataFrame:
    """Cost sizes: ms per creation phase (sub-range) of the slowest rank's creation per T (one rank
    per size, so the phases add up to that creation); ``ipc open`` by buffer."""
    cr = creation_ranges(events)
    cr = cr[cr.variant == COST_VARIANT]
    slowest = cr.loc[cr.groupby("tokens").ms.idxmax(), ["tokens", "rank"]]
    d = events[(events.variant == COST_VARIANT) & (events.category == "range")
               & ~events.lane.str.startswith(
                   ("stream", "device"))].merge(slowest, on=["tokens", "rank"])
    sub = d.name.str.replace(PHASE_PREFIX, "", regex=False)
    d = d.assign(sub=sub.where(sub.str.startswith("ipc open"),
                               sub.str.replace(r" (data|flags|lamport)$", "", regex=True)))
    t = d[d["sub"].isin(PHASE_ORDER)].groupby(["tokens", "sub"]).dur_us.sum().unstack("sub") / 1e3
    return t[[c for c in PHASE_ORDER if c in t.columns]].fillna(0.0)


def trace_step(events, *, world_size: int, hidden_dim: int) -> list[str]:
    """Where the creation cost steps up, read from the traced cost sizes: which phase and call grow,
    by how much, whether the growth follows the bytes or the size of one allocation, what the trace
    rules out; then each rank's long calls in the first creation above the step."""
    r = creation_ranges(events)
    cost = r[r.variant == COST_VARIANT].groupby("tokens").ms.max()
    ob, ph = open_by_buffer(events), phase_frame(events)
    lam = {
        int(T): rebuild.workspace_sizes(world_size, int(T), hidden_dim)["aligned"][2] / MiB
        for T in cost.index
    }
    lo, hi = [T for T in cost.index if lam[int(T)] <= 336
              ], [T for T in cost.index if lam[int(T)] >= 672]
    if not lo or not hi:
        return ["the traced sizes do not straddle the 336 -> 672 MiB Lamport step"]
    a, b, top = max(lo), min(hi), max(cost.index)
    step = cost[b] - cost[a]
    grow = (ph.loc[b] - ph.loc[a]).sort_values(ascending=False)
    data_mib = rebuild.workspace_sizes(world_size, int(top), hidden_dim)["aligned"][0] / MiB
    long = events[(events.variant == COST_VARIANT) & (events.tokens == b)
                  & (events.category == "runtime") & (events.dur_us >= 1e3)].sort_values("start_us")
    return [
        f"traced creation T={int(a)} (Lamport {lam[int(a)]:.0f} MiB): {cost[a]:.1f} ms; T={int(b)} "
        f"({lam[int(b)]:.0f} MiB): {cost[b]:.1f} ms ({cost[b] / cost[a]:.1f}×, +{step:.1f} ms)",
        f"largest growth: '{grow.index[0]}' +{grow.iloc[0]:.1f} ms; one cudaIpcOpenMemHandle of "
        f"the Lamport buffer {ob.loc[a, 'lamport']:.2f} -> {ob.loc[b, 'lamport']:.2f} ms, and "
        f"{ob.loc[top, 'lamport']:.2f} ms at T={int(top)} ({lam[int(top)]:.0f} MiB)",
        f"one open of the data buffer: {ob['data'].min():.2f}-{ob['data'].max():.2f} ms at every "
        f"traced size, {data_mib:.0f} MiB (T={int(top)}) included; flags buffer "
        f"{ob['flags'].median():.2f} ms",
        "each grew by less than a tenth of the step (ruled out as its cause): " + ", ".join(
            k for k, v in grow.items() if v < 0.1 * step),
        *(f"rank {int(rank)}, T={int(b)}, calls over 1 ms: " + ", ".join(
            f"{c.name} in '{c.phase}' {c.dur_us / 1e3:.1f} ms" for c in g.itertuples())
          for rank, g in long.groupby("rank"))
    ]


def first_open(events) -> str:
    """Along the replay: the first IPC open of every creation (the data buffer) against the two
    after it."""
    d = events[(events.category == "runtime") & events.name.str.contains("IpcOpenMemHandle")
               & (events.variant != COST_VARIANT)]
    if d.empty:
        return "no IPC opens in the trace"
    by = d.groupby(d.phase.str.replace("ipc open ", "", regex=False)).dur_us.median() / 1e3
    nan = float("nan")
    return (f"along the replay, one IPC open takes {by.get('data', nan):.2f} ms for the data "
            f"buffer (the first of each creation) and {by.get('flags', nan):.2f} / "
            f"{by.get('lamport', nan):.2f} ms for the flags / Lamport buffers opened right after "
            f"it (medians, {len(d)} opens)")


# --------------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------------
def mechanism(run=None, *, trace_name: str = "short_ramp", policies=("floor_0", "floor_2048"),
              hidden_dim: int = 7168):
    """The slide: the workspace size each policy holds along the trace (a staircase), a mark at
    every re-creation (area ~ its MiB per rank), per policy the count (simulation, exact) and, for
    the first shown run, its GPU ms."""
    run = run.first if run else None
    W = run_world_size(run) if run is not None else 2
    sched = pd.DataFrame([{
        "policy": name, "step": e.step, "tokens": e.max_token_num, "MiB": e.bytes_per_rank / MiB
    } for name in policies for e in measure.simulated(trace_name, name, W, hidden_dim)[0].events])
    tokens = measure.trace_tokens(trace_name)
    xmax = int(int(sched.step.max()) * 1.15) + 5
    fig, ax = plots.figure(width=11, height=4.6)
    ax.plot(range(xmax), tokens[:xmax], lw=0.6, color="#95a5a6",
            label="x.shape[0] per forward step")
    ax.axhline(rebuild.PR_FLOOR, color="#7f8c8d", lw=0.8, ls=":")
    ev = gpu_event_frame(run.df, trace_name) if run is not None else None
    for name in policies:
        s, e = sched[sched.policy == name], ev[ev.variant == name] if ev is not None else None
        ms = {} if e is None else {int(a): float(b) for a, b in zip(e.step, e.value)}
        color = {"floor_0": plots.PALETTE["before"],
                 "floor_2048": plots.PALETTE["after"]}.get(name, plots.PALETTE["neutral"])
        steps = s.step.clip(lower=0)
        ax.step(
            list(steps) + [xmax],
            list(s.tokens) + [list(s.tokens)[-1]], where="post", color=color, lw=1.6)
        label = (f"{LABEL.get(name, name)}{' — the PR' if name == 'floor_2048' else ''}: {len(s)} "
                 f"re-creation{'s' if len(s) != 1 else ''}, peak {s.MiB.max():.0f} MiB/rank"
                 + (f", {sum(ms.get(int(x), 0.0) for x in s.step):.0f} ms" if ms else ""))
        ax.scatter(steps, s.tokens, s=25 + 2.0 * s.MiB, color=color, alpha=0.75, zorder=3,
                   edgecolors="white", linewidths=0.6, label=label)
        for x, t, mib in zip(steps, s.tokens, s.MiB):
            note = f"{int(t)}" + (f" · {ms[int(x)]:.1f} ms" if int(x) in ms else "")
            ax.annotate(note, (x, t), xytext=(0, 7 + 0.05 * mib), textcoords="offset points",
                        rotation=90, fontsize=6.5, ha="center", va="bottom", color=color)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(_ticks())
    ax.set_ylim(0.8, 2**15)
    ax.set_xlim(-5, xmax)
    ax.set_xlabel(f"forward step of the '{trace_name}' trace (steps {xmax}–{len(tokens)}: no "
                  "re-creation under either policy)")
    ax.set_ylabel("tokens (log2)")
    ax.set_title(f"Cold start on short prompts, W={W}, H={hidden_dim}: the workspace is re-created "
                 "whenever x.shape[0] outgrows it")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, markerscale=0.5)
    plots.caption(
        fig, run, extra="counts and sizes: simulation of the rebuild (exact); mark area ~ "
        "workspace MiB/rank" + ("; ms: destroy + create, slowest rank" if run else ""))
    return fig


def events_figure(trace_name: str, panels: dict, *, note: str, source=None):
    """The trace on top; under it one panel per entry of ``panels`` (``{title: frame of variant,
    step, area[, ms]}``): a row per policy, a dot per (re-)creation, its count (and total ms) at the
    right."""
    fig, axes = plots.figure(1, 1 + len(panels), width=11, height=2.2 + 2.4 * len(panels),
                             sharex=True, height_ratios=[1] + [2] * len(panels))
    axes = axes[:, 0]
    tokens = measure.trace_tokens(trace_name)
    axes[0].plot(range(len(tokens)), tokens, lw=0.6, color="0.4")
    axes[0].set_ylabel("x.shape[0]")
    axes[0].set_title(f"trace '{trace_name}': (re-)creations per policy, cold start")
    for ax, (title, ev) in zip(axes[1:], panels.items()):
        for i, name in enumerate(POLICY_ORDER):
            e = ev[ev.variant == name]
            if len(e):
                ax.scatter(e.step.clip(lower=0), [i] * len(e), s=e.area, alpha=0.7)
                ax.annotate(f"{len(e)}×" + (f" {e.ms.sum():.0f} ms" if "ms" in e else ""),
                            (1.005, i), xycoords=("axes fraction", "data"), va="center", fontsize=8)
        ax.set_yticks(range(len(POLICY_ORDER)), POLICY_ORDER)
        ax.set_ylabel(title)
    for ax in axes:
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(-0.5, len(tokens) * 1.05)
    axes[-1].set_xlabel("forward step (symlog: linear below 10)")
    plots.caption(fig, source, extra=note)
    return fig


def tradeoff_figure(cells: dict, *, x: str, ms: Optional[str] = None, xlabel: str, note: str,
                    source=None):
    """Re-creations against peak MiB per rank, one panel per ``(trace, world size)`` of ``cells``
    (tables indexed by policy), each point labelled with its policies (and their ms)."""
    traces, worlds = sorted({t for t, _ in cells}), sorted({w for _, w in cells})
    fig, axes = plots.figure(len(worlds), len(traces), width=6 * len(worlds), height=7)
    for (tname, W), t in cells.items():
        ax = axes[traces.index(tname)][worlds.index(W)]
        ax.scatter(t[x], t.recreations, s=40, color=f"C{worlds.index(W)}")
        for (xv, yv), g in t.groupby([x, "recreations"]):
            text = "\n".join(
                SHORT.get(n, n.replace("floor_", "floor ")) +
                (f": {g.loc[n, ms]:.0f} ms" if ms else "") for n in POLICY_ORDER if n in g.index)
            ax.annotate(text, (xv, yv), fontsize=7, xytext=(4, 3), textcoords="offset points",
                        va="bottom", rotation=20)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_ticks())
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.margins(x=0.35, y=0.35)
        ax.set_ylim(bottom=0)
        ax.set(title=f"'{tname}', W={W}", xlabel=xlabel, ylabel="re-creations")
    plots.caption(fig, source, extra=note)
    return fig


def cost_figure(every: list, shown: list):
    """Creation ms against T for every run (the shown runs solid, older repeats dashed), and the
    IPC-open phase of the shown runs against the Lamport buffer size. Runs are matched by path,
    never by identity: ``every`` and ``shown`` may be separately loaded copies."""
    fig, axes = plots.figure(2, 1, width=12, height=4.2)
    ax_create, ax_open = axes[0]
    shown_paths = {r.path for r in shown}
    for r in sorted(every, key=lambda r: (run_world_size(r), str(r.manifest.created_utc))):
        W, H, newest = run_world_size(r), run_hidden(r), r.path in shown_paths
        c = cost_frame(r.df).reset_index()
        g = c[c.phase == "create"]
        mach = r.manifest.gpu_count_machine or r.manifest.gpu_count
        ax_create.errorbar(g.tokens, g.time_median, yerr=[
            g.time_median - g.time_p10, g.time_p90 - g.time_median
        ], marker="o", capsize=3, ls="-" if newest else "--",
                           label=f"W={W} ({mach}-GPU box, {r.path.stem[9:15]}Z)")
        if newest:
            o = c[c.phase == "open"]
            ax_open.plot(
                [rebuild.workspace_sizes(W, int(T), H)["aligned"][2] / MiB for T in o.tokens],
                o.time_median, marker="o", label=f"W={W}")
    ax_create.set(xlabel="workspace T (tokens, log2)",
                  ylabel="creation ms (median, p10-p90, slowest rank)")
    ax_open.set(xlabel="Lamport buffer per rank (MiB, log2)", ylabel="IPC-open phase, ms (median)")
    for ax in (ax_create, ax_open):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(_ticks())
            axis.set_minor_formatter(_ticks())
    p = shown[-1].manifest.params
    plots.caption(
        fig, shown[-1], extra=f"runs {', '.join(r.path.stem[:16] for r in shown)}; "
        f"H={p['hidden_dim']}, bf16, three IPC buffers + fill + barriers; median of "
        f"{p['cost_repeats']}; dashed: older repeats")
    return fig


def profile_overview(events, *, rank: int = 0, variants=("floor_0", "floor_2048"), run=None):
    """Swim-lanes of every re-creation of ``rank``, one group per policy, back to back (the replay
    between them cut), so the axis is time spent re-creating; IPC handle opens highlighted."""
    tables = {}
    for v in variants:
        d = events[(events.variant == v) & (events["rank"] == rank)]
        d = d[(d.category != "range") | d.name.str.endswith(rebuild.RECREATE_RANGE)]
        is_range = d.category == "range"  # each labelled with the workspace size it creates
        d = d.assign(name=d.name.where(~is_range, d.tokens.astype(int).astype(str) + " tok"))
        parts, t = [], 0.0
        for _, g in d.groupby("creation", sort=True):
            parts.append(g.assign(start_us=g.start_us - g.start_us.min() + t))
            t = float((parts[-1].start_us + g.dur_us).max()) + 300.0
        tables[f"{LABEL.get(v, v)} ({d.creation.nunique()}×)"] = (pd.concat(
            parts, ignore_index=True) if parts else d)
    fig = plots.timeline(
        tables, highlight=r"IpcOpenMemHandle", highlight_label="IPC handle open",
        categories=("runtime", "memset", "kernel", "range"),
        title=f"rank {rank}: every workspace re-creation of the cold start, back to back")
    plots.caption(
        fig, run, extra="torch.profiler; gaps between re-creations cut; outlines: "
        "'recreate workspace' ranges, labelled with the workspace T they create")
    return fig


def profile_step(events, *, world_size: int, hidden_dim: int, run=None):
    """Left: ms per creation phase for each traced size (stacked, slowest rank), labelled with the
    Lamport buffer's MiB. Right: one IPC open per buffer against the size of that buffer."""
    fig, axes = plots.figure(2, 1, width=12, height=4.4)
    ax, ax2 = axes[0]
    t = phase_frame(events)
    x, bottom = np.arange(len(t)), np.zeros(len(t))
    for col in t.columns:
        ax.bar(x, t[col], bottom=bottom, label=col, color=PHASE_COLORS[PHASE_ORDER.index(col)])
        bottom += t[col].to_numpy()
    sizes = {
        int(T): rebuild.workspace_sizes(world_size, int(T), hidden_dim)["aligned"]
        for T in set(t.index) | set(open_by_buffer(events).index)
    }
    ax.set_xticks(x, [f"T={int(T)}\n{sizes[int(T)][2] / MiB:.0f} MiB" for T in t.index], fontsize=8)
    ax.set(xlabel="workspace T and its Lamport buffer per rank",
           ylabel="ms per creation phase (traced, slowest rank's creation)")
    ax.legend(fontsize=7, ncol=2)
    ob = open_by_buffer(events)
    for name in ob.columns:
        ax2.plot([sizes[int(T)][rebuild.BUFFER_NAMES.index(name)] / MiB for T in ob.index],
                 ob[name], marker="o", ls="", label=f"{name} buffer")
    ax2.set_xscale("log", base=2)
    ax2.set(xlabel="size of the buffer opened (MiB per rank, log2)",
            ylabel="one IPC open (ms, median over peers, slowest rank)")
    ax2.legend(fontsize=8)
    plots.caption(fig, run, extra=f"torch.profiler, one traced creation per size, W={world_size}")
    return fig


# --------------------------------------------------------------------------------------------------
# the notebook's sections
# --------------------------------------------------------------------------------------------------
def simulation(world_size: int = 4, world_sizes=(2, 4), hidden_dim: int = 7168) -> None:
    """The simulation over both traces: the (re-)creations per policy along each trace (dot area ~
    workspace T), then memory against re-creations, cold start."""
    for tname in measure.TRACES:
        ev = pd.DataFrame([{"variant": n, "step": e.step, "area": 12 + 60 * e.max_token_num / 4096}
                           for n in POLICY_ORDER
                           for e in measure.simulated(tname, n, world_size, hidden_dim)[0].events])
        notebook.show_figure(
            events_figure(tname, {f"simulated, W={world_size}": ev},
                          note="simulated on the fake creator (no GPU); dot size ~ workspace T"))
    d = pd.DataFrame(
        measure.simulate_rows({"hidden_dim": hidden_dim}, world_sizes=list(world_sizes),
                              scenarios=(0,)))
    cells = {(t, W): g.pivot_table(index="variant", columns="metric", values="value")
             for (t, W), g in d[d.metric != "event_workspace"].groupby(["trace", "world_size"])}
    notebook.show_figure(
        tradeoff_figure(
            cells, x="peak_workspace", xlabel="peak workspace per rank"
            " (MiB, log2)", note="memory vs re-creations per "
            "policy, cold start, simulated; shape = x.shape[0]"))


@notebook.needs_run
def replay(run) -> None:
    """The GPU replay per policy of each shown run (ms and MiB: slowest rank), its agreement with
    the simulation, the re-creations along each trace (dot area ~ ms), memory against
    re-creations."""
    for r in run.shown:
        print(f"W={run_world_size(r)}: {r.path.name} ({r.label}) - GPU replay per policy")
        notebook.show_table(
            notebook.as_counts(policy_stats(r).round(1), ["recreations", "refused_calls"]))
        print(consistency(r))
    note = (f"runs {', '.join(r.path.stem[:16] for r in run.shown)}; cold start; ms: destroy + "
            "create, slowest rank")
    for tname in measure.TRACES:
        panels = {
            f"W={run_world_size(r)}": gpu_event_frame(r.df,
                                                      tname).assign(area=lambda e: 4 * e.value,
                                                                    ms=lambda e: e.value)
            for r in run.shown
        }
        notebook.show_figure(events_figure(tname, panels, note=note, source=run.shown[-1]))
    cells = {(t, run_world_size(r)): policy_stats(r).xs(t, level="trace")
             for r in run.shown
             for t in measure.TRACES}
    notebook.show_figure(
        tradeoff_figure(
            cells, x="peak_workspace_measured", ms="recreate_time_total", source=run.shown[-1],
            xlabel="peak workspace per rank, measured (MiB, log2)",
            note=note + "; labels: total ms; memory = cudaMemGetInfo above the baseline"))


@notebook.needs_run
def cost(run) -> None:
    """What one creation costs against T (every run; older repeats dashed), per shown run the ms per
    creation phase, then the world sizes recorded more than once side by side."""
    every = every_run(run)
    notebook.show_figure(cost_figure(every, run.shown))
    for r in run.shown:
        print(f"W={run_world_size(r)}: median ms per creation phase (slowest rank)")
        notebook.show_table(phase_table(r).round(2))
        print(cost_step(r))
    for W in sorted({run_world_size(r) for r in every}):
        if sum(run_world_size(r) == W for r in every) > 1:
            print(f"W={W}, every run: creation ms per T and re-creation ms per policy (blank: "
                  "not measured by that run, see note)")
            t = repeatability_table(every, W)
            notebook.show_table(t.round(2).astype(object).where(t.notna(), ""))


@notebook.needs_run
def leaks(run) -> None:
    """MiB above the baseline on every rank of every run, and the rank processes left."""
    every = every_run(run)
    t = leak_table(every)
    notebook.show_table(t)
    bad = (t.fillna(0).abs() > 0).any(axis=1)
    print(f"leak check FAILED for {list(t.index[bad])}" if bad.any(
    ) else "leak check: every rank back to 0 MiB on its GPU and on the others, no rank process "
          f"left, in all {len(every)} runs")


@notebook.needs_run
def profiler(run) -> None:
    """Per shown run with a trace: rank 0's re-creations back to back, the ranges per rank, the CUDA
    calls inside them, then where the creation cost steps up."""
    traced = [r for r in run.shown if r.sidecar("events") is not None]
    for r in run.shown:
        if r.sidecar("events") is None:
            print(f"{r.path.name}: " + NO_TRACE.format(mv=r.manifest.method_version))
    for r in traced:
        ev, W, H = r.sidecar("events"), run_world_size(r), run_hidden(r)
        notebook.show_figure(profile_overview(ev, run=r))
        notebook.show_table(trace_recreation_table(ev).round(1))
        for rank in sorted(ev["rank"].unique()):
            print(f"{r.path.name}, rank {rank}: CUDA calls inside the creations")
            notebook.show_table(call_table(ev, rank=int(rank)).round(1))
        notebook.show_figure(profile_step(ev, world_size=W, hidden_dim=H, run=r))
        print("\n".join(trace_step(ev, world_size=W, hidden_dim=H) + [first_open(ev)]))
    if not traced:
        print("no shown run has a trace; from the phase timings alone: " + "; ".join(
            cost_step(r) for r in run.shown))


# --------------------------------------------------------------------------------------------------
# the real engine at TP 2 and 4 (data/recorded/engine_workspace_floor/)
# --------------------------------------------------------------------------------------------------
# the call site each engine variant runs, as the rebuild's policy (the released managers keep no
# high-water mark)
ENGINE_POLICY = {("0.5.12.post1", "fusion"): "before_pr", ("0.5.13", "fusion"): "floor_2048",
                 ("0.5.13", "x-shape"): "shape_no_hwm"}


def engine_trace(entry: dict, spec: dict, decisions: dict) -> list[int]:
    """Every token count the call site can see in one engine run, in the engine's order: the
    decode-graph and piecewise captures (largest first), then each call's prefill and decode steps
    (warm-up calls included), kept where the fusion gate lets them through."""
    caps = sorted(decisions.get("decode_bs") or [], reverse=True) + sorted(
        decisions.get("pcg_tokens") or [], reverse=True)
    steps = []
    for il in spec.get("input_lens", []):
        for _ in range(int(spec.get("warmup", 0)) + int(spec.get("repeats", 1))):
            for n in spec.get("requests", [1]):
                steps += [il * n] + [n] * (int(spec.get("output_len", 1)) - 1)
    return rebuild.fused_steps(caps + steps)


def engine_facts(run) -> list[dict]:
    """Per engine variant of the run that started: its policy, the creations per rank and per
    manager and their sizes (the trace adjustment's lines), the creations inside the timed calls
    (forward steps), and the rebuild's simulation of the same trace with SGLang's pre-initialisation
    at 2048 tokens."""
    specs = {(s["release"], s["case"]): s for s in run.manifest.params.get("specs", [])}
    out = []
    for i, e in enumerate(run.manifest.engine_runs):
        key = (e["release"], e["case"])
        log = run.sidecar(f"log_{i}")
        if e.get("status") != "ok" or key not in ENGINE_POLICY or log is None:
            continue
        d = eng.read_log(gzip.decompress(log.read_bytes()).decode(errors="replace"))
        hidden = int(eng.text_config(e["model"]["config"])["hidden_size"])
        world = int(d["resolved"].get("tp_size", 2)) if d.get("resolved") else 2
        policy = dataclasses.replace(rebuild.POLICIES[ENGINE_POLICY[key]], high_water=False)
        trace = engine_trace(e, specs.get(key, {}), d)
        mgr, _ = rebuild.simulate(policy, trace, world_size=world, hidden_dim=hidden,
                                  pre_initialize=rebuild.FUSE_ALLREDUCE_MAX_BATCH_SIZE)
        ev = [x for x in d["events"] if x.get("event") == "workspace"]
        ranks = sorted({int(x["rank"]) for x in ev})
        per_rank = {r: [x for x in ev if int(x["rank"]) == r] for r in ranks}
        out.append({
            "variant": f"{key[0]}+{key[1]}", "policy": policy.name, "world": world, "per_rank": {
                r: len(v)
                for r, v in per_rank.items()
            }, "managers": {r: len({x.get("obj")
                                    for x in v})
                            for r, v in per_rank.items()},
            "sizes": sorted({int(x["max_token_num"])
                             for x in ev}), "in_calls": sum(c.get("events", 0) for c in d["calls"]),
            "calls": len(d["calls"]), "steps": len(trace), "sim": len(mgr.events),
            "sim_sizes": sorted({x.max_token_num
                                 for x in mgr.events}),
            "ms": sorted(float(x["seconds"]) * 1e3 for x in ev if "seconds" in x), "ms_by_rank": {
                r: [float(x["seconds"]) * 1e3 for x in v if "seconds" in x]
                for r, v in per_rank.items()
            }, "first_call_ms": {
                int(c["input_len"]): float(c["seconds"]) * 1e3
                for c in d["calls"] if int(c.get("warmup", 0))
            }, "call_ms": {
                int(c["input_len"]): float(c["seconds"]) * 1e3
                for c in d["calls"] if not int(c.get("warmup", 0))
            }
        })
    return out


def engine_facts_of(runs_: list) -> list[dict]:
    """:func:`engine_facts` over several runs (each read with its own log sidecars), the newest
    answer per TP size and variant."""
    best = {}
    for r in sorted(runs_, key=lambda r: r.manifest.created_utc):
        best.update({(f["world"], f["variant"]): f for f in engine_facts(r)})
    return [best[k] for k in sorted(best)]


def _label(f: dict) -> str:
    return f"TP {f['world']} · {f['variant']}"


def engine_table(facts: list[dict]) -> pd.DataFrame:
    """One row per engine variant: its call site (the rebuild's policy), the workspace creations
    per rank and their size, how many of them fell inside the forward steps, the rebuild's
    simulation of the same trace, and the time of each rank's first and second creation (the first
    on a fresh machine holds FlashInfer's kernel build)."""
    rows = []
    for f in facts:
        nth = [[v[i] for _, v in sorted(f["ms_by_rank"].items()) if len(v) > i] for i in (0, 1)]
        rows.append({
            "variant": _label(f),
            "call site": rebuild.POLICIES[f["policy"]].label, "creations per rank": "/".join(
                str(f["per_rank"][r]) for r in sorted(f["per_rank"])), "max_token_num": "/".join(
                    map(str,
                        f["sizes"])), "in forward steps": f"{f['in_calls']} in {f['calls']} calls",
            "simulated, per manager": f"{f['sim']} at {'/'.join(map(str, f['sim_sizes']))}",
            "1st creation (ms)": "/".join(f"{m:,.1f}" for m in nth[0]),
            "2nd creation (ms)": "/".join(f"{m:,.1f}" for m in nth[1])
        })
    return pd.DataFrame(rows).set_index("variant") if rows else pd.DataFrame()


def first_call_table(facts: list[dict]) -> pd.DataFrame:
    """Per prompt length, each variant's first generate call (untimed warm-up) beside its timed
    one, in ms: where a first call is slow, something was built or loaded then."""
    rows = []
    for f in facts:
        for n, ms in sorted(f["first_call_ms"].items()):
            rows.append({
                "variant": _label(f), "prompt tokens": n, "first call": ms,
                "timed call": f["call_ms"].get(n)
            })
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    return (df.pivot_table(index="variant", columns="prompt tokens",
                           values=["first call", "timed call"],
                           aggfunc="first").round(1).stack(level=0, future_stack=True))


def engine_reading(facts: list[dict]) -> list[str]:
    """What the engine runs say, in numbers read from them: creations per rank and when, and the
    first call of each prompt length above the fusion gate beside its timed call."""
    if not facts:
        return []
    per = sorted({n for f in facts for n in f["per_rank"].values()})
    sizes = sorted({s for f in facts for s in f["sizes"]})
    inside = sum(f["in_calls"] for f in facts)
    out = [
        f"every variant: {'/'.join(map(str, per))} creations per rank, all at "
        f"{'/'.join(map(str, sizes))} tokens, {inside} of them during the "
        f"{sum(f['calls'] for f in facts)} generate calls; the rebuild's simulation with "
        f"pre-initialisation: {'/'.join(str(f['sim']) for f in facts)} per manager"
    ]
    big = sorted({n for f in facts for n in f["first_call_ms"] if not rebuild.fusion_applies(n)})
    for n in big:
        first = [f["first_call_ms"][n] for f in facts if n in f["first_call_ms"]]
        timed = [f["call_ms"][n] for f in facts if n in f["call_ms"]]
        out.append(f"{n} tokens (above the fusion gate, no creation printed): first call "
                   f"{_ms_span(first)}, timed call {_ms_span(timed)}")
    first_create = [v[0] for f in facts for v in f["ms_by_rank"].values() if v]
    second = [v[1] for f in facts for v in f["ms_by_rank"].values() if len(v) > 1]
    if first_create and second:
        out.append(f"a rank's first creation {_ms_span(first_create)} (holding FlashInfer's "
                   f"kernel build where its cache was cold), its second {_ms_span(second)}")
    return out


def _ms_span(ms: list[float]) -> str:
    """``lo–hi`` in ms, or in s where the largest is a second or more."""
    lo, hi = min(ms), max(ms)
    if hi >= 1000:
        return f"{lo / 1e3:.1f}–{hi / 1e3:.1f} s"
    return f"{lo:.1f}–{hi:.1f} ms" if hi < 100 else f"{lo:.0f}–{hi:.0f} ms"


def engine(run) -> None:
    """SGLang's own engine at each recorded TP size with `--enable-flashinfer-allreduce-fusion`:
    the workspace creations per rank (the trace adjustment's lines), beside the rebuild's
    simulation of the same trace, then each prompt length's first and timed call."""
    facts = engine_facts_of(run.shown) if run else []
    tps = " and ".join(str(w) for w in sorted({f["world"] for f in facts})) or "2"
    if not engine_view.header(run, f"DeepSeek-V3-style 2 layers, TP {tps}"):
        return
    notebook.show_table(engine_table(facts))
    notebook.show_table(first_call_table(facts))
    for line in engine_reading(facts):
        print(line)


def beside_rows(run, engine_run) -> list[dict]:
    """Workspace creations as the rebuild (cold start, on real workspaces) and SGLang's engine
    (pre-initialised) count them, and what a creation costs in each."""
    rows = []
    if run:
        run = run.first
        gpu, w = runs.gpu_short(run.manifest), run_world_size(run)
        stats = policy_stats(run)
        for pol in ("floor_0", "floor_2048"):
            try:
                n = int(stats.loc[("short_ramp", pol), "recreations"])
            except (KeyError, TypeError, ValueError):
                continue
            rows.append({
                "source": f"rebuild ({gpu} TP {w}), cold start",
                "measures": f"creations along the short-prompt trace, "
                f"{rebuild.POLICIES[pol].label}", "figure": f"{n}"
            })
    else:
        rows.append({
            "source": "rebuild", "measures": getattr(run, "line", "no GPU run"), "figure": ""
        })
    if engine_run:
        for f in engine_facts_of(engine_run.shown):
            rows.append({
                "source": f"SGLang {f['variant']} engine (TP {f['world']})",
                "measures": f"creations per rank, {rebuild.POLICIES[f['policy']].label} "
                "(pre-initialised at 2048 before capture; the rebuild "
                f"simulates {f['sim']} per manager)",
                "figure": f"{max(f['per_rank'].values())} ({f['in_calls']} in forward steps)"
            })
    return rows


def beside(run, engine_run) -> None:
    """The rebuild beside the real engine (see :func:`beside_rows`)."""
    engine_view.beside(beside_rows(run, engine_run))
