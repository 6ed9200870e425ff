"""Capture and replay of decode CUDA graphs, before and after the SWA-location preset.

Mirrors ``python/sglang/srt/model_executor/cuda_graph_runner.py`` (PR-era, April–May 2026): ``DecodeInputBuffers``
(``create`` with ``is_hybrid_swa`` allocating ``out_cache_loc_swa``, ``populate_from_forward_batch``) and
``CudaGraphRunner.capture_one_batch_size`` / ``replay_prepare`` / ``replay``, decode only.

The three runner states (``VARIANTS``):

``before``    upstream before #23552: no ``out_cache_loc_swa`` buffer, nothing calls ``set_swa_loc`` before
              capture, so the captured graph holds the per-layer translation (an index gather + an int32 cast,
              2 kernels) in every SWA layer, replayed every decode step.
``pr23552``   #23552: an int64 ``out_cache_loc_swa`` buffer, filled in ``populate_from_forward_batch`` from
              ``forward_batch.out_cache_loc_swa``, and ``set_swa_loc(buffers.out_cache_loc_swa[:num_tokens])``
              before capture: the graph writes SWA layers straight at the buffer. On a padded batch the buffer
              is *not* cleared, so padded tokens write at whatever SWA slots the previous, larger batch left in
              the tail -- slots of live requests.
``pr24743``   #24743: the buffer is int32 (the dtype ``translate_loc_from_full_to_swa`` returns) and is zeroed
              on a padded batch, like ``out_cache_loc``, so padded tokens write to SWA slot 0.

Without CUDA, :class:`DecodeGraphRunner` with ``use_cuda_graph=False`` replays by re-running the captured step
with the Python state it had at capture (the same static buffers and the same ``swa_loc``), which is what a graph
replay does.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from sglab.fixes.swa_loc.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglab.fixes.swa_loc.toy_model import ToyHybridModel

VARIANTS = ("before", "pr23552", "pr24743")

# dtype of DecodeInputBuffers.out_cache_loc_swa per variant (None: no buffer)
SWA_LOC_BUFFER_DTYPE = {"before": None, "pr23552": torch.int64, "pr24743": torch.int32}


@dataclass(frozen=True)
class RunnerConfig:
    """The switches a variant sets on :class:`DecodeGraphRunner`."""

    preset_swa_loc: bool
    swa_loc_dtype: Optional[torch.dtype]
    zero_swa_on_pad: bool


def runner_config(variant: str) -> RunnerConfig:
    """The :class:`RunnerConfig` of one of ``VARIANTS``."""
    if variant == "before":
        return RunnerConfig(preset_swa_loc=False, swa_loc_dtype=None, zero_swa_on_pad=False)
    if variant == "pr23552":
        return RunnerConfig(preset_swa_loc=True, swa_loc_dtype=torch.int64, zero_swa_on_pad=False)
    if variant == "pr24743":
        return RunnerConfig(preset_swa_loc=True, swa_loc_dtype=torch.int32, zero_swa_on_pad=True)
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


@dataclass
class DecodeInputBuffers:
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    out_cache_loc_swa: Optional[torch.Tensor]

    @classmethod
    def create(cls, *, device, max_bs: int, seq_len_fill_value: int = 1, is_hybrid_swa: bool = False,
               swa_loc_dtype: torch.dtype = torch.int64) -> "DecodeInputBuffers":
        with torch.device(device):
            input_ids = torch.zeros((max_bs,), dtype=torch.int64)
            seq_lens = torch.full((max_bs,), seq_len_fill_value, dtype=torch.int32)
            out_cache_loc = torch.zeros((max_bs,), dtype=torch.int64)
            out_cache_loc_swa = torch.zeros((max_bs,), dtype=swa_loc_dtype) if is_hybrid_swa else None
        return cls(input_ids, seq_lens, out_cache_loc, out_cache_loc_swa)

    def populate_from_forward_batch(self, *, forward_batch: ForwardBatch, raw_bs: int, bs: int,
                                    seq_len_fill_value: int = 1, zero_swa_on_pad: bool = True) -> None:
        """Copy a batch of ``raw_bs`` tokens into the static buffers of the ``bs`` graph.

        Padded tokens ``[raw_bs:bs]`` get ``seq_len_fill_value`` and ``out_cache_loc`` 0 (the padding slot).
        ``zero_swa_on_pad`` is #24743: zero ``out_cache_loc_swa`` too; without it its tail keeps the SWA slots
        of the previous replay.
        """
        if bs != raw_bs:
            self.seq_lens.fill_(seq_len_fill_value)
            self.out_cache_loc.zero_()
            if zero_swa_on_pad and self.out_cache_loc_swa is not None:
                self.out_cache_loc_swa.zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        if self.out_cache_loc_swa is not None and forward_batch.out_cache_loc_swa is not None:
            # int32 source into the buffer; an int64 buffer (#23552) makes this a converting copy
            self.out_cache_loc_swa[:raw_bs].copy_(forward_batch.out_cache_loc_swa[:raw_bs])


class DecodeGraphRunner:
    """Captures one decode step per batch size and replays it (``CudaGraphRunner``, decode only).

    ``preset_swa_loc`` is #23552's ``set_swa_loc(buffers.out_cache_loc_swa[:num_tokens])`` before capture;
    ``swa_loc_dtype`` the dtype of that buffer; ``zero_swa_on_pad`` #24743's zeroing on padded batches.
    ``use_cuda_graph`` defaults to "the pool is on a CUDA device"; without graphs a replay re-runs the step
    eagerly with the Python state it had at capture.
    """

    seq_len_fill_value = 1

    def __init__(self, model: "ToyHybridModel", capture_bs: List[int], *, preset_swa_loc: bool,
                 swa_loc_dtype: Optional[torch.dtype] = torch.int32, zero_swa_on_pad: bool = True,
                 use_cuda_graph: Optional[bool] = None):
        self.model = model
        self.pool = model.pool
        self.device = self.pool.device
        self.capture_bs = sorted(set(capture_bs))
        self.max_bs = self.capture_bs[-1]
        self.preset_swa_loc = preset_swa_loc
        self.zero_swa_on_pad = zero_swa_on_pad
        self.use_cuda_graph = (self.device.type == "cuda") if use_cuda_graph is None else use_cuda_graph
        if self.use_cuda_graph and self.device.type != "cuda":
            raise ValueError("use_cuda_graph needs the pool on a CUDA device")
        is_hybrid_swa = preset_swa_loc  # before #23552 there was no buffer to preset from
        self.buffers = DecodeInputBuffers.create(
            device=self.device, max_bs=self.max_bs, seq_len_fill_value=self.seq_len_fill_value,
            is_hybrid_swa=is_hybrid_swa, swa_loc_dtype=swa_loc_dtype or torch.int32)
        self.graphs: Dict[int, object] = {}
        self.capture_translate_calls: Dict[int, int] = {}
        self._swa_loc_at_capture: Dict[int, Optional[torch.Tensor]] = {}
        self._mempool = None
        self._stream = None

    @classmethod
    def for_variant(cls, model: "ToyHybridModel", capture_bs: List[int], variant: str,
                    use_cuda_graph: Optional[bool] = None) -> "DecodeGraphRunner":
        cfg = runner_config(variant)
        return cls(model, capture_bs, preset_swa_loc=cfg.preset_swa_loc, swa_loc_dtype=cfg.swa_loc_dtype,
                   zero_swa_on_pad=cfg.zero_swa_on_pad, use_cuda_graph=use_cuda_graph)

    # -- capture ---------------------------------------------------------------------------------------------
    def capture(self) -> None:
        """Capture every batch size, largest first (as upstream)."""
        if not self.preset_swa_loc and self.pool.swa_loc is not None:
            raise ValueError("pool.swa_loc is already set: a graph captured now would read that tensor. "
                             "Build a fresh pool for the runner without the preset.")
        if self.use_cuda_graph:
            self._mempool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(device=self.device)
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def _run_once(self, num_tokens: int) -> torch.Tensor:
        b = self.buffers
        return self.model.forward(b.input_ids[:num_tokens], b.seq_lens[:num_tokens], b.out_cache_loc[:num_tokens])

    def capture_one_batch_size(self, bs: int) -> None:
        num_tokens = bs
        # #23552: set before capture so set_kv_buffer's Python branch (if self.swa_loc is not None) takes the
        # fast path and the graph records writes at this buffer instead of the per-layer translation.
        if self.preset_swa_loc and self.buffers.out_cache_loc_swa is not None:
            self.pool.set_swa_loc(self.buffers.out_cache_loc_swa[:num_tokens])
        self._swa_loc_at_capture[bs] = self.pool.swa_loc

        if not self.use_cuda_graph:
            for _ in range(2):
                self._run_once(num_tokens)
            calls = self.pool.translate_calls
            self._run_once(num_tokens)  # stands in for the captured run
            self.capture_translate_calls[bs] = self.pool.translate_calls - calls
            self.graphs[bs] = None
            return

        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run_once(num_tokens)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        try:
            graph = torch.cuda.CUDAGraph(keep_graph=True)  # keeps the raw graph for static node counting
            kept = True
        except TypeError:  # torch without keep_graph
            graph, kept = torch.cuda.CUDAGraph(), False
        calls = self.pool.translate_calls
        with torch.cuda.graph(graph, pool=self._mempool, stream=stream):
            self._run_once(num_tokens)
        self.capture_translate_calls[bs] = self.pool.translate_calls - calls
        if kept:
            graph.instantiate()
        torch.cuda.synchronize(self.device)
        self.graphs[bs] = graph

    # -- replay ----------------------------------------------------------------------------------------------
    def padded_bs(self, raw_bs: int) -> int:
        """The smallest captured batch size >= raw_bs."""
        i = bisect.bisect_left(self.capture_bs, raw_bs)
        if i == len(self.capture_bs):
            raise ValueError(f"batch of {raw_bs} exceeds the largest captured size {self.max_bs}")
        return self.capture_bs[i]

    def replay_prepare(self, forward_batch: ForwardBatch) -> int:
        raw_bs = forward_batch.batch_size
        bs = self.padded_bs(raw_bs)
        self.buffers.populate_from_forward_batch(forward_batch=forward_batch, raw_bs=raw_bs, bs=bs,
                                                 seq_len_fill_value=self.seq_len_fill_value,
                                                 zero_swa_on_pad=self.zero_swa_on_pad)
        return bs

    def replay_graph(self, bs: int) -> None:
        """Replay the step captured for ``bs`` on the buffers as they are (no populate)."""
        if self.use_cuda_graph:
            self.graphs[bs].replay()
            return
        saved = self.pool.swa_loc
        self.pool.set_swa_loc(self._swa_loc_at_capture[bs])  # the branch the "graph" recorded
        try:
            self._run_once(bs)
        finally:
            self.pool.set_swa_loc(saved)

    def replay(self, forward_batch: ForwardBatch) -> int:
        """Populate the buffers from ``forward_batch`` and replay; returns the padded batch size used."""
        bs = self.replay_prepare(forward_batch)
        self.replay_graph(bs)
        return bs
