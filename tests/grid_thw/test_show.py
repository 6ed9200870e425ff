"""The grid_thw tables and figures on the CPU, from recorded runs: the engine picture under the
card, the stray contexts of a run, runs kept apart, every GPU section printing its one line without
a run, the lesson's cache answer and "your own setup"."""

import matplotlib


matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from sglab.core import runs  # noqa: E402
from sglab.grid_thw import claims, measure, rebuild, sglang, show  # noqa: E402


def test_the_picture_under_the_card_is_the_engine_that_saw_the_most_gpus():
    """The engine run of TP 4 on four GPUs: every process × every GPU, each rank ≥ 1 red on the
    three GPUs not its own with #22858 reverted and on none as released."""
    engine = sglang.FIX.recorded_engine()
    if not any(show.engine_gpus(r) == 4 for r in engine.shown):
        pytest.skip("no committed four-GPU engine run")
    newest = max((r for r in engine.shown if show.engine_tp(r) == 4),
                 key=lambda r: r.manifest.created_utc)
    cells = show.engine_cells(newest)
    assert len(cells) == 5 * 4  # the main process and four ranks, on four GPUs each
    assert int(cells.stray.sum()) == 9 and set(cells[cells.stray]["rank"]) == {1, 2, 3}
    assert (cells[cells.gpu != cells["rank"]].query("rank >= 0").after == 0).all()
    texts = [t.get_text() for t in show.mechanism(engine).axes[0].texts]
    assert "GPU 3 (rank 3)" in texts and "rank 3" in texts and "main (tokenizer)" in texts
    assert f"9 stray contexts, {cells[cells.stray].before.sum():,.0f} MiB with .cpu() reverted; " \
        "0 as released" in texts
    nothing = show.mechanism(runs.NoRun("engine_grid_thw", "none")).axes[0].texts[0].get_text()
    assert nothing == "no engine run to draw yet"


def test_stray_contexts_count_every_rank_gpu_pair_off_its_own_gpu():
    """The rebuild's TP-4 run on four GPUs: 3 ranks × (GPU 0 and two others) hold memory before the
    fix, none after; a TP-2 run on two GPUs: one, on GPU 0."""
    by_tp = {int(r.manifest.params["tp_size"]): r for r in runs.load_all_recorded("grid_thw")}
    n, mib = show.stray_contexts(by_tp[4].df)
    w = show.waste_vs_tp(by_tp[4].df).set_index("variant")
    off = show.off_rank_gpus(by_tp[4].df).set_index(["variant", "phase"])
    assert n == 9 and mib == w.median_mib["before"] + off.total_mib[("before", "kernel")]
    assert show.stray_contexts(by_tp[4].df, "after") == (0, 0.0)
    two = [r for r in runs.load_all_recorded("grid_thw") if show.visible_gpus(r.df) == 2]
    assert two and show.stray_contexts(two[-1].df)[0] == 1


def test_other_figures_draw_from_recorded_runs():
    recorded = runs.load_all_recorded("grid_thw")
    df = show.frame(recorded)
    assert len(show.heatmaps(recorded[-1]).axes) >= 3
    assert list(show.cache_table(recorded[-1].df).index) == ["before", "after"]


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


@pytest.mark.parametrize("section", [show.landed, show.waste, show.profiler])
def test_gpu_sections_print_the_no_run_line(section, capsys):
    assert section(runs.NoRun("grid_thw", "no recorded run")) is None
    assert capsys.readouterr().out.strip() == "no GPU run to show (no recorded run)"


def test_gpu_sections_show_the_recorded_runs(capsys):
    from sglab.grid_thw import claims

    shown = claims.shown(runs.load_all_recorded("grid_thw"))
    if not shown:
        pytest.skip("no recorded grid_thw run")
    for section in (show.landed, show.waste, show.profiler):
        section(runs.RunSet(shown))
    out = capsys.readouterr().out
    assert "cuda:0" in out and "grows by 90 MiB during `reduce`" in out
    # the Perfetto trace is named relative to the checkout, never by an absolute path
    assert "Perfetto trace of the same (ui.perfetto.dev): data/recorded/grid_thw/" in out
    assert str(runs.repo_root()) not in out


