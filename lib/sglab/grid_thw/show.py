"""Tables and figures of notebook 05, from a run (recorded or live) or the CPU cache point, and
"your own setup".

Every section that takes a run accepts a :class:`~sglab.core.runs.NoRun` too and then prints its one
line. Tables of several runs keep them apart with a ``run`` column (:func:`frame`): runs are never
added up.

- tables: where the grid landed, process × GPU MiB, the GPU-0 waste, repeatability, leftovers,
  concurrency, the cache point, the memory steps of the time series (what the claims read);
- figures: :func:`mechanism` (the slide: processes × GPUs, before | after), :func:`heatmaps`,
  :func:`waste_figure`, :func:`cache_bars`, :func:`memory_series` (the profiler picture);
- your own setup: a TP size and a request stream -> the GPU-0 waste before the fix and the vision
  cache's hits (:func:`your_setup`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sglab.core import notebook, plots, runs
from sglab.grid_thw import measure, rebuild, sglang
from sglab.grid_thw.measure import KERNEL_STEPS, PHASES
from sglab.core import engine_records, engine_stats, engine_view


STRAY = "#c0392b"
VARIANT_ORDER = ("before", "ipc", "eager", "after")


# --------------------------------------------------------------------------------------------------
# tables of one run's frame (or several runs' frames joined by `frame`)
# --------------------------------------------------------------------------------------------------
def run_name(run) -> str:
    """Short, unique name of a run: GPU, TP size, GPUs on the machine, start time (UTC)."""
    m = run.manifest
    gpu = m.gpu_name.replace("NVIDIA ", "")
    tp = m.tp
    box = m.gpu_count_machine or visible_gpus(run.df) or tp
    created = m.created_utc
    return f"{gpu} TP {tp}, {box}-GPU machine, {created[:10]} {created[11:16]}Z"


def visible_gpus(df) -> int:
    """How many GPUs the ranks saw (the NVML readings cover every GPU of the machine)."""
    mem = memory_frame(df)
    return int(mem.gpu.max()) + 1 if len(mem) else 0


def frame(runs_: list):
    """All runs in one tidy frame with a ``run`` column (:func:`run_name`)."""
    frames = [r.df.assign(run=run_name(r)) for r in runs_]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _by_run(df) -> list[str]:
    return ["run"] if "run" in df.columns else []


def memory_frame(df):
    return df[df.metric == "gpu_memory"]


def stray(df, *, gpu0_only: bool = True):
    """Readings of ranks >= 1 on GPUs not their own: GPU 0 only (default), or every foreign GPU."""
    m = memory_frame(df)
    m = m[(m["rank"] >= 1) & (m.gpu != m["rank"])]
    return m[m.gpu == 0] if gpu0_only else m


def gpu0_per_rank(df):
    """MiB each rank >= 1 holds on GPU 0, per run, variant, TP size and phase: median, min, max over
    repeats and ranks, and how many values."""
    m = stray(df)
    g = m.groupby(_by_run(m) + ["variant", "tp_size", "phase"]).value
    return pd.DataFrame({
        "median_mib": g.median(), "min_mib": g.min(), "max_mib": g.max(), "n": g.size()
    }).reset_index()


def waste_vs_tp(df, phase: str = "kernel"):
    """Total MiB on GPU 0 held by ranks 1..N-1, per run, variant and TP size (median, min, max over
    repeats)."""
    m = stray(df)
    m = m[m.phase == phase]
    keys = _by_run(m) + ["variant", "tp_size"]
    g = m.groupby(keys + ["repeat"]).value.sum().reset_index().groupby(keys).value
    return pd.DataFrame({
        "median_mib": g.median(), "min_mib": g.min(), "max_mib": g.max(), "repeats": g.size()
    }).reset_index()


def off_rank_gpus(df):
    """MiB ranks >= 1 hold on GPUs that are neither GPU 0 nor their own, per run, variant and
    phase: (rank, GPU) pairs holding anything, their median MiB, the total per repeat (median)."""
    m = stray(df, gpu0_only=False)
    m = m[m.gpu != 0]
    keys = _by_run(m) + ["variant", "tp_size", "phase"]
    rows = []
    for key, g in m.groupby(keys):
        held = g[g.value > 0]
        rows.append(
            dict(zip(keys, key), gpus_per_run=int(m.gpu.max()) + 1, pairs_holding=held.groupby([
                "rank", "gpu"
            ]).ngroups, pairs=g.groupby(["rank", "gpu"]).ngroups,
                 median_mib_per_pair=float(held.value.median()) if len(held) else 0.0,
                 total_mib=float(g.groupby("repeat").value.sum().median())))
    return pd.DataFrame(rows)


def repeatability(df, variants=VARIANT_ORDER):
    """MiB per rank >= 1 on GPU 0, a column per run, a row per variant and phase: the value when
    every repeat and rank agree, "lo–hi" when not; ``n`` values per cell."""
    per = gpu0_per_rank(df)
    cell = [
        f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"
        for lo, hi in zip(per.min_mib, per.max_mib)
    ]
    per = per.assign(mib=[f"{c} (n={n})" for c, n in zip(cell, per.n)])
    t = per.pivot_table(index=["variant", "phase"], columns=_by_run(per) or ["tp_size"],
                        values="mib", aggfunc="first")
    t = t.loc[[(v, p) for v in variants for p in PHASES if (v, p) in t.index]]
    t.columns.name = None
    return t


def spread_mib(df) -> float:
    """The largest max − min of a rank >= 1's MiB on GPU 0 over the repeats and ranks of one variant
    and phase (0 when every reading agrees)."""
    per = gpu0_per_rank(df)
    return float((per.max_mib - per.min_mib).max()) if len(per) else 0.0


def landing(df):
    """Where each rank's grid landed: one row per variant × TP × rank (the set over repeats)."""
    d = df[df.metric.isin(["grid_device", "grid_key_is_image_grid_thw"])]
    idx = _by_run(d) + ["variant", "tp_size", "rank", "repeat"]
    out = d.pivot_table(index=idx, columns="metric", values="value").reset_index()
    out["grid_device"] = ["cpu" if v < 0 else f"cuda:{int(v)}" for v in out["grid_device"]]
    out["grid_key"] = [
        "image_grid_thw" if v else "grid_thws" for v in out["grid_key_is_image_grid_thw"]
    ]
    out["repeat_id"] = out[_by_run(out) + ["repeat"]].astype(str).agg("/".join, axis=1)
    return out.groupby(["variant", "tp_size", "rank"
                        ]).agg(grid_key=("grid_key", lambda s: "/".join(sorted(set(s)))),
                               grid_device=("grid_device", lambda s: "/".join(sorted(set(s)))),
                               repeats=("repeat_id", "nunique")).reset_index()


