"""Tables and figures of notebook 02 from the simulation or a run: the mechanism, the GPU replay, a
creation's cost, the profiler trace and the real engine. Tables take the slowest rank's host ms."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from sglab.core import engine_view, notebook, plots, text
from sglab.core.trace import PHASE_PREFIX
from sglab.workspace_floor import measure, rebuild, sglang, traces
from sglab.workspace_floor.measure import COST_VARIANT, run_hidden
from sglab.workspace_floor.rebuild import MiB, label
from sglab.workspace_floor.traffic import your_setup  # noqa: F401 (the notebook's last cell)


POLICY_ORDER = list(rebuild.POLICIES)
STORY = ("before_pr", "floor_0", "floor_2048")  # released before, the PR's first draft, merged
COLORS = dict(before_pr=plots.PALETTE["neutral"], floor_0=plots.PALETTE["before"],
              floor_2048=plots.PALETTE["after"])


def _ticks():
    return FuncFormatter(lambda v, _: f"{v:g}")


def named(df: pd.DataFrame, level: str = "variant") -> pd.DataFrame:
    """``df`` with the policy ids of index ``level`` read as their short names."""
    return df.rename(index=label, level=level)


def _lamport_mib(W: int, T, H: int) -> float:
    return rebuild.workspace_sizes(W, int(T), H)["aligned"][2] / MiB


# -- tables of a run -------------------------------------------------------------------------------
def policy_stats(run) -> pd.DataFrame:
    """Per (trace, policy id) of the GPU replay: re-creations, ms and peak MiB, slowest rank."""
    d = run.df[(run.df.source == "gpu") & run.df.variant.isin(POLICY_ORDER)]
    t = d.pivot_table(index=["trace", "variant"], columns="metric", values="value", aggfunc="max")
    cols = ("recreations", "create_time_median", "create_time_total", "recreate_time_total",
            "peak_workspace", "peak_workspace_measured", "refused_calls")
    order = sorted(t.index, key=lambda k: (k[0], POLICY_ORDER.index(k[1])))
    return t.loc[order, [c for c in cols if c in t.columns]]


def replay_table(run) -> pd.DataFrame:
    """:func:`policy_stats` for reading: policies by name, counts whole, units in the names."""
    t = text.counts(policy_stats(run).round(1), ["recreations", "refused_calls"])
    d = run.df[run.df.metric.isin(t.columns)]
    units = d.drop_duplicates("metric").set_index("metric")["unit"].to_dict()
    shown = {c: f"{c} ({units[c]})" for c in t.columns if units.get(c, "count") != "count"}
    return named(t.rename(columns=shown))


def cost_frame(df) -> pd.DataFrame:
    """Median and p10 / p90 creation (and per-phase) ms per T, slowest rank (GPU cost sweep)."""
    d = df[(df.variant == "cost_sweep") & df.metric.isin(["time_median", "time_p10", "time_p90"])]
    return d.pivot_table(index=["tokens", "phase"], columns="metric", values="value", aggfunc="max")


def phase_table(run) -> pd.DataFrame:
    """Median ms per creation phase and T (slowest rank), with the per-rank sizes."""
    W, H = run.manifest.tp, run_hidden(run)
    t = cost_frame(run.df)["time_median"].unstack("phase")
    t.insert(0, "Lamport MiB", [_lamport_mib(W, T, H) for T in t.index])
    t.insert(1, "workspace MiB",
             [rebuild.workspace_bytes_per_rank(W, int(T), H) / MiB for T in t.index])
    t.index = t.index.astype(int)
    return t


def cost_step(run, below_mib: float = 336, above_mib: float = 672) -> str:
    """Median creation and IPC-open ms, Lamport <= ``below_mib`` against >= ``above_mib``."""
    p = phase_table(run)
    lo, hi = p[p["Lamport MiB"] <= below_mib], p[p["Lamport MiB"] >= above_mib]
    a, b = lo.create.median(), hi.create.median()
    return (f"W={run.manifest.tp}: creation {a:.1f} ms with Lamport buffers <= {below_mib} "
            f"MiB, {b:.1f} ms with >= {above_mib} MiB ({b / a:.1f}×); the IPC-open phase "
            f"{lo.open.median():.1f} -> {hi.open.median():.1f} ms")


# -- tables of the profiler trace (the run's ``events`` sidecar) -----------------------------------
CALLS = {  # each creation's CUDA runtime or driver calls (cuda.bindings may reach either name)
    "alloc": r"^(cudaMalloc|cuMemAlloc)", "free": r"^(cudaFree|cuMemFree)",
    "ipc get handle": r"^cu(da)?IpcGetMemHandle", "ipc open": r"^cu(da)?IpcOpenMemHandle",
    "ipc close": r"^cu(da)?IpcCloseMemHandle", "lamport fill": r"^cuMemsetD16",
    "synchronize": r"Synchronize"
}
PHASE_COLORS = {
    "destroy old workspace": "#bdc3c7", "preflight": "#7f8c8d", "alloc": "#2471a3",
    "ipc get handle": "#76d7c4", "exchange handles": "#a9cce3", "ipc open data": "#f5b041",
    "ipc open flags": "#dc7633", "ipc open lamport": "#a04000", "lamport fill": "#229954",
    "metadata": "#7d3c98", "barrier": "#34495e"
}


def _host(events):
    return events[~events.lane.str.startswith(("stream", "device"))]


def creation_ranges(events) -> pd.DataFrame:
    """One row per traced creation: variant, rank, creation, step, tokens and its ms."""
    r = _host(events)
    r = r[(r.category == "range")
          & r.name.str.endswith((rebuild.RECREATE_RANGE, measure.COST_RANGE))]
    out = r[["variant", "rank", "creation", "step", "tokens"]].assign(ms=r.dur_us / 1e3)
    return out.sort_values(["variant", "rank", "creation"]).reset_index(drop=True)


def trace_recreation_table(events) -> pd.DataFrame:
    """Per profiled policy: re-creation ranges per rank and the time in them, slowest rank."""
    r = creation_ranges(events)
    by = r[r.variant != COST_VARIANT].groupby(["variant", "rank"]).ms
    per_rank = by.agg(ranges="size", total_ms="sum")
    t = per_rank.groupby("variant").agg(ranges_min=("ranges", "min"), ranges_max=("ranges", "max"),
                                        total_ms=("total_ms", "max"))
    return t.reindex([v for v in POLICY_ORDER if v in t.index])


def _calls(events, groups=None) -> pd.DataFrame:
    d = events[events.category == "runtime"]
    d = d.assign(
        call=d.name.map(lambda n: next((g for g, rx in CALLS.items() if re.search(rx, n)), "")))
    return d[d.call.isin(groups) if groups else d.call != ""]


def call_table(events, rank: int = 0) -> pd.DataFrame:
    """The CUDA calls inside one rank's creations: per creation, median µs, total ms."""
    mine = events[events["rank"] == rank]
    by = _calls(mine).groupby(["variant", "call", "name"]).dur_us
    t = by.agg(calls="size", median_us="median", total_ms=lambda s: s.sum() / 1e3)
    n = mine.groupby("variant").creation.nunique()
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
    """Cost sizes: ms per phase of the slowest rank's creation per T, IPC open by buffer."""
    cr = creation_ranges(events)
    cr = cr[cr.variant == COST_VARIANT]
    slowest = cr.loc[cr.groupby("tokens").ms.idxmax(), ["tokens", "rank"]]
    d = _host(events)
    d = d[(d.variant == COST_VARIANT) & (d.category == "range")].merge(
        slowest, on=["tokens", "rank"])
    sub = d.name.str.replace(PHASE_PREFIX, "", regex=False)
    d = d.assign(sub=sub.where(sub.str.startswith("ipc open"),
                               sub.str.replace(r" (data|flags|lamport)$", "", regex=True)))
    t = d[d["sub"].isin(PHASE_COLORS)].groupby(["tokens", "sub"]).dur_us.sum().unstack("sub") / 1e3
    return t[[c for c in PHASE_COLORS if c in t.columns]].fillna(0.0)


