"""Every figure of notebook 02, each a function returning a captioned matplotlib figure.

- :func:`mechanism` (the slide): the re-creations along the cold-start short-prompt trace, per policy;
- :func:`simulated_events`, :func:`simulated_tradeoff`: the CPU simulation over both traces;
- :func:`gpu_events`, :func:`gpu_tradeoff`, :func:`cost`: the GPU replay and the creation-cost sweep;
- :func:`profile_overview`, :func:`profile_step`: the profiler's picture of the re-creations (drawn in
  :mod:`.profile_figures`, re-exported here).
"""

from __future__ import annotations

from typing import Optional

from sglab.core import plots
from sglab.fixes import workspace_floor as wf

from sglab.experiments.workspace_floor import analysis
from sglab.experiments.workspace_floor._closed import closed
from sglab.experiments.workspace_floor.analysis import POLICY_ORDER
from sglab.experiments.workspace_floor.profile_figures import profile_overview, profile_step  # noqa: F401  (the notebook finds every figure here)
from sglab.experiments.workspace_floor.simulation import MiB, schedule
from sglab.experiments.workspace_floor.traces import TRACES, trace_tokens

SHORT = {"before_pr": "before PR", "shape_no_hwm": "shape, no hwm", "floor_0": "shape"}
MECH_LABEL = {"floor_0": "x.shape[0]", "floor_2048": "max(x.shape[0], 2048) — the PR"}
MECH_COLOR = {"floor_0": plots.PALETTE["before"], "floor_2048": plots.PALETTE["after"]}


def short_name(policy: str) -> str:
    return SHORT.get(policy, policy.replace("floor_", "floor "))


def _plain_ticks():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}")


def _marker_size(mib):
    return 25 + 2.0 * mib  # area ~ workspace MiB per rank


# --------------------------------------------------------------------------------------------- the slide
def _gpu_ms(run, trace_name: str, policy: str) -> dict:
    """``{step: ms}`` (destroy old + create new, slowest rank) of a run's re-creations, empty without a run."""
    if run is None:
        return {}
    ev = analysis.gpu_event_frame(run.df, trace_name)
    ev = ev[ev.variant == policy]
    return {int(s): float(v) for s, v in zip(ev.step, ev.value)}


@closed
def mechanism(shown=(), *, trace_name: str = "short_ramp", policies=("floor_0", "floor_2048"),
              world_size: Optional[int] = None, hidden_dim: int = 7168):
    """The workspace size each policy holds along the trace (a staircase), a mark at every re-creation sized by
    its workspace, and per policy the count (simulation, exact) and the GPU ms of the shown run of this world
    size where there is one."""
    run = next((r for r in shown if world_size is None or analysis.run_world_size(r) == world_size), None)
    W = world_size or (analysis.run_world_size(run) if run is not None else 2)
    sched = schedule(trace_name, policies, world_size=W, hidden_dim=hidden_dim)
    tokens = trace_tokens(trace_name)
    last = int(sched.step.max())
    xmax = int(last * 1.15) + 5
    fig, ax = plots.figure(width=11, height=4.6)
    ax.plot(range(xmax), tokens[:xmax], lw=0.6, color="#95a5a6", label="x.shape[0] per forward step")
    ax.axhline(wf.PR_FLOOR, color="#7f8c8d", lw=0.8, ls=":")
    for name in policies:
        _mechanism_policy(ax, sched[sched.policy == name], name, xmax, _gpu_ms(run, trace_name, name))
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(_plain_ticks())
    ax.set_ylim(0.8, 2 ** 15)
    ax.set_xlim(-5, xmax)
    ax.set_xlabel(f"forward step of the '{trace_name}' trace (steps {xmax}–{len(tokens)}: no re-creation under "
                  "either policy)")
    ax.set_ylabel("tokens (log2)")
    ax.set_title(f"Cold start on short prompts, W={W}, H={hidden_dim}: the workspace is re-created whenever "
                 "x.shape[0] outgrows it")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, markerscale=0.5)
    src = run if run is not None else None
    plots.caption(fig, src, extra="counts and sizes: simulation of the rebuild (exact); mark area ~ workspace "
                                  "MiB/rank" + ("; ms: destroy + create, slowest rank" if run is not None else ""))
    return fig


