"""Recorded real-engine runs (``data/recorded/engine_<fix>/``), read as one frame of the newest
answer per model and variant (:func:`frame`)."""

from __future__ import annotations

import copy
from collections import OrderedDict

import numpy as np
import pandas as pd

from sglab.core import hardware, runs


KEYS = ["model", "release", "case"]
AGAIN = "-again"  # a case's A/A control: the same flags, started in the same interleaved rounds


def _model_of(run) -> dict:
    """``{variant: model name}`` from the run's engine entries."""
    return {e["variant"]: (e.get("model") or {}).get("name", "?") for e in run.manifest.engine_runs}


def frame(runs_: list) -> pd.DataFrame:
    """The newest answer per (model, TP size, variant); cached and shared: never change it."""
    if len(runs_) == 1 and hasattr(runs_[0], "memo"):
        return runs_[0].memo("engine frame", lambda: _frame(runs_), shared=True)
    return cached(_FRAMES, tuple(runs_), (), lambda: _frame(runs_), 64)


_FRAMES: OrderedDict = OrderedDict()  # frames of several runs, the newest 64


def cached(store: OrderedDict, objs: tuple, key: tuple, work, limit: int):
    """``work()`` once per ``objs`` (by identity) and ``key``, the newest ``limit`` kept."""
    k = (*map(id, objs), *key)
    hit = store.get(k)
    if hit is None or any(a is not b for a, b in zip(hit[0], objs)):
        hit = store[k] = (objs, work())
        if len(store) > limit:
            store.popitem(last=False)
    store.move_to_end(k)
    return hit[1]


def _rows(run) -> tuple:
    """``(rows, at, combos, has, ok)``: a run's rows with model, TP and run label, each row's index
    into its distinct ``ids``, which of those have a status row, an ok one; shared: never change."""

    def make():
        df = run.df.copy()
        named = df["variant"].map(_model_of(run))  # a merged run keeps its rows' own model
        df["model"] = (df["model"].fillna(named) if "model" in df else named).fillna("?")
        tps = {e["variant"]: int(e.get("tp") or 1) for e in run.manifest.engine_runs}
        tp = df["variant"].map(tps)
        df["tp"] = (df["tp"].fillna(tp) if "tp" in df else tp).fillna(1).astype(int)
        df["run"] = run_label(run)
        cols = ("model", "tp", "tool", "release", "variant", "case")  # these go together
        ids = pd.DataFrame({c: df[c] if c in df else np.nan for c in cols}).fillna({"tool": ""})
        at = ids.groupby(list(ids), sort=False, dropna=False).ngroup().to_numpy()
        has, ok = np.zeros((2, at.max(initial=-1) + 1), bool)
        status = (df["metric"] == "status").to_numpy()
        has[at[status]], ok[at[status & (df["value"] == "ok").to_numpy()]] = True, True
        return df, at, ids.drop_duplicates().reset_index(drop=True), has, ok

    return run.memo("engine rows", make, shared=True) if hasattr(run, "memo") else make()


def _frame(runs_: list) -> pd.DataFrame:
    got = [_rows(r) for r in sorted(runs_, key=lambda r: r.manifest.created_utc)]
    if not got:
        return pd.DataFrame(columns=[*KEYS, "metric", "value", "run"])
    # per run and distinct ids (few, not per row): the newest answer per variant of each model, TP
    # size and tool; a variant the newest run with its release's A/A control answered comes from it
    ends = np.cumsum([0] + [len(g[2]) for g in got])
    order = np.repeat(np.arange(len(got)), np.diff(ends)).tolist()
    ids = [i for g in got for i in g[2].itertuples(index=False, name=None)]
    key = [(m, tp, tool, v) for m, tp, tool, _, v, _ in ids]  # model, TP, tool, variant
    keep = np.ones(len(ids), bool)
    if {"case", "release"} <= {c for g in got for c in g[0].columns}:
        ctl: dict = {}  # (model, TP, tool, release): the newest run with its A/A control
        for (m, tp, tool, rel, _, case), o in zip(ids, order):
            if str(case).endswith(AGAIN) and not pd.isna(rel):
                ctl[m, tp, tool, rel] = max(ctl.get((m, tp, tool, rel), -1), o)
        mine = [ctl.get(i[:4]) == o for i, o in zip(ids, order)]
        answered = {k for k, y in zip(key, mine) if y}
        keep = np.array([k not in answered or y for k, y in zip(key, mine)], bool)
    has, ok = np.concatenate([g[3] for g in got]), np.concatenate([g[4] for g in got])
    if not (has & keep).any():  # a rebuild's run: every variant it has answered
        has, ok = np.ones(len(ids), bool), np.ones(len(ids), bool)
    best: dict = {}  # per model, TP, tool and variant: (answered ok, newest)
    for i in np.flatnonzero(has & keep):
        if not pd.isna(key[i][3]):
            best[key[i]] = max(best.get(key[i], (False, -1)), (bool(ok[i]), order[i]))
    stays = np.array([best.get(k, (0, -1))[1] == o for k, o in zip(key, order)], bool) & keep
    rows = pd.concat([g[0][stays[a:b][g[1]]] for g, a, b in zip(got, ends, ends[1:])],
                     ignore_index=True)
    return rows.assign(tool=rows["tool"].fillna("") if "tool" in rows else "")


