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

from .. import runs
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
# Analysis of a run (notebook tables, README headline)
# ---------------------------------------------------------------------------------------------------------------
HEADLINE_CONFIG = {"num_layers": 48, "swa_per_full": 5, "batch_size": 32}  # Gemma-3-like layout, mid-size batch
VARIANT_LABELS = {"before": "before (translate inside the graph)", "pr23552": "#23552 (preset, int64 buffer)",
                  "pr24743": "#24743 (preset, int32, zeroed on pad)"}
_CFG = ["swa_per_full", "num_layers", "n_swa_layers"]


short_gpu = runs.gpu_short


def newest_per_gpu(runs_: list) -> list:
    """The newest run of each GPU model (by ``created_utc``), ordered by short GPU name, descending (H200, H100)."""
    best = runs.newest_by(runs_, lambda r: r.manifest.get("gpu_name"))
    return [best[k] for k in sorted(best, key=short_gpu, reverse=True)]


def _sweep(df):
    return df[df.num_layers.isin(df[df.metric == "graph_kernel_nodes"].num_layers.unique())
              & ~df.metric.str.startswith("pad_")]


def kernel_counts(df):
    """Per (layout, batch size): static kernel nodes and profiled kernels per replay of each variant."""
    d = _sweep(df)
    idx = _CFG + ["batch_size"]
    nodes = d[d.metric == "graph_kernel_nodes"].pivot_table(index=idx, columns="variant", values="value")
    prof = d[d.metric == "profiled_kernels"].pivot_table(index=idx, columns="variant", values="value")
    return nodes.astype(int), prof.astype(int)


def kernel_table(df):
    """One row per layout: kernel nodes of each variant (checked equal for every batch size), the extra
    kernels per SWA layer, whether the profiler saw the same number in one replay, translate calls in capture."""
    nodes, prof = kernel_counts(df)
    d = _sweep(df)
    calls = d[d.metric == "translate_calls_capture"].pivot_table(index=_CFG, columns="variant", values="value",
                                                                 aggfunc="max")
    per_layout = nodes.groupby(level=_CFG)
    out = per_layout.first()
    out.columns = [f"kernels {c}" for c in out.columns]
    n_swa = out.index.get_level_values("n_swa_layers")
    out["same for every batch size"] = (per_layout.nunique() == 1).all(axis=1)
    out["+ per SWA layer: before vs #24743"] = (out["kernels before"] - out["kernels pr24743"]) / n_swa
    out["+ per SWA layer: #24743 vs #23552"] = (out["kernels pr24743"] - out["kernels pr23552"]) / n_swa
    out["profiler = static (all bs)"] = (prof == nodes).all(axis=1).groupby(level=_CFG).all()
    out["translate calls in capture (before)"] = calls["before"].astype(int)
    return out


def profiler_agreement(df) -> Dict[str, int]:
    """How many (layout, batch size, variant) cells have profiler count == static count, and the largest gap."""
    nodes, prof = kernel_counts(df)
    gap = (prof - nodes).abs()
    return {"cells": int(gap.size), "equal": int((gap == 0).sum().sum()), "max_abs_diff": int(gap.max().max())}


def time_table(df):
    """Median replay time per variant (µs), before/#24743 ratio and µs saved per SWA layer, per layout × bs."""
    import pandas as pd

    d = _sweep(df)
    med = d[d.metric == "time_median"].pivot_table(index=_CFG + ["batch_size"], columns="variant",
                                                   values="value") * 1e3
    out = pd.DataFrame({f"{v} µs": med[v] for v in med.columns})
    out["before / #24743"] = med["before"] / med["pr24743"]
    out["#24743 / #23552"] = med["pr24743"] / med["pr23552"]
    out["µs saved per SWA layer"] = (med["before"] - med["pr24743"]) / med.index.get_level_values("n_swa_layers")
    return out


