"""The SWA location preset in real SGLang: the fix's record ``FIX``, its source check, its CPU probe
(in a release's worker), the engine scenario, the code path, and the real answers beside the
rebuild's (:func:`compare`)."""

from __future__ import annotations

import ast
import functools
import inspect
import types

from sglab.core import lazy
from sglab.sglang import bootstrap, compare as real, source as S
from sglab.sglang.engine import Case, Scenario, revert_adjustment
from sglab.sglang.codepath import Node
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import has_file
from sglab.sglang.releases import parse_version
from sglab.sglang.upstream import Verdict


torch = lazy.Module("torch")  # for the probes and the comparison: reading FIX needs neither
rebuild = lazy.Module("sglab.swa_loc.rebuild")

SWA_POOL = "srt/mem_cache/swa_memory_pool.py"
DECODE_RUNNER = "srt/model_executor/cuda_graph_runner.py"
PROBE_RELEASES = ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.23")
BUFFER_VARIANT = {"0.5.10.post1": "before", "0.5.11": "pr23552", "0.5.12.post1": "pr24743"}
PR_ERA_RELEASES = ("0.5.10.post1", "0.5.11", "0.5.12.post1")  # translate: a gather, an int32 cast
KERNELS_PER_TRANSLATION_TODAY = 1  # 0.5.13 on: one gather


# -- the source check (the release timeline, `sglab upstream`) -------------------------------------
def _swa_buffer_facts(tree) -> tuple:
    """#24743's pair: the decode buffer's dtype, whether a padded populate zeroes it."""
    create = S.find(tree, "DecodeInputBuffers.create")
    dtype = None
    for value in S.assignments(create, "out_cache_loc_swa"):
        for call in S.calls(value, "zeros"):
            kw = S.keyword(call, "dtype")
            dtype = ast.unparse(kw) if kw is not None else dtype
    populate = S.find(tree, "DecodeInputBuffers.populate_from_forward_batch")
    zeroed = any(
        ast.unparse(c.func).endswith("out_cache_loc_swa.zero_") for c in S.calls(populate, "zero_"))
    return dtype, zeroed


def swa_padding_zeroed(read) -> bool:
    """Whether the decode buffers zero ``out_cache_loc_swa`` on a padded populate (#24743's fix)."""
    _, tree = S.parsed(read, DECODE_RUNNER)
    return tree is not None and _swa_buffer_facts(tree)[1]


def check(read) -> Verdict:
    """The state of #23552 (and #24743) in one SGLang, from its SWA pool and decode runner."""
    src, tree = S.parsed(read, SWA_POOL)
    if src is None:
        return Verdict("absent",
                       "no mem_cache/swa_memory_pool.py: no hybrid SWA KV pool in this SGLang")
    set_kv = S.find(tree, "SWAKVPool.set_kv_buffer")
    if set_kv is None:
        return Verdict("unknown", "mem_cache/swa_memory_pool.py has no SWAKVPool.set_kv_buffer")
    if not S.calls(set_kv, "translate_loc_from_full_to_swa"):
        if S.find(tree, "SWAKVPool.set_swa_loc") is None and S.mentions(set_kv, "swa_loc"):
            return Verdict(
                "changed", "SWAKVPool.set_kv_buffer never translates: it is handed the SWA "
                "location translated once per forward (set_swa_loc is gone, nothing to preset)")
        return Verdict("unknown", "SWAKVPool.set_kv_buffer neither translates nor takes a swa_loc")
    _, runner = S.parsed(read, DECODE_RUNNER)
    capture = S.find(runner, "CudaGraphRunner.capture_one_batch_size")
    if capture is None:
        return Verdict(
            "unknown", "set_kv_buffer translates unless swa_loc is set, but the decode runner's "
            "CudaGraphRunner.capture_one_batch_size was not found")
    presets = [c for c in S.calls(capture, "set_swa_loc") if "out_cache_loc_swa" in ast.unparse(c)]
    if not presets:
        return Verdict(
            "before", "set_kv_buffer translates unless swa_loc is set, and capture_one_batch_size "
            "sets none: every SWA layer's translation is captured into the decode graph")
    dtype, zeroed = _swa_buffer_facts(runner)
    tail = (f"#24743: padded tail zeroed, {dtype} buffer"
            if zeroed else f"#24743 not yet: padded tail not zeroed, {dtype} buffer")
    return Verdict(
        "pr-era", f"capture_one_batch_size presets set_swa_loc(out_cache_loc_swa) before capture "
        f"(#23552); {tail}")


