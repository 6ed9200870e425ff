"""Tables and figures of notebook 05: the real engine's processes × GPUs (the picture under the
card, the engine section's ``VIEW``), the rebuild's GPU runs (the appendix), the lesson's cache
answer and "your own setup". Several runs keep apart in a ``run`` column (:func:`frame`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sglab.core import engine_records, engine_stats, notebook, plots, runs, text
from sglab.core.engine_view import EngineView
from sglab.grid_thw import measure, rebuild, series


STRAY = plots.PALETTE["before"]
VARIANT_ORDER = series.VARIANT_ORDER


# -- tables of one run's frame (or several runs' frames joined by `frame`) -------------------------
def run_name(run) -> str:
    """Short, unique name of a run: GPU, TP size, GPUs on the machine, start time (UTC)."""
    m = run.manifest
    box = m.gpu_count_machine or visible_gpus(run.df) or m.tp
    return f"{m.gpu} TP {m.tp}, {box}-GPU machine, {m.date} {m.created_utc[11:16]}Z"


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


def stray_contexts(df, variant: str = "before", phase: str = "kernel") -> tuple[int, float]:
    """The (rank >= 1, GPU not its own) pairs holding memory, their MiB (median over repeats)."""
    s = stray(df, gpu0_only=False)
    per = s[(s.variant == variant) & (s.phase == phase)].groupby(["rank", "gpu"]).value.median()
    return int((per > 0).sum()), float(per[per > 0].sum())


def _spread(g, n: str) -> pd.DataFrame:
    return g.agg(median_mib="median", min_mib="min", max_mib="max", **{n: "size"}).reset_index()


def gpu0_per_rank(df):
    """MiB each rank >= 1 holds on GPU 0 per run, variant, TP size, phase: median, min, max, n."""
    m = stray(df)
    return _spread(m.groupby(_by_run(m) + ["variant", "tp_size", "phase"]).value, "n")


def waste_vs_tp(df, phase: str = "kernel"):
    """Total MiB ranks 1..N-1 hold on GPU 0, per run, variant, TP size (median, min, max)."""
    m = stray(df)
    m = m[m.phase == phase]
    keys = _by_run(m) + ["variant", "tp_size"]
    return _spread(
        m.groupby(keys + ["repeat"]).value.sum().reset_index().groupby(keys).value, "repeats")


def off_rank_gpus(df):
    """MiB ranks >= 1 hold on GPUs neither GPU 0 nor their own, per run, variant and phase."""
    m = stray(df, gpu0_only=False)
    m = m[m.gpu != 0]
    keys = _by_run(m) + ["variant", "tp_size", "phase"]
    rows = []
    for key, g in m.groupby(keys):
        held = g[g.value > 0]
        pairs = [d.groupby(["rank", "gpu"]).ngroups for d in (held, g)]
        rows.append(
            dict(zip(keys, key), gpus_per_run=int(m.gpu.max()) + 1, pairs_holding=pairs[0],
                 pairs=pairs[1],
                 median_mib_per_pair=float(held.value.median()) if len(held) else 0.0,
                 total_mib=float(g.groupby("repeat").value.sum().median())))
    return pd.DataFrame(rows)


def landing(df):
    """Where each rank's grid landed: one row per variant × TP × rank (the set over repeats)."""
    d = df[df.metric.isin(["grid_device", "grid_key_is_image_grid_thw"])]
    idx = _by_run(d) + ["variant", "tp_size", "rank", "repeat"]
    out = d.pivot_table(index=idx, columns="metric", values="value").reset_index()
    out["grid_device"] = ["cpu" if v < 0 else f"cuda:{int(v)}" for v in out["grid_device"]]
    out["grid_key"] = np.where(out["grid_key_is_image_grid_thw"], "image_grid_thw", "grid_thws")
    out["repeat_id"] = out[_by_run(out) + ["repeat"]].astype(str).agg("/".join, axis=1)
    one = lambda s: "/".join(sorted(set(s)))  # noqa: E731
    return out.groupby(["variant", "tp_size",
                        "rank"]).agg(grid_key=("grid_key", one), grid_device=("grid_device", one),
                                     repeats=("repeat_id", "nunique")).reset_index()


