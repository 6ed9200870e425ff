"""The Kimi-K2.5 ``.model`` alias in real SGLang: the fix's record, its source check, its probe (the
release's Kimi class through the release's gate), the comparison with the rebuild, ``ENGINE`` (the
real-engine scenarios) and ``CODE_PATH`` (where the fix sits in 0.5.13)."""

from __future__ import annotations

import ast
import functools
import json
import re
import types

from sglab.core import lazy
from sglab.sglang import bootstrap, compare as real, source as S
from sglab.sglang.codepath import Node
from sglab.sglang.engine import PCG_FLAGS, Case, Scenario
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import Recorder, captured_logs, has_file, module_path, patched
from sglab.sglang.upstream import Verdict

# imported by the probes and the comparison that use them: reading FIX needs neither
torch = lazy.Module("torch")
rebuild = lazy.Module("sglab.pcg_gate.rebuild")

KIMI_MODEL = "srt/models/kimi_k25.py"
PROBE_RELEASES = ("0.5.10.post1", "0.5.12.post1", "0.5.13", "0.5.23")
VARIANT_OF = dict(
    zip(PROBE_RELEASES, ("plain_alias", "no_alias", "property_guard", "property_guard")))
# the real class with nn.Module.__setattr__ restored (where the release has the guard): the property
CASE_VARIANT = {"as_released": None, "property_without_guard": "property_only"}
KEYS = ("gate_enabled", "keys_before_gate", "keys_after_gate", "model_in_modules_after_gate",
        "layer_model_path")
TOKENS = [4, 8, 16]  # any non-empty capture list: the gate only checks that one is set


# -- the source check (the release timeline, `sglab upstream`) -------------------------------------
def check(read) -> Verdict:
    src = read(KIMI_MODEL)
    if src is None:
        return Verdict("absent", "no models/kimi_k25.py: Kimi-K2.5 is not in this SGLang")
    cls = S.find(S.parse(src), "KimiK25ForConditionalGeneration")
    if not isinstance(cls, ast.ClassDef):
        return Verdict("unknown", "models/kimi_k25.py has no KimiK25ForConditionalGeneration class")
    prop = S.find(cls, "model")
    has_property = prop is not None and any(
        ast.unparse(d) == "property" for d in prop.decorator_list)
    guard = "model" in S.string_constants(S.find(cls, "__setattr__"))
    alias = S.assignments(S.find(cls, "__init__"), "self.model")
    if has_property and guard:
        return Verdict(
            "pr-era", "`model` property returns language_model and __setattr__ drops "
            "writes to `model`: the PCG gate passes, the LLM is registered once")
    if has_property:
        return Verdict(
            "before", "`model` property without the __setattr__ guard: the gate "
            "passes, but the runner's write to `.model` registers the LLM a second time")
    if alias:
        return Verdict(
            "before", f"plain `self.model = {ast.unparse(alias[0])}` in __init__: the gate "
            "passes, but nn.Module registers it twice (duplicate model.* keys)")
    return Verdict(
        "before", "no `.model` on KimiK25ForConditionalGeneration: the piecewise-CUDA-"
        "graph gate (hasattr(model, 'model')) refuses it as 'not a language model'")


# -- the CPU probe (inside one release's worker process) -------------------------------------------
def build_kimi(kimi, cls=None):
    """The release's ``KimiK25ForConditionalGeneration`` (or ``cls``) around the tiny LLM."""
    cls = cls or kimi.KimiK25ForConditionalGeneration
    mm_args = types.SimpleNamespace(mm_enable_dp_encoder=False)
    getter = "get_mm" if hasattr(kimi, "get_mm") else "get_global_server_args"
    config = types.SimpleNamespace(vision_config=None, text_config=None, encoder_only=False)
    with patched(kimi, MoonViT3dPretrainedModel=lambda *a, **k: torch.nn.Linear(4, 4),
                 K2VLMultiModalProjector=lambda *a, **k: torch.nn.Linear(4, 4),
                 DeepseekV3ForCausalLM=lambda *a, **k: rebuild.tiny_language_model(),
                 **{getter: lambda: mm_args}):
        return cls(config, quant_config=None)