def trace_step(events, *, world_size: int, hidden_dim: int) -> list[str]:
    """Where the creation cost steps up, from the traced cost sizes: what grows, what does not."""
    r = creation_ranges(events)
    cost = r[r.variant == COST_VARIANT].groupby("tokens").ms.max()
    ob, ph = open_by_buffer(events), phase_frame(events)
    lam = {int(T): _lamport_mib(world_size, T, hidden_dim) for T in cost.index}
    lo = [T for T in cost.index if lam[int(T)] <= 336]
    hi = [T for T in cost.index if lam[int(T)] >= 672]
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
    """Along the replay: the first IPC open of every creation against the two after it."""
    d = _calls(events[events.variant != COST_VARIANT], ["ipc open"])
    if d.empty:
        return "no IPC opens in the trace"
    by = d.groupby(d.phase.str.replace("ipc open ", "", regex=False)).dur_us.median() / 1e3
    nan = float("nan")
    return (f"along the replay, one IPC open takes {by.get('data', nan):.2f} ms for the data "
            f"buffer (the first of each creation) and {by.get('flags', nan):.2f} / "
            f"{by.get('lamport', nan):.2f} ms for the flags / Lamport buffers opened right after "
            f"it (medians, {len(d)} opens)")


# -- figures ---------------------------------------------------------------------------------------
def mechanism(run=None, *, trace_name: str = "short_ramp", policies=STORY, hidden_dim: int = 7168):
    """The workspace each policy holds along a cold start, a mark at every creation."""
    run = run if run else None  # a Run, or a NoRun (the simulation alone)
    W = run.manifest.tp if run is not None else 2
    pre = rebuild.FUSE_ALLREDUCE_MAX_BATCH_SIZE
    tokens = traces.trace_tokens(trace_name)
    events = {n: traces.simulated(trace_name, n, W, hidden_dim)[0].events for n in policies}
    xmax = int(max(e.step for ev in events.values() for e in ev) * 1.15) + 5
    fig, ax = plots.figure(width=11, height=4.6)
    ax.plot(range(xmax), tokens[:xmax], lw=0.6, color="#95a5a6",
            label="x.shape[0] per forward step")
    if run is not None:  # per policy and creation: ms to destroy the old + create the new, slowest
        ev = run.df[run.df.metric.isin(["event_create", "event_destroy"])
                    & (run.df.trace == trace_name)]
        ev = ev.groupby(["variant", "step", "tokens", "rank"], as_index=False)["value"].sum()
        ev = ev.groupby(["variant", "step", "tokens"], as_index=False)["value"].max()
    for i, name in enumerate(policies):
        s = pd.DataFrame(
            [(max(e.step, 0), e.max_token_num, e.bytes_per_rank / MiB) for e in events[name]],
            columns=["step", "tokens", "MiB"])
        e = ev[ev.variant == name] if run is not None else pd.DataFrame(columns=["step", "value"])
        ms = {int(a): float(b) for a, b in zip(e.step.clip(lower=0), e.value)}
        color = COLORS.get(name, plots.PALETTE["neutral"])
        ax.step([*s.step, xmax], [*s.tokens, s.tokens.iloc[-1]], where="post", color=color, lw=1.6,
                ls=":" if name == "before_pr" else "-", zorder=2 + i)
        n, warm = len(s), traces.recreations(trace_name, name, W, hidden_dim, pre)
        said = (f"{label(name)}: {n} creation{'s' if n != 1 else ''} cold, {warm} pre-initialised; "
                f"peak {s.MiB.max():.0f} MiB/rank"
                + (f", {sum(ms.get(int(x), 0.0) for x in s.step):.0f} ms" if ms else ""))
        ax.scatter(s.step, s.tokens, s=25 + 2.0 * s.MiB, color=color, alpha=0.75, zorder=4,
                   edgecolors="white", linewidths=0.6, label=said)
        if name == "before_pr":
            continue  # the same mark as the merged floor's: one label is enough
        for x, t, mib in zip(s.step, s.tokens, s.MiB):
            note = f"{int(t)}" + (f" · {ms[int(x)]:.1f} ms" if int(x) in ms else "")
            ax.annotate(note, (x, t), xytext=(0, 7 + 0.05 * mib), textcoords="offset points",
                        rotation=90, fontsize=6.5, ha="center", va="bottom", color=color)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(_ticks())
    ax.set(
        ylim=(0.8, 2**16), xlim=(-5, xmax), ylabel="tokens (log2)",
        xlabel=f"forward step of the '{trace_name}' trace (steps {xmax}–{len(tokens)}: no "
        "creation under any policy)", title=f"A cold start on short prompts, W={W}, "
        f"H={hidden_dim}: the workspace each call site holds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, markerscale=0.5)
    plots.caption(
        fig, run, extra="counts and sizes: simulation of the rebuild (exact); mark area ~ "
        f"MiB/rank; pre-initialised: SGLang's pre_initialize_workspaces({pre}) first"
        + ("; ms: destroy + create, slowest rank" if run is not None else ""))
    return fig


def cost_figure(shown: list):
    """Creation ms against T per shown run, and the IPC-open phase against the Lamport size."""
    fig, axes = plots.figure(2, 1, width=12, height=4.2)
    ax_create, ax_open = axes[0]
    for r in shown:
        W, H = r.manifest.tp, run_hidden(r)
        c = cost_frame(r.df).reset_index()
        g, o = c[c.phase == "create"], c[c.phase == "open"]
        err = [g.time_median - g.time_p10, g.time_p90 - g.time_median]
        ax_create.errorbar(g.tokens, g.time_median, yerr=err, marker="o", capsize=3, label=f"W={W}")
        ax_open.plot([_lamport_mib(W, T, H) for T in o.tokens], o.time_median, marker="o",
                     label=f"W={W}")
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
        fig, shown[-1], extra=f"H={p['hidden_dim']}, bf16, three IPC buffers + fill + "
        f"barriers; median of {p['cost_repeats']}")
    return fig


