"""The per-fix source checks on small synthetic SGLang trees shaped like the real releases: every
state of every check is reached, each verdict carries its reason, and the same checks read a folder
on disk."""

from __future__ import annotations

import textwrap

import pytest

from sglab.sglang import upstream
from sglab.tools.fixes import FIXES, NAMES, get
from sglab.sglang.upstream import RELEASE_STATES, STATES, Verdict
from sglab.sglang import checks
from sglab.sglang import source as S


def state(check, files: dict) -> Verdict:
    v = check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


# -- #26382 A
# --------------------------------------------------------------------------------------------------
KIMI_HEAD = """
class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = DeepseekV3ForCausalLM(config.text_config)
"""
KIMI = {"no_alias": KIMI_HEAD,
        "plain_alias": KIMI_HEAD + "        self.model = self.language_model.model\n",
        "property": KIMI_HEAD
        + "\n    @property\n    def model(self):\n        return self.language_model\n",}
KIMI["guard"] = KIMI["property"] + ("\n    def __setattr__(self, name, value):\n        if name == "
                                    "\"model\":\n" "            return\n        "
                                    "super().__setattr__(name, value)\n")


@pytest.mark.parametrize("shape,status,words",
                         [("no_alias", "before", "not a language model"),
                          ("plain_alias", "before", "self.language_model.model"),
                          ("property", "before", "without the __setattr__ guard"),
                          ("guard", "pr-era", "registered once")])
def test_pcg_gate_states(shape, status, words):
    v = state(checks.pcg_gate, {checks.KIMI_MODEL: KIMI[shape]})
    assert v.status == status and words in v.detail


def test_pcg_gate_absent_and_unknown():
    assert state(checks.pcg_gate, {}).status == "absent"
    assert state(checks.pcg_gate,
                 {checks.KIMI_MODEL: "class Other:\n    pass\n"}).status == "unknown"


# -- #26382 B
# --------------------------------------------------------------------------------------------------
def _layernorm(kwarg: str) -> dict:
    return {checks.LAYERNORM: f"""
def _forward_with_allreduce_fusion(norm_module, x, residual, weight):
    fused_result = flashinfer_allreduce_residual_rmsnorm(
        input_tensor=x, residual=residual, weight=weight, {kwarg}use_attn_tp_group=True)
    return fused_result
""", "srt/layers/flashinfer_comm_fusion.py": """
def flashinfer_allreduce_residual_rmsnorm(input_tensor, residual, weight, eps=1e-6, max_token_num: int = 2048):
    assert input_tensor.shape[0] <= max_token_num
"""}


@pytest.mark.parametrize("kwarg,status,words", [
    ("", "before", "default max_token_num=2048 applies and it asserts"),
    ("max_token_num=max(x.shape[0], 2048), ", "pr-era", "max(x.shape[0], 2048)"),
    ("max_token_num=max(x.shape[0], 4096), ", "changed", "other than the PR's 2048"),
    ("max_token_num=x.shape[0], ", "unknown", "x.shape[0]")])
def test_workspace_floor_states(kwarg, status, words):
    v = state(checks.workspace_floor, _layernorm(kwarg))
    assert v.status == status and words in v.detail


def test_workspace_floor_absent():
    assert state(checks.workspace_floor, {}).status == "absent"
    v = state(checks.workspace_floor, {checks.LAYERNORM: "def rms_norm(x):\n    return x\n"})
    assert v.status == "absent" and "does not call" in v.detail
    assert state(checks.workspace_floor, {checks.LAYERNORM: "def broken(:\n"}).status == "unknown"


# -- #24662
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


@pytest.mark.parametrize("files,status",
                         [({}, "absent"),
                          ({checks.BREAKABLE_RUNNER: "class BreakableCudaGraphRunner:" + REJECT},
                           "before"),
                          ({checks.BREAKABLE_RUNNER: "class BreakableCudaGraphRunner:" + SWAP},
                           "pr-era"),
                          ({checks.PREFILL_RUNNER: "class PrefillCudaGraphRunner:" + SWAP},
                           "changed"),
                          ({checks.PREFILL_RUNNER: "class PrefillCudaGraphRunner:"
                            + REJECT.replace("can_run", "can_run_graph")}, "regressed"),
                          ({checks.BREAKABLE_RUNNER: "class BreakableCudaGraphRunner:\n    pass\n"},
                           "unknown"),
                          ({checks.BREAKABLE_RUNNER: "class Other:\n    pass\n"}, "unknown")])
def test_breakable_graph_states(files, status):
    assert state(checks.breakable_graph, files).status == status


# -- #22858 -----------------------------------------------------------------------------------------------------
def _processor(build: str, ret: str, move: bool) -> dict:
    moved = "        grid_thws = grid_thws.cpu()\n" if move else ""
    return {checks.KIMI_PROCESSOR: f"""
def _gpu_preprocess_images(images):
    all_grids = [image_grid(im) for im in images]
    grid_thws = {build}
    return pixels(images), grid_thws

class KimiGPUProcessorWrapper:
    def _gpu_call(self, text, images):
        pixel_values, grid_thws = _gpu_preprocess_images(images)
{moved}        return {{"input_ids": ids(text), "pixel_values": pixel_values, "{ret}": grid_thws}}
"""}


