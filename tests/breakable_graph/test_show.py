"""The breakable_graph tables and figures on the CPU: the structure of one capture (the slide),
every GPU section on the committed runs and on a NoRun, and "your own setup"."""

from __future__ import annotations

import matplotlib
import pytest

from sglab.breakable_graph import claims, measure, show
from sglab.core import runs


matplotlib.use("Agg")
RECORDED = runs.load_all_recorded("breakable_graph")


@pytest.mark.parametrize("layers", [2, 16])
def test_capture_structure_on_the_cpu(layers):
    before, after = (show.capture_structure(b, layers) for b in ("before", "after"))
    for s in (before, after):
        assert (len(s.segments), len(s.breaks)) == (layers + 1, layers)
        assert all(".self_attn.attn" in b for b in s.breaks)
    assert before.tail_in_graph and not after.tail_in_graph
    labels = [show.segment_label(seg) for seg in after.segments]
    assert labels[0] == "embed | L0 norm·qkv" and labels[-1].endswith("final norm")
    assert show.segment_label(before.segments[-1]).endswith("final norm·logits tail")


def test_mechanism_without_a_run_draws_the_cpu_rebuild():
    fig = show.mechanism(runs.NoRun("breakable_graph", "no run"))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("17 graph segments, 16 eager breaks" in t for t in texts)
    assert any("can_run = False → runs eagerly (replayed anyway: 1 logit row)" in t for t in texts)
    assert any("can_run = True → replays the segments, 3 logit rows" in t for t in texts)


@pytest.mark.skipif(not RECORDED, reason="no recorded breakable_graph run")
def test_every_section_renders_the_committed_runs(capsys):
    run = runs.RunSet(claims.shown(RECORDED))
    texts = [t.get_text() for t in show.mechanism(run.first).axes[0].texts]
    assert any("1 logit row" in t for t in texts) and any("3 logit rows" in t for t in texts)
    for section in (show.correctness, show.latency, show.launches, show.profiler):
        section(run)
    out = capsys.readouterr().out
    assert "after vs eager ×, min" in out and "token_hit_rate" in out
    assert "512 tokens per prefill" in out
    t = show.speedup_table(run.first.df)
    assert t["requests"].tolist() == ["3..8"] * 3
    assert (t["before vs eager ×, min"] > 0.9).all() and (t["before vs eager ×, max"] < 1.1).all()
    assert round(t["after vs eager ×, min"].min(), 2) == 1.21
    seg = show.segment_table(run.first.df)
    assert (seg.xs("graph_segments", axis=1, level="metric") == 17).all().all()


def test_the_reruns_are_read_in_the_methods_notebook():
    assert not hasattr(show, "reruns") and not hasattr(show, "reruns_table")


def test_a_gpu_section_without_a_run_prints_its_line(capsys):
    show.latency(runs.NoRun("breakable_graph", "test"))
    assert capsys.readouterr().out.strip() == "no GPU run to show (test)"


def test_your_setup_is_the_hit_rate_of_your_traffic(monkeypatch):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    t = show.your_setup()
    assert len(t) == 6 and set(t.runner) == {"before", "after"}
    default = t[(t.p_single == 0.35) & (t.max_requests == 8)].set_index("runner")
    want = show.hit_table(measure.hit_rate_rows())
    assert default.loc["before", "hit_rate"] == want.loc["before", "hit_rate"]
    assert default.loc["after", "graph_batches"] == want.loc["after", "graph_batches"]
    assert (t.groupby(["p_single",
                       "max_requests"]).hit_rate.apply(lambda s: s.iloc[0] != s.iloc[1])).all()


def test_the_gpu_tables_read_as_yes_no_and_counts_with_no_nan(capsys):
    """Part a's table says yes/no for can_run and counts logit rows (eager has no can_run: blank);
    the hit-rate table counts batches; none prints 1.0, 3.0 or NaN."""
    shown = claims.shown(RECORDED)
    if not shown:
        pytest.skip("no recorded breakable_graph run")
    run = runs.RunSet([shown[-1]])
    view = show.bs3_view(run.first.df)
    assert list(view["can_run"]) == ["yes", "no", ""]  # after, before, eager
    assert str(view["logit_rows"].dtype) == "Int64"
    show.correctness(run)
    show.latency(run)
    out = capsys.readouterr().out
    assert "NaN" not in out.split("num_tokens")[0]
    hits = next(ln for ln in out.splitlines() if ln.startswith("after ") and "0.9" in ln)
    assert hits.split()[-2:] == [str(int(float(v))) for v in hits.split()[-2:]]
