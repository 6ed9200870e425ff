"""The capture-size experiment on real GPUs with NCCL (2+ GPUs)."""

from __future__ import annotations

import pytest

from sglab import hardware
from sglab.experiments import capture_sizes as ex


@pytest.mark.skipif(not hardware.meets(2)[0], reason="needs 2 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(2)
def test_two_ranks_nccl_capture_and_replay():
    df = ex.run({"world_size": 2, "hidden": 256, "max_tokens": 512}, progress=False)
    s = ex.summary(df).set_index("variant")
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
        assert s.loc[v, "worst_replay_err"] <= ex.TOL


@pytest.mark.skipif(not hardware.meets(4)[0], reason="needs 4 CUDA GPUs")
@pytest.mark.gpu
@pytest.mark.gpus(4)
def test_four_ranks_scaled_sizes():
    df = ex.run({"world_size": 4, "hidden": 256, "max_tokens": 512}, progress=False)
    probe = df[df.variant == "before_probe"]
    assert sorted(probe.loc[probe.metric == "failed", "size"]) == [2, 6, 10, 14]
    s = ex.summary(df).set_index("variant")
    assert s.loc["pr_filter", "replayed_ok"] == s.loc["pr_filter", "sizes"]
