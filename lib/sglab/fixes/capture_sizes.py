"""Piecewise-CUDA-graph capture sizes vs the attention-TP reduce-scatter (SGLang PR #23972).

Mirrors, PR-era (May 2026):

- ``python/sglang/srt/server_args.py``: ``ServerArgs._generate_piecewise_cuda_graph_tokens`` (the default token
  counts that get one piecewise capture each) and the ``piecewise_cuda_graph_max_tokens`` default (the chunked
  prefill size, or 2048 for MLA models) -> :func:`default_piecewise_capture_sizes`,
  :func:`default_piecewise_max_tokens`.
- ``python/sglang/srt/utils/common.py``: ``require_mlp_tp_gather``, ``require_attn_tp_gather``,
  ``require_gathered_buffer`` (does the layer communicator scatter tokens across the attention-TP group?),
  ``ceil_align``.
- ``python/sglang/srt/layers/dp_attention.py``: ``compute_dp_attention_world_info`` (attention TP size =
  ``tp // attn_dp // attn_cp``) -> :func:`attention_tp_size`.
- ``python/sglang/srt/model_executor/piecewise_cuda_graph_runner.py``: ``PiecewiseCudaGraphRunner.__init__``,
  the filter the PR adds (``mul_base = attn_tp_size``; ``if mul_base % attn_cp_size != 0: mul_base *=
  attn_cp_size``; keep sizes divisible by ``mul_base``; assert one is left) -> :func:`piecewise_mul_base`,
  :func:`filter_piecewise_capture_sizes`.
- ``python/sglang/srt/model_executor/cuda_graph_runner.py``: ``get_batch_sizes_to_capture``, the decode
  runner's older filter that the PR copies, which also doubles ``mul_base`` under two-batch overlap ->
  :func:`decode_mul_base`, :func:`filter_decode_batch_sizes`.
- ``python/sglang/srt/layers/communicator.py``: ``CommunicateWithAllReduceAndLayerNormFn.
  _scatter_hidden_states_and_residual`` (``hidden.tensor_split(attn_tp_size)[attn_tp_rank]`` then
  ``attn_tp_reduce_scatter_tensor`` into that shard) and ``_gather_hidden_states_and_residual``
  (``attn_tp_all_gather_into_tensor``) -> :func:`scatter_to_attn_tp`, :func:`gather_from_attn_tp`.

Later SGLang stopped dropping sizes: unaligned prefill buckets are rounded *up* with ``ceil_align`` and
de-duplicated (the approach of sgl-project/sglang#33200; released from 0.5.22) -> :func:`round_up_capture_sizes`.
The alignment SGLang 0.5.23 rounds to is the decode runner's, two-batch overlap included:
``model_executor/runner/prefill_cuda_graph_runner.py::get_prefill_num_tokens_to_capture`` calls
``utils/common.py::get_cuda_graph_max_batch_size``, i.e. ``ceil_align`` to
``get_cuda_graph_batch_size_alignment()`` -> :func:`today_alignment`, :func:`today_capture_sizes`. (Rounding up to
the PR's ``mul_base`` instead, as this module's callers may do to compare policies at one alignment, is the same
list except under two-batch overlap, where 0.5.23 aligns to twice as much.)

Also here, for the design review: :func:`lcm_base` (the least common multiple of attn TP and CP, which the
PR's ``mul_base`` is not always) and :func:`comment_base` (``attn_tp_size * attn_cp_size``, which the PR's code
comment claims and the code does not enforce).

No measuring here; :mod:`sglab.experiments.capture_sizes` measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

PR = 23972
PR_URL = "https://github.com/sgl-project/sglang/pull/23972"

# The MLA default of piecewise_cuda_graph_max_tokens (DeepSeek-Coder-V2-Lite, the crash report's model, is MLA).
MLA_MAX_TOKENS = 2048


# --------------------------------------------------------------------------------------------------------------
# server_args.py: the default capture sizes
# --------------------------------------------------------------------------------------------------------------
def default_piecewise_capture_sizes(max_tokens: int = MLA_MAX_TOKENS) -> list[int]:
    """``ServerArgs._generate_piecewise_cuda_graph_tokens``: 4..32 step 4, 48..256 step 16, 288..512 step 32,
    576..1024 step 64, 1280..4096 step 256, then 4608.. step 512, cut at ``max_tokens``."""
    capture_sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64))
        + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in capture_sizes if s <= max_tokens]


def default_piecewise_max_tokens(chunked_prefill_size: int, use_mla_backend: bool) -> int:
    """``piecewise_cuda_graph_max_tokens`` when unset: the chunked prefill size, or 2048 with an MLA backend."""
    return MLA_MAX_TOKENS if use_mla_backend else chunked_prefill_size


# --------------------------------------------------------------------------------------------------------------
# utils/common.py: when does the layer communicator scatter tokens over the attention-TP group?
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParallelArgs:
    """The ``ServerArgs`` fields the decision reads (names as upstream)."""

    tp_size: int
    dp_size: int = 1
    enable_dp_attention: bool = False
    moe_dense_tp_size: int | None = None
    enable_dp_lm_head: bool = False
    moe_a2a_backend: str = "none"  # "none" | "deepep" | ...
    attn_cp_size: int = 1
    enable_two_batch_overlap: bool = False


def require_mlp_tp_gather(a: ParallelArgs) -> bool:
    """The MLP input is all-gathered (not all-reduced): each MLP TP group spans several attention-DP groups."""
    if a.enable_dp_attention:
        assert a.dp_size > 1, "dp_size must be greater than 1"
        if a.moe_dense_tp_size is None:
            return True
        elif not a.enable_dp_lm_head:
            return True
        elif a.moe_a2a_backend == "none":
            return True
        else:
            return a.moe_dense_tp_size > a.tp_size // a.dp_size
    return False


def require_attn_tp_gather(a: ParallelArgs) -> bool:
    """The attention input is scattered over the attention-TP group (``--moe-dense-tp-size 1`` or an A2A MoE)."""
    assert a.moe_dense_tp_size in (1, None)
    if a.moe_a2a_backend != "none" or a.moe_dense_tp_size == 1:
        if a.enable_dp_attention:
            return a.dp_size < a.tp_size
        return True
    return False


def require_gathered_buffer(a: ParallelArgs) -> bool:
    return require_mlp_tp_gather(a) or require_attn_tp_gather(a)


def attention_tp_size(a: ParallelArgs) -> int:
    """``compute_dp_attention_world_info``: ``tp_size // attn_dp_size // attn_cp_size``."""
    attn_dp_size = a.dp_size if a.enable_dp_attention else 1
    return a.tp_size // attn_dp_size // a.attn_cp_size


