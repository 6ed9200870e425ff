"""The source checks: given ``read(relpath)`` over an SGLang package folder, does it contain each fix?

One function per upstream change, registered under the experiment's name. Each reads source text only (never
imports SGLang), so it runs the same on an installed package, an unpacked wheel or a checkout.
"""

from __future__ import annotations

import ast

from . import Verdict, register


def inspect_kimi_wrapper(source: str, class_name: str = "KimiK25ForConditionalGeneration") -> dict:
    """Static reading of ``models/kimi_k25.py``: property ``model``, a ``__setattr__`` that tests
    ``name == "model"``, or a plain ``self.model = ...`` assignment in ``__init__``."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    found = {"class": cls is not None, "property": False, "guard": False, "plain_alias": False}
    if cls is None:
        return found
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        decos = {ast.unparse(d) for d in node.decorator_list}
        if node.name == "model" and "property" in decos:
            found["property"] = True
        if node.name == "__setattr__":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Compare) and any(
                        isinstance(c, ast.Constant) and c.value == "model" for c in sub.comparators):
                    found["guard"] = True
        if node.name == "__init__":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and any(ast.unparse(t) == "self.model" for t in sub.targets):
                    found["plain_alias"] = True
    return found


@register("pcg_gate", "Kimi-K2.5 wrapper: `.model` property + __setattr__ guard (#26382)")
def pcg_gate(read) -> Verdict:
    src = read("srt/models/kimi_k25.py")
    if src is None:
        return Verdict("unknown", "srt/models/kimi_k25.py not found in the installed sglang")
    f = inspect_kimi_wrapper(src)
    if not f["class"]:
        return Verdict("unknown", "KimiK25ForConditionalGeneration not found in models/kimi_k25.py")
    if f["property"] and f["guard"]:
        return Verdict("fix", "KimiK25ForConditionalGeneration has the `model` property and the "
                              "__setattr__ guard (#26382)")
    if f["plain_alias"]:
        return Verdict("neither", "plain `self.model = ...` alias in __init__ (duplicate registration)")
    if f["property"]:
        return Verdict("neither", "`model` property without the __setattr__ guard")
    return Verdict("neither", "no `.model` on KimiK25ForConditionalGeneration: the PR-era gate "
                              "disables piecewise CUDA graph")


@register("workspace_floor", "layernorm passes max_token_num=max(x.shape[0], 2048) to the fused AR+norm")
def workspace_floor(read) -> Verdict:
    src = read("srt/layers/layernorm.py")
    if src is None:
        return Verdict("unknown", "srt/layers/layernorm.py not found in the installed sglang")
    if "max(x.shape[0], 2048)" in src:
        return Verdict("fix", "layernorm.py calls with max_token_num=max(x.shape[0], 2048)")
    if "flashinfer_allreduce_residual_rmsnorm" in src:
        return Verdict("neither", "layernorm.py calls the fused AR+norm without the 2048 floor")
    return Verdict("later", "layernorm.py no longer calls flashinfer_allreduce_residual_rmsnorm")


@register("breakable_graph", "Breakable CUDA graph captures only the layer stack (#24662)")
def breakable_graph(read) -> Verdict:
    src = read("srt/model_executor/breakable_cuda_graph_runner.py")
    if src is not None:
        if "replay_layer_forward" in src or "self.layer_model" in src:
            return Verdict("fix", "BreakableCudaGraphRunner captures layer_model and swaps its forward "
                                  "at replay; the logits tail runs eagerly")
        if "forward_batch.batch_size > 1" in src:
            return Verdict("neither", "BreakableCudaGraphRunner captures model.forward and rejects "
                                      "batch_size > 1 in can_run")
    later = read("srt/model_executor/runner/prefill_cuda_graph_runner.py")
    if later is not None and "layer_model" in later:
        return Verdict("later", "the breakable graph moved into runner/prefill_cuda_graph_runner.py, "
                                "which captures only layer_model")
    return Verdict("unknown", "no breakable graph runner source found")


_RUNNER_PATHS = ("srt/model_executor/cuda_graph_runner.py",
                 "srt/model_executor/runner/cuda_graph_runner.py",
                 "srt/model_executor/runner/decode_cuda_graph_runner.py")


@register("swa_loc", "SWA location preset before decode-graph capture (#23552, #24743)")
def swa_loc(read) -> Verdict:
    pool = read("srt/mem_cache/swa_memory_pool.py")
    if pool is None:
        return Verdict("unknown", "srt/mem_cache/swa_memory_pool.py not found")
    if "def set_swa_loc" not in pool:
        if "swa_loc" in pool:
            return Verdict("later", "SWAKVPool has no set_swa_loc any more: the SWA location is "
                                    "translated once per forward and passed to set_kv_buffer")
        return Verdict("unknown", "SWAKVPool has neither set_swa_loc nor a swa_loc argument")
    runner_src = [src for src in (read(p) for p in _RUNNER_PATHS) if src]
    text = "\n".join(runner_src)
    if "out_cache_loc_swa" in text and "set_swa_loc(" in text:
        zeroed = "out_cache_loc_swa.zero_()" in text
        return Verdict("fix", "the decode runner presets set_swa_loc(out_cache_loc_swa) before capture"
                              + ("; the buffer is zeroed on padded batches (#24743)" if zeroed else
                                 "; the buffer is NOT zeroed on padded batches (#24743 missing)"))
    if runner_src:
        return Verdict("neither", "set_swa_loc exists but the decode runner does not call it before "
                                  "capture: every SWA layer translates inside the graph")
    return Verdict("unknown", "decode CUDA-graph runner source not found")


@register("grid_thw", "Kimi-K2.5 grid on the CPU under image_grid_thw (#22858)")
def grid_thw(read) -> Verdict:
    src = read("srt/multimodal/processors/kimi_k25.py")
    if src is None:
        return Verdict("unknown", "srt/multimodal/processors/kimi_k25.py not found")
    has_key = '"image_grid_thw"' in src
    if has_key and "grid_thws = grid_thws.cpu()" in src:
        return Verdict("fix", "_gpu_call moves grid_thws to the CPU and returns it as image_grid_thw")
    if has_key:
        return Verdict("later", "kimi_k25.py returns image_grid_thw without the PR's .cpu() line "
                                "(the grid is built on the CPU in a later rewrite)")
    if '"grid_thws"' in src:
        return Verdict("neither", "_gpu_call still returns grid_thws (on the preprocessing device)")
    return Verdict("unknown", "kimi_k25.py has neither key")


_PCG_PATHS = ("srt/model_executor/piecewise_cuda_graph_runner.py",)
_LATER_PATHS = ("srt/model_executor/cuda_graph_runner/prefill_runner.py",
                "srt/model_executor/runner/prefill_cuda_graph_runner.py",
                "srt/arg_groups/cuda_graph_hook.py", "srt/server_args.py", "srt/model_executor/model_runner.py")


@register("capture_sizes", "PR #23972: piecewise capture sizes aligned to the attention-TP group")
def capture_sizes(read) -> Verdict:
    for rel in _PCG_PATHS:
        text = read(rel)
        if text and "No piecewise CUDA graph capture sizes are multiples of" in text:
            return Verdict("fix", f"{rel} drops capture sizes not divisible by mul_base (the PR)")
    for rel in _LATER_PATHS:
        text = read(rel)
        if text and "ceil_align" in text and ("prefill" in text) and ("attn_tp" in text or "mul_base" in text):
            return Verdict("later", f"{rel} aligns prefill capture sizes with ceil_align (rounds up)")
    # SGLang 0.5.2x: the prefill runner rounds each capture size up through get_cuda_graph_max_batch_size, whose
    # alignment comes from the base runner's ceil_align(..., mul_base)
    prefill = read("srt/model_executor/runner/prefill_cuda_graph_runner.py")
    base = read("srt/model_executor/runner/base_cuda_graph_runner.py")
    if (prefill and "def get_prefill_num_tokens_to_capture" in prefill
            and "get_cuda_graph_max_batch_size(" in prefill and base and "ceil_align(" in base
            and "mul_base" in base):
        return Verdict("later", "runner/prefill_cuda_graph_runner.py rounds every capture size up to the "
                                "TP/CP alignment (get_prefill_num_tokens_to_capture → get_cuda_graph_max_batch_size)")
    for rel in _PCG_PATHS:
        if read(rel):
            return Verdict("neither", f"{rel} present without the capture-size filter")
    return Verdict("unknown", "no piecewise/prefill runner found at the known paths")
