"""Piecewise-CUDA-graph capture sizes against the attention-TP reduce-scatter (SGLang #23972),
rebuilt PR-era, one section per upstream file and symbol (``python/sglang/srt/...``). The switch is
:func:`policy_lists` (``before``, ``pr_filter``, ``round_up``); :func:`lcm_base` and
:func:`comment_base` are the design review's other bases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.distributed as dist

from sglab.sglang import server_args


MLA_MAX_TOKENS = 2048  # piecewise_cuda_graph_max_tokens for MLA (the crash report's model)

# -- 1. server_args.py · ServerArgs._generate_piecewise_cuda_graph_tokens --------------------------
default_piecewise_capture_sizes = server_args.piecewise_cuda_graph_tokens


# -- 2. utils/common.py · require_mlp_tp_gather, require_attn_tp_gather, require_gathered_buffer ---
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
    """The MLP input is all-gathered: each MLP TP group spans several attention-DP groups."""
    if not a.enable_dp_attention:
        return False
    assert a.dp_size > 1, "dp_size must be greater than 1"
    if a.moe_dense_tp_size is None or not a.enable_dp_lm_head or a.moe_a2a_backend == "none":
        return True
    return a.moe_dense_tp_size > a.tp_size // a.dp_size


def require_attn_tp_gather(a: ParallelArgs) -> bool:
    """The attention input is scattered over attention TP (``--moe-dense-tp-size 1``, A2A MoE)."""
    assert a.moe_dense_tp_size in (1, None)
    if a.moe_a2a_backend != "none" or a.moe_dense_tp_size == 1:
        return a.dp_size < a.tp_size if a.enable_dp_attention else True
    return False


def require_gathered_buffer(a: ParallelArgs) -> bool:
    return require_mlp_tp_gather(a) or require_attn_tp_gather(a)


def ceil_align(x: int, y: int) -> int:
    return (x + y - 1) // y * y


# -- 3. layers/dp_attention.py · compute_dp_attention_world_info -----------------------------------
def attention_tp_size(a: ParallelArgs) -> int:
    """``tp_size // attn_dp_size // attn_cp_size``."""
    return a.tp_size // (a.dp_size if a.enable_dp_attention else 1) // a.attn_cp_size


# -- 4. model_executor/piecewise_cuda_graph_runner.py · PiecewiseCudaGraphRunner.__init__ ----------
class NoCaptureSizes(AssertionError):
    """The PR's assertion: nothing survives the filter."""


def piecewise_mul_base(attn_tp_size: int, attn_cp_size: int = 1) -> int:
    """``mul_base = attn_tp_size``, times ``attn_cp_size`` when that does not divide it."""
    return attn_tp_size * (attn_cp_size if attn_tp_size % attn_cp_size else 1)


def filter_piecewise_capture_sizes(sizes: Sequence[int], attn_tp_size: int, attn_cp_size: int = 1,
                                   *, gathered: bool = True) -> list[int]:
    """When ``require_gathered_buffer`` holds, keep only the sizes divisible by
    :func:`piecewise_mul_base`; assert that one is left."""
    if not gathered:
        return list(sizes)
    mul_base = piecewise_mul_base(attn_tp_size, attn_cp_size)
    filtered = [n for n in sizes if n % mul_base == 0]
    if not filtered:
        raise NoCaptureSizes(f"No piecewise CUDA graph capture sizes are multiples of {mul_base}")
    return filtered


def lcm_base(attn_tp_size: int, attn_cp_size: int = 1) -> int:
    """The least common multiple (``mul_base`` is a common multiple, e.g. tp 4, cp 6: 24 vs 12)."""
    return math.lcm(attn_tp_size, attn_cp_size)


def comment_base(attn_tp_size: int, attn_cp_size: int = 1) -> int:
    """What the PR's comment says the code requires: ``attn_tp_size * attn_cp_size``."""
    return attn_tp_size * attn_cp_size


# -- 5. model_executor/cuda_graph_runner.py · get_batch_sizes_to_capture ---------------------------
def decode_mul_base(attn_tp_size: int, attn_cp_size: int = 1, *, gathered: bool = True,
                    two_batch_overlap: bool = False) -> int:
    """x2 under two-batch overlap, x attention TP when gathered, x CP when CP does not divide it."""
    return piecewise_mul_base((2 if two_batch_overlap else 1) * (attn_tp_size if gathered else 1),
                              attn_cp_size)


