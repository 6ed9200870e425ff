"""04's harness adjustment for the real engine (``sglab.swa_loc.sglang.PRESET_REVERTED``): it
removes exactly #23552's hunk from the released 0.5.11 source, and refuses a release without it."""

from __future__ import annotations

import pytest

from sglab.sglang import engine as eng
from sglab.sglang import testing
from sglab.swa_loc.sglang import PRESET_REVERTED


RUNNER = "srt/model_executor/cuda_graph_runner.py"


def test_the_revert_removes_exactly_the_prs_hunk():
    adj = PRESET_REVERTED
    params = eng.patch_params(adj)
    text = params["text"]
    assert "set_swa_loc" in text and text.startswith("    # swa_loc must be set before capture")
    fn = testing.function_source((testing.package("0.5.11") / RUNNER).read_text(),
                                 "CudaGraphRunner.capture_one_batch_size")
    new = eng.reverted_source({**params, "name": adj.name}, fn)
    assert "set_swa_loc" not in new
    assert len(fn.splitlines()) - len(new.splitlines()) == len(text.splitlines())
    compile(new, "reverted", "exec")
    # 0.5.12.post1 has the hunk too (changed by #24743), 0.5.13 has none: the revert refuses
    # instead of guessing
    with pytest.raises(ValueError, match="0 times"):
        eng.remove_text(
            testing.function_source((testing.package("0.5.13") / RUNNER).read_text(),
                                    "CudaGraphRunner.capture_one_batch_size"), text, "x")


def test_the_reason_names_the_case_as_the_tables_label_it():
    """The harness note under the engine section names the reverted case by the label its tables
    show (the case's label), not by another."""
    from sglab.swa_loc.sglang import ENGINE

    reverted = [c.label for s in ENGINE for c in s.cases if PRESET_REVERTED in c.adjustments]
    assert reverted == ["before"]
    assert "the case 'before' in the tables" in PRESET_REVERTED.reason
    assert "labelled" not in PRESET_REVERTED.reason
