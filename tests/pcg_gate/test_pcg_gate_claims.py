"""pcg_gate claims on the committed runs (all hold or are n/a with a reason) and on damaged copies of them (the
right claim fails, by name)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from sglab.tools import cli
from sglab.core import runs

EXP = "pcg_gate"
RECORDED = runs.list_runs(EXP)


def test_every_recorded_run_verifies(capsys):
    if not RECORDED:
        pytest.skip("no recorded pcg_gate run")
    assert cli.main(["verify", EXP]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and f"{len(RECORDED)} run(s): {len(RECORDED)} hold" in out


def _copy(src, tmp_path, edit, method=None):
    """A copy of a recorded run (CSV, manifest, sidecars) with its rows edited; the manifest's row count kept."""
    dst = tmp_path / src.name
    for f in src.parent.glob(src.stem + ".*"):
        shutil.copy2(f, tmp_path / f.name)
    df = edit(pd.read_csv(dst))
    df.to_csv(dst, index=False)
    m = json.loads(dst.with_suffix(".json").read_text())
    m["rows"] = len(df)
    dst.with_suffix(".json").write_text(json.dumps(m))
    return dst


def _set(df, value, **where):
    sel = pd.Series(True, index=df.index)
    for k, v in where.items():
        sel &= df[k] == v
    assert sel.any(), where
    df.loc[sel, "value"] = value
    return df


DAMAGE = {
    "pcg_gate.gate_decision": lambda df: _set(df, 1.0, variant="eager", metric="gate_enabled"),
    "pcg_gate.piecewise_equals_eager": lambda df: _set(df, 0.5, variant="piecewise", metric="max_abs_diff",
                                                       num_tokens=64),
    "pcg_gate.graph_count": lambda df: _set(df, 849.0, variant="piecewise", metric="graphs"),
    "pcg_gate.small_prefill_speedup": lambda df: _set(df, 50.0, variant="piecewise", metric="time_median",
                                                      num_tokens=64),
}


@pytest.mark.parametrize("claim", sorted(DAMAGE))
def test_a_damaged_copy_fails_the_right_claim(claim, tmp_path, capsys):
    if not RECORDED:
        pytest.skip("no recorded pcg_gate run")
    path = _copy(RECORDED[-1], tmp_path, DAMAGE[claim])
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    failed = {line.split()[1] for line in out.splitlines() if line.startswith("FAIL ")}
    assert failed == {claim}, out


M2 = [p for p in RECORDED if json.loads(p.with_suffix(".json").read_text()).get("method_version", 1) >= 2]
DAMAGE_M2 = {
    "pcg_gate.duplicate_keys": lambda df: _set(df, 97.0, variant="property_guard", metric="model_keys_after_gate"),
    "pcg_gate.trace_launch_gaps": lambda df: _set(df, 0.9, variant="eager", metric="trace_busy",
                                                  num_tokens=int(df[df.metric == "trace_busy"].num_tokens.min())),
    "pcg_gate.copies_explain_slowdown": lambda df: _set(df, 0.0, variant="piecewise", metric="trace_copy_us"),
    "pcg_gate.kernel_counts_agree": lambda df: df.assign(value=df.value.where(
        ~((df.metric == "kernel_table_calls") & (df.variant == "eager")), df.value + 1)),
}


@pytest.mark.parametrize("claim", sorted(DAMAGE_M2))
def test_a_damaged_method2_copy_fails_the_right_claim(claim, tmp_path, capsys):
    if not M2:
        pytest.skip("no recorded pcg_gate run of method 2 yet")
    path = _copy(M2[-1], tmp_path, DAMAGE_M2[claim])
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    failed = {line.split()[1] for line in out.splitlines() if line.startswith("FAIL ")}
    if claim == "pcg_gate.kernel_counts_agree" and "n/a   pcg_gate.kernel_counts_agree" in out:
        pytest.skip("the committed run's kernel table came from torch.profiler (claim n/a)")
    assert failed == {claim}, out


def test_a_cpu_run_has_the_gate_rows_the_claims_read():
    """The CPU path of run() writes the method-2 gate rows; the gate claims hold on them."""
    import torch

    from sglab.core import claims
    from sglab.tools import fixes
    from sglab.experiments import pcg_gate as exp
    from sglab.core.timing import host_time

    tiny = {"hidden": 64, "num_layers": 2, "num_heads": 4, "intermediate": 96, "vocab": 50, "max_tokens": 64,
            "token_counts": [16, 64], "direct_token_counts": [], "trace_token_counts": [16], "repeat": 1,
            "rounds": 1, "warmup": 0}
    out = exp._run({**exp.DEFAULT_PARAMS, **tiny}, torch.device("cpu"), use_graphs=False, progress=False,
                   timer=lambda f, warmup, repeat: host_time(f, warmup=warmup, repeat=repeat))
    run = runs.Run(out.df, {"experiment": EXP, "method_version": 2, "params": {**exp.DEFAULT_PARAMS, **tiny}},
                   runs.repo_root() / "cpu.csv")
    v = claims.values(fixes.claims(EXP), run)
    assert v["pcg_gate.gate_decision"].status == "pass"
    assert v["pcg_gate.duplicate_keys"].status == "pass"
    assert v["pcg_gate.duplicate_keys"].value["lm_keys"] == 1 + 2 * 6 + 1
