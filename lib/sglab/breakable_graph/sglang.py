"""The breakable CUDA graph in real SGLang: the fix's record ``FIX``, its source check, its code
path, the real-release probe (on the CPU, in a release's worker process) beside the rebuild."""

from __future__ import annotations

import ast
import contextlib
import functools
import types

from sglab.core import lazy
from sglab.sglang.engine import Case, Scenario, PCG_FLAGS
from sglab.sglang import bootstrap
from sglab.sglang.codepath import Node
from sglab.sglang import compare as real
from sglab.sglang import source as S
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import Recorder, Stop, captured_logs, has_file, module_path, patched
from sglab.sglang.upstream import Verdict


torch = lazy.Module("torch")  # for the probes and the comparison: reading FIX needs neither
rebuild = lazy.Module("sglab.breakable_graph.rebuild")

RUNNER_FILE = "srt/model_executor/breakable_cuda_graph_runner.py"
PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
PROBE_RELEASES = ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13")
# the rebuild variant each release must match (rebuild.BEFORE, rebuild.AFTER; a test holds them)
VARIANT_OF = {"0.5.11": "before", "0.5.12.post1": "after", "0.5.13": "after"}


# -- the source check (the release timeline, `sglab upstream`) -------------------------------------
def _swaps_layer_forward(cls) -> bool:
    """The after-#24662 shape: ``self.layer_model`` resolved, its ``forward`` swapped at replay."""
    return bool(S.assignments(cls, "self.layer_model")) and bool(
        S.assignments(cls, "self.layer_model.forward"))


def _rejects_multi_request(can_run) -> bool:
    return any(
        isinstance(n, ast.Compare) and ast.unparse(n.left) == "forward_batch.batch_size"
        for n in ast.walk(can_run)) if can_run is not None else False


def check(read) -> Verdict:
    """The state of #24662 in one SGLang, read from the breakable runner (or its successor)."""
    text = read(RUNNER_FILE)
    if text is not None:
        cls = S.find(S.parse(text), "BreakableCudaGraphRunner")
        if cls is None:
            return Verdict("unknown",
                           "breakable_cuda_graph_runner.py has no BreakableCudaGraphRunner class")
        if _swaps_layer_forward(cls):
            return Verdict(
                "pr-era", "BreakableCudaGraphRunner captures self.layer_model and swaps its "
                "forward for the graph at replay; the logits tail runs eagerly for "
                "any request count")
        if _rejects_multi_request(S.find(cls, "can_run")):
            return Verdict(
                "before", "BreakableCudaGraphRunner captures model.forward (logits tail included) "
                "at bs=1, so can_run refuses every batch of more than one request")
        return Verdict(
            "unknown", "BreakableCudaGraphRunner neither swaps layer_model.forward nor refuses bs "
            "> 1")
    text = read(PREFILL_RUNNER)
    if text is not None:
        cls = S.find(S.parse(text), "PrefillCudaGraphRunner")
        if cls is not None and _swaps_layer_forward(cls):
            return Verdict(
                "changed", "breakable_cuda_graph_runner.py is gone; the unified "
                "PrefillCudaGraphRunner captures self.layer_model and swaps its "
                "forward at replay (multi-request)")
        if cls is not None and _rejects_multi_request(
                S.find(cls, "can_run_graph") or S.find(cls, "can_run")):
            return Verdict("regressed",
                           "PrefillCudaGraphRunner refuses batches of more than one request again")
        return Verdict(
            "unknown", "runner/prefill_cuda_graph_runner.py found, but no layer_model swap "
            "recognised")
    return Verdict(
        "absent", "no breakable CUDA graph runner in this SGLang (neither "
        "breakable_cuda_graph_runner.py nor runner/prefill_cuda_graph_runner.py)")


# -- the CPU probe (inside one release's worker process) -------------------------------------------
# The released BreakableCudaGraphRunner (0.5.11 to 0.5.13) around the rebuild's tiny models, up to
# the graph memory pool; then its can_run on stand-in batches, and its capture batch's buffers.
CAPTURE_TOKENS = [16, 32, 64]
ONE, MULTI = "1 request (30)", "3 requests (10+12+10)"
BATCHES = {
    ONE: [30], MULTI: [10, 12, 10], "8 requests (8×6)": [6] * 8,
    "over the largest bucket (50+50)": [50, 50]
}
MAX_BS = 8


