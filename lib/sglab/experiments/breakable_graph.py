"""Breakable CUDA graph for multi-request prefill, before and after SGLang #24662.

Parts of one run (column ``part``):

- ``a_bs3``: the "before" graph (whole forward, captured with one request) replayed for a 3-request batch:
  how many logit rows come back, and how far the one row is from eager.
- ``b_match``: the "after" graph (layer stack only, logits tail eager) against eager prefill for 1..8 requests
  at equal token counts (``padded=0``: the token count is a capture bucket; ``padded=1``: it is not, the graph
  of the next bucket up runs with padding). Max abs diff of the logits.
- ``c_hit_rate``: share of a seeded mixed stream of prefill batches that each runner sends to its graph.
- ``d_latency``: prefill latency (CUDA events, median and p10/p90) of eager, the "before" runner (graph for
  one request, eager otherwise) and the "after" runner, for 1..8 requests at several token counts.
- ``launches``: host launches per prefill (kernel launches and graph launches, torch.profiler) and graph
  segments per bucket.
- ``e_resolution``: ``layer_model`` resolution on four model shapes with the #24662 rule and the later
  walk-the-chain rule (runs on the CPU).

Parts ``c_hit_rate`` and ``e_resolution`` run anywhere (:func:`hit_rate_rows`, :func:`resolution_rows`).
"""

from __future__ import annotations

import gc
import logging
import math
import random
from dataclasses import asdict
from typing import Any, Iterable

import pandas as pd
import torch

from .. import runs
from ..fixes import breakable_graph as bg

EXPERIMENT = "breakable_graph"
METHOD_VERSION = 2  # 2: eager/before/after timed in interleaved rounds
GPUS = 1
DEFAULT_PARAMS = {
    # model (bf16 on the GPU)
    "vocab_size": 32000,
    "hidden_size": 1024,
    "num_heads": 8,
    "head_dim": 128,
    "intermediate_size": 2816,
    "num_layers": 16,
    "dtype": "bfloat16",
    # graph buckets (tokens) and the sweep
    "capture_num_tokens": [64, 128, 256, 512, 1024, 2048, 4096],
    "token_counts": [128, 512, 2048],
    "padded_token_counts": [1000],
    "batch_sizes": [1, 2, 3, 4, 5, 6, 7, 8],
    "warmup": 10,
    "repeat": 60,              # samples per variant and configuration, taken in `rounds` alternating rounds
    "rounds": 3,
    "launch_token_count": 512,
    "launch_batch_sizes": [1, 4, 8],
    # mixed prefill stream for the hit rate
    "stream_batches": 1000,
    "stream_max_bs": 8,
    "stream_p_single": 0.35,
    "stream_min_len": 16,
    "stream_max_len": 2048,
    "seed": 0,
}
PARTS = ("a_bs3", "b_match", "c_hit_rate", "d_latency", "launches", "e_resolution")
_DEFAULTS = {"part": "", "num_tokens": -1, "batch_size": -1, "padded": -1, "model_shape": "", "resolver": "",
             "layer_model": ""}


def _row(part: str, variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, **_DEFAULTS, "part": part}
    row.update(kw)
    row.update(metric=metric, value=float(value), unit=unit)
    return row


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


# --------------------------------------------------------------------------------------------------------
# Batches: a fixed token count split into requests, and a mixed stream
# --------------------------------------------------------------------------------------------------------
def split_tokens(num_tokens: int, batch_size: int, seed: int) -> list[int]:
    """Split ``num_tokens`` into ``batch_size`` request lengths (each >= 1), seeded."""
    if not 1 <= batch_size <= num_tokens:
        raise ValueError(f"cannot split {num_tokens} tokens into {batch_size} requests")
    rng = random.Random(seed * 7919 + num_tokens * 31 + batch_size)
    cuts = sorted(rng.sample(range(1, num_tokens), batch_size - 1))
    edges = [0, *cuts, num_tokens]
    return [b - a for a, b in zip(edges, edges[1:])]


def prefill_stream(
    n_batches: int,
    *,
    seed: int = 0,
    max_bs: int = 8,
    p_single: float = 0.35,
    min_len: int = 16,
    max_len: int = 2048,
) -> list[bg.BatchShape]:
    """A seeded stream of prefill batch shapes: one request with probability ``p_single``, else 2..max_bs
    requests; request lengths log-uniform in [min_len, max_len]."""
    rng = random.Random(seed)
    out = []
    lo, hi = math.log(min_len), math.log(max_len)
    for _ in range(n_batches):
        bs = 1 if (max_bs == 1 or rng.random() < p_single) else rng.randint(2, max_bs)
        lens = tuple(int(round(math.exp(rng.uniform(lo, hi)))) for _ in range(bs))
        out.append(bg.BatchShape(lens))
    return out


