"""Measure the SWA location preset on a GPU: for each layout the three runners of
:mod:`sglab.swa_loc.rebuild` capture a decode graph per batch size; then the #24743 padding
scenario and the profiler's sidecars. :func:`sweep` takes its probes and timer as arguments."""

from __future__ import annotations

import gc
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pandas as pd
import torch

from sglab.core import kernel_table, runs, timing, trace
from sglab.core.kernels import graph_kernel_nodes, profiled_kernels
from sglab.swa_loc import rebuild


EXPERIMENT = "swa_loc"
METHOD_VERSION = 2
GPUS = 1
# the sweep: Gemma-3-like 5 local : 1 global layers and gpt-oss-like alternation; ``trace_config``:
# the traced replays' cell; ``eager_config``: the eager kernel table's step
HEADLINE_CONFIG = {"num_layers": 48, "swa_per_full": 5, "batch_size": 32}
DEFAULT_PARAMS: Dict[str, Any] = {
    "layer_counts": [12, 48], "swa_per_full": [5, 1], "batch_sizes": [1, 32, 128],
    "variants": list(rebuild.VARIANTS), "size": 4096, "size_swa": 2048, "head_num": 8,
    "head_dim": 128, "dtype": "bfloat16", "warmup": 10, "repeat": 60, "rounds": 3,
    "pad_num_layers": 12, "trace_config": dict(HEADLINE_CONFIG), "eager_config": dict(
        num_layers=12, swa_per_full=5, batch_size=32), "kernel_table_runs": 3, "seed": 0
}
TRACE_PHASE = "replay "  # + variant
SWA_WRITE, FULL_WRITE = "SWA layer KV write", "full layer KV write"


