"""CPU tests of the rebuild, the experiment's tables, the traced-pass reduction and the figures (the gloo run,
the claims and the headline are in test_capture_sizes_claims.py)."""

from __future__ import annotations

import math

import pytest

from sglab.sglang import checks

from sglab.fixes import capture_sizes as cs

DEFAULT_2048 = [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
                288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536, 1792,
                2048]


def test_default_sizes_pr_era():
    assert cs.default_piecewise_capture_sizes(2048) == DEFAULT_2048
    big = cs.default_piecewise_capture_sizes(8192)
    assert big[len(DEFAULT_2048):] == [2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096, 4608, 5120, 5632, 6144,
                                       6656, 7168, 7680, 8192]
    assert cs.default_piecewise_max_tokens(8192, use_mla_backend=True) == 2048
    assert cs.default_piecewise_max_tokens(8192, use_mla_backend=False) == 8192


def test_require_gathered_buffer():
    # the crash report: --tp 8 --moe-dense-tp-size 1, no DP attention
    a = cs.ParallelArgs(tp_size=8, moe_dense_tp_size=1)
    assert cs.require_attn_tp_gather(a) and cs.require_gathered_buffer(a)
    assert cs.attention_tp_size(a) == 8
    # plain TP: no scatter
    assert not cs.require_gathered_buffer(cs.ParallelArgs(tp_size=8))
    # DP attention with dp == tp: attention is not scattered, but the MLP input is gathered
    b = cs.ParallelArgs(tp_size=8, dp_size=8, enable_dp_attention=True, moe_dense_tp_size=1)
    assert not cs.require_attn_tp_gather(b)
    assert cs.require_mlp_tp_gather(b)
    assert cs.attention_tp_size(b) == 1
    c = cs.ParallelArgs(tp_size=8, dp_size=2, enable_dp_attention=True, moe_dense_tp_size=1)
    assert cs.require_attn_tp_gather(c) and cs.attention_tp_size(c) == 4
    # attention CP divides the TP group
    assert cs.attention_tp_size(cs.ParallelArgs(tp_size=8, attn_cp_size=2, moe_dense_tp_size=1)) == 4


def test_tp8_drops_4_12_20_28():
    kept = cs.filter_piecewise_capture_sizes(DEFAULT_2048, 8)
    assert [s for s in DEFAULT_2048 if s not in kept] == [4, 12, 20, 28]
    assert len(kept) == 38
    # before the PR (no gathered buffer): nothing filtered
    assert cs.filter_piecewise_capture_sizes(DEFAULT_2048, 8, gathered=False) == DEFAULT_2048
    # the unequal shards the boundary would see at 12 tokens on 8 ranks
    assert cs.shard_sizes(12, 8) == [2, 2, 2, 2, 1, 1, 1, 1]
    assert cs.shard_sizes(28, 8) == [4, 4, 4, 4, 3, 3, 3, 3]
    for n in (4, 12, 20, 28):
        with pytest.raises(cs.UnequalShards, match=r"shards \["):
            cs.check_equal_shards(n, 8)
    cs.check_equal_shards(8, 8)


def test_small_tp_keeps_everything():
    for tp in (1, 2, 4):
        assert cs.filter_piecewise_capture_sizes(DEFAULT_2048, tp) == DEFAULT_2048


def test_mul_base_vs_lcm_vs_product():
    assert (cs.piecewise_mul_base(4, 6), cs.lcm_base(4, 6), cs.comment_base(4, 6)) == (24, 12, 24)
    # comment says tp*cp; code keeps multiples of 4 when cp divides tp
    assert (cs.piecewise_mul_base(4, 2), cs.lcm_base(4, 2), cs.comment_base(4, 2)) == (4, 4, 8)
    assert (cs.piecewise_mul_base(2, 4), cs.lcm_base(2, 4), cs.comment_base(2, 4)) == (8, 4, 8)
    assert (cs.piecewise_mul_base(6, 4), cs.lcm_base(6, 4), cs.comment_base(6, 4)) == (24, 12, 24)
    for tp in range(1, 9):
        for cp in range(1, 7):
            m = cs.piecewise_mul_base(tp, cp)
            assert m % tp == 0 and m % cp == 0  # always a common multiple
            assert m % cs.lcm_base(tp, cp) == 0
            assert (m == cs.lcm_base(tp, cp)) == (tp % cp == 0 or math.gcd(tp, cp) == 1)