def cache_table(df):
    """The cache point: a row per variant (before: per request, after: per image)."""
    c = df[df.phase == "cache"]
    return c.pivot_table(index="variant", columns="metric",
                         values="value").reindex(["before", "after"])


def concurrency(df):
    """Per run, variant, repeat: other processes on GPU 0 at ``init``, the ranks' MiB there."""
    o = df[(df.metric == "other_processes") & (df.gpu == 0) & (df.phase == "init")]
    keys = _by_run(df) + ["variant", "repeat"]
    if o.empty:
        return pd.DataFrame(columns=keys + ["others_on_gpu0", "ranks_ge1_on_gpu0_mib"])
    s = stray(df)
    s = s[s.phase == "init"].groupby(keys).value.max().rename("ranks_ge1_on_gpu0_mib")
    t = o.groupby(keys).value.max().rename("others_on_gpu0")
    return pd.concat([t, s], axis=1, join="inner").reset_index()


# -- the appendix: the rebuild's GPU runs, each section shown from the runs (or their NoRun line)
@notebook.needs_run
def landed(run) -> None:
    """The runs shown, where each rank's grid landed, process × GPU of the run with most ranks."""
    for r in run.shown:
        print(f"  {run_name(r)}  (method {r.manifest.method_version}, {r.path.name})")
    notebook.show_table(landing(frame(run.shown)))
    most = max(run.shown, key=lambda r: (r.manifest.tp, r.manifest.created_utc))
    notebook.show_figure(heatmaps(most))


@notebook.needs_run
def waste(run) -> None:
    """MiB per rank ≥ 1 on GPU 0 by phase, the GPU-0 total per TP size, then other GPUs."""
    df = frame(run.shown)
    per = gpu0_per_rank(df).pivot_table(index=["variant", "phase"], columns=["run"],
                                        values="median_mib")
    phases = [(v, p) for v in VARIANT_ORDER for p in measure.PHASES if (v, p) in per.index]
    notebook.show_table(text.counts(per.loc[phases]))
    notebook.show_table(text.counts(waste_vs_tp(df), ["median_mib", "min_mib", "max_mib"]))
    off = off_rank_gpus(df)
    off = off[off.pairs_holding > 0] if len(off) else off
    if len(off):
        notebook.show_table(text.counts(off, ["median_mib_per_pair", "total_mib"]))
    else:
        print("no rank holds memory on a GPU other than GPU 0 and its own")


def sampling(run) -> str:
    """The rate the parent's NVML sampler was asked for and the rate it reached over the run."""
    asked = float(run.manifest.params.get("sample_hz", measure.DEFAULT_PARAMS["sample_hz"]))
    d = run.df[run.df.metric.isin(["sampler_hz", "sampler_errors"])].groupby("metric").value.max()
    reached = f"{d['sampler_hz']:.0f} Hz reached" if "sampler_hz" in d else "no rate recorded"
    errors = f", {d['sampler_errors']:.0f} failed reads" if "sampler_errors" in d else ""
    return (f"{engine_records.run_label(run)}: NVML sampled by the parent, {asked:.0f} Hz asked, "
            f"{reached}{errors}")


@notebook.needs_run
def profiler(run) -> None:
    """The newest run shown with a memory time series: the figure, its steps, the stack limits."""
    found = next((r for r in reversed(run.shown) if r.sidecar("memory") is not None), None)
    if found is None:
        print("The runs shown predate the memory time series (method 1, no `memory` sidecar); a "
              "new recording (`sglab record grid_thw`) adds it.")
        return
    print(sampling(found))
    notebook.show_figure(series.memory_series(found, variants=("before", "after", "eager")))
    notebook.file_link(found.sidecar("trace"), "Perfetto trace of the same (ui.perfetto.dev)")
    notebook.show_table(series.growth_by_step(found))
    notebook.show_table(series.stack_limits(found.df))
    print(series.explain_growth(found))


