"""CPU tests of the tables and figures: the padding model, the alignment table, the mechanism
picture and the heatmaps (the run's tables and the trace picture are exercised on the
gloo run and the recorded H200 run in test_claims.py)."""

from __future__ import annotations

from sglab.capture_sizes import measure as ex
from sglab.capture_sizes import rebuild as cs
from sglab.capture_sizes import show
from sglab.core import runs


DEFAULT_2048 = cs.default_piecewise_capture_sizes(2048)


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_padding():
    w = show.padding_waste([4, 8], 10)
    assert w == {
        "covered": 8, "eager": 2, "pad_tokens": (3 + 2 + 1 + 0) + (3 + 2 + 1 + 0),
        "pad_frac": 12 / 36
    }


def test_alignment_table_exact():
    t = show.alignment_table()
    assert len(t) == 8 * 4 * 2
    r = t[(t.attn_tp == 8) & (t.attn_cp == 1) & (~t.two_batch_overlap)].iloc[0]
    assert (r.n_default, r.n_pr, r.lost_pr, r.n_round_up, r.lost_round_up) == (42, 38, 4, 38, 4)
    r = t[(t.attn_tp == 8) & (t.attn_cp == 1) & (t.two_batch_overlap)].iloc[0]
    assert (r.mul_base_pr, r.mul_base_decode, r.n_pr, r.n_decode_style,
            r.pr_below_decode_base) == (8, 16, 38, 36, 2)
    r = t[(t.attn_tp == 4) & (t.attn_cp == 3) & (~t.two_batch_overlap)].iloc[0]
    assert (r.mul_base_pr, r.lcm, r.tp_x_cp) == (12, 12, 12)
    r = t[(t.attn_tp == 3) & (t.attn_cp == 1) & (~t.two_batch_overlap)].iloc[0]
    assert (r.n_pr, r.n_round_up, r.eager_pr, r.eager_round_up) == (14, 42, 2048 - 1536, 0)
    # the PR's assertion fires only where no default size is a multiple of mul_base (tp 7, cp 3 ->
    # 21)
    asserts = t[t.pr_asserts]
    assert set(zip(asserts.attn_tp, asserts.attn_cp)) == {(7, 3)}
    assert t[(t.attn_tp == 7) & (t.attn_cp == 3)].n_round_up.iloc[0] == 33


def test_mechanism_picture_from_the_rebuild():
    import matplotlib.pyplot as plt

    fig = show.mechanism(8)
    texts = _texts(fig)
    assert texts.count("✗ refused") == 4
    for n in ("4", "12", "20", "28", "32"):
        assert n in texts
    assert sum(t.startswith("→ ") and t.endswith("merged") for t in texts) == 4
    assert texts.count("dropped") == 4 and "34 kept" in texts
    assert any("PR filter keeps 38 of 42 (drops 4, 12, 20, 28)" in t for t in texts)
    plt.close(fig)
    fig = show.mechanism(3)  # non-power-of-two TP: refusals everywhere, rounding up keeps all 42
    texts = _texts(fig)
    assert texts.count("✗ refused") == sum(1 for n in DEFAULT_2048[:12] if n % 3)
    assert any("rounding up gives 42 buckets" in t for t in texts)
    plt.close(fig)
    fig = show.mechanism(2, sizes=ex.raw_sizes(2))  # the scaled list of a 2-GPU run
    assert _texts(fig).count("✗ refused") == 4
    plt.close(fig)


def test_alignment_heatmaps_mark_the_assertion():
    import matplotlib.pyplot as plt

    fig = show.alignment_heatmaps(show.alignment_table(), 2048, 42)
    assert len(fig.axes) == 3
    # PR-filter panels at tp 7, cp 3; round-up never asserts
    assert sum(t == "assert" for t in _texts(fig)) == 2
    plt.close(fig)


def test_the_summary_view_is_blank_where_nothing_failed_or_replayed():
    """The recorded runs' summaries, as the notebook shows them: no NaN or <NA>, the numbers of
    the frame the claims read unchanged."""
    for r in runs.load_all_recorded("capture_sizes"):
        view, full = show.summary_view(r.df), show.summary(r.df)
        assert "error" not in view.columns
        assert not view.isna().any().any(), r.path.name
        text = view.to_string()
        assert "NaN" not in text and "<NA>" not in text
        blank = full["first_failure"].isna()
        assert (view.loc[blank, "first_failure"] == "").all()
        assert list(view.loc[~blank, "first_failure"]) == list(full.loc[~blank, "first_failure"])
        none = full["failed_sizes"].map(len) == 0  # a variant where no size failed
        assert none.any() and (view.loc[none, "failed_sizes"] == "").all() and "[]" not in text


def test_the_profiler_links_the_perfetto_trace_relative_to_the_checkout(capsys):
    """The trace is a link that opens from the notebook or the report on any machine, not this
    machine's absolute path."""
    from sglab.capture_sizes import claims
    from sglab.core import notebook

    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    show.profiler(run)
    out = capsys.readouterr().out
    links = [ln for ln in out.splitlines() if ln.startswith("Perfetto trace of rank 0")]
    assert len(links) == len([r for r in run.shown if r.sidecar("trace") is not None]) > 0
    assert all(ln.split(": ", 1)[1].startswith("data/recorded/capture_sizes/") for ln in links)
    assert str(runs.repo_root()) not in out


def test_first_of_says_how_many_sizes_a_cut_list_has():
    """The notebook's "PR drops" cell: a cut list ends in "…" and its length; a short one is
    whole."""
    dropped = [n for n in DEFAULT_2048 if n % 24]
    assert len(dropped) == 29
    assert show.first_of(dropped) == "4, 8, 12, 16, 20, 28, …, 29 in all"
    assert show.first_of([4, 12, 20, 28]) == "4, 12, 20, 28"
    assert show.first_of(list(range(6))) == "0, 1, 2, 3, 4, 5"