def leftovers(df):
    """Per run, variant and TP size: processes still alive / still listed by NVML after each group
    (max over repeats), and how many groups were checked."""
    d = df[df.metric.isin(["processes_alive", "nvml_processes_listed"])]
    idx = _by_run(d) + ["variant", "tp_size"]
    t = d.pivot_table(index=idx, columns="metric", values="value", aggfunc="max").reset_index()
    checked = d[d.metric == "processes_alive"].groupby(idx).size().rename("groups_checked")
    t = t.merge(checked.reset_index(), on=idx)
    t.columns.name = None
    return t


def cache_table(df):
    """The cache point: a row per variant (before: per request, after: per image)."""
    c = df[df.phase == "cache"]
    return c.pivot_table(index="variant", columns="metric",
                         values="value").reindex(["before", "after"])


def concurrency(df):
    """Per run, variant and repeat: the most processes of *other* groups rank 0 saw on GPU 0 at
    ``init``, and what the group's ranks >= 1 held there then (method 2; none in method 1)."""
    o = df[(df.metric == "other_processes") & (df.gpu == 0) & (df.phase == "init")]
    keys = _by_run(df) + ["variant", "repeat"]
    if o.empty:
        return pd.DataFrame(columns=keys + ["others_on_gpu0", "ranks_ge1_on_gpu0_mib"])
    s = stray(df)
    s = s[s.phase == "init"].groupby(keys).value.max().rename("ranks_ge1_on_gpu0_mib")
    t = o.groupby(keys).value.max().rename("others_on_gpu0")
    return pd.concat([t, s], axis=1, join="inner").reset_index()


def cells(df, phase: str = "kernel"):
    """Process × GPU, before vs after (median over repeats) of ONE run: the numbers of the slide.
    ``stray``: a rank holds memory on a GPU not its own."""
    m = memory_frame(df)
    m = m[(m.phase == phase) & m.variant.isin(["before", "after"])]
    t = m.pivot_table(index=["process", "rank", "gpu"], columns="variant", values="value",
                      aggfunc="median")
    t = t.reindex(columns=["before", "after"]).fillna(0.0).reset_index()
    t["stray"] = (t["rank"] >= 0) & (t.gpu != t["rank"]) & (t.before > 0)
    t.columns.name = None
    return t.sort_values(["rank", "gpu"]).reset_index(drop=True)  # tokenizer (rank -1) first


