"""The breakable_graph measurement on the CPU: batches and the seeded stream, the hit rate, and one
whole run's rows with emulated graphs and host times."""

from __future__ import annotations

import pytest
import torch

from sglab.breakable_graph import measure, show
from sglab.breakable_graph import rebuild as bg


def test_hit_rate_exact():

    class Stub:

        def __init__(self, before):
            self.before = before

        def can_run(self, s):
            return (s.batch_size == 1 or not self.before) and s.num_tokens <= 100

    shapes = [bg.BatchShape(x) for x in [(10,), (20, 30), (50, 60), (100,), (1, 2, 3, 4), (101,)]]
    b = measure.graph_hit_rate(Stub(True), shapes)
    a = measure.graph_hit_rate(Stub(False), shapes)
    assert b == {"batches": 6, "graph_batches": 2, "hit_rate": 2 / 6, "token_hit_rate": 110 / 381}
    assert a == {"batches": 6, "graph_batches": 4, "hit_rate": 4 / 6, "token_hit_rate": 170 / 381}


def test_prefill_stream_seeded_and_hit_rates():
    s1 = measure.prefill_stream(300, seed=3)
    assert s1 == measure.prefill_stream(300, seed=3)
    assert s1 != measure.prefill_stream(300, seed=4)
    assert all(
        1 <= s.batch_size <= 8 and all(16 <= n <= 2048 for n in s.extend_seq_lens_cpu) for s in s1)
    rows = measure.hit_rate_rows({"stream_batches": 300, "seed": 3})
    get = {(r["variant"], r["metric"]): r["value"]
           for r in rows if r["variant"] in ("before", "after")}
    singles = sum(1 for s in s1 if s.batch_size == 1)
    fits = [s for s in s1 if s.num_tokens <= 4096]
    assert get[("before", "graph_batches")] == sum(1 for s in fits if s.batch_size == 1) == singles
    assert get[("after", "graph_batches")] == len(fits)
    assert get[("after", "hit_rate")] > get[("before", "hit_rate")]
    per_bs = {r["batch_size"]: r["value"] for r in rows if r["metric"] == "batches_with_bs"}
    assert sum(per_bs.values()) == 300 and per_bs[1] == singles


def test_split_tokens():
    for n, bs in [(128, 1), (128, 3), (512, 8), (8, 8)]:
        lens = measure.split_tokens(n, bs, seed=0)
        assert len(lens) == bs and sum(lens) == n and min(lens) >= 1
        assert lens == measure.split_tokens(n, bs, seed=0)
    with pytest.raises(ValueError):
        measure.split_tokens(4, 5, seed=0)


def test_run_rows_on_cpu(capsys):
    params = dict(vocab_size=128, hidden_size=64, num_heads=4, head_dim=16, intermediate_size=128,
                  num_layers=2, capture_num_tokens=[16, 32, 64], token_counts=[32, 64],
                  padded_token_counts=[40], batch_sizes=[1,
                                                         3], warmup=0, repeat=2, stream_batches=40)
    out = measure.run(params, progress=True, device="cpu")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln]
    assert all(ln.startswith("[breakable_graph] ") for ln in lines) and len(lines) <= 10
    df = out.df
    assert set(df["part"]) == {"a_bs3", "b_match", "c_hit_rate", "d_latency", "launches"}
    assert list(df.columns) == [
        "experiment", "variant", "part", "num_tokens", "batch_size", "padded", "model_shape",
        "resolver", "layer_model", "metric", "value", "unit"
    ]
    a = df[df["part"] == "a_bs3"].set_index(["variant", "metric"])["value"]
    assert (a[("eager", "logit_rows")], a[("before", "logit_rows")], a[("after",
                                                                        "logit_rows")]) == (3, 1, 3)
    assert a[("before", "can_run")] == 0 and a[("after", "can_run")] == 1
    assert a[("before", "row0_max_abs_diff")] < 1e-4 and a[("after", "max_abs_diff")] < 1e-4
    b = df[(df["part"] == "b_match") & (df["metric"] == "max_abs_diff")]
    assert len(b) == 6 and (b["value"] < 1e-4).all()
    lat = show.latency_table(df)
    assert len(lat) == 4 and {"speedup_after", "speedup_before"} <= set(lat.columns)
    used = df[(df["part"] == "d_latency") & (df["metric"] == "used_graph")].set_index([
        "variant", "batch_size"
    ])
    assert used.loc[("before", 1), "value"].tolist() == [1, 1]
    assert used.loc[("before", 3), "value"].tolist() == [0, 0]
    assert (used.loc["after", "value"] == 1).all()
    assert set(out.sidecars) == {"events"}


def test_each_timer_takes_the_arguments_the_latency_cells_give_it():
    """Part d times with CUDA events on the run's own device, or the host's clock on the CPU:
    each call it makes is one the timer accepts (a keyword the GPU timer lost once broke
    `sglab record breakable_graph` on GPUs alone, where the CPU tests never call it)."""
    import inspect

    for dev, on_gpu in ((torch.device("cuda", 0), True), (torch.device("cpu"), False)):
        t = measure.timer_for(dev, on_gpu)
        inspect.signature(t.func).bind(lambda: None, *t.args, warmup=0, repeat=1, **t.keywords)