def filter_decode_batch_sizes(batch_sizes: Sequence[int], attn_tp_size: int, attn_cp_size: int = 1,
                              *, gathered: bool = True, two_batch_overlap: bool = False,
                              num_max_requests: int | None = None) -> list[int]:
    """Pad ``num_max_requests`` up to ``mul_base`` (and add it when the list goes past it), keep
    the batch sizes divisible by ``mul_base`` (one token each), clamp, sort, de-duplicate."""
    capture_bs = list(batch_sizes)
    mul_base = decode_mul_base(attn_tp_size, attn_cp_size, gathered=gathered,
                               two_batch_overlap=two_batch_overlap)
    if num_max_requests is None:
        num_max_requests = max(capture_bs)
    num_max_requests = ceil_align(num_max_requests, mul_base)
    if max(capture_bs) > num_max_requests:
        capture_bs += [num_max_requests]
    capture_bs = [bs for bs in capture_bs if bs % mul_base == 0]
    capture_bs = sorted({bs for bs in capture_bs if bs <= num_max_requests})
    assert len(capture_bs) > 0 and capture_bs[0] > 0, f"{capture_bs=}"
    return capture_bs


# -- 6. model_executor/runner/prefill_cuda_graph_runner.py · get_prefill_num_tokens_to_capture
#    (0.5.22+)
def round_up_capture_sizes(sizes: Iterable[int], alignment: int) -> list[int]:
    """Round every size up to a multiple of ``alignment``, sort, de-duplicate."""
    return sorted({ceil_align(n, alignment) for n in sizes})


def today_capture_sizes(sizes: Iterable[int], attn_tp_size: int, attn_cp_size: int = 1, *,
                        gathered: bool = True, two_batch_overlap: bool = False) -> list[int]:
    """Every size rounded up to the decode runner's ``mul_base`` (0.5.23's alignment)."""
    return round_up_capture_sizes(
        sizes,
        decode_mul_base(attn_tp_size, attn_cp_size, gathered=gathered,
                        two_batch_overlap=two_batch_overlap))


def policy_lists(sizes: Sequence[int], attn_tp: int, attn_cp: int = 1,
                 two_batch_overlap: bool = False) -> dict[str, list[int]]:
    """The switch: what each variant captures from ``sizes`` with the tokens scattered: ``before``
    (as given), ``pr_filter`` (empty where the PR asserts), ``round_up`` (as SGLang 0.5.23)."""
    try:
        kept = filter_piecewise_capture_sizes(sizes, attn_tp, attn_cp)
    except NoCaptureSizes:
        kept = []
    return {
        "before": list(sizes), "pr_filter": kept,
        "round_up": today_capture_sizes(sizes, attn_tp, attn_cp,
                                        two_batch_overlap=two_batch_overlap)
    }


# -- 7. layers/communicator.py · _scatter_hidden_states_and_residual,
#    _gather_hidden_states_and_residual
def shard_sizes(num_tokens: int, attn_tp_size: int) -> list[int]:
    """Rows per rank under ``tensor_split(attn_tp_size)``: the first ``n % w`` get one more."""
    q, r = divmod(num_tokens, attn_tp_size)
    return [q + 1 if i < r else q for i in range(attn_tp_size)]


class UnequalShards(ValueError):
    """``tensor_split`` gave ranks different shard sizes; a reduce-scatter cannot run on them."""

    def __init__(self, num_tokens: int, attn_tp_size: int):
        self.num_tokens, self.attn_tp_size = num_tokens, attn_tp_size
        self.shards = shard_sizes(num_tokens, attn_tp_size)
        super().__init__(f"{num_tokens} tokens over attention TP {attn_tp_size}: tensor_split "
                         f"gives shards {self.shards}; reduce_scatter_tensor needs every rank's "
                         f"output to be input/{attn_tp_size} rows ({num_tokens} % {attn_tp_size} "
                         f"= {num_tokens % attn_tp_size})")


def check_equal_shards(num_tokens: int, attn_tp_size: int) -> None:
    """Raise :class:`UnequalShards` when ``num_tokens`` does not split."""
    if num_tokens % attn_tp_size != 0:
        raise UnequalShards(num_tokens, attn_tp_size)


def scatter_to_attn_tp(hidden, attn_tp_rank: int, attn_tp_size: int, group=None, *,
                       check: bool = True):
    """This rank's ``tensor_split`` shard of ``hidden``, overwritten with the reduce-scatter over
    the attention-TP group; ``check``: unequal shards fail on every rank before any collective."""
    if check:
        check_equal_shards(hidden.shape[0], attn_tp_size)
    local = hidden.tensor_split(attn_tp_size)[attn_tp_rank]
    dist.reduce_scatter_tensor(local, hidden, group=group)
    return local


def gather_from_attn_tp(out, local, group=None):
    """All-gather the per-rank shards into ``out``."""
    dist.all_gather_into_tensor(out, local, group=group)
    return out


def dense_tp1_stand_in(x, weight, eps: float = 1e-6):
    """A per-token RMSNorm (float32), standing in for the layernorm + dense MLP at TP 1 between
    scatter and gather; row-wise, so padding never changes real rows."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * weight