# --------------------------------------------------------------------------------------------------
# the memory time series: which mark each step in a process's memory belongs to
# --------------------------------------------------------------------------------------------------
def _values_at(series, ts) -> "np.ndarray":
    """The step series' values at the times ``ts`` (0 before its first point); ``series`` is sorted
    by ``t_s``."""
    i = np.searchsorted(series.t_s.to_numpy(), np.asarray(ts, dtype=float), side="right")
    return np.concatenate(([0.0], series.mib.to_numpy(dtype=float)))[i]


def mark_deltas(mem, marks, *, gpu: int = 0):
    """For every mark of every process: its memory on ``gpu`` when the mark began and when its next
    mark began (a pause after the last), and the difference; robust to NVML's transient readings
    inside a step (a resize frees, then allocates)."""
    out = []
    mem = mem[mem.gpu == gpu]
    by = mem.sort_values("t_s", kind="stable").groupby(["variant", "repeat", "process"])
    series = {key: s for key, s in by}
    empty = mem.iloc[:0]
    for (variant, repeat, process), ms in marks.groupby(["variant", "repeat", "process"],
                                                        sort=False):
        ms = ms.sort_values("t_s")
        s = series.get((variant, repeat, process), empty)
        ends = list(ms.t_s.iloc[1:]) + [float(ms.t_s.iloc[-1] + ms.dur_s.iloc[-1]) + 0.05]
        before, after = _values_at(s, ms.t_s), _values_at(s, ends)
        for r, a, b in zip(ms.itertuples(), before, after):
            out.append((variant, repeat, process, int(r.rank), gpu, r.mark, float(a), float(b),
                        float(b - a)))
    return pd.DataFrame(
        out, columns=[
            "variant", "repeat", "process", "rank", "gpu", "mark", "before_mib", "after_mib",
            "delta_mib"
        ])


def step_deltas(run, gpu: int = 0):
    """What each marked step added to each process's memory on ``gpu`` (None without a series)."""

    def make():
        mem, marks = run.sidecar("memory"), run.sidecar("marks")
        return None if mem is None or marks is None else mark_deltas(mem, marks, gpu=gpu)

    return run.memo(f"step_deltas {gpu}", make)


def growth_by_step(run):
    """MiB each step added on GPU 0 for ranks >= 1 (median over repeats and ranks), a row per
    variant, a column per step in time order (None without a time series)."""
    d = step_deltas(run, gpu=0)
    if d is None:
        return None
    order = ["unpickle", *KERNEL_STEPS]
    d = d[(d["rank"] >= 1) & d["mark"].isin(order)]
    t = d.pivot_table(index="variant", columns="mark", values="delta_mib", aggfunc="median")
    t = t.reindex(columns=[c for c in order if c in t.columns])
    t = t.reindex([v for v in VARIANT_ORDER if v in t.index])
    t.columns.name = None
    return t


def stack_limits(df):
    """CU_LIMIT_STACK_SIZE of the context on the grid's GPU after each kernel step, ranks >= 1
    (min–max over repeats and ranks; method 2)."""
    s = df[(df.metric == "stack_limit_bytes") & (df["rank"] >= 1)]
    if s.empty:
        return pd.DataFrame()
    t = s.groupby(["variant", "phase"]).value.agg(
        lambda v: f"{v.min():.0f}" if v.min() == v.max() else f"{v.min():.0f}–{v.max():.0f}")
    t = t.unstack()
    t = t.reindex(columns=[c for c in KERNEL_STEPS if c in t.columns])
    t.columns.name = None
    return t


def explain_growth(run) -> str:
    """The growth of the stray context in words, from the run's own numbers."""
    g = growth_by_step(run)
    if g is None or "before" not in g.index:
        return ("This run has no memory time series: record a new run to see where the context "
                "grows.")
    b = g.loc["before"]
    kernel = [c for c in g.columns if c != "unpickle"]
    big = max(kernel, key=lambda c: b[c])
    small = ", ".join(f"`{c}` +{b[c]:.0f}" for c in kernel if c != big)
    text = (f"Before the fix, a rank ≥ 1's GPU-0 context appears during the unpickling "
            f"({b['unpickle']:.0f} MiB) and grows by {b[big]:.0f} MiB during `{big}`; the other "
            f"steps add little ({small} MiB).")
    stack = stack_limits(run.df)
    if len(stack) and "before" in stack.index and big in stack.columns:
        text += (f" The per-thread stack limit reads {stack.loc['before', big]} bytes after "
                 f"`{big}` as after every other step, so the step is not the driver raising the "
                 "stack size.")
    if "eager" in g.index:
        e = g.loc["eager"]
        text += (f" With CUDA_MODULE_LOADING=EAGER the stray context is {e['unpickle']:.0f} MiB "
                 f"at the unpickling and the kernel steps add {sum(e[c] for c in kernel):.0f} "
                 "MiB: what lazy loading defers to the first kernel that needs it, eager loading "
                 "pays up front (and much more of it).")
    return text