def _gate_pr_era(prepared, wrapper) -> dict:
    """``ModelRunner.init_piecewise_cuda_graphs`` of 0.5.1x on a stand-in runner."""
    mr = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.model_runner")
    ns = types.SimpleNamespace
    runner = ns(
        server_args=ns(disable_piecewise_cuda_graph=False, piecewise_cuda_graph_tokens=TOKENS,
                       enable_breakable_cuda_graph=False), is_draft_worker=False, model=wrapper,
        model_config=ns(num_hidden_layers=2), device="cpu", gpu_id=0)
    rec = Recorder()
    names = {"PiecewiseCudaGraphRunner": rec, "get_available_gpu_memory": lambda *a, **k: 0.0}
    if hasattr(mr, "BreakableCudaGraphRunner"):
        names["BreakableCudaGraphRunner"] = rec
    with patched(mr, **names), captured_logs(mr.__name__) as logs:
        mr.ModelRunner.init_piecewise_cuda_graphs(runner)
    return dict(gate="ModelRunner.init_piecewise_cuda_graphs", enabled=bool(rec.calls), logs=logs,
                attention_layers=getattr(runner, "attention_layers", []))


def _gate_cuda_graph_setup(prepared, wrapper) -> dict:
    """``capture_prefill_graph`` of 0.5.16 on, on a stand-in runner, breakable prefill backend."""
    load = functools.partial(bootstrap.import_release_module, prepared)
    cgs = load("sglang.srt.model_executor.model_runner_components.cuda_graph_setup")
    mr = load("sglang.srt.model_executor.model_runner")
    cfgmod = load("sglang.srt.model_executor.cuda_graph_config")
    from sglang.srt.runtime_context import get_context  # the release's own module

    ns = types.SimpleNamespace
    runner = ns(is_draft_worker=False, spec_algorithm=ns(is_eagle=lambda: False), lora_manager=None,
                model=wrapper, model_config=ns(context_len=4096, num_hidden_layers=2), device="cpu",
                req_to_token_pool=ns(size=64), layer_info=ns(start_layer=0, end_layer=2), gpu_id=0)
    runner.get_cuda_graph_layers = types.MethodType(mr.ModelRunner.get_cuda_graph_layers, runner)
    cfg = cfgmod.CudaGraphConfig(
        prefill=cfgmod.PhaseConfig(backend=cfgmod.Backend.BREAKABLE, bs=list(TOKENS)))
    rec, eager = Recorder(), object()
    with get_context().override_server_args(cuda_graph_config=cfg), \
            patched(cgs, PrefillCudaGraphRunner=rec,
                    get_available_gpu_memory=lambda *a, **k: 0.0), \
            captured_logs(cgs.__name__) as logs:
        result = cgs.capture_prefill_graph(model_runner=runner, eager_runner=eager)
    return dict(gate="cuda_graph_setup.capture_prefill_graph", enabled=result.runner is rec,
                logs=logs, attention_layers=list(getattr(runner, "attention_layers", [])))


