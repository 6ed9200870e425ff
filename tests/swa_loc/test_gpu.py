"""GPU tests of the SWA-location preset (#23552) and the padding fix (#24743) on real CUDA
graphs."""

from __future__ import annotations

import pytest
import torch

from sglab.swa_loc import measure as ex, show
from sglab.swa_loc import rebuild as fx
from sglab.swa_loc import claims as SWA


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
]

BATCH_SIZES = [1, 8, 32]
SIZES = dict(size=512, size_swa=256, head_num=8, head_dim=128)


def captured(num_layers, ratio, variant, batch_sizes=BATCH_SIZES):
    s = fx.build_setup(num_layers=num_layers, swa_per_full=ratio, device="cuda", **SIZES)
    r = fx.DecodeGraphRunner.for_variant(s.model, batch_sizes, variant, use_cuda_graph=True)
    r.capture()
    return s, r


def node_counts(num_layers, ratio):
    from sglab.core.kernels import graph_kernel_nodes

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
    # the stand-in store_cache converts an int32 location to int64 (one kernel) before torch's
    # index_put; the #23552 int64 buffer needs no conversion, SGLang's store_cache kernel needs none
    # for either dtype
    nodes, n_swa = node_counts(num_layers, ratio)
    for bs in BATCH_SIZES:
        assert nodes["before"][bs] - nodes["pr23552"][bs] == 3 * n_swa, (bs, nodes)
        assert nodes["pr24743"][bs] - nodes["pr23552"][bs] == n_swa, (bs, nodes)
    # the node count does not depend on the batch size
    for v in fx.VARIANTS:
        assert len(set(nodes[v].values())) == 1, nodes


def test_profiled_replay_shows_the_same_difference():
    from sglab.core.kernels import profiled_kernels

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
        clean = ex.pad_bug_scenario(variant, device="cuda", use_cuda_graph=True,
                                    num_layers=num_layers, swa_per_full=ratio)
        assert clean["corrupted"] == {} and clean["matches_prediction"], variant


def test_run_small(data_root):
    from sglab.core import claims, runs

    params = {
        **ex.DEFAULT_PARAMS, "layer_counts": [6], "swa_per_full": [5], "batch_sizes": [1, 8],
        "rounds": 1, "warmup": 2, "repeat": 5, "size": 256, "size_swa": 128, "pad_num_layers": 6,
        "trace_config": {"num_layers": 6, "swa_per_full": 5,
                         "batch_size": 8}, "kernel_table_runs": 2
    }
    out = ex.run(params, progress=False)
    df = out.df
    nodes = df[df.metric == "graph_kernel_nodes"].pivot_table(index="batch_size", columns="variant",
                                                              values="value")
    assert ((nodes["before"] - nodes["pr24743"]) == 2 * 5).all()
    assert set(df[df.metric == "kv_mismatch_slots"].value) == {0.0}
    assert (df[df.metric == "time_median"].value > 0).all()
    assert set(df[df.metric == "pad_matches_prediction"].value) == {1.0}
    assert {"events", "trace", "graph_kernels", "eager_kernels"} <= set(out.sidecars)
    path = runs.write_run(df, experiment="swa_loc", method_version=ex.METHOD_VERSION, params=params,
                          extra=out.extra, sidecars=out.sidecars)
    res = {r.claim.id: r.outcome for r in claims.evaluate(SWA, runs.read_run(path))}
    failed = {k: o for k, o in res.items() if o.status == "fail"}
    assert not failed, failed
    assert res["swa_loc.trace_equals_static"].status == "pass"
    assert res["swa_loc.trace_translation_kernels"].status == "pass"
    assert res["swa_loc.replay_ratio"].status == "n/a"  # no 48-layer cell in this small run


# --------------------------------------------------------------------------------------------------
# the profiler passes
# --------------------------------------------------------------------------------------------------
def test_traced_replay_kernel_count_equals_static_node_count():
    from collections import Counter

    from sglab.swa_loc import measure, show
    from sglab.core.kernels import graph_kernel_nodes

    runners, static, n_swa = {}, {}, None
    for v in fx.VARIANTS:
        s, r = captured(12, 5, v, [8])
        runners[v], static[v], n_swa = (r, graph_kernel_nodes(r.graphs[8]).kernels,
                                        len(s.swa_layer_ids))
    side = measure.traced_pass(runners, 8)
    counts = show.trace_counts(side["events"])
    assert {v: c["kernels"] for v, c in counts.items()} == static
    assert side["trace"].exists() and side["trace"].stat().st_size > 0
    # the kernels the preset removes: two names, once per SWA layer, and the traced replay runs
    # exactly those
    removed = show.translation_kernels(side["graph_kernels"])
    assert len(removed) == 2 and set(removed.values()) == {n_swa}, removed
    traced = show.trace_counts(side["events"], show.name_pattern(removed))
    assert traced["before"]["matching"] == 2 * n_swa and traced["pr24743"]["matching"] == 0
    # in the trace they sit where the static graph has them: the names of the traced kernels, in
    # order
    ev = side["events"][(side["events"].variant == "before")
                        & (side["events"].category == "kernel")]
    names = Counter(ev.name)
    assert names == Counter(
        dict(
            zip(*side["graph_kernels"].query("variant == 'before'")[["kernel", "nodes"
                                                                     ]].to_numpy().T)))


NSIGHT_SCRIPT = """
import json, sys
import torch
from sglab.swa_loc import measure
p = {**measure.DEFAULT_PARAMS, "kernel_table_runs": 3,
     "trace_config": {"num_layers": 12, "swa_per_full": 5, "batch_size": 8}}
table, info = measure.eager_kernel_tables(p, torch.device("cuda"))
table.to_csv(sys.argv[1], index=False)
print(json.dumps(info))
"""


def test_eager_kernel_table_nsight_matches_torch_profiler(tmp_path):
    """In a fresh process (CUPTI takes one subscriber per process: torch.profiler in this one would
    hold it)."""
    import json
    import subprocess
    import sys

    import pandas as pd

    from sglab.core import kernel_table as op_kernels
    from sglab.core import kernels

    tool, why = kernels.nsight_backend()
    if tool != "cupti":
        pytest.skip(why)
    out = tmp_path / "eager.csv"
    proc = subprocess.run([sys.executable, "-c", NSIGHT_SCRIPT,
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["nsight"] == "ran", info
    t = pd.read_csv(out, keep_default_na=False)
    c = op_kernels.cross_check(t[t.backend == op_kernels.NSIGHT], t[t.backend == op_kernels.TORCH])
    assert c["rows"] > 0 and c["equal"] == c["rows"], c
    swa = t[(t.backend == op_kernels.TORCH) & (t.scope == profile_scope())]
    per_variant = swa.groupby("variant").calls.sum() / 10  # 10 SWA layers in 12 layers at 5:1
    assert per_variant["before"] - per_variant["pr24743"] == 2, per_variant


def profile_scope():
    from sglab.swa_loc.measure import SWA_WRITE

    return SWA_WRITE
