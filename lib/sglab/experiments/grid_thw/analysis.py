"""Tables from grid_thw runs: where the grid landed, what each process holds on each GPU, the waste on GPU 0, the
spread between repeats, leftovers, the cache point and the memory steps of the time series.

Every function takes one run's frame or several runs' frames joined by :func:`frame` (a ``run`` column keeps them
apart; runs are never added up).
"""

from __future__ import annotations

import pandas as pd

from sglab.experiments.grid_thw.ranks import PHASES


def run_name(run) -> str:
    """Short, unique name of one run: GPU, TP size, GPUs on the machine, start time (UTC)."""
    m = run.manifest
    gpu = str(m.get("gpu_name", "?")).replace("NVIDIA ", "")
    tp = int(m.get("params", {}).get("tp_size", m.get("gpu_count", 0)))
    box = int(m.get("gpu_count_machine", visible_gpus(run.df) or tp))
    created = str(m.get("created_utc", ""))
    return f"{gpu} TP {tp}, {box}-GPU machine, {created[:10]} {created[11:16]}Z"


def visible_gpus(df: pd.DataFrame) -> int:
    """How many GPUs the ranks saw (the NVML readings cover every GPU of the machine)."""
    mem = memory_frame(df)
    return int(mem.gpu.max()) + 1 if len(mem) else 0


def frame(runs_: list) -> pd.DataFrame:
    """All runs in one tidy frame with a ``run`` column (:func:`run_name`), oldest run first."""
    frames = [r.df.assign(run=run_name(r)) for r in runs_]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _by_run(df: pd.DataFrame) -> list[str]:
    return ["run"] if "run" in df.columns else []


def memory_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.metric == "gpu_memory"]


def stray(df: pd.DataFrame, *, gpu0_only: bool = True) -> pd.DataFrame:
    """Readings of ranks >= 1 on GPUs that are not their own: GPU 0 only (default), or every foreign GPU."""
    m = memory_frame(df)
    m = m[(m["rank"] >= 1) & (m.gpu != m["rank"])]
    return m[m.gpu == 0] if gpu0_only else m


def heatmap(df: pd.DataFrame, variant: str, phase: str = "kernel") -> pd.DataFrame:
    """Process × GPU MiB (median over repeats) for one variant and phase, of ONE run."""
    m = memory_frame(df)
    m = m[(m.variant == variant) & (m.phase == phase)]
    t = m.groupby(["rank", "process", "gpu"]).value.median().reset_index()
    t = t.sort_values(["rank"], key=lambda s: s.where(s >= 0, 10**6))
    table = t.pivot_table(index="process", columns="gpu", values="value", sort=False)
    table = table[sorted(table.columns)]
    table.columns = [f"GPU {int(c)}" for c in table.columns]
    table.index.name = None
    return table


def gpu0_per_rank(df: pd.DataFrame) -> pd.DataFrame:
    """MiB each rank >= 1 holds on GPU 0 (where it has no business), per run (when ``df`` has a ``run`` column),
    variant, TP size and phase: median, min and max over repeats and ranks, and how many values."""
    m = stray(df)
    g = m.groupby(_by_run(m) + ["variant", "tp_size", "phase"]).value
    out = pd.DataFrame({"median_mib": g.median(), "min_mib": g.min(), "max_mib": g.max(), "n": g.size()})
    return out.reset_index()


def waste_vs_tp(df: pd.DataFrame, phase: str = "kernel") -> pd.DataFrame:
    """Total MiB on GPU 0 held by ranks 1..N-1, per run (when ``df`` has a ``run`` column), variant and TP size
    (median, min, max over repeats; runs are never summed together)."""
    m = stray(df)
    m = m[m.phase == phase]
    keys = _by_run(m) + ["variant", "tp_size"]
    per_rep = m.groupby(keys + ["repeat"]).value.sum().reset_index()
    g = per_rep.groupby(keys).value
    return pd.DataFrame({"median_mib": g.median(), "min_mib": g.min(), "max_mib": g.max(),
                         "repeats": g.size()}).reset_index()


def off_rank_gpus(df: pd.DataFrame) -> pd.DataFrame:
    """MiB ranks >= 1 hold on GPUs that are neither GPU 0 nor their own, per run, variant and phase: how many
    (rank, GPU) pairs hold anything, the median MiB of those, and the total per repeat (median)."""
    m = stray(df, gpu0_only=False)
    m = m[m.gpu != 0]
    keys = _by_run(m) + ["variant", "tp_size", "phase"]
    rows = []
    for key, g in m.groupby(keys):
        held = g[g.value > 0]
        per_rep = g.groupby("repeat").value.sum()
        rows.append(dict(zip(keys, key), gpus_per_run=int(m.gpu.max()) + 1 if len(m) else 0,
                         pairs_holding=held.groupby(["rank", "gpu"]).ngroups, pairs=g.groupby(["rank", "gpu"]).ngroups,
                         median_mib_per_pair=float(held.value.median()) if len(held) else 0.0,
                         total_mib=float(per_rep.median())))
    return pd.DataFrame(rows)