def probe(prepared, params) -> list[dict]:
    """Rows ``case, metric, value``: the release's Kimi class through its own gate."""
    kimi = bootstrap.import_release_module(prepared, "sglang.srt.models.kimi_k25")
    moved = has_file(prepared, "srt/model_executor/model_runner_components/cuda_graph_setup.py")
    gate_fn = _gate_cuda_graph_setup if moved else _gate_pr_era
    cls = kimi.KimiK25ForConditionalGeneration
    cases = [("as_released", cls)]
    if isinstance(cls.__dict__.get("model"), property) and "__setattr__" in cls.__dict__:
        cases.append(("property_without_guard",
                      type("KimiPropertyWithoutGuard", (cls,),
                           {"__setattr__": torch.nn.Module.__setattr__})))
    rows = []
    for case, klass in cases:
        wrapper = build_kimi(kimi, klass)
        in_modules, keys_before = "model" in wrapper._modules, sorted(wrapper.state_dict())
        alias = getattr(wrapper, "model", None)
        out = gate_fn(prepared, wrapper)
        target = module_path(wrapper, alias) if alias is not None else None  # after the gate
        attn = [a for a in out["attention_layers"] if a is not None]
        layers_path = None
        if attn:
            p = module_path(wrapper, attn[0])  # e.g. language_model.model.layers.0.self_attn.attn
            layers_path = p.rsplit(".layers.", 1)[0] if p and ".layers." in p else p
        facts = dict(gate=out["gate"], has_model_attr=alias is not None, alias_target=target,
                     model_in_modules_before_gate=in_modules, gate_enabled=out["enabled"],
                     messages=[m for _, m in out["logs"]], keys_before_gate=keys_before,
                     keys_after_gate=sorted(wrapper.state_dict()),
                     model_in_modules_after_gate="model" in wrapper._modules,
                     layer_model_path=layers_path, num_attention_layers=len(attn))
        rows += [{"case": case, "metric": k, "value": v} for k, v in facts.items()]
    return rows


# -- the comparison: the releases beside the rebuild -----------------------------------------------
def rebuild_facts(variant: str) -> dict:
    """The rebuild's wrapper through the rebuild's gate, as the probe reports a release."""
    w = rebuild.build_wrapper(variant)
    before = sorted(w.state_dict())
    with rebuild.quiet_gate():
        res = rebuild.init_piecewise_cuda_graphs(
            rebuild.ModelRunnerState(w, num_hidden_layers=rebuild.TINY_LM.num_layers))
    return dict(gate_enabled=res.enabled, keys_before_gate=before,
                keys_after_gate=sorted(w.state_dict()), model_in_modules_after_gate="model"
                in w._modules, layer_model_path=res.layer_model_path if res.enabled else None)


def real_facts(result, case: str = "as_released") -> dict:
    f = real.facts(result, case=case)
    out = {k: f.get(k) for k in KEYS}
    out["layer_model_path"] = f.get("layer_model_path") if f.get("gate_enabled") else None
    return out


def describe(f: dict) -> str:
    if not f.get("gate_enabled"):
        return f"gate refuses (not a language model); {len(f.get('keys_after_gate') or [])} keys"
    before, after = f.get("keys_before_gate") or [], f.get("keys_after_gate") or []
    dup = sum(k.startswith("model.") for k in after)
    return (f"gate passes; keys {len(before)} → {len(after)} after the gate, {dup} under model.*; "
            f"layer stack {f.get('layer_model_path')}")


def comparison(results: dict, variant_of: dict = VARIANT_OF):
    """One row per (release, case): the real class through the real gate beside the rebuild."""
    rows = []
    for release, r in real.ran(results).items():
        for case in [c for c in CASE_VARIANT if c in set(r.rows["case"])]:
            v = CASE_VARIANT[case] or variant_of[release]
            what = "the Kimi wrapper through the gate" + (", guard removed"
                                                          if case != "as_released" else "")
            rows.append(
                real.facts_row(release, what, real_facts(r, case), v, rebuild_facts(v), KEYS,
                               describe))
    return real.table(rows)


# -- the real engine: `sglab engine --scenario NAME`, recorded under data/recorded/engine_pcg_gate/
# the width sweep: the Llama config's 32 layers at these hidden sizes (head_dim 64, the MLP 2.75×
# as in the 512 config), each case named w<hidden>-pcg / w<hidden>-off
WIDTHS = (512, 1024, 2048, 4096)
WIDTH_CASE = re.compile(r"^w(?P<hidden>\d+)-(?P<arm>pcg|off)$")