# -- the CPU probe (inside one release's worker process) -------------------------------------------
SWA_LAYERS, FULL_LAYERS = [0, 2], [1, 3]
HEAD_NUM, HEAD_DIM = 2, 4
PRESET_CASE = dict(set_swa_loc="set_swa_loc() before the layers",
                   swa_loc_arg="swa_loc= passed to each write",
                   write_loc="KVWriteLoc carrying swa_loc")


def kwargs_for(fn, values: dict) -> dict:
    """The subset of ``values`` that ``fn`` accepts (signatures differ between releases)."""
    params = inspect.signature(fn).parameters
    required = [n for n, p in params.items() if p.default is p.empty and p.kind is p.KEYWORD_ONLY]
    if missing := [n for n in required if n not in values]:
        raise TypeError(f"{fn.__qualname__} needs {missing}, which this probe does not know")
    return {k: v for k, v in values.items() if k in params}


def build_pool(prepared, device: str = "cpu"):
    """The release's (pool, allocator): 16 full and 6 SWA slots, float32, SWA layers 0, 2 of 4."""
    swa = bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.swa_memory_pool")
    alloc_mod = swa if hasattr(swa, "SWATokenToKVPoolAllocator") else \
        bootstrap.import_release_module(prepared, "sglang.srt.mem_cache.allocator.swa")
    size = dict(size=16, size_swa=6, page_size=1, dtype=torch.float32, device=device)
    pool = swa.SWAKVPool(**kwargs_for(
        swa.SWAKVPool.__init__,
        dict(**size, head_num=HEAD_NUM, head_dim=HEAD_DIM, swa_attention_layer_ids=list(
            SWA_LAYERS), full_attention_layer_ids=list(FULL_LAYERS), enable_kvcache_transpose=False,
             enable_memory_saver=False)))
    allocator = alloc_mod.SWATokenToKVPoolAllocator(**kwargs_for(
        alloc_mod.SWATokenToKVPoolAllocator.__init__, dict(**size, kvcache=pool, need_sort=False)))
    return pool, allocator


def _write_step(prepared, mode: str, device: str) -> dict:
    """One decode step of 3 tokens through all 4 layers, the SWA location given as ``mode`` says."""
    pool, allocator = build_pool(prepared, device)
    loc = allocator.alloc(3)
    swa_slots = allocator.full_to_swa_index_mapping[loc].to(torch.int64)
    calls, translate = [], pool.translate_loc_from_full_to_swa  # the pool's own and a caller's
    pool.translate_loc_from_full_to_swa = lambda indices: calls.append(1) or translate(indices)
    k = torch.arange(3 * HEAD_NUM * HEAD_DIM, dtype=torch.float32, device=device).reshape(
        3, HEAD_NUM, HEAD_DIM) + 1
    target, error, extra = loc, None, {}
    if mode == "swa_loc_arg":  # the caller translates once and passes swa_loc= to every layer
        extra = {"swa_loc": allocator.translate_loc_from_full_to_swa(loc)}
    elif mode == "set_swa_loc":  # the one translation ForwardBatch.init_new makes
        pool.set_swa_loc(allocator.translate_loc_from_full_to_swa(loc))
    elif mode == "write_loc":
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        target = KVWriteLoc(loc=loc, swa_loc=allocator.translate_loc_from_full_to_swa(loc))
    calls.clear()
    try:
        for layer_id in range(4):
            pool.set_kv_buffer(types.SimpleNamespace(layer_id=layer_id), target, k * (layer_id + 1),
                               -k, **extra)
    except AssertionError as exc:
        error = f"AssertionError: {exc}".strip().rstrip(":")
    landed = None if error else bool(torch.equal(pool.swa_kv_pool.k_buffer[0][swa_slots], k))
    n_calls = len(calls)  # before the translation below, which only reads the dtype
    return dict(translate_calls=n_calls, error=error, swa_rows_at_paired_slots=landed,
                translate_dtype=_dtype(allocator.translate_loc_from_full_to_swa(loc)))


def _rows(part: str, case: str, values: dict) -> list:
    return [{"part": part, "case": case, "metric": m, "value": v} for m, v in values.items()]


