"""Decode-graph kernels, replay time and KV contents with and without the SWA-location preset (SGLang #23552,
follow-up #24743).

For each layer count and SWA:full ratio, three runners (``before``, ``pr23552``, ``pr24743``; see
:mod:`sglab.fixes.swa_loc`) capture one decode graph per batch size, each on its own identically built pool.
Per (variant, layers, batch size):

- ``translate_calls_capture``: ``translate_loc_from_full_to_swa`` calls while the graph was being captured
  (Python counter);
- ``graph_kernel_nodes``: kernel nodes in the captured graph (static count through cuda-bindings);
- ``profiled_kernels``: kernels torch.profiler sees during one replay;
- ``kv_mismatch_slots``: (layer, slot) pairs where the pool after one populated replay differs from an
  eager reference that ran the same batch (padding slot 0 excluded; expected 0);
- ``time_median`` / ``time_p10`` / ``time_p90``: CUDA-event time of one replay, samples pooled over
  ``rounds`` rounds that interleave the variants.

Then the #24743 padding scenario (:func:`pad_bug_scenario`) on real graphs for each variant:
``pad_corrupted_slots`` (layer, slot pairs that differ from the eager reference), ``pad_predicted_slots``
and ``pad_matches_prediction`` (1 when exactly the predicted slots, in every SWA layer and nowhere else).
"""

from __future__ import annotations

import gc
from typing import Any, Dict, List, Optional

import torch

from .. import runs, upstream
from ..fixes import swa_loc as fx

EXPERIMENT = "swa_loc"
METHOD_VERSION = 1
GPUS = 1
DEFAULT_PARAMS: Dict[str, Any] = {
    "layer_counts": [6, 12, 24, 48],
    "swa_per_full": [5, 1],  # Gemma-3-like 5 local : 1 global, and gpt-oss-like alternation
    "batch_sizes": [1, 8, 32, 128],
    "variants": list(fx.VARIANTS),
    "size": 4096,
    "size_swa": 2048,
    "head_num": 8,
    "head_dim": 128,
    "dtype": "bfloat16",
    "warmup": 20,
    "repeat": 200,
    "rounds": 3,
    "pad_num_layers": 12,
    "seed": 0,
}

_FILL = {"num_layers": -1, "swa_per_full": -1, "n_swa_layers": -1, "batch_size": -1}