def ceil_align(x: int, y: int) -> int:
    return (x + y - 1) // y * y


# --------------------------------------------------------------------------------------------------------------
# The alignment bases
# --------------------------------------------------------------------------------------------------------------
def piecewise_mul_base(attn_tp_size: int, attn_cp_size: int = 1) -> int:
    """The PR's ``mul_base``: ``attn_tp_size``, times ``attn_cp_size`` when that does not divide it."""
    mul_base = attn_tp_size
    if mul_base % attn_cp_size != 0:
        mul_base *= attn_cp_size
    return mul_base


def decode_mul_base(attn_tp_size: int, attn_cp_size: int = 1, *, gathered: bool = True,
                    two_batch_overlap: bool = False) -> int:
    """``get_batch_sizes_to_capture``'s ``mul_base``: x2 under two-batch overlap, x attn TP when the buffer is
    gathered, x attn CP when CP does not divide the result."""
    mul_base = 1
    if two_batch_overlap:
        mul_base *= 2
    if gathered:
        mul_base *= attn_tp_size
    if mul_base % attn_cp_size != 0:
        mul_base *= attn_cp_size
    return mul_base


def lcm_base(attn_tp_size: int, attn_cp_size: int = 1) -> int:
    """The least common multiple of attention TP and CP sizes (review finding: ``mul_base`` is a common
    multiple, not always the least one, e.g. tp 4, cp 6 -> 24 vs 12)."""
    return math.lcm(attn_tp_size, attn_cp_size)


def comment_base(attn_tp_size: int, attn_cp_size: int = 1) -> int:
    """What the PR's comment says the code requires: divisible by ``attn_tp_size * attn_cp_size``."""
    return attn_tp_size * attn_cp_size


# --------------------------------------------------------------------------------------------------------------
# The filters (before / PR / decode variant / today)
# --------------------------------------------------------------------------------------------------------------
class NoCaptureSizes(AssertionError):
    """The PR's assertion: nothing survives the filter."""


def filter_piecewise_capture_sizes(sizes: Sequence[int], attn_tp_size: int, attn_cp_size: int = 1, *,
                                   gathered: bool = True) -> list[int]:
    """``PiecewiseCudaGraphRunner.__init__`` after the PR: when ``require_gathered_buffer`` holds, keep only the
    sizes divisible by :func:`piecewise_mul_base`; assert that one is left. Before the PR: ``sizes`` as given."""
    sizes = list(sizes)
    if not gathered:
        return sizes
    mul_base = piecewise_mul_base(attn_tp_size, attn_cp_size)
    filtered = [n for n in sizes if n % mul_base == 0]
    if not filtered:
        raise NoCaptureSizes(f"No piecewise CUDA graph capture sizes are multiples of {mul_base}")
    return filtered


def filter_decode_batch_sizes(batch_sizes: Sequence[int], attn_tp_size: int, attn_cp_size: int = 1, *,
                              gathered: bool = True, two_batch_overlap: bool = False,
                              num_max_requests: int | None = None, num_tokens_per_bs: int = 1) -> list[int]:
    """``get_batch_sizes_to_capture`` (decode runner): pad ``num_max_requests`` up to ``mul_base`` and add it when
    the list goes past it, keep ``bs * num_tokens_per_bs`` divisible by ``mul_base``, clamp, sort, de-duplicate."""
    capture_bs = list(batch_sizes)
    mul_base = decode_mul_base(attn_tp_size, attn_cp_size, gathered=gathered,
                               two_batch_overlap=two_batch_overlap)
    if two_batch_overlap:
        num_tokens_per_bs = 1
    if num_max_requests is None:
        num_max_requests = max(capture_bs)
    num_max_requests = (num_max_requests + mul_base - 1) // mul_base * mul_base
    if max(capture_bs) > num_max_requests:
        capture_bs += [num_max_requests]
    capture_bs = [bs for bs in capture_bs if bs * num_tokens_per_bs % mul_base == 0]
    capture_bs = [bs for bs in capture_bs if bs <= num_max_requests]
    capture_bs = sorted(set(capture_bs))
    assert len(capture_bs) > 0 and capture_bs[0] > 0, f"{capture_bs=}"
    return capture_bs


