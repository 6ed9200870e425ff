"""CPU tests of the breakable-graph runner (#24662): layer_model resolution, routing / hit rate, the eager
model, and the before/after capture boundary through the CPU emulation of replay."""

from __future__ import annotations

import logging

import pytest

from sglab.sglang import checks
import torch

from sglab.experiments import breakable_graph as ex
from sglab.fixes import breakable_graph as bg

CAPS = [16, 32, 64]
V = bg.TINY_CONFIG.vocab_size


@pytest.fixture(scope="module")
def model():
    return bg.build_model(bg.TINY_CONFIG)


@pytest.fixture(scope="module")
def runners(model):
    return (bg.BreakableGraphRunner(model, boundary="before", capture_num_tokens=CAPS),
            bg.BreakableGraphRunner(model, boundary="after", capture_num_tokens=CAPS))


# -- layer_model resolution ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,walk,path", [
    ("causal_lm", False, "model"),
    ("causal_lm", True, "model"),
    ("vlm_language_model", False, "language_model.model"),
    ("vlm_language_model", True, "language_model.model"),
    ("no_model_layers", False, "None"),
    ("no_model_layers", True, "None"),
    ("nested_wrapper", False, "None"),
    ("nested_wrapper", True, "model.model"),
])
def test_resolution(shape, walk, path, caplog):
    m = bg.build_model(bg.TINY_CONFIG, shape=shape)
    with caplog.at_level(logging.WARNING, logger=bg.__name__):
        found = bg.resolve_layer_model(m, walk=walk)
    assert ex.module_path(m, found) == path
    warned = [r for r in caplog.records if "Could not resolve inner layer_model" in r.getMessage()]
    assert len(warned) == (1 if path == "None" else 0)
    if path != "None":
        assert hasattr(found, "layers") and len(found.layers) == bg.TINY_CONFIG.num_layers


def test_resolution_table_and_rows():
    t = ex.resolution_table()
    assert len(t) == 8
    assert t["bcg_enabled"].sum() == 5
    miss = t[~t["bcg_enabled"]]
    assert set(zip(miss["model_shape"], miss["resolver"])) == {
        ("no_model_layers", "pr24662"), ("no_model_layers", "walk_chain"), ("nested_wrapper", "pr24662")}
    assert (miss["warning"].str.contains("TinyGPTStyleLM|TinyNestedWrapper")).all()
    rows = ex.resolution_rows()
    assert len(rows) == 16 and {r["metric"] for r in rows} == {"resolved", "warned"}


def test_unresolved_runner_is_disabled_and_falls_back(caplog):
    m = bg.build_model(bg.TINY_CONFIG, shape="no_model_layers")
    with caplog.at_level(logging.WARNING, logger=bg.__name__):
        r = bg.BreakableGraphRunner(m, boundary="after", capture_num_tokens=CAPS)
    assert r.layer_model is None and r.captured == {}
    assert any("TinyGPTStyleLM" in rec.getMessage() for rec in caplog.records)
    batch = bg.make_batch([5, 6], vocab_size=V)
    assert r.can_run(batch) is False
    out, used = r.forward(batch)
    assert used is False and out.shape == (2, V)
    with pytest.raises(RuntimeError):
        r.replay(batch)


# -- routing and hit rate -----------------------------------------------------------------------------------
def test_can_run(model):
    before = bg.BreakableGraphRunner(model, boundary="before", capture_num_tokens=CAPS, capture=False)
    after = bg.BreakableGraphRunner(model, boundary="after", capture_num_tokens=CAPS, capture=False)
    cases = {(64,): (True, True), (30, 34): (False, True), (65,): (False, False), (1,) * 8: (False, True),
             (40, 40): (False, False), (1,): (True, True)}
    for lens, (b, a) in cases.items():
        s = bg.BatchShape(lens)
        assert before.can_run(s) is b, lens
        assert after.can_run(s) is a, lens
    assert before.captured == {} and after.captured == {}


def test_hit_rate_exact():
    class Stub:
        def __init__(self, before):
            self.before = before

        def can_run(self, s):
            return (s.batch_size == 1 or not self.before) and s.num_tokens <= 100

    shapes = [bg.BatchShape(x) for x in [(10,), (20, 30), (50, 60), (100,), (1, 2, 3, 4), (101,)]]
    b = ex.graph_hit_rate(Stub(True), shapes)
    a = ex.graph_hit_rate(Stub(False), shapes)
    assert b == {"batches": 6, "graph_batches": 2, "hit_rate": 2 / 6, "token_hit_rate": 110 / 381}
    assert a == {"batches": 6, "graph_batches": 4, "hit_rate": 4 / 6, "token_hit_rate": 170 / 381}