# --------------------------------------------------------------------------------------------------
# the GPU sections of the notebook, each shown from the run (or its NoRun line)
# --------------------------------------------------------------------------------------------------
def slide_run(shown: list):
    """The run the slide draws: the one with the most ranks (then the newest)."""
    return max(shown, key=lambda r: (int(r.df.tp_size.max()), str(r.manifest.created_utc)),
               default=None)


@notebook.needs_run
def landed(run) -> None:
    """The runs shown, where each rank's grid landed, and process × GPU per variant of the run the
    slide draws."""
    for r in run.shown:
        print(f"  {run_name(r)}  (method {r.manifest.method_version}, {r.path.name})")
    notebook.show_table(landing(frame(run.shown)))
    notebook.show_figure(heatmaps(slide_run(run.shown)))


@notebook.needs_run
def repeats(run) -> None:
    """MiB per rank >= 1 on GPU 0 per run, variant and phase, and the largest spread in a run."""
    df = frame(run.shown)
    notebook.show_table(repeatability(df))
    print(f"Largest spread within one run: {spread_mib(df):.0f} MiB.")


@notebook.needs_run
def waste(run) -> None:
    """The GPU-0 total per TP size (table and figure), then what ranks hold on other GPUs."""
    df = frame(run.shown)
    notebook.show_table(waste_vs_tp(df).round(0))
    notebook.show_figure(waste_figure(df, run.shown))
    off = off_rank_gpus(df)
    off = off[off.pairs_holding > 0] if len(off) else off
    if len(off):
        notebook.show_table(off)
    else:
        print("no rank holds memory on a GPU other than GPU 0 and its own")


@notebook.needs_run
def hygiene(run) -> None:
    """No process left after its group; the `init` baselines read beside other groups."""
    df = frame(run.shown)
    notebook.show_table(leftovers(df))
    notebook.show_table(concurrency(df))


@notebook.needs_run
def profiler(run) -> None:
    """Memory over time of the newest run shown that has a time series, its Perfetto file, what
    each step added on GPU 0, the stack limits, and what that says."""
    series = next((r for r in reversed(run.shown) if r.sidecar("memory") is not None), None)
    if series is None:
        print("The runs shown predate the memory time series (method 1, no `memory` sidecar); a "
              "new recording (`sglab record grid_thw`) adds it.")
        return
    notebook.show_figure(memory_series(series, variants=("before", "after", "eager")))
    print(f"Perfetto file of the same: {series.sidecar('trace')}")
    notebook.show_table(growth_by_step(series))
    notebook.show_table(stack_limits(series.df))
    print(explain_growth(series))


# --------------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------------
def _cell(ax, x: float, y: float, w: float, h: float, row) -> None:
    """One process × GPU cell: before (left) | after (right); a stray context is filled red."""
    left = (STRAY if row.stray else "#d5d8dc") if row.before > 0 else "white"
    plots.box(ax, x, y, w / 2, h, color=left, edge=STRAY if row.stray else "#566573")
    plots.box(ax, x + w / 2, y, w / 2, h, color="#d5d8dc" if row.after > 0 else "white")
    for dx, mib, white in ((w / 4, row.before, row.stray), (3 * w / 4, row.after, False)):
        ax.text(x + dx, y + h / 2, "—" if mib == 0 else f"{mib:.0f}", ha="center", va="center",
                fontsize=9, color="white" if white else "black",
                fontweight="bold" if white else "normal")
    if row.stray:
        ax.text(x + w / 4, y - 0.06, "stray context", ha="center", va="top", fontsize=7,
                color=STRAY)


