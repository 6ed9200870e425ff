"""The capture-size experiment on real GPUs with NCCL (2+ GPUs): rows, the traced pass, and the
claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglab.capture_sizes import claims as cc
from sglab.capture_sizes import measure as ex
from sglab.capture_sizes import show
from sglab.core import claims, hardware, runs
from sglab.tools import verify


SMALL = {"world_size": 2, "hidden": 256, "max_tokens": 512}


def _verdicts(out, params, tmp_path) -> dict:
    path = runs.write_run(out.df, experiment=ex.EXPERIMENT, method_version=ex.METHOD_VERSION,
                          params={**ex.DEFAULT_PARAMS, **params}, root=tmp_path,
                          gpu_count=params["world_size"], sidecars=out.sidecars)
    return {r.claim.id: r.outcome for r in claims.evaluate(cc, verify.load_run(path))}


@pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(2)
def test_two_ranks_nccl_capture_replay_and_trace(tmp_path):
    out = ex.run(SMALL, progress=False)
    df = out.df
    s = show.summary(df).set_index("variant")
    assert s.loc["before", "first_failure"] == 1 and s.loc["before", "captured_or_ok"] == 0
    assert "UnequalShards" in s.loc["before", "error"]
    probe = df[df.variant == "before_probe"]
    assert sorted(probe.loc[probe.metric == "failed", "size"]) == [1, 3, 5, 7]
    # torch's NCCL backend refuses the unequal shards itself, on every rank, before calling NCCL
    # (expected: "ValueError: input tensor must be the same size as output size times world size")
    assert probe.loc[probe.metric == "failed", "error"].str.contains("Error").all()
    for v in ("pr_filter", "round_up"):
        assert s.loc[v, "failed"] == 0
        assert s.loc[v, "captured_or_ok"] == s.loc[v, "sizes"] == s.loc[v, "replayed_ok"]
        assert s.loc[v, "worst_replay_err"] == 0.0

    # the traced pass: one range per size on both ranks, refused sizes marked and without any
    # collective
    cr = show.capture_ranges(out.sidecars["events"])
    assert set(cr["rank"]) == {0, 1}
    for rank in (0, 1):
        before = cr[(cr.variant == "before") & (cr["rank"] == rank)]
        assert sorted(set(before.loc[before.refused, "size"])) == [1, 3, 5, 7]
        assert not cr[(cr.variant == "after") & (cr["rank"] == rank)].refused.any()
    refused = cr[cr.refused]
    assert (refused[["reduce_scatters", "all_gathers", "nccl_kernels", "kernels"]] == 0).all().all()
    # an accepted capture: 2 eager runs + the captured call on the host, but only the eager runs' 4
    # NCCL kernels
    acc = cr[~cr.refused & (cr.stage == "capture")]
    assert (acc.reduce_scatters == 3).all() and (acc.all_gathers == 3).all()
    assert (acc.nccl_kernels == 4).all()
    assert Path(out.sidecars["trace"]).stat().st_size > 1000

    res = _verdicts(out, SMALL, tmp_path)
    assert all(o.status == "pass" for o in res.values()), {
        k: o.reason
        for k, o in res.items() if o.status != "pass"
    }


@pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(2)
def test_without_the_traced_pass_trace_claims_are_na(tmp_path):
    params = {**SMALL, "profile": False}
    out = ex.run(params, progress=False)
    assert out.sidecars == {}
    res = _verdicts(out, params, tmp_path)
    assert res["capture_sizes.trace_refused_marked"].status == "n/a"
    assert "profile=False" in res["capture_sizes.trace_refused_marked"].reason
    assert res["capture_sizes.pr_filter_replays_exactly"].status == "pass"


@pytest.mark.skipif(not hardware.meets(4)[0], reason="needs 4 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(4)
def test_four_ranks_scaled_sizes(tmp_path):
    params = {**SMALL, "world_size": 4}
    out = ex.run(params, progress=False)
    probe = out.df[out.df.variant == "before_probe"]
    assert sorted(probe.loc[probe.metric == "failed", "size"]) == [2, 6, 10, 14]
    s = show.summary(out.df).set_index("variant")
    assert s.loc["pr_filter", "replayed_ok"] == s.loc["pr_filter", "sizes"]
    assert set(show.capture_ranges(out.sidecars["events"])["rank"]) == {0, 1, 2, 3}
    res = _verdicts(out, params, tmp_path)
    assert all(o.status == "pass" for o in res.values()), {
        k: o.reason
        for k, o in res.items() if o.status != "pass"
    }