def profile_overview(events, *, rank: int = 0, variants=("floor_0", "floor_2048"), run=None):
    """Swim-lanes of every re-creation of ``rank``, one group per policy, back to back."""
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
        tables[f"{label(v)} ({d.creation.nunique()}×)"] = (pd.concat(parts, ignore_index=True)
                                                           if parts else d)
    fig = plots.timeline(
        tables, highlight=r"IpcOpenMemHandle", highlight_label="IPC handle open",
        categories=("runtime", "memset", "kernel", "range"),
        title=f"rank {rank}: every workspace re-creation of the cold start, back to back")
    plots.caption(
        fig, run, extra="torch.profiler; gaps between re-creations cut; outlines: "
        "'recreate workspace' ranges, labelled with the workspace T they create")
    return fig


def profile_step(events, *, world_size: int, hidden_dim: int, run=None):
    """Ms per creation phase per traced size; one IPC open per buffer against its size."""
    fig, axes = plots.figure(2, 1, width=12, height=4.4)
    ax, ax2 = axes[0]
    t, ob = phase_frame(events), open_by_buffer(events)
    x, bottom = np.arange(len(t)), np.zeros(len(t))
    for col in t.columns:
        ax.bar(x, t[col], bottom=bottom, label=col, color=PHASE_COLORS[col])
        bottom += t[col].to_numpy()
    sizes = {
        int(T): rebuild.workspace_sizes(world_size, int(T), hidden_dim)["aligned"]
        for T in set(t.index) | set(ob.index)
    }
    ax.set_xticks(x, [f"T={int(T)}\n{sizes[int(T)][2] / MiB:.0f} MiB" for T in t.index], fontsize=8)
    ax.set(xlabel="workspace T and its Lamport buffer per rank",
           ylabel="ms per creation phase (traced, slowest rank's creation)")
    ax.legend(fontsize=7, ncol=2)
    for name in ob.columns:
        ax2.plot([sizes[int(T)][rebuild.BUFFER_NAMES.index(name)] / MiB for T in ob.index],
                 ob[name], marker="o", ls="", label=f"{name} buffer")
    ax2.set_xscale("log", base=2)
    ax2.set(xlabel="size of the buffer opened (MiB per rank, log2)",
            ylabel="one IPC open (ms, median over peers, slowest rank)")
    ax2.legend(fontsize=8)
    plots.caption(fig, run, extra=f"torch.profiler, one traced creation per size, W={world_size}")
    return fig