def mechanism(run, phase: str = "kernel"):
    """Processes × GPUs of the run shown with the most ranks: MiB held after the kernel steps,
    before | after the fix (median over repeats). Rank r belongs on GPU r and the tokenizer on GPU
    0 in both variants; what a rank holds elsewhere is a stray context."""
    if not run:
        fig, ax = plots.canvas(6, 1.2)
        ax.text(5, 1.5, "no run to draw yet", ha="center", va="center")
        return fig
    run = slide_run(run.shown)
    t = cells(run.df, phase)
    procs, gpus = list(dict.fromkeys(t.process)), sorted(set(t.gpu))
    w, h, gx, gy = 1.7, 0.55, 0.3, 0.45
    width, height = 2.0 + len(gpus) * (w + gx), 1.2 + len(procs) * (h + gy)
    fig, ax = plots.canvas(min(11.0, 1.3 * width), min(6.5, 0.95 * height), xlim=(0, width),
                           ylim=(0, height))
    top = height - 0.9
    for j, g in enumerate(gpus):
        x = 2.0 + j * (w + gx)
        owner = "tokenizer, rank 0" if g == 0 else f"rank {g}"
        ax.text(x + w / 2, top + 0.42, f"GPU {g} ({owner})", ha="center", va="bottom", fontsize=9,
                fontweight="bold")
        for dx, which in ((w / 4, "before"), (3 * w / 4, "after")):
            ax.text(x + dx, top + 0.12, which, ha="center", va="bottom", fontsize=7.5,
                    color=plots.PALETTE[which])
    for i, proc in enumerate(procs):
        y = top - (i + 1) * (h + gy) + gy
        plots.label(ax, 0.1, y + h / 2, proc, fontsize=9)
        for j, g in enumerate(gpus):
            row = t[(t.process == proc) & (t.gpu == g)]
            if len(row):
                _cell(ax, 2.0 + j * (w + gx), y, w, h, row.iloc[0])
    s = t[t.stray]
    ax.set_title(
        "MiB per process and GPU after a kernel on the grid — before | after `.cpu()` "
        f"({run_name(run)})", fontsize=10)
    ax.text(
        0.1, 0.15, f"{len(s)} stray context(s), {s.before.sum():.0f} MiB before; "
        f"{s.after.sum():.0f} MiB after", fontsize=8.5, color=STRAY)
    return fig


def heatmaps(run, phase: str = "kernel"):
    """One process × GPU heatmap per variant of one run (median over repeats)."""
    df = run.df
    variants = [v for v in VARIANT_ORDER if v in set(df.variant)]
    fig, axes = plots.figure(ncols=len(variants), width=3.6 * len(variants),
                             height=1.3 + 0.55 * (int(df.tp_size.max()) + 1))
    tables = {}
    for v in variants:  # process × GPU MiB, median over repeats, the tokenizer (rank -1) last
        m = memory_frame(df)
        m = m[(m.variant == v) & (m.phase == phase)]
        t = m.groupby(["rank", "process", "gpu"]).value.median().reset_index()
        t = t.sort_values(["rank"], key=lambda s: s.where(s >= 0, 10**6))
        t = t.pivot_table(index="process", columns="gpu", values="value", sort=False)
        tables[v] = t[sorted(t.columns)].rename(columns=lambda c: f"GPU {int(c)}")
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
    fig.suptitle(run_name(run), fontsize=10)
    plots.caption(fig, run, extra=f"phase '{phase}' · median over repeats")
    return fig


def waste_figure(df, runs_: list):
    """GPU-0 MiB held by ranks 1..N−1 against the TP size, one marker per run (never summed)."""
    styles = {
        "before": dict(marker="o", ls="-", color=plots.PALETTE["before"]),
        "ipc": dict(marker="x", ls="--", color=plots.PALETTE["accent"],
                    markersize=8), "eager": dict(marker="^", ls=":", color="#7d3c98"),
        "after": dict(marker="s", ls="-", color=plots.PALETTE["after"])
    }
    w = waste_vs_tp(df)
    w = w.assign(machine=[name.split(", ")[1] for name in w.run])
    fig, ax = plots.figure(width=6.4)
    for (v, machine), g in w.groupby(["variant", "machine"]):
        st = dict(styles.get(v, {}))
        if machine.startswith("2-GPU"):
            st.update(ls="none", mfc="none", markersize=10)
        g = g.sort_values("tp_size")
        ax.plot(g.tp_size, g.median_mib, label=f"{v} ({machine})", **st)
    per = gpu0_per_rank(df)
    one = per[(per.phase == "kernel") & (per.variant == "before")].median_mib.median()
    tps = np.array(sorted(w.tp_size.unique()))
    ax.plot(tps, (tps - 1) * one, color="#999999", lw=0.8, ls=":", label=f"(N−1) × {one:.0f} MiB")
    ax.set_xticks(tps)
    ax.set_xlabel("TP size N")
    ax.set_ylabel("MiB on GPU 0 held by ranks 1..N−1")
    ax.set_ylim(bottom=-50)
    ax.legend(loc="upper left", fontsize=8)
    plots.caption(fig, runs_[-1], extra=f"{len(runs_)} runs, each plotted on its own · phase "
                  "'kernel' · median")
    return fig


