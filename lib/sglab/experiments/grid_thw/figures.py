"""Every plot of notebook 05, drawn from a run's numbers (recorded or live) or from the CPU cache point.

- :func:`mechanism` — the slide: processes × GPUs, each cell the MiB that process holds on that GPU before | after
  the fix, the stray contexts marked;
- :func:`heatmaps` — process × GPU per variant; :func:`waste_vs_tp` — GPU-0 total per TP size;
- :func:`cache_bars` — the cache point; :func:`memory_series` — the profiler picture: per-process memory over time on
  each GPU with the processes' marks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sglab.core import plots
from sglab.core import plots as diagram
from sglab.experiments.grid_thw import analysis

STRAY = "#c0392b"


def slide_run(runs: list):
    """The run the slide draws: the one with the most ranks (then the newest)."""
    if not runs:
        return None
    return max(runs, key=lambda r: (int(r.df.tp_size.max()), str(r.manifest.get("created_utc", ""))))


def _label(mib: float) -> str:
    return "—" if mib == 0 else f"{mib:.0f}"


def _cell(ax, x: float, y: float, w: float, h: float, row) -> None:
    """One process × GPU cell: before (left) | after (right); a stray context is filled red."""
    legit = "#d5d8dc"
    left = (STRAY if row.stray else legit) if row.before > 0 else "white"
    right = legit if row.after > 0 else "white"
    diagram.box(ax, x, y, w / 2, h, color=left, edge=STRAY if row.stray else "#566573")
    diagram.box(ax, x + w / 2, y, w / 2, h, color=right)
    ax.text(x + w / 4, y + h / 2, _label(row.before), ha="center", va="center", fontsize=9,
            color="white" if row.stray else "black", fontweight="bold" if row.stray else "normal")
    ax.text(x + 3 * w / 4, y + h / 2, _label(row.after), ha="center", va="center", fontsize=9)
    if row.stray:
        ax.text(x + w / 4, y - 0.06, "stray context", ha="center", va="top", fontsize=7, color=STRAY)


def mechanism(run, phase: str = "kernel"):
    """Processes × GPUs of one run: MiB held after the kernel steps, before | after the fix (median over repeats).

    Rank r belongs on GPU r and the tokenizer on GPU 0 (it preprocesses there) in both variants; everything a rank
    holds elsewhere is a stray context, opened only because the grid arrived on ``cuda:0``."""
    if run is None:
        fig, ax = diagram.canvas(6, 1.2)
        ax.text(5, 1.5, "no run to draw yet", ha="center", va="center")
        return fig
    t = analysis.cells(run.df, phase)
    procs = list(dict.fromkeys(t.process))
    gpus = sorted(set(t.gpu))
    w, h, gx, gy = 1.7, 0.55, 0.3, 0.45
    width, height = 2.0 + len(gpus) * (w + gx), 1.2 + len(procs) * (h + gy)
    fig, ax = diagram.canvas(min(11.0, 1.3 * width), min(6.5, 0.95 * height), xlim=(0, width), ylim=(0, height))
    top = height - 0.9
    for j, g in enumerate(gpus):
        owner = "tokenizer, rank 0" if g == 0 else f"rank {g}"
        x = 2.0 + j * (w + gx)
        ax.text(x + w / 2, top + 0.42, f"GPU {g} ({owner})", ha="center", va="bottom", fontsize=9, fontweight="bold")
        ax.text(x + w / 4, top + 0.12, "before", ha="center", va="bottom", fontsize=7.5, color=plots.PALETTE["before"])
        ax.text(x + 3 * w / 4, top + 0.12, "after", ha="center", va="bottom", fontsize=7.5,
                color=plots.PALETTE["after"])
    for i, proc in enumerate(procs):
        y = top - (i + 1) * (h + gy) + gy
        diagram.label(ax, 0.1, y + h / 2, proc, fontsize=9)
        for j, g in enumerate(gpus):
            row = t[(t.process == proc) & (t.gpu == g)]
            if len(row):
                _cell(ax, 2.0 + j * (w + gx), y, w, h, row.iloc[0])
    stray = t[t.stray]
    ax.set_title(f"MiB per process and GPU after a kernel on the grid — before | after `.cpu()` "
                 f"({analysis.run_name(run)})", fontsize=10)
    ax.text(0.1, 0.15, f"{len(stray)} stray context(s), {stray.before.sum():.0f} MiB before; "
                       f"{t[t.stray].after.sum():.0f} MiB after", fontsize=8.5, color=STRAY)
    return fig


def heatmaps(run, phase: str = "kernel"):
    """One process × GPU heatmap per variant of one run (median over repeats)."""
    df = run.df
    variants = [v for v in ("before", "ipc", "eager", "after") if v in set(df.variant)]
    tp = int(df.tp_size.max())
    fig, axes = plots.figure(ncols=len(variants), width=3.6 * len(variants), height=1.3 + 0.55 * (tp + 1))
    tables = {v: analysis.heatmap(df, v, phase) for v in variants}
    vmax = max(1.0, max(float(np.nanmax(t.values)) for t in tables.values()))
    for ax, v in zip(np.ravel(axes), variants):
        t = tables[v]
        ax.imshow(t.values, cmap="Reds", vmin=0, vmax=vmax)
        ax.set_xticks(range(t.shape[1]), t.columns)
        ax.set_yticks(range(t.shape[0]), t.index)
        ax.grid(False)
        for i in range(t.shape[0]):
            for j in range(t.shape[1]):
                ax.text(j, i, f"{t.values[i, j]:.0f}", ha="center", va="center", fontsize=8,
                        color="white" if t.values[i, j] > 0.6 * vmax else "black")
        ax.set_title(f"{v}: MiB per process × GPU")
    fig.suptitle(analysis.run_name(run), fontsize=10)
    plots.caption(fig, run, extra=f"phase '{phase}' · median over repeats")
    return fig


def waste_vs_tp(df: pd.DataFrame, runs: list):
    """GPU-0 MiB held by ranks 1..N−1 against the TP size, one marker per run (runs are never added up)."""
    waste = analysis.waste_vs_tp(df)
    per = analysis.gpu0_per_rank(df)
    fig, ax = plots.figure(width=6.4)
    styles = {"before": dict(marker="o", ls="-", color=plots.PALETTE["before"]),
              "ipc": dict(marker="x", ls="--", color=plots.PALETTE["accent"], markersize=8),
              "eager": dict(marker="^", ls=":", color="#7d3c98"),
              "after": dict(marker="s", ls="-", color=plots.PALETTE["after"])}
    waste = waste.assign(machine=[name.split(", ")[1] for name in waste.run])
    for (v, machine), g in waste.groupby(["variant", "machine"]):
        st = dict(styles.get(v, {}))
        if machine.startswith("2-GPU"):
            st.update(ls="none", mfc="none", markersize=10)
        g = g.sort_values("tp_size")
        ax.plot(g.tp_size, g.median_mib, label=f"{v} ({machine})", **st)
    one = per[(per.phase == "kernel") & (per.variant == "before")].median_mib.median()
    tps = np.array(sorted(waste.tp_size.unique()))
    ax.plot(tps, (tps - 1) * one, color="#999999", lw=0.8, ls=":", label=f"(N−1) × {one:.0f} MiB")
    ax.set_xticks(tps)
    ax.set_xlabel("TP size N")
    ax.set_ylabel("MiB on GPU 0 held by ranks 1..N−1")
    ax.set_ylim(bottom=-50)
    ax.legend(loc="upper left", fontsize=8)
    plots.caption(fig, runs[-1], extra=f"{len(runs)} runs, each plotted on its own · phase 'kernel' · median")
    return fig


def cache_bars(table: pd.DataFrame, extra: str = ""):
    """Images served from the vision cache: per request (before) vs per image (after)."""
    fig, ax = plots.figure(width=6, height=3)
    ax.bar(["per request (before)", "per image (after)"], table["cache_image_hit_rate"] * 100,
           color=[plots.PALETTE["before"], plots.PALETTE["after"]])
    ax.set_ylabel("images served from cache, %")
    ax.set_ylim(0, 100)
    plots.caption(fig, None, extra=extra)
    return fig


SERIES_MARKS = ("unpickle", "first kernel", "reduce", "item", "copy to own GPU", "own-GPU kernel", "release")
LINE_COLORS = {"tokenizer": "#7f8c8d", "rank 0": "#2471a3", "rank 1": "#229954", "rank 2": "#d68910",
               "rank 3": "#7d3c98"}


def _series_panel(ax, mem: pd.DataFrame, marks: pd.DataFrame, variant: str, rank: int) -> None:
    me = marks[marks.process == f"rank {rank}"]
    own = me[me["mark"] == "own context"].t_s
    end = me[me["mark"] == "release"]
    t0 = (float(own.min()) if len(own) else float(me.t_s.min())) - 0.4
    t1 = (float((end.t_s + end.dur_s).max()) if len(end) else float(me.t_s.max())) + 0.4
    top = max(1.0, float(mem.mib.max()))
    for (proc, gpu), g in mem.groupby(["process", "gpu"]):
        if g.mib.max() == 0:
            continue
        rank_of = int(proc.split()[1]) if proc.startswith("rank") else None
        stray = rank_of is not None and rank_of != gpu
        g = pd.concat([g, g.tail(1).assign(t_s=max(t1, float(g.t_s.max())))]).sort_values("t_s")
        ax.step(g.t_s, g.mib, where="post", lw=2.4 if stray else 1.2, ls="-" if stray else "--",
                color=STRAY if stray else LINE_COLORS.get(proc, "#34495e"),
                label=f"{proc} on GPU {gpu}" + (" (stray)" if stray else ""))
    for r in me[me["mark"].isin(SERIES_MARKS)].itertuples():
        ax.axvspan(r.t_s, r.t_s + max(r.dur_s, 0.004), color="#f9e79f", alpha=0.8, lw=0)
        ax.text(r.t_s, top * 1.02, r.mark, rotation=50, fontsize=7, ha="left", va="bottom", color="#555555")
    ax.set_xlim(t0, t1)
    ax.set_ylim(0, top * 1.05)
    ax.set_ylabel("MiB (NVML)")
    ax.set_title(f"{variant}: every process of the group, rank {rank}'s steps shaded", loc="left", pad=34)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5)


def memory_series(run, *, repeat: int = 0, variants=("before", "after"), rank: int = 1):
    """The profiler picture: NVML memory of every process of one group per variant over time (seconds from the
    group's start), each process's line per GPU, rank ``rank``'s steps shaded. None without a time series."""
    mem, marks = run.sidecar("memory"), run.sidecar("marks")
    if mem is None or marks is None:
        return None
    variants = [v for v in variants if v in set(mem.variant)]
    fig, axes = plots.figure(nrows=len(variants), width=11.0, height=3.3 * len(variants))
    for ax, v in zip(np.ravel(np.atleast_1d(axes)), variants):
        sel = lambda d: d[(d.variant == v) & (d.repeat == repeat)]  # noqa: E731
        _series_panel(ax, sel(mem), sel(marks), v, rank)
    np.ravel(np.atleast_1d(axes))[-1].set_xlabel("seconds from the group's start")
    plots.caption(fig, run, extra=f"repeat {repeat} · NVML sampled in the parent at "
                                  f"{float(run.df[run.df.metric == 'sampler_hz'].value.max()):.0f} Hz")
    return fig
