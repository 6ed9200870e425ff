"""The real hybrid-SWA pool's decode write in a CUDA graph (#23552, #24743), and the decode buffers, on a GPU.

Pool: ``mem_cache/swa_memory_pool.py`` ``SWAKVPool`` with ``SWATokenToKVPoolAllocator``, 8 layers of which 6 are
SWA, bs 32, bf16; one decode write (``set_kv_buffer`` of every layer) captured in a CUDA graph, three ways:

- ``per_layer``: every SWA layer translates its full-pool location (0.5.1x: the pool's own fallback, no
  ``swa_loc`` set; 0.5.2x: a ``KVWriteLoc`` translated per SWA layer);
- ``once_in_graph``: one translation inside the graph, shared by every layer (0.5.1x: ``set_swa_loc`` inside
  the forward; 0.5.2x: one pre-translated ``KVWriteLoc``);
- ``preset``: translated before capture into a static buffer (0.5.1x: ``set_swa_loc`` before capture, what the
  decode graph runner of #23552 does with ``out_cache_loc_swa``; 0.5.2x: the same buffer in a ``KVWriteLoc``).

``(per_layer - preset) / SWA layers`` is what one translation costs in kernel nodes. What the release's own
translation code predicts (:func:`kernels_per_translation`): a gather, plus a cast kernel where it ends in
``.to(torch.int32)`` of an int64 mapping (0.5.10.post1 to 0.5.12.post1); 0.5.23 is the gather alone.

Buffers: :func:`sglab.sglang.probes.swa_loc.buffer_rows` on CUDA (``DecodeInputBuffers``: dtype of
``out_cache_loc_swa``, its padded tail after a padded populate).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types

from sglab.sglang.gpu import graphs

LAYERS = 8
FULL_LAYERS = (3, 7)
SWA_LAYERS = tuple(i for i in range(LAYERS) if i not in FULL_LAYERS)
BS, HEADS, HEAD_DIM = 32, 8, 128
SIZE, SIZE_SWA = 4096, 1024
VARIANTS = ("per_layer", "once_in_graph", "preset")


def translation_source(fn) -> str:
    """The body of a release's ``translate_loc_from_full_to_swa`` without comments or docstring."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return "\n".join(ast.unparse(stmt) for stmt in _without_docstring(tree.body[0].body))


def release_translation(release: str) -> str:
    """The translation body of an installed release, read from its source file (no import): what a test on a
    machine without a GPU compares the GPU run with."""
    from sglab.sglang.releases import package_dir

    path = package_dir(release) / "srt" / "mem_cache" / "swa_memory_pool.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "SWAKVPool":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "translate_loc_from_full_to_swa":
                    return "\n".join(ast.unparse(stmt) for stmt in _without_docstring(fn.body))
    raise ValueError(f"sglang {release}: no SWAKVPool.translate_loc_from_full_to_swa in {path}")


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        return body[1:]
    return body


def kernels_per_translation(source: str, mapping_dtype: str = "int64") -> int:
    """Kernels one translation launches, read from its code: the gather ``mapping[kv_indices]``, plus one cast
    when the result is converted with ``.to(torch.int32)`` from a mapping that is not int32 already."""
    if "full_to_swa_index_mapping[" not in source:
        raise ValueError(f"not the PR-era or current translation (no mapping gather): {source!r}")
    cast = ".to(torch.int32)" in source and mapping_dtype != "int32"
    return 1 + int(cast)


def _modules(prepared):
    from sglab.sglang import bootstrap

    swa = bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.swa_memory_pool")
    alloc = swa if hasattr(swa, "SWATokenToKVPoolAllocator") else \
        bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.allocator.swa")
    return swa, alloc