def repeatability(df: pd.DataFrame, variants=("before", "ipc", "eager", "after")) -> pd.DataFrame:
    """MiB per rank >= 1 on GPU 0, one column per run, one row per variant and phase: the value when every repeat
    and rank agree, "lo–hi" when they do not (the spread within a run); ``n`` values per cell."""
    per = gpu0_per_rank(df)
    cell = [f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}" for lo, hi in zip(per.min_mib, per.max_mib)]
    per = per.assign(mib=[f"{c} (n={n})" for c, n in zip(cell, per.n)])
    cols = _by_run(per) or ["tp_size"]
    t = per.pivot_table(index=["variant", "phase"], columns=cols, values="mib", aggfunc="first")
    order = [(v, p) for v in variants for p in PHASES if (v, p) in t.index]
    t = t.loc[order]
    t.columns.name = None
    return t


def spread_mib(df: pd.DataFrame) -> float:
    """The largest max − min of the MiB a rank >= 1 holds on GPU 0, over the repeats and ranks of one variant and
    phase (0 when every repeat of every rank read the same)."""
    per = gpu0_per_rank(df)
    return float((per.max_mib - per.min_mib).max()) if len(per) else 0.0


def landing(df: pd.DataFrame) -> pd.DataFrame:
    """Where each rank's grid landed (one row per variant × TP × rank; the set of devices over repeats and runs)."""
    d = df[df.metric.isin(["grid_device", "grid_key_is_image_grid_thw"])]
    idx = _by_run(d) + ["variant", "tp_size", "rank", "repeat"]
    out = d.pivot_table(index=idx, columns="metric", values="value").reset_index()
    out["grid_device"] = ["cpu" if v < 0 else f"cuda:{int(v)}" for v in out["grid_device"]]
    out["grid_key"] = ["image_grid_thw" if v else "grid_thws" for v in out["grid_key_is_image_grid_thw"]]
    out["repeat_id"] = out[_by_run(out) + ["repeat"]].astype(str).agg("/".join, axis=1)
    return out.groupby(["variant", "tp_size", "rank"]).agg(
        grid_key=("grid_key", lambda s: "/".join(sorted(set(s)))),
        grid_device=("grid_device", lambda s: "/".join(sorted(set(s)))),
        repeats=("repeat_id", "nunique")).reset_index()


def leftovers(df: pd.DataFrame) -> pd.DataFrame:
    """Per run, variant and TP size: processes still alive / still listed by NVML after each group (max over
    repeats), and how many groups were checked."""
    d = df[df.metric.isin(["processes_alive", "nvml_processes_listed"])]
    idx = _by_run(d) + ["variant", "tp_size"]
    t = d.pivot_table(index=idx, columns="metric", values="value", aggfunc="max").reset_index()
    checked = d[d.metric == "processes_alive"].groupby(idx).size().rename("groups_checked").reset_index()
    t = t.merge(checked, on=idx)
    t.columns.name = None
    return t


def cache_table(df: pd.DataFrame) -> pd.DataFrame:
    """The cache point: one row per variant (before = bundled per request, after = per image), one column per
    metric."""
    c = df[df.phase == "cache"]
    return c.pivot_table(index="variant", columns="metric", values="value").reindex(["before", "after"])


def concurrency(df: pd.DataFrame) -> pd.DataFrame:
    """Per run, variant and repeat: the most processes of *other* groups rank 0 saw on GPU 0 at ``init``, and what the
    group's ranks >= 1 held there at that moment (method 2: groups run side by side; method-1 runs have no rows)."""
    o = df[(df.metric == "other_processes") & (df.gpu == 0) & (df.phase == "init")]
    keys = _by_run(df) + ["variant", "repeat"]
    if o.empty:
        return pd.DataFrame(columns=keys + ["others_on_gpu0", "ranks_ge1_on_gpu0_mib"])
    s = stray(df)
    s = s[s.phase == "init"].groupby(keys).value.max().rename("ranks_ge1_on_gpu0_mib")
    t = o.groupby(keys).value.max().rename("others_on_gpu0")
    return pd.concat([t, s], axis=1, join="inner").reset_index()


