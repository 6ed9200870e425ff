"""The source checks: given ``read(relpath)`` over an SGLang package folder, which state is each fix
in?

One function per upstream change (each fix's record names its own), each answering one of
:data:`sglab.sglang.upstream.STATES` with a one-line reason. They read syntax (functions and classes
found by name with :mod:`ast`), never import SGLang, and never look at a version number: the same
function classifies an installed package, an unpacked wheel, a wheel read through zipfile, or a
checkout. ``before`` and ``regressed`` differ by the code around the missing fix: ``before`` is the
PR-era code without it, ``regressed`` is code from after the PR (a refactor that replaced the fixed
file) that lost it.
"""

from __future__ import annotations

import ast

from sglab.sglang.upstream import Verdict
from sglab.sglang import source as S

KIMI_MODEL = "srt/models/kimi_k25.py"
KIMI_PROCESSOR = "srt/multimodal/processors/kimi_k25.py"
LAYERNORM = "srt/layers/layernorm.py"
BREAKABLE_RUNNER = "srt/model_executor/breakable_cuda_graph_runner.py"
PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"


def _parsed(read, rel):
    """(text, tree) of ``rel``; tree is None when the file is missing or does not parse."""
    text = read(rel)
    return text, (S.parse(text) if text is not None else None)


# -- #26382 part A
# ----------------------------------------------------------------------------------------------
def inspect_kimi_wrapper(source: str, class_name: str = "KimiK25ForConditionalGeneration") -> dict:
    """Static reading of ``models/kimi_k25.py``: property ``model``, a ``__setattr__`` that tests
    ``name == "model"``, or a plain ``self.model = ...`` assignment in ``__init__`` (with what it
    aliases)."""
    cls = S.find(S.parse(source), class_name)
    found = {"class": isinstance(cls, ast.ClassDef), "property": False, "guard": False,
             "plain_alias": None}
    if not found["class"]:
        return found
    prop = S.find(cls, "model")
    found["property"] = prop is not None and "property" in {ast.unparse(d)
                                                            for d in prop.decorator_list}
    setattr_fn = S.find(cls, "__setattr__")
    found["guard"] = "model" in S.string_constants(setattr_fn)
    alias = S.assignments(S.find(cls, "__init__"), "self.model")
    found["plain_alias"] = ast.unparse(alias[0]) if alias else None
    return found


def pcg_gate(read) -> Verdict:
    src = read(KIMI_MODEL)
    if src is None:
        return Verdict("absent", "no models/kimi_k25.py: Kimi-K2.5 is not in this SGLang")
    f = inspect_kimi_wrapper(src)
    if not f["class"]:
        return Verdict("unknown", "models/kimi_k25.py has no KimiK25ForConditionalGeneration class")
    if f["property"] and f["guard"]:
        return Verdict("pr-era",
                       "`model` property returns language_model and __setattr__ drops writes to "
                                 "`model`: the PCG gate passes, the LLM is registered once")
    if f["property"]:
        return Verdict("before",
                       "`model` property without the __setattr__ guard: the gate passes, but the "
                                 "runner's write to `.model` registers the LLM a second time")
    if f["plain_alias"]:
        return Verdict("before",
                       f"plain `self.model = {f['plain_alias']}` in __init__: the gate passes, but "
                                 "nn.Module registers it twice (duplicate model.* keys)")
    return Verdict("before",
                   "no `.model` on KimiK25ForConditionalGeneration: the piecewise-CUDA-graph gate "
                             "(hasattr(model, 'model')) refuses it as 'not a language model'")


# -- #26382 part B
# ----------------------------------------------------------------------------------------------
_PR_FLOOR = "max(x.shape[0], 2048)"


def _callee_default(read) -> str:
    """The end of the "before" reason: the callee's default and its assert, read from
    flashinfer_comm_fusion.py."""
    _, tree = _parsed(read, "srt/layers/flashinfer_comm_fusion.py")
    fn = S.find(tree, "flashinfer_allreduce_residual_rmsnorm")
    if fn is None:
        return ""
    args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):]
    default = next((ast.unparse(d) for a,
                    d in zip(args, fn.args.defaults) if a.arg == "max_token_num"), None)
    if default is None:
        return ""
    guard = any(isinstance(n,
                           ast.Assert) and "max_token_num" in ast.unparse(n.test)
                for n in ast.walk(fn))
    return f": the callee's default max_token_num={default} applies" + (
        f" and it asserts the batch has at most {default} tokens" if guard else "")


def workspace_floor(read) -> Verdict:
    src, tree = _parsed(read, LAYERNORM)
    if src is None:
        return Verdict("absent", "no layers/layernorm.py in this SGLang")
    if tree is None:
        return Verdict("unknown", "layers/layernorm.py does not parse")
    scope = S.find(tree, "_forward_with_allreduce_fusion") or tree
    fused = S.calls(scope, "flashinfer_allreduce_residual_rmsnorm")
    if not fused:
        return Verdict("absent", "layernorm.py does not call flashinfer_allreduce_residual_rmsnorm "
                                 "(no fused all-reduce + RMSNorm, no workspace to size)")
    passed = [S.keyword(c, "max_token_num") for c in fused]
    if all(e is None for e in passed):
        return Verdict("before",
                       "layernorm.py calls flashinfer_allreduce_residual_rmsnorm without "
                       "max_token_num" + _callee_default(read))
    spelled = {ast.unparse(e) for e in passed if e is not None}
    if _PR_FLOOR in spelled:
        return Verdict("pr-era", f"layernorm.py passes max_token_num={_PR_FLOOR} to "
                                 "flashinfer_allreduce_residual_rmsnorm")
    floors = [e for e in passed if isinstance(e,
                                              ast.Call) and S.callee_name(e) == "max"
              and len(e.args) == 2 and isinstance(e.args[1],
                                                  ast.Constant) and isinstance(e.args[1].value,
                                                          int)]
    if floors:
        return Verdict("changed",
                       f"layernorm.py passes max_token_num={ast.unparse(floors[0])}: a floor other "
                                  "than the PR's 2048")
    return Verdict("unknown",
                   f"layernorm.py passes max_token_num={sorted(spelled)[0]}, not a floor this "
                   "check " "recognises")