def test_decode_variant_two_batch_overlap():
    assert cs.decode_mul_base(8, 1) == 8
    assert cs.decode_mul_base(8, 1, two_batch_overlap=True) == 16
    assert cs.decode_mul_base(4, 2, two_batch_overlap=True) == 8
    assert cs.decode_mul_base(3, 2, two_batch_overlap=True) == 6  # 2*3 = 6 is divisible by cp 2
    assert cs.decode_mul_base(4, 1, gathered=False) == 1
    bs = [1, 2, 4, 8, 12, 16, 24, 32]
    assert cs.filter_decode_batch_sizes(bs, 4) == [4, 8, 12, 16, 24, 32]
    assert cs.filter_decode_batch_sizes(bs, 4, two_batch_overlap=True) == [8, 16, 24, 32]
    # num_max_requests 10 is padded to 12 and added
    assert cs.filter_decode_batch_sizes(bs, 4, num_max_requests=10) == [4, 8, 12]
    # the piecewise filter ignores two-batch overlap: 8 at tp 8 survives there but not in decode with TBO
    assert 8 in cs.filter_piecewise_capture_sizes(DEFAULT_2048, 8)
    assert 8 not in cs.filter_decode_batch_sizes(DEFAULT_2048, 8, two_batch_overlap=True)


def test_no_sizes_left_asserts():
    with pytest.raises(cs.NoCaptureSizes, match="multiples of 24"):
        cs.filter_piecewise_capture_sizes([4, 8, 16], 4, 6)


def test_round_up_today():
    assert cs.round_up_capture_sizes(DEFAULT_2048, 8) == cs.filter_piecewise_capture_sizes(DEFAULT_2048, 8)
    r3 = cs.round_up_capture_sizes(DEFAULT_2048, 3)
    assert r3[:8] == [6, 9, 12, 18, 21, 24, 30, 33]
    assert len(r3) == 42 and r3[-1] == 2049
    assert len(cs.filter_piecewise_capture_sizes(DEFAULT_2048, 3)) == 14
    assert cs.ceil_align(2048, 7) == 2051


# ---------------------------------------------------------------------------------------------------------------
# experiment module: tables, merge, the boundary on two gloo ranks
# ---------------------------------------------------------------------------------------------------------------
from sglab.sglang import upstream  # noqa: E402
from sglab.tools.fixes import NAMES, get
from sglab.experiments import capture_sizes as ex  # noqa: E402


def test_pick_bucket_and_padding():
    assert cs.pick_bucket(13, DEFAULT_2048) == 16
    assert cs.pick_bucket(2049, DEFAULT_2048) is None
    w = ex.padding_waste([4, 8], 10)
    assert w == {"covered": 8, "eager": 2, "pad_tokens": (3 + 2 + 1 + 0) + (3 + 2 + 1 + 0),
                 "pad_frac": 12 / 36}


def test_scaled_default_sizes():
    s4 = ex.scaled_default_sizes(4)
    assert [n for n in s4 if n % 4] == [2, 6, 10, 14]
    assert len(s4) == 42
    s2 = ex.scaled_default_sizes(2)
    assert [n for n in s2 if n % 2] == [1, 3, 5, 7]
    assert ex.scaled_default_sizes(8) == DEFAULT_2048


def test_size_lists_break_the_same_sizes():
    l4 = ex.size_lists(4)
    assert [n for n in l4["before"] if n % 4] == [2, 6, 10, 14]
    assert l4["pr_filter"] == [n for n in l4["before"] if n % 4 == 0] and len(l4["pr_filter"]) == 38
    assert l4["round_up"] == l4["pr_filter"]  # power-of-two alignment: rounding merges into existing buckets
    l2 = ex.size_lists(2)
    assert [n for n in l2["before"] if n % 2] == [1, 3, 5, 7]
    # the unscaled default list has no bad size at 2 or 4 ranks
    assert all(n % 4 == 0 for n in ex.size_lists(4, "default")["before"])
    # 3 ranks: the default list itself breaks
    assert len(ex.size_lists(3)["pr_filter"]) == 14


def test_replay_token_counts():
    assert ex.replay_token_counts([4, 8, 16]) == {4: [1, 3, 4], 8: [5, 7, 8], 16: [9, 15, 16]}
    assert ex.replay_token_counts([1, 2]) == {1: [1], 2: [2]}


