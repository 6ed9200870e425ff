"""The real hybrid-SWA KV pool and decode input buffers (#23552, #24743), on the CPU (or CUDA where present).

Pool (``mem_cache/swa_memory_pool.py`` ``SWAKVPool`` with ``SWATokenToKVPoolAllocator``, page size 1): a
4-layer write (2 SWA layers) of one decode step, counting the pool's ``translate_loc_from_full_to_swa``
calls, with and without ``set_swa_loc`` where the release has it; 0.5.2x passes a ``KVWriteLoc`` whose SWA
location is translated once by the caller. Every case also checks where the rows landed: an SWA layer's K
must sit at the SWA slot the allocator paired with each full slot.

Translation: the aten ops one ``translate_loc_from_full_to_swa`` dispatches (each a kernel node when a GPU
captures it): ``full_to_swa_index_mapping[loc].to(torch.int32)`` up to 0.5.12.post1 is a gather and a cast, the
bare gather of 0.5.13 on is one.

Buffers (``model_executor/cuda_graph_runner.py`` ``DecodeInputBuffers``; releases up to 0.5.13 have the file,
0.5.11 on have the ``out_cache_loc_swa`` field): dtype of the field, and its padded tail after a full populate
(SWA slots 11..14) followed by a padded one (2 real tokens into the 4-token graph).
"""

from __future__ import annotations

import inspect
import types

from sglab.sglang.probing import has_file

SWA_LAYERS, FULL_LAYERS = [0, 2], [1, 3]
HEAD_NUM, HEAD_DIM = 2, 4


def _kwargs_for(fn, values: dict) -> dict:
    """The subset of ``values`` that ``fn`` accepts (signatures differ between releases)."""
    params = inspect.signature(fn).parameters
    missing = [n for n, p in params.items() if p.default is p.empty and p.kind is p.KEYWORD_ONLY
               and n not in values]
    if missing:
        raise TypeError(f"{fn.__qualname__} needs {missing}, which this probe does not know")
    return {k: v for k, v in values.items() if k in params}


def device_of(params: dict) -> str:
    """``params["device"]``, else CUDA where torch sees it (SGLang's CUDA paths, e.g. its store_cache kernel,
    expect CUDA tensors there), else the CPU."""
    import torch

    return params.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")


def build_pool(prepared, device: str = "cpu"):
    """(pool, allocator) of the release on ``device``."""
    import torch

    from sglab.sglang import bootstrap

    swa = bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.swa_memory_pool")
    alloc_mod = swa if hasattr(swa, "SWATokenToKVPoolAllocator") else \
        bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.allocator.swa")
    pool = swa.SWAKVPool(**_kwargs_for(swa.SWAKVPool.__init__, dict(
        size=16, size_swa=6, page_size=1, dtype=torch.float32, head_num=HEAD_NUM, head_dim=HEAD_DIM,
        swa_attention_layer_ids=SWA_LAYERS, full_attention_layer_ids=FULL_LAYERS, enable_kvcache_transpose=False,
        device=device, enable_memory_saver=False)))
    allocator = alloc_mod.SWATokenToKVPoolAllocator(**_kwargs_for(alloc_mod.SWATokenToKVPoolAllocator.__init__, dict(
        size=16, size_swa=6, page_size=1, dtype=torch.float32, device=device, kvcache=pool, need_sort=False)))
    return pool, allocator


def _count_translations(pool) -> list:
    """Wrap the instance's translate method; the list grows by one per call."""
    calls, real = [], pool.translate_loc_from_full_to_swa

    def counted(kv_indices):
        calls.append(1)
        return real(kv_indices)

    pool.translate_loc_from_full_to_swa = counted
    return calls


