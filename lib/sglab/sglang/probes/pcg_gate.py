"""The real Kimi-K2.5 wrapper through the real piecewise-CUDA-graph gate (#26382 part A).

``KimiK25ForConditionalGeneration.__init__`` runs as released, with its three heavy parts
(``MoonViT3dPretrainedModel``, ``K2VLMultiModalProjector``, ``DeepseekV3ForCausalLM``) swapped for tiny modules
of the rebuild's shape: a 2-layer language model whose layers carry ``self_attn.attn``. Whatever the release
does with ``self.model`` (0.5.10.x assigns ``self.model = self.language_model.model``; 0.5.13 defines a
property and a ``__setattr__`` guard) is therefore the release's own code.

The gate is the release's own function on a stand-in runner:

- 0.5.1x: ``ModelRunner.init_piecewise_cuda_graphs`` (``model_executor/model_runner.py``); the runner class it
  would construct is recorded instead, and ``get_available_gpu_memory`` answers 0.
- 0.5.16 and later: ``capture_prefill_graph`` (``model_executor/model_runner_components/cuda_graph_setup.py``),
  with the configuration published through ``get_context().override_server_args`` and a breakable prefill
  backend, ``PrefillCudaGraphRunner`` recorded.

Cases: ``as_released``; and, where the release has the property, ``property_without_guard``: a subclass of
the real class whose ``__setattr__`` is ``nn.Module.__setattr__`` again (the property alone).
"""

from __future__ import annotations

import types

from sglab.sglang.probing import Recorder, captured_logs, has_file, module_path, patched

TOKENS = [4, 8, 16]   # any non-empty capture list; the gate only checks that one is set


def _tiny_language_model():
    """The rebuild's own tiny DeepseekV3ForCausalLM-shaped LLM (``.model`` with embed_tokens, layers, norm, and
    ``.lm_head``), so that the real class and the rebuild's wrappers hold the same parameter names."""
    from sglab.fixes.pcg_gate import tiny_language_model

    return tiny_language_model()


def build_kimi(kimi, cls=None):
    """Run the release's ``KimiK25ForConditionalGeneration.__init__`` (or ``cls``'s) with tiny parts."""
    from torch import nn

    cls = cls or kimi.KimiK25ForConditionalGeneration
    mm_args = types.SimpleNamespace(mm_enable_dp_encoder=False)
    getter = "get_mm" if hasattr(kimi, "get_mm") else "get_global_server_args"
    config = types.SimpleNamespace(vision_config=None, text_config=None, encoder_only=False)
    with patched(kimi, **{getter: lambda: mm_args,
                          "MoonViT3dPretrainedModel": lambda *a, **k: nn.Linear(4, 4),
                          "K2VLMultiModalProjector": lambda *a, **k: nn.Linear(4, 4),
                          "DeepseekV3ForCausalLM": lambda *a, **k: _tiny_language_model()}):
        return cls(config, quant_config=None)


def _gate_pr_era(prepared, wrapper) -> dict:
    """``ModelRunner.init_piecewise_cuda_graphs`` of 0.5.1x on a stand-in runner."""
    from sglab.sglang import bootstrap

    mr = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.model_runner")
    runner = types.SimpleNamespace(
        server_args=types.SimpleNamespace(disable_piecewise_cuda_graph=False, piecewise_cuda_graph_tokens=TOKENS,
                                          enable_breakable_cuda_graph=False),
        is_draft_worker=False, model=wrapper, model_config=types.SimpleNamespace(num_hidden_layers=2),
        device="cpu", gpu_id=0)
    rec = Recorder()
    names = {"PiecewiseCudaGraphRunner": rec, "get_available_gpu_memory": lambda *a, **k: 0.0}
    if hasattr(mr, "BreakableCudaGraphRunner"):
        names["BreakableCudaGraphRunner"] = rec
    with patched(mr, **names), captured_logs(mr.__name__) as logs:
        mr.ModelRunner.init_piecewise_cuda_graphs(runner)
    return {"gate": "ModelRunner.init_piecewise_cuda_graphs", "enabled": bool(rec.calls), "logs": logs,
            "attention_layers": getattr(runner, "attention_layers", [])}