def _mechanism_policy(ax, s, name: str, xmax: int, ms: dict) -> None:
    color = MECH_COLOR.get(name, plots.PALETTE["neutral"])
    steps = [max(0, int(x)) for x in s.step] + [xmax]
    sizes = list(s.tokens) + [list(s.tokens)[-1]]
    ax.step(steps, sizes, where="post", color=color, lw=1.6)
    total = sum(ms.get(int(x), 0.0) for x in s.step)
    text = (f"{MECH_LABEL.get(name, name)}: {len(s)} re-creation{'s' if len(s) != 1 else ''}, "
            f"peak {s.MiB.max():.0f} MiB/rank" + (f", {total:.0f} ms" if ms else ""))
    ax.scatter(s.step.clip(lower=0), s.tokens, s=_marker_size(s.MiB), color=color, alpha=0.75, zorder=3,
               edgecolors="white", linewidths=0.6, label=text)
    for x, t, mib in zip(s.step.clip(lower=0), s.tokens, s.MiB):
        note = f"{int(t)}" + (f" · {ms[int(x)]:.1f} ms" if int(x) in ms else "")
        ax.annotate(note, (x, t), xytext=(0, 7 + 0.05 * mib), textcoords="offset points", rotation=90,
                    fontsize=6.5, ha="center", va="bottom", color=color)


# --------------------------------------------------------------------------------------------- simulation
def _events_panel(ax_trace, ax_events, sim_df, trace_name: str, world_size: int, scenario: str = "cold"):
    """Top: the trace's token counts; bottom: one row per policy, a dot at each (re-)creation sized by T."""
    tokens = trace_tokens(trace_name)
    ax_trace.plot(range(len(tokens)), tokens, lw=0.6, color="0.4")
    ax_trace.set_ylabel("x.shape[0]")
    ax_trace.set_title(f"trace '{trace_name}' - (re-)creations per policy, {scenario} (same steps at every W)")
    ev = sim_df[(sim_df.metric == "event_workspace") & (sim_df.trace == trace_name)
                & (sim_df.world_size == world_size) & (sim_df.scenario == scenario)]
    for i, name in enumerate(POLICY_ORDER):
        e = ev[ev.variant == name]
        if e.empty:
            continue
        ax_events.scatter(e.step.clip(lower=0), [i] * len(e), s=12 + 60 * e.tokens / 4096, alpha=0.7)
        ax_events.annotate(f"{len(e)}×", (1.005, i), xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax_events.set_yticks(range(len(POLICY_ORDER)), POLICY_ORDER)
    ax_events.set_xlabel("forward step (symlog: linear below 10)")
    for ax in (ax_trace, ax_events):
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(-0.5, len(tokens) * 1.3)


@closed
def simulated_events(sim_df, world_size: int = 4):
    """Both traces, each with its (re-)creations per policy (simulated)."""
    import matplotlib.pyplot as plt

    plots.apply_style()
    fig, axes = plt.subplots(4, 1, figsize=(11, 9), height_ratios=[1, 2, 1, 2], constrained_layout=True)
    for k, name in enumerate(TRACES):
        _events_panel(axes[2 * k], axes[2 * k + 1], sim_df, name, world_size)
    plots.caption(fig, None, extra="simulated on the fake creator (no GPU); dot size ~ workspace T")
    return fig


def _tradeoff_panel(ax, t, title: str, *, x: str, ms: Optional[str] = None, color: str = "C0"):
    """Re-creations against peak MiB per rank; one label per point listing its policies (and their ms)."""
    ax.scatter(t[x], t.recreations, s=40, color=color)
    for (xv, yv), g in t.groupby([x, "recreations"]):
        text = "\n".join(short_name(n) + (f": {g.loc[n, ms]:.0f} ms" if ms else "")
                         for n in POLICY_ORDER if n in g.index)
        ax.annotate(text, (xv, yv), fontsize=7, xytext=(4, 3), textcoords="offset points", va="bottom",
                    rotation=20)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_plain_ticks())
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.margins(x=0.35, y=0.35)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_ylabel("re-creations")


@closed
def simulated_tradeoff(sim_df, world_sizes=(2, 4), scenario: str = "cold"):
    """Rows: traces; columns: world sizes. Re-creations against peak workspace per rank (simulated)."""
    import matplotlib.pyplot as plt

    plots.apply_style()
    fig, axes = plt.subplots(len(TRACES), len(world_sizes), figsize=(6 * len(world_sizes), 7),
                             constrained_layout=True, squeeze=False)
    for col, W in enumerate(world_sizes):
        for row, tname in enumerate(TRACES):
            d = sim_df[(sim_df.source == "simulated") & (sim_df.world_size == W) & (sim_df.trace == tname)
                       & (sim_df.scenario == scenario)]
            t = d.pivot_table(index="variant", columns="metric", values="value", aggfunc="max")
            _tradeoff_panel(axes[row][col], t, f"'{tname}', W={W} (simulated)", x="peak_workspace",
                            color=f"C{col}")
            axes[row][col].set_xlabel("peak workspace per rank (MiB, log2)")
    plots.caption(fig, None, extra="memory vs re-creations per policy, cold start, simulated; shape = x.shape[0]")
    return fig


# --------------------------------------------------------------------------------------------- GPU replay
def _runs_caption(fig, shown: dict, extra: str = "") -> None:
    newest = shown[max(shown)]
    text = "runs " + ", ".join(f"W={W} {r.path.stem[:16]}" for W, r in shown.items())
    plots.caption(fig, newest, extra=text + (f"\n{extra}" if extra else ""))


