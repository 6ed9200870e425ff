"""breakable_graph claims on the committed runs (all hold or are n/a with a reason) and on damaged copies of them
(the right claim fails, by name)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sglab.tools import cli
from sglab.core import runs

from tests.pcg_gate.test_claims import _copy, _set  # noqa: E402

EXP = "breakable_graph"
RECORDED = runs.list_runs(EXP)


def test_every_recorded_run_verifies(capsys):
    if not RECORDED:
        pytest.skip("no recorded breakable_graph run")
    assert cli.main(["verify", EXP]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and f"{len(RECORDED)} run(s): {len(RECORDED)} hold" in out


def _drop_variant(df, variant, part):
    return df[~((df.part == part) & (df.variant == variant))]


DAMAGE = {
    "breakable_graph.before_bs3_one_row": lambda df: _set(df, 3.0, part="a_bs3", variant="before",
                                                         metric="logit_rows"),
    "breakable_graph.after_equals_eager": lambda df: _set(df, 0.125, part="b_match", variant="after",
                                                         metric="max_abs_diff", batch_size=3),
    "breakable_graph.hit_rate": lambda df: _set(df, 325.0, part="c_hit_rate", variant="before",
                                               metric="graph_batches"),
    "breakable_graph.multi_request_speedup": lambda df: _set(df, 100.0, part="d_latency", variant="after",
                                                            metric="time_median", batch_size=8),
    "breakable_graph.segments_per_bucket": lambda df: _set(df, 16.0, part="launches", variant="after",
                                                          metric="graph_segments", num_tokens=512),
    "breakable_graph.routing": lambda df: _set(df, 1.0, part="d_latency", variant="before", metric="used_graph",
                                              batch_size=8),
    "breakable_graph.launches": lambda df: _set(df, 16.0, part="launches", variant="after",
                                               metric="host_graph_launches", batch_size=8),
}


@pytest.mark.parametrize("claim", sorted(DAMAGE))
def test_a_damaged_copy_fails_the_right_claim(claim, tmp_path, capsys):
    if not RECORDED:
        pytest.skip("no recorded breakable_graph run")
    path = _copy(RECORDED[-1], tmp_path, DAMAGE[claim])
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    failed = {line.split()[1] for line in out.splitlines() if line.startswith("FAIL ")}
    assert failed == {claim}, out


def test_a_dropped_variant_is_a_failure_not_a_pass(tmp_path, capsys):
    if not RECORDED:
        pytest.skip("no recorded breakable_graph run")
    path = _copy(RECORDED[-1], tmp_path, lambda df: _drop_variant(df, "after", "c_hit_rate"))
    assert cli.main(["verify", str(path)]) == 1
    assert "could not evaluate" in capsys.readouterr().out


M3 = [p for p in RECORDED if json.loads(p.with_suffix(".json").read_text()).get("method_version", 1) >= 3]


def test_the_trace_claim_reads_the_events_sidecar(tmp_path, capsys):
    if not M3:
        pytest.skip("no recorded breakable_graph run of method 3 yet")
    import gzip

    path = _copy(M3[-1], tmp_path, lambda df: df)
    m = json.loads(path.with_suffix(".json").read_text())
    ev_path = tmp_path / m["sidecars"]["events"]
    lines = gzip.decompress(ev_path.read_bytes()).decode().splitlines()
    kept = [ln for ln in lines if not ("cudaGraphLaunch" in ln and ",after," in ln)][: len(lines)]
    ev_path.write_bytes(gzip.compress(("\n".join(kept) + "\n").encode()))
    assert cli.main(["verify", str(path)]) == 1
    assert "FAIL breakable_graph.trace_3_requests" in capsys.readouterr().out
