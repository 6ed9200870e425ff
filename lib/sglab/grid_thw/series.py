"""The memory time series of a grid_thw run: NVML samples of every process of a group and the marks
each process took, made into the sidecars ``memory``, ``marks`` and ``trace`` (Perfetto), then read
back: what each marked step added to a process's memory on a GPU, and the profiler picture."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from sglab.core import memory, plots
from sglab.core.text import span

# the steps each rank marks after it unpickles the grid (measure's rank code marks them by name)
KERNEL_STEPS = ("first kernel", "reduce", "item", "copy to own GPU", "own-GPU kernel")

VARIANT_ORDER = ("before", "ipc", "eager", "after")

# -- the time series: NVML samples and marks reduced to sidecars (times from each group's start) ---
MEMORY_COLUMNS = ["variant", "repeat", "process", "rank", "gpu", "t_s", "mib"]
MARK_COLUMNS = ["variant", "repeat", "process", "rank", "mark", "t_s", "dur_s"]


def group_tables(groups: list[dict], samples, ticks: list[float]):
    """The ``memory`` change points and ``marks`` of every group, times from the group's start."""
    mem, marks = [], []
    for g in groups:
        t0 = g["t_start"]
        window = [t for t in ticks if t0 <= t <= g["t_end"]]
        for s in memory.step_series(samples, window, pids=list(g["procs"])).itertuples():
            process, rank = g["procs"][s.pid]
            t = round(s.t - t0, 4)
            mem.append((g["variant"], g["repeat"], process, rank, s.gpu, t, s.used_mib))
        for process, rank, name, a, b in g["marks"]:
            marks.append((g["variant"], g["repeat"], process, rank, name, round(a - t0, 4),
                          round(b - a, 4)))
    return pd.DataFrame(mem, columns=MEMORY_COLUMNS), pd.DataFrame(marks, columns=MARK_COLUMNS)


def write_perfetto(mem, marks, path) -> Path:
    """Chrome trace JSON: a process per group, a MiB counter per (process, GPU), marks as slices."""
    keys = {(v, r) for d in (mem, marks) for v, r in zip(d.variant, d.repeat.tolist())}
    gid = {k: i + 1 for i, k in enumerate(sorted(keys, key=str))}
    tid: dict = {}
    events = [
        dict(name="process_name", ph="M", pid=i, args={"name": f"{variant} · repeat {repeat}"})
        for (variant, repeat), i in gid.items()
    ]
    for r in marks.itertuples():
        k = (r.variant, r.repeat)
        t = tid.setdefault((k, r.process), len(tid) + 1)
        events.append(dict(name="thread_name", ph="M", pid=gid[k], tid=t, args={"name": r.process}))
        events.append(
            dict(name=r.mark, ph="X", pid=gid[k], tid=t, ts=r.t_s * 1e6,
                 dur=max(r.dur_s * 1e6, 1.0)))
    for r in mem.itertuples():
        events.append(
            dict(name=f"{r.process} · GPU {r.gpu} (MiB)", ph="C", pid=gid[(r.variant, r.repeat)],
                 ts=r.t_s * 1e6, args={"MiB": r.mib}))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path


def sidecars(groups: list[dict], samples, ticks: list[float]) -> dict:
    mem, marks = group_tables(groups, samples, ticks)
    trace = Path(tempfile.mkdtemp(prefix="sglab-grid-trace-")) / "grid_thw.trace.json.gz"
    write_perfetto(mem, marks, trace)
    return {"memory": mem, "marks": marks, "trace": trace}


# -- the memory time series: which mark each step in a process's memory belongs to -----------------
def _values_at(series, ts) -> "np.ndarray":
    """The step series' (sorted by ``t_s``) values at ``ts`` (0 before its first point)."""
    i = np.searchsorted(series.t_s.to_numpy(), np.asarray(ts, dtype=float), side="right")
    return np.concatenate(([0.0], series.mib.to_numpy(dtype=float)))[i]