def cache_bars(image_hit_rates, extra: str = ""):
    """Images served from the vision cache: per request (before) vs per image (after)."""
    fig, ax = plots.figure(width=6, height=3)
    ax.bar(["per request (before)", "per image (after)"], [100 * r for r in image_hit_rates],
           color=[plots.PALETTE["before"], plots.PALETTE["after"]])
    ax.set_ylabel("images served from cache, %")
    ax.set_ylim(0, 100)
    plots.caption(fig, None, extra=extra)
    return fig


def cache_point(stats: dict, extra: str = "") -> None:
    """The lesson's cache point (``{"before": CacheStats, "after": CacheStats}``): lookups, hits
    and images encoded per variant, the bars, and how many fewer encodes per image."""
    notebook.show_table(
        pd.DataFrame([{
            "variant": v, "lookups": s.lookups, "hits": s.hits,
            "item hit rate": round(s.hit_rate, 3), "images": s.images,
            "images encoded": s.images_encoded, "image hit rate": round(s.image_hit_rate, 3)
        } for v, s in stats.items()]).set_index("variant"))
    b, a = stats["before"], stats["after"]
    notebook.show_figure(cache_bars([b.image_hit_rate, a.image_hit_rate], extra))
    print(f"The vision tower encodes {a.images_encoded} of {a.images} images per image vs "
          f"{b.images_encoded} per request ({b.images_encoded / a.images_encoded:.0f}× fewer "
          "encodes).")


SERIES_MARKS = ("unpickle", *KERNEL_STEPS, "release")
LINE_COLORS = {
    "tokenizer": "#7f8c8d", "rank 0": "#2471a3", "rank 1": "#229954", "rank 2": "#d68910",
    "rank 3": "#7d3c98"
}


def _series_panel(ax, mem, marks, variant: str, rank: int) -> None:
    me = marks[marks.process == f"rank {rank}"]
    own, end = me[me["mark"] == "own context"].t_s, me[me["mark"] == "release"]
    t0 = (float(own.min()) if len(own) else float(me.t_s.min())) - 0.4
    t1 = (float((end.t_s + end.dur_s).max()) if len(end) else float(me.t_s.max())) + 0.4
    top = max(1.0, float(mem.mib.max()))
    for (proc, gpu), g in mem.groupby(["process", "gpu"]):
        if g.mib.max() == 0:
            continue
        stray_ = proc.startswith("rank") and int(proc.split()[1]) != gpu
        g = pd.concat([g, g.tail(1).assign(t_s=max(t1, float(g.t_s.max())))]).sort_values("t_s")
        ax.step(g.t_s, g.mib, where="post", lw=2.4 if stray_ else 1.2, ls="-" if stray_ else "--",
                color=STRAY if stray_ else LINE_COLORS.get(proc, "#34495e"),
                label=f"{proc} on GPU {gpu}" + (" (stray)" if stray_ else ""))
    for r in me[me["mark"].isin(SERIES_MARKS)].itertuples():
        ax.axvspan(r.t_s, r.t_s + max(r.dur_s, 0.004), color="#f9e79f", alpha=0.8, lw=0)
        ax.text(r.t_s, top * 1.02, r.mark, rotation=50, fontsize=7, ha="left", va="bottom",
                color="#555555")
    ax.set_xlim(t0, t1)
    ax.set_ylim(0, top * 1.05)
    ax.set_ylabel("MiB (NVML)")
    ax.set_title(f"{variant}: every process of the group, rank {rank}'s steps shaded", loc="left",
                 pad=34)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5)