def test_prefill_stream_seeded_and_hit_rates():
    s1 = ex.prefill_stream(300, seed=3)
    assert s1 == ex.prefill_stream(300, seed=3)
    assert s1 != ex.prefill_stream(300, seed=4)
    assert all(1 <= s.batch_size <= 8 and all(16 <= n <= 2048 for n in s.extend_seq_lens_cpu) for s in s1)
    rows = ex.hit_rate_rows({"stream_batches": 300, "seed": 3})
    get = {(r["variant"], r["metric"]): r["value"] for r in rows if r["variant"] in ("before", "after")}
    singles = sum(1 for s in s1 if s.batch_size == 1)
    fits = [s for s in s1 if s.num_tokens <= 4096]
    assert get[("before", "graph_batches")] == sum(1 for s in fits if s.batch_size == 1) == singles
    assert get[("after", "graph_batches")] == len(fits)
    assert get[("after", "hit_rate")] > get[("before", "hit_rate")]
    per_bs = {r["batch_size"]: r["value"] for r in rows if r["metric"] == "batches_with_bs"}
    assert sum(per_bs.values()) == 300 and per_bs[1] == singles


def test_split_tokens():
    for n, bs in [(128, 1), (128, 3), (512, 8), (8, 8)]:
        lens = ex.split_tokens(n, bs, seed=0)
        assert len(lens) == bs and sum(lens) == n and min(lens) >= 1
        assert lens == ex.split_tokens(n, bs, seed=0)
    with pytest.raises(ValueError):
        ex.split_tokens(4, 5, seed=0)


# -- the eager model ----------------------------------------------------------------------------------------
def test_attention_mixes_only_within_requests(model):
    lens = [5, 9, 3, 7]
    batch = bg.make_batch(lens, vocab_size=V, seed=2)
    logits = bg.run_eager(model, batch)
    assert logits.shape == (4, V)
    start = 0
    for i, n in enumerate(lens):
        alone = bg.make_batch([n], vocab_size=V)
        alone.input_ids = batch.input_ids[start:start + n]
        torch.testing.assert_close(bg.run_eager(model, alone)[0], logits[i], atol=1e-5, rtol=1e-5)
        start += n


def test_metadata_padding():
    m = bg.build_attn_metadata([2, 3], 7, "cpu")
    assert m.token_req.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert m.mask[4].tolist() == [False, False, True, True, True, False, False]
    assert m.mask[6].tolist() == [False] * 5 + [True, True]
    with pytest.raises(ValueError):
        bg.build_attn_metadata([4, 4], 7, "cpu")


# -- before / after through the CPU emulation of replay ------------------------------------------------------
def test_before_replay_for_three_requests_returns_one_row(model, runners):
    before, _ = runners
    batch = bg.make_batch([10, 12, 10], vocab_size=V, seed=1)
    ref = bg.run_eager(model, batch)
    out = before.replay(batch)
    assert out.shape == (1, V) and ref.shape == (3, V)  # bs=1 baked into the captured tail
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)  # request 0's last token only
    assert before.can_run(batch) is False
    logits, used = before.forward(batch)
    assert used is False and logits.shape == (3, V)


@pytest.mark.parametrize("lens", [[32], [10, 12, 10], [5, 7, 9, 11], [3, 4, 5], [20, 30, 14], [1] * 8])
def test_after_replay_matches_eager(model, runners, lens):
    _, after = runners
    batch = bg.make_batch(lens, vocab_size=V, seed=len(lens))
    ref = bg.run_eager(model, batch)
    out, used = after.forward(batch)
    assert used is True and out.shape == (len(lens), V)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert "forward" not in vars(after.layer_model)  # the swap is undone


def test_swap_restored_after_error(model, runners, monkeypatch):
    _, after = runners

    def boom(*args, **kwargs):
        raise RuntimeError("tail failed")

    monkeypatch.setattr(model.logits_processor, "forward", boom)
    with pytest.raises(RuntimeError, match="tail failed"):
        after.replay(bg.make_batch([4, 4], vocab_size=V))
    assert "forward" not in vars(after.layer_model)