def graph_hit_rate(runner: Any, shapes: Iterable[bg.BatchShape]) -> dict:
    """How many batches (and tokens) of ``shapes`` the runner's ``can_run`` sends to the graph."""
    batches = hits = tokens = hit_tokens = 0
    for s in shapes:
        batches += 1
        tokens += s.num_tokens
        if runner.can_run(s):
            hits += 1
            hit_tokens += s.num_tokens
    return {
        "batches": batches,
        "graph_batches": hits,
        "hit_rate": hits / batches if batches else float("nan"),
        "token_hit_rate": hit_tokens / tokens if tokens else float("nan"),
    }


def hit_rate_rows(params: dict | None = None, model: torch.nn.Module | None = None) -> list[dict]:
    """Part c: routing only (``can_run``), nothing captured; runs on the CPU."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    if model is None:
        model = bg.build_model(bg.TINY_CONFIG)
    shapes = prefill_stream(int(p["stream_batches"]), seed=int(p["seed"]), max_bs=int(p["stream_max_bs"]),
                            p_single=float(p["stream_p_single"]), min_len=int(p["stream_min_len"]),
                            max_len=int(p["stream_max_len"]))
    rows = []
    for boundary in bg.BOUNDARIES:
        runner = bg.BreakableGraphRunner(model, boundary=boundary, capture_num_tokens=p["capture_num_tokens"],
                                         capture=False)
        h = graph_hit_rate(runner, shapes)
        rows += [
            _row("c_hit_rate", boundary, "hit_rate", h["hit_rate"], "fraction"),
            _row("c_hit_rate", boundary, "token_hit_rate", h["token_hit_rate"], "fraction"),
            _row("c_hit_rate", boundary, "graph_batches", h["graph_batches"], "batches"),
            _row("c_hit_rate", boundary, "batches", h["batches"], "batches"),
        ]
    # the stream's make-up, for the notebook's table
    for bs in range(1, int(p["stream_max_bs"]) + 1):
        n = sum(1 for s in shapes if s.batch_size == bs)
        rows.append(_row("c_hit_rate", "stream", "batches_with_bs", n, "batches", batch_size=bs))
    too_big = sum(1 for s in shapes if s.num_tokens > max(p["capture_num_tokens"]))
    rows.append(_row("c_hit_rate", "stream", "batches_over_max_tokens", too_big, "batches"))
    return rows


# --------------------------------------------------------------------------------------------------------
# Part e: layer_model resolution
# --------------------------------------------------------------------------------------------------------
class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def resolve_with_warnings(model: torch.nn.Module, *, walk: bool) -> tuple[torch.nn.Module | None, list[str]]:
    """``resolve_layer_model`` with the warnings it logs captured."""
    log = logging.getLogger(bg.__name__)
    handler = _Capture()
    log.addHandler(handler)
    try:
        found = bg.resolve_layer_model(model, walk=walk)
    finally:
        log.removeHandler(handler)
    return found, handler.messages


def module_path(root: torch.nn.Module, module: torch.nn.Module | None) -> str:
    if module is None:
        return "None"
    for name, m in root.named_modules():
        if m is module:
            return name or "<the model itself>"
    return "<not a submodule>"


def resolution_table(cfg: bg.ModelConfig = bg.TINY_CONFIG) -> pd.DataFrame:
    """One row per (model shape, resolver): what is found, whether a warning was logged, its text."""
    out = []
    for shape in bg.MODEL_SHAPES:
        model = bg.build_model(cfg, shape=shape)
        for resolver, walk in (("pr24662", False), ("walk_chain", True)):
            found, warnings = resolve_with_warnings(model, walk=walk)
            out.append({
                "model_shape": shape,
                "model_class": type(model).__name__,
                "resolver": resolver,
                "layer_model": module_path(model, found),
                "bcg_enabled": found is not None,
                "warning": warnings[0] if warnings else "",
            })
    return pd.DataFrame(out)


def resolution_rows() -> list[dict]:
    rows = []
    for r in resolution_table().itertuples():
        kw = dict(model_shape=r.model_shape, resolver=r.resolver, layer_model=r.layer_model)
        rows.append(_row("e_resolution", r.resolver, "resolved", int(r.bcg_enabled), "bool", **kw))
        rows.append(_row("e_resolution", r.resolver, "warned", int(bool(r.warning)), "bool", **kw))
    return rows


# --------------------------------------------------------------------------------------------------------
# GPU parts
# --------------------------------------------------------------------------------------------------------
def _launch_counts(fn) -> dict:
    """Host-side launches during one call of ``fn`` (torch.profiler): kernel launches and graph launches,
    and the device kernels that ran (inside graphs too)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernel_launches = graph_launches = device_kernels = 0
    for ev in prof.events():
        name = ev.name
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            if not name.startswith(("Memcpy", "Memset")):
                device_kernels += 1
        elif "GraphLaunch" in name:
            graph_launches += 1
        elif "LaunchKernel" in name:
            kernel_launches += 1
    return {"host_kernel_launches": kernel_launches, "host_graph_launches": graph_launches,
            "device_kernels": device_kernels}