# -- #24662
# --------------------------------------------------------------------------------------------------
def _swaps_layer_forward(cls) -> bool:
    """The after-#24662 shape: ``self.layer_model`` is resolved and its ``forward`` swapped for the
    graph at replay."""
    return bool(S.assignments(cls, "self.layer_model")) and bool(S.assignments(cls,
            "self.layer_model.forward"))


def _rejects_multi_request(can_run) -> bool:
    return any(isinstance(n, ast.Compare) and ast.unparse(n.left) == "forward_batch.batch_size"
               for n in ast.walk(can_run)) if can_run is not None else False


def breakable_graph(read) -> Verdict:
    src, tree = _parsed(read, BREAKABLE_RUNNER)
    if src is not None:
        cls = S.find(tree, "BreakableCudaGraphRunner")
        if cls is None:
            return Verdict("unknown",
                           "breakable_cuda_graph_runner.py has no BreakableCudaGraphRunner class")
        if _swaps_layer_forward(cls):
            return Verdict("pr-era",
                           "BreakableCudaGraphRunner captures self.layer_model and swaps its "
                           "forward " "for the graph at replay; the logits tail runs eagerly for "
                           "any request count")
        if _rejects_multi_request(S.find(cls, "can_run")):
            return Verdict("before",
                           "BreakableCudaGraphRunner captures model.forward (logits tail included) "
                           "at " "bs=1, so can_run refuses every batch of more than one request")
        return Verdict("unknown",
                       "BreakableCudaGraphRunner neither swaps layer_model.forward nor refuses bs "
                       "> 1")
    src, tree = _parsed(read, PREFILL_RUNNER)
    if src is not None:
        cls = S.find(tree, "PrefillCudaGraphRunner")
        if cls is not None and _swaps_layer_forward(cls):
            return Verdict("changed",
                           "breakable_cuda_graph_runner.py is gone; the unified "
                           "PrefillCudaGraphRunner " "captures self.layer_model and swaps its "
                           "forward at replay (multi-request)")
        if cls is not None and _rejects_multi_request(S.find(cls, "can_run_graph") or S.find(cls,
                "can_run")):
            return Verdict("regressed",
                           "PrefillCudaGraphRunner refuses batches of more than one request again")
        return Verdict("unknown",
                       "runner/prefill_cuda_graph_runner.py found, but no layer_model swap "
                       "recognised")
    return Verdict("absent",
                   "no breakable CUDA graph runner in this SGLang (neither "
                   "breakable_cuda_graph_runner.py " "nor runner/prefill_cuda_graph_runner.py)")


# -- #22858
# --------------------------------------------------------------------------------------------------
def _dict_keys(node) -> set[str]:
    return {k.value for n in ast.walk(node) if isinstance(n, ast.Dict)
            for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _grid_built_on_cpu(tree) -> bool:
    """``_gpu_preprocess_images`` makes ``grid_thws`` with ``torch.tensor(...)`` and no ``device=``:
    a CPU tensor."""
    fn = S.find(tree, "_gpu_preprocess_images")
    return any(isinstance(v, ast.Call) and S.callee_name(v) == "tensor" and S.keyword(v,
            "device") is None for v in S.assignments(fn, "grid_thws"))


def grid_thw(read) -> Verdict:
    src, tree = _parsed(read, KIMI_PROCESSOR)
    if src is None:
        return Verdict("absent",
                       "no multimodal/processors/kimi_k25.py: no Kimi-K2.5 image processor")
    gpu_call = S.find(tree, "KimiGPUProcessorWrapper._gpu_call")
    if gpu_call is None:
        return Verdict("absent",
                       "no KimiGPUProcessorWrapper._gpu_call: Kimi-K2.5 images are not "
                       "preprocessed on " "a GPU here, so no grid is built on cuda:0")
    keys = _dict_keys(gpu_call)
    moved = S.mentions(gpu_call, "grid_thws.cpu()")
    on_cpu = _grid_built_on_cpu(tree)
    if "image_grid_thw" in keys and moved:
        return Verdict("pr-era",
                       "_gpu_call moves grid_thws to the CPU (.cpu()) and returns it as "
                       "image_grid_thw")
    if "image_grid_thw" in keys and on_cpu:
        return Verdict("changed",
                       "_gpu_preprocess_images builds grid_thws on the CPU (torch.tensor, no "
                       "device) " "and _gpu_call returns it as image_grid_thw; no .cpu() needed")
    if "image_grid_thw" in keys:
        return Verdict("regressed",
                       "_gpu_call returns image_grid_thw built on the GPU without .cpu(): a cuda:0 "
                                    "tensor reaches every TP rank again")
    if "grid_thws" in keys and not (moved or on_cpu):
        return Verdict("before",
                       "_gpu_call returns grid_thws as built on the preprocessing GPU (not a "
                                 "FEATURE_NAMES key, so it reaches every TP rank as a cuda:0 "
                       "tensor)")
    return Verdict("unknown",
                   f"_gpu_call returns keys {sorted(keys)}: not a shape this check recognises")