def build(prepared, device: str = "cuda"):
    """(pool, allocator) of the release on ``device``, in this probe's shape."""
    import torch

    from sglab.sglang.probes.swa_loc import _kwargs_for

    swa, alloc_mod = _modules(prepared)
    pool = swa.SWAKVPool(**_kwargs_for(swa.SWAKVPool.__init__, dict(
        size=SIZE, size_swa=SIZE_SWA, page_size=1, dtype=torch.bfloat16, head_num=HEADS, head_dim=HEAD_DIM,
        swa_attention_layer_ids=list(SWA_LAYERS), full_attention_layer_ids=list(FULL_LAYERS),
        enable_kvcache_transpose=False, device=device, enable_memory_saver=False)))
    allocator = alloc_mod.SWATokenToKVPoolAllocator(**_kwargs_for(alloc_mod.SWATokenToKVPoolAllocator.__init__, dict(
        size=SIZE, size_swa=SIZE_SWA, page_size=1, dtype=torch.bfloat16, device=device, kvcache=pool,
        need_sort=False)))
    return pool, allocator


def _writers(pool, loc, ks, vs, write_loc_cls):
    """{variant: (set-up before capture, the captured write)}; the real ``set_kv_buffer`` in every one."""
    layers = [types.SimpleNamespace(layer_id=i) for i in range(LAYERS)]
    translate = pool.translate_loc_from_full_to_swa
    static = {}

    def write(locs):
        for i, layer in enumerate(layers):
            pool.set_kv_buffer(layer, locs[i], ks[i], vs[i])

    if write_loc_cls is None:             # 0.5.1x: the pool holds the SWA location (set_swa_loc)
        def setup(variant):
            pool.set_swa_loc(translate(loc) if variant == "preset" else None)

        def once():
            pool.set_swa_loc(translate(loc))
            write([loc] * LAYERS)

        fns = {"per_layer": lambda: write([loc] * LAYERS), "once_in_graph": once,
               "preset": lambda: write([loc] * LAYERS)}
    else:                                  # 0.5.2x: the caller passes it in a KVWriteLoc
        W = write_loc_cls

        def setup(variant):
            static["swa"] = translate(loc) if variant == "preset" else None

        def per_layer():
            write([W(loc=loc, swa_loc=translate(loc)) if i in SWA_LAYERS else W(loc=loc) for i in range(LAYERS)])

        def once():
            w = W(loc=loc, swa_loc=translate(loc))
            write([w] * LAYERS)

        fns = {"per_layer": per_layer, "once_in_graph": once,
               "preset": lambda: write([W(loc=loc, swa_loc=static["swa"])] * LAYERS)}
    return setup, fns


def _landed(pool, allocator, loc, ks) -> bool:
    """After a replay into zeroed buffers: every layer's K rows sit where the allocator put them (SWA layers at
    the paired SWA slots)."""
    import torch

    if loc.is_cuda:
        torch.cuda.synchronize()
    swa_slots = allocator.full_to_swa_index_mapping[loc].long()
    ok = True
    for i in range(LAYERS):
        pool_layer, is_swa = pool.layers_mapping[i]
        sub = pool.swa_kv_pool if is_swa else pool.full_kv_pool
        rows = sub.k_buffer[pool_layer][swa_slots if is_swa else loc]
        ok = ok and bool(torch.equal(rows.reshape(BS, -1), ks[i].reshape(BS, -1)))
    return ok


def _zero(pool) -> None:
    for sub in (pool.swa_kv_pool, pool.full_kv_pool):
        for b in list(sub.k_buffer) + list(sub.v_buffer):
            b.zero_()


def _count_translations(pool):
    """(list that grows by one per translation, the release's own bound method): the instance's translate
    method wrapped, so the pool's internal calls (0.5.1x) and the caller's (0.5.2x) are both counted."""
    calls, real = [], pool.translate_loc_from_full_to_swa

    def counted(kv_indices):
        calls.append(1)
        return real(kv_indices)

    pool.translate_loc_from_full_to_swa = counted
    return calls, real