# -- the notebook's sections -----------------------------------------------------------------------
def simulation(world_sizes=(2, 4), hidden_dim: int = 7168) -> None:
    """Memory against re-creations per policy, a panel per trace and world size (simulated)."""
    d = pd.DataFrame(
        measure.simulate_rows({"hidden_dim": hidden_dim}, world_sizes=list(world_sizes),
                              scenarios=(0,)))
    d = d[d.metric != "event_workspace"]
    names, worlds = sorted(set(d.trace)), sorted(set(d.world_size))
    fig, axes = plots.figure(len(worlds), len(names), width=5.5 * len(worlds), height=5.6)
    for (tname, W), g in d.groupby(["trace", "world_size"]):
        t = g.pivot_table(index="variant", columns="metric", values="value")
        ax = axes[names.index(tname)][worlds.index(W)]
        ax.scatter(t.peak_workspace, t.recreations, s=40, color=f"C{worlds.index(W)}")
        for (xv, yv), p in t.groupby(["peak_workspace", "recreations"]):
            ax.annotate("\n".join(label(n) for n in POLICY_ORDER if n in p.index), (xv, yv),
                        fontsize=7, xytext=(4, 3), textcoords="offset points", va="bottom",
                        rotation=20)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_ticks())
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.margins(x=0.35, y=0.35)
        ax.set_ylim(bottom=0)
        ax.set(title=f"'{tname}', W={W}", xlabel="peak workspace per rank (MiB, log2)",
               ylabel="re-creations")
    plots.caption(fig, None, extra="memory vs re-creations per policy, cold start, simulated")
    notebook.show_figure(fig)


