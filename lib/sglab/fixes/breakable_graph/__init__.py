"""Breakable CUDA graph for multi-request prefill (SGLang PR #24662, "Breakable Cuda Graph Support for bs > 1").

One module per upstream file:

- :mod:`.forward_batch` — the prefill batch and the attention metadata breaks read (``ForwardBatch``, the
  attention backend's ``forward_metadata``, ``set_forward_context``);
- :mod:`.breakable_cuda_graph` — ``eager_on_graph``, ``BreakableCUDAGraph``, ``BreakableCUDAGraphCapture``;
- :mod:`.models` — the shared toy decoder with a varlen attention break and a logits tail, in the wrapper shapes
  that ``layer_model`` resolution meets;
- :mod:`.breakable_cuda_graph_runner` — ``BreakableCudaGraphRunner`` with the capture boundary before and after
  the PR, and ``layer_model`` resolution.

No measuring here; :mod:`sglab.experiments.breakable_graph` measures.
"""

from sglab.fixes.breakable_graph.breakable_cuda_graph import (
    BreakableCUDAGraph,
    BreakableCUDAGraphCapture,
    EmulatedReplay,
    eager_on_graph,
)
from sglab.fixes.breakable_graph.breakable_cuda_graph_runner import AFTER, BEFORE, BOUNDARIES, BreakableGraphRunner, resolve_layer_model
from sglab.fixes.breakable_graph.forward_batch import (
    AttnMetadata,
    BatchShape,
    PrefillBatch,
    build_attn_metadata,
    get_forward_metadata,
    make_batch,
    set_forward_context,
)
from sglab.fixes.breakable_graph.models import (
    MODEL_SHAPES,
    TINY_CONFIG,
    ModelConfig,
    TinyCausalLM,
    TinyGPTStyleLM,
    TinyNestedWrapper,
    TinyVLM,
    VarlenAttention,
    build_model,
    run_eager,
    varlen_attention,
)
from sglab.core.toy_decoder import LogitsProcessor

__all__ = [
    "AFTER", "BEFORE", "BOUNDARIES", "MODEL_SHAPES", "TINY_CONFIG", "AttnMetadata", "BatchShape",
    "BreakableCUDAGraph", "BreakableCUDAGraphCapture", "BreakableGraphRunner", "EmulatedReplay", "LogitsProcessor",
    "ModelConfig", "PrefillBatch", "TinyCausalLM", "TinyGPTStyleLM", "TinyNestedWrapper", "TinyVLM",
    "VarlenAttention", "build_attn_metadata", "build_model", "eager_on_graph", "get_forward_metadata",
    "make_batch", "resolve_layer_model", "run_eager", "set_forward_context", "varlen_attention",
]
