"""The real breakable-CUDA-graph runner's routing (#24662), against
``sglab.breakable_graph.rebuild``; the comparison the notebook shows; the source check.

One worker per release: 0.5.10.post1 (no breakable runner), 0.5.11 (before: bs=1 capture with the
logits tail, multi-request prefill rejected), 0.5.12.post1 and 0.5.13 (after: the layer stack
only).
"""

import pytest

from sglab.breakable_graph import rebuild as bg
from sglab.breakable_graph import sglang
from sglab.sglang import compare
from sglab.sglang.runner import run_probe
from sglab.sglang.testing import require
from sglab.sglang.upstream import RELEASE_STATES, Verdict


RELEASES = sglang.PROBE_RELEASES
REAL_CALLS = ["breakable_graph"]  # the notebook's call (conftest)


@pytest.fixture(scope="module")
def real():
    return compare.answers(sglang.FIX)


def can_run(result, shape, label):
    df = result.rows
    hit = df[(df.model == shape) & (df.batch == label) & (df.metric == "can_run")]
    assert len(hit) == 1, (shape, label)
    return hit["value"].iloc[0]


def test_0511_rejects_a_multi_request_prefill_like_the_rebuild_before(real):
    r = require(real["0.5.11"])
    assert can_run(r, "causal_lm", sglang.MULTI) is False
    assert can_run(r, "causal_lm", sglang.ONE) is True
    runner = bg.BreakableGraphRunner(bg.build_model(), boundary=bg.BEFORE,
                                     capture_num_tokens=sglang.CAPTURE_TOKENS, max_bs=sglang.MAX_BS,
                                     capture=False)
    assert runner.can_run(bg.BatchShape((10, 12, 10))) is False
    for shape in bg.MODEL_SHAPES:
        assert sglang.real_facts(r, shape) == sglang.rebuild_facts(bg.BEFORE, shape), shape


@pytest.mark.parametrize("release", ["0.5.12.post1", "0.5.13"])
def test_after_serves_a_multi_request_prefill_like_the_rebuild_after(real, release):
    r = require(real[release])
    assert can_run(r, "causal_lm", sglang.MULTI) is True
    assert can_run(r, "causal_lm", "8 requests (8×6)") is True
    assert can_run(r, "causal_lm", "over the largest bucket (50+50)") is False
    for shape in bg.MODEL_SHAPES:
        assert sglang.real_facts(r, shape) == sglang.rebuild_facts(bg.AFTER, shape), shape


def test_layer_stack_and_its_failure_warning(real):
    r = require(real["0.5.12.post1"])
    f = {s: sglang.real_facts(r, s) for s in bg.MODEL_SHAPES}
    assert f["causal_lm"]["layer_model"] == "model"
    assert f["vlm_language_model"]["layer_model"] == "language_model.model"
    for shape in ("no_model_layers", "nested_wrapper"):
        assert f[shape]["layer_model"] is None
        assert f[shape]["warnings"][0].startswith("[BCG] Could not resolve inner layer_model")
        assert not any(f[shape][f"can_run · {b}"] for b in sglang.BATCHES)


@pytest.mark.parametrize("release, reads_static", [("0.5.11", True), ("0.5.12.post1", False)])
def test_capture_batch_reads_a_static_per_request_buffer_only_before(real, release, reads_static):
    r = require(real[release])
    assert compare.facts(r, model="causal_lm",
                         batch="")["capture_reads_static_bs_buffer"] is reads_static
    assert sglang.rebuild_facts(sglang.VARIANT_OF[release],
                                "causal_lm")["capture_reads_static_bs_buffer"] is reads_static


def test_each_release_names_a_variant_of_the_rebuild():
    assert set(sglang.VARIANT_OF.values()) == {bg.BEFORE, bg.AFTER}
    assert sglang.VARIANT_OF["0.5.11"] == bg.BEFORE


def test_0510_has_no_breakable_runner(real):
    r = require(real["0.5.10.post1"])
    assert compare.facts(r)["runner_file"] is None