def test_alignment_table_exact():
    t = ex.alignment_table()
    assert len(t) == 8 * 4 * 2
    r = t[(t.attn_tp == 8) & (t.attn_cp == 1) & (~t.two_batch_overlap)].iloc[0]
    assert (r.n_default, r.n_pr, r.lost_pr, r.n_round_up, r.lost_round_up) == (42, 38, 4, 38, 4)
    r = t[(t.attn_tp == 8) & (t.attn_cp == 1) & (t.two_batch_overlap)].iloc[0]
    assert (r.mul_base_pr, r.mul_base_decode, r.n_pr, r.n_decode_style, r.pr_below_decode_base) == (8, 16, 38, 36, 2)
    r = t[(t.attn_tp == 4) & (t.attn_cp == 3) & (~t.two_batch_overlap)].iloc[0]
    assert (r.mul_base_pr, r.lcm, r.tp_x_cp) == (12, 12, 12)
    r = t[(t.attn_tp == 3) & (t.attn_cp == 1) & (~t.two_batch_overlap)].iloc[0]
    assert (r.n_pr, r.n_round_up, r.eager_pr, r.eager_round_up) == (14, 42, 2048 - 1536, 0)
    # the PR's assertion fires only where no default size is a multiple of mul_base (tp 7, cp 3 -> 21)
    asserts = t[t.pr_asserts]
    assert set(zip(asserts.attn_tp, asserts.attn_cp)) == {(7, 3)}
    assert t[(t.attn_tp == 7) & (t.attn_cp == 3)].n_round_up.iloc[0] == 33


def test_review_table():
    r = ex.review_table().set_index("finding")
    assert (r.loc["comment vs code", "comment (tp*cp)"], r.loc["comment vs code", "code mul_base"]) == (8, 4)
    assert (r.loc["common multiple, not least", "code mul_base"], r.loc["common multiple, not least", "lcm"]) == (24, 12)
    assert r.loc["common multiple, not least", "sizes kept by code"] == 13  # multiples of 24 in the default list
    assert "16 under TBO" in r.loc["two-batch overlap not folded in", "what it means"]
    assert "keeps 14 of 42" in r.loc["drop vs round up", "what it means"]


def test_merge_requires_agreement():
    a = [{"variant": "v", "world_size": 2, "size": 4, "metric": "replay_max_abs_err", "value": 0.5, "unit": "abs"}]
    b = [{"variant": "v", "world_size": 2, "size": 4, "metric": "replay_max_abs_err", "value": 1.0, "unit": "abs"}]
    assert ex._merge([a, b])[0]["value"] == 1.0
    c = [{"variant": "v", "world_size": 2, "size": 4, "metric": "captured", "value": 1.0, "unit": ""}]
    d = [{"variant": "v", "world_size": 2, "size": 4, "metric": "captured", "value": 0.0, "unit": ""}]
    with pytest.raises(RuntimeError, match="disagree"):
        ex._merge([c, d])
    with pytest.raises(RuntimeError, match="fewer"):
        ex._merge([c, []])


def test_probe_precondition():
    for w in (2, 3, 4, 8):
        for n in range(1, 100):
            assert ex._probe_is_safe(n, w)


def test_upstream_check_verdicts():
    before = ("class PiecewiseCudaGraphRunner:\n    def __init__(self, r):\n"
              "        self.capture_num_tokens = self.compile_config.get_capture_sizes()\n")
    pr = before + "        self.capture_num_tokens = [n for n in self.capture_num_tokens if n % mul_base == 0]\n"
    assert checks.capture_sizes({"srt/model_executor/piecewise_cuda_graph_runner.py": pr}.get).status == "pr-era"
    assert checks.capture_sizes({"srt/model_executor/piecewise_cuda_graph_runner.py": before}.get).status == "before"
    assert checks.capture_sizes({}.get).status == "absent"
    assert "capture_sizes" in NAMES