def run(params: dict | None = None, *, progress: bool = True) -> pd.DataFrame:
    if not torch.cuda.is_available():
        raise RuntimeError("the breakable_graph experiment needs a CUDA GPU")
    return _run(params, progress=progress, device=torch.device("cuda", torch.cuda.current_device()))


def _run(params: dict | None, *, progress: bool, device: torch.device) -> pd.DataFrame:
    """The run on ``device``. On the CPU (tests of the row plumbing only) graphs are emulated, times are
    host times and the launch counts are left out."""
    from tqdm.auto import tqdm

    from functools import partial

    from ..measure.timing import cuda_time, host_time, interleaved

    p = {**DEFAULT_PARAMS, **(params or {})}
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    dtype = getattr(torch, p["dtype"]) if on_gpu else torch.float32
    cfg = model_config(p)
    seed = int(p["seed"])
    caps = sorted(int(n) for n in p["capture_num_tokens"])
    say = print if progress else (lambda *a, **k: None)

    where = torch.cuda.get_device_name(dev) if on_gpu else "cpu"
    say(f"[breakable_graph] model {asdict(cfg)} {dtype} on {where}")
    model = bg.build_model(cfg, device=dev, dtype=dtype, seed=seed)
    pool = torch.cuda.graph_pool_handle() if on_gpu else None  # one pool for every segment of both runners
    say(f"[breakable_graph] capturing {len(caps)} buckets {caps}, boundary=before ...")
    before = bg.BreakableGraphRunner(model, boundary=bg.BEFORE, capture_num_tokens=caps, pool=pool)
    say("[breakable_graph] capturing boundary=after ...")
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

    # (a) the before graph replayed for 3 requests
    n_a = p["token_counts"][0]
    b3 = batch_for(n_a, 3)
    eager3 = bg.run_eager(model, b3)
    got = before.replay(b3).clone()
    aft3 = after.replay(b3).clone()
    if on_gpu:
        torch.cuda.synchronize(dev)
    kw = dict(num_tokens=n_a, batch_size=3)
    rows += [
        _row("a_bs3", "eager", "logit_rows", eager3.shape[0], "rows", **kw),
        _row("a_bs3", "before", "logit_rows", got.shape[0], "rows", **kw),
        _row("a_bs3", "after", "logit_rows", aft3.shape[0], "rows", **kw),
        _row("a_bs3", "before", "row0_max_abs_diff", (got[0].float() - eager3[0].float()).abs().max().item(),
             "logit", **kw),
        _row("a_bs3", "after", "max_abs_diff", (aft3.float() - eager3.float()).abs().max().item(), "logit", **kw),
        _row("a_bs3", "before", "can_run", int(before.can_run(b3)), "bool", **kw),
        _row("a_bs3", "after", "can_run", int(after.can_run(b3)), "bool", **kw),
    ]
    say(f"[breakable_graph] (a) 3 requests: eager {tuple(eager3.shape)}, before-graph {tuple(got.shape)}, "
        f"after-graph {tuple(aft3.shape)}")

    # (b) after vs eager at equal token counts (and padded ones)
    sweep_b = [(n, 0) for n in p["token_counts"]] + [(n, 1) for n in p["padded_token_counts"]]
    for n, padded in tqdm(sweep_b, desc="(b) after vs eager", disable=not progress):
        for bs in p["batch_sizes"]:
            batch = batch_for(n, bs)
            ref = bg.run_eager(model, batch).float()
            out = after.replay(batch).float()
            kw = dict(num_tokens=n, batch_size=bs, padded=padded)
            rows.append(_row("b_match", "after", "logit_rows", out.shape[0], "rows", **kw))
            rows.append(_row("b_match", "after", "max_abs_diff", (out - ref).abs().max().item(), "logit", **kw))
            rows.append(_row("b_match", "eager", "max_abs_logit", ref.abs().max().item(), "logit", **kw))

    # (c) hit rate on the real runners' routing
    rows += hit_rate_rows(p, model=model)

    # (d) latency
    sweep_d = [(n, bs) for n in p["token_counts"] for bs in p["batch_sizes"]]
    for n, bs in tqdm(sweep_d, desc="(d) latency", disable=not progress):
        batch = batch_for(n, bs)
        fns = {
            "eager": lambda: bg.run_eager(model, batch),
            "before": lambda: before.forward(batch),
            "after": lambda: after.forward(batch),
        }
        kw = dict(num_tokens=n, batch_size=bs)
        timer = (partial(cuda_time, device=dev) if on_gpu else partial(host_time, sync=False))
        timed = interleaved(fns, rounds=int(p["rounds"]), warmup=int(p["warmup"]), repeat=int(p["repeat"]),
                            timer=timer)
        for name, t in timed.items():
            rows += t.rows(**{**_DEFAULTS, **kw, "part": "d_latency", "variant": name})
        rows.append(_row("d_latency", "before", "used_graph", int(before.can_run(batch)), "bool", **kw))
        rows.append(_row("d_latency", "after", "used_graph", int(after.can_run(batch)), "bool", **kw))

    # launches per prefill
    n_l = int(p["launch_token_count"])
    for bs in tqdm(p["launch_batch_sizes"] if on_gpu else [], desc="launches", disable=not progress):
        batch = batch_for(n_l, bs)
        for name, fn in (("eager", lambda: bg.run_eager(model, batch)), ("before", lambda: before.forward(batch)),
                         ("after", lambda: after.forward(batch))):
            fn()
            for metric, value in _launch_counts(fn).items():
                rows.append(_row("launches", name, metric, value, "count", num_tokens=n_l, batch_size=bs))

    # (e) resolution (CPU logic, recorded with the run for completeness)
    rows += resolution_rows()

    del before, after, model, pool
    gc.collect()
    if on_gpu:
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    say("[breakable_graph] done")
    return runs.tidy(EXPERIMENT, rows)


