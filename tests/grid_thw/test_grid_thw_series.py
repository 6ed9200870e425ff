"""The grid_thw time series on the CPU: samples and marks reduced to sidecars, steps attributed to marks (a resize
that dips inside a step included), the Perfetto file, and every figure drawn from synthetic and recorded tables."""

import gzip
import json

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from sglab.core import runs  # noqa: E402
from sglab.experiments import grid_thw as exp  # noqa: E402
from sglab.experiments.grid_thw import figures, series  # noqa: E402

TOK, R0, R1 = 100, 200, 201


def _group():
    """One synthetic group starting at t = 10 s: rank 1 (pid 201) unpickles at 10.5 s (a 520 MiB context on GPU 0,
    built up over two ticks), then `reduce` at 10.8 s grows it to 612 MiB through a transient dip to 108 MiB."""
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
    group = {"variant": "before", "repeat": 0, "t_start": 10.0, "t_end": 11.45,
             "procs": {TOK: ("tokenizer", -1), R0: ("rank 0", 0), R1: ("rank 1", 1)}, "marks": marks}
    return group, samples, ticks


def test_group_tables_keep_change_points_on_the_group_clock():
    group, samples, ticks = _group()
    mem, marks = series.group_tables([group], samples, ticks)
    assert list(mem.columns) == series.MEMORY_COLUMNS and list(marks.columns) == series.MARK_COLUMNS
    stray = mem[(mem.process == "rank 1") & (mem.gpu == 0)]
    assert list(stray.mib) == [0.0, 104.0, 520.0, 108.0, 612.0, 612.0]
    assert stray.t_s.iloc[0] == 0.0 and stray.t_s.iloc[-1] == pytest.approx(1.45)
    own = mem[(mem.process == "rank 0")]
    assert list(own.mib) == [978.0, 978.0]  # constant: first and last tick only
    assert marks[marks["mark"] == "reduce"].t_s.iloc[0] == pytest.approx(0.8)


def test_steps_and_deltas_attribute_growth_to_the_right_mark():
    group, samples, ticks = _group()
    mem, marks = series.group_tables([group], samples, ticks)
    steps = series.steps(mem, marks)
    s1 = steps[(steps.process == "rank 1") & (steps.gpu == 0)]
    assert list(zip(s1["mark"], s1.from_mib, s1.to_mib)) == [("unpickle", 0.0, 104.0), ("unpickle", 104.0, 520.0),
                                                             ("reduce", 108.0, 612.0)]
    d = series.mark_deltas(mem, marks, gpu=0)
    r1 = d[d.process == "rank 1"].set_index("mark").delta_mib
    # the dip inside `reduce` does not matter: 520 when it began, 612 when the next step began
    assert r1["unpickle"] == 520.0 and r1["reduce"] == 92.0 and r1["first kernel"] == 0.0 and r1["item"] == 0.0


def test_perfetto_file_has_counters_and_slices(tmp_path):
    group, samples, ticks = _group()
    mem, marks = series.group_tables([group], samples, ticks)
    path = series.write_perfetto(mem, marks, tmp_path / "t.json.gz")
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(counters) == len(mem) and len(slices) == len(marks)
    assert {"rank 1 · GPU 0 (MiB)", "tokenizer · GPU 0 (MiB)"} <= {e["name"] for e in counters}
    assert any(e["name"] == "reduce" and e["ts"] == pytest.approx(0.8e6) for e in slices)


def _recorded(method):
    out = [r for r in runs.load_all_recorded("grid_thw") if r.manifest.get("method_version") == method]
    if not out:
        pytest.skip(f"no method-{method} recorded run")
    return out


def test_mechanism_picture_marks_every_stray_context():
    tp4 = [r for r in _recorded(1) if int(r.manifest["params"]["tp_size"]) == 4]
    if not tp4:
        pytest.skip("no TP 4 run")
    cells = exp.cells(tp4[-1].df)
    assert int(cells.stray.sum()) == 9  # 3 ranks × (GPU 0 + 2 other GPUs)
    assert (cells[cells.stray].after == 0).all()
    fig = figures.mechanism(tp4[-1])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("stray context") == 9 and "rank 3" in texts and "GPU 3 (rank 3)" in texts
    shown = figures.slide_run(runs.load_all_recorded("grid_thw"))
    assert int(shown.manifest["params"]["tp_size"]) == 4  # the slide draws the run with the most ranks


def test_memory_series_figure_from_a_recorded_run_or_none():
    assert figures.memory_series(_recorded(1)[-1]) is None  # predates the time series
    run = _recorded(2)[-1]
    fig = figures.memory_series(run, variants=("before", "after", "eager"))
    assert len(fig.axes) == 3
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "rank 1 on GPU 0 (stray)" in labels
    assert not [t for t in fig.axes[1].get_legend().get_texts() if "stray" in t.get_text()]  # after: none


def test_other_figures_draw_from_recorded_runs():
    recorded = runs.load_all_recorded("grid_thw")
    df = exp.frame(recorded)
    assert len(figures.heatmaps(recorded[-1]).axes) >= 3
    assert figures.waste_vs_tp(df, recorded).axes[0].get_xlabel() == "TP size N"
    cache = exp.cache_table(recorded[-1].df)
    assert list(cache.index) == ["before", "after"]
    assert len(figures.cache_bars(cache).axes[0].patches) == 2
