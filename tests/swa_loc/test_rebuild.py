"""CPU tests of the hybrid SWA pool, its set_kv_buffer branch, translate counts and the decode
runner (#23552 / #24743), all eager."""

from __future__ import annotations

import pytest

import torch

from sglab.swa_loc import rebuild as fx
from sglab.swa_loc import claims as SWA


SMALL = dict(size=64, size_swa=32, head_num=2, head_dim=4)


def setup(num_layers=6, swa_per_full=5, **kw):
    return fx.build_setup(num_layers=num_layers, swa_per_full=swa_per_full, **{**SMALL, **kw})


@pytest.mark.parametrize("num_layers,ratio,swa,full", [
    (6, 5, [0, 1, 2, 3, 4], [5]),
    (12, 5, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10], [5, 11]),
    (4, 1, [0, 2], [1, 3]),
    (3, 0, [], [0, 1, 2]),
    (3, 5, [0, 1, 2], []),
])
def test_hybrid_layer_ids(num_layers, ratio, swa, full):
    assert fx.hybrid_layer_ids(num_layers, ratio) == (swa, full)


def test_mapping_has_sentinel_and_pairs_slots():
    s = setup()
    m = s.allocator.full_to_swa_index_mapping
    assert m.dtype == torch.int64 and m.shape == (64 + 1 + 1,)
    assert m[-1].item() == -1 and int(m[:-1].abs().sum()) == 0
    assert s.pool.full_to_swa_index_mapping is m
    loc = s.allocator.alloc(5)
    swa = m[loc]
    assert loc.dtype == torch.int64 and bool((loc > 0).all()) and bool((swa > 0).all())
    assert len(set(swa.tolist())) == 5
    # slot 0 (padding) maps to SWA slot 0, -1 to -1
    t = s.pool.translate_loc_from_full_to_swa(torch.tensor([0, -1, *loc.tolist()]))
    assert t.dtype == torch.int32
    assert t.tolist() == [0, -1, *swa.tolist()]


def test_same_seed_same_slots():
    a, b = setup(), setup()
    assert torch.equal(a.allocator.alloc(7), b.allocator.alloc(7))
    assert torch.equal(a.allocator.full_to_swa_index_mapping, b.allocator.full_to_swa_index_mapping)


def kv(s, n, fill):
    k = torch.full((n, 2, 4), float(fill), dtype=s.pool.dtype)
    return k, -k


def test_set_kv_buffer_swa_layer_translates_without_preset():
    s = setup()
    loc = s.allocator.alloc(3)
    swa = s.allocator.full_to_swa_index_mapping[loc]
    s.pool.translate_calls = 0
    k, v = kv(s, 3, 7)
    s.pool.set_kv_buffer(0, loc, k, v)  # layer 0 is SWA
    assert s.pool.translate_calls == 1
    kb, vb = s.pool.buffers(0)
    assert torch.equal(kb[swa], k) and torch.equal(vb[swa], v)
    assert int((kb != 0).flatten(1).any(1).sum()) == 3  # nothing else written


def test_set_kv_buffer_swa_layer_uses_preset_loc():
    s = setup()
    loc = s.allocator.alloc(3)
    preset = torch.tensor([1, 2, 3], dtype=torch.int32)  # deliberately not the mapped slots
    s.pool.set_swa_loc(preset)
    s.pool.translate_calls = 0
    k, v = kv(s, 3, 5)
    s.pool.set_kv_buffer(1, loc, k, v)
    assert s.pool.translate_calls == 0
    kb, _ = s.pool.buffers(1)
    assert torch.equal(kb[1:4], k)
    assert sorted((kb != 0).flatten(1).any(1).nonzero().flatten().tolist()) == [1, 2, 3]