@closed
def gpu_events(shown: dict, trace_name: str):
    """The trace, then one panel per world size: a dot per (re-)creation on the GPU, area ~ its ms (destroying
    the old workspace + creating the new one, slowest rank), count and total per policy at the right."""
    import matplotlib.pyplot as plt

    plots.apply_style()
    fig, axes = plt.subplots(1 + len(shown), 1, figsize=(11, 2.2 + 2.4 * len(shown)), sharex=True,
                             height_ratios=[1] + [2] * len(shown), constrained_layout=True)
    tokens = trace_tokens(trace_name)
    axes[0].plot(range(len(tokens)), tokens, lw=0.6, color="0.4")
    axes[0].set_ylabel("x.shape[0] (tokens)")
    axes[0].set_title(f"trace '{trace_name}': (re-)creations per policy on the GPUs, cold start")
    for ax, (W, run) in zip(axes[1:], shown.items()):
        ev = analysis.gpu_event_frame(run.df, trace_name)
        for i, name in enumerate(POLICY_ORDER):
            e = ev[ev.variant == name]
            if e.empty:
                continue
            ax.scatter(e.step, [i] * len(e), s=4 * e.value, alpha=0.7)
            ax.annotate(f"{len(e)}× {e.value.sum():.0f} ms", (1.005, i), xycoords=("axes fraction", "data"),
                        va="center", fontsize=8)
        ax.set_yticks(range(len(POLICY_ORDER)), POLICY_ORDER)
        ax.set_ylabel(f"W={W}")
    for ax in axes:
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(-0.5, len(tokens))
    axes[-1].set_xlabel("forward step (symlog)")
    _runs_caption(fig, shown, "dot area ~ ms to destroy + re-create (slowest rank); right: count and total ms")
    return fig


@closed
def gpu_tradeoff(shown: dict):
    """Rows: traces; columns: world sizes. Re-creations against the peak workspace memory measured per rank,
    each point labelled with its policies and their total host-blocking ms (slowest rank)."""
    import matplotlib.pyplot as plt

    plots.apply_style()
    fig, axes = plt.subplots(len(TRACES), len(shown), figsize=(6 * len(shown), 8), constrained_layout=True,
                             squeeze=False)
    for col, (W, run) in enumerate(shown.items()):
        st = analysis.policy_stats(run)
        for row, tname in enumerate(TRACES):
            ax = axes[row][col]
            _tradeoff_panel(ax, st.xs(tname, level="trace"), f"'{tname}', W={W}", x="peak_workspace_measured",
                            ms="recreate_time_total", color=f"C{col}")
            ax.set_xlabel("peak workspace per rank, measured (MiB, log2)")
    _runs_caption(fig, shown, "cold start; labels: policy and its total destroy + create ms; shape = x.shape[0]; "
                              "memory = cudaMemGetInfo above the baseline")
    return fig


@closed
def cost(runs_, shown: dict):
    """Creation ms vs T for every run (older repeats dashed), and the IPC-open phase against the Lamport buffer
    size (both world sizes step up at the same buffer size)."""
    fig, axes = plots.figure(2, 1, width=12, height=4.2)
    ax_create, ax_open = axes[0]
    newest = {id(r) for r in shown.values()}
    for r in sorted(runs_, key=lambda r: (analysis.run_world_size(r), str(r.manifest.get("created_utc")))):
        W, H = analysis.run_world_size(r), analysis.run_hidden(r)
        c = analysis.cost_frame(r.df).reset_index()
        g = c[c.phase == "create"]
        mach = r.manifest.get("gpu_count_machine", r.manifest.get("gpu_count"))
        ax_create.errorbar(g.tokens, g.time_median, yerr=[g.time_median - g.time_p10, g.time_p90 - g.time_median],
                           marker="o", capsize=3, ls="-" if id(r) in newest else "--",
                           label=f"W={W} ({mach}-GPU box, {r.path.stem[9:15]}Z)")
        if id(r) in newest:
            o = c[c.phase == "open"]
            lam = [wf.workspace_sizes(W, int(T), H)["aligned"][2] / MiB for T in o.tokens]
            ax_open.plot(lam, o.time_median, marker="o", label=f"W={W}")
    ax_create.set_xlabel("workspace T (tokens, log2)")
    ax_create.set_ylabel("creation ms (median, p10-p90, slowest rank)")
    ax_open.set_xlabel("Lamport buffer per rank (MiB, log2)")
    ax_open.set_ylabel("IPC-open phase, ms (median)")
    for ax in (ax_create, ax_open):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(_plain_ticks())
            axis.set_minor_formatter(_plain_ticks())
    newest_run = shown[max(shown)]
    p = newest_run.manifest["params"]
    _runs_caption(fig, shown, f"H={p['hidden_dim']}, bf16, three IPC buffers + fill + barriers; median of "
                              f"{p['cost_repeats']}")
    return fig