def memory_series(run, *, repeat: int = 0, variants=("before", "after"), rank: int = 1):
    """The profiler picture: NVML memory of every process of one group per variant over time
    (seconds from the group's start), a line per process and GPU, rank ``rank``'s steps shaded.
    None without a time series."""
    mem, marks = run.sidecar("memory"), run.sidecar("marks")
    if mem is None or marks is None:
        return None
    variants = [v for v in variants if v in set(mem.variant)]
    fig, axes = plots.figure(nrows=len(variants), width=11.0, height=3.3 * len(variants))
    axes = np.ravel(np.atleast_1d(axes))
    for ax, v in zip(axes, variants):

        def sel(d):
            return d[(d.variant == v) & (d.repeat == repeat)]

        _series_panel(ax, sel(mem), sel(marks), v, rank)
    axes[-1].set_xlabel("seconds from the group's start")
    hz = float(run.df[run.df.metric == "sampler_hz"].value.max())
    plots.caption(fig, run, extra=f"repeat {repeat} · NVML sampled in the parent at {hz:.0f} Hz")
    return fig


# --------------------------------------------------------------------------------------------------
# your own setup: a TP size and a request stream -> GPU-0 waste before the fix, vision cache hits
# --------------------------------------------------------------------------------------------------
def stray_mib() -> dict:
    """Per GPU model: MiB a rank >= 1 holds on GPU 0 after a kernel, ``(before, after)`` the fix
    (median over the recorded runs of that GPU)."""
    out: dict = {}
    for r in runs.load_all_recorded(measure.EXPERIMENT):
        per = gpu0_per_rank(r.df)
        per = per[per.phase == "kernel"]
        got = out.setdefault(runs.gpu_short(r), ([], []))
        for v, into in zip(("before", "after"), got):
            into.extend(per[per.variant == v].median_mib)
    return {
        gpu: (float(np.median(b)), float(np.median(a)))
        for gpu, (b, a) in out.items() if b and a
    }


def setup_table(tp_size: int, requests: int, image_pool: int, max_images: int):
    """Per GPU model with a recorded run: the GPU-0 memory N − 1 ranks hold before and after the
    fix (one stray context each before, as measured); and the vision cache on a seeded stream of
    ``requests`` requests of 1..``max_images`` images from a pool of ``image_pool`` (run now)."""
    stream = rebuild.request_stream(int(requests), int(image_pool), int(max_images), 0)
    before, after = (measure.simulate_cache(stream, fixed=f) for f in (False, True))
    cache = {
        "images requested": after.images, "encoded per request (before)": before.images_encoded,
        "encoded per image (after)": after.images_encoded
    }
    n = int(tp_size) - 1
    rows = [{
        "GPU": gpu, "stray MiB per rank ≥ 1": round(b), "GPU-0 MiB before": round(n * b),
        "GPU-0 MiB after": round(n * a), **cache
    } for gpu, (b, a) in stray_mib().items()]
    return pd.DataFrame(rows or [{"GPU": "no recorded run", **cache}])


def your_setup(interactive: bool = False):
    """TP size and a request stream -> GPU-0 MiB before / after the fix and images the vision
    tower encodes (a static table; with ``interactive``, controls in JupyterLab)."""
    return notebook.explore(
        setup_table, {
            "tp_size": [2, 4, 8, 16], "requests": [50, 200, 1000], "image_pool": [8, 24, 100, 1000],
            "max_images": [1, 2, 4, 8]
        }, static=[{"tp_size": 8, "requests": 200, "image_pool": 24, "max_images": 4},
                   {"tp_size": 4, "requests": 200, "image_pool": 1000, "max_images": 1}],
        title="Your deployment: what the grid on cuda:0 and the bundled items cost",
        interactive=interactive)


# --------------------------------------------------------------------------------------------------
# the real engine at TP 2 (data/recorded/engine_grid_thw/)
# --------------------------------------------------------------------------------------------------
def _tp_of(run) -> dict:
    """``{case: TP size}`` of each engine entry."""
    return {e["case"]: e["tp"] for e in run.manifest.engine_runs}


def engine_memory(run) -> pd.DataFrame:
    """Each process's memory on each GPU after the image request, per case that started: rows
    ``case, process, rank, gpu, MiB`` (rank: the scheduler's TP rank, None for other processes)."""
    df = engine_records.frame([run])
    ok = {k[2] for k, v in engine_stats.started(df).items() if v}
    d = df[(df.metric == "gpu_memory") & df.case.isin(ok)]
    rows = []
    for case, proc, gpu, mib in zip(d.case, d.process, d.gpu, d.value):
        m = re.search(r"scheduler_TP(\d+)", str(proc))
        rows.append({
            "case": case, "process": str(proc), "rank": int(m.group(1)) if m else None,
            "gpu": int(float(gpu)), "MiB": float(mib)
        })
    return pd.DataFrame(rows, columns=["case", "process", "rank", "gpu", "MiB"])