def test_set_kv_buffer_full_layer_ignores_swa_loc():
    s = setup()
    loc = s.allocator.alloc(3)
    s.pool.set_swa_loc(torch.tensor([1, 2, 3], dtype=torch.int32))
    s.pool.translate_calls = 0
    k, v = kv(s, 3, 2)
    s.pool.set_kv_buffer(5, loc, k, v)  # layer 5 is full
    assert s.pool.translate_calls == 0
    kb, vb = s.pool.buffers(5)
    assert kb.shape[0] == 65 and torch.equal(kb[loc], k) and torch.equal(vb[loc], v)
    swa_k, _ = s.pool.buffers(0)
    assert int(swa_k.abs().sum()) == 0


@pytest.mark.parametrize("num_layers,ratio", [(6, 5), (12, 5), (24, 5), (8, 1), (5, 0)])
def test_eager_translate_counts(num_layers, ratio):
    s = setup(num_layers, ratio)
    n_swa = len(s.swa_layer_ids)
    s.pool.translate_calls = 0
    b = fx.decode_batch(s, [1, 2, 3, 4], [5, 6, 7, 8])
    assert s.pool.translate_calls == 1  # ForwardBatch.init_new, once per batch
    assert b.out_cache_loc_swa.dtype == torch.int32
    s.pool.translate_calls = 0
    fx.forward_eager(s.model, b, use_precomputed_swa_loc=False)
    assert s.pool.translate_calls == n_swa
    fx.forward_eager(s.model, b, use_precomputed_swa_loc=False)
    assert s.pool.translate_calls == 2 * n_swa
    s.pool.translate_calls = 0
    fx.forward_eager(s.model, b, use_precomputed_swa_loc=True)
    assert s.pool.translate_calls == 0
    assert s.pool.swa_loc is b.out_cache_loc_swa  # left set, as upstream


def test_eager_paths_write_the_same_kv():
    a, b = setup(12, 5), setup(12, 5)
    ba = fx.decode_batch(a, [3, 9, 27], [4, 5, 6])
    bb = fx.decode_batch(b, [3, 9, 27], [4, 5, 6])
    fx.forward_eager(a.model, ba, use_precomputed_swa_loc=False)
    fx.forward_eager(b.model, bb, use_precomputed_swa_loc=True)
    assert fx.pool_diff(a.pool, b.pool, skip_padding_slot=False) == {}
    # and something was written in every layer
    for layer in range(12):
        kb, _ = a.pool.buffers(layer)
        assert int((kb != 0).flatten(1).any(1).sum()) == 3


def test_buffers_per_variant():
    s = setup()
    dtypes = {
        v: None
        if fx.DecodeGraphRunner.for_variant(s.model, [4], v).buffers.out_cache_loc_swa is None else
        fx.DecodeGraphRunner.for_variant(s.model, [4], v).buffers.out_cache_loc_swa.dtype
        for v in fx.VARIANTS
    }
    assert dtypes == fx.SWA_LOC_BUFFER_DTYPE == {
        "before": None, "pr23552": torch.int64, "pr24743": torch.int32
    }


@pytest.mark.parametrize("zero", [False, True])
def test_populate_padding(zero):
    bufs = fx.DecodeInputBuffers.create(device="cpu", max_bs=4, is_hybrid_swa=True,
                                        swa_loc_dtype=torch.int64)
    full = fx.ForwardBatch(torch.tensor([1, 2, 3, 4]), torch.tensor([9, 9, 9, 9],
                                                                    dtype=torch.int32),
                           torch.tensor([11, 12, 13, 14]),
                           torch.tensor([21, 22, 23, 24], dtype=torch.int32))
    bufs.populate_from_forward_batch(forward_batch=full, raw_bs=4, bs=4, zero_swa_on_pad=zero)
    assert bufs.out_cache_loc_swa.dtype == torch.int64 and bufs.out_cache_loc_swa.tolist() == [
        21, 22, 23, 24
    ]
    small = fx.ForwardBatch(torch.tensor([5, 6]), torch.tensor([3, 3], dtype=torch.int32),
                            torch.tensor([15, 16]), torch.tensor([25, 26], dtype=torch.int32))
    bufs.populate_from_forward_batch(forward_batch=small, raw_bs=2, bs=4, zero_swa_on_pad=zero)
    assert bufs.out_cache_loc.tolist() == [15, 16, 0, 0]
    assert bufs.seq_lens.tolist() == [3, 3, 1, 1]
    assert bufs.input_ids.tolist() == [5, 6, 3, 4]  # upstream leaves the input_ids tail as it was
    assert bufs.out_cache_loc_swa.tolist() == ([25, 26, 0, 0] if zero else [25, 26, 23, 24])


