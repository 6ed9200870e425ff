"""Notebook 03 on one GPU: breakable-CUDA-graph prefill before and after SGLang #24662.

Parts of one run (column ``part``):

- ``a_bs3``: the "before" graph (whole forward, captured with one request) replayed for a 3-request batch:
  how many logit rows come back, and how far the one row is from eager.
- ``b_match``: the "after" graph (layer stack only, logits tail eager) against eager prefill for 1..8 requests
  at equal token counts (``padded=0``: the token count is a capture bucket; ``padded=1``: it is not, the graph
  of the next bucket up runs with padding). Max abs diff of the logits.
- ``c_hit_rate``: share of a seeded mixed stream of prefill batches that each runner sends to its graph.
- ``d_latency``: prefill latency (CUDA events, median and p10/p90) of eager, the "before" runner (graph for
  one request, eager otherwise) and the "after" runner, per request count at several token counts.
- ``launches``: graph segments and eager breaks per bucket; host launches per prefill (kernel launches and graph
  launches) and device kernels, from the traced pass (:mod:`.profile`).
- ``e_resolution``: ``layer_model`` resolution on four model shapes with the #24662 rule and the later
  walk-the-chain rule (runs on the CPU).

Phases (:mod:`sglab.core.timing`): build, capture, correctness, hit rate, timing, profile, resolution.
"""

from __future__ import annotations

import gc
from dataclasses import asdict
from functools import partial

import torch

from sglab.core import runs
from sglab.fixes import breakable_graph as bg
from sglab.core import timing as phases
from sglab.experiments.breakable_graph import profile
from sglab.experiments.breakable_graph.routing import _DEFAULTS, _row, hit_rate_rows, resolution_rows, split_tokens

EXPERIMENT = "breakable_graph"
METHOD_VERSION = 3  # 2: eager/before/after timed in interleaved rounds; 3: lean sweep (request counts 1, 3, 8;
#                     5 buckets; 15 samples), weights drawn on the GPU, traced pass, phases
DEFAULT_PARAMS = {
    # model (bf16 on the GPU)
    "vocab_size": 32000,
    "hidden_size": 1024,
    "num_heads": 8,
    "head_dim": 128,
    "intermediate_size": 2816,
    "num_layers": 16,
    "dtype": "bfloat16",
    # graph buckets (tokens): those the sweep runs in, and 4096, the largest, which decides what the routing accepts
    "capture_num_tokens": [128, 512, 1024, 2048, 4096],
    "token_counts": [128, 512, 2048],
    "padded_token_counts": [1000],
    "batch_sizes": [1, 3, 8],
    "warmup": 3,
    "repeat": 15,              # samples per variant and configuration, taken in `rounds` alternating rounds
    "rounds": 3,
    "launch_token_count": 512,
    "launch_batch_sizes": [1, 3, 8],  # the traced pass; its 3-request prefill is kept as the events sidecar
    # mixed prefill stream for the hit rate
    "stream_batches": 1000,
    "stream_max_bs": 8,
    "stream_p_single": 0.35,
    "stream_min_len": 16,
    "stream_max_len": 2048,
    "seed": 0,
}
PARTS = ("a_bs3", "b_match", "c_hit_rate", "d_latency", "launches", "e_resolution")


def model_config(params: dict) -> bg.ModelConfig:
    return bg.ModelConfig(
        vocab_size=int(params["vocab_size"]),
        hidden_size=int(params["hidden_size"]),
        num_heads=int(params["num_heads"]),
        head_dim=int(params["head_dim"]),
        intermediate_size=int(params["intermediate_size"]),
        num_layers=int(params["num_layers"]),
        max_position=max(8192, max(int(n) for n in params["capture_num_tokens"])),
    )


def run(params: dict | None = None, *, progress: bool = True) -> runs.Measured:
    if not torch.cuda.is_available():
        raise RuntimeError("the breakable_graph experiment needs a CUDA GPU")
    return _run(params, progress=progress, device=torch.device("cuda", torch.cuda.current_device()))


def _build(cfg, dev, dtype, seed: int):
    """The model, its weights drawn on the GPU (method 3; method 2 drew the same distributions on the CPU, which
    took seconds of the live budget for a 16-layer model)."""
    return bg.build_model(cfg, device=dev, dtype=dtype, seed=seed, draw_on="device" if dev.type == "cuda" else "cpu")


def _part_a(model, before, after, batch, on_gpu: bool, say) -> list:
    """The before graph replayed for a 3-request batch (what ``can_run`` prevents), the after graph for the same."""
    eager3 = bg.run_eager(model, batch)
    got = before.replay(batch).clone()
    aft3 = after.replay(batch).clone()
    if on_gpu:
        torch.cuda.synchronize()
    kw = dict(num_tokens=batch.num_tokens, batch_size=batch.batch_size)
    say(f"[breakable_graph] (a) 3 requests: eager {tuple(eager3.shape)}, before-graph {tuple(got.shape)}, "
        f"after-graph {tuple(aft3.shape)}")
    return [
        _row("a_bs3", "eager", "logit_rows", eager3.shape[0], "rows", **kw),
        _row("a_bs3", "before", "logit_rows", got.shape[0], "rows", **kw),
        _row("a_bs3", "after", "logit_rows", aft3.shape[0], "rows", **kw),
        _row("a_bs3", "before", "row0_max_abs_diff", (got[0].float() - eager3[0].float()).abs().max().item(),
             "logit", **kw),
        _row("a_bs3", "after", "max_abs_diff", (aft3.float() - eager3.float()).abs().max().item(), "logit", **kw),
        _row("a_bs3", "before", "can_run", int(before.can_run(batch)), "bool", **kw),
        _row("a_bs3", "after", "can_run", int(after.can_run(batch)), "bool", **kw),
    ]