def _dtype(tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def dispatched_ops(fn, *args) -> list:
    """The aten ops ``fn(*args)`` dispatches, views left out (on a GPU each a kernel)."""
    from sglab.core.kernel_table import DispatchMode

    ops: list = []

    class _Record(DispatchMode):

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if not func.is_view:
                ops.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with _Record():
        fn(*args)
    return ops


def _forward_batch(out_cache_loc_swa, n: int, device: str):
    i64, arange = torch.zeros(n, dtype=torch.int64, device=device), torch.arange(1, n + 1)
    int32 = functools.partial(torch.tensor, dtype=torch.int32, device=device)
    unused = ("mrope_positions", "encoder_lens", "mamba_track_indices", "mamba_track_mask",
              "ngram_embedding_info")
    return types.SimpleNamespace(
        input_ids=i64.clone(), req_pool_indices=i64.clone(), positions=i64.clone(),
        seq_lens=int32([5] * n), seq_lens_cpu=torch.full(
            (n,), 5, dtype=torch.int32), out_cache_loc=arange.to(device),
        out_cache_loc_swa=int32(out_cache_loc_swa), num_token_non_padded=int32([n]),
        **dict.fromkeys(unused))


def buffer_rows(prepared, device: str) -> list:
    """``DecodeInputBuffers``: its dtype and padded tail after a full, then a padded populate."""
    cgr = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.cuda_graph_runner")
    dib = getattr(cgr, "DecodeInputBuffers", None)
    has_field = dib is not None and "out_cache_loc_swa" in getattr(dib, "__annotations__", {})
    rows = _rows("buffers", "decode", {"has_out_cache_loc_swa": has_field})
    if not has_field:
        return rows
    buf = dib.create(**kwargs_for(
        dib.create,
        dict(device=device, max_bs=4, max_num_token=4, hidden_size=8, vocab_size=16,
             dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False,
             require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0,
             num_tokens_per_bs=1, cache_loc_dtype=torch.int64, enable_mamba_track=False,
             ne_token_table=None, is_hybrid_swa=True)))
    populate = dict(seq_len_fill_value=1, require_gathered_buffer=False, num_tokens_per_bs=1,
                    nsa_enable_prefill_cp=False, enable_num_token_non_padded_flag=False,
                    pp_proxy_tensors=None)
    for swa, raw_bs in (([11, 12, 13, 14], 4), ([21, 22], 2)):
        args = dict(populate, forward_batch=_forward_batch(swa, raw_bs, device), raw_bs=raw_bs,
                    raw_num_token=raw_bs, bs=4)
        buf.populate_from_forward_batch(**kwargs_for(buf.populate_from_forward_batch, args))
    swa = buf.out_cache_loc_swa
    return rows + _rows(
        "buffers", "decode",
        dict(dtype=_dtype(swa), padded_tail_after_padded_populate=swa[2:4].tolist(),
             real_part_after_padded_populate=swa[:2].tolist()))


def probe(prepared, params: dict) -> list:
    """Rows ``part, case, metric, value``: the pool, one translation, the decode buffers."""
    device = params.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    pool, allocator = build_pool(prepared, device)
    modes = ["no_swa_loc"] + (["set_swa_loc"] if hasattr(pool, "set_swa_loc") else [])
    write_params = inspect.signature(pool.set_kv_buffer).parameters
    modes += (["swa_loc_arg"] if "swa_loc" in write_params else []) + \
             (["write_loc"] if "loc_info" in write_params else [])
    rows = _rows("pool", "device", {"value": device})
    rows += _rows("pool", "has_set_swa_loc", {"value": hasattr(pool, "set_swa_loc")})
    for mode in modes:
        rows += _rows("pool", mode, _write_step(prepared, mode, device))
    # one translation of 3 full slots: its aten ops, the mapping's dtype, the ``return`` line
    fn, mapping = pool.translate_loc_from_full_to_swa, getattr(pool, "full_to_swa_index_mapping",
                                                               None)
    source = [ln.strip() for ln in inspect.getsource(fn).splitlines()]
    source = [ln for ln in source if ln.startswith("return ")]
    rows += _rows(
        "translation", "pool",
        dict(ops=dispatched_ops(fn, allocator.alloc(3)),
             mapping_dtype=_dtype(mapping) if mapping is not None else None,
             source=source[-1] if source else None))
    if not params.get("pool_only") and has_file(prepared, DECODE_RUNNER):
        rows += buffer_rows(prepared, device)
    return rows


# -- the real engine: `sglab engine --scenario NAME`, recorded under data/recorded/engine_swa_loc/
PR_DIFF = "data/upstream/swa_loc/pr23552.diff"
PRESET_REVERTED = revert_adjustment(
    "revert-pr23552-swa-loc-preset",
    "the 'before' of #23552 never ran as a whole engine in the engine runs' environment "
    "(0.5.10.post1 pins torch 2.9.1): on 0.5.11 the PR's hunk in "
    "CudaGraphRunner.capture_one_batch_size (the set_swa_loc preset before capture, read from "
    f"{PR_DIFF}) is removed, nothing else; the case 'before' in the tables",
    "sglang.srt.model_executor.cuda_graph_runner", "CudaGraphRunner.capture_one_batch_size",
    diff=PR_DIFF, contains="set_swa_loc")
# starts: the decode times with the spread between starts (no claim rests on them)
ENGINE = (Scenario(
    fix="swa_loc", name="04-swa-kernels",
    what="GPT-OSS-style model (8 layers, 4 sliding-window): kernels per decode-graph replay and "
    "per layer from bench_one_batch's own decode trace; 'before' = 0.5.11 with #23552's preset "
    "reverted", model="gpt_oss_swa", tool="bench", releases=("0.5.11", "0.5.12.post1", "0.5.13"),
    cases=(Case("released"), Case("before", (), (PRESET_REVERTED,), releases=("0.5.11",))),
    batch_sizes=(32,), input_lens=(256,), output_len=16, profile=True, starts=3,
    expect="before: the translation's gather and int32 cast in every SWA layer of every replay, 2 "
    "kernels per SWA layer more than 0.5.11 released"),)

_BUFFERS = ("DecodeInputBuffers.create", "DecodeInputBuffers.populate_from_forward_batch")
FIX = Fix(
    name="swa_loc", number="04", prs=(23552, 24743), gpus=1,
    title="SWA location preset before decode-graph capture (#23552, #24743)", check=check,
    lacking=("#24743 not yet", "partly fixed (#23552 without #24743: padded tokens can write "
             "into live SWA slots)"),
    hunks=(Spec(23552, symbols_in(DECODE_RUNNER, *_BUFFERS,
                                  "CudaGraphRunner.capture_one_batch_size")),
           Spec(24743, symbols_in(DECODE_RUNNER, *_BUFFERS),
                first_with=swa_padding_zeroed)), probe=Probe("sglab.swa_loc.sglang:probe",
                                                             PROBE_RELEASES), engine=ENGINE)

# a decode step's SWA write in the release with both PRs, from the batch to the pool
CODE_PATH_RELEASE = "0.5.12.post1"
CODE_PATH = (
    Node("srt/model_executor/forward_batch_info.py", "ForwardBatch.init_new",
         "translates the batch's full slots to SWA slots once: out_cache_loc_swa"),
    Node(DECODE_RUNNER, "DecodeInputBuffers.populate_from_forward_batch",
         "copies them into the graph's static buffer; #24743 zeroes it on a padded batch"),
    Node(DECODE_RUNNER, "CudaGraphRunner.capture_one_batch_size",
         "#23552: set_swa_loc(static buffer) before the graph is captured"),
    Node(SWA_POOL, "SWAKVPool.set_kv_buffer",
         "each SWA layer: swa_loc set, write there; unset, translate again"),
    Node(
        SWA_POOL, "SWAKVPool.translate_loc_from_full_to_swa",
        "the gather and int32 cast a graph captured without the preset replays in every SWA layer"))


# -- the real answers beside the rebuild's (the notebook's real-SGLang section) --------------------
def _rebuild_pool():
    pool = rebuild.SWAKVPool(16, 6, 2, 4, torch.float32, SWA_LAYERS, FULL_LAYERS, "cpu")
    return pool, rebuild.SWATokenToKVPoolAllocator(16, 6, pool)


def rebuild_write(preset: bool) -> dict:
    """The rebuild's pool through the probe's step: translations, and whether K landed."""
    pool, alloc = _rebuild_pool()
    loc = alloc.alloc(3)
    swa_slots = alloc.full_to_swa_index_mapping[loc].to(torch.int64)
    if preset:
        pool.set_swa_loc(alloc.translate_loc_from_full_to_swa(loc))
    pool.translate_calls = 0
    k = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4) + 1
    for layer in range(4):
        pool.set_kv_buffer(layer, loc, k * (layer + 1), -k)
    return dict(translate_calls=pool.translate_calls,
                landed=bool(torch.equal(pool.buffers(0)[0][swa_slots], k)))


