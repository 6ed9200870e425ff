"""CPU tests of the rebuilt breakable-graph runner (#24662): layer_model resolution, routing, the
eager model, and the before/after capture boundary through the CPU emulation of replay."""

from __future__ import annotations

import logging

import pytest
import torch

from sglab.breakable_graph import rebuild as bg
from sglab.breakable_graph.measure import module_path


CAPS = [16, 32, 64]
V = bg.TINY_CONFIG.vocab_size


@pytest.fixture(scope="module")
def model():
    return bg.build_model(bg.TINY_CONFIG)


@pytest.fixture(scope="module")
def runners(model):
    return (bg.BreakableGraphRunner(model, boundary="before", capture_num_tokens=CAPS),
            bg.BreakableGraphRunner(model, boundary="after", capture_num_tokens=CAPS))


# -- layer_model resolution
# --------------------------------------------------------------------------------------------------
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
    assert str(module_path(m, found)) == path
    warned = [r for r in caplog.records if "Could not resolve inner layer_model" in r.getMessage()]
    assert len(warned) == (1 if path == "None" else 0)
    if path != "None":
        assert hasattr(found, "layers") and len(found.layers) == bg.TINY_CONFIG.num_layers


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


# -- routing
# --------------------------------------------------------------------------------------------------
def test_can_run(model):
    before = bg.BreakableGraphRunner(model, boundary="before", capture_num_tokens=CAPS,
                                     capture=False)
    after = bg.BreakableGraphRunner(model, boundary="after", capture_num_tokens=CAPS, capture=False)
    cases = {(64,): (True, True), (30, 34): (False, True), (65,): (False, False),
             (1,) * 8: (False, True), (40, 40): (False, False), (1,): (True, True)}
    for lens, (b, a) in cases.items():
        s = bg.BatchShape(lens)
        assert before.can_run(s) is b, lens
        assert after.can_run(s) is a, lens
    assert before.captured == {} and after.captured == {}


# -- the eager model
# --------------------------------------------------------------------------------------------------
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


# -- before / after through the CPU emulation of replay
# --------------------------------------------------------------------------------------------------
def test_before_replay_for_three_requests_returns_one_row(model, runners):
    before, _ = runners
    batch = bg.make_batch([10, 12, 10], vocab_size=V, seed=1)
    ref = bg.run_eager(model, batch)
    out = before.replay(batch)
    assert out.shape == (1, V) and ref.shape == (3, V)  # bs=1 baked into the captured tail
    # request 0's last token only
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=1e-5)
    assert before.can_run(batch) is False
    logits, used = before.forward(batch)
    assert used is False and logits.shape == (3, V)


@pytest.mark.parametrize("lens",
                         [[32], [10, 12, 10], [5, 7, 9, 11], [3, 4, 5], [20, 30, 14], [1] * 8])
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