def round_up_capture_sizes(sizes: Iterable[int], alignment: int) -> list[int]:
    """Today: round every size up to a multiple of ``alignment`` (``ceil_align``), then sort and de-duplicate."""
    return sorted({ceil_align(n, alignment) for n in sizes})


def today_alignment(attn_tp_size: int, attn_cp_size: int = 1, *, gathered: bool = True,
                    two_batch_overlap: bool = False) -> int:
    """SGLang 0.5.23 ``get_cuda_graph_batch_size_alignment`` (CUDA): x2 under two-batch overlap, x attn TP when the
    buffer is gathered, x attn CP when CP does not divide the result -- the decode runner's ``mul_base``."""
    return decode_mul_base(attn_tp_size, attn_cp_size, gathered=gathered, two_batch_overlap=two_batch_overlap)


def today_capture_sizes(sizes: Iterable[int], attn_tp_size: int, attn_cp_size: int = 1, *, gathered: bool = True,
                        two_batch_overlap: bool = False) -> list[int]:
    """SGLang 0.5.23 ``get_prefill_num_tokens_to_capture``: ``sorted({ceil_align(n, alignment) for n in sizes})``
    with :func:`today_alignment`."""
    return round_up_capture_sizes(sizes, today_alignment(attn_tp_size, attn_cp_size, gathered=gathered,
                                                         two_batch_overlap=two_batch_overlap))


def pick_bucket(num_tokens: int, buckets: Sequence[int]) -> int | None:
    """The runner's replay pick: the smallest bucket >= ``num_tokens``; None when none is (eager fallback)."""
    for b in sorted(buckets):
        if b >= num_tokens:
            return b
    return None


# --------------------------------------------------------------------------------------------------------------
# communicator.py: the dense-TP1 layer boundary
# --------------------------------------------------------------------------------------------------------------
def shard_sizes(num_tokens: int, attn_tp_size: int) -> list[int]:
    """Rows of each rank's shard under ``tensor_split(attn_tp_size)``: the first ``n % w`` ranks get one more."""
    q, r = divmod(num_tokens, attn_tp_size)
    return [q + 1 if i < r else q for i in range(attn_tp_size)]


class UnequalShards(ValueError):
    """``tensor_split`` gave ranks different shard sizes; a reduce-scatter cannot run on them."""

    def __init__(self, num_tokens: int, attn_tp_size: int):
        self.num_tokens = num_tokens
        self.attn_tp_size = attn_tp_size
        self.shards = shard_sizes(num_tokens, attn_tp_size)
        super().__init__(
            f"{num_tokens} tokens over attention TP {attn_tp_size}: tensor_split gives shards {self.shards}; "
            f"reduce_scatter_tensor needs every rank's output to be input/{attn_tp_size} rows "
            f"({num_tokens} % {attn_tp_size} = {num_tokens % attn_tp_size})")


def check_equal_shards(num_tokens: int, attn_tp_size: int) -> None:
    """Raise :class:`UnequalShards` before any collective when ``num_tokens`` does not split evenly."""
    if num_tokens % attn_tp_size != 0:
        raise UnequalShards(num_tokens, attn_tp_size)


def scatter_to_attn_tp(hidden, attn_tp_rank: int, attn_tp_size: int, group=None, *, check: bool = True):
    """``_scatter_hidden_states_and_residual``'s communication: this rank's ``tensor_split`` shard of the
    (partial-sum) ``hidden`` is overwritten in place with the reduce-scatter of ``hidden`` over the attention-TP
    group, and returned. With ``check`` the shard sizes are verified first, so a bad token count fails on every
    rank before any collective is issued; without it the collective library sees the unequal shards."""
    import torch.distributed as dist

    if check:
        check_equal_shards(hidden.shape[0], attn_tp_size)
    local = hidden.tensor_split(attn_tp_size)[attn_tp_rank]
    dist.reduce_scatter_tensor(local, hidden, group=group)
    return local


def gather_from_attn_tp(out, local, group=None):
    """``_gather_hidden_states_and_residual``'s communication: all-gather the per-rank shards into ``out``."""
    import torch.distributed as dist

    dist.all_gather_into_tensor(out, local, group=group)
    return out


def dense_tp1_stand_in(x, weight, eps: float = 1e-6):
    """What runs between scatter and gather in the rebuild: a per-token RMSNorm (in float32) with a weight,
    standing in for the layernorm + dense MLP that run at TP size 1 on each rank's tokens. Row-wise, so padding
    rows never change real rows."""
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * weight
