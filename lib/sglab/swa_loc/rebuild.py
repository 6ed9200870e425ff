"""The SWA location preset before decode-graph capture (SGLang #23552, follow-up #24743), rebuilt
PR-era beside ``data/upstream/swa_loc/pr23552.diff`` and ``pr24743.diff``, each section headed by
the upstream file and symbols it mirrors, then the toy hybrid model; the switch is
:func:`runner_config`. Without CUDA a runner "replays" the captured step with its capture state."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch


# -- 1. mem_cache/memory_pool.py · MHATokenToKVPool, store_cache -----------------------------------
def store_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                loc: torch.Tensor) -> None:
    """Write one layer's K and V rows at ``loc``: SGLang's torch fallback ``k_cache[loc] = k`` (on
    CUDA its ``store_cache`` kernel takes int32 or int64 as they are; ``index_put_`` would convert
    int32 once per call, so one conversion here keeps it at one kernel per layer)."""
    if loc.dtype != torch.int64:
        loc = loc.to(torch.int64)
    k_cache[loc] = k
    v_cache[loc] = v


class MHATokenToKVPool:
    """Per-layer K and V buffers of ``size + page_size`` rows (row 0: the padding slot)."""

    def __init__(self, size: int, head_num: int, head_dim: int, layer_num: int, dtype: torch.dtype,
                 device, page_size: int = 1):
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        shape = (size + page_size, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor) -> None:
        store_cache(cache_k, cache_v, self.k_buffer[layer_id], self.v_buffer[layer_id], loc)


# -- 2. mem_cache/swa_memory_pool.py · SWAKVPool, SWATokenToKVPoolAllocator ------------------------
class SWAKVPool:
    """KV cache with separate pools for full and SWA attention layers (PR-era ``SWAKVPool``).

    ``layers_mapping``: {layer_id: (index in its sub-pool, is_swa)}. ``set_kv_buffer``'s branch is
    Python: an SWA layer writes at ``self.swa_loc`` when set, else translates ``loc`` right there,
    in every SWA layer; a CUDA graph records whichever side was live at capture — the whole of
    #23552. It takes a layer id (upstream: the layer); ``translate_calls`` counts translations.
    """

    def __init__(self, size: int, size_swa: int, head_num: int, head_dim: int, dtype: torch.dtype,
                 swa_attention_layer_ids: List[int], full_attention_layer_ids: List[int], device,
                 page_size: int = 1):
        self.size, self.size_swa, self.dtype = size, size_swa, dtype
        self.device = torch.device(device)
        self.page_size = page_size
        self.swa_layer_nums = len(swa_attention_layer_ids)
        self.full_layer_nums = len(full_attention_layer_ids)
        self.layer_num = self.swa_layer_nums + self.full_layer_nums
        self.swa_loc: Optional[torch.Tensor] = None
        self.swa_kv_pool = MHATokenToKVPool(size_swa, head_num, head_dim, self.swa_layer_nums,
                                            dtype, device, page_size)
        self.full_kv_pool = MHATokenToKVPool(size, head_num, head_dim, self.full_layer_nums, dtype,
                                             device, page_size)
        self.layers_mapping: Dict[int, Tuple[int, bool]] = {}
        for full_attn_layer_id, global_layer_id in enumerate(full_attention_layer_ids):
            self.layers_mapping[global_layer_id] = (full_attn_layer_id, False)
        for swa_layer_id, global_layer_id in enumerate(swa_attention_layer_ids):
            self.layers_mapping[global_layer_id] = (swa_layer_id, True)
        self.full_to_swa_index_mapping: Optional[torch.Tensor] = None
        self.translate_calls = 0

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def is_swa_layer(self, layer_id: int) -> bool:
        return self.layers_mapping[layer_id][1]

    def set_swa_loc(self, loc: Optional[torch.Tensor]) -> None:
        self.swa_loc = loc

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        assert self.full_to_swa_index_mapping is not None
        self.translate_calls += 1
        # kv_indices could hold -1 (alloc_extend's last_loc): -1 through the trailing entry
        return self.full_to_swa_index_mapping[kv_indices].to(torch.int32)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor) -> None:
        layer_id_pool, is_swa_layer = self.layers_mapping[layer_id]
        if is_swa_layer:
            if self.swa_loc is not None:
                loc = self.swa_loc
            else:
                if self.full_to_swa_index_mapping is not None:
                    loc = self.translate_loc_from_full_to_swa(loc)
            self.swa_kv_pool.set_kv_buffer(layer_id_pool, loc, cache_k, cache_v)
        else:
            self.full_kv_pool.set_kv_buffer(layer_id_pool, loc, cache_k, cache_v)

    def buffers(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(k_buffer, v_buffer) of a global layer id, in its sub-pool (not upstream API)."""
        idx, is_swa = self.layers_mapping[layer_id]
        pool = self.swa_kv_pool if is_swa else self.full_kv_pool
        return pool.k_buffer[idx], pool.v_buffer[idx]