def _row(variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    fill = dict.fromkeys(("num_layers", "swa_per_full", "n_swa_layers", "batch_size"), -1)
    return {"variant": variant, **fill, **kw, "metric": metric, "value": float(value), "unit": unit}


def setup_kwargs(p: dict, num_layers: int, swa_per_full: int, device) -> dict:
    """The :func:`sglab.swa_loc.rebuild.build_setup` arguments of one layout under ``p``."""
    kw = {k: p[k] for k in ("size", "size_swa", "head_num", "head_dim", "seed")}
    return dict(kw, num_layers=num_layers, swa_per_full=swa_per_full,
                dtype=getattr(torch, p["dtype"]), device=device)


def make_batches(setup: rebuild.Setup, batch_sizes: List[int], *,
                 seed: int = 0) -> Dict[int, rebuild.ForwardBatch]:
    """One decode batch per batch size, in order; identical on identically built setups."""
    g = torch.Generator().manual_seed(seed)
    return {  # for each batch size, its ids then its sequence lengths
        bs: rebuild.decode_batch(setup,
                                 torch.randint(0, 1024, (bs,), generator=g).tolist(),
                                 torch.randint(2, 200, (bs,), generator=g).tolist())
        for bs in batch_sizes
    }


# -- the #24743 padding scenario -------------------------------------------------------------------
def pad_bug_scenario(variant: str, *, device="cpu", use_cuda_graph: Optional[bool] = None,
                     num_layers: int = 6, swa_per_full: int = 5, capture_bs=(4, 8),
                     n_requests: int = 8, finished=(2, 4), context_len: int = 3, head_num: int = 2,
                     head_dim: int = 16, size: int = 256, size_swa: int = 128,
                     dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Dict[str, Any]:
    """Two decode steps through ``variant``'s runner against eager, the second one padded."""
    cfg = rebuild.runner_config(variant)
    kw = dict(num_layers=num_layers, swa_per_full=swa_per_full, size=size, size_swa=size_swa,
              head_num=head_num, head_dim=head_dim, dtype=dtype, device=device, seed=seed)
    graph_side, ref = rebuild.build_setup(**kw), rebuild.build_setup(**kw)
    runner = rebuild.DecodeGraphRunner.for_variant(graph_side.model, list(capture_bs), variant,
                                                   use_cuda_graph)
    runner.capture()  # at start-up, before any request
    vocab = graph_side.model.embed.shape[0]
    for s in (graph_side, ref):  # every request's context, written eagerly (identically)
        g = torch.Generator().manual_seed(seed + 2)
        for _ in range(n_requests):
            ids = torch.randint(0, vocab, (context_len,), generator=g).tolist()
            rebuild.forward_eager(s.model,
                                  rebuild.decode_batch(s, ids, list(range(1, context_len + 1))))
    g = torch.Generator().manual_seed(seed + 1)
    ids1 = torch.randint(0, vocab, (n_requests,), generator=g).tolist()
    seq1 = [context_len + 1] * n_requests
    alive = [r for r in range(n_requests) if r not in set(finished)]
    ids2 = torch.randint(0, vocab, (len(alive),), generator=g).tolist()
    seq2 = [context_len + 2] * len(alive)
    b1 = rebuild.decode_batch(graph_side, ids1, seq1)
    bs1 = runner.replay(b1)
    bs2 = runner.replay(rebuild.decode_batch(graph_side, ids2, seq2))
    rebuild.forward_eager(ref.model, rebuild.decode_batch(ref, ids1, seq1))
    rebuild.forward_eager(ref.model, rebuild.decode_batch(ref, ids2, seq2))
    if runner.use_cuda_graph:
        torch.cuda.synchronize(runner.device)
    raw_bs2 = len(alive)
    stale = b1.out_cache_loc_swa[raw_bs2:bs2].tolist()  # what the tail holds after step 1
    owners = list(range(raw_bs2, bs2))  # step 1's batch positions are request ids
    predicted = sorted(stale) if (cfg.preset_swa_loc and not cfg.zero_swa_on_pad) else []
    diff = rebuild.pool_diff(graph_side.pool, ref.pool)
    swa_ids, full_ids = graph_side.swa_layer_ids, graph_side.full_layer_ids
    matches = all(diff.get(lyr, []) == predicted
                  for lyr in swa_ids) and not any(lyr in diff for lyr in full_ids)
    return dict(variant=variant, bs_step1=bs1, raw_bs_step2=raw_bs2, bs_step2=bs2,
                stale_tail_swa_slots=stale, stale_tail_owners=owners, owners_still_running=[
                    r for r in owners if r in alive
                ], predicted_slots=predicted, corrupted=diff, swa_layer_ids=swa_ids,
                full_layer_ids=full_ids, matches_prediction=bool(matches), n_corrupted=sum(
                    map(len, diff.values())), n_predicted=len(predicted) * len(swa_ids))


# -- the sweep -------------------------------------------------------------------------------------
def _cleanup(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def sweep(p: dict, *, device, use_cuda_graph: bool, probes: Dict[str, Callable], timer,
          progress: bool = True, on_trace: Optional[Callable] = None) -> List[dict]:
    """Rows of the sweep and the padding scenario; ``on_trace(runners, labels, bs)`` once."""
    p = {**DEFAULT_PARAMS, **p}
    batch_sizes = sorted(int(b) for b in p["batch_sizes"])
    torch.manual_seed(p["seed"])
    tc = p.get("trace_config") or {}
    rows: List[dict] = []
    layouts = [(int(r), int(L)) for r in p["swa_per_full"] for L in p["layer_counts"]]
    for i, (ratio, L) in enumerate(layouts):
        if progress:
            print(f"[swa_loc] layout {i + 1}/{len(layouts)}: {L} layers, {ratio}:1", flush=True)
        kw = setup_kwargs(p, L, ratio, device)
        labels = dict(num_layers=L, swa_per_full=ratio,
                      n_swa_layers=len(rebuild.hybrid_layer_ids(L, ratio)[0]))
        # every variant captured on its own pool, its KV writes checked against an eager reference
        with timing.phase("correctness"):
            ref = rebuild.build_setup(**kw)
            ref_batches = make_batches(ref, batch_sizes, seed=p["seed"])
            for bs in batch_sizes:
                rebuild.forward_eager(ref.model, ref_batches[bs])
        runners = {}
        for v in p["variants"]:
            with timing.phase("capture"):
                s = rebuild.build_setup(**kw)
                runner = rebuild.DecodeGraphRunner.for_variant(s.model, batch_sizes, v,
                                                               use_cuda_graph=use_cuda_graph)
                runner.capture()
                for bs in batch_sizes:
                    rows += [
                        _row(v, "translate_calls_capture", runner.capture_translate_calls[bs],
                             "calls", batch_size=bs, **labels),
                        _row(v, "graph_kernel_nodes", probes["graph_kernel_nodes"](runner, bs),
                             "kernels", batch_size=bs, **labels)
                    ]
            with timing.phase("correctness"):
                batches = make_batches(s, batch_sizes, seed=p["seed"])
                for bs in batch_sizes:  # one populated replay per batch, in the reference's order
                    runner.replay(batches[bs])
                if runner.use_cuda_graph:
                    torch.cuda.synchronize(runner.device)
                diff = rebuild.pool_diff(s.pool, ref.pool)
                rows.append(
                    _row(v, "kv_mismatch_slots", sum(map(len, diff.values())), "slots", **labels))
            runners[v] = runner
        with timing.phase("timing"):
            for bs in batch_sizes:
                fns = {v: (lambda r=r: r.replay_graph(bs)) for v, r in runners.items()}
                timings = timing.interleaved(fns, rounds=int(p["rounds"]), warmup=int(p["warmup"]),
                                             repeat=int(p["repeat"]), timer=timer)
                for v, t in timings.items():
                    rows.extend(t.rows(variant=v, batch_size=bs, **labels))
        with timing.phase("profile"):  # one profiled replay per cell
            rows += [
                _row(v, "profiled_kernels", probes["profiled_kernels"](runner, bs), "kernels",
                     batch_size=bs, **labels) for v, runner in runners.items() for bs in batch_sizes
            ]
        if on_trace is not None and (tc.get("num_layers"), tc.get("swa_per_full")) == (L, ratio) \
                and tc.get("batch_size") in batch_sizes:
            on_trace(runners, labels, int(tc["batch_size"]))
        del runners
        _cleanup(device)
    for v in p["variants"]:
        with timing.phase("pad scenario"):
            res = pad_bug_scenario(v, device=device, use_cuda_graph=use_cuda_graph,
                                   num_layers=int(p["pad_num_layers"]),
                                   dtype=getattr(torch, p["dtype"]), seed=p["seed"])
        labels = dict(num_layers=int(p["pad_num_layers"]), swa_per_full=5,
                      n_swa_layers=len(res["swa_layer_ids"]), batch_size=res["bs_step2"])
        rows += [
            _row(v, "pad_corrupted_slots", res["n_corrupted"], "slots", **labels),
            _row(v, "pad_predicted_slots", res["n_predicted"], "slots", **labels),
            _row(v, "pad_matches_prediction", int(res["matches_prediction"]), "bool", **labels)
        ]
        _cleanup(device)
    return rows


# -- profiler passes (GPU), separate from the timed ones -------------------------------------------
def reduce_events(events):
    """The events of the ``replay <variant>`` phases with a ``variant`` column, host ops dropped."""
    ev = events[events.phase.str.startswith(TRACE_PHASE) & (events.category != "op")].copy()
    ev["variant"] = ev.phase.str.slice(len(TRACE_PHASE))
    return ev.reset_index(drop=True)


def traced_pass(runners: dict, bs: int) -> dict:
    """The sidecars: one profiled replay per variant, and each graph's kernel nodes by name."""
    with timing.phase("trace"):
        path = Path(tempfile.mkdtemp(prefix="sglab-swa_loc-")) / "replays.trace.json.gz"
        with trace.Recorder(perfetto=path) as rec:
            # a first profiled replay of each, outside any phase: profiler start-up
            for r in runners.values():
                r.replay_graph(bs)
            torch.cuda.synchronize()
            for v, r in runners.items():
                with trace.phase(TRACE_PHASE + v):
                    r.replay_graph(bs)
                    torch.cuda.synchronize()
        names = pd.DataFrame([(v, kernel_table.demangle(n)) for v, r in runners.items()
                              for n in graph_kernel_nodes(r.graphs[bs]).names],
                             columns=["variant", "kernel"])
        kernels = names.groupby(["variant", "kernel"], sort=False).size().reset_index(name="nodes")
        return {"events": reduce_events(rec.events), "trace": path, "graph_kernels": kernels}


@contextmanager
def kv_write_scopes(pool: rebuild.SWAKVPool, mode: kernel_table.OpRanges):
    """Label the ops of every ``set_kv_buffer`` call with the kind of layer it writes."""
    original = pool.set_kv_buffer

    def labelled(layer_id, *args, **kwargs):
        with mode.scope(SWA_WRITE if pool.is_swa_layer(layer_id) else FULL_WRITE):
            return original(layer_id, *args, **kwargs)

    pool.set_kv_buffer = labelled
    try:
        yield
    finally:
        del pool.set_kv_buffer


def eager_steps(setup: rebuild.Setup, batch: rebuild.ForwardBatch) -> dict:
    """{variant: step(mode)} of the two eager decode steps (``before`` clears an earlier one)."""

    def step(mode, preset: bool):
        if not preset:
            setup.pool.set_swa_loc(None)
        with kv_write_scopes(setup.pool, mode):
            rebuild.forward_eager(setup.model, batch, use_precomputed_swa_loc=preset)

    return {"before": lambda mode: step(mode, False), "pr24743": lambda mode: step(mode, True)}


def kv_write_ops(variant: str, *, num_layers: int = 6, swa_per_full: int = 5) -> list:
    """The aten ops of the KV writes in one CPU replay of ``variant``'s step, scoped by layer."""
    s = rebuild.build_setup(num_layers=num_layers, swa_per_full=swa_per_full, size=16, size_swa=8,
                            head_num=1, head_dim=4)
    runner = rebuild.DecodeGraphRunner.for_variant(s.model, [1], variant, use_cuda_graph=False)
    runner.capture()
    mode = kernel_table.OpRanges()
    with kv_write_scopes(s.pool, mode), mode:
        runner.replay_graph(1)
    return [c for c in mode.calls if c.scope]


def eager_kernel_tables(p: dict, device) -> tuple:
    """``(table, info)``: the ``eager_kernels`` table (nsight-python, then torch.profiler)."""
    tc = p["eager_config"]
    s = rebuild.build_setup(
        **setup_kwargs(p, int(tc["num_layers"]), int(tc["swa_per_full"]), device))
    bs = int(tc["batch_size"])
    steps = eager_steps(s, make_batches(s, [bs], seed=p["seed"])[bs])
    runs_ = int(p["kernel_table_runs"])
    with timing.phase("eager kernel table: nsight-python"):
        ns, reason = kernel_table.nsight_table(steps, runs=runs_)
    with timing.phase("eager kernel table: torch.profiler"):
        tp = kernel_table.torch_table(steps, runs=runs_)
    table = pd.concat([t for t in (ns, tp) if t is not None], ignore_index=True)
    return table, dict(config=dict(tc), runs=runs_, backends=sorted(set(table.backend)),
                       nsight="ran" if ns is not None else "did not run", nsight_reason=reason)


# -- the GPU run -----------------------------------------------------------------------------------
def check_params(p: dict) -> dict:
    """Merged parameters, with one-line errors for values the sweep cannot use."""
    p = {**DEFAULT_PARAMS, **(p or {})}
    if unknown := sorted(set(p["variants"]) - set(rebuild.VARIANTS)):
        raise ValueError(f"unknown variant(s) {unknown}; expected some of {list(rebuild.VARIANTS)}")
    if p["dtype"] not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {p['dtype']!r}")
    if not p["batch_sizes"] or min(int(b) for b in p["batch_sizes"]) < 1:
        raise ValueError(f"batch_sizes must be >= 1, got {p['batch_sizes']}")
    need = sum(int(b) for b in p["batch_sizes"])  # a pool's slot per token of every batch
    if need > min(int(p["size"]), int(p["size_swa"])):
        raise ValueError(f"size / size_swa ({p['size']} / {p['size_swa']}) hold fewer slots than "
                         f"the batches allocate ({need})")
    return p


def run(params: Optional[dict] = None, *, progress: bool = True) -> runs.Measured:
    """The GPU sweep, the padding scenario on real graphs, the profiler pictures (nsight first)."""
    p = check_params(params or {})
    if not torch.cuda.is_available():
        raise RuntimeError("the swa_loc measurement captures CUDA graphs: it needs a CUDA GPU")
    with timing.phase("cuda init"):
        device = torch.device("cuda", torch.cuda.current_device())
        torch.ones(1, device=device).sum().item()
    with timing.phase("eager kernel table"):
        eager, eager_info = eager_kernel_tables(p, device)
    probes = dict(
        graph_kernel_nodes=lambda runner, bs: graph_kernel_nodes(runner.graphs[bs]).kernels,
        profiled_kernels=lambda runner, bs: len(profiled_kernels(lambda: runner.replay_graph(bs))))
    traced: dict = {}
    rows = sweep(p, device=device, use_cuda_graph=True, probes=probes, timer=None,
                 progress=progress,
                 on_trace=lambda r, labels, bs: traced.update(traced_pass(r, bs)))
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars={"eager_kernels": eager, **traced},
                         extra={"eager_kernels": eager_info})
