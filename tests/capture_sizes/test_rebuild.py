"""CPU tests of the rebuild: the default sizes, the gather decision, the PR's filter, the decode
runner's rule, today's round-up, the policies side by side, and the design-review findings."""

from __future__ import annotations

import math

import pytest

from sglab.capture_sizes import rebuild as cs


DEFAULT_2048 = [
    4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
    288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536,
    1792, 2048
]


def test_default_sizes_pr_era():
    assert cs.default_piecewise_capture_sizes(2048) == DEFAULT_2048
    big = cs.default_piecewise_capture_sizes(8192)
    assert big[len(DEFAULT_2048):] == [
        2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096, 4608, 5120, 5632, 6144, 6656, 7168, 7680,
        8192
    ]


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
    assert cs.attention_tp_size(cs.ParallelArgs(tp_size=8, attn_cp_size=2,
                                                moe_dense_tp_size=1)) == 4


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
    # the piecewise filter ignores two-batch overlap: 8 at tp 8 survives there but not in decode
    # with TBO
    assert 8 in cs.filter_piecewise_capture_sizes(DEFAULT_2048, 8)
    assert 8 not in cs.filter_decode_batch_sizes(DEFAULT_2048, 8, two_batch_overlap=True)


def test_no_sizes_left_asserts():
    with pytest.raises(cs.NoCaptureSizes, match="multiples of 24"):
        cs.filter_piecewise_capture_sizes([4, 8, 16], 4, 6)


def test_round_up_today():
    assert cs.round_up_capture_sizes(DEFAULT_2048,
                                     8) == cs.filter_piecewise_capture_sizes(DEFAULT_2048, 8)
    r3 = cs.round_up_capture_sizes(DEFAULT_2048, 3)
    assert r3[:8] == [6, 9, 12, 18, 21, 24, 30, 33]
    assert len(r3) == 42 and r3[-1] == 2049
    assert len(cs.filter_piecewise_capture_sizes(DEFAULT_2048, 3)) == 14
    assert cs.ceil_align(2048, 7) == 2051


def test_policy_lists():
    p = cs.policy_lists(DEFAULT_2048, 8)
    assert p["before"] == DEFAULT_2048 and [n for n in DEFAULT_2048 if n not in p["pr_filter"]
                                            ] == [4, 12, 20, 28]
    assert p["round_up"] == p["pr_filter"]
    assert cs.policy_lists([4, 8, 16], 4, 6)["pr_filter"] == []  # where the PR's assertion fires
    # two-batch overlap: the round-up follows the decode runner's doubled base, the PR's filter does
    # not
    tbo = cs.policy_lists(DEFAULT_2048, 8, 1, True)
    assert tbo["round_up"][:2] == [16, 32] and tbo["pr_filter"][:2] == [8, 16]


def test_review_findings():
    """The design-review findings on the default list: the comment promises tp*cp, the code keeps
    a common multiple that is not always the least one, two-batch overlap is not folded in, and
    dropping loses buckets that rounding up keeps."""

    def kept(base):
        return [n for n in DEFAULT_2048 if n % base == 0]

    assert (cs.comment_base(4, 2), cs.piecewise_mul_base(4, 2)) == (8, 4)
    assert (cs.piecewise_mul_base(4, 6), cs.lcm_base(4, 6), len(kept(24))) == (24, 12, 13)
    assert cs.decode_mul_base(8, 1, two_batch_overlap=True) == 16
    assert len(kept(8)) - len(kept(16)) == 2
    assert (len(kept(3)), len(cs.round_up_capture_sizes(DEFAULT_2048, 3))) == (14, 42)
    assert len(cs.filter_decode_batch_sizes(DEFAULT_2048, 8, two_batch_overlap=True)) == 36