# --------------------------------------------------------------------------------------------------------
# Analysis helpers (used by the notebook)
# --------------------------------------------------------------------------------------------------------
def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median latency per (num_tokens, batch_size) and variant, with speedups over eager."""
    d = df[(df["part"] == "d_latency") & (df["metric"] == "time_median")]
    t = d.pivot_table(index=["num_tokens", "batch_size"], columns="variant", values="value").reset_index()
    t["speedup_after"] = t["eager"] / t["after"]
    t["speedup_before"] = t["eager"] / t["before"]
    return t


def spread(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    d = df[(df["part"] == "d_latency") & (df["variant"] == variant)]
    return d.pivot_table(index=["num_tokens", "batch_size"], columns="metric", values="value").reset_index()


gpu_short = runs.gpu_short


def newest_per_gpu(runs_: list) -> list:
    """The newest run of each GPU model, ordered by GPU name."""
    return list(runs.newest_by(runs_, runs.gpu_short).values())


def multi_request_speedups(df: pd.DataFrame) -> pd.Series:
    """Eager / after median latency for the batches with 2+ requests (all token counts)."""
    t = latency_table(df)
    return t[t["batch_size"] > 1]["speedup_after"]


def hit_rates(df: pd.DataFrame) -> dict:
    """{variant: {"hit_rate": ..., "token_hit_rate": ...}} of part c."""
    c = df[(df["part"] == "c_hit_rate") & df["variant"].isin(["before", "after"])]
    return {v: dict(zip(g["metric"], g["value"])) for v, g in c.groupby("variant")}


def headline(runs_: list) -> str:
    """README index line: the claim with the numbers of the newest recorded run per GPU."""
    shown = newest_per_gpu(runs_)
    parts = []
    for r in shown:
        s = multi_request_speedups(r.df)
        parts.append(f"{gpu_short(r.manifest)} {s.min():.2f}–{s.max():.2f}× (median {s.median():.2f}×)")
    hr = hit_rates(shown[-1].df)
    diff = max(float(r.df[(r.df["part"] == "b_match") & (r.df["metric"] == "max_abs_diff")]["value"].max())
               for r in shown)
    tabs = [latency_table(r.df) for r in shown]
    ns = sorted(int(n) for t in tabs for n in t["num_tokens"].unique())
    bss = sorted(int(b) for t in tabs for b in t["batch_size"].unique() if b > 1)
    return ("Capturing only the layer stack lets one breakable CUDA graph serve prefill batches of any request "
            f"count: graph hit rate {hr['before']['hit_rate']:.0%} → {hr['after']['hit_rate']:.0%} of a mixed "
            f"prefill stream; {bss[0]}–{bss[-1]}-request prefills of {ns[0]}–{ns[-1]} tokens vs eager: {'; '.join(parts)}; "
            f"logits max abs diff vs eager {diff:.3g}.")