def _row(variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, **_FILL}
    row.update(kw)
    row.update(metric=metric, value=float(value), unit=unit)
    return row


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def make_batches(setup: fx.Setup, batch_sizes: List[int], *, seed: int = 0, vocab_size: int = 1024) -> Dict[int, fx.ForwardBatch]:
    """One decode batch per batch size, allocated in the order given; identical on identically built setups."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for bs in batch_sizes:
        ids = torch.randint(0, vocab_size, (bs,), generator=g).tolist()
        seq_lens = torch.randint(2, 200, (bs,), generator=g).tolist()
        out[bs] = fx.decode_batch(setup, ids, seq_lens)
    return out


def kv_mismatch_count(diff: Dict[int, List[int]]) -> int:
    return sum(len(v) for v in diff.values())


# ---------------------------------------------------------------------------------------------------------------
# The #24743 padding scenario
# ---------------------------------------------------------------------------------------------------------------
def pad_bug_scenario(variant: str, *, device="cpu", use_cuda_graph: Optional[bool] = None, num_layers: int = 6,
                     swa_per_full: int = 5, capture_bs=(4, 8), n_requests: int = 8, finished=(2, 4),
                     context_len: int = 3, head_num: int = 2, head_dim: int = 16, size: int = 256,
                     size_swa: int = 128, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Dict[str, Any]:
    """Two decode steps through the runner of ``variant``, checked against the same steps run eagerly.

    Requests ``0..n_requests-1`` each have ``context_len`` tokens written eagerly (a prefill). Step 1 decodes
    all of them in the ``n_requests`` graph (no padding). Then the requests in ``finished`` leave; the batch is
    filtered in order, so step 2 has ``n_requests - len(finished)`` tokens, padded up to the same graph. The
    tail of ``out_cache_loc_swa`` still holds the SWA slots where the last requests of step 1 wrote their
    token -- requests that are still running. Predicted corruption: those slots, in every SWA layer, when the
    buffer is preset but not zeroed on padding; nothing otherwise.
    """
    cfg = fx.runner_config(variant)
    kw = dict(num_layers=num_layers, swa_per_full=swa_per_full, size=size, size_swa=size_swa, head_num=head_num,
              head_dim=head_dim, dtype=dtype, device=device, seed=seed)
    graph_side, ref = fx.build_setup(**kw), fx.build_setup(**kw)
    runner = fx.DecodeGraphRunner.for_variant(graph_side.model, list(capture_bs), variant, use_cuda_graph)
    runner.capture()  # at start-up, before any request

    g = torch.Generator().manual_seed(seed + 1)
    vocab = graph_side.model.embed.shape[0]
    for s in (graph_side, ref):  # prefill: context tokens of every request, written eagerly
        gg = torch.Generator().manual_seed(seed + 2)
        for _ in range(n_requests):
            ids = torch.randint(0, vocab, (context_len,), generator=gg).tolist()
            fx.forward_eager(s.model, fx.decode_batch(s, ids, list(range(1, context_len + 1))))

    ids1 = torch.randint(0, vocab, (n_requests,), generator=g).tolist()
    seq1 = [context_len + 1] * n_requests
    alive = [r for r in range(n_requests) if r not in set(finished)]
    ids2 = torch.randint(0, vocab, (len(alive),), generator=g).tolist()
    seq2 = [context_len + 2] * len(alive)

    b1 = fx.decode_batch(graph_side, ids1, seq1)
    bs1 = runner.replay(b1)
    b2 = fx.decode_batch(graph_side, ids2, seq2)
    bs2 = runner.replay(b2)
    r1 = fx.decode_batch(ref, ids1, seq1)
    fx.forward_eager(ref.model, r1)
    fx.forward_eager(ref.model, fx.decode_batch(ref, ids2, seq2))
    if runner.use_cuda_graph:
        torch.cuda.synchronize(runner.device)

    raw_bs2 = len(alive)
    stale = b1.out_cache_loc_swa[raw_bs2:bs2].tolist()  # what the tail holds after step 1
    owners = list(range(raw_bs2, bs2))  # step-1 batch positions = request ids (step 1 had every request)
    buggy = cfg.preset_swa_loc and not cfg.zero_swa_on_pad
    predicted = sorted(stale) if buggy else []
    diff = fx.pool_diff(graph_side.pool, ref.pool)
    swa_ids, full_ids = graph_side.swa_layer_ids, graph_side.full_layer_ids
    matches = (all(diff.get(l, []) == predicted for l in swa_ids)
               and not any(l in diff for l in full_ids))
    live_owner = [r for r in owners if r in alive]
    out = {
        "variant": variant, "bs_step1": bs1, "raw_bs_step2": raw_bs2, "bs_step2": bs2,
        "stale_tail_swa_slots": stale, "stale_tail_owners": owners, "owners_still_running": live_owner,
        "predicted_slots": predicted, "corrupted": diff, "swa_layer_ids": swa_ids, "full_layer_ids": full_ids,
        "matches_prediction": bool(matches),
        "n_corrupted": kv_mismatch_count(diff), "n_predicted": len(predicted) * len(swa_ids),
    }
    del runner, graph_side, ref
    return out


# ---------------------------------------------------------------------------------------------------------------
# The GPU sweep
# ---------------------------------------------------------------------------------------------------------------
def run(params: Optional[dict] = None, *, progress: bool = True):
    """The GPU sweep and the padding scenario on real CUDA graphs (see the module docstring)."""
    from ..measure.kernels import graph_kernel_nodes, profiled_kernels
    from ..measure.timing import cuda_time

    p = {**DEFAULT_PARAMS, **(params or {})}
    if not torch.cuda.is_available():
        raise RuntimeError("the swa_loc experiment captures CUDA graphs: it needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    probes = {
        "graph_kernel_nodes": lambda runner, bs: graph_kernel_nodes(runner.graphs[bs]).kernels,
        "profiled_kernels": lambda runner, bs: len(profiled_kernels(lambda: runner.replay_graph(bs))),
    }
    timer = lambda fn: cuda_time(fn, warmup=int(p["warmup"]), repeat=int(p["repeat"]))  # noqa: E731
    rows = sweep(p, device=device, use_cuda_graph=True, probes=probes, timer=timer, progress=progress)
    return runs.tidy(EXPERIMENT, rows)


def sweep(p: dict, *, device, use_cuda_graph: bool, probes: Dict[str, Any], timer, progress: bool = True) -> List[dict]:
    """Rows of the sweep and of the padding scenario. ``probes``: {metric: fn(runner, bs) -> kernel count};
    ``timer``: fn(callable) -> Timing. :func:`run` passes the GPU ones; the CPU tests pass eager stand-ins."""
    from tqdm.auto import tqdm

    from ..measure.timing import Timing

    dtype = _dtype(p["dtype"])
    batch_sizes = sorted(int(b) for b in p["batch_sizes"])
    variants = list(p["variants"])
    torch.manual_seed(p["seed"])
    is_cuda = torch.device(device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if is_cuda else (lambda: None)
    rows: List[dict] = []

    configs = [(int(r), int(L)) for r in p["swa_per_full"] for L in p["layer_counts"]]
    bar = tqdm(configs, desc="swa_loc sweep", disable=not progress)
    for ratio, L in bar:
        bar.set_postfix(layers=L, swa_per_full=ratio)
        kw = dict(num_layers=L, swa_per_full=ratio, size=p["size"], size_swa=p["size_swa"], head_num=p["head_num"],
                  head_dim=p["head_dim"], dtype=dtype, device=device, seed=p["seed"])
        ref = fx.build_setup(**kw)
        labels = dict(num_layers=L, swa_per_full=ratio, n_swa_layers=len(ref.swa_layer_ids))
        ref_batches = make_batches(ref, batch_sizes, seed=p["seed"])
        for bs in batch_sizes:
            fx.forward_eager(ref.model, ref_batches[bs])

        runners = {}
        for v in variants:
            s = fx.build_setup(**kw)
            runner = fx.DecodeGraphRunner.for_variant(s.model, batch_sizes, v, use_cuda_graph=use_cuda_graph)
            runner.capture()
            for bs in batch_sizes:
                rows.append(_row(v, "translate_calls_capture", runner.capture_translate_calls[bs], "calls",
                                 batch_size=bs, **labels))
                rows.append(_row(v, "graph_kernel_nodes", probes["graph_kernel_nodes"](runner, bs), "kernels",
                                 batch_size=bs, **labels))
            batches = make_batches(s, batch_sizes, seed=p["seed"])
            for bs in batch_sizes:  # one populated replay per batch, same order as the eager reference
                runner.replay(batches[bs])
            sync()
            diff = fx.pool_diff(s.pool, ref.pool)
            rows.append(_row(v, "kv_mismatch_slots", kv_mismatch_count(diff), "slots", **labels))
            for bs in batch_sizes:
                rows.append(_row(v, "profiled_kernels", probes["profiled_kernels"](runner, bs), "kernels",
                                 batch_size=bs, **labels))
            runners[v] = runner

        samples: Dict[tuple, List[float]] = {}
        for _ in range(int(p["rounds"])):  # rounds interleave the variants
            for bs in batch_sizes:
                for v in variants:
                    t = timer(lambda: runners[v].replay_graph(bs))
                    samples.setdefault((v, bs), []).extend(t.samples_ms)
        for (v, bs), ss in samples.items():
            rows.extend(Timing(ss).rows(variant=v, batch_size=bs, **labels))

        del runners, ref, ref_batches
        gc.collect()
        if is_cuda:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()

    for v in tqdm(variants, desc="pad scenario", disable=not progress):
        res = pad_bug_scenario(v, device=device, use_cuda_graph=use_cuda_graph, num_layers=int(p["pad_num_layers"]),
                               dtype=dtype, seed=p["seed"])
        labels = dict(num_layers=int(p["pad_num_layers"]), swa_per_full=5, n_swa_layers=len(res["swa_layer_ids"]),
                      batch_size=res["bs_step2"])
        rows.append(_row(v, "pad_corrupted_slots", res["n_corrupted"], "slots", **labels))
        rows.append(_row(v, "pad_predicted_slots", res["n_predicted"], "slots", **labels))
        rows.append(_row(v, "pad_matches_prediction", int(res["matches_prediction"]), "bool", **labels))
        gc.collect()
        if is_cuda:
            torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Does the installed SGLang contain the fix?
# ---------------------------------------------------------------------------------------------------------------
_RUNNER_PATHS = ("srt/model_executor/cuda_graph_runner.py",
                 "srt/model_executor/runner/cuda_graph_runner.py",
                 "srt/model_executor/runner/decode_cuda_graph_runner.py")


@upstream.register("swa_loc", "SWA location preset before decode-graph capture (#23552, #24743)")
def _check(read) -> "upstream.Verdict":
    pool = read("srt/mem_cache/swa_memory_pool.py")
    if pool is None:
        return upstream.Verdict("unknown", "srt/mem_cache/swa_memory_pool.py not found")
    if "def set_swa_loc" not in pool:
        if "swa_loc" in pool:
            return upstream.Verdict("later", "SWAKVPool has no set_swa_loc any more: the SWA location is "
                                             "translated once per forward and passed to set_kv_buffer")
        return upstream.Verdict("unknown", "SWAKVPool has neither set_swa_loc nor a swa_loc argument")
    runner_src = [src for src in (read(p) for p in _RUNNER_PATHS) if src]
    text = "\n".join(runner_src)
    if "out_cache_loc_swa" in text and "set_swa_loc(" in text:
        zeroed = "out_cache_loc_swa.zero_()" in text
        return upstream.Verdict("fix", "the decode runner presets set_swa_loc(out_cache_loc_swa) before capture"
                                       + ("; the buffer is zeroed on padded batches (#24743)" if zeroed else
                                          "; the buffer is NOT zeroed on padded batches (#24743 missing)"))
    if runner_src:
        return upstream.Verdict("neither", "set_swa_loc exists but the decode runner does not call it before "
                                           "capture: every SWA layer translates inside the graph")
    return upstream.Verdict("unknown", "decode CUDA-graph runner source not found")
