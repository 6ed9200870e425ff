"""GPU tests of the breakable-graph runner (#24662) with real CUDA graph segments: the "after" graph
matches eager prefill for 1..8 requests, the "before" graph is rejected for more than one request
(and replaying it anyway returns one row), and the measurement runs end to end on a small
configuration."""

from __future__ import annotations

import pytest
import torch

from sglab.breakable_graph import measure, show
from sglab.breakable_graph import rebuild as bg


CFG = bg.ModelConfig(vocab_size=1000, hidden_size=256, num_heads=4, head_dim=64,
                     intermediate_size=512, num_layers=4, max_position=1024)
CAPS = [64, 128, 256]


@pytest.fixture(scope="module")
def setup():
    dev = torch.device("cuda", torch.cuda.current_device())
    model = bg.build_model(CFG, device=dev, dtype=torch.float32, seed=0)
    pool = torch.cuda.graph_pool_handle()
    before = bg.BreakableGraphRunner(model, boundary="before", capture_num_tokens=CAPS, pool=pool)
    after = bg.BreakableGraphRunner(model, boundary="after", capture_num_tokens=CAPS, pool=pool)
    yield dev, model, before, after
    del before, after, model
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _batch(n, bs, dev, seed=0):
    return bg.make_batch(measure.split_tokens(n, bs, seed), vocab_size=CFG.vocab_size, device=dev,
                         seed=seed + bs)


@pytest.mark.gpu
def test_segments_per_bucket(setup):
    _, _, before, after = setup
    for n in CAPS:
        assert after.segments(n) == (CFG.num_layers + 1, CFG.num_layers)
        assert before.segments(n) == (CFG.num_layers + 1, CFG.num_layers)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [128, 256])
@pytest.mark.parametrize("bs", range(1, 9))
def test_after_matches_eager_equal_tokens(setup, n, bs):
    dev, model, _, after = setup
    batch = _batch(n, bs, dev)
    ref = bg.run_eager(model, batch)
    out, used = after.forward(batch)
    torch.cuda.synchronize()
    assert used is True and out.shape == (bs, CFG.vocab_size)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 3, 8])
def test_after_matches_eager_padded(setup, bs):
    dev, model, _, after = setup
    batch = _batch(100, bs, dev)  # runs in the 128 bucket with 28 padding tokens
    ref = bg.run_eager(model, batch)
    out, used = after.forward(batch)
    torch.cuda.synchronize()
    assert used is True and out.shape == (bs, CFG.vocab_size)
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
def test_before_rejected_for_more_than_one_request(setup):
    dev, model, before, _ = setup
    one = _batch(128, 1, dev)
    ref1 = bg.run_eager(model, one)
    out1, used1 = before.forward(one)
    assert used1 is True
    torch.testing.assert_close(out1, ref1, atol=1e-4, rtol=1e-4)

    three = _batch(128, 3, dev)
    assert before.can_run(three) is False
    ref3 = bg.run_eager(model, three)
    out3, used3 = before.forward(three)
    assert used3 is False and out3.shape == (3, CFG.vocab_size)
    torch.testing.assert_close(out3, ref3)

    replayed = before.replay(three)  # what can_run prevents: bs=1 baked into the captured tail
    torch.cuda.synchronize()
    assert replayed.shape == (1, CFG.vocab_size)
    torch.testing.assert_close(replayed[0], ref3[0], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_structure_capture_matches_the_real_capture(setup):
    _, model, before, after = setup
    for runner in (before, after):
        s = show.capture_structure(runner.boundary, model=model)
        assert (len(s.segments), len(s.breaks)) == runner.segments(CAPS[0])
        assert s.tail_in_graph is (runner.boundary == "before")


@pytest.mark.gpu
def test_measurement_small_run():
    params = dict(vocab_size=1000, hidden_size=256, num_heads=4, head_dim=64, intermediate_size=512,
                  num_layers=2, capture_num_tokens=[64, 128], token_counts=[64, 128],
                  padded_token_counts=[100], batch_sizes=[1, 3], warmup=1, repeat=3,
                  launch_token_count=64, launch_batch_sizes=[1, 3], stream_batches=50)
    out = measure.run(params, progress=False)
    df = out.df
    ev = out.sidecars["events"]
    assert set(ev.variant) == {"before", "after"} and set(ev.batch_size) == {3}
    lt = show.launch_table(df)
    assert lt.loc[(3, "after"), "host_graph_launches"] == 3
    assert lt.loc[(3, "before"), "host_graph_launches"] == 0
    assert set(df["part"]) == {"a_bs3", "b_match", "c_hit_rate", "d_latency", "launches"}
    a = df[df["part"] == "a_bs3"].set_index(["variant", "metric"])["value"]
    assert a[("before", "logit_rows")] == 1 and a[("after", "logit_rows")] == 3
    assert a[("eager", "logit_rows")] == 3
    b = df[(df["part"] == "b_match") & (df["metric"] == "max_abs_diff")]
    assert len(b) == 6 and (b["value"] < 0.1).all()
    lat = show.latency_table(df)
    assert len(lat) == 4 and (lat[["eager", "before", "after"]] > 0).all().all()
    launches = df[(df["part"] == "launches") & (df["metric"] == "host_graph_launches")
                  & (df["variant"] == "after")]
    assert (launches["value"] >= 3).all()