def rebuild_translation_ops() -> list:
    """The aten ops of one rebuilt translation (each a kernel node when captured on a GPU)."""
    pool, alloc = _rebuild_pool()
    return dispatched_ops(pool.translate_loc_from_full_to_swa, alloc.alloc(3))


def rebuild_buffer(variant: str):
    """(dtype, padded tail) of the rebuild's decode buffer after a full, then a padded populate."""
    cfg = rebuild.runner_config(variant)
    if cfg.swa_loc_dtype is None:
        return None
    buf = rebuild.DecodeInputBuffers.create(device="cpu", max_bs=4, is_hybrid_swa=True,
                                            swa_loc_dtype=cfg.swa_loc_dtype)
    for swa, raw_bs in (([11, 12, 13, 14], 4), ([21, 22], 2)):
        fb = rebuild.ForwardBatch(torch.zeros(raw_bs, dtype=torch.int64),
                                  torch.full((raw_bs,), 5, dtype=torch.int32),
                                  torch.arange(1, raw_bs + 1), torch.tensor(swa, dtype=torch.int32))
        buf.populate_from_forward_batch(forward_batch=fb, raw_bs=raw_bs, bs=4,
                                        zero_swa_on_pad=cfg.zero_swa_on_pad)
    return _dtype(buf.out_cache_loc_swa), buf.out_cache_loc_swa[2:4].tolist()