def test_bucket_and_reject_beyond_max(runners):
    before, after = runners
    assert [after.bucket(n) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    with pytest.raises(ValueError):
        after.bucket(65)
    assert before.max_num_tokens == after.max_num_tokens == 64


def test_bad_boundary(model):
    with pytest.raises(ValueError):
        bg.BreakableGraphRunner(model, boundary="middle", capture_num_tokens=CAPS)


def test_eager_on_graph_passthrough_without_capture():
    calls = []

    @bg.eager_on_graph(True)
    def f(x):
        calls.append(1)
        return x + 1

    assert f(torch.ones(2)).tolist() == [2.0, 2.0] and calls == [1]
    assert bg.eager_on_graph(False)(len) is len


def test_upstream_check_registered():
    from sglab.sglang import upstream
    from sglab.tools.fixes import NAMES, get

    assert "breakable_graph" in NAMES
    src_before = ("class BreakableCudaGraphRunner:\n    def can_run(self, forward_batch):\n"
                  "        if forward_batch.batch_size > 1:\n            return False\n")
    src_after = ("class BreakableCudaGraphRunner:\n    def __init__(self, m):\n"
                 "        self.layer_model = m.language_model.model\n\n    def replay(self, fb):\n"
                 "        self.layer_model.forward = replay_layer_forward\n")
    check = checks.breakable_graph
    assert check(lambda p: src_before if p.endswith("breakable_cuda_graph_runner.py") else None).status == "before"
    assert check(lambda p: src_after if p.endswith("breakable_cuda_graph_runner.py") else None).status == "pr-era"
    later = src_after.replace("BreakableCudaGraphRunner", "PrefillCudaGraphRunner")
    assert check(lambda p: later if p.endswith("runner/prefill_cuda_graph_runner.py") else None).status == "changed"
    assert check(lambda p: None).status == "absent"


def test_run_rows_on_cpu():
    params = dict(vocab_size=128, hidden_size=64, num_heads=4, head_dim=16, intermediate_size=128, num_layers=2,
                  capture_num_tokens=[16, 32, 64], token_counts=[32, 64], padded_token_counts=[40],
                  batch_sizes=[1, 3], warmup=0, repeat=2, stream_batches=40)
    df = ex._run(params, progress=False, device=torch.device("cpu")).df
    assert set(df["part"]) == set(ex.PARTS)
    assert list(df.columns[:2]) == ["experiment", "variant"] and list(df.columns[-3:]) == ["metric", "value", "unit"]
    a = df[df["part"] == "a_bs3"].set_index(["variant", "metric"])["value"]
    assert (a[("eager", "logit_rows")], a[("before", "logit_rows")], a[("after", "logit_rows")]) == (3, 1, 3)
    assert a[("before", "can_run")] == 0 and a[("after", "can_run")] == 1
    assert a[("before", "row0_max_abs_diff")] < 1e-4 and a[("after", "max_abs_diff")] < 1e-4
    b = df[(df["part"] == "b_match") & (df["metric"] == "max_abs_diff")]
    assert len(b) == 6 and (b["value"] < 1e-4).all()
    lat = ex.latency_table(df)
    assert len(lat) == 4 and {"speedup_after", "speedup_before"} <= set(lat.columns)
    used = df[(df["part"] == "d_latency") & (df["metric"] == "used_graph")].set_index(["variant", "batch_size"])
    assert used.loc[("before", 1), "value"].tolist() == [1, 1] and used.loc[("before", 3), "value"].tolist() == [0, 0]
    assert (used.loc["after", "value"] == 1).all()


# -- README headline from the committed recorded runs ---------------------------------------------------------
def test_headline_from_recorded_runs():
    import csv
    import json
    from pathlib import Path
    from statistics import median

    from sglab.core import runs

    folder = Path(runs.repo_root()) / "data" / "recorded" / "breakable_graph"
    newest: dict[str, Path] = {}
    for js in sorted(folder.glob("*.json")):
        m = json.loads(js.read_text())
        gpu = m["gpu_name"].replace("NVIDIA", "").split()[0]
        if gpu not in newest or m["created_utc"] > json.loads(newest[gpu].read_text())["created_utc"]:
            newest[gpu] = js
    if not newest:
        pytest.skip("no recorded run of breakable_graph")
    from sglab.core import claims
    from sglab.tools import fixes

    text = claims.headline(fixes.claims("breakable_graph"), claims.shown(fixes.claims("breakable_graph"), runs.load_all_recorded("breakable_graph")))
    assert "|" not in text and len(text) < 350
    for gpu, js in newest.items():
        rows = list(csv.DictReader(js.with_suffix(".csv").open()))
        med = {}
        for r in rows:
            if r["part"] == "d_latency" and r["metric"] == "time_median":
                med[(int(float(r["num_tokens"])), int(float(r["batch_size"])), r["variant"])] = float(r["value"])
        sp = [med[(n, b, "eager")] / med[(n, b, "after")] for (n, b, v) in med if v == "after" and b > 1]
        params = json.loads(js.read_text())["params"]
        assert len(sp) == len(params["token_counts"]) * sum(b > 1 for b in params["batch_sizes"])
        assert f"{gpu} {min(sp):.2f}–{max(sp):.2f}× (median {median(sp):.2f}×)" in text
        hit = {(r["variant"], r["metric"]): float(r["value"]) for r in rows if r["part"] == "c_hit_rate"}
        assert f"Graph hit rate {hit[('before', 'hit_rate')]:.0%} → {hit[('after', 'hit_rate')]:.0%}" in text
    # the committed runs: H100 and H200, one each
    assert sorted(newest) == ["H100", "H200"]
    assert "max abs diff vs eager 0." in text
