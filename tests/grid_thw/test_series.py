"""The memory time series of a grid_thw run on the CPU: samples and marks reduced to sidecars on the
group's clock, the Perfetto file, each step's memory attributed to its mark (a resize that dips
inside a step included), and the profiler picture of a recorded run."""

import gzip
import json

import matplotlib
import pandas as pd
import pytest

from sglab.core import runs
from sglab.grid_thw import series


matplotlib.use("Agg")

# --- the time series: samples and marks reduced to sidecars, and the Perfetto file ---
TOK, R0, R1 = 100, 200, 201


def synthetic_group():
    """One group starting at t = 10 s: rank 1 (pid 201) unpickles at 10.5 s (a 520 MiB context on
    GPU 0, built up over two ticks), then `reduce` at 10.8 s grows it to 612 MiB through a
    transient dip to 108 MiB."""
    ticks = [10.0 + 0.05 * i for i in range(30)]  # 10.00 .. 11.45
    rows = []
    for t in ticks:
        rows += [(t, TOK, 0, 612.0), (t, R0, 0, 978.0), (t, R1, 1, 978.0)]
        if t >= 10.55:
            v = 104.0 if t < 10.6 else 520.0
            if t >= 10.85:
                v = 108.0 if t < 10.9 else 612.0
            rows.append((t, R1, 0, v))
    samples = pd.DataFrame(rows, columns=["t", "pid", "gpu", "used_mib"])
    marks = [("tokenizer", -1, "preprocess", 10.1, 10.2), ("rank 1", 1, "own context", 10.3, 10.32),
             ("rank 1", 1, "unpickle", 10.5, 10.61), ("rank 1", 1, "first kernel", 10.7, 10.71),
             ("rank 1", 1, "reduce", 10.8, 10.86), ("rank 1", 1, "item", 11.0, 11.01),
             ("rank 1", 1, "release", 11.2, 11.25)]
    group = {
        "variant": "before", "repeat": 0, "t_start": 10.0, "t_end": 11.45,
        "procs": {TOK: ("tokenizer", -1), R0: ("rank 0", 0), R1: ("rank 1", 1)}, "marks": marks
    }
    return group, samples, ticks


def test_group_tables_keep_change_points_on_the_group_clock():
    group, samples, ticks = synthetic_group()
    mem, marks = series.group_tables([group], samples, ticks)
    assert list(mem.columns) == series.MEMORY_COLUMNS
    assert list(marks.columns) == series.MARK_COLUMNS
    stray = mem[(mem.process == "rank 1") & (mem.gpu == 0)]
    assert list(stray.mib) == [0.0, 104.0, 520.0, 108.0, 612.0, 612.0]
    assert stray.t_s.iloc[0] == 0.0 and stray.t_s.iloc[-1] == pytest.approx(1.45)
    own = mem[(mem.process == "rank 0")]
    assert list(own.mib) == [978.0, 978.0]  # constant: first and last tick only
    assert marks[marks["mark"] == "reduce"].t_s.iloc[0] == pytest.approx(0.8)


def test_perfetto_file_has_counters_and_slices(tmp_path):
    group, samples, ticks = synthetic_group()
    mem, marks = series.group_tables([group], samples, ticks)
    path = series.write_perfetto(mem, marks, tmp_path / "t.json.gz")
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(counters) == len(mem) and len(slices) == len(marks)
    assert {"rank 1 · GPU 0 (MiB)", "tokenizer · GPU 0 (MiB)"} <= {e["name"] for e in counters}
    assert any(e["name"] == "reduce" and e["ts"] == pytest.approx(0.8e6) for e in slices)


def test_mark_deltas_attribute_growth_to_the_right_mark():
    group, samples, ticks = synthetic_group()
    mem, marks = series.group_tables([group], samples, ticks)
    d = series.mark_deltas(mem, marks, gpu=0)
    r1 = d[d.process == "rank 1"].set_index("mark").delta_mib
    # the dip inside `reduce` does not matter: 520 when it began, 612 when the next step began
    assert r1["unpickle"] == 520.0 and r1["reduce"] == 92.0
    assert r1["first kernel"] == 0.0 and r1["item"] == 0.0


def test_a_mark_before_the_first_memory_reading_starts_from_zero():
    group, samples, ticks = synthetic_group()
    mem, marks = series.group_tables([group], samples, ticks)
    first = mem.t_s.min()
    early = marks.iloc[:1].assign(t_s=first - 10.0, dur_s=1.0, mark="early")
    d = series.mark_deltas(mem, pd.concat([early, marks]), gpu=0)
    row = d[d.mark == "early"].iloc[0]
    assert row.before_mib == 0.0  # it began before the first reading
    assert row.delta_mib == row.after_mib > 0  # and ends where the next mark begins
    # a process with no reading on this GPU at all: zeros, no error
    ghost = marks.iloc[:2].assign(process="rank 9")
    assert (series.mark_deltas(mem, ghost, gpu=0).delta_mib == 0).all()


def test_step_deltas_are_computed_once_per_run_and_gpu():
    run = _recorded(2)[-1]
    first = series.step_deltas(run)
    first.loc[:, "delta_mib"] = -1.0  # a caller's change stays its own
    again = series.step_deltas(run)
    assert (again.delta_mib != -1.0).any() and "step_deltas 0" in run._memo
    assert again.equals(series.mark_deltas(run.sidecar("memory"), run.sidecar("marks"), gpu=0))


def _recorded(method):
    out = [r for r in runs.load_all_recorded("grid_thw") if r.manifest.method_version == method]
    if not out:
        pytest.skip(f"no method-{method} recorded run")
    return out


def test_memory_series_figure_from_a_recorded_run_or_none():
    assert series.memory_series(_recorded(1)[-1]) is None  # predates the time series
    run = _recorded(2)[-1]
    fig = series.memory_series(run, variants=("before", "after", "eager"))
    assert len(fig.axes) == 3
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "rank 1 on GPU 0 (stray)" in labels
    after = fig.axes[1].get_legend().get_texts()
    assert not [t for t in after if "stray" in t.get_text()]  # after: none
    assert "grows by 90 MiB during `reduce`" in series.explain_growth(run)