class SWATokenToKVPoolAllocator:
    """Hands out full-pool slots, each paired with an SWA-pool slot through
    ``full_to_swa_index_mapping`` (int64, ``size + 1`` zeros and a trailing ``-1``). Page size 1;
    the free lists are seeded permutations of ``1..size`` (0: the padding slot), so a token's full
    and SWA slots differ, as once a server has run for a while."""

    def __init__(self, size: int, size_swa: int, kvcache: SWAKVPool, *, seed: int = 0):
        self._size_full, self._size_swa = size, size_swa
        self.page_size = 1
        self.device = kvcache.device
        self.full_to_swa_index_mapping = torch.cat([
            torch.zeros(size + self.page_size, dtype=torch.int64, device=self.device),
            torch.tensor([-1], dtype=torch.int64, device=self.device)
        ])
        g = torch.Generator().manual_seed(seed)
        self._free_full = (torch.randperm(size, generator=g) + 1).tolist()
        self._free_swa = (torch.randperm(size_swa, generator=g) + 1).tolist()
        self._kvcache = kvcache
        self._kvcache.register_mapping(self.full_to_swa_index_mapping)

    def available_size(self) -> int:
        return min(len(self._free_full), len(self._free_swa))

    def alloc(self, need_size: int) -> torch.Tensor:
        """``need_size`` full slots (int64, on the pool's device); maps each to a fresh SWA slot."""
        if need_size > self.available_size():
            raise RuntimeError(f"out of KV slots: need {need_size}, have {self.available_size()}")
        full, swa = self._free_full[:need_size], self._free_swa[:need_size]
        del self._free_full[:need_size], self._free_swa[:need_size]
        full_t = torch.tensor(full, dtype=torch.int64, device=self.device)
        self.full_to_swa_index_mapping[full_t] = torch.tensor(swa, dtype=torch.int64,
                                                              device=self.device)
        return full_t

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self._kvcache.translate_loc_from_full_to_swa(kv_indices)


# -- 3. model_executor/forward_batch_info.py · ForwardBatch.out_cache_loc_swa, ForwardBatch.init_new
@dataclass
class ForwardBatch:
    """A decode batch: one new token per request."""

    input_ids: torch.Tensor  # int64 [bs]
    seq_lens: torch.Tensor  # int32 [bs]
    out_cache_loc: torch.Tensor  # int64 [bs], full-pool slots
    out_cache_loc_swa: Optional[torch.Tensor] = None  # int32 [bs], SWA-pool slots

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def init_new(cls, input_ids: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                 allocator: Optional[SWATokenToKVPoolAllocator]) -> "ForwardBatch":
        """As upstream: a hybrid-SWA batch translates ``out_cache_loc`` once, here, outside any
        graph (a graph captured without the preset repeats it in every SWA layer)."""
        out_cache_loc_swa = (allocator.translate_loc_from_full_to_swa(out_cache_loc)
                             if allocator is not None else None)
        return cls(input_ids, seq_lens.to(torch.int32), out_cache_loc, out_cache_loc_swa)