def cells(df: pd.DataFrame, phase: str = "kernel") -> pd.DataFrame:
    """Process × GPU, before vs after (median over repeats) for ONE run: the numbers of the mechanism picture.
    ``stray``: a rank holds memory on a GPU that is not its own."""
    m = memory_frame(df)
    m = m[(m.phase == phase) & m.variant.isin(["before", "after"])]
    t = m.pivot_table(index=["process", "rank", "gpu"], columns="variant", values="value", aggfunc="median")
    t = t.reindex(columns=["before", "after"]).fillna(0.0).reset_index()
    t["stray"] = (t["rank"] >= 0) & (t.gpu != t["rank"]) & (t.before > 0)
    t.columns.name = None
    return t.sort_values(["rank", "gpu"]).reset_index(drop=True)  # tokenizer (rank -1) first


def step_deltas(run, gpu: int = 0) -> pd.DataFrame | None:
    """What each marked step added to each process's memory on ``gpu`` (None without a time series)."""
    from sglab.experiments.grid_thw import series

    mem, marks = run.sidecar("memory"), run.sidecar("marks")
    if mem is None or marks is None:
        return None
    return series.mark_deltas(mem, marks, gpu=gpu)


def memory_steps(run) -> pd.DataFrame | None:
    """The increases in each process's memory over time with the mark that caused them (None when the run has no
    time series: recorded before method 2)."""
    from sglab.experiments.grid_thw import series

    mem, marks = run.sidecar("memory"), run.sidecar("marks")
    if mem is None or marks is None:
        return None
    return series.steps(mem, marks)


def growth_by_step(run) -> pd.DataFrame | None:
    """MiB each step added on GPU 0 for ranks >= 1 (median over repeats and ranks), one row per variant, one column
    per step in time order (None without a time series)."""
    from sglab.experiments.grid_thw.ranks import KERNEL_STEPS

    d = step_deltas(run, gpu=0)
    if d is None:
        return None
    order = ["unpickle", *KERNEL_STEPS]
    d = d[(d["rank"] >= 1) & d["mark"].isin(order)]
    t = d.pivot_table(index="variant", columns="mark", values="delta_mib", aggfunc="median")
    t = t.reindex(columns=[c for c in order if c in t.columns])
    t = t.reindex([v for v in ("before", "ipc", "eager", "after") if v in t.index])
    t.columns.name = None
    return t


def stack_limits(df: pd.DataFrame) -> pd.DataFrame:
    """The per-thread stack limit (CU_LIMIT_STACK_SIZE) of the context on the grid's GPU after each kernel step, for
    ranks >= 1 (min–max over repeats and ranks; method 2)."""
    from sglab.experiments.grid_thw.ranks import KERNEL_STEPS

    s = df[(df.metric == "stack_limit_bytes") & (df["rank"] >= 1)]
    if s.empty:
        return pd.DataFrame()
    t = s.groupby(["variant", "phase"]).value.agg(lambda v: f"{v.min():.0f}" if v.min() == v.max()
                                                  else f"{v.min():.0f}–{v.max():.0f}").unstack()
    t = t.reindex(columns=[c for c in KERNEL_STEPS if c in t.columns])
    t.columns.name = None
    return t


def explain_growth(run) -> str:
    """The growth of the stray context in words, from the run's own numbers (time series, stack limits, eager)."""
    g = growth_by_step(run)
    if g is None or "before" not in g.index:
        return "This run has no memory time series: record a new run to see where the context grows."
    b = g.loc["before"]
    steps = [c for c in g.columns if c != "unpickle"]
    big = max(steps, key=lambda c: b[c])
    small = ", ".join(f"`{c}` +{b[c]:.0f}" for c in steps if c != big)
    text = (f"Before the fix, a rank ≥ 1's GPU-0 context appears during the unpickling ({b['unpickle']:.0f} MiB) and "
            f"grows by {b[big]:.0f} MiB during `{big}`; the other steps add little ({small} MiB).")
    stack = stack_limits(run.df)
    if len(stack) and "before" in stack.index and big in stack.columns:
        text += (f" The per-thread stack limit reads {stack.loc['before', big]} bytes after `{big}` as after every "
                 "other step, so the step is not the driver raising the stack size.")
    if "eager" in g.index:
        e = g.loc["eager"]
        text += (f" With CUDA_MODULE_LOADING=EAGER the stray context is {e['unpickle']:.0f} MiB at the unpickling and "
                 f"the kernel steps add {sum(e[c] for c in steps):.0f} MiB: what lazy loading defers to the first "
                 "kernel that needs it, eager loading pays up front (and much more of it).")
    return text