def merged(runs_: list) -> runs.Run:
    """Runs of one experiment as one Run: :func:`frame`'s rows, every engine entry, spec and log."""
    ordered = sorted(runs_, key=lambda r: r.manifest.created_utc)
    newest = ordered[-1]
    if len(ordered) == 1 or not any(r.manifest.engine_runs for r in ordered):
        return newest  # one run, or rebuild runs: each whole, the newest answers every variant
    m = copy.deepcopy(newest.manifest.raw)
    m["engine_runs"] = [e for r in ordered for e in r.manifest.engine_runs]
    own = newest.manifest.sidecars.items()
    cars = {n: str(newest.path.parent / f) for n, f in own if not n.startswith("log_")}
    entries = [(r, f"log_{i}") for r in ordered for i in range(len(r.manifest.engine_runs))]
    for at, (r, log) in enumerate(entries):  # each engine entry keeps its own log (``log_<i>``)
        if log in r.manifest.sidecars:
            cars[f"log_{at}"] = str(r.path.parent / r.manifest.sidecars[log])
    m["sidecars"] = cars
    m.setdefault("params",
                 {})["specs"] = [e for r in ordered for e in r.manifest.params.get("specs", [])]
    m["merged_from"] = [r.path.name for r in ordered]
    counts = sorted({r.manifest.gpu_count for r in ordered})
    m["merged_span"] = dict(gpu_counts=counts,
                            dates=[ordered[0].manifest.date, newest.manifest.date])
    # each row keeps its model and TP size: two runs may share a variant name for two of either
    df = frame(ordered).drop(columns=["run"])
    m["rows"] = len(df)
    return runs.Run(df, m, newest.path)


def by_gpu(runs_: list) -> dict:
    """``{GPU model: its runs}``, in the order of ``runs_``."""
    gpus = dict.fromkeys(r.manifest.gpu for r in runs_)
    return {gpu: [r for r in runs_ if r.manifest.gpu == gpu] for gpu in gpus}


def per_gpu(rs: runs.RunSet) -> list:
    """One merged run per GPU model (:func:`merged`): the model shown first, then the others."""
    return [merged(v) for v in by_gpu([*rs.shown, *rs.elsewhere]).values()]


def load(fix: str, number: str = "NN") -> runs.RunSet:
    """A fix's recorded engine runs, the GPU model answering the most variants shown; or a NoRun."""
    found = sorted(runs.load_all_recorded(f"engine_{fix}"), key=lambda r: r.manifest.created_utc)
    if not found:
        return runs.NoRun(
            f"engine_{fix}", "no recorded real-engine run; on a GPU box: "
            f"bash scripts/engine_gpu.sh --plan {number}")
    by = by_gpu(found)
    answers = {g: {(m, v) for r in rs for v, m in _model_of(r).items()} for g, rs in by.items()}
    gpu = min(by, key=lambda g: (-len(answers[g]), -len(by[g])))  # first of equals
    return runs.RunSet(by[gpu], [r for r in found if r.manifest.gpu != gpu],
                       experiment=f"engine_{fix}")


def label(run) -> str:
    return f"{run.manifest.gpu}, {run.manifest.date}"


def run_label(r) -> str:
    """One run among several of a day: GPU, date, time (UTC) and the CPUs where pinned."""
    return f"{label(r)} {r.manifest.created_utc[11:16].replace(':', '')}Z{pinned(r)}"


def pinned(r) -> str:
    """``", CPUs 0-7"`` where a run's engines ran pinned (``sglab engine --cpus``), else ``""``."""
    sets = sorted({tuple(e.get("cpus") or ()) for e in r.manifest.engine_runs} - {()})
    return "".join(f", CPUs {hardware.cpu_text(c)}" for c in sets)


def host_medians(r) -> list[float]:
    """One run's host per-launch costs measured before and after it (medians, µs)."""
    got = r.manifest.host_launch_us.values()
    return [v["median"] for v in got if isinstance(v, dict) and "median" in v]


def run_host_us(r) -> float | None:
    """One run's host per-launch cost: the mean of its before and after medians (µs), else None."""
    got = host_medians(r)
    return sum(got) / len(got) if got else None


def host_us(rs: runs.RunSet, *variant: str) -> float | None:
    """The host's µs per launch beside the newest run that started ``variant`` (release, ...)."""
    for r in sorted(rs.shown, key=lambda r: r.manifest.created_utc, reverse=True):
        started = {(e.get("release"), (e.get("model") or {}).get("name"), e.get("case"))
                   for e in r.manifest.engine_runs}
        if ((not variant or any(v[:len(variant)] == variant for v in started))
                and (got := run_host_us(r)) is not None):
            return got
    return None


def adjustments(rs: runs.RunSet) -> list[str]:
    """The harness adjustments of the shown runs, one line each (name: reason), once each."""
    seen = {}
    for r in rs.shown:
        for e in r.manifest.engine_runs:
            for a in e.get("adjustments", []):
                seen.setdefault(a["name"], a["reason"])
    return [f"{k}: {v}" for k, v in seen.items()]


# an engine entry's tool as SGLang names it
TOOL_NAMES = {"bench": "bench_one_batch", "engine": "Engine.generate", "serve": "bench_serving"}


def tools(rs: runs.RunSet) -> list[str]:
    """SGLang's own tools the shown runs timed with."""
    used = [e.get("tool") for r in rs for e in r.manifest.engine_runs]
    return sorted({TOOL_NAMES.get(t, str(t)) for t in used})