@pytest.mark.parametrize("num_layers,ratio", [(6, 5), (12, 5), (8, 1)])
def test_runner_capture_translate_counts(num_layers, ratio):
    for v in fx.VARIANTS:
        s = setup(num_layers, ratio)
        r = fx.DecodeGraphRunner.for_variant(s.model, [1, 4, 8], v)
        assert r.use_cuda_graph is False
        r.capture()
        expect = 0 if v != "before" else len(s.swa_layer_ids)
        assert r.capture_translate_calls == {1: expect, 4: expect, 8: expect}, v
        # a replay runs what was captured: the same count per step
        b = fx.decode_batch(s, [1, 2, 3], [4, 5, 6])
        s.pool.translate_calls = 0
        assert r.replay(b) == 4
        assert s.pool.translate_calls == expect


def test_runner_without_preset_refuses_a_stale_swa_loc():
    s = setup()
    s.pool.set_swa_loc(torch.tensor([1], dtype=torch.int32))
    r = fx.DecodeGraphRunner.for_variant(s.model, [1], "before")
    with pytest.raises(ValueError):
        r.capture()


def test_replay_keeps_python_state_and_pads():
    s = setup()
    r = fx.DecodeGraphRunner.for_variant(s.model, [2, 8], "pr24743")
    r.capture()
    assert r.padded_bs(1) == 2 and r.padded_bs(3) == 8 and r.padded_bs(8) == 8
    with pytest.raises(ValueError):
        r.padded_bs(9)
    before = s.pool.swa_loc
    r.replay(fx.decode_batch(s, [1, 2, 3], [4, 5, 6]))
    assert s.pool.swa_loc is before


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_runner_kv_matches_eager_reference_without_padding(variant):
    g, ref = setup(12, 5), setup(12, 5)
    r = fx.DecodeGraphRunner.for_variant(g.model, [1, 4, 8], variant)
    r.capture()
    for ids, lens in (([1, 2, 3, 4], [5, 6, 7, 8]), ([9], [3]), ([7] * 8, list(range(2, 10)))):
        r.replay(fx.decode_batch(g, ids, lens))
        fx.forward_eager(ref.model, fx.decode_batch(ref, ids, lens))
    assert fx.pool_diff(g.pool, ref.pool) == {}


def test_unknown_variant():
    with pytest.raises(ValueError):
        fx.runner_config("after")


# --------------------------------------------------------------------------------------------------
# The #24743 padding scenario, eager (the GPU test replays real graphs)
# --------------------------------------------------------------------------------------------------
from sglab.swa_loc import measure as ex, show  # noqa: E402


@pytest.mark.parametrize("num_layers,ratio", [(6, 5), (12, 5), (8, 1)])
def test_pad_bug_corrupts_exactly_the_stale_tail_slots(num_layers, ratio):
    res = ex.pad_bug_scenario("pr23552", num_layers=num_layers, swa_per_full=ratio)
    n_swa = len(res["swa_layer_ids"])
    assert (res["bs_step1"], res["raw_bs_step2"], res["bs_step2"]) == (8, 6, 8)
    assert res["stale_tail_owners"] == [6, 7] and res["owners_still_running"] == [6, 7]
    assert len(res["predicted_slots"]) == 2 and all(s > 0 for s in res["predicted_slots"])
    assert res["corrupted"] == {layer: res["predicted_slots"] for layer in res["swa_layer_ids"]}
    assert res["matches_prediction"] and res["n_corrupted"] == res["n_predicted"] == 2 * n_swa