# -- figures ---------------------------------------------------------------------------------------
def mechanism(engine):
    """Every process × GPU of the widest engine run, MiB with `.cpu()` reverted | as released."""
    if not engine:
        fig, ax = plots.canvas(6, 1.2)
        ax.text(5, 1.5, "no engine run to draw yet", ha="center", va="center")
        return fig
    run = max(engine.shown, key=lambda r: (engine_gpus(r), engine_tp(r), r.manifest.created_utc))
    t = engine_cells(run)
    procs, gpus = list(dict.fromkeys(t.process)), sorted(set(t.gpu))
    w, h, gx, gy = 1.9, 0.42, 0.3, 0.22
    width, height = 2.2 + len(gpus) * (w + gx), 1.3 + len(procs) * (h + gy)
    fig, ax = plots.canvas(min(11.0, 1.25 * width), min(5.5, 0.9 * height), xlim=(0, width),
                           ylim=(0, height))
    top = height - 0.95
    for j, g in enumerate(gpus):
        x = 2.2 + j * (w + gx)
        owner = "main, rank 0" if g == 0 else f"rank {g}"
        ax.text(x + w / 2, top + 0.42, f"GPU {g} ({owner})", ha="center", va="bottom", fontsize=9,
                fontweight="bold")
        for dx, which, color in ((w / 4, "reverted", "before"), (3 * w / 4, "released", "after")):
            ax.text(x + dx, top + 0.12, which, ha="center", va="bottom", fontsize=7.5,
                    color=plots.PALETTE[color])
    for i, proc in enumerate(procs):
        y = top - (i + 1) * (h + gy) + gy
        plots.label(ax, 0.1, y + h / 2, proc, fontsize=9)
        for j, g in enumerate(gpus):  # MiB reverted (left) | released; a stray context in red
            x, row = 2.2 + j * (w + gx), t[(t.process == proc) & (t.gpu == g)].iloc[0]
            left = (STRAY if row.stray else "#d5d8dc") if row.before > 0 else "white"
            plots.box(ax, x, y, w / 2, h, color=left, edge=STRAY if row.stray else "#566573")
            plots.box(ax, x + w / 2, y, w / 2, h, color="#d5d8dc" if row.after > 0 else "white")
            for dx, mib, white in ((w / 4, row.before, row.stray), (3 * w / 4, row.after, False)):
                ax.text(x + dx, y + h / 2, "—" if mib == 0 else f"{mib:.0f}", ha="center",
                        va="center", fontsize=8.5, color="white" if white else "black",
                        fontweight="bold" if white else "normal")
    foreign = (t["rank"] >= 0) & (t.gpu != t["rank"])
    s = t[t.stray]
    ax.set_title(
        f"SGLang {run.manifest.engine_runs[0]['release']}'s engine fed one image: MiB per "
        f"process and GPU, #22858's .cpu() reverted | as released ({run_name(run)})", fontsize=10)
    ax.text(
        0.1, 0.12, f"{len(s)} stray contexts, {s.before.sum():,.0f} MiB with .cpu() "
        f"reverted; {int((foreign & (t.after > 0)).sum())} as released", fontsize=8.5, color=STRAY)
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
        for (i, j), mib in np.ndenumerate(t.values):
            ax.text(j, i, f"{mib:.0f}", ha="center", va="center", fontsize=8,
                    color="white" if mib > 0.6 * vmax else "black")
        ax.set_title(f"{v}: MiB per process × GPU")
    fig.suptitle(run_name(run), fontsize=10)
    plots.caption(fig, run, extra=f"phase '{phase}' · median over repeats")
    return fig


def cache_answer(stats: dict):
    """``{"before": CacheStats, "after": CacheStats}`` as the exercise's answer."""
    names = {"before": "per request (before)", "after": "per image (after)"}
    return pd.DataFrame([{
        "cache key": names[v], "lookups": s.lookups, "hits": s.hits, "images": s.images,
        "images encoded": s.images_encoded, "images from the cache": f"{s.image_hit_rate:.1%}"
    } for v, s in stats.items()]).set_index("cache key")


# -- your own setup: a TP size and a request stream -> GPU-0 waste before the fix, vision cache hits
def stray_mib() -> dict:
    """Per GPU model and TP size: ``(before, after, runs)``, MiB per rank >= 1 on GPU 0 (kernel)."""
    per = pd.concat([
        gpu0_per_rank(r.df).assign(gpu=runs.gpu_short(r), run=r.manifest.created_utc)
        for r in runs.load_all_recorded(measure.EXPERIMENT)
    ] or [pd.DataFrame(columns=["gpu", "run", "variant", "tp_size", "phase", "median_mib"])])
    per = per[per.phase == "kernel"]
    out: dict = {}
    for (gpu, tp), g in per.groupby(["gpu", "tp_size"], sort=False):
        by = g.groupby("variant").median_mib.median()
        if {"before", "after"} <= set(by.index):
            out.setdefault(gpu, {})[int(tp)] = (float(by["before"]), float(by["after"]),
                                                int(g.run.nunique()))
    return {gpu: dict(sorted(t.items())) for gpu, t in out.items()}


