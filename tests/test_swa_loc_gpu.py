"""GPU tests of the SWA-location preset (#23552) and the padding fix (#24743) on real CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from sglab.experiments import swa_loc as ex
from sglab.fixes import swa_loc as fx

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BATCH_SIZES = [1, 8, 32]
SIZES = dict(size=512, size_swa=256, head_num=8, head_dim=128)


def captured(num_layers, ratio, variant, batch_sizes=BATCH_SIZES):
    s = fx.build_setup(num_layers=num_layers, swa_per_full=ratio, device="cuda", **SIZES)
    r = fx.DecodeGraphRunner.for_variant(s.model, batch_sizes, variant, use_cuda_graph=True)
    r.capture()
    return s, r


def node_counts(num_layers, ratio):
    from sglab.measure.kernels import graph_kernel_nodes

    out, n_swa = {}, None
    for v in fx.VARIANTS:
        s, r = captured(num_layers, ratio, v)
        n_swa = len(s.swa_layer_ids)
        expect_calls = n_swa if v == "before" else 0
        assert r.capture_translate_calls == {bs: expect_calls for bs in BATCH_SIZES}
        out[v] = {bs: graph_kernel_nodes(r.graphs[bs]).kernels for bs in BATCH_SIZES}
        del r, s
    torch.cuda.empty_cache()
    return out, n_swa


LAYOUTS = [(6, 5), (12, 5), (24, 5), (8, 1)]


@pytest.mark.parametrize("num_layers,ratio", LAYOUTS)
def test_without_preset_two_more_kernel_nodes_per_swa_layer(num_layers, ratio):
    nodes, n_swa = node_counts(num_layers, ratio)
    for bs in BATCH_SIZES:
        assert nodes["before"][bs] - nodes["pr24743"][bs] == 2 * n_swa, (bs, nodes)


@pytest.mark.parametrize("num_layers,ratio", LAYOUTS)
def test_int64_buffer_also_skips_the_index_conversion(num_layers, ratio):
    # the stand-in store_cache converts an int32 location to int64 (one kernel) before torch's index_put;
    # the #23552 int64 buffer needs no conversion, SGLang's store_cache kernel needs none for either dtype
    nodes, n_swa = node_counts(num_layers, ratio)
    for bs in BATCH_SIZES:
        assert nodes["before"][bs] - nodes["pr23552"][bs] == 3 * n_swa, (bs, nodes)
        assert nodes["pr24743"][bs] - nodes["pr23552"][bs] == n_swa, (bs, nodes)
    # the node count does not depend on the batch size
    for v in fx.VARIANTS:
        assert len(set(nodes[v].values())) == 1, nodes


def test_profiled_replay_shows_the_same_difference():
    from sglab.measure.kernels import profiled_kernels

    counts, n_swa = {}, None
    for v in ("before", "pr24743"):
        s, r = captured(12, 5, v, [8])
        n_swa = len(s.swa_layer_ids)
        counts[v] = len(profiled_kernels(lambda: r.replay_graph(8)))
        del r, s
    assert counts["before"] - counts["pr24743"] == 2 * n_swa, counts


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_graph_kv_matches_eager_reference(variant):
    g, r = captured(12, 5, variant, [1, 4, 8])
    ref = fx.build_setup(num_layers=12, swa_per_full=5, device="cuda", **SIZES)
    for ids, lens in (([1, 2, 3, 4], [5, 6, 7, 8]), ([9], [3]), ([7] * 8, list(range(2, 10)))):
        r.replay(fx.decode_batch(g, ids, lens))
        fx.forward_eager(ref.model, fx.decode_batch(ref, ids, lens))
    torch.cuda.synchronize()
    assert fx.pool_diff(g.pool, ref.pool) == {}


@pytest.mark.parametrize("num_layers,ratio", [(6, 5), (12, 5), (8, 1)])
def test_pad_bug_corrupts_exactly_the_predicted_slots_on_graphs(num_layers, ratio):
    res = ex.pad_bug_scenario("pr23552", device="cuda", use_cuda_graph=True, num_layers=num_layers,
                              swa_per_full=ratio)
    assert res["owners_still_running"] == [6, 7] and len(res["predicted_slots"]) == 2
    assert res["corrupted"] == {layer: res["predicted_slots"] for layer in res["swa_layer_ids"]}
    assert res["matches_prediction"] and res["n_corrupted"] == 2 * len(res["swa_layer_ids"])
    for variant in ("before", "pr24743"):
        clean = ex.pad_bug_scenario(variant, device="cuda", use_cuda_graph=True, num_layers=num_layers,
                                    swa_per_full=ratio)
        assert clean["corrupted"] == {} and clean["matches_prediction"], variant


def test_run_small():
    df = ex.run({"layer_counts": [6], "swa_per_full": [5], "batch_sizes": [1, 8], "rounds": 1, "warmup": 2,
                 "repeat": 5, "size": 256, "size_swa": 128, "pad_num_layers": 6}, progress=False)
    nodes = df[df.metric == "graph_kernel_nodes"].pivot_table(index="batch_size", columns="variant", values="value")
    assert ((nodes["before"] - nodes["pr24743"]) == 2 * 5).all()
    assert set(df[df.metric == "kv_mismatch_slots"].value) == {0.0}
    assert (df[df.metric == "time_median"].value > 0).all()
    pad = df[df.metric == "pad_matches_prediction"]
    assert set(pad.value) == {1.0}