@pytest.mark.parametrize("variant", ["before", "pr24743"])
def test_pad_scenario_clean_without_the_bug(variant):
    res = ex.pad_bug_scenario(variant, num_layers=12)
    assert res["predicted_slots"] == [] and res["corrupted"] == {}
    assert res["matches_prediction"] and res["n_corrupted"] == 0
    # the tail is there; it is just not written through
    assert len(res["stale_tail_swa_slots"]) == 2


def test_sweep_rows_eager():
    from functools import partial

    from sglab.core import runs
    from sglab.core.timing import host_time

    p = {
        **ex.DEFAULT_PARAMS, "layer_counts": [6, 12], "swa_per_full": [5, 1],
        "batch_sizes": [1, 4, 8], "size": 128, "size_swa": 64, "head_num": 2, "head_dim": 8,
        "rounds": 2, "repeat": 4, "warmup": 0, "pad_num_layers": 6,
        "trace_config": {"num_layers": 12, "swa_per_full": 1, "batch_size": 4}
    }
    probes = {"graph_kernel_nodes": lambda r, bs: -1, "profiled_kernels": lambda r, bs: -1}
    traced = []
    rows = ex.sweep(
        p, device="cpu", use_cuda_graph=False, probes=probes, timer=partial(host_time, sync=False),
        progress=False, on_trace=lambda runners, labels, bs: traced.append(
            (sorted(runners), labels, bs)))
    df = runs.tidy(ex.EXPERIMENT, rows)
    assert list(df.columns) == [
        "experiment", "variant", "num_layers", "swa_per_full", "n_swa_layers", "batch_size",
        "metric", "value", "unit"
    ]
    tc = df[df.metric == "translate_calls_capture"]
    assert len(tc) == 3 * 4 * 3
    for _, r in tc.iterrows():
        assert r.value == (r.n_swa_layers if r.variant == "before" else 0)
    assert set(df[df.metric == "kv_mismatch_slots"].value) == {0.0}
    assert len(df[df.metric == "time_median"]) == 3 * 4 * 3
    assert (df[df.metric == "time_p90"].value.to_numpy()
            >= df[df.metric == "time_p10"].value.to_numpy()).all()
    pad = df[df.metric.str.startswith("pad_")].pivot_table(index="variant", columns="metric",
                                                           values="value")
    assert pad.loc["pr23552", "pad_corrupted_slots"] == pad.loc["pr23552",
                                                                "pad_predicted_slots"] == 2 * 5
    assert pad.loc["before", "pad_corrupted_slots"] == pad.loc["pr24743",
                                                               "pad_corrupted_slots"] == 0
    assert set(pad["pad_matches_prediction"]) == {1.0}
    # the traced pass runs once, on the layout of trace_config, with every variant's runner
    assert traced == [(["before", "pr23552",
                        "pr24743"], {"num_layers": 12, "swa_per_full": 1, "n_swa_layers": 6}, 4)]


def test_check_params_rejects_bad_input():
    from sglab.swa_loc.measure import check_params

    with pytest.raises(ValueError, match="unknown variant"):
        check_params({"variants": ["after"]})
    with pytest.raises(ValueError, match="fewer slots"):
        check_params({"batch_sizes": [4096], "size": 1024})
    assert check_params({})["repeat"] == ex.DEFAULT_PARAMS["repeat"]


# --------------------------------------------------------------------------------------------------
# The committed recorded runs: claims and tables
# --------------------------------------------------------------------------------------------------
def _every_csv():
    """``[(manifest, rows)]`` of every recorded swa_loc run, read straight from its files."""
    import csv
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "data" / "recorded" / "swa_loc"
    return [(json.loads(path.with_suffix(".json").read_text()), list(csv.DictReader(path.open())))
            for path in sorted(folder.glob("*.csv"))]