def _build_runner(bcg, model):
    """(runner, log messages): the release's ``__init__`` up to the memory-pool request."""
    ns = types.SimpleNamespace
    model_runner = ns(
        device="cpu", gpu_id=0, model=model, is_multimodal=False, is_generation=True,
        is_hybrid_swa=False, dtype=torch.float32, model_config=ns(hidden_size=8), server_args=ns(
            piecewise_cuda_graph_tokens=list(CAPTURE_TOKENS), enable_cudagraph_gc=False,
            enable_return_hidden_states=False), req_to_token_pool=ns(size=MAX_BS),
        token_to_kv_pool=None, spec_algorithm=None, is_draft_worker=False, attention_layers=[],
        attn_backend=ns(use_captured_forward_metadata_for_breakable_cuda_graph=False),
        moe_layers=[], moe_fusions=[])

    def stop(*a, **k):
        raise Stop()

    cls = bcg.BreakableCudaGraphRunner
    runner = cls.__new__(cls)
    with patched(bcg, get_global_graph_memory_pool=stop, log_info_on_rank0=Recorder()), \
            captured_logs(bcg.__name__) as logs:
        with contextlib.suppress(Stop):
            cls.__init__(runner, model_runner)
    return runner, [m for _, m in logs]


def _forward_batch(lens):
    """A stand-in extend batch with the fields ``can_run`` reads (no embeddings, no logprobs)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    n = int(sum(lens))
    return types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND, batch_size=len(lens), input_ids=torch.zeros(
            n, dtype=torch.int64), input_embeds=None, replace_embeds=None, return_logprob=False,
        capture_hidden_mode=CaptureHiddenMode.NULL, global_num_tokens_cpu=None,
        extend_seq_lens_cpu=list(lens), extend_logprob_start_lens_cpu=[n] * len(lens))


def _capture_batch_facts(runner) -> dict:
    """Does the bs=1 capture batch read a static per-request buffer (the pre-#24662 tail's)?"""
    fb = runner._build_capture_forward_batch(CAPTURE_TOKENS[0])
    static = getattr(runner, "static_extend_seq_lens", None)
    shares = static is not None and fb.extend_seq_lens.untyped_storage().data_ptr() == \
        static.untyped_storage().data_ptr()
    return dict(capture_batch_size=int(fb.batch_size), capture_reads_static_bs_buffer=bool(shares),
                static_bs_buffer_len=int(static.shape[0]) if static is not None else None)


def _model_rows(bcg, shape: str) -> list[dict]:
    model = rebuild.build_model(shape=shape)
    runner, logs = _build_runner(bcg, model)
    has_attr = hasattr(runner, "layer_model")
    layer = getattr(runner, "layer_model", None)
    rows = [("", "resolves_layer_model", has_attr),
            ("", "layer_model", module_path(model, layer) if layer is not None else None),
            ("", "warnings", [m for m in logs if "[BCG]" in m]),
            ("", "max_num_tokens", int(runner.max_num_tokens))]
    rows += [
        (b, "can_run", bool(runner.can_run(_forward_batch(lens)))) for b, lens in BATCHES.items()
    ]
    if layer is not None or not has_attr:  # a disabled runner returns before its buffers exist
        rows += [("", k, v) for k, v in _capture_batch_facts(runner).items()]
    return [{"model": shape, "batch": b, "metric": k, "value": v} for b, k, v in rows]


def probe(prepared, params: dict) -> list[dict]:
    """Rows ``model, batch, metric, value`` for each model shape (default: the rebuild's)."""
    if not has_file(prepared, RUNNER_FILE):
        return [{"model": "", "batch": "", "metric": "runner_file", "value": None}]
    bcg = bootstrap.import_release_module(prepared,
                                          "sglang.srt.model_executor.breakable_cuda_graph_runner")
    rows = [{"model": "", "batch": "", "metric": "runner_file", "value": "sglang/" + RUNNER_FILE}]
    for shape in (params or {}).get("shapes") or list(rebuild.MODEL_SHAPES):
        rows += _model_rows(bcg, shape)
    return rows


# -- the real engine: `sglab engine --scenario NAME`, in data/recorded/engine_breakable_graph/
ENGINE = (Scenario(
    fix="breakable_graph", name="03-bcg-requests",
    what="--enable-breakable-cuda-graph with 1 to 8 requests per prefill (Engine API, one "
    "generate call per batch): graph used or eager fallback per prefill batch (the "
    "scheduler's 'Prefill batch' line), and latency", model="llama_32x512", tool="engine",
    releases=("0.5.11", "0.5.12.post1"),
    cases=(Case("bcg", ("--enable-breakable-cuda-graph", *PCG_FLAGS, "--disable-radix-cache")),
           Case("eager", ("--disable-piecewise-cuda-graph", "--disable-radix-cache"))),
    requests=(1, 2, 4, 8), starts=3, control="eager", input_lens=(128,), output_len=1, repeats=5,
    expect="0.5.11: graph only with one request (can_run rejects batch_size > 1); "
    "0.5.12.post1: graph at every batch"),)

# -- the code path of a prefill batch through the breakable graph, in the release with #24662 the
# engine runs use (claims.AFTER_RELEASE)
MODEL_RUNNER = "srt/model_executor/model_runner.py"
CODE_PATH = (Node(MODEL_RUNNER, "ModelRunner.init_piecewise_cuda_graphs",
                  "--enable-breakable-cuda-graph picks the breakable runner"),
             Node(RUNNER_FILE, "BreakableCudaGraphRunner.__init__",
                  "finds layer_model; none found: a [BCG] warning, eager from then on"),
             Node(RUNNER_FILE, "BreakableCudaGraphRunner._capture_one",
                  "captures layer_model.forward per token bucket"),
             Node("srt/layers/radix_attention.py", "unified_attention_with_output",
                  "attention, @eager_on_graph: the break between segments"),
             Node(MODEL_RUNNER, "ModelRunner.forward_extend", "a prefill batch: can_run, replay"),
             Node(RUNNER_FILE, "BreakableCudaGraphRunner.can_run", "no batch-size condition"),
             Node(RUNNER_FILE, "BreakableCudaGraphRunner.replay",
                  "layer_model.forward swapped for the replay; the outer forward eager"),
             Node("srt/layers/logits_processor.py", "LogitsProcessor.forward",
                  "the tail: each request's last token, lm_head, eager"))

_RUNNER_SYMBOLS = ("__init__", "_run_forward", "_build_capture_forward_batch", "can_run", "replay")
FIX = Fix(
    name="breakable_graph", number="03", prs=(24662,), gpus=1,
    title="Breakable CUDA graph captures only the layer stack (#24662)", check=check, hunks=(Spec(
        24662, symbols_in(RUNNER_FILE,
                          *(f"BreakableCudaGraphRunner.{m}" for m in _RUNNER_SYMBOLS))),),
    probe=Probe("sglab.breakable_graph.sglang:probe", PROBE_RELEASES), engine=ENGINE)


# -- the real answers beside the rebuild's (the notebook's real-SGLang section) --------------------
def rebuild_facts(boundary: str, shape: str) -> dict:
    """What the rebuild's runner decides on one model shape, named as the probe names them."""
    model = rebuild.build_model(shape=shape)
    with captured_logs(rebuild.__name__) as logs:
        r = rebuild.BreakableGraphRunner(model, boundary=boundary,
                                         capture_num_tokens=CAPTURE_TOKENS, max_bs=MAX_BS,
                                         capture=False)
    out = dict(layer_model=module_path(model, r.layer_model) if r.layer_model else None,
               warnings=[m for _, m in logs if "[BCG]" in m], max_num_tokens=r.max_num_tokens)
    for label, lens in BATCHES.items():
        out[f"can_run · {label}"] = bool(r.can_run(rebuild.BatchShape(tuple(lens))))
    if boundary == rebuild.BEFORE or r.layer_model is not None:
        key = "capture_reads_static_bs_buffer"
        out[key] = _capture_batch_facts(r)[key]  # the probe's own reading, on the rebuild
    return out


def real_facts(result, shape: str) -> dict:
    """The release's facts on one model shape, from the probe's rows."""
    f = real.facts(result, model=shape, batch="")
    out = {k: f.get(k) for k in ("layer_model", "warnings", "max_num_tokens")}
    rows = result.rows[(result.rows["model"] == shape) & (result.rows["metric"] == "can_run")]
    out.update({f"can_run · {b}": v for b, v in zip(rows["batch"], rows["value"])})
    if "capture_reads_static_bs_buffer" in f:
        out["capture_reads_static_bs_buffer"] = f["capture_reads_static_bs_buffer"]
    return out


def describe(f: dict) -> str:
    """One side's facts on one model shape in words: the multi-request decision, the layer stack."""
    stack = f.get("layer_model") or ("none: disabled with a warning" if f.get("warnings") else
                                     "not resolved (captures model.forward)")
    return (f"{MULTI}: "
            f"{'served by the graph' if f.get(f'can_run · {MULTI}') else 'rejected → eager'}; 1 "
            f"request: {'graph' if f.get(f'can_run · {ONE}') else 'eager'}; layer stack: {stack}")


def comparison(results: dict, variant_of: dict = VARIANT_OF):
    """Per release that ran and model shape, its runner beside the rebuild's (or: no runner)."""
    rows = []
    for release, result in real.ran(results).items():
        has_runner = real.facts(result).get("runner_file") is not None
        if not has_runner or release not in variant_of:
            rows.append(
                real.row(release, "has breakable_cuda_graph_runner.py", has_runner,
                         "rebuild: a runner from 0.5.11 on", release in variant_of))
            continue
        for shape in rebuild.MODEL_SHAPES:
            got, want = real_facts(result, shape), rebuild_facts(variant_of[release], shape)
            rows.append(
                real.facts_row(release, f"{shape}: routing and layer stack", got,
                               variant_of[release], want, sorted(set(got) | set(want)), describe))
    return real.table(rows)


# the notebook's real-SGLang section; the fix across releases, a released symbol beside the rebuild
compare = functools.partial(real.section, FIX, comparison, what="(release, model shape) rows")
released = functools.partial(real.released, FIX)