@notebook.needs_run
def replay(run) -> None:
    """The GPU replay per policy of each shown run and its agreement with the simulation."""
    for r in run.shown:
        print(f"W={r.manifest.tp}: {r.path.name} ({r.label}) - GPU replay per policy")
        notebook.show_table(replay_table(r))
        d = r.df[(r.df.source == "simulated") & (r.df.scenario == "cold")]
        sim = d.pivot_table(index=["trace", "variant"], columns="metric", values="value",
                            aggfunc="max")
        t = policy_stats(r).join(sim.add_suffix("_simulated"))
        same = ((t.recreations == t.recreations_simulated)
                & (t.peak_workspace == t.peak_workspace_simulated)).all()
        gap = text.span(t.peak_workspace_measured - t.peak_workspace, "{:g}", " MiB")
        print(f"W={r.manifest.tp}: GPU re-creations and sizes == simulation in {len(t)} (trace, "
              f"policy) cells: {'yes' if same else 'no'}; measured − computed peak per rank: "
              f"{gap} (the int64 pointer table's caching-allocator segment)")
    print("create_time_*: the creations alone; recreate_time_total: every creation plus "
          "destroying the workspace it replaces (closing the peers' mappings, freeing, a barrier), "
          "summed over the trace; peak_workspace: per rank, from FlashInfer's sizes, _measured: "
          "cudaMemGetInfo above the rank's baseline")


@notebook.needs_run
def cost(run) -> None:
    """What one creation costs against T, then per shown run the ms per creation phase."""
    notebook.show_figure(cost_figure(run.shown))
    for r in run.shown:
        print(f"W={r.manifest.tp}: median ms per creation phase (slowest rank)")
        notebook.show_table(phase_table(r).round(2))
        print(cost_step(r))


@notebook.needs_run
def profiler(run) -> None:
    """Per shown run with a trace: Perfetto files, the re-creations, their CUDA calls, the step."""
    traced = [r for r in run.shown if not notebook.predates_traces(r)]
    for r in traced:
        ev, W, H = r.sidecar("events"), r.manifest.tp, run_hidden(r)
        for rank in range(W):
            if r.sidecar(f"trace_rank{rank}") is not None:
                notebook.file_link(r.sidecar(f"trace_rank{rank}"),
                                   f"W={W}, rank {rank}: Perfetto trace")
        notebook.show_figure(profile_overview(ev, run=r))
        notebook.show_table(named(trace_recreation_table(ev).round(1)))
        for rank in sorted(ev["rank"].unique()):
            print(f"{r.path.name}, rank {rank}: CUDA calls inside the creations")
            t = call_table(ev, rank=int(rank)).round(1)
            notebook.show_table(named(text.counts(t, ["per creation"], where_whole=True)))
        notebook.show_figure(profile_step(ev, world_size=W, hidden_dim=H, run=r))
        print("\n".join(trace_step(ev, world_size=W, hidden_dim=H) + [first_open(ev)]))
    if not traced:
        print("no shown run has a trace; from the phase timings alone: " + "; ".join(
            cost_step(r) for r in run.shown))