def setup_table(tp_size: int, requests: int, image_pool: int, max_images: int):
    """Per GPU model: GPU-0 MiB of N − 1 ranks before and after (recorded or nearest), the cache."""
    stream = rebuild.request_stream(int(requests), int(image_pool), int(max_images), 0)
    before, after = (measure.simulate_cache(stream, fixed=f) for f in (False, True))
    cache = {
        "images requested": after.images, "encoded per request (before)": before.images_encoded,
        "encoded per image (after)": after.images_encoded
    }
    tp, n, rows = int(tp_size), int(tp_size) - 1, []
    for gpu, by_tp in stray_mib().items():
        below = [t for t in by_tp if t < tp]
        near = tp if tp in by_tp else max(below) if below else min(by_tp)
        b, a, runs_ = by_tp[near]
        source = (f"measured at TP {tp} ({'median of ' if runs_ > 1 else ''}{runs_} run"
                  f"{'s' * (runs_ > 1)})"
                  if near == tp else f"estimate from TP {near} (no TP {tp} run)")
        rows.append({
            "GPU": gpu, "stray MiB per rank ≥ 1": round(b), "per-rank MiB from": source,
            "GPU-0 MiB before": round(n * b), "GPU-0 MiB after": round(n * a), **cache
        })
    return pd.DataFrame(rows or [{"GPU": "no recorded run", **cache}])


def your_setup(interactive: bool = False):
    """TP size and a request stream -> :func:`setup_table`."""
    controls = dict(tp_size=[2, 4, 8, 16], requests=[50, 200, 1000], image_pool=[8, 24, 100, 1000],
                    max_images=[1, 2, 4, 8])
    static = [{"tp_size": 8, "requests": 200, "image_pool": 24, "max_images": 4},
              {"tp_size": 4, "requests": 200, "image_pool": 1000, "max_images": 1}]
    return notebook.explore(
        setup_table, controls, static=static, interactive=interactive,
        title="Your deployment: what the grid on cuda:0 and the bundled items cost")


# -- the real engine at TP 2 and TP 4 (data/recorded/engine_grid_thw/) -----------------------------
def engine_tp(run) -> int:
    return max((e["tp"] for e in run.manifest.engine_runs), default=1)


def engine_gpus(run) -> int:
    """The GPUs of the machine an engine run's engines saw (a TP-2 engine on a 4-GPU box sees 4)."""
    return run.manifest.gpu_count_machine or run.manifest.gpu_count


def engine_memory(run) -> pd.DataFrame:
    """Rows ``case, process, rank, gpu, MiB`` after the image request, per case that started."""
    df = engine_records.frame([run])
    df = df[df.tp == df.tp.max()]  # runs merged from TP 2 and TP 4: the widest, as its headline
    ok = {k[2] for k, v in engine_stats.started(df).items() if v}
    d = df[(df.metric == "gpu_memory") & df.case.isin(ok)]
    process = d.process.astype(str)
    rank = process.str.extract(r"scheduler_TP(\d+)", expand=False).astype(float)
    return pd.DataFrame(
        dict(case=d.case, process=process, rank=rank, gpu=d.gpu.astype(float).astype(int),
             MiB=d.value.astype(float))).reset_index(drop=True)


def engine_gpu0(run) -> dict:
    """``{case: {rank: MiB on GPU 0}}`` for every scheduler rank ≥ 1 of each case."""
    mem, tps = engine_memory(run), {e["case"]: e["tp"] for e in run.manifest.engine_runs}
    on0 = mem[mem["gpu"] == 0].groupby(["case", "rank"])["MiB"].sum()
    ranks = {case: range(1, tps.get(case, 1)) for case in sorted(set(mem["case"]))}
    return {case: {r: float(on0.get((case, r), 0.0)) for r in rs} for case, rs in ranks.items()}