def comparison(results: dict):
    """One row per (release, behaviour) of the releases that ran, beside the rebuild's."""
    rows = []
    for release, result in real.ran(results).items():
        pr_era = release in PR_ERA_RELEASES
        unset, preset = real.facts(result, part="pool", case="no_swa_loc"), rebuild_write(True)
        if unset.get("error") is None:
            rows.append(
                real.row(release, "translations in one write, location not preset (2 SWA layers)",
                         unset.get("translate_calls"), "rebuild: before",
                         rebuild_write(False)["translate_calls"]))
        for case, how in PRESET_CASE.items():
            got = real.facts(result, part="pool", case=case)
            if got.get("translate_calls") is not None:
                rows += [
                    real.row(release, f"translations in the layers, {how}", got["translate_calls"],
                             "rebuild: #23552 / #24743", preset["translate_calls"]),
                    real.row(release, f"SWA rows at the allocator's paired slots, {how}",
                             got.get("swa_rows_at_paired_slots"), "rebuild: #23552 / #24743",
                             preset["landed"])
                ]
        ops = real.facts(result, part="translation", case="pool").get("ops") or []
        rows.append(
            real.row(
                release, f"kernels per translation "
                f"({' + '.join(o.removeprefix('aten::') for o in ops)})", len(ops),
                "rebuild's translation" if pr_era else "claims: today's translation",
                len(rebuild_translation_ops()) if pr_era else KERNELS_PER_TRANSLATION_TODAY))
        if release in BUFFER_VARIANT:
            buf, want = real.facts(result, part="buffers",
                                   case="decode"), rebuild_buffer(BUFFER_VARIANT[release])
            got = ((buf.get("dtype"), buf.get("padded_tail_after_padded_populate"))
                   if buf.get("has_out_cache_loc_swa") else None)
            rows.append(
                real.row(release, "decode buffer out_cache_loc_swa: (dtype, padded tail)", got,
                         f"rebuild: {BUFFER_VARIANT[release]}",
                         tuple(want) if want else None))
    return real.table(rows)


def compare() -> None:
    """The notebook's real-SGLang section, and which translation each release ships."""
    results = real.answers(FIX)
    real.section(FIX, comparison, what="(release, behaviour) rows", results=results)
    print(kernels_statement(results))


released = functools.partial(real.released, FIX)  # the releases, a symbol beside the rebuild


def kernels_statement(results: dict) -> str:
    """Which releases translate with a gather and a cast, which with one gather."""
    by_source: dict = {}
    for v, r in real.ran(results).items():
        t = real.facts(r, part="translation", case="pool")
        by_source.setdefault((t.get("source"), len(t.get("ops") or [])), []).append(v)
    if not by_source:
        return "no release ran: the kernels per translation of the real code are not known here"
    return "\n".join(
        f"{', '.join(vs)}: `{src}` -> {n} kernel{'s' if n != 1 else ''} per translation"
        for (src, n), vs in sorted(by_source.items(), key=lambda kv: parse_version(kv[1][0])))
