"""CPU tests of the measurement: the size lists of each variant, the runner's loop on a stand-in
rank, the merge of the ranks' rows and the traced pass's reduction (the gloo run itself is in
test_claims.py)."""

from __future__ import annotations

import pytest

from sglab.capture_sizes import measure as ex
from sglab.capture_sizes import rebuild as cs
from sglab.capture_sizes import show


DEFAULT_2048 = cs.default_piecewise_capture_sizes(2048)


def _events(rows):
    import pandas as pd

    from sglab.core import trace

    return pd.DataFrame([dict(zip(trace.COLUMNS, r)) for r in rows], columns=trace.COLUMNS)


def test_raw_sizes_scaled():
    s4 = ex.raw_sizes(4)
    assert [n for n in s4 if n % 4] == [2, 6, 10, 14]
    assert len(s4) == 42
    s2 = ex.raw_sizes(2)
    assert [n for n in s2 if n % 2] == [1, 3, 5, 7]
    assert ex.raw_sizes(8) == DEFAULT_2048


def test_size_lists_break_the_same_sizes():
    l4 = ex.size_lists(4)
    assert [n for n in l4["before"] if n % 4] == [2, 6, 10, 14]
    assert l4["pr_filter"] == [n for n in l4["before"] if n % 4 == 0] and len(l4["pr_filter"]) == 38
    # power-of-two alignment: rounding merges into existing buckets
    assert l4["round_up"] == l4["pr_filter"]
    l2 = ex.size_lists(2)
    assert [n for n in l2["before"] if n % 2] == [1, 3, 5, 7]
    # the unscaled default list has no bad size at 2 or 4 ranks
    assert all(n % 4 == 0 for n in ex.size_lists(4, "default")["before"])
    # 3 ranks: the default list itself breaks
    assert len(ex.size_lists(3)["pr_filter"]) == 14


def test_replay_token_counts():
    assert ex.replay_token_counts([4, 8, 16]) == {4: [1, 3, 4], 8: [5, 7, 8], 16: [9, 15, 16]}
    assert ex.replay_token_counts([1, 2]) == {1: [1], 2: [2]}


def test_merge_requires_agreement():
    a = [{
        "variant": "v", "world_size": 2, "size": 4, "metric": "replay_max_abs_err", "value": 0.5,
        "unit": "abs"
    }]
    b = [{
        "variant": "v", "world_size": 2, "size": 4, "metric": "replay_max_abs_err", "value": 1.0,
        "unit": "abs"
    }]
    assert ex._merge([a, b])[0]["value"] == 1.0
    c = [{
        "variant": "v", "world_size": 2, "size": 4, "metric": "captured", "value": 1.0, "unit": ""
    }]
    d = [{
        "variant": "v", "world_size": 2, "size": 4, "metric": "captured", "value": 0.0, "unit": ""
    }]
    with pytest.raises(RuntimeError, match="disagree"):
        ex._merge([c, d])
    with pytest.raises(RuntimeError, match="fewer"):
        ex._merge([c, []])


def test_the_probe_is_safe_unequal_shards_fail_torchs_size_check_on_every_rank():
    """``before_probe`` calls the collective without the shard check: safe only because no rank's
    shard times the world size is the token count, so every rank refuses before NCCL."""
    for w in (2, 3, 4, 8):
        for n in range(1, 100):
            if n % w:
                assert all(s * w != n for s in cs.shard_sizes(n, w))


def test_reduce_events_tags_variants_and_keeps_what_the_picture_needs():
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
    out = ex.reduce_events(ev, rank=1)
    assert list(out.columns) == ex.EVENT_COLUMNS and set(out["rank"]) == {1}
    assert "aten::mul" not in set(out.name) and "cudaLaunchKernel" not in set(out.name)
    assert "c10d::monitored_barrier_" not in set(out.name)
    assert not out.name.isin(["phase::before", "phase::after"]).any()
    before, after = out[out.variant == "before"], out[out.variant == "after"]
    assert len(before) == 7 and len(after) == 2
    assert after.start_us.min() == 10.0  # re-zeroed to the variant's start
    cr = show.capture_ranges(out)
    b = cr[cr.variant == "before"].set_index("size")
    assert bool(b.loc[3, "refused"]) and not bool(b.loc[4, "refused"])
    assert (b.loc[4, "reduce_scatters"], b.loc[4, "nccl_kernels"], b.loc[3, "kernels"]) == (1, 1, 0)
    assert cr[cr.variant == "after"].all_gathers.tolist() == [1]
    assert ex.reduce_events(ev[ev.name != "phase::before"].iloc[:3], rank=0).empty


def test_capture_loop_order_and_every_size_ends_synchronised():
    """The runner's loop on a stand-in rank: warm-up at the smallest size, then largest first with
    two eager runs and a capture; a size with unequal shards stops the loop (or is skipped in the
    traced pass), and every size's work ends with a synchronisation (the trace attributes device
    work to a size by time)."""
    calls = []
    work = ex.RankWork.__new__(ex.RankWork)
    work.w, work.use_graphs, work.rows = 2, False, []
    work.sync = lambda barrier=True: calls.append("sync")

    def boundary(n, check=True):
        if check:
            cs.check_equal_shards(n, 2)
        calls.append(n)

    work.boundary = boundary
    graphs = work.capture_all("v", [2, 3, 4], record=True)
    # warm-up at 2; capture 4: two eager runs and the capture; 3 refused before any collective: stop
    assert sorted(graphs) == [4] and calls == [
        "sync", 2, "sync", "sync", 4, "sync", 4, "sync", "sync", "sync"
    ]
    rows = {(r["size"], r["metric"]): r for r in work.rows}
    assert rows[(3, "failed")]["stage"] == "capture" and (2, "not_reached") in rows and (
        4, "captured") in rows
    calls.clear()
    graphs = work.capture_all("v", [2, 3, 4], record=False, keep_going=True)
    assert sorted(graphs) == [2, 4] and [c for c in calls if c != "sync"] == [2, 4, 4, 2, 2]
    assert all(
        calls[i + 1] == "sync" for i, c in enumerate(calls) if c != "sync" and i + 1 < len(calls))