def engine_stray(run, case: str) -> tuple[int, float]:
    """The (scheduler rank >= 1, GPU not its own) pairs holding memory in ``case``, their MiB."""
    m = engine_memory(run)
    m = m[(m["case"] == case) & (m["rank"].fillna(0) >= 1) & (m["gpu"] != m["rank"]) & (m.MiB > 0)]
    return len(m), float(m.MiB.sum())


def gpus_held(run) -> dict:
    """``{case: {rank: [GPU, ...]}}``: the GPUs where each scheduler rank ≥ 1 holds memory."""
    mem = engine_memory(run)
    held = mem[mem["rank"].fillna(0) >= 1].assign(gpu=lambda d: d["gpu"].where(d["MiB"] > 0))
    return {
        case: {int(r): sorted(int(x) for x in g.dropna())
               for r, g in c.groupby("rank").gpu}
        for case, c in held.groupby("case")
    }


def other_gpus(run) -> dict:
    """``{rank: [GPU, ...]}``: with #22858 reverted, the GPUs besides 0 and its own a rank holds."""
    before = gpus_held(run).get("before", {})
    return {r: o for r, g in before.items() if (o := [x for x in g if x not in (0, r)])}


def engine_cells(run) -> pd.DataFrame:
    """Every process × GPU of one engine run, MiB ``before`` and ``after``, and ``stray``."""
    m = engine_memory(run).assign(case=lambda d: d["case"].replace({"released": "after"}))
    m["process"] = [f"rank {r:.0f}" if r == r else "main (tokenizer)" for r in m["rank"]]
    m["rank"] = m["rank"].fillna(-1).astype(int)
    t = m.pivot_table(index=["rank", "process"], columns=["gpu", "case"], values="MiB",
                      aggfunc="sum")
    every = pd.MultiIndex.from_product([range(engine_gpus(run)), ["before", "after"]])
    t = t.reindex(columns=every).fillna(0.0).stack(level=0, future_stack=True).reset_index()
    t.columns = ["rank", "process", "gpu", "before", "after"]
    t["stray"] = (t["rank"] >= 0) & (t.gpu != t["rank"]) & (t.before > 0)
    return t


def engine_table(newest: dict) -> pd.DataFrame:
    """``{TP: run}`` -> MiB per (TP, case, process) and GPU; NaN where a machine had no such GPU."""
    mem = pd.concat([engine_memory(r).assign(TP=tp) for tp, r in newest.items()])
    wide = mem.pivot_table(index=["TP", "case", "process"], columns="gpu", values="MiB",
                           aggfunc="sum")
    for tp, r in newest.items():
        there = [g for g in wide.columns if g < engine_gpus(r)]
        rows = wide.index.get_level_values("TP") == tp
        wide.loc[rows, there] = wide.loc[rows, there].fillna(0)
    wide.columns = [f"GPU {c}" for c in wide.columns]
    return wide


def engine_tables(rs) -> None:
    """``VIEW.extra``: each process's MiB per GPU, newest run per TP size; other GPUs held."""
    newest = runs.newest_by(rs.shown, key=engine_tp)
    mem = pd.concat([engine_memory(r).assign(TP=tp) for tp, r in newest.items()])
    if mem.empty:
        print("no process memory recorded")
        return
    print("Each process's memory on each GPU after the image request (MiB), the newest run of "
          "each TP size (" + "; ".join(
              f"TP {tp}: {engine_records.run_label(r)}, {engine_gpus(r)} GPUs"
              for tp, r in newest.items()) + "); blank: no such GPU on that run's machine:")
    notebook.show_table(text.blank(text.counts(engine_table(newest))))  # NVML counts whole MiB
    for r in rs.shown:
        if extra := other_gpus(r):
            print(f"{engine_records.run_label(r)} (TP {engine_tp(r)} on {engine_gpus(r)} GPUs): "
                  f"with #22858 reverted, ranks ≥ 1 also hold a context on GPUs other than GPU 0 "
                  f"and their own: " + "; ".join(
                      f"TP{k} on GPU {', '.join(map(str, v))}" for k, v in extra.items()))


VIEW = EngineView(
    what="Kimi-K2.5 tiny fed one 448×448 image, 0.5.11 as released and with #22858's `.cpu()` "
    "reverted, at TP 2 and TP 4", extra=engine_tables)