def test_the_cache_answer_says_the_share_of_images_on_both_sides():
    """Images from the cache over images requested, per request and per image: the same
    denominator on both sides (not the items' hit rate, whose denominators differ)."""
    stream = rebuild.request_stream(60, 12, 4, 0)
    stats = {
        v: measure.simulate_cache(stream, fixed=f)
        for v, f in (("before", False), ("after", True))
    }
    t = show.cache_answer(stats)
    assert list(t.index) == ["per request (before)", "per image (after)"]
    for (_, row), s in zip(t.iterrows(), stats.values()):
        assert row["images"] == s.images == len([i for ids in stream for i in ids])
        assert row["images from the cache"] == f"{1 - s.images_encoded / s.images:.1%}"
    assert t["images encoded"].iloc[1] == 12  # per image: each of the pool's images once


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


def test_the_cost_section_shows_the_context_staying_after_release(capsys):
    """Per rank ≥ 1 on GPU 0 at every barrier: the `before` context is still there at `released`
    (only its process's end frees it), `after` holds nothing in any phase."""
    shown = runs.RunSet(claims.shown(runs.load_all_recorded("grid_thw")))
    show.waste(shown)
    released = [
        ln.split()[-len(shown):]
        for ln in capsys.readouterr().out.splitlines() if ln.split()[:1] == ["released"]
    ]  # before, ipc, eager, after
    per = show.gpu0_per_rank(show.frame(shown.shown)).set_index(["variant", "phase"])
    before = per.loc[("before", "released")].sort_values("run").median_mib
    assert released[0] == [f"{v:.0f}" for v in before] and (before > 0).all()
    assert released[-1] == ["0"] * len(shown)


def test_the_engine_table_leaves_a_gpu_the_machine_did_not_have_blank():
    """TP 2 on a two-GPU machine beside TP 4 on four: GPU 2 and 3 of the TP-2 rows are missing (no
    such GPU), not 0 MiB; a GPU that was there and held nothing reads 0."""
    engine = sglang.FIX.recorded_engine()
    newest = runs.newest_by(engine.shown, key=show.engine_tp)
    if not (2 in newest and show.engine_gpus(newest[2]) == 2 and 4 in newest):
        pytest.skip("no committed TP-2 engine run on a two-GPU machine beside a TP-4 run")
    wide = show.engine_table(newest)
    two, four = wide.xs(2, level="TP"), wide.xs(4, level="TP")
    assert two[["GPU 2", "GPU 3"]].isna().all().all()
    assert not two[["GPU 0", "GPU 1"]].isna().any().any() and (two["GPU 1"] == 0).any()
    assert not four.isna().any().any() and (four == 0).any().any()


def test_your_setup_reads_the_per_rank_figure_of_its_tp_size():
    """A recorded TP size reads its own runs' per-rank MiB (what the waste table shows for it); a TP
    size not recorded says it is an estimate and from which TP size."""
    by_gpu = show.stray_mib()
    if not by_gpu:
        pytest.skip("no recorded grid_thw run")
    gpu, by_tp = next(iter(by_gpu.items()))
    for tp, (before, after, n) in by_tp.items():
        row = show.setup_table(tp, 60, 12, 4).set_index("GPU").loc[gpu]
        assert row["stray MiB per rank ≥ 1"] == round(before)
        assert row["GPU-0 MiB before"] == round((tp - 1) * before)
        assert row["per-rank MiB from"].startswith(f"measured at TP {tp} (")
    r4 = [r for r in runs.load_all_recorded("grid_thw") if int(r.manifest.params["tp_size"]) == 4]
    if r4 and 4 in by_tp and by_tp[4][2] == 1:  # one TP-4 run: exactly its waste table's total
        w = show.waste_vs_tp(r4[0].df).set_index("variant")
        row = show.setup_table(4, 60, 12, 4).set_index("GPU").loc[gpu]
        assert row["GPU-0 MiB before"] == w.median_mib["before"]
    top = max(by_tp)
    row = show.setup_table(top * 4, 60, 12, 4).set_index("GPU").loc[gpu]
    assert row["per-rank MiB from"] == f"estimate from TP {top} (no TP {top * 4} run)"
    assert row["stray MiB per rank ≥ 1"] == round(by_tp[top][0])


def test_the_profiler_says_the_rate_asked_and_the_rate_reached():
    shown = [r for r in runs.load_all_recorded("grid_thw") if r.sidecar("memory") is not None]
    if not shown:
        pytest.skip("no recorded run with a memory time series")
    r = shown[-1]
    hz = float(r.df[r.df.metric == "sampler_hz"].value.max())
    asked = float(r.manifest.params["sample_hz"])
    said = show.sampling(r)
    assert f"{asked:.0f} Hz asked, {hz:.0f} Hz reached" in said
    assert said.startswith(show.engine_records.run_label(r))
