"""The memory time series: NVML samples and the processes' marks reduced to small sidecars, the steps in each
process's memory attributed to the mark that caused them, and a Perfetto file of both.

This is the notebook's profiler picture. A torch.profiler trace would show the unpickling and the kernels, but not
the thing that matters here — memory a process holds on a GPU that is not its own — so the picture is NVML's
per-process memory over time, with the moments each process marked (``unpickle``, ``first kernel``, ``reduce``,
``item``, ``copy to own GPU``, ...; the tokenizer's ``preprocess`` includes ``grid_thws.cpu()`` in ``after``).

Sidecars (times in seconds from the group's start, per variant × repeat):

- ``memory``: ``variant, repeat, process, rank, gpu, t_s, mib`` — the change points of each (process, GPU) series
  (:func:`sglab.core.memory.step_series`): drawn as steps, exactly the sampled series;
- ``marks``: ``variant, repeat, process, rank, mark, t_s, dur_s``;
- ``trace``: both as a Chrome/Perfetto JSON (counter tracks per process and GPU, slices for the marks).
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pandas as pd

from sglab.core import memory
from sglab.experiments.grid_thw.ranks import _row

MEMORY_COLUMNS = ["variant", "repeat", "process", "rank", "gpu", "t_s", "mib"]
MARK_COLUMNS = ["variant", "repeat", "process", "rank", "mark", "t_s", "dur_s"]
STEP_COLUMNS = ["variant", "repeat", "process", "rank", "gpu", "t_s", "from_mib", "to_mib", "mark", "after_end_s"]
DELTA_COLUMNS = ["variant", "repeat", "process", "rank", "gpu", "mark", "before_mib", "after_mib", "delta_mib"]


def sampler_rows(sampler: memory.Sampler, tp_size: int) -> list[dict]:
    kw = {"tp_size": tp_size, "process": "sampler", "phase": "series"}
    return [_row("all", "sampler_hz", sampler.achieved_hz(), "Hz", **kw),
            _row("all", "sampler_ticks", len(sampler.ticks), "count", **kw),
            _row("all", "sampler_errors", sampler.errors, "count", **kw)]


def group_tables(groups: list[dict], samples: pd.DataFrame, ticks: list[float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``memory`` and ``marks`` tables of every group, each on its own time axis (0 = the group's start)."""
    mem, marks = [], []
    for g in groups:
        t0 = g["t_start"]
        window = [t for t in ticks if t0 <= t <= g["t_end"]]
        steps = memory.step_series(samples, window, pids=list(g["procs"]))
        for s in steps.itertuples():
            process, rank = g["procs"][s.pid]
            mem.append((g["variant"], g["repeat"], process, rank, s.gpu, round(s.t - t0, 4), s.used_mib))
        for process, rank, name, a, b in g["marks"]:
            marks.append((g["variant"], g["repeat"], process, rank, name, round(a - t0, 4), round(b - a, 4)))
    return pd.DataFrame(mem, columns=MEMORY_COLUMNS), pd.DataFrame(marks, columns=MARK_COLUMNS)


def sidecars(groups: list[dict], samples: pd.DataFrame, ticks: list[float]) -> dict:
    mem, marks = group_tables(groups, samples, ticks)
    trace = Path(tempfile.mkdtemp(prefix="sglab-grid-trace-")) / "grid_thw.trace.json.gz"
    write_perfetto(mem, marks, trace)
    return {"memory": mem, "marks": marks, "trace": trace}


def steps(mem: pd.DataFrame, marks: pd.DataFrame) -> pd.DataFrame:
    """Every increase in a process's memory on a GPU, with the mark of that process that started last before it.

    ``after_end_s``: how long after that mark ended the increase was first sampled (<= 0: inside the mark). Marks are
    separated by pauses longer than NVML's lag, so the latest mark begun before a step is the step's cause.
    """
    out = []
    for (variant, repeat, process, gpu), g in mem.groupby(["variant", "repeat", "process", "gpu"], sort=False):
        g = g.sort_values("t_s")
        mine = marks[(marks.variant == variant) & (marks.repeat == repeat) & (marks.process == process)]
        prev = None
        for r in g.itertuples():
            if prev is not None and r.mib > prev:
                begun = mine[mine.t_s <= r.t_s].sort_values("t_s")
                name, after = ("", float("nan")) if begun.empty else (
                    begun.iloc[-1]["mark"], r.t_s - begun.iloc[-1].t_s - begun.iloc[-1].dur_s)
                out.append((variant, repeat, process, int(r.rank), int(gpu), r.t_s, prev, r.mib, name,
                            round(after, 4)))
            prev = r.mib
    return pd.DataFrame(out, columns=STEP_COLUMNS)


def write_perfetto(mem: pd.DataFrame, marks: pd.DataFrame, path: str | Path) -> Path:
    """Chrome trace JSON (opens in https://ui.perfetto.dev): one trace process per group, one counter track per
    (process, GPU) in MiB, one thread per process with its marks as slices."""
    events = []
    keys = sorted(set(map(tuple, mem[["variant", "repeat"]].values.tolist()))
                  | set(map(tuple, marks[["variant", "repeat"]].values.tolist())), key=str)
    gid = {k: i + 1 for i, k in enumerate(keys)}
    tid: dict = {}
    for (variant, repeat), i in gid.items():
        events.append({"name": "process_name", "ph": "M", "pid": i, "args": {"name": f"{variant} · repeat {repeat}"}})
    for r in marks.itertuples():
        k = (r.variant, r.repeat)
        t = tid.setdefault((k, r.process), len(tid) + 1)
        events.append({"name": "thread_name", "ph": "M", "pid": gid[k], "tid": t, "args": {"name": r.process}})
        events.append({"name": r.mark, "ph": "X", "pid": gid[k], "tid": t, "ts": r.t_s * 1e6,
                       "dur": max(r.dur_s * 1e6, 1.0)})
    for r in mem.itertuples():
        events.append({"name": f"{r.process} · GPU {r.gpu} (MiB)", "ph": "C", "pid": gid[(r.variant, r.repeat)],
                       "ts": r.t_s * 1e6, "args": {"MiB": r.mib}})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path


def _value_at(series: pd.DataFrame, t: float) -> float:
    """The step series' value at ``t`` (0 before its first point)."""
    before = series[series.t_s <= t]
    return float(before.mib.iloc[-1]) if len(before) else 0.0


def mark_deltas(mem: pd.DataFrame, marks: pd.DataFrame, *, gpu: int = 0) -> pd.DataFrame:
    """For every mark of every process: its memory on ``gpu`` when the mark began and when the process's next mark
    began (the pause after the last one for the last), and the difference — what each step added, robust to NVML's
    transient readings inside a step (a resize frees, then allocates)."""
    out = []
    for (variant, repeat, process), ms in marks.groupby(["variant", "repeat", "process"], sort=False):
        ms = ms.sort_values("t_s")
        s = mem[(mem.variant == variant) & (mem.repeat == repeat) & (mem.process == process) & (mem.gpu == gpu)]
        s = s.sort_values("t_s")
        ends = list(ms.t_s.iloc[1:]) + [float(ms.t_s.iloc[-1] + ms.dur_s.iloc[-1]) + 0.05]
        for r, end in zip(ms.itertuples(), ends):
            a, b = _value_at(s, r.t_s), _value_at(s, end)
            out.append((variant, repeat, process, int(r.rank), gpu, r.mark, a, b, b - a))
    return pd.DataFrame(out, columns=DELTA_COLUMNS)