# -- 4. model_executor/model_runner.py · ModelRunner._forward_raw (the path without a CUDA graph)
def forward_eager(model: "ToyHybridModel", batch: ForwardBatch, *,
                  use_precomputed_swa_loc: bool = True) -> torch.Tensor:
    """With ``use_precomputed_swa_loc`` (upstream, when ``out_cache_loc_swa`` is set) the pool's
    ``swa_loc`` is set first (and left set) and no SWA layer translates; without, every one does."""
    if use_precomputed_swa_loc and batch.out_cache_loc_swa is not None:
        model.pool.set_swa_loc(batch.out_cache_loc_swa)
    return model.forward(batch.input_ids, batch.seq_lens, batch.out_cache_loc)


# -- 5. model_executor/cuda_graph_runner.py · DecodeInputBuffers, CudaGraphRunner (decode only) ----
# before   no out_cache_loc_swa buffer, no set_swa_loc before capture: the graph holds the
#          translation (an index gather + an int32 cast) in every SWA layer, every decode step.
# pr23552  an int64 buffer, filled in populate_from_forward_batch, preset before capture; not
#          cleared on a padded batch: padded tokens write at the SWA slots a larger batch left.
# pr24743  the buffer is int32 (what the translation returns) and zeroed on a padded batch.
VARIANTS = ("before", "pr23552", "pr24743")
SWA_LOC_BUFFER_DTYPE = {"before": None, "pr23552": torch.int64, "pr24743": torch.int32}


@dataclass(frozen=True)
class RunnerConfig:
    """The switches a variant sets on :class:`DecodeGraphRunner`."""

    preset_swa_loc: bool
    swa_loc_dtype: Optional[torch.dtype]
    zero_swa_on_pad: bool