def width_args(hidden: int) -> tuple[str, ...]:
    """The ``--json-model-override-args`` that build the Llama config at ``hidden``."""
    if hidden == 512:
        return ()
    heads = hidden // 64
    override = dict(hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                    num_attention_heads=heads, num_key_value_heads=heads)
    return ("--json-model-override-args", json.dumps(override, separators=(",", ":")))


OFF = Case("pcg-off", ("--disable-piecewise-cuda-graph",))
SIZES = dict(input_lens=(128, 256, 512, 1024), repeats=5, starts=3, control="pcg-off",
             launch_pass=True, output_len=8)
# 01-kimi-pcg: 0.5.12.post1 also gets kimi-k25-post-load-weights: sglab engine adds what the model
# needs with dummy weights by itself (sglab.sglang.engine.spec.MODEL_NEEDS)
ENGINE = (
    Scenario(
        fix="pcg_gate", name="01-kimi-pcg", model="kimi_k25_tiny", tool="bench",
        what="Kimi-K2.5 tiny (2 DeepSeek-V3 layers, MLA, 8 experts; 1-layer vision tower): "
        "piecewise CUDA graph decided by the release, and prefill latency per token count with it "
        "on and off", releases=("0.5.12.post1", "0.5.13"),
        cases=(Case("default", PCG_FLAGS),
               Case("enforce", ("--enforce-piecewise-cuda-graph", *PCG_FLAGS)), OFF), **SIZES,
        expect="default: disabled by ServerArgs (multimodal) on both; enforce: 0.5.12.post1 'the "
        "model is not a language model', 0.5.13 captured for [128, 256, 512, 1024]; pcg-off: the "
        "eager baseline"),
    Scenario(
        fix="pcg_gate", name="01-llama-pcg", model="llama_32x512", tool="bench",
        what="Llama-style 32 layers x hidden 512 (launch-bound prefill): prefill with and without "
        "piecewise CUDA graphs", releases=("0.5.13",), cases=(Case("pcg", PCG_FLAGS), OFF), **SIZES,
        expect="pcg faster than pcg-off at every size, by more than the A/A gap of pcg-off "
        "started twice"),
    # 24 starts: split over calls with --cases 'w512-*' 'w1024-*', then the rest
    Scenario(
        fix="pcg_gate", name="01-llama-width", model="llama_32x512", tool="bench",
        what="where piecewise graphs stop paying: the same 32 Llama layers at hidden 512 to 4096 "
        "(--json-model-override-args), prefill with and without piecewise graphs, 128 to 2048 "
        "tokens", releases=("0.5.13",), cases=tuple(
            Case(f"w{h}-{arm}", (*flags, *width_args(h))) for h in WIDTHS
            for arm, flags in (("pcg", (*PCG_FLAGS, "2048")), ("off", OFF.args))),
        input_lens=(128, 512, 1024, 2048), repeats=3, starts=3, output_len=4,
        expect="the gain off / pcg falls as the width (compute per launch) grows"))

# Kimi-K2.5 at its real widths under the release's server and bench_serving, as the PR measured:
# 2 of its 61 layers (40 GB of dummy weights) fit one 80-GB GPU; 05's stand-in processor stands in.
SERVE_FLAGS = ("--cuda-graph-max-bs", "8")
PROCESSOR = "kimi-k25-processor-stand-in"  # a shared adjustment: sglab.sglang.engine.spec
SERVE = Scenario(
    fix="pcg_gate", name="01-kimi-full-serve", model="kimi_k25_full", tool="serve",
    what="Kimi-K2.5 at full width (hidden 7168, MLA, 384 experts; 1 dense + 1 MoE layer), the "
    "release's server and bench_serving: TTFT, TPOT and E2E with piecewise graphs enforced and off",
    releases=("0.5.12.post1",
              "0.5.13"), cases=(Case("enforce", ("--enforce-piecewise-cuda-graph", *SERVE_FLAGS),
                                     (PROCESSOR,)),
                                Case("pcg-off", ("--disable-piecewise-cuda-graph", *SERVE_FLAGS),
                                     (PROCESSOR,), releases=("0.5.13",))),
    input_lens=(128, 1024, 2048), output_len=64, requests=(1, 4), prompts=4, starts=3,
    control="pcg-off", expect="0.5.12.post1: the gate refuses (eager prefill); 0.5.13 enforce: "
    "piecewise prefill up to 2048 tokens; pcg-off: the eager baseline, started twice (A/A)")
