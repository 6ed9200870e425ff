"""The swa_loc profiler pieces and figures on the CPU: the event reduction, the KV-write ops of each
variant, the tables of a method-2 run's sidecars, and every figure on recorded and synthetic
data."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest

from sglab.core import runs
from sglab.swa_loc import measure, show
from sglab.swa_loc import rebuild as fx


matplotlib.use("Agg")

from tests.swa_loc.test_claims import CAST, GATHER, OTHER, _method2, _sidecars  # noqa: E402


def test_kv_write_ops_per_variant():
    first = {v: show.one_layer_ops(v) for v in fx.VARIANTS}
    assert first["before"] == [
        "index", "_to_copy->int32", "_to_copy->int64", "index_put_", "index_put_"
    ]
    # int64 buffer: torch's index_put_ takes it as it is
    assert first["pr23552"] == ["index_put_", "index_put_"]
    assert first["pr24743"] == ["_to_copy->int64", "index_put_", "index_put_"]
    calls = measure.kv_write_ops("before", num_layers=6, swa_per_full=5)
    assert [c.scope for c in calls].count(measure.SWA_WRITE) == 5 * 5
    assert [c.scope for c in calls].count(measure.FULL_WRITE) == 2


def test_kv_write_scopes_restore_the_pool():
    s = fx.build_setup(num_layers=6, swa_per_full=5, size=16, size_swa=8, head_num=1, head_dim=4)
    steps = measure.eager_steps(s, fx.decode_batch(s, [1, 2], [3, 4]))
    from sglab.core import kernel_table as ops

    with ops.OpRanges() as mode:
        steps["before"](mode)
    assert "set_kv_buffer" not in vars(s.pool)  # the instance patch is gone
    swa = [c for c in mode.calls if c.scope == measure.SWA_WRITE]
    assert len(swa) == 5 * 5 and s.pool.translate_calls >= 5
    with ops.OpRanges() as mode:
        steps["pr24743"](mode)
    assert [c.op for c in mode.calls if c.scope == measure.SWA_WRITE
            ][:3] == ["_to_copy->int64", "index_put_", "index_put_"]


def test_reduce_events_keeps_the_replay_phases():
    ev = pd.DataFrame([
        {
            "lane": "host", "name": "phase::replay before", "category": "range", "start_us": 0,
            "dur_us": 9, "phase": "replay before"
        },
        {
            "lane": "stream 7", "name": "k", "category": "kernel", "start_us": 1, "dur_us": 1,
            "phase": "replay before"
        },
        {
            "lane": "host", "name": "aten::mul", "category": "op", "start_us": 1, "dur_us": 1,
            "phase": "replay before"
        },
        {
            "lane": "stream 7", "name": "warm", "category": "kernel", "start_us": 0, "dur_us": 1,
            "phase": ""
        },
        {
            "lane": "stream 7", "name": "k", "category": "kernel", "start_us": 11, "dur_us": 1,
            "phase": "replay pr24743"
        },
    ])
    out = measure.reduce_events(ev)
    assert list(out.name) == ["phase::replay before", "k", "k"]
    assert list(out.variant) == ["before", "before", "pr24743"]


def test_sidecar_tables(data_root):
    side = _sidecars()
    assert show.translation_kernels(side["graph_kernels"]) == {GATHER: 40, CAST: 40}
    pattern = show.name_pattern([GATHER, CAST])
    assert show.trace_counts(side["events"], pattern) == {
        "before": {"kernels": 315, "matching": 80}, "pr23552": {"kernels": 195, "matching": 0},
        "pr24743": {"kernels": 235, "matching": 0}
    }
    assert show.name_pattern([]) is None
    kw = show.kv_write_kernels(side["eager_kernels"], "before")
    assert list(kw.op) == ["index", "_to_copy->int32"] and list(kw.calls) == [40, 40]
    wide = show.eager_table(side["eager_kernels"])
    assert {"calls · torch.profiler", "calls · nsight-python (CUPTI)"} <= set(wide.columns)
    assert str(wide["calls · torch.profiler"].dtype) == "Int64"  # shown as 10, not 10.0
    assert "10.0" not in wide.round(2)[["calls · torch.profiler"]].to_string()


@pytest.mark.parametrize("name,short", [
    (GATHER, "index_elementwise_kernel · index gather<8B>"),
    (CAST, "unrolled_elementwise_kernel · copy -> int"),
    (OTHER, "vectorized_elementwise_kernel · MulFunctor"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, "
     "long*, int, long, long, long, long, bool)", "vectorized_gather_kernel"),
    ("my_kernel", "my_kernel"),
])
def test_short_kernel(name, short):
    assert show.short_kernel(name) == short


def _texts(fig):
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts) + " " + \
        " ".join(ax.get_title() for ax in fig.axes)


def test_mechanism_without_and_with_kernel_names(data_root):
    fig = show.mechanism()
    text = _texts(fig)
    assert "5 kernel nodes before, 3 with the preset" in text and "2 kernels" in text
    run = _method2(data_root)
    text = _texts(show.mechanism(runs.RunSet([run])))
    assert "index gather<8B>" in text and "copy -> int" in text


def test_replay_timeline_and_the_message_for_old_runs(data_root, capsys):
    old = runs.load_all_recorded("swa_loc") or []
    fig = show.replay_timeline(_method2(data_root))
    assert "48 layers" in fig.axes[0].get_title() and not capsys.readouterr().out
    assert any("translation (gather + int32 cast): 80" in t.get_text() for t in fig.axes[0].texts)
    for r in old:
        assert show.replay_timeline(r) is None
        assert "predates profiler traces" in capsys.readouterr().out


def test_sweep_figures_on_recorded_runs():
    from sglab.core import notebook
    from sglab.swa_loc import claims

    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    assert run, "no recorded swa_loc run"
    fig = show.kernels_per_replay(run)
    assert len(fig.axes) == 2 and all(len(ax.lines) == 3 for ax in fig.axes)
    fig = show.replay_times(run.shown)
    assert len(fig.axes) == 3


def test_every_gpu_section_says_why_it_has_nothing_to_show(capsys):
    none = runs.NoRun("swa_loc", "no recorded swa_loc run yet")
    for section in (show.kernels, show.times, show.padding, show.profiler):
        assert section(none) is None
        assert capsys.readouterr().out.strip() == "no GPU run to show (no recorded swa_loc run yet)"


def test_the_appendix_tables_name_their_run_and_read_whole_counts(capsys):
    """Kernels per replay: the extra kernels per SWA layer read 2 and 1, not 2.0 and 1.0. Replay
    time: the per-cell table names the run it comes from (GPU, date and time), one of several."""
    from sglab.core import engine_records, notebook
    from sglab.swa_loc import claims

    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    assert run, "no recorded swa_loc run"
    show.kernels(run)
    out = capsys.readouterr().out
    table = show.kernel_table(run.first.df)
    assert set(table["+ per SWA layer: before vs #24743"]) == {2.0}  # the data stay numbers
    assert "2.0" not in out and "1.0" not in out
    show.times(run)
    out = capsys.readouterr().out
    label = engine_records.run_label(run.first)
    assert out.splitlines()[0] == f"{label}, every cell:"
    assert label.startswith(run.first.manifest.gpu) and label.endswith("Z")


def test_the_variants_table_shows_a_setting_a_state_lacks_as_a_dash():
    """The "before" has no SWA buffer: its dtype reads "—", not None; the others keep theirs."""
    t = show.variants_table()
    assert list(t.index) == list(fx.VARIANTS)
    assert "—" in set(t.loc["before"]) and None not in set(t.loc["before"])
    assert "—" not in set(t.loc[fx.VARIANTS[-1]])