def _write_step(prepared, mode: str, device: str) -> dict:
    """One decode step of 3 tokens through all 4 layers; ``mode``: ``no_swa_loc`` (no ``swa_loc``),
    ``set_swa_loc`` (0.5.10.post1-0.5.12.post1: set before the layers), ``swa_loc_arg`` (0.5.13: passed to each
    write) or ``write_loc`` (0.5.2x: ``KVWriteLoc``)."""
    import torch

    pool, allocator = build_pool(prepared, device)
    loc = allocator.alloc(3)
    swa_slots = allocator.full_to_swa_index_mapping[loc].to(torch.int64)
    calls = _count_translations(pool)
    k = torch.arange(3 * HEAD_NUM * HEAD_DIM, dtype=torch.float32, device=device).reshape(3, HEAD_NUM, HEAD_DIM) + 1
    target, error, extra = loc, None, {}
    if mode == "swa_loc_arg":            # 0.5.13: the caller translates once and passes swa_loc= to every layer
        extra = {"swa_loc": allocator.translate_loc_from_full_to_swa(loc)}
        calls.clear()
    elif mode == "set_swa_loc":
        pool.set_swa_loc(allocator.translate_loc_from_full_to_swa(loc))
        calls.clear()                    # the one translation ForwardBatch.init_new makes, outside the layers
    elif mode == "write_loc":
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        target = KVWriteLoc(loc=loc, swa_loc=allocator.translate_loc_from_full_to_swa(loc))
        calls.clear()
    try:
        for layer_id in range(4):
            pool.set_kv_buffer(types.SimpleNamespace(layer_id=layer_id), target, k * (layer_id + 1), -k, **extra)
    except AssertionError as exc:
        error = f"AssertionError: {exc}".strip().rstrip(":")
    landed = None
    if error is None:
        k_swa = pool.swa_kv_pool.k_buffer[0]      # SWA layer 0's buffer in the SWA sub-pool
        landed = bool(torch.equal(k_swa[swa_slots], k))
    return {"translate_calls": len(calls), "error": error, "swa_rows_at_paired_slots": landed,
            "translate_dtype": str(allocator.translate_loc_from_full_to_swa(loc).dtype).replace("torch.", "")}


def pool_rows(prepared, device: str) -> list[dict]:
    pool, _ = build_pool(prepared, device)
    modes = ["no_swa_loc"]
    if hasattr(pool, "set_swa_loc"):
        modes.append("set_swa_loc")
    write_params = inspect.signature(pool.set_kv_buffer).parameters
    if "swa_loc" in write_params:
        modes.append("swa_loc_arg")
    if "loc_info" in write_params:
        modes.append("write_loc")
    rows = [{"part": "pool", "case": "has_set_swa_loc", "metric": "value", "value": hasattr(pool, "set_swa_loc")}]
    for mode in modes:
        for metric, value in _write_step(prepared, mode, device).items():
            rows.append({"part": "pool", "case": mode, "metric": metric, "value": value})
    return rows


