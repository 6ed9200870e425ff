"""The token counts that piecewise CUDA graphs are captured for, and the pick of one at run time.

Mirrors, PR era (SGLang #26382, May 2026):

- ``python/sglang/srt/server_args.py``: ``ServerArgs._generate_piecewise_cuda_graph_tokens`` (one capture per
  listed token count, up to ``--piecewise-cuda-graph-max-tokens``);
- ``python/sglang/srt/model_executor/piecewise_cuda_graph_runner.py``: the runner pads a batch up to the smallest
  captured size that holds it, and runs eagerly above the largest.
"""

from __future__ import annotations

import bisect
from typing import Optional


def piecewise_cuda_graph_tokens(max_tokens: int = 4096) -> list[int]:
    """Token counts that get one piecewise capture each (``--piecewise-cuda-graph-max-tokens`` = max_tokens):
    SGLang's default list, the same one #23972 filters
    (:func:`sglab.capture_sizes.rebuild.default_piecewise_capture_sizes`)."""
    from sglab.capture_sizes.rebuild import default_piecewise_capture_sizes

    return default_piecewise_capture_sizes(max_tokens)


def bucket_for(num_tokens: int, capture_tokens: list[int]) -> Optional[int]:
    """Smallest captured size >= num_tokens (the static shape the batch is padded to), or None when the batch
    is larger than every capture (the runner then falls back to the eager forward)."""
    sizes = sorted(capture_tokens)
    i = bisect.bisect_left(sizes, num_tokens)
    return sizes[i] if i < len(sizes) else None