def _recorded_csvs():
    newest = {}
    for man, rows in _every_csv():
        if (man["gpu_name"] not in newest
                or man["created_utc"] > newest[man["gpu_name"]][0]["created_utc"]):
            newest[man["gpu_name"]] = (man, rows)
    return newest


def _value(rows, variant, metric, layers, ratio, bs):
    hits = [
        float(r["value"]) for r in rows
        if r["variant"] == variant and r["metric"] == metric and int(r["num_layers"]) == layers
        and int(r["swa_per_full"]) == ratio and int(r["batch_size"]) == bs
    ]
    assert len(hits) == 1
    return hits[0]


def test_headline_from_recorded_runs():
    from sglab.core import claims, runs

    newest = _recorded_csvs()
    if not newest:
        pytest.skip("no recorded swa_loc run")
    text = claims.headline(SWA, claims.shown(SWA, runs.load_all_recorded("swa_loc")))
    assert "|" not in text and len(text) < 450  # kernels, a real layout per step, replay, padding
    L, ratio, bs = 48, 5, 32
    all_ratios = []
    for name, (man, rows) in newest.items():
        gpu = name.replace("NVIDIA", "").split()[0]
        kb = _value(rows, "before", "graph_kernel_nodes", L, ratio, bs)
        ka = _value(rows, "pr24743", "graph_kernel_nodes", L, ratio, bs)
        assert (kb, ka) == (315.0, 235.0)  # 48 layers, 40 SWA: 2 extra kernels per SWA layer
        assert f"{kb:.0f} → {ka:.0f} kernels per replay" in text
        tb = _value(rows, "before", "time_median", L, ratio, bs) * 1e3
        ta = _value(rows, "pr24743", "time_median", L, ratio, bs) * 1e3
        peers = [
            _value(r, "before", "time_median", L, ratio, bs) / _value(
                r, "pr24743", "time_median", L, ratio, bs) for m, r in _every_csv()
            if m["gpu_name"] == name and m.get("method_version") == man.get("method_version")
        ]
        across = f"; {min(peers):.2f}–{max(peers):.2f}× over {len(peers)} runs" if len(
            peers) > 1 else ""
        assert f"{tb:.0f} → {ta:.0f} µs ({tb / ta:.2f}×{across}) on {gpu}".replace(
            f"{min(peers):.2f}–{min(peers):.2f}×", f"{min(peers):.2f}×") in text
        for r in rows:
            if r["metric"] == "time_median" and r["variant"] == "before":
                after = _value(rows, "pr24743", "time_median", int(r["num_layers"]),
                               int(r["swa_per_full"]), int(r["batch_size"]))
                all_ratios.append(float(r["value"]) / after)
    assert "+2 per SWA layer in every cell" in text
    assert f"{min(all_ratios):.2f}–{max(all_ratios):.2f}×" in text
    assert "20 live (layer, slot) pairs overwritten by #23552, 0 by #24743" in text


def test_shown_and_tables_on_recorded():
    from sglab.core import claims, runs

    rs = runs.load_all_recorded("swa_loc")
    if not rs:
        pytest.skip("no recorded swa_loc run")
    shown = claims.shown(SWA, rs)
    assert len({r.manifest.gpu_name
                for r in shown}) == len(shown) == len({r.manifest.gpu_name
                                                       for r in rs})
    for r in shown:
        kt = show.kernel_table(r.df)
        assert set(kt["+ per SWA layer: before vs #24743"]) == {2.0}
        assert set(kt["+ per SWA layer: #24743 vs #23552"]) == {1.0}
        assert kt["same for every batch size"].all() and kt["profiler = static (all bs)"].all()
        # every (layout, batch size, variant) cell of the sweep
        agree = show.profiler_agreement(r.df)
        cells = r.df[r.df.metric == "graph_kernel_nodes"].shape[0]
        assert agree == {"cells": cells, "equal": cells, "max_abs_diff": 0}
