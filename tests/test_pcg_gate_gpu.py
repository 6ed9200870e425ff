"""GPU test of notebook 01: piecewise-graph prefill equals eager prefill within bf16 tolerance."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_piecewise_matches_eager_on_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from sglab.experiments import pcg_gate as exp

    params = {"num_layers": 8, "token_counts": [16, 100, 1000, 4096], "repeat": 3, "rounds": 1, "warmup": 1}
    df = exp.run(params, progress=False).df
    t = exp.latency_table(df)
    assert list(t.index) == [16, 100, 1000, 4096]
    assert list(t["bucket"]) == [16, 112, 1024, 4096]
    bad = t[~t["within_tol"]]
    assert bad.empty, bad[["max_abs_diff", "tolerance"]].to_string()
    facts = exp.run_facts(df)
    assert facts[("eager", "gate_enabled")] == 0.0 and facts[("piecewise", "gate_enabled")] == 1.0
    assert facts[("piecewise", "graphs")] == 50 * 9  # 50 buckets up to 4096 tokens x (8 layers + 1) segments
    assert (t[["eager median ms", "piecewise median ms"]] > 0).all().all()
