"""Measure: the sweep over layouts x batch sizes x variants on real CUDA graphs, the padding scenario, and (GPU
only) the traced replays and the eager kernel table of :mod:`.profile`.

:func:`sweep` is the loop itself; it takes its kernel-count probes and its timer as arguments so that the CPU tests
run it eagerly with stand-ins, and :func:`run` passes the GPU ones.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Optional

import torch

from sglab.core import runs
from sglab.fixes import swa_loc as fx
from sglab.core import timing as phases
from sglab.experiments.swa_loc import DEFAULT_PARAMS, EXPERIMENT

_FILL = {"num_layers": -1, "swa_per_full": -1, "n_swa_layers": -1, "batch_size": -1}


def _row(variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, **_FILL}
    row.update(kw)
    row.update(metric=metric, value=float(value), unit=unit)
    return row


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def setup_kwargs(p: dict, num_layers: int, swa_per_full: int, device) -> dict:
    """The :func:`sglab.fixes.swa_loc.build_setup` arguments of one layout under parameters ``p``."""
    return dict(num_layers=num_layers, swa_per_full=swa_per_full, size=p["size"], size_swa=p["size_swa"],
                head_num=p["head_num"], head_dim=p["head_dim"], dtype=_dtype(p["dtype"]), device=device,
                seed=p["seed"])


def make_batches(setup: fx.Setup, batch_sizes: List[int], *, seed: int = 0,
                 vocab_size: int = 1024) -> Dict[int, fx.ForwardBatch]:
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
def _prefill(setups, *, n_requests: int, context_len: int, seed: int) -> None:
    """The context tokens of every request, written eagerly into each setup (identically)."""
    for s in setups:
        g = torch.Generator().manual_seed(seed + 2)
        vocab = s.model.embed.shape[0]
        for _ in range(n_requests):
            ids = torch.randint(0, vocab, (context_len,), generator=g).tolist()
            fx.forward_eager(s.model, fx.decode_batch(s, ids, list(range(1, context_len + 1))))


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
    _prefill((graph_side, ref), n_requests=n_requests, context_len=context_len, seed=seed)

    g = torch.Generator().manual_seed(seed + 1)
    vocab = graph_side.model.embed.shape[0]
    ids1 = torch.randint(0, vocab, (n_requests,), generator=g).tolist()
    seq1 = [context_len + 1] * n_requests
    alive = [r for r in range(n_requests) if r not in set(finished)]
    ids2 = torch.randint(0, vocab, (len(alive),), generator=g).tolist()
    seq2 = [context_len + 2] * len(alive)

    b1 = fx.decode_batch(graph_side, ids1, seq1)
    bs1 = runner.replay(b1)
    bs2 = runner.replay(fx.decode_batch(graph_side, ids2, seq2))
    fx.forward_eager(ref.model, fx.decode_batch(ref, ids1, seq1))
    fx.forward_eager(ref.model, fx.decode_batch(ref, ids2, seq2))
    if runner.use_cuda_graph:
        torch.cuda.synchronize(runner.device)

    raw_bs2 = len(alive)
    stale = b1.out_cache_loc_swa[raw_bs2:bs2].tolist()  # what the tail holds after step 1
    owners = list(range(raw_bs2, bs2))  # step-1 batch positions = request ids (step 1 had every request)
    predicted = sorted(stale) if (cfg.preset_swa_loc and not cfg.zero_swa_on_pad) else []
    diff = fx.pool_diff(graph_side.pool, ref.pool)
    swa_ids, full_ids = graph_side.swa_layer_ids, graph_side.full_layer_ids
    matches = all(diff.get(lyr, []) == predicted for lyr in swa_ids) and not any(lyr in diff for lyr in full_ids)
    return {
        "variant": variant, "bs_step1": bs1, "raw_bs_step2": raw_bs2, "bs_step2": bs2,
        "stale_tail_swa_slots": stale, "stale_tail_owners": owners,
        "owners_still_running": [r for r in owners if r in alive],
        "predicted_slots": predicted, "corrupted": diff, "swa_layer_ids": swa_ids, "full_layer_ids": full_ids,
        "matches_prediction": bool(matches),
        "n_corrupted": kv_mismatch_count(diff), "n_predicted": len(predicted) * len(swa_ids),
    }


# ---------------------------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------------------------
def _cleanup(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _capture_and_check(p: dict, kw: dict, labels: dict, batch_sizes: List[int], *, use_cuda_graph: bool,
                       probes: Dict[str, Callable], rows: List[dict]) -> dict:
    """Capture every variant on its own pool, check its KV writes against an eager reference; the runners."""
    with phases.phase("correctness"):
        ref = fx.build_setup(**kw)
        ref_batches = make_batches(ref, batch_sizes, seed=p["seed"])
        for bs in batch_sizes:
            fx.forward_eager(ref.model, ref_batches[bs])
    runners = {}
    for v in p["variants"]:
        with phases.phase("capture"):
            s = fx.build_setup(**kw)
            runner = fx.DecodeGraphRunner.for_variant(s.model, batch_sizes, v, use_cuda_graph=use_cuda_graph)
            runner.capture()
            for bs in batch_sizes:
                rows.append(_row(v, "translate_calls_capture", runner.capture_translate_calls[bs], "calls",
                                 batch_size=bs, **labels))
                rows.append(_row(v, "graph_kernel_nodes", probes["graph_kernel_nodes"](runner, bs), "kernels",
                                 batch_size=bs, **labels))
        with phases.phase("correctness"):
            batches = make_batches(s, batch_sizes, seed=p["seed"])
            for bs in batch_sizes:  # one populated replay per batch, same order as the eager reference
                runner.replay(batches[bs])
            if runner.use_cuda_graph:
                torch.cuda.synchronize(runner.device)
            diff = fx.pool_diff(s.pool, ref.pool)
            rows.append(_row(v, "kv_mismatch_slots", kv_mismatch_count(diff), "slots", **labels))
        runners[v] = runner
    return runners


def _time_and_count(p: dict, runners: dict, labels: dict, batch_sizes: List[int], *, probes: Dict[str, Callable],
                    timer, rows: List[dict]) -> None:
    """Replay time per (variant, bs) through ``interleaved``; then, separately, one profiled replay per cell."""
    from sglab.core.timing import interleaved

    with phases.phase("timing"):
        for bs in batch_sizes:
            fns = {v: (lambda r=r: r.replay_graph(bs)) for v, r in runners.items()}
            timings = interleaved(fns, rounds=int(p["rounds"]), warmup=int(p["warmup"]), repeat=int(p["repeat"]),
                                  timer=timer)
            for v, t in timings.items():
                rows.extend(t.rows(variant=v, batch_size=bs, **labels))
    with phases.phase("profile"):
        for v, runner in runners.items():
            for bs in batch_sizes:
                rows.append(_row(v, "profiled_kernels", probes["profiled_kernels"](runner, bs), "kernels",
                                 batch_size=bs, **labels))


def _pad_rows(p: dict, *, device, use_cuda_graph: bool, progress: bool) -> List[dict]:
    from tqdm.auto import tqdm

    rows = []
    for v in tqdm(p["variants"], desc="pad scenario", disable=not progress):
        with phases.phase("pad scenario"):
            res = pad_bug_scenario(v, device=device, use_cuda_graph=use_cuda_graph,
                                   num_layers=int(p["pad_num_layers"]), dtype=_dtype(p["dtype"]), seed=p["seed"])
        labels = dict(num_layers=int(p["pad_num_layers"]), swa_per_full=5, n_swa_layers=len(res["swa_layer_ids"]),
                      batch_size=res["bs_step2"])
        rows.append(_row(v, "pad_corrupted_slots", res["n_corrupted"], "slots", **labels))
        rows.append(_row(v, "pad_predicted_slots", res["n_predicted"], "slots", **labels))
        rows.append(_row(v, "pad_matches_prediction", int(res["matches_prediction"]), "bool", **labels))
        _cleanup(device)
    return rows


def sweep(p: dict, *, device, use_cuda_graph: bool, probes: Dict[str, Callable], timer, progress: bool = True,
          on_trace: Optional[Callable[[dict, dict, int], None]] = None) -> List[dict]:
    """Rows of the sweep and of the padding scenario.

    ``probes``: {metric: fn(runner, bs) -> kernel count} for ``graph_kernel_nodes`` and ``profiled_kernels``;
    ``timer``: fn(callable, warmup=, repeat=) -> Timing, handed to ``interleaved``. ``on_trace(runners, labels,
    bs)`` runs once, after the timing of the layout of ``p["trace_config"]`` (the traced pass of :func:`run`)."""
    from tqdm.auto import tqdm

    p = {**DEFAULT_PARAMS, **p}
    batch_sizes = sorted(int(b) for b in p["batch_sizes"])
    torch.manual_seed(p["seed"])
    tc = p.get("trace_config") or {}
    rows: List[dict] = []
    bar = tqdm([(int(r), int(L)) for r in p["swa_per_full"] for L in p["layer_counts"]], desc="swa_loc sweep",
               disable=not progress)
    for ratio, L in bar:
        bar.set_postfix(layers=L, swa_per_full=ratio)
        kw = setup_kwargs(p, L, ratio, device)
        labels = dict(num_layers=L, swa_per_full=ratio, n_swa_layers=len(fx.hybrid_layer_ids(L, ratio)[0]))
        runners = _capture_and_check(p, kw, labels, batch_sizes, use_cuda_graph=use_cuda_graph, probes=probes,
                                     rows=rows)
        _time_and_count(p, runners, labels, batch_sizes, probes=probes, timer=timer, rows=rows)
        if on_trace is not None and (tc.get("num_layers"), tc.get("swa_per_full")) == (L, ratio) \
                and tc.get("batch_size") in batch_sizes:
            on_trace(runners, labels, int(tc["batch_size"]))
        del runners
        _cleanup(device)
    rows.extend(_pad_rows(p, device=device, use_cuda_graph=use_cuda_graph, progress=progress))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The GPU run
# ---------------------------------------------------------------------------------------------------------------
def check_params(p: dict) -> dict:
    """Merged parameters, with one-line errors for values the sweep cannot use."""
    p = {**DEFAULT_PARAMS, **(p or {})}
    unknown = sorted(set(p["variants"]) - set(fx.VARIANTS))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; expected some of {list(fx.VARIANTS)}")
    if p["dtype"] not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {p['dtype']!r}")
    if not p["batch_sizes"] or min(int(b) for b in p["batch_sizes"]) < 1:
        raise ValueError(f"batch_sizes must be >= 1, got {p['batch_sizes']}")
    need = sum(int(b) for b in p["batch_sizes"])  # each pool allocates one slot per token of every batch
    if need > min(int(p["size"]), int(p["size_swa"])):
        raise ValueError(f"size / size_swa ({p['size']} / {p['size_swa']}) hold fewer slots than the batches "
                         f"allocate ({need})")
    return p


def run(params: Optional[dict] = None, *, progress: bool = True) -> runs.Measured:
    """The GPU sweep, the padding scenario on real CUDA graphs, and the profiler pictures (see the package
    docstring). nsight-python runs first: CUPTI takes one subscriber per process, and torch.profiler's sessions
    after it work, while the other order leaves nsight-python without CUPTI."""
    from sglab.experiments.swa_loc import profile

    p = check_params(params or {})
    if not torch.cuda.is_available():
        raise RuntimeError("the swa_loc experiment captures CUDA graphs: it needs a CUDA GPU")
    with phases.phase("cuda init"):
        device = torch.device("cuda", torch.cuda.current_device())
        torch.ones(1, device=device).sum().item()
    with phases.phase("eager kernel table"):
        eager, eager_info = profile.eager_kernel_tables(p, device)
    traced: dict = {}
    rows = sweep(p, device=device, use_cuda_graph=True, probes=profile.gpu_probes(), timer=None,
                 progress=progress, on_trace=lambda r, labels, bs: traced.update(profile.traced_pass(r, bs)))
    sidecars = {"eager_kernels": eager, **traced}
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=sidecars, extra={"eager_kernels": eager_info})