# -- the real engine at TP 2 and 4 (data/recorded/engine_workspace_floor/) -------------------------
def _ms(ms: list[float]) -> str:
    """``lo–hi`` in ms, or in s where the largest is a second or more."""
    if ms and max(ms) >= 1000:
        return text.span([m / 1e3 for m in ms], "{:.1f}", " s")
    return text.span(ms, "{:.1f}" if ms and max(ms) < 100 else "{:.0f}", " ms")


def joined(values, sep: str = "/") -> str:
    return sep.join(map(str, sorted(set(values))))


def engine_table(facts: list[dict]) -> pd.DataFrame:
    """Per TP size and engine variant: creations per rank and size, the simulation, times."""
    rows = [{
        "TP": f["world"], "release": f["variant"].split("+")[0], "call site": label(f["policy"]),
        "creations per rank": text.count(f["per_rank"].values()), "max_token_num": joined(
            f["sizes"]), "in forward steps": f"{f['in_calls']} in {f['calls']} calls",
        "rebuild, pre-initialised": f"{f['sim']} per manager at {joined(f['sim_sizes'])}",
        "a creation": _ms([m for v in f["ms_by_rank"].values()
                           for m in v[1:]]), "first one, JIT build or load": _ms([
                               v[0] - v[1] for v in f["ms_by_rank"].values() if len(v) > 1
                           ])
    } for f in facts]
    return pd.DataFrame(rows).set_index(["TP", "release", "call site"]) if rows else pd.DataFrame()


def engine_lines(facts: list[dict]) -> list[str]:
    """What the engine runs say: the creations and when, the first one's cost, the unfused steps."""
    if not facts:
        return []
    per = text.count([n for f in facts for n in f["per_rank"].values()])
    out = [
        f"every variant: {per} creations per rank (one per workspace manager: attention TP and MoE "
        f"TP), all at {joined(s for f in facts for s in f['sizes'])} tokens before graph "
        f"capture, {sum(f['in_calls'] for f in facts)} of them during the "
        f"{sum(f['calls'] for f in facts)} generate calls"
    ]
    first = [v[0] for f in facts for v in f["ms_by_rank"].values() if v]
    later = [m for f in facts for v in f["ms_by_rank"].values() for m in v[1:]]
    if first and later:
        out.append(f"a rank's first creation in its process took {_ms(first)}: FlashInfer builds "
                   f"(JIT) or loads its kernels then; every later creation {_ms(later)}, the "
                   "creation itself")
    unfused = {n for f in facts for n in f["first_call_ms"] if not rebuild.fusion_applies(n)}
    for n in sorted(unfused):
        a = [f["first_call_ms"][n] for f in facts if n in f["first_call_ms"]]
        b = [f["call_ms"][n] for f in facts if n in f["call_ms"]]
        out.append(f"{n} tokens (above the fusion gate, no creation): first call {_ms(a)}, timed "
                   f"call {_ms(b)}: the unfused path builds its kernels on first use")
    return out


def _engine_extra(rs) -> None:
    facts = sglang.engine_facts_of(rs.shown)
    notebook.show_table(engine_table(facts))
    print("\n".join(engine_lines(facts)))


VIEW = engine_view.EngineView(
    what="DeepSeek-V3-style 2 layers, --enable-flashinfer-allreduce-fusion, the short-prompt trace "
    "one request at a time", extra=_engine_extra)


def beside_rows(run, engine_run) -> list[dict]:
    """Workspace creations as the rebuild (a cold start) and SGLang's engine count them."""
    rows = engine_view.missing_rows(run, engine_run)
    if run:
        stats = policy_stats(run)
        rows += [{
            "source": f"rebuild ({run.manifest.gpu} TP {run.manifest.tp}), cold start",
            "measures": f"creations along the short-prompt trace, {label(pol)}",
            "figure": text.count(stats.loc[("short_ramp", pol), "recreations"])
        } for pol in ("floor_0", "floor_2048") if ("short_ramp", pol) in stats.index]
    for f in sglang.engine_facts_of(engine_run.shown) if engine_run else []:
        rows.append({
            "source": f"SGLang {f['variant']} engine (TP {f['world']})",
            "measures": f"creations per rank, {label(f['policy'])} (pre-initialised at 2048 "
            f"before capture; the rebuild simulates {f['sim']} per manager)",
            "figure": f"{max(f['per_rank'].values())} ({f['in_calls']} in forward steps)"
        })
    return rows