def _part_b(model, after, p: dict, batch_for, progress: bool) -> list:
    """The after graph against eager at bucket-sized and padded token counts, every request count."""
    from tqdm.auto import tqdm

    rows = []
    sweep = [(n, 0) for n in p["token_counts"]] + [(n, 1) for n in p["padded_token_counts"]]
    for n, padded in tqdm(sweep, desc="(b) after vs eager", disable=not progress):
        for bs in p["batch_sizes"]:
            batch = batch_for(n, bs)
            ref = bg.run_eager(model, batch).float()
            out = after.replay(batch).float()
            kw = dict(num_tokens=n, batch_size=bs, padded=padded)
            rows.append(_row("b_match", "after", "logit_rows", out.shape[0], "rows", **kw))
            rows.append(_row("b_match", "after", "max_abs_diff", (out - ref).abs().max().item(), "logit", **kw))
            rows.append(_row("b_match", "eager", "max_abs_logit", ref.abs().max().item(), "logit", **kw))
    return rows


def _part_d(model, before, after, p: dict, batch_for, timer, progress: bool) -> list:
    """Eager, before and after prefill latency in interleaved rounds, per token count and request count."""
    from tqdm.auto import tqdm

    from sglab.core.timing import interleaved

    rows = []
    sweep = [(n, bs) for n in p["token_counts"] for bs in p["batch_sizes"]]
    for n, bs in tqdm(sweep, desc="(d) latency", disable=not progress):
        batch = batch_for(n, bs)
        fns = {"eager": partial(bg.run_eager, model, batch), "before": partial(before.forward, batch),
               "after": partial(after.forward, batch)}
        kw = dict(num_tokens=n, batch_size=bs)
        timed = interleaved(fns, rounds=int(p["rounds"]), warmup=int(p["warmup"]), repeat=int(p["repeat"]),
                            timer=timer)
        for name, t in timed.items():
            rows += t.rows(**{**_DEFAULTS, **kw, "part": "d_latency", "variant": name})
        rows.append(_row("d_latency", "before", "used_graph", int(before.can_run(batch)), "bool", **kw))
        rows.append(_row("d_latency", "after", "used_graph", int(after.can_run(batch)), "bool", **kw))
    return rows


def _run(params: dict | None, *, progress: bool, device: torch.device) -> runs.Measured:
    """The run on ``device``. On the CPU (tests of the row plumbing only) graphs are emulated, times are host
    times and the traced pass sees host events only."""
    from sglab.core.timing import cuda_time, host_time

    p = {**DEFAULT_PARAMS, **(params or {})}
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    dtype = getattr(torch, p["dtype"]) if on_gpu else torch.float32
    cfg, seed = model_config(p), int(p["seed"])
    caps = sorted(int(n) for n in p["capture_num_tokens"])
    say = print if progress else (lambda *a, **k: None)
    say(f"[breakable_graph] model {asdict(cfg)} {dtype} on {torch.cuda.get_device_name(dev) if on_gpu else 'cpu'}")
    with phases.phase("build"):
        model = _build(cfg, dev, dtype, seed)
    with phases.phase("capture"):
        pool = torch.cuda.graph_pool_handle() if on_gpu else None  # one pool for every segment of both runners
        say(f"[breakable_graph] capturing {len(caps)} buckets {caps}, boundary=before and after ...")
        before = bg.BreakableGraphRunner(model, boundary=bg.BEFORE, capture_num_tokens=caps, pool=pool)
        after = bg.BreakableGraphRunner(model, boundary=bg.AFTER, capture_num_tokens=caps, pool=pool)
    rows: list[dict] = []
    for n in caps:
        for name, r in (("before", before), ("after", after)):
            segs, breaks = r.segments(n)
            rows.append(_row("launches", name, "graph_segments", segs, "count", num_tokens=n))
            rows.append(_row("launches", name, "eager_breaks", breaks, "count", num_tokens=n))

    def batch_for(n_tokens: int, bs: int) -> bg.PrefillBatch:
        lens = split_tokens(n_tokens, bs, seed)
        return bg.make_batch(lens, vocab_size=cfg.vocab_size, device=dev, seed=seed + n_tokens + bs)

    with phases.phase("correctness"):
        rows += _part_a(model, before, after, batch_for(p["token_counts"][0], 3), on_gpu, say)
        rows += _part_b(model, after, p, batch_for, progress)
    with phases.phase("hit rate"):
        rows += hit_rate_rows(p, model=model)
    timer = partial(cuda_time, device=dev) if on_gpu else partial(host_time, sync=False)
    with phases.phase("timing"):
        rows += _part_d(model, before, after, p, batch_for, timer, progress)
    with phases.phase("profile"):
        prof = profile.profile_pass(p, model, before, after, batch_for, on_gpu)
    rows += prof.rows
    with phases.phase("resolution"):
        rows += resolution_rows()
    del before, after, model, pool
    gc.collect()
    if on_gpu:
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    say("[breakable_graph] done")
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=prof.sidecars)
