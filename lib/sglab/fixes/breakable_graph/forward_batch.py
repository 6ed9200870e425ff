"""Prefill batches and the attention metadata that a breakable graph's eager breaks read.

A small subset of SGLang's ``python/sglang/srt/model_executor/forward_batch_info.py`` (``ForwardBatch``: the
token-major ``input_ids`` / ``positions`` and the per-request ``extend_seq_lens``), of the attention backend's
``forward_metadata`` (which tokens may attend to which) and of ``set_forward_context`` (where attention finds that
metadata). Here the forward context is a module global.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class PrefillBatch:
    """Token-major prefill batch: the tokens of all requests concatenated."""

    input_ids: torch.Tensor  # (num_tokens,) int64
    positions: torch.Tensor  # (num_tokens,) int64, restart at 0 for every request
    extend_seq_lens: torch.Tensor  # (batch_size,) int64, on the model's device
    extend_seq_lens_cpu: list[int]

    @property
    def batch_size(self) -> int:
        return len(self.extend_seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class BatchShape:
    """Only the shape of a prefill batch (request lengths): what ``can_run`` decides on."""

    extend_seq_lens_cpu: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        return len(self.extend_seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.extend_seq_lens_cpu))


def make_batch(
    seq_lens: Sequence[int], *, vocab_size: int, device: torch.device | str = "cpu", seed: int = 0
) -> PrefillBatch:
    """A prefill batch of ``len(seq_lens)`` requests with seeded random token ids."""
    seq_lens = [int(n) for n in seq_lens]
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"every request needs at least one token, got {seq_lens}")
    g = torch.Generator().manual_seed(seed)
    total = sum(seq_lens)
    input_ids = torch.randint(0, vocab_size, (total,), generator=g, dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in seq_lens])
    return PrefillBatch(
        input_ids=input_ids.to(device),
        positions=positions.to(device),
        extend_seq_lens=torch.tensor(seq_lens, dtype=torch.int64).to(device),
        extend_seq_lens_cpu=seq_lens,
    )


@dataclass
class AttnMetadata:
    """Per-forward attention metadata (the role of the attention backend's ``forward_metadata``).

    ``token_req[i]`` is the request of token ``i``; padding tokens (a graph bucket larger than the live
    batch) get their own id ``batch_size`` so they never mix with real requests. ``mask[i, j]`` is True when
    token ``i`` may attend to token ``j``: same request and ``j <= i``.
    """

    num_tokens: int
    batch_size: int
    token_req: torch.Tensor
    mask: torch.Tensor


def build_attn_metadata(
    extend_seq_lens_cpu: Sequence[int], num_tokens: int, device: torch.device | str
) -> AttnMetadata:
    lens = [int(n) for n in extend_seq_lens_cpu]
    real = sum(lens)
    if real > num_tokens:
        raise ValueError(f"batch has {real} tokens, more than the {num_tokens} slots")
    bs = len(lens)
    token_req = torch.repeat_interleave(torch.arange(bs, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64))
    if num_tokens > real:
        token_req = torch.cat([token_req, torch.full((num_tokens - real,), bs, dtype=torch.int64)])
    device = torch.device(device)
    if device.type == "cuda":  # no stream sync for the host-to-device copy
        token_req = token_req.pin_memory().to(device, non_blocking=True)
    else:
        token_req = token_req.to(device)
    same = token_req[:, None] == token_req[None, :]
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril_()
    return AttnMetadata(num_tokens=num_tokens, batch_size=bs, token_req=token_req, mask=same & causal)


_forward_metadata: AttnMetadata | None = None


@contextmanager
def set_forward_context(metadata: AttnMetadata):
    """Make ``metadata`` what attention break points read (SGLang: ``set_forward_context``)."""
    global _forward_metadata
    previous = _forward_metadata
    _forward_metadata = metadata
    try:
        yield
    finally:
        _forward_metadata = previous


def get_forward_metadata() -> AttnMetadata:
    if _forward_metadata is None:
        raise RuntimeError("attention called outside set_forward_context(...)")
    return _forward_metadata
