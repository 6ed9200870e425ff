"""The grid_thw tables and figures on the CPU, from synthetic and recorded runs: steps attributed to
marks (a resize that dips inside a step included), runs kept apart, every figure drawn, every GPU
section printing its one line without a run, and "your own setup"."""

import matplotlib


matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from sglab.core import runs  # noqa: E402
from sglab.grid_thw import measure, show  # noqa: E402
from tests.grid_thw.test_measure import synthetic_group  # noqa: E402


def test_mark_deltas_attribute_growth_to_the_right_mark():
    group, samples, ticks = synthetic_group()
    mem, marks = measure.group_tables([group], samples, ticks)
    d = show.mark_deltas(mem, marks, gpu=0)
    r1 = d[d.process == "rank 1"].set_index("mark").delta_mib
    # the dip inside `reduce` does not matter: 520 when it began, 612 when the next step began
    assert r1["unpickle"] == 520.0 and r1["reduce"] == 92.0
    assert r1["first kernel"] == 0.0 and r1["item"] == 0.0


def test_a_mark_before_the_first_memory_reading_starts_from_zero():
    group, samples, ticks = synthetic_group()
    mem, marks = measure.group_tables([group], samples, ticks)
    first = mem.t_s.min()
    early = marks.iloc[:1].assign(t_s=first - 10.0, dur_s=1.0, mark="early")
    d = show.mark_deltas(mem, pd.concat([early, marks]), gpu=0)
    row = d[d.mark == "early"].iloc[0]
    assert row.before_mib == 0.0  # it began before the first reading
    assert row.delta_mib == row.after_mib > 0  # and ends where the next mark begins
    # a process with no reading on this GPU at all: zeros, no error
    ghost = marks.iloc[:2].assign(process="rank 9")
    assert (show.mark_deltas(mem, ghost, gpu=0).delta_mib == 0).all()


def test_step_deltas_are_computed_once_per_run_and_gpu():
    run = _recorded(2)[-1]
    first = show.step_deltas(run)
    first.loc[:, "delta_mib"] = -1.0  # a caller's change stays its own
    again = show.step_deltas(run)
    assert (again.delta_mib != -1.0).any() and "step_deltas 0" in run._memo
    assert again.equals(show.mark_deltas(run.sidecar("memory"), run.sidecar("marks"), gpu=0))


def _recorded(method):
    out = [r for r in runs.load_all_recorded("grid_thw") if r.manifest.method_version == method]
    if not out:
        pytest.skip(f"no method-{method} recorded run")
    return out


def test_mechanism_picture_marks_every_stray_context():
    tp4 = [r for r in runs.load_all_recorded("grid_thw") if int(r.manifest.params["tp_size"]) == 4]
    assert tp4, "the TP-4 run is committed"
    cells = show.cells(tp4[-1].df)
    assert int(cells.stray.sum()) == 9  # 3 ranks × (GPU 0 + 2 other GPUs)
    assert (cells[cells.stray].after == 0).all()
    fig = show.mechanism(runs.RunSet([tp4[-1]]))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("stray context") == 9 and "rank 3" in texts and "GPU 3 (rank 3)" in texts
    shown = show.slide_run(runs.load_all_recorded("grid_thw"))
    assert int(shown.manifest.params["tp_size"]) == 4  # the slide draws the most ranks
    assert show.mechanism(runs.NoRun("grid_thw", "none")).axes[0].texts[0].get_text() == \
        "no run to draw yet"


def test_memory_series_figure_from_a_recorded_run_or_none():
    assert show.memory_series(_recorded(1)[-1]) is None  # predates the time series
    run = _recorded(2)[-1]
    fig = show.memory_series(run, variants=("before", "after", "eager"))
    assert len(fig.axes) == 3
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "rank 1 on GPU 0 (stray)" in labels
    after = fig.axes[1].get_legend().get_texts()
    assert not [t for t in after if "stray" in t.get_text()]  # after: none
    assert "grows by 90 MiB during `reduce`" in show.explain_growth(run)


def test_other_figures_draw_from_recorded_runs():
    recorded = runs.load_all_recorded("grid_thw")
    df = show.frame(recorded)
    assert len(show.heatmaps(recorded[-1]).axes) >= 3
    assert show.waste_figure(df, recorded).axes[0].get_xlabel() == "TP size N"
    cache = show.cache_table(recorded[-1].df)
    assert list(cache.index) == ["before", "after"]
    assert len(show.cache_bars(list(cache.cache_image_hit_rate)).axes[0].patches) == 2


def test_analysis_keeps_runs_apart():
    recorded = runs.load_all_recorded("grid_thw")
    if len(recorded) < 2:
        pytest.skip("needs two recorded runs")
    df = show.frame(recorded)
    assert df.run.nunique() == len(recorded)
    waste = show.waste_vs_tp(df)
    assert len(waste) == sum(len(set(r.df.variant) - {"all"}) for r in recorded)
    for r in recorded:
        reps = int(r.manifest.params["repeats"])
        assert (waste[waste.run == show.run_name(r)].repeats == reps).all()
    left = show.leftovers(df)
    assert (left.processes_alive == 0).all() and (left.nvml_processes_listed == 0).all()


@pytest.mark.parametrize("section",
                         [show.landed, show.repeats, show.waste, show.hygiene, show.profiler])
def test_gpu_sections_print_the_no_run_line(section, capsys):
    assert section(runs.NoRun("grid_thw", "no recorded run")) is None
    assert capsys.readouterr().out.strip() == "no GPU run to show (no recorded run)"


def test_gpu_sections_show_the_recorded_runs(capsys):
    from sglab.grid_thw import claims

    shown = claims.shown(runs.load_all_recorded("grid_thw"))
    if not shown:
        pytest.skip("no recorded grid_thw run")
    run = shown[0]
    run.shown = shown
    for section in (show.landed, show.repeats, show.waste, show.hygiene, show.profiler):
        section(run)
    out = capsys.readouterr().out
    assert "Largest spread within one run: 0 MiB." in out and "cuda:0" in out


def test_your_setup_static_table(monkeypatch):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    table = show.your_setup()
    assert list(table.tp_size) == [8, 4]
    assert {"GPU", "GPU-0 MiB before", "encoded per image (after)"} <= set(table.columns)
    one = show.setup_table(4, 60, 12, 4)
    assert list(one["encoded per request (before)"]) == [143] * len(one)
    assert list(one["encoded per image (after)"]) == [12] * len(one)
    if "H200" in set(one.GPU):
        row = one.set_index("GPU").loc["H200"]
        assert abs(row["GPU-0 MiB before"] - 3 * row["stray MiB per rank ≥ 1"]) <= 2
