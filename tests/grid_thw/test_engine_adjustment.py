"""05's harness adjustments for the real engine: #22858's line is in 0.5.11 and the revert removes
only it; the stand-in processor, handed to the released 0.5.11 through its own `get_processor`,
drives its own Kimi-K2.5 image path on the CPU (the media tokens at the config's ids, the image
expanded to the rebuild's token count, the grid the rebuild computes)."""

from __future__ import annotations

import json

import pytest

from sglab.grid_thw import rebuild, stand_in
from sglab.grid_thw.sglang import ENGINE, GRID_ON_CUDA0
from sglab.sglang import engine as eng
from sglab.sglang import testing
from sglab.core.runs import repo_root


CONFIG = repo_root() / "data" / "models" / "kimi_k25_tiny" / "config.json"


def test_the_revert_removes_only_the_grids_cpu_line_in_0_5_11():
    src = (testing.package("0.5.11") / "srt/multimodal/processors/kimi_k25.py").read_text()
    fn = testing.function_source(src, "KimiGPUProcessorWrapper._gpu_call")
    new = eng.reverted_source({**GRID_ON_CUDA0.param_dict(), "name": GRID_ON_CUDA0.name}, fn)
    assert ".cpu()" not in new and "grid_thws" in new
    assert len(fn.splitlines()) - len(new.splitlines()) == 1


def test_the_media_tokens_take_the_ids_below_the_placeholder(tmp_path):
    cfg = json.loads(CONFIG.read_text())
    ids = stand_in.media_token_ids(cfg)
    assert ids["<|media_pad|>"] == cfg["media_placeholder_token_id"] == 31999
    assert sorted(ids.values()) == [31996, 31997, 31998, 31999]
    folder = eng.prepare_model(CONFIG, tmp_path / "model")
    tok = stand_in.tokenizer_json(folder, cfg)
    assert {t: tok["model"]["vocab"][t] for t in ids} == ids and len(tok["model"]["vocab"]) == 32000
    assert {a["content"] for a in tok["added_tokens"]} >= set(ids)


def test_both_cases_start_the_stand_in_and_the_dummy_weight_fix():
    for spec in ENGINE[0].specs():
        names = [a.name for a in eng.with_model_needs(spec, lambda _: None).adjustments]
        assert names[0] == stand_in.PROCESSOR.name and "kimi-k25-post-load-weights" in names
        assert (GRID_ON_CUDA0.name in names) == (spec.case == "before")


STAND_IN = ("tests.grid_thw.stand_in_probe:probe",
            {"config": str(CONFIG), "prompt": ENGINE[0].prompt})
# 0.5.11: 05's engine; 0.5.13: 01's full-width server, whose tokenizer manager builds the same
# processor at start-up (answered by the test session: conftest)
STAND_IN_RELEASES = ("0.5.11", "0.5.13")
REAL_CALLS = [(*STAND_IN, STAND_IN_RELEASES)]


@pytest.fixture(scope="module", params=STAND_IN_RELEASES)
def answer(request):
    return testing.require(testing.probe_one(request.param, *STAND_IN))


def test_the_release_takes_the_stand_in_through_its_own_get_processor(answer):
    v = lambda m: testing.value(answer, metric=m)  # noqa: E731
    assert v("processor") == "Processor" and v("image_token_id") == 31999
    assert v("image_tokens") == v("expected_image_tokens") > 0
    assert v("media_token_ids") == [31996, 31997, 31998] and v("max_id") < v("vocab_size")
    # the media tokens are matched whole, the rest split on whitespace (words outside the
    # tokenizer's t4..t31995 are <unk>)
    assert v("tokenized") == [31996, 0, 31997, 31999, 31998, 7] and v("tokenizer_size") == 32000
    image = rebuild.synthetic_image(0)
    want = rebuild.navit_resize_config(image.shape[2], image.shape[1])
    assert v("grid")[0][0] == 1 and v("grid_device") == "cpu" and v("pixel_values_finite")
    assert v("grid")[0][1] * v("grid")[0][2] == want["num_tokens"] * rebuild.MERGE_KERNEL_SIZE**2