def mark_deltas(mem, marks, *, gpu: int = 0):
    """Per mark of every process: MiB on ``gpu`` when it began, when the next began, the change."""
    out = []
    mem = mem[mem.gpu == gpu]
    series = dict(
        list(mem.sort_values("t_s", kind="stable").groupby(["variant", "repeat", "process"])))
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
    columns = [*MARK_COLUMNS[:4], "gpu", "mark", "before_mib", "after_mib", "delta_mib"]
    return pd.DataFrame(out, columns=columns)


def step_deltas(run, gpu: int = 0):
    """What each marked step added to each process's memory on ``gpu`` (None without a series)."""
    mem, marks = run.sidecar("memory"), run.sidecar("marks")
    return run.memo(
        f"step_deltas {gpu}", lambda: None
        if mem is None or marks is None else mark_deltas(mem, marks, gpu=gpu))


def growth_by_step(run):
    """Median MiB each step added on GPU 0 for ranks >= 1, a row per variant (None: no series)."""
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
    """CU_LIMIT_STACK_SIZE on the grid's GPU after each kernel step, ranks >= 1 (min–max)."""
    s = df[(df.metric == "stack_limit_bytes") & (df["rank"] >= 1)]
    if s.empty:
        return pd.DataFrame()
    t = s.groupby(["variant", "phase"]).value.agg(lambda v: span(v, "{:.0f}")).unstack()
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


# -- the profiler picture: every process's memory over time, one group per variant -----------------
SERIES_MARKS = ("unpickle", *KERNEL_STEPS, "release")
LINE_COLORS = {
    "tokenizer": "#7f8c8d", "rank 0": "#2471a3", "rank 1": "#229954", "rank 2": "#d68910",
    "rank 3": "#7d3c98"
}


def memory_series(run, *, repeat: int = 0, variants=("before", "after"), rank: int = 1):
    """Every process's NVML memory over time, one group per variant (None without a series)."""
    mem, marks = run.sidecar("memory"), run.sidecar("marks")
    if mem is None or marks is None:
        return None
    variants = [v for v in variants if v in set(mem.variant)]
    fig, axes = plots.figure(nrows=len(variants), width=11.0, height=3.3 * len(variants))
    axes = np.ravel(np.atleast_1d(axes))
    for ax, v in zip(axes, variants):  # every process of the group, the rank's steps shaded
        m, me = (d[(d.variant == v) & (d.repeat == repeat)] for d in (mem, marks))
        me = me[me.process == f"rank {rank}"]
        own, end = me[me["mark"] == "own context"].t_s, me[me["mark"] == "release"]
        t0 = (float(own.min()) if len(own) else float(me.t_s.min())) - 0.4
        t1 = (float((end.t_s + end.dur_s).max()) if len(end) else float(me.t_s.max())) + 0.4
        top = max(1.0, float(m.mib.max()))
        for (proc, gpu), g in m.groupby(["process", "gpu"]):
            if g.mib.max() == 0:
                continue
            stray_ = proc.startswith("rank") and int(proc.split()[1]) != gpu
            g = pd.concat([g, g.tail(1).assign(t_s=max(t1, float(g.t_s.max())))]).sort_values("t_s")
            ax.step(g.t_s, g.mib, where="post", lw=2.4 if stray_ else 1.2,
                    ls="-" if stray_ else "--",
                    color=plots.PALETTE["before"] if stray_ else LINE_COLORS.get(proc, "#34495e"),
                    label=f"{proc} on GPU {gpu}" + (" (stray)" if stray_ else ""))
        for r in me[me["mark"].isin(SERIES_MARKS)].itertuples():
            ax.axvspan(r.t_s, r.t_s + max(r.dur_s, 0.004), color="#f9e79f", alpha=0.8, lw=0)
            ax.text(r.t_s, top * 1.02, r.mark, rotation=50, fontsize=7, ha="left", va="bottom",
                    color="#555555")
        ax.set_xlim(t0, t1)
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel("MiB (NVML)")
        ax.set_title(f"{v}: every process of the group, rank {rank}'s steps shaded", loc="left",
                     pad=34)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5)
    axes[-1].set_xlabel("seconds from the group's start")
    hz = float(run.df[run.df.metric == "sampler_hz"].value.max())
    plots.caption(fig, run, extra=f"repeat {repeat} · NVML sampled in the parent at {hz:.0f} Hz")
    return fig
