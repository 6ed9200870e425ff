"""The real breakable-CUDA-graph prefill runner's routing decision (#24662), on the CPU.

``BreakableCudaGraphRunner.__init__`` (``model_executor/breakable_cuda_graph_runner.py``, 0.5.11 to 0.5.13) runs
as released on a stand-in model runner that carries only what it reads, around the rebuild's own tiny models
(:data:`sglab.fixes.breakable_graph.MODEL_SHAPES`), so the layer stack it resolves can be compared module for
module. It is stopped by :class:`~._support.Stop` where it would first ask for the CUDA graph memory pool: after the
static buffers (0.5.11) and after the ``layer_model`` resolution (0.5.12), before any warm-up or capture. Then:

- the release's own ``can_run`` on stand-in forward batches (``ForwardMode.EXTEND``, the token ids of the live
  batch, no input embeddings, no logprobs) of one and of several requests, and of more tokens than the largest
  bucket;
- the release's own ``_build_capture_forward_batch``: is the capture batch's ``extend_seq_lens`` a slice of a
  static ``(max_bs,)`` buffer (what the captured logits tail reads before #24662), or a fresh bs=1 tensor?

0.5.10.x has no breakable runner; 0.5.14 replaced the file (``runner/prefill_cuda_graph_runner.py``): a release
without the file gives one row saying so.
"""

from __future__ import annotations

import types

from sglab.sglang.probing import Recorder, Stop, captured_logs, has_file, module_path, patched

RUNNER_FILE = "srt/model_executor/breakable_cuda_graph_runner.py"
CAPTURE_TOKENS = [16, 32, 64]
BATCHES = {"1 request (30)": [30], "3 requests (10+12+10)": [10, 12, 10], "8 requests (8×6)": [6] * 8,
           "over the largest bucket (50+50)": [50, 50]}
MAX_BS = 8


def batch_label(lens) -> str:
    """The label of a batch of request lengths, as the probe's rows name it."""
    for label, want in BATCHES.items():
        if list(want) == list(lens):
            return label
    return "+".join(str(n) for n in lens)


def _stand_in_runner(model, capture_tokens):
    """The attributes of ``ModelRunner`` that the runner's ``__init__`` and ``_build_capture_forward_batch`` read."""
    import torch

    return types.SimpleNamespace(
        device="cpu", gpu_id=0, model=model, is_multimodal=False, is_generation=True, is_hybrid_swa=False,
        dtype=torch.float32, model_config=types.SimpleNamespace(hidden_size=8),
        server_args=types.SimpleNamespace(piecewise_cuda_graph_tokens=list(capture_tokens),
                                          enable_cudagraph_gc=False, enable_return_hidden_states=False),
        req_to_token_pool=types.SimpleNamespace(size=MAX_BS), token_to_kv_pool=None,
        attn_backend=types.SimpleNamespace(use_captured_forward_metadata_for_breakable_cuda_graph=False),
        spec_algorithm=None, is_draft_worker=False, attention_layers=[], moe_layers=[], moe_fusions=[])


def build_runner(bcg, model, capture_tokens):
    """(runner, log messages): the release's ``__init__`` up to the memory-pool request."""
    def stop(*a, **k):
        raise Stop()

    cls = bcg.BreakableCudaGraphRunner
    runner = cls.__new__(cls)
    with patched(bcg, get_global_graph_memory_pool=stop, log_info_on_rank0=Recorder()), \
            captured_logs(bcg.__name__) as logs:
        try:
            cls.__init__(runner, _stand_in_runner(model, capture_tokens))
        except Stop:
            pass
    return runner, [m for _, m in logs]


def forward_batch(lens):
    """A stand-in extend batch with the fields ``can_run`` reads (a ``ForwardBatch`` of ``len(lens)`` requests)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    n = int(sum(lens))
    return types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND, batch_size=len(lens), input_ids=torch.zeros(n, dtype=torch.int64),
        input_embeds=None, replace_embeds=None, return_logprob=False, capture_hidden_mode=CaptureHiddenMode.NULL,
        global_num_tokens_cpu=None, extend_seq_lens_cpu=list(lens), extend_logprob_start_lens_cpu=[n] * len(lens))


def capture_batch_facts(runner) -> dict:
    """Does the bs=1 capture batch read a static per-request buffer (the pre-#24662 tail's source)?"""
    fb = runner._build_capture_forward_batch(CAPTURE_TOKENS[0])
    static = getattr(runner, "static_extend_seq_lens", None)
    shares = static is not None and fb.extend_seq_lens.untyped_storage().data_ptr() == \
        static.untyped_storage().data_ptr()
    return {"capture_batch_size": int(fb.batch_size), "capture_reads_static_bs_buffer": bool(shares),
            "static_bs_buffer_len": int(static.shape[0]) if static is not None else None}


def model_rows(bcg, shape: str) -> list[dict]:
    from sglab.fixes.breakable_graph import build_model

    model = build_model(shape=shape)
    runner, logs = build_runner(bcg, model, CAPTURE_TOKENS)
    has_attr = hasattr(runner, "layer_model")
    layer = getattr(runner, "layer_model", None)
    facts = {"resolves_layer_model": has_attr,
             "layer_model": (module_path(model, layer) if layer is not None else None),
             "warnings": [m for m in logs if "[BCG]" in m], "max_num_tokens": int(runner.max_num_tokens)}
    rows = [{"model": shape, "batch": "", "metric": k, "value": v} for k, v in facts.items()]
    for label, lens in BATCHES.items():
        rows.append({"model": shape, "batch": label, "metric": "can_run",
                     "value": bool(runner.can_run(forward_batch(lens)))})
    if layer is not None or not has_attr:     # a disabled runner returns before its buffers exist
        rows += [{"model": shape, "batch": "", "metric": k, "value": v}
                 for k, v in capture_batch_facts(runner).items()]
    return rows


def run(prepared, params: dict) -> list[dict]:
    """Rows ``model, batch, metric, value`` for each model shape (default: every shape of the rebuild)."""
    from sglab.sglang import bootstrap

    if not has_file(prepared, RUNNER_FILE):
        return [{"model": "", "batch": "", "metric": "runner_file", "value": None}]
    bcg = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.breakable_cuda_graph_runner")
    from sglab.fixes.breakable_graph import MODEL_SHAPES

    rows = [{"model": "", "batch": "", "metric": "runner_file", "value": "sglang/" + RUNNER_FILE}]
    for shape in params.get("shapes") or list(MODEL_SHAPES):
        rows += model_rows(bcg, shape)
    return rows