def runner_config(variant: str) -> RunnerConfig:
    """The before/after switch: the :class:`RunnerConfig` of one of :data:`VARIANTS`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    return RunnerConfig(preset_swa_loc=variant != "before",
                        swa_loc_dtype=SWA_LOC_BUFFER_DTYPE[variant],
                        zero_swa_on_pad=variant == "pr24743")


@dataclass
class DecodeInputBuffers:
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    out_cache_loc_swa: Optional[torch.Tensor]

    @classmethod
    def create(cls, *, device, max_bs: int, seq_len_fill_value: int = 1,
               is_hybrid_swa: bool = False,
               swa_loc_dtype: torch.dtype = torch.int64) -> "DecodeInputBuffers":
        with torch.device(device):
            input_ids = torch.zeros((max_bs,), dtype=torch.int64)
            seq_lens = torch.full((max_bs,), seq_len_fill_value, dtype=torch.int32)
            out_cache_loc = torch.zeros((max_bs,), dtype=torch.int64)
            out_cache_loc_swa = torch.zeros(
                (max_bs,), dtype=swa_loc_dtype) if is_hybrid_swa else None
        return cls(input_ids, seq_lens, out_cache_loc, out_cache_loc_swa)

    def populate_from_forward_batch(self, *, forward_batch: ForwardBatch, raw_bs: int, bs: int,
                                    seq_len_fill_value: int = 1,
                                    zero_swa_on_pad: bool = True) -> None:
        """Copy a batch of ``raw_bs`` tokens into the static buffers of the ``bs`` graph. Padded
        tokens ``[raw_bs:bs]`` get ``seq_len_fill_value`` and ``out_cache_loc`` 0 (the padding
        slot); ``zero_swa_on_pad`` is #24743: zero ``out_cache_loc_swa`` too, else its tail keeps
        the last slots."""
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
    """Captures one decode step per batch size and replays it (``CudaGraphRunner``, decode only):
    ``preset_swa_loc`` is #23552's ``set_swa_loc`` before capture, ``swa_loc_dtype`` its buffer's
    dtype, ``zero_swa_on_pad`` #24743's zeroing; ``use_cuda_graph`` defaults to a CUDA pool."""

    seq_len_fill_value = 1

    def __init__(self, model: "ToyHybridModel", capture_bs: List[int], *, preset_swa_loc: bool,
                 swa_loc_dtype: Optional[torch.dtype] = torch.int32, zero_swa_on_pad: bool = True,
                 use_cuda_graph: Optional[bool] = None):
        self.model, self.pool = model, model.pool
        self.device = self.pool.device
        self.capture_bs = sorted(set(capture_bs))
        self.max_bs = self.capture_bs[-1]
        self.preset_swa_loc, self.zero_swa_on_pad = preset_swa_loc, zero_swa_on_pad
        on_cuda = self.device.type == "cuda"
        self.use_cuda_graph = on_cuda if use_cuda_graph is None else use_cuda_graph
        if self.use_cuda_graph and not on_cuda:
            raise ValueError("use_cuda_graph needs the pool on a CUDA device")
        # before #23552 there was no buffer to preset from
        self.buffers = DecodeInputBuffers.create(
            device=self.device, max_bs=self.max_bs, seq_len_fill_value=self.seq_len_fill_value,
            is_hybrid_swa=preset_swa_loc, swa_loc_dtype=swa_loc_dtype or torch.int32)
        self.graphs: Dict[int, object] = {}
        self.capture_translate_calls: Dict[int, int] = {}
        self._swa_loc_at_capture: Dict[int, Optional[torch.Tensor]] = {}
        self._mempool = self._stream = None

    @classmethod
    def for_variant(cls, model: "ToyHybridModel", capture_bs: List[int], variant: str,
                    use_cuda_graph: Optional[bool] = None) -> "DecodeGraphRunner":
        cfg = runner_config(variant)
        return cls(model, capture_bs, preset_swa_loc=cfg.preset_swa_loc,
                   swa_loc_dtype=cfg.swa_loc_dtype, zero_swa_on_pad=cfg.zero_swa_on_pad,
                   use_cuda_graph=use_cuda_graph)

    def capture(self) -> None:
        """Capture every batch size, largest first (as upstream)."""
        if not self.preset_swa_loc and self.pool.swa_loc is not None:
            raise ValueError("pool.swa_loc is already set: a graph captured now would read that "
                             "tensor. Build a fresh pool for the runner without the preset.")
        if self.use_cuda_graph:
            self._mempool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(device=self.device)
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def _run_once(self, num_tokens: int) -> torch.Tensor:
        b = self.buffers
        return self.model.forward(b.input_ids[:num_tokens], b.seq_lens[:num_tokens],
                                  b.out_cache_loc[:num_tokens])

    def capture_one_batch_size(self, bs: int) -> None:
        num_tokens = bs
        # #23552: set before capture, so set_kv_buffer's Python branch takes the fast path and the
        # graph records writes at this buffer instead of the per-layer translation
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
        try:  # the raw graph, for counting nodes
            graph, kept = torch.cuda.CUDAGraph(keep_graph=True), True
        except TypeError:  # a torch without keep_graph
            graph, kept = torch.cuda.CUDAGraph(), False
        calls = self.pool.translate_calls
        with torch.cuda.graph(graph, pool=self._mempool, stream=stream):
            self._run_once(num_tokens)
        self.capture_translate_calls[bs] = self.pool.translate_calls - calls
        if kept:
            graph.instantiate()
        torch.cuda.synchronize(self.device)
        self.graphs[bs] = graph

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
        """Populate the buffers from ``forward_batch`` and replay: the padded batch size used."""
        bs = self.replay_prepare(forward_batch)
        self.replay_graph(bs)
        return bs


