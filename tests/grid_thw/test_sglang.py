"""The Kimi-K2.5 grid in real SGLang (#22858), against ``sglab.grid_thw.rebuild``: the source check
on synthetic trees, the released model, GPU preprocessor and wire, and the notebook's comparison.
(What a rank holds on GPU 0 is the real engine's record, ``engine_grid_thw``: no GPU probe.)

Releases: 0.5.10.post1 (the model reads ``grid_thws``; CPU HF processor only), 0.5.11 (the PR:
``image_grid_thw``, ``.cpu()`` in the GPU preprocessor; pickle wire), 0.5.23 (reads either key;
msgpack wire that records the device).
"""

import pytest

from sglab.grid_thw import rebuild as fx
from sglab.grid_thw import sglang
from sglab.sglang import compare
from sglab.sglang.runner import run_probe
from sglab.sglang.testing import require
from sglab.sglang.upstream import RELEASE_STATES, Verdict


RELEASES = sglang.PROBE_RELEASES
REAL_CALLS = ["grid_thw"]  # the notebook's call (conftest)


# --------------------------------------------------------------------------------------------------
# the source check
# --------------------------------------------------------------------------------------------------
def state(files: dict) -> Verdict:
    v = sglang.check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


def _processor(build: str, ret: str, move: bool) -> dict:
    moved = "        grid_thws = grid_thws.cpu()\n" if move else ""
    return {
        sglang.KIMI_PROCESSOR: f"""
def _gpu_preprocess_images(images):
    all_grids = [image_grid(im) for im in images]
    grid_thws = {build}
    return pixels(images), grid_thws

class KimiGPUProcessorWrapper:
    def _gpu_call(self, text, images):
        pixel_values, grid_thws = _gpu_preprocess_images(images)
{moved}        return {{"input_ids": ids(text), "pixel_values": pixel_values, "{ret}": grid_thws}}
"""
    }


@pytest.mark.parametrize("build,ret,move,status", [
    ("torch.stack(all_grids, dim=0)", "grid_thws", False, "before"),
    ("torch.stack(all_grids, dim=0)", "image_grid_thw", True, "pr-era"),
    ("torch.tensor(all_grids, dtype=torch.int64)", "image_grid_thw", False, "changed"),
    ("torch.stack(all_grids, dim=0)", "image_grid_thw", False, "regressed"),
    ("torch.stack(all_grids, dim=0)", "grids", False, "unknown")
])
def test_check_states(build, ret, move, status):
    assert state(_processor(build, ret, move)).status == status


def test_check_absent():
    assert state({}).status == "absent"
    v = state({sglang.KIMI_PROCESSOR: "class KimiK2_5VLImageProcessor:\n    pass\n"})
    assert v.status == "absent" and "KimiGPUProcessorWrapper._gpu_call" in v.detail


def test_the_record():
    from sglab.tools.fixes import NAMES, get

    assert "grid_thw" in NAMES and get("grid_thw") is sglang.FIX
    assert sglang.FIX.probe.fn == "sglab.grid_thw.sglang:probe"
    # no GPU probe: the engine scenarios record each process's memory on GPU 0
    assert getattr(sglang.FIX, "gpu", None) is None
    assert [s.name for s in sglang.FIX.engine
            ] == ["05-grid-thw", "05-grid-thw-tp4", "05-grid-thw-tp8"]


# --------------------------------------------------------------------------------------------------
# the released code on the CPU
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real():
    return compare.answers(sglang.FIX)


def reads(result, key):
    return compare.facts(result, part="model", case=key)["reads_grid"]


@pytest.mark.parametrize("release, keys", [("0.5.10.post1", {"grid_thws"}),
                                           ("0.5.11", {"image_grid_thw"}),
                                           ("0.5.23", {"grid_thws", "image_grid_thw"})])
def test_which_key_the_released_model_reads(real, release, keys):
    r = require(real[release])
    assert {k for k in ("grid_thws", "image_grid_thw") if reads(r, k)} == keys


def test_rebuild_keys_match_the_releases_on_either_side(real):
    images = [fx.synthetic_image(0)] * 2
    before = fx.grid_key(fx.gpu_call(fx.prompt_for(2), images, fixed=False, device="cpu"))
    after = fx.grid_key(fx.gpu_call(fx.prompt_for(2), images, fixed=True, device="cpu"))
    assert (before, after) == ("grid_thws", "image_grid_thw")
    r0510, r0511 = require(real["0.5.10.post1"]), require(real["0.5.11"])
    assert reads(r0510, before) and not reads(r0510, after)
    assert reads(r0511, after) and not reads(r0511, before)


def test_0511_gpu_preprocessor_on_the_cpu_equals_the_rebuild_after(real):
    p = compare.facts(require(real["0.5.11"]), part="processor")
    want = fx.gpu_call(fx.prompt_for(3), [fx.synthetic_image(i) for i in range(3)], fixed=True,
                       device="cpu")
    assert p["keys"] == sorted(want) == ["image_grid_thw", "input_ids", "pixel_values"]
    assert p["grid"] == want["image_grid_thw"].tolist()
    assert p["grid_dtype"] == "int64" and p["grid_device"] == "cpu"
    assert p["pixel_values_match_rebuild"] is True
    assert p["image_tokens"] == int((want["input_ids"] == fx.IMAGE_TOKEN_ID).sum())


def test_0510_has_no_gpu_preprocessor(real):
    assert compare.facts(require(real["0.5.10.post1"]), part="processor")["exists"] is False


@pytest.mark.parametrize("release, wire", [("0.5.11", "pickle"), ("0.5.23", "msgpack")])
def test_the_release_wire_keeps_device_dtype_shape_and_records_the_device(real, release, wire):
    r = require(real[release])
    for key in ("grid_thws", "image_grid_thw"):
        w = compare.facts(r, part="wire", case=key)
        assert w["wire"].startswith(wire) and w["item_class"] == "MultimodalDataItem"
        assert w["key_kept"]
        assert w["device_received"] == w["device_sent"] == w["device_recorded_on_wire"]
        assert w["dtype_kept"] and w["shape_kept"] and w["values_kept"]


def test_the_section_table_agrees_and_a_wrong_variant_fails(real, capsys):
    results = {v: require(real[v]) for v in RELEASES}
    table = sglang.comparison(results)
    assert list(table.release) == list(RELEASES)
    assert compare.check_table(table), table[~table.agrees].to_string()
    bad = sglang.comparison({"0.5.11": results["0.5.11"]}, variant_of={"0.5.11": "before"})
    assert not compare.check_table(bad)
    assert "model reads it: real False, rebuild True" in capsys.readouterr().out


def test_a_missing_release_is_left_out_and_says_why():
    results = {"0.5.9": run_probe("0.5.9", sglang.FIX.probe.fn)}
    assert len(sglang.comparison(results, variant_of={"0.5.9": "before"})) == 0
    assert "sglang 0.5.9: not run: not installed" in compare.status_lines(results)


@pytest.mark.gpu
def test_a_cuda_grid_comes_back_on_cuda_over_the_msgpack_wire():
    """On a GPU box: the grid on cuda:0 arrives on cuda:0 (the wire records the device)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = require(run_probe("0.5.23", sglang.FIX.probe.fn, {"device": "cuda:0"}))
    w = compare.facts(r, part="wire", case="image_grid_thw")
    assert w["device_sent"] == w["device_received"] == w["device_recorded_on_wire"] == "cuda:0"


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases
    say now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(real, sglang.FIX.probe.fn) == len(RELEASES)