def _gate_cuda_graph_setup(prepared, wrapper) -> dict:
    """``capture_prefill_graph`` of 0.5.16+ on a stand-in runner, breakable prefill backend."""
    from sglab.sglang import bootstrap

    cgs = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.model_runner_components."
                                                    "cuda_graph_setup")
    mr = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.model_runner")
    cfgmod = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.cuda_graph_config")
    from sglang.srt.runtime_context import get_context

    runner = types.SimpleNamespace(
        is_draft_worker=False, spec_algorithm=types.SimpleNamespace(is_eagle=lambda: False), lora_manager=None,
        model=wrapper, model_config=types.SimpleNamespace(context_len=4096, num_hidden_layers=2),
        req_to_token_pool=types.SimpleNamespace(size=64), layer_info=types.SimpleNamespace(start_layer=0, end_layer=2),
        device="cpu", gpu_id=0)
    runner.get_cuda_graph_layers = types.MethodType(mr.ModelRunner.get_cuda_graph_layers, runner)
    cfg = cfgmod.CudaGraphConfig(prefill=cfgmod.PhaseConfig(backend=cfgmod.Backend.BREAKABLE, bs=list(TOKENS)))
    rec, eager = Recorder(), object()
    with get_context().override_server_args(cuda_graph_config=cfg), \
            patched(cgs, PrefillCudaGraphRunner=rec, get_available_gpu_memory=lambda *a, **k: 0.0), \
            captured_logs(cgs.__name__) as logs:
        result = cgs.capture_prefill_graph(model_runner=runner, eager_runner=eager)
    return {"gate": "cuda_graph_setup.capture_prefill_graph", "enabled": result.runner is rec, "logs": logs,
            "attention_layers": list(getattr(runner, "attention_layers", []))}


def _case_rows(case: str, wrapper, gate_fn, prepared) -> list[dict]:
    in_modules = "model" in wrapper._modules
    keys_before = sorted(wrapper.state_dict())
    alias = getattr(wrapper, "model", None)
    out = gate_fn(prepared, wrapper)
    keys_after = sorted(wrapper.state_dict())
    attn = [a for a in out["attention_layers"] if a is not None]
    layers_path = None
    if attn:
        p = module_path(wrapper, attn[0])        # e.g. language_model.model.layers.0.self_attn.attn
        layers_path = p.rsplit(".layers.", 1)[0] if p and ".layers." in p else p
    facts = {
        "gate": out["gate"],
        "has_model_attr": alias is not None,
        "alias_target": module_path(wrapper, alias) if alias is not None else None,
        "model_in_modules_before_gate": in_modules,
        "gate_enabled": out["enabled"],
        "messages": [m for _, m in out["logs"]],
        "keys_before_gate": keys_before,
        "keys_after_gate": keys_after,
        "model_in_modules_after_gate": "model" in wrapper._modules,
        "layer_model_path": layers_path,
        "num_attention_layers": len(attn),
    }
    return [{"case": case, "metric": k, "value": v} for k, v in facts.items()]


def run(prepared, params: dict) -> list[dict]:
    """Rows ``case, metric, value`` for the release's Kimi class through its gate."""
    from torch import nn

    from sglab.sglang import bootstrap

    kimi = bootstrap.import_release_module(prepared, "sglang.srt.models.kimi_k25")
    moved = has_file(prepared, "srt/model_executor/model_runner_components/cuda_graph_setup.py")
    gate_fn = _gate_cuda_graph_setup if moved else _gate_pr_era
    cls = kimi.KimiK25ForConditionalGeneration
    cases = [("as_released", cls)]
    if isinstance(cls.__dict__.get("model"), property) and "__setattr__" in cls.__dict__:
        cases.append(("property_without_guard", type("KimiPropertyWithoutGuard", (cls,),
                                                     {"__setattr__": nn.Module.__setattr__})))
    rows = []
    for case, klass in cases:
        rows += _case_rows(case, build_kimi(kimi, klass), gate_fn, prepared)
    return rows

