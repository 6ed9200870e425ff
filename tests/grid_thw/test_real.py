"""A real ``MultimodalDataItem`` with Kimi-K2.5's grid over SGLang's own wire (#22858), against
``sglab.fixes.grid_thw``.

Releases: 0.5.10.post1 (the model reads ``grid_thws``; CPU HF processor only), 0.5.11 (the PR: ``image_grid_thw``,
``.cpu()`` in the GPU preprocessor; pickle wire), 0.5.23 (reads either key; msgpack wire that records the device).
"""

import pytest

from sglab.experiments.grid_thw import real as exp_real
from sglab.fixes import grid_thw as fx
from sglab.sglang import compare_old as compare, run_probe
from sglab.sglang.testing import probe_all, require

RELEASES = exp_real.RELEASES
REAL_CALLS = ["grid_thw"]  # the notebook's call (conftest)


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, "grid_thw:run")


def reads(result, key):
    return compare.facts(result, part="model", case=key)["reads_grid"]


@pytest.mark.parametrize("release, keys", [("0.5.10.post1", {"grid_thws"}), ("0.5.11", {"image_grid_thw"}),
                                           ("0.5.23", {"grid_thws", "image_grid_thw"})])
def test_which_key_the_released_model_reads(real, release, keys):
    r = require(real[release])
    assert {k for k in ("grid_thws", "image_grid_thw") if reads(r, k)} == keys


def test_rebuild_keys_match_the_releases_on_either_side(real):
    before = fx.grid_key(fx.gpu_call(fx.prompt_for(2), [fx.synthetic_image(0)] * 2, fixed=False, device="cpu"))
    after = fx.grid_key(fx.gpu_call(fx.prompt_for(2), [fx.synthetic_image(0)] * 2, fixed=True, device="cpu"))
    assert (before, after) == ("grid_thws", "image_grid_thw")
    assert reads(require(real["0.5.10.post1"]), before) and not reads(require(real["0.5.10.post1"]), after)
    assert reads(require(real["0.5.11"]), after) and not reads(require(real["0.5.11"]), before)


def test_0511_gpu_preprocessor_on_the_cpu_equals_the_rebuild_after(real):
    p = compare.facts(require(real["0.5.11"]), part="processor")
    want = fx.gpu_call(fx.prompt_for(3), [fx.synthetic_image(i) for i in range(3)], fixed=True, device="cpu")
    assert p["keys"] == sorted(want) == ["image_grid_thw", "input_ids", "pixel_values"]
    assert p["grid"] == want["image_grid_thw"].tolist() and p["grid_dtype"] == "int64" and p["grid_device"] == "cpu"
    assert p["pixel_values_match_rebuild"] is True
    assert p["image_tokens"] == int((want["input_ids"] == fx.IMAGE_TOKEN_ID).sum())


def test_0510_has_no_gpu_preprocessor(real):
    assert compare.facts(require(real["0.5.10.post1"]), part="processor")["exists"] is False


@pytest.mark.parametrize("release, wire", [("0.5.11", "pickle"), ("0.5.23", "msgpack")])
def test_the_release_wire_keeps_device_dtype_shape_and_records_the_device(real, release, wire):
    r = require(real[release])
    for key in ("grid_thws", "image_grid_thw"):
        w = compare.facts(r, part="wire", case=key)
        assert w["wire"].startswith(wire) and w["item_class"] == "MultimodalDataItem" and w["key_kept"]
        assert w["device_received"] == w["device_sent"] == w["device_recorded_on_wire"]
        assert w["dtype_kept"] and w["shape_kept"] and w["values_kept"]


def test_notebook_agreement_table_passes_and_a_wrong_variant_fails(real):
    results = {v: require(real[v]) for v in RELEASES}
    assert compare.status(exp_real.checks(results)) == "pass"
    bad = exp_real.checks({"0.5.11": results["0.5.11"]}, variant_of={"0.5.11": "before"})
    assert compare.status(bad) == "fail"
    assert "model reads it: real False, rebuild True" in compare.summary(bad, exp_real.CLAIM)


def test_a_missing_release_is_a_not_run_row():
    (check,) = exp_real.checks({"0.5.9": run_probe("0.5.9", "grid_thw:run")})
    assert check.agrees is None and check.behaviour.startswith("not run: sglang 0.5.9: not installed")


@pytest.mark.gpu
def test_a_cuda_grid_comes_back_on_cuda_over_the_msgpack_wire():
    """On a GPU box: the grid on cuda:0 arrives on cuda:0 (the wire records the device), as #22858 says."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = require(run_probe("0.5.23", "grid_thw:run", {"device": "cuda:0"}))
    w = compare.facts(r, part="wire", case="image_grid_thw")
    assert w["device_sent"] == w["device_received"] == w["device_recorded_on_wire"] == "cuda:0"


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases say now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(real, "grid_thw:run") == len(RELEASES)