# -- 6. no upstream file: a toy hybrid model, its setup, a pool comparison -------------------------
def hybrid_layer_ids(num_layers: int, swa_per_full: int) -> Tuple[List[int], List[int]]:
    """(swa ids, full ids) for ``swa_per_full`` sliding-window layers per full layer, the full layer
    last in each group (Gemma 3: 5 local then 1 global; gpt-oss: 1 and 1)."""
    if num_layers < 1:
        raise ValueError("num_layers must be >= 1")
    if swa_per_full < 0:
        raise ValueError("swa_per_full must be >= 0")
    period = swa_per_full + 1
    full = [i for i in range(num_layers) if (i + 1) % period == 0]
    swa = [i for i in range(num_layers) if (i + 1) % period != 0]
    return swa, full


class ToyHybridModel:
    """``num_layers`` attention layers that only write their KV into an :class:`SWAKVPool` (a
    Gemma-3 / gpt-oss stand-in): hidden ``h = embed[input_id] + seq_len``, layer ``l`` writes ``K =
    h * a_l`` and ``V = h * b_l`` (2 elementwise kernels and the KV write)."""

    def __init__(self, pool: SWAKVPool, *, vocab_size: int = 1024, head_num: int, head_dim: int,
                 seed: int = 0):
        self.pool, self.num_layers = pool, pool.layer_num
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab_size, head_num, head_dim,
                                 generator=g).to(pool.dtype).to(pool.device)
        self.k_scale = [1.0 + 0.01 * i for i in range(self.num_layers)]
        self.v_scale = [-1.0 - 0.01 * i for i in range(self.num_layers)]

    def forward(self, input_ids: torch.Tensor, seq_lens: torch.Tensor,
                out_cache_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed[input_ids] + seq_lens.to(self.pool.dtype)[:, None, None]
        for layer_id in range(self.num_layers):
            self.pool.set_kv_buffer(layer_id, out_cache_loc, h * self.k_scale[layer_id],
                                    h * self.v_scale[layer_id])
        return h


@dataclass
class Setup:
    pool: SWAKVPool
    allocator: SWATokenToKVPoolAllocator
    model: ToyHybridModel
    swa_layer_ids: List[int] = field(default_factory=list)
    full_layer_ids: List[int] = field(default_factory=list)


def build_setup(*, num_layers: int, swa_per_full: int = 5, size: int = 1024, size_swa: int = 512,
                head_num: int = 8, head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
                device="cpu", vocab_size: int = 1024, seed: int = 0) -> Setup:
    """Pool, allocator and model; two calls with the same arguments hand out the same slots."""
    swa_ids, full_ids = hybrid_layer_ids(num_layers, swa_per_full)
    pool = SWAKVPool(size, size_swa, head_num, head_dim, dtype, swa_ids, full_ids, device)
    allocator = SWATokenToKVPoolAllocator(size, size_swa, pool, seed=seed)
    model = ToyHybridModel(pool, vocab_size=vocab_size, head_num=head_num, head_dim=head_dim,
                           seed=seed)
    return Setup(pool, allocator, model, swa_ids, full_ids)


def decode_batch(setup: Setup, input_ids: List[int], seq_lens: List[int]) -> ForwardBatch:
    """One new slot per request, and the decode batch (its SWA slots translated once)."""
    dev = setup.pool.device
    return ForwardBatch.init_new(torch.tensor(input_ids, dtype=torch.int64, device=dev),
                                 torch.tensor(seq_lens, dtype=torch.int32, device=dev),
                                 setup.allocator.alloc(len(input_ids)), setup.allocator)


def pool_diff(a: SWAKVPool, b: SWAKVPool, *,
              skip_padding_slot: bool = True) -> Dict[int, List[int]]:
    """{global layer id: sorted slots of its sub-pool where K or V differ}, layers with a difference
    only; slot 0 (the padding slot) skipped by default."""
    out: Dict[int, List[int]] = {}
    for layer_id in sorted(a.layers_mapping):
        (ka, va), (kb, vb) = a.buffers(layer_id), b.buffers(layer_id)
        differs = (ka != kb).flatten(1).any(1) | (va != vb).flatten(1).any(1)
        rows = differs.nonzero().flatten().tolist()
        rows = [r for r in rows if r != 0] if skip_padding_slot else rows
        if rows:
            out[layer_id] = rows
    return out
