"""The real ``BreakableCUDAGraph`` (#24662) capturing the workbook's toy layer stack, beside the
rebuild's.

Real code: ``BreakableCUDAGraph``, ``BreakableCUDAGraphCapture`` and ``eager_on_graph`` of the
release (``model_executor/breakable_cuda_graph/breakable_cuda_graph.py`` in 0.5.11 to 0.5.13,
``model_executor/runner_backend_utils/breakable_cuda_graph/`` from 0.5.14). The model is
:mod:`sglab.fixes.breakable_graph`'s toy decoder; each layer's attention op, the varlen attention
that reads the live request boundaries, is decorated with the release's own ``eager_on_graph(True)``
instead of the rebuild's.

As the runner does after #24662, only the layer stack (``model.model``) is captured, once, for a
token bucket with a one-request placeholder batch; it is then replayed for live batches of several
requests (the break reads their boundaries at replay), and compared with eager: max abs difference
over the live tokens. The rebuild's capture of the same weights runs beside it.
"""

from __future__ import annotations

import copy
import dataclasses

from sglab.sglang.gpu import graphs

BUCKET = 64
LIVE_BATCHES = {"capture_batch": [BUCKET], "three_requests": [20, 30, 14],
                "two_requests_padded": [10, 20]}
REAL_MODULES = ("sglang.srt.model_executor.breakable_cuda_graph.breakable_cuda_graph",
                "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph")


def real_module(prepared):
    """The release's breakable-graph module (it moved in 0.5.14)."""
    from sglab.sglang import bootstrap
    from sglab.sglang.probing import has_file

    for name in REAL_MODULES:
        if has_file(prepared, name.replace(".", "/").removeprefix("sglang/") + ".py"):
            return bootstrap.import_release_module(prepared, name)
    raise bootstrap.NotRunnable(f"sglang {prepared.release}: no breakable_cuda_graph module")


def models(real, layers: int, device: str):
    """(rebuild model, same weights with the release's ``eager_on_graph`` on every attention
    break)."""
    import torch
    from torch import nn

    from sglab.fixes import breakable_graph as bg

    class RealBreakAttention(nn.Module):
        """The attention op with the release's decorator around the rebuild's varlen attention
        body."""

        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, q, k, v):
            return self.fn(q.contiguous(), k.contiguous(), v.contiguous())

    cfg = dataclasses.replace(bg.TINY_CONFIG, num_layers=layers)
    rebuild = bg.build_model(cfg, device=device, dtype=torch.float32, seed=0).requires_grad_(False)
    with_real = copy.deepcopy(rebuild)
    real_break = real.eager_on_graph(True)(bg.varlen_attention.__wrapped__)
    for layer in with_real.model.layers:
        layer.self_attn.attn = RealBreakAttention(real_break)
    return rebuild, with_real


def capture(graph_mod, stack, device: str):
    """(graph, static ids, static positions, output buffer): ``stack`` captured once for
    :data:`BUCKET` tokens with a one-request placeholder batch, after two eager warm-ups on the
    capture stream."""
    import torch

    from sglab.fixes import breakable_graph as bg

    ids = torch.zeros(BUCKET, dtype=torch.int64, device=device)
    pos = torch.arange(BUCKET, dtype=torch.int64, device=device)
    meta = bg.build_attn_metadata([BUCKET], BUCKET, device)
    stream, graph = torch.cuda.Stream(), graph_mod.BreakableCUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), bg.set_forward_context(meta):
        with torch.cuda.stream(stream):
            for _ in range(2):
                stack(ids, pos)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with graph_mod.BreakableCUDAGraphCapture(graph, pool=torch.cuda.graph_pool_handle(),
                                                 stream=stream):
            out = stack(ids, pos)
    torch.cuda.synchronize()
    return graph, ids, pos, out


