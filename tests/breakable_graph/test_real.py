"""The real breakable-CUDA-graph runner's routing (#24662), against ``sglab.fixes.breakable_graph``; and the
agreement table and recorded-run hook of :mod:`sglab.sglang.compare` that notebooks 01, 03 and 05 show.

One worker per release (module fixture): 0.5.10.post1 (no breakable runner), 0.5.11 (before: bs=1 capture with
the logits tail, multi-request prefill rejected), 0.5.12.post1 and 0.5.13 (after: the layer stack only).
"""

import pandas as pd
import pytest

from sglab.core import runs
from sglab.experiments.breakable_graph import real as exp_real
from sglab.fixes import breakable_graph as bg
from sglab.sglang import compare_old as compare, run_probe
from sglab.sglang.probes import breakable_graph as probe
from sglab.sglang.testing import probe_all, require

RELEASES = exp_real.RELEASES
REAL_CALLS = ["breakable_graph"]  # the notebook's call (conftest)


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, "breakable_graph:run")


def can_run(result, shape, label):
    df = result.rows
    hit = df[(df.model == shape) & (df.batch == label) & (df.metric == "can_run")]
    assert len(hit) == 1, (shape, label)
    return hit["value"].iloc[0]


def test_0511_rejects_a_multi_request_prefill_like_the_rebuild_before(real):
    r = require(real["0.5.11"])
    assert can_run(r, "causal_lm", exp_real.MULTI) is False
    assert can_run(r, "causal_lm", "1 request (30)") is True
    runner = bg.BreakableGraphRunner(bg.build_model(), boundary=bg.BEFORE, capture_num_tokens=probe.CAPTURE_TOKENS,
                                     max_bs=probe.MAX_BS, capture=False)
    assert runner.can_run(bg.BatchShape((10, 12, 10))) is False
    for shape in bg.MODEL_SHAPES:
        assert exp_real.real_facts(r, shape) == exp_real.rebuild_facts(bg.BEFORE, shape), shape


@pytest.mark.parametrize("release", ["0.5.12.post1", "0.5.13"])
def test_after_serves_a_multi_request_prefill_like_the_rebuild_after(real, release):
    r = require(real[release])
    assert can_run(r, "causal_lm", exp_real.MULTI) is True
    assert can_run(r, "causal_lm", "8 requests (8×6)") is True
    assert can_run(r, "causal_lm", "over the largest bucket (50+50)") is False
    for shape in bg.MODEL_SHAPES:
        assert exp_real.real_facts(r, shape) == exp_real.rebuild_facts(bg.AFTER, shape), shape


def test_layer_stack_and_its_failure_warning(real):
    r = require(real["0.5.12.post1"])
    f = {s: exp_real.real_facts(r, s) for s in bg.MODEL_SHAPES}
    assert f["causal_lm"]["layer_model"] == "model"
    assert f["vlm_language_model"]["layer_model"] == "language_model.model"
    for shape in ("no_model_layers", "nested_wrapper"):
        assert f[shape]["layer_model"] is None
        assert f[shape]["warnings"][0].startswith("[BCG] Could not resolve inner layer_model")
        assert not any(f[shape][f"can_run · {b}"] for b in probe.BATCHES)


@pytest.mark.parametrize("release, reads_static", [("0.5.11", True), ("0.5.12.post1", False)])
def test_capture_batch_reads_a_static_per_request_buffer_only_before(real, release, reads_static):
    r = require(real[release])
    assert compare.facts(r, model="causal_lm", batch="")["capture_reads_static_bs_buffer"] is reads_static
    assert exp_real.rebuild_facts(exp_real.VARIANT_OF[release], "causal_lm")[
        "capture_reads_static_bs_buffer"] is reads_static


def test_0510_has_no_breakable_runner(real):
    r = require(real["0.5.10.post1"])
    assert compare.facts(r)["runner_file"] is None


def test_agreement_table_passes_and_a_wrong_variant_fails(real):
    results = {v: require(real[v]) for v in ("0.5.11", "0.5.12.post1")}
    checks = exp_real.checks(results)
    assert compare.status(checks) == "pass" and [c.agrees for c in checks] == [True, True]
    # the same real rows against the wrong rebuild variant must be caught, fact by fact
    bad = exp_real.checks({"0.5.11": results["0.5.11"]}, variant_of={"0.5.11": bg.AFTER})
    assert compare.status(bad) == "fail" and bad[0].agrees is False
    text = compare.summary(bad, exp_real.CLAIM)
    assert text.startswith("MISMATCH") and f"causal_lm · can_run · {exp_real.MULTI}" in text


def test_a_missing_release_is_not_run_with_its_reason():
    result = run_probe("0.5.9", "breakable_graph:run")
    assert result.status == "not-run"
    (check,) = exp_real.checks({"0.5.9": result})
    assert check.agrees is None and check.behaviour.startswith("not run: sglang 0.5.9: not installed")
    assert compare.status([check]) == "n/a"
    assert compare.table([check]).loc["0.5.9", "agrees"] == "n/a"


def test_recorded_hook_says_not_recorded_then_shows_the_newest_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_DATA", str(tmp_path))
    assert compare.show_recorded("breakable_graph") is False
    assert "not recorded yet" in capsys.readouterr().out
    df = runs.tidy("real_breakable_graph", [
        {"variant": "eager_vs_graph", "release": "0.5.23", "metric": "max_abs_diff", "value": 0.0, "unit": "1"}])
    runs.write_run(df, experiment="real_breakable_graph", method_version=1, root=tmp_path / "recorded",
                   params={"releases": ["0.5.23"], "shims": {"0.5.23": ["sgl_kernel"]}})
    run = compare.recorded("breakable_graph")
    assert run is not None and list(run.df["release"]) == ["0.5.23"]
    assert any("sgl_kernel" in line for line in compare.recorded_lines(run))
    assert isinstance(compare.recorded_table(run), pd.DataFrame)


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases say now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(real, "breakable_graph:run") == len(RELEASES)