# the same widths under bench_one_batch (prefill per token count, decode per step, and the launch
# count pass), and one TP-4 rank's widths (heads, dense and expert MLPs a quarter) on one GPU
BENCH = dict(releases=("0.5.13",), cases=tuple(Case(c.label, c.args) for c in SERVE.cases),
             input_lens=(128, 512, 1024, 2048, 4096), repeats=3, starts=3, control="pcg-off",
             launch_pass=True, output_len=16)
FULL_BENCH = Scenario(
    fix="pcg_gate", name="01-kimi-full-bench", model="kimi_k25_full", tool="bench", **BENCH,
    what="Kimi-K2.5 at full width, bench_one_batch: prefill and decode with piecewise graphs "
    "enforced and off", expect="piecewise prefill up to 2048 tokens (MLA cap), eager at 4096")
RANK_BENCH = Scenario(
    fix="pcg_gate", name="01-kimi-rank-bench", model="kimi_k25_tp4rank", tool="bench", **BENCH,
    what="one TP-4 rank of Kimi-K2.5 (16 heads, MLP 4608, experts 512 wide) on one GPU, "
    "bench_one_batch: prefill and decode with piecewise graphs enforced and off",
    expect="launch-bound: piecewise prefill pays up to 1024 tokens")
ENGINE = ENGINE + (SERVE, FULL_BENCH, RANK_BENCH)

# #26382's own benchmark, as its description gives it (the PR's figures, not measured here)
PR_BENCHMARK = dict(
    setup="Kimi-K2.5 with real weights, TP 4 on B200", where="B200, TP 4",
    metrics=dict(TTFT=("s", 0.479, 0.147), TPOT=("ms", 12.5, 17.7), E2E=("s", 0.722, 0.488)))

# where the fix sits in 0.5.13, the first release with it: the flags decide, the gate asks, the
# alias answers, the guard drops the write-back, the runner captures
CODE_PATH_RELEASE = "0.5.13"
CODE_PATH = (Node("srt/server_args.py", "ServerArgs._handle_piecewise_cuda_graph",
                  "off for a multimodal model unless --enforce-piecewise-cuda-graph"),
             Node("srt/model_executor/model_runner.py", "ModelRunner.init_piecewise_cuda_graphs",
                  "the gate: hasattr(model, 'model'), then model.model = ..."),
             Node(KIMI_MODEL, "KimiK25ForConditionalGeneration.model", "the alias: language_model"),
             Node(KIMI_MODEL, "KimiK25ForConditionalGeneration.__setattr__",
                  "the guard: drops the write-back"),
             Node("srt/model_executor/piecewise_cuda_graph_runner.py",
                  "PiecewiseCudaGraphRunner.capture", "one graph per piece and token count"))

HUNK = Spec(
    26382,
    symbols_in(KIMI_MODEL, "KimiK25ForConditionalGeneration.model",
               "KimiK25ForConditionalGeneration.__setattr__"))
FIX = Fix(name="pcg_gate", number="01", part="part A", prs=(26382,), gpus=1,
          title="Kimi-K2.5 wrapper: `.model` property + __setattr__ guard (#26382)", check=check,
          hunks=(HUNK,), probe=Probe("sglab.pcg_gate.sglang:probe", PROBE_RELEASES), engine=ENGINE)

# the notebook's real-SGLang section; the fix across releases, a released symbol beside the rebuild
compare = functools.partial(real.section, FIX, comparison, what="(release, case) rows")
released = functools.partial(real.released, FIX)