def dispatched_ops(fn, *args) -> list[str]:
    """The aten ops ``fn(*args)`` dispatches that compute something (views left out): on a GPU each one is a
    kernel launch, and a kernel node when captured in a CUDA graph. Works on the CPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[str] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if not func.is_view:
                ops.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with _Record():
        fn(*args)
    return ops


def translation_rows(prepared, device: str) -> list[dict]:
    """One translation of 3 full slots by the pool's ``translate_loc_from_full_to_swa``: the aten ops it
    dispatches, the mapping's dtype and the release's own ``return`` line."""
    pool, allocator = build_pool(prepared, device)
    loc = allocator.alloc(3)
    fn = pool.translate_loc_from_full_to_swa
    source = [ln.strip() for ln in inspect.getsource(fn).splitlines() if ln.strip().startswith("return ")]
    mapping = getattr(pool, "full_to_swa_index_mapping", None)
    return [{"part": "translation", "case": "pool", "metric": "ops", "value": dispatched_ops(fn, loc)},
            {"part": "translation", "case": "pool", "metric": "mapping_dtype",
             "value": str(mapping.dtype).replace("torch.", "") if mapping is not None else None},
            {"part": "translation", "case": "pool", "metric": "source", "value": source[-1] if source else None}]


def _forward_batch(out_cache_loc_swa, n: int, device: str):
    import torch

    z = torch.zeros(n, dtype=torch.int64, device=device)
    return types.SimpleNamespace(
        input_ids=z.clone(), req_pool_indices=z.clone(), seq_lens=torch.full((n,), 5, dtype=torch.int32, device=device),
        seq_lens_cpu=torch.full((n,), 5, dtype=torch.int32), out_cache_loc=torch.arange(1, n + 1, device=device),
        positions=z.clone(), out_cache_loc_swa=torch.tensor(out_cache_loc_swa, dtype=torch.int32, device=device),
        mrope_positions=None, encoder_lens=None, mamba_track_indices=None, mamba_track_mask=None,
        ngram_embedding_info=None, num_token_non_padded=torch.tensor([n], dtype=torch.int32, device=device))


def buffer_rows(prepared, device: str) -> list[dict]:
    """``DecodeInputBuffers``: the field's dtype and the padded tail after a padded populate."""
    import torch

    from sglab.sglang import bootstrap

    cgr = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.cuda_graph_runner")
    DIB = getattr(cgr, "DecodeInputBuffers", None)
    has_field = DIB is not None and "out_cache_loc_swa" in getattr(DIB, "__annotations__", {})
    rows = [{"part": "buffers", "case": "decode", "metric": "has_out_cache_loc_swa", "value": has_field}]
    if not has_field:
        return rows
    buf = DIB.create(**_kwargs_for(DIB.create, dict(
        device=device, max_bs=4, max_num_token=4, hidden_size=8, vocab_size=16, dtype=torch.float32, dp_size=1,
        pp_size=1, is_encoder_decoder=False, require_mlp_tp_gather=False, seq_len_fill_value=1,
        encoder_len_fill_value=0, num_tokens_per_bs=1, cache_loc_dtype=torch.int64, enable_mamba_track=False,
        ne_token_table=None, is_hybrid_swa=True)))
    populate = dict(raw_num_token=None, seq_len_fill_value=1, require_gathered_buffer=False, num_tokens_per_bs=1,
                    nsa_enable_prefill_cp=False, enable_num_token_non_padded_flag=False, pp_proxy_tensors=None)
    for swa, raw_bs in (([11, 12, 13, 14], 4), ([21, 22], 2)):
        args = {**populate, "forward_batch": _forward_batch(swa, raw_bs, device), "raw_bs": raw_bs,
                "raw_num_token": raw_bs, "bs": 4}
        buf.populate_from_forward_batch(**_kwargs_for(buf.populate_from_forward_batch, args))
    tail = buf.out_cache_loc_swa[2:4].tolist()
    rows += [{"part": "buffers", "case": "decode", "metric": "dtype",
              "value": str(buf.out_cache_loc_swa.dtype).replace("torch.", "")},
             {"part": "buffers", "case": "decode", "metric": "padded_tail_after_padded_populate", "value": tail},
             {"part": "buffers", "case": "decode", "metric": "real_part_after_padded_populate",
              "value": buf.out_cache_loc_swa[:2].tolist()}]
    return rows


def run(prepared, params: dict) -> list[dict]:
    """Rows ``part, case, metric, value``: the pool (every release) and the decode buffers (0.5.1x)."""
    device = device_of(params)
    rows = [{"part": "pool", "case": "device", "metric": "value", "value": device}] + pool_rows(prepared, device)
    rows += translation_rows(prepared, device)
    # 0.5.14 moved the decode runner to model_executor/runner/ (another buffer class); the PR-era class is
    # what #23552 and #24743 changed
    if not params.get("pool_only") and has_file(prepared, "srt/model_executor/cuda_graph_runner.py"):
        rows += buffer_rows(prepared, device)
    return rows