def test_upstream_check_recognises_todays_round_up(tmp_path):
    """The layout of SGLang 0.5.14+: one prefill runner; 0.5.22+ rounds each size up to the alignment."""
    from sglab.sglang import upstream

    runner = tmp_path / "srt" / "model_executor" / "runner"
    runner.mkdir(parents=True)
    (tmp_path / "srt" / "utils").mkdir()
    (runner / "prefill_cuda_graph_runner.py").write_text(
        "def get_prefill_num_tokens_to_capture(capture_tokens):\n"
        "    return sorted({get_cuda_graph_max_batch_size(n) for n in capture_tokens})\n\n"
        "class PrefillCudaGraphRunner:\n    def __init__(self, r):\n"
        "        self.capture_num_tokens = get_prefill_num_tokens_to_capture(r.sizes)\n")
    (tmp_path / "srt" / "utils" / "common.py").write_text(
        "def get_cuda_graph_max_batch_size(n):\n    return ceil_align(n, get_cuda_graph_batch_size_alignment())\n")
    assert upstream.check(get("capture_sizes"), root=tmp_path).status == "changed"
    (tmp_path / "srt" / "utils" / "common.py").write_text("def get_cuda_graph_max_batch_size(n):\n    return n\n")
    assert upstream.check(get("capture_sizes"), root=tmp_path).status == "regressed"
def test_policy_lists_and_size_table():
    d = cs.default_piecewise_capture_sizes(2048)
    p = ex.policy_lists(d, 8)
    assert p["before"] == d and [n for n in d if n not in p["pr_filter"]] == [4, 12, 20, 28]
    assert p["round_up"] == p["pr_filter"]
    assert ex.policy_lists([4, 8, 16], 4, 6)["pr_filter"] == []  # where the PR's assertion fires
    t = ex.size_table(8).set_index("size")
    assert list(t.index[~t.equal_shards]) == [4, 12, 20, 28]
    assert t.loc[12, "shards"] == [2, 2, 2, 2, 1, 1, 1, 1] and t.loc[12, "rounded_up_to"] == 16
    assert not t.loc[12, "kept_by_pr"] and t.loc[16, "kept_by_pr"]
    # any list can be laid out, e.g. a release's own sizes, with attention CP folded into the base
    t = ex.size_table(4, sizes=[6, 12, 24], attn_cp=6).set_index("size")
    assert list(t.rounded_up_to) == [24, 24, 24] and list(t.kept_by_pr) == [False, False, True]


def test_rule_table_and_alignment_summary():
    r = ex.rule_table(DEFAULT_2048).set_index(["attn_tp", "attn_cp", "two_batch_overlap"])
    assert r.loc[(8, 1, False), "PR drops"] == [4, 12, 20, 28]
    assert (r.loc[(8, 1, True), "decode mul_base"], r.loc[(8, 1, True), "decode rule keeps"]) == (16, 36)
    assert (r.loc[(4, 6, False), "PR mul_base"], r.loc[(4, 6, False), "PR keeps"]) == (24, 13)
    text = ex.alignment_summary(ex.alignment_table())
    assert "asserts in 1 pair(s)" in text and "over 32 (attn_tp, attn_cp) pairs" in text


def _events(rows):
    import pandas as pd

    from sglab.core import trace

    return pd.DataFrame([dict(zip(trace.COLUMNS, r)) for r in rows], columns=trace.COLUMNS)