def pool_rows(prepared, params: dict) -> list[dict]:
    """Each variant: translations one forward makes, where the rows landed after a replay, the graph's kernels;
    then the replay times, interleaved. ``params["device"] == "cpu"`` (a dry run on a machine without CUDA):
    the same writes eagerly, no graph, no timing."""
    import torch

    device = params.get("device", "cuda")
    pool, allocator = build(prepared, device)
    write_loc_cls = None
    if not hasattr(pool, "set_swa_loc"):
        from sglab.sglang import bootstrap

        write_loc_cls = bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.memory_pool").KVWriteLoc
    loc = allocator.alloc(BS)
    gen = torch.Generator(device=device).manual_seed(0)
    ks = [torch.randn(BS, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
          for _ in range(LAYERS)]
    vs = [torch.randn_like(k) for k in ks]
    calls, real = _count_translations(pool)
    setup, fns = _writers(pool, loc, ks, vs, write_loc_cls)
    rows, captured = [], {}
    for variant in VARIANTS:
        setup(variant)
        calls.clear()
        fns[variant]()                         # one eager forward: the translations it makes
        rows.append({"variant": variant, "metric": "translate_calls", "value": len(calls), "unit": "calls"})
        if device == "cuda":
            captured[variant] = graphs.capture(fns[variant])
        _zero(pool)
        if device == "cuda":
            captured[variant].replay()
        else:
            fns[variant]()
        rows.append({"variant": variant, "metric": "rows_landed", "value": _landed(pool, allocator, loc, ks),
                     "unit": "graph replay" if device == "cuda" else "eager"})
        if device == "cuda":
            rows += graphs.count_rows(variant, captured[variant])
    if hasattr(pool, "set_swa_loc"):
        pool.set_swa_loc(None)
    if captured:
        rows += graphs.timing_rows(captured, rounds=params.get("rounds", 5), repeat=params.get("repeat", 200))
    return rows + _derived(rows, real, allocator)


def _derived(rows: list[dict], translate, allocator) -> list[dict]:
    """Nodes per SWA layer (measured) beside what the release's translation code predicts."""
    nodes = {r["variant"]: r["value"] for r in rows if r["metric"] == "kernel_nodes"}
    source = translation_source(translate)
    mapping_dtype = str(allocator.full_to_swa_index_mapping.dtype).replace("torch.", "")
    k = kernels_per_translation(source, mapping_dtype)
    n = len(SWA_LAYERS)
    out = [
        {"variant": "setup", "metric": "layers", "value": LAYERS, "unit": "layers"},
        {"variant": "setup", "metric": "swa_layers", "value": n, "unit": "layers"},
        {"variant": "setup", "metric": "batch_size", "value": BS, "unit": "tokens"},
        {"variant": "setup", "metric": "translation_source", "value": source, "unit": ""},
        {"variant": "setup", "metric": "mapping_dtype", "value": mapping_dtype, "unit": ""},
        {"variant": "per_layer-preset", "metric": "expected_nodes_per_swa_layer", "value": k, "unit": "nodes"},
    ]
    if nodes:
        out += [{"variant": "per_layer-preset", "metric": "nodes_per_swa_layer",
                 "value": (nodes["per_layer"] - nodes["preset"]) / n, "unit": "nodes"},
                {"variant": "per_layer-once_in_graph", "metric": "node_difference",
                 "value": nodes["per_layer"] - nodes["once_in_graph"], "unit": "nodes"}]
    return out


def buffer_rows(prepared, device: str = "cuda") -> list[dict]:
    """The decode buffers on ``device``, as tidy rows (variant ``decode_buffers``)."""
    from sglab.sglang.probing import has_file
    from sglab.sglang.probes.swa_loc import buffer_rows as cpu_rows

    if not has_file(prepared, "srt/model_executor/cuda_graph_runner.py"):
        return []
    return [{"variant": "decode_buffers", "metric": r["metric"], "value": r["value"], "unit": ""}
            for r in cpu_rows(prepared, device)]


def run(prepared, params: dict) -> list[dict]:
    """Rows ``variant, metric, value, unit`` (and ``kernel`` for node names)."""
    device = params.get("device", "cuda")
    if device == "cuda":
        graphs.require_cuda(prepared)
    rows = graphs.device_rows()
    if params.get("pool", True):
        rows += pool_rows(prepared, params)
    if params.get("buffers", True):
        rows += buffer_rows(prepared, device)
    return rows
