"""GPU tests of notebook 01: piecewise-graph prefill equals eager prefill within bf16 tolerance, the
direct hand-off computes what the copy hand-off does, the traced pass sees what the claims read
(launch gaps, the hand-off copies, kernel counts that agree between the profiler and the per-kernel
table), and method 3's rows: the host's per-launch cost on two clocks, launches per prefill."""

from __future__ import annotations

import pytest

from sglab.core import claims as C
from sglab.core import runs
from sglab.pcg_gate import claims, measure, tables


pytestmark = pytest.mark.gpu

PARAMS = {
    "num_layers": 8, "token_counts": [16, 100, 1000, 4096], "direct_token_counts": [4096],
    "trace_token_counts": [16, 4096], "kernel_table_tokens": 4096, "kernel_table_runs": 2,
    "repeat": 3, "rounds": 1, "warmup": 1
}


@pytest.fixture(scope="module")
def measured():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return measure.run(PARAMS, progress=False)


def test_piecewise_matches_eager_on_gpu(measured):
    df = measured.df
    t = tables.latency_table(df)
    assert list(t.index) == [16, 100, 1000, 4096]
    assert list(t["bucket"]) == [16, 112, 1024, 4096]
    bad = t[~t["within_tol"]]
    assert bad.empty, bad[["max_abs_diff", "tolerance"]].to_string()
    facts = tables.run_facts(df)
    assert facts[("eager", "gate_enabled")] == 0.0 and facts[("piecewise", "gate_enabled")] == 1.0
    # 50 buckets up to 4096 tokens x (8 layers + 1) pieces
    assert facts[("piecewise", "graphs")] == 50 * 9
    assert (t[["eager median ms", "piecewise median ms", "direct median ms"]].fillna(1)
            > 0).all().all()
    direct = df[(df.variant == "piecewise_direct") & (df.metric == "max_abs_diff")]
    assert len(direct) == 1 and float(direct.value.iloc[0]) <= float(t.loc[4096, "tolerance"])


def test_gate_rows_count_the_duplicate(measured):
    g = tables.gate_table(measured.df)
    lm = 1 + 8 * 6 + 1  # embed, 6 tensors per layer, final norm (no lm_head)
    assert (g["lm_keys"] == lm).all()
    assert dict(g["model_keys_after_gate"]) == {
        "no_alias": 0, "plain_alias": lm, "property_only": lm, "property_guard": 0,
        "property_setter": lm
    }
    assert dict(g["gate_enabled"]) == {
        "no_alias": 0, "plain_alias": 1, "property_only": 1, "property_guard": 1,
        "property_setter": 1
    }


def test_trace_sees_launch_gaps_and_copies(measured):
    t = tables.trace_table(measured.df)
    assert t.loc[(16, "eager"), "graph_launches"] == 0
    assert t.loc[(16, "piecewise"), "graph_launches"] == 9  # one per piece
    assert t.loc[(16, "eager"), "busy"] < t.loc[(16, "piecewise"), "busy"]
    assert t.loc[(4096, "eager"), "copy_ops"] == 0
    # per layer q, k, v (copy kernels), the residual (graph memcpy) and the attention output; + the
    # final output and the ids
    assert t.loc[(4096, "piecewise"), "copy_ops"] == 5 * 8 + 2
    # the attention outputs and the ids only
    assert t.loc[(4096, "piecewise_direct"), "copy_ops"] == 8 + 1
    ev = measured.sidecars["events"]
    assert set(ev.variant) == {"eager", "piecewise", "piecewise_direct"}
    assert set(ev.num_tokens) == {16, 4096}
    assert measured.sidecars["trace"].exists()


def test_kernel_table_agrees_with_the_profiler(measured):
    d = measured.df
    kt = measured.extra["kernel_table"]
    calls = d[(d.metric == "kernel_table_calls") & (d.variant == "eager")].value.iloc[0]
    traced = d[(d.metric == "trace_kernels") & (d.variant == "eager")
               & (d.num_tokens == 4096)].value.iloc[0]
    assert calls == traced, (kt, calls, traced)
    table = measured.sidecars["kernels"]
    assert set(table.label) == {"eager 4096", "pieces_eager 4096"}
    copies = table[table.kernel.str.contains("direct_copy")]
    # the hand-off copies exist only in the pieces
    assert set(copies.label) == {"pieces_eager 4096"}


def test_method3_host_cost_and_launch_counts(measured):
    """Both clocks see the same launch burst; the counting pass sees every eager kernel launched
    one by one, and piecewise as its graph launches, attention and hand-off calls; the
    launch-bound claims and the host-cost check hold on the run."""
    lt = tables.launch_table(measured.df)
    assert list(lt.index) == [16, 100, 1000, 4096]
    assert (lt["host µs/launch"] > 0).all()
    assert ((lt["host µs/launch (CUDA events)"] / lt["host µs/launch"] - 1).abs() < 0.25).all()
    t = tables.trace_table(measured.df)
    assert lt.loc[16, "eager launches"] == t.loc[(16, "eager"), "kernel_launches"]
    # 9 graph launches, per layer the attention kernel and its output copy, the ids copy
    assert lt.loc[16, "piecewise launches"] >= 9 + 2 * 8 + 1
    assert lt.loc[16, "piecewise launches"] < lt.loc[16, "eager launches"] / 3
    run = runs.Run(
        measured.df, {
            "experiment": "pcg_gate", "method_version": 3, "params": {
                **measure.DEFAULT_PARAMS, **PARAMS
            }, "kernel_table": measured.extra["kernel_table"]
        },
        runs.repo_root() / "gpu.csv")
    v = C.values(claims, run)
    assert v["pcg_gate.host_launch_cost"].status == "pass", v["pcg_gate.host_launch_cost"]
    assert v["pcg_gate.small_prefill_speedup"].value["launches_eager"] == lt.loc[16,
                                                                                 "eager launches"]