def replay_rows(label: str, captured, stack, device: str) -> tuple[list[dict], dict]:
    """Replay for every live batch vs eager; rows plus the replay outputs (to compare real with
    rebuild)."""
    import torch

    from sglab.fixes import breakable_graph as bg

    graph, ids, pos, out = captured
    rows, outs = [], {}
    for name, lens in LIVE_BATCHES.items():
        batch = bg.make_batch(lens, vocab_size=bg.TINY_CONFIG.vocab_size, device=device, seed=1)
        n = batch.num_tokens
        ids.zero_()
        pos.zero_()
        ids[:n].copy_(batch.input_ids)
        pos[:n].copy_(batch.positions)
        meta = bg.build_attn_metadata(lens, BUCKET, device)
        with torch.no_grad():
            with bg.set_forward_context(meta):
                graph.replay()
                torch.cuda.synchronize()
                replayed = out[:n].clone()
                eager_bucket = stack(ids, pos)[:n]       # same shapes as the graph: same kernels
            with bg.set_forward_context(bg.build_attn_metadata(lens, n, device)):
                eager_live = stack(batch.input_ids, batch.positions)   # the live tokens alone
        outs[name] = replayed
        for what, eager in (("bucket", eager_bucket), ("live", eager_live)):
            rows.append({"variant": label, "case": name, "metric": f"max_abs_diff_vs_eager_{what}",
                         "value": float((replayed - eager).abs().max()), "unit": ""})
        rows.append({"variant": label, "case": name, "metric": "requests", "value": len(lens),
                     "unit": "requests"})
    rows.append({"variant": label, "metric": "segments", "value": len(graph._segments),
                 "unit": "segments"})
    rows.append({"variant": label, "metric": "breaks", "value": len(graph._break_fns),
                 "unit": "breaks"})
    return rows, outs


def eager_rows(rebuild, with_real, device: str) -> list[dict]:
    """Without CUDA (a dry run): the release's decorator outside a capture is a pass-through, so
    both models must agree exactly."""
    import torch

    from sglab.fixes import breakable_graph as bg

    rows = []
    for name, lens in LIVE_BATCHES.items():
        batch = bg.make_batch(lens, vocab_size=bg.TINY_CONFIG.vocab_size, device=device, seed=1)
        meta = bg.build_attn_metadata(lens, batch.num_tokens, device)
        with torch.no_grad(), bg.set_forward_context(meta):
            a = rebuild.model(batch.input_ids, batch.positions)
            b = with_real.model(batch.input_ids, batch.positions)
        rows.append({"variant": "real_eager", "case": name,
                     "metric": "max_abs_diff_vs_rebuild_eager", "value": float((a - b).abs().max()),
                     "unit": ""})
    return rows


def run(prepared, params: dict) -> list[dict]:
    """Rows ``variant`` (``real`` / ``rebuild``), ``case`` (live batch), ``metric``, ``value``,
    ``unit``."""
    from sglab.fixes import breakable_graph as bg

    device = params.get("device", "cuda")
    layers = int(params.get("layers", 4))
    if device == "cuda":
        graphs.require_cuda(prepared)
    real = real_module(prepared)
    rebuild, with_real = models(real, layers, device)
    rows = graphs.device_rows() + [{"variant": "setup", "metric": "layers", "value": layers,
                                    "unit": "layers"},
                                   {"variant": "setup", "metric": "bucket_tokens", "value": BUCKET,
                                    "unit": "tokens"},
                                   {"variant": "setup", "metric": "module", "value": real.__name__,
                                    "unit": ""}]
    if device != "cuda":
        return rows + eager_rows(rebuild, with_real, device)
    real_rows, real_out = replay_rows("real", capture(real, with_real.model, device),
                                      with_real.model, device)
    bg_rows, bg_out = replay_rows("rebuild", capture(bg, rebuild.model, device), rebuild.model,
                                  device)
    rows += real_rows + bg_rows
    for name in LIVE_BATCHES:
        rows.append({"variant": "real-rebuild", "case": name, "metric": "max_abs_diff",
                     "value": float((real_out[name] - bg_out[name]).abs().max()), "unit": ""})
    return rows