def test_reduce_events_tags_variants_and_keeps_what_the_picture_needs():
    from sglab.experiments.capture_sizes import profile

    ev = _events([
        ("host", "phase::before", "range", 0.0, 100.0, "before"),
        ("host", "phase::capture 4", "range", 1.0, 40.0, "capture 4"),
        ("host", "c10d::_reduce_scatter_base_", "op", 2.0, 1.0, "capture 4"),
        ("host", "aten::mul", "op", 3.0, 1.0, "capture 4"),
        ("host", "c10d::monitored_barrier_", "op", 4.0, 1.0, "capture 4"),
        ("runtime", "cudaLaunchKernel", "runtime", 5.0, 1.0, "capture 4"),
        ("runtime", "cudaStreamBeginCapture", "runtime", 6.0, 1.0, "capture 4"),
        ("stream 7", "ncclDevKernel_ReduceScatter", "kernel", 7.0, 2.0, "capture 4"),
        ("stream 7", "phase::capture 4", "range", 7.0, 2.0, "capture 4"),
        ("host", "phase::capture 3", "range", 50.0, 5.0, "capture 3"),
        ("host", "phase::refused 3", "range", 51.0, 0.5, "refused 3"),
        ("host", "phase::after", "range", 200.0, 50.0, "after"),
        ("host", "phase::capture 4", "range", 210.0, 20.0, "capture 4"),
        ("host", "c10d::_allgather_base_", "op", 215.0, 1.0, "capture 4"),
    ])
    out = profile.reduce_events(ev, rank=1)
    assert list(out.columns) == profile.EVENT_COLUMNS and set(out["rank"]) == {1}
    assert "aten::mul" not in set(out.name) and "cudaLaunchKernel" not in set(out.name)
    assert "c10d::monitored_barrier_" not in set(out.name)
    assert not out.name.isin(["phase::before", "phase::after"]).any()
    before, after = out[out.variant == "before"], out[out.variant == "after"]
    assert len(before) == 7 and len(after) == 2
    assert after.start_us.min() == 10.0  # re-zeroed to the variant's start
    cr = ex.capture_ranges(out)
    b = cr[cr.variant == "before"].set_index("size")
    assert bool(b.loc[3, "refused"]) and not bool(b.loc[4, "refused"])
    assert (b.loc[4, "reduce_scatters"], b.loc[4, "nccl_kernels"], b.loc[3, "kernels"]) == (1, 1, 0)
    assert cr[cr.variant == "after"].all_gathers.tolist() == [1]
    assert profile.reduce_events(ev[ev.name != "phase::before"].iloc[:3], rank=0).empty


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_mechanism_picture_from_the_rebuild():
    import matplotlib.pyplot as plt

    from sglab.experiments.capture_sizes import figures

    fig = figures.mechanism(8)
    texts = _texts(fig)
    assert texts.count("✗ refused") == 4
    for n in ("4", "12", "20", "28", "32"):
        assert n in texts
    assert sum(t.startswith("→ ") and t.endswith("merged") for t in texts) == 4
    assert texts.count("dropped") == 4 and "34 kept" in texts
    assert any("PR filter keeps 38 of 42 (drops 4, 12, 20, 28)" in t for t in texts)
    plt.close(fig)
    fig = figures.mechanism(3)  # non-power-of-two TP: refusals everywhere, rounding up keeps all 42
    texts = _texts(fig)
    assert texts.count("✗ refused") == sum(1 for n in DEFAULT_2048[:12] if n % 3)
    assert any("rounding up gives 42 buckets" in t for t in texts)
    plt.close(fig)
    fig = figures.mechanism(2, sizes=ex.raw_sizes(2))  # the scaled list of a 2-GPU run
    assert _texts(fig).count("✗ refused") == 4
    plt.close(fig)


def test_alignment_heatmaps_mark_the_assertion():
    import matplotlib.pyplot as plt

    from sglab.experiments.capture_sizes import figures

    fig = figures.alignment_heatmaps(ex.alignment_table(), 2048, 42)
    assert len(fig.axes) == 3
    assert sum(t == "assert" for t in _texts(fig)) == 2  # PR-filter panels at tp 7, cp 3; round-up never asserts
    plt.close(fig)


def test_capture_loop_order_and_every_size_ends_synchronised():
    """The runner's loop on a stand-in rank: warm-up at the smallest size, then largest first with two eager runs
    and a capture; a size with unequal shards stops the loop (or is skipped in the traced pass), and every size's
    work ends with a synchronisation (the trace attributes device work to a size by time)."""
    from sglab.experiments.capture_sizes.run import RankWork

    calls = []
    work = RankWork.__new__(RankWork)
    work.w, work.use_graphs, work.rows = 2, False, []
    work.sync = lambda barrier=True: calls.append("sync")

    def boundary(n, check=True):
        if check:
            cs.check_equal_shards(n, 2)
        calls.append(n)

    work.boundary = boundary
    graphs = work.capture_all("v", [2, 3, 4], record=True)
    # warm-up at 2; capture 4: two eager runs and the capture; 3 refused before any collective: stop
    assert sorted(graphs) == [4] and calls == ["sync", 2, "sync", "sync", 4, "sync", 4, "sync", "sync", "sync"]
    rows = {(r["size"], r["metric"]): r for r in work.rows}
    assert rows[(3, "failed")]["stage"] == "capture" and (2, "not_reached") in rows and (4, "captured") in rows
    calls.clear()
    graphs = work.capture_all("v", [2, 3, 4], record=False, keep_going=True)
    assert sorted(graphs) == [2, 4] and [c for c in calls if c != "sync"] == [2, 4, 4, 2, 2]
    assert all(calls[i + 1] == "sync" for i, c in enumerate(calls) if c != "sync" and i + 1 < len(calls))