def engine_gpu0(run) -> dict:
    """``{case: {rank: MiB on GPU 0}}`` for every scheduler rank ≥ 1 of each case that started and
    recorded memory (0 where NVML lists that rank on GPU 0 with nothing)."""
    mem, tps = engine_memory(run), _tp_of(run)
    out = {}
    for case, g in mem.groupby("case"):
        on0 = {}
        for r in range(1, tps.get(case, 1)):
            hit = g[(g["rank"] == r) & (g["gpu"] == 0)]
            on0[r] = float(hit["MiB"].sum()) if len(hit) else 0.0
        out[case] = on0
    return out


def _run_tp(run) -> int:
    return max(_tp_of(run).values(), default=1)


def engine_gpus(run) -> int:
    """The GPUs of the machine an engine run's engines saw (a TP-2 engine on a 4-GPU box sees
    4)."""
    return run.manifest.gpu_count_machine or run.manifest.gpu_count


def gpus_held(run) -> dict:
    """``{case: {rank: [GPU, ...]}}``: the GPUs where each scheduler rank ≥ 1 holds memory (``[]``
    for a rank NVML lists with nothing)."""
    mem = engine_memory(run)
    ranks = mem[mem["rank"].fillna(0) >= 1]
    return {
        case: {
            int(r): sorted(int(x) for x in g[g["MiB"] > 0]["gpu"])
            for r, g in c.groupby("rank")
        }
        for case, c in ranks.groupby("case")
    }


def other_gpus(run) -> dict:
    """``{rank: [GPU, ...]}``: with #22858 reverted, the GPUs besides GPU 0 and its own where a
    scheduler rank ≥ 1 holds memory (another GPU's context, as on a machine with more GPUs than
    the TP size)."""
    before = gpus_held(run).get("before", {})
    return {r: o for r, g in before.items() if (o := [x for x in g if x not in (0, r)])}


def gpu0_by_run(run) -> pd.DataFrame:
    """GPU 0's total held by scheduler ranks ≥ 1, one row per recorded run (its TP size, machine
    and date), one column per case: how the figure repeats between machines and days."""
    rows = []
    for r in sorted(run.shown, key=lambda r: (_run_tp(r), r.manifest.created_utc)):
        on0 = engine_gpu0(r)
        rows.append({
            "TP": _run_tp(r), "run": engine_records.run_label(r),
            **{case: sum(ranks.values())
               for case, ranks in sorted(on0.items())}
        })
    return pd.DataFrame(rows).set_index(["TP", "run"]) if rows else pd.DataFrame()


def engine(run) -> None:
    """SGLang's own engine at each recorded TP size fed one image: each process's memory on each
    GPU (NVML, after the request) in the newest run of each TP size, 0.5.11 as released beside
    #22858 reverted; then GPU 0's total held by ranks >= 1 in every run."""
    if not run:
        engine_view.planned(run, sglang.ENGINE)
        return
    newest = runs.newest_by(run.shown, key=_run_tp)
    parts = []
    for r in newest.values():
        m = engine_memory(r)
        parts.append(m.assign(TP=m["case"].map(_tp_of(r))))
    mem = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    engine_view.header(run, "Kimi-K2.5 tiny fed one image, TP " + " and ".join(map(str, newest)))
    if mem.empty:
        print("no process memory recorded")
        return
    print("Each process's memory on each GPU, the newest run of each TP size (" + "; ".join(
        f"TP {tp}: {engine_records.run_label(r)}" for tp, r in newest.items()) + "):")
    wide = mem.pivot_table(index=["TP", "case", "process"], columns="gpu", values="MiB",
                           aggfunc="sum").fillna(0).round(0)
    wide.columns = [f"GPU {c} (MiB)" for c in wide.columns]
    notebook.show_table(notebook.as_counts(wide, wide.columns))  # NVML counts whole MiB
    print("GPU 0 held by scheduler ranks ≥ 1 (MiB), every recorded run:")
    gpu0 = gpu0_by_run(run)
    notebook.show_table(notebook.as_counts(gpu0, gpu0.columns))
    for r in run.shown:
        extra = other_gpus(r)
        if extra:
            print(f"{engine_records.run_label(r)} (TP {_run_tp(r)} on {engine_gpus(r)} GPUs): with "
                  "#22858 reverted, ranks ≥ 1 also hold a context on other GPUs than GPU 0 and "
                  "their own: " + "; ".join(
                      f"TP{k} on GPU {', '.join(map(str, v))}" for k, v in extra.items()))