def headline_numbers(run, config: Optional[dict] = None) -> Dict[str, Any]:
    """Kernels per replay and replay time, before vs #24743, at ``config`` (default :data:`HEADLINE_CONFIG`),
    plus the ratio range over the whole sweep."""
    c = {**HEADLINE_CONFIG, **(config or {})}
    nodes, prof = kernel_counts(run.df)
    t = time_table(run.df)
    sel = lambda tab: tab.xs((c["swa_per_full"], c["num_layers"], c["batch_size"]),  # noqa: E731
                             level=("swa_per_full", "num_layers", "batch_size")).iloc[0]
    kn, kp, tr = sel(nodes), sel(prof), sel(t)
    n_swa = int(nodes.xs((c["swa_per_full"], c["num_layers"]), level=("swa_per_full", "num_layers"))
                .index.get_level_values("n_swa_layers")[0])
    extra = ((nodes["before"] - nodes["pr24743"]) / nodes.index.get_level_values("n_swa_layers")).unique()
    return {
        "gpu": short_gpu(run.manifest.get("gpu_name")), "config": c, "n_swa_layers": n_swa,
        "kernels_before": int(kn["before"]), "kernels_after": int(kn["pr24743"]),
        "profiled_before": int(kp["before"]), "profiled_after": int(kp["pr24743"]),
        "extra_per_swa_layer": sorted(float(x) for x in extra),
        "us_before": float(tr["before µs"]), "us_after": float(tr["pr24743 µs"]),
        "ratio": float(tr["before / #24743"]),
        "ratio_min": float(t["before / #24743"].min()), "ratio_max": float(t["before / #24743"].max()),
        "profiler_agrees": profiler_agreement(run.df)["max_abs_diff"] == 0,
        "layers_range": (int(nodes.index.get_level_values("num_layers").min()),
                         int(nodes.index.get_level_values("num_layers").max())),
        "layouts": sorted({int(x) for x in nodes.index.get_level_values("swa_per_full")}),
        "bs_range": (int(nodes.index.get_level_values("batch_size").min()),
                     int(nodes.index.get_level_values("batch_size").max())),
    }


def headline(runs_: list) -> str:
    """README index line: the claim with the kernels per replay and the replay-time ratio of each GPU's newest
    recorded run."""
    nums = [headline_numbers(r) for r in newest_per_gpu(runs_)]
    if not nums:
        return "Presetting the SWA cache location before capture removes the full→SWA translation from replays."
    a = nums[0]
    c = a["config"]
    extra = sorted({x for n in nums for x in n["extra_per_swa_layer"]})
    per_layer = f"{extra[0]:g} kernels per SWA layer" if len(extra) == 1 else         f"{extra[0]:g}–{extra[-1]:g} kernels per SWA layer"
    kernels = sorted({(n["kernels_before"], n["kernels_after"]) for n in nums})
    ktxt = "; ".join(f"{b} → {af}" for b, af in kernels)
    prof = "profiler count = static count" if all(n["profiler_agrees"] for n in nums) else         "profiler count differs from the static count"
    times = ", ".join(f"{n['us_before']:.0f} → {n['us_after']:.0f} µs ({n['ratio']:.2f}×) on {n['gpu']}"
                      for n in nums)
    lo, hi = min(n["ratio_min"] for n in nums), max(n["ratio_max"] for n in nums)
    (l0, l1), (b0, b1) = a["layers_range"], a["bs_range"]
    return (f"Presetting `swa_loc` before decode-graph capture removes {per_layer} from every replay. "
            f"{c['num_layers']} layers ({a['n_swa_layers']} SWA, {c['swa_per_full']}:1), bs {c['batch_size']}: "
            f"{ktxt} kernels per replay ({prof}); replay {times}; {lo:.2f}–{hi:.2f}× over {l0}–{l1} layers, "
            f"{' and '.join(f'{x}:1' for x in a['layouts'])}, bs {b0}–{b1}.")