def test_the_section_table_agrees_everywhere_and_a_wrong_variant_fails(real):
    for v in RELEASES:
        require(real[v])
    table = sglang.comparison(real)
    assert list(dict.fromkeys(table.release)) == list(RELEASES)
    assert len(table) == 1 + 3 * len(bg.MODEL_SHAPES)
    assert compare.check_table(table), table[~table.agrees].to_string()
    # the same real rows against the wrong rebuild variant must be caught, fact by fact
    bad = sglang.comparison({"0.5.11": real["0.5.11"]}, variant_of={"0.5.11": bg.AFTER})
    assert not bad.agrees.any()
    row = bad.set_index("behaviour").loc["causal_lm: routing and layer stack"]
    assert f"can_run · {sglang.MULTI}: real False, rebuild True" in row.differences


def test_a_missing_release_is_not_run_with_its_reason():
    result = run_probe("0.5.9", sglang.FIX.probe.fn)
    assert result.status == "not-run" and result.reason.startswith("sglang 0.5.9: not installed")
    assert len(sglang.comparison({"0.5.9": result})) == 0


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases say
    now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(real, sglang.FIX.probe.fn) == len(RELEASES)


def test_the_engine_checks_the_replay_and_no_gpu_probe_is_left():
    """One instrument per question: the engine scenario runs the released graph; no GPU probe of
    this fix is left beside it."""
    assert getattr(sglang.FIX, "gpu", None) is None and sglang.FIX.engine
    assert not any(hasattr(sglang, f) for f in ("gpu_probe", "gpu_tables", "gpu_recorded"))


# -- the source check, on small synthetic SGLang trees shaped like the releases
# --------------------------------------------------------------------------------------------------
SWAP = """
    def __init__(self, model_runner):
        language_model = getattr(model_runner.model, "language_model", model_runner.model)
        self.layer_model = language_model.model

    def replay(self, forward_batch):
        def replay_layer_forward(*args, **kwargs):
            return self.graph.replay()
        self.layer_model.forward = replay_layer_forward
"""
REJECT = """
    def can_run(self, forward_batch):
        if forward_batch.batch_size > 1:
            return False
        return True
"""
RUNNER, PREFILL = sglang.RUNNER_FILE, sglang.PREFILL_RUNNER


@pytest.mark.parametrize("files,status", [
    ({}, "absent"), ({RUNNER: "class BreakableCudaGraphRunner:" + REJECT}, "before"),
    ({RUNNER: "class BreakableCudaGraphRunner:" + SWAP}, "pr-era"),
    ({PREFILL: "class PrefillCudaGraphRunner:" + SWAP}, "changed"),
    ({PREFILL: "class PrefillCudaGraphRunner:" + REJECT.replace("can_run", "can_run_graph")
      }, "regressed"), ({RUNNER: "class BreakableCudaGraphRunner:\n    pass\n"}, "unknown"),
    ({RUNNER: "class Other:\n    pass\n"}, "unknown")
])
def test_breakable_graph_states(files, status):
    v = sglang.check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    assert isinstance(v, Verdict) and v.status == status


def test_the_record_is_in_the_catalog():
    from sglab.tools.fixes import get

    assert get("breakable_graph") is sglang.FIX
    assert sglang.FIX.check is sglang.check


def test_the_code_path_names_functions_of_the_first_release_with_the_fix():
    from sglab.breakable_graph import claims
    from sglab.sglang import codepath
    from sglab.sglang.releases import release_installed

    assert {n.path for n in sglang.CODE_PATH} >= {sglang.RUNNER_FILE}
    if not release_installed(claims.AFTER_RELEASE):
        pytest.skip(f"sglang {claims.AFTER_RELEASE} not installed")
    lines = {n.symbol: codepath.line_of(claims.AFTER_RELEASE, n) for n in sglang.CODE_PATH}
    assert all(lines.values()), lines