@pytest.mark.parametrize("build,ret,move,status", [
    ("torch.stack(all_grids, dim=0)", "grid_thws", False, "before"),
    ("torch.stack(all_grids, dim=0)", "image_grid_thw", True, "pr-era"),
    ("torch.tensor(all_grids, dtype=torch.int64)", "image_grid_thw", False, "changed"),
    ("torch.stack(all_grids, dim=0)", "image_grid_thw", False, "regressed"),
    ("torch.stack(all_grids, dim=0)", "grids", False, "unknown")])
def test_grid_thw_states(build, ret, move, status):
    assert state(checks.grid_thw, _processor(build, ret, move)).status == status


def test_grid_thw_absent():
    assert state(checks.grid_thw, {}).status == "absent"
    v = state(checks.grid_thw,
              {checks.KIMI_PROCESSOR: "class KimiK2_5VLImageProcessor:\n    pass\n"})
    assert v.status == "absent" and "KimiGPUProcessorWrapper._gpu_call" in v.detail


# -- every state reachable; the folder path; the verdict contract -----------------------------------------------
def test_every_release_state_is_reached_by_some_check():
    from sglab.capture_sizes import sglang as cs
    from sglab.swa_loc import sglang as swa
    from tests.swa_loc.test_sglang import POOL_LATER

    reached = {state(checks.pcg_gate, {}).status,
               state(checks.pcg_gate, {checks.KIMI_MODEL: KIMI["guard"]}).status,
               state(checks.pcg_gate, {checks.KIMI_MODEL: KIMI["no_alias"]}).status,
               state(swa.check, {swa.SWA_POOL: POOL_LATER}).status,
               state(cs.check, {cs.PREFILL_RUNNER: "class PrefillCudaGraphRunner:\n"
                                "    def __init__(self, r):\n"
                                "        self.capture_num_tokens = sorted(r.sizes)\n"}).status,
               state(checks.pcg_gate, {checks.KIMI_MODEL: "class Other:\n    pass\n"}).status,}
    assert reached == set(RELEASE_STATES)
    assert set(STATES) == set(RELEASE_STATES) | {"not-installed"}


def test_checks_read_a_folder_on_disk(tmp_path):
    from sglab.capture_sizes import sglang as cs
    from tests.capture_sizes.test_sglang import PCG_PR

    for rel, text in {checks.KIMI_MODEL: KIMI["guard"], cs.PIECEWISE_RUNNER: PCG_PR}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert upstream.check(get("pcg_gate"), root=tmp_path).status == "pr-era"
    assert upstream.check(get("capture_sizes"), root=tmp_path).status == "pr-era"
    assert upstream.check(get("grid_thw"), root=tmp_path).status == "absent"
    frame = upstream.check_all(FIXES, root=tmp_path)
    assert list(frame["check"]) == list(NAMES) and frame["detail"].str.len().min() > 0
    v = upstream.check(get("pcg_gate"), root=tmp_path / "srt")  # a folder without srt/ in it: not an SGLang tree
    assert v.status == "unknown" and "not an SGLang package folder" in v.detail


def test_verdict_needs_a_known_state_and_a_one_line_reason():
    with pytest.raises(ValueError, match="must be one of"):
        Verdict("fix", "old vocabulary")
    for bad in ("", "   ", "two\nlines"):
        with pytest.raises(ValueError, match="one-line reason"):
            Verdict("unknown", bad)
    assert str(Verdict("before", "why")) == "before: why" and Verdict("before",
                                                                      "why").reason == "why"


def test_a_raising_check_answers_unknown_with_the_error(monkeypatch):
    def boom(read):
        raise RuntimeError("cannot read\nthis")

    from sglab.sglang.fix import Fix

    v = upstream.run_check(Fix("boom", "99", "raises", (1,), 0, boom), {}.get)
    assert v.status == "unknown" and "RuntimeError: cannot read this" in v.detail
    with pytest.raises(ValueError, match="unknown fix"):
        get("no_such_fix")
    if upstream.installed() is None:
        assert upstream.check(get("pcg_gate")).status == "not-installed"


def test_source_helpers_find_symbols_by_name():
    src = textwrap.dedent("""
        class A:
            @property
            def model(self):
                return 1

            class Inner:
                def f(self):
                    pass
        def g():
            return A().model
        """)
    assert S.symbol_text(src, "A.model") == "@property\ndef model(self):\n    return 1\n"
    assert S.symbol_text(src, "A.Inner.f").startswith("def f(self):")
    assert S.symbol_text(src, "A.nope") is None and S.symbol_text(None, "g") is None
    assert S.parse("def broken(:") is None and S.find(None, "g") is None
    assert len(S.calls(S.find(S.parse(src), "g"), "A")) == 1
