"""Measure the breakable CUDA graph before and after SGLang #24662 on one GPU, in parts (``part``):
``a_bs3`` the one-request "before" graph replayed for 3 requests; ``b_match`` "after" against eager;
``c_hit_rate`` a seeded mixed stream routed by ``can_run``; ``d_latency`` eager, before and after
in interleaved rounds; ``launches`` segments per bucket and launches per prefill (a traced pass).
On the CPU graphs are emulated and times are host times."""

from __future__ import annotations

import gc
import math
import random
from dataclasses import asdict
from functools import partial
from typing import Any, Iterable, Optional

import pandas as pd
import torch

from sglab.breakable_graph import rebuild
from sglab.core import runs, timing, trace
from sglab.sglang.probing import captured_logs, module_path  # noqa: F401 (03 calls module_path)


EXPERIMENT = "breakable_graph"
METHOD_VERSION = 3
GPUS = 1
_MODEL = dict(vocab_size=32000, hidden_size=1024, num_heads=8, head_dim=128, intermediate_size=2816,
              num_layers=16, dtype="bfloat16")  # bf16 on the GPU
# graph buckets (the largest decides what the routing accepts), the timed cells, the traced ones
_CELLS = dict(capture_num_tokens=[128, 512, 1024, 2048, 4096], token_counts=[128, 512, 2048],
              padded_token_counts=[1000], batch_sizes=[1, 3, 8], launch_batch_sizes=[1, 3, 8])
# ``repeat`` samples per variant and cell in ``rounds`` alternating rounds; the mixed stream
_PASSES = dict(warmup=3, repeat=15, rounds=3, launch_token_count=512, stream_batches=1000,
               stream_max_bs=8, stream_p_single=0.35, stream_min_len=16, stream_max_len=2048,
               seed=0)
DEFAULT_PARAMS = {**_MODEL, **_CELLS, **_PASSES}
_DEFAULTS = dict(part="", num_tokens=-1, batch_size=-1, padded=-1, model_shape="", resolver="",
                 layer_model="")


def _row(part: str, variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, **_DEFAULTS, "part": part, **kw}
    return {**row, "metric": metric, "value": float(value), "unit": unit}


def model_config(params: dict) -> rebuild.ModelConfig:
    shape = {k: int(params[k]) for k in _MODEL if k != "dtype"}
    return rebuild.ModelConfig(**shape, max_position=max(8192,
                                                         *map(int, params["capture_num_tokens"])))


# -- batches: a fixed token count split into requests, and a seeded mixed stream; the hit rate -----
def split_tokens(num_tokens: int, batch_size: int, seed: int) -> list[int]:
    """Split ``num_tokens`` into ``batch_size`` request lengths (each >= 1), seeded."""
    if not 1 <= batch_size <= num_tokens:
        raise ValueError(f"cannot split {num_tokens} tokens into {batch_size} requests")
    rng = random.Random(seed * 7919 + num_tokens * 31 + batch_size)
    edges = [0, *sorted(rng.sample(range(1, num_tokens), batch_size - 1)), num_tokens]
    return [b - a for a, b in zip(edges, edges[1:])]


def prefill_stream(n_batches: int, *, seed: int = 0, max_bs: int = 8, p_single: float = 0.35,
                   min_len: int = 16, max_len: int = 2048) -> list[rebuild.BatchShape]:
    """A seeded stream of prefill batch shapes, lengths log-uniform in [min_len, max_len]."""
    rng = random.Random(seed)
    out, lo, hi = [], math.log(min_len), math.log(max_len)
    for _ in range(n_batches):
        bs = 1 if (max_bs == 1 or rng.random() < p_single) else rng.randint(2, max_bs)
        out.append(
            rebuild.BatchShape(tuple(int(round(math.exp(rng.uniform(lo, hi)))) for _ in range(bs))))
    return out


def stream(p: dict) -> list[rebuild.BatchShape]:
    """The mixed stream of parameters ``p`` (``stream_*`` and ``seed``)."""
    return prefill_stream(int(p["stream_batches"]), seed=int(p["seed"]),
                          max_bs=int(p["stream_max_bs"]), p_single=float(p["stream_p_single"]),
                          min_len=int(p["stream_min_len"]), max_len=int(p["stream_max_len"]))


def graph_hit_rate(runner: Any, shapes: Iterable[rebuild.BatchShape]) -> dict:
    """How many batches (and tokens) of ``shapes`` the runner's ``can_run`` sends to the graph."""
    shapes = list(shapes)
    hit = [s for s in shapes if runner.can_run(s)]
    batches, tokens = len(shapes), sum(s.num_tokens for s in shapes)
    return dict(batches=batches, graph_batches=len(hit),
                hit_rate=len(hit) / batches if batches else float("nan"),
                token_hit_rate=sum(s.num_tokens for s in hit) / tokens if tokens else float("nan"))


_HIT_UNITS = dict(hit_rate="fraction", token_hit_rate="fraction", graph_batches="batches",
                  batches="batches")


def hit_rate_rows(params: Optional[dict] = None, model: Optional[torch.nn.Module] = None) -> list:
    """Part c: routing only (``can_run``), nothing captured; runs on the CPU."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    model = model if model is not None else rebuild.build_model(rebuild.TINY_CONFIG)
    shapes, row, rows = stream(p), partial(_row, "c_hit_rate"), []
    for boundary in rebuild.BOUNDARIES:
        runner = rebuild.BreakableGraphRunner(model, boundary=boundary,
                                              capture_num_tokens=p["capture_num_tokens"],
                                              capture=False)
        h = graph_hit_rate(runner, shapes)
        rows += [row(boundary, k, h[k], u) for k, u in _HIT_UNITS.items()]
    sizes = range(1, int(p["stream_max_bs"]) + 1)
    made = {bs: sum(s.batch_size == bs for s in shapes) for bs in sizes}  # the stream's make-up
    rows += [
        row("stream", "batches_with_bs", n, "batches", batch_size=bs) for bs, n in made.items()
    ]
    too_big = sum(s.num_tokens > max(p["capture_num_tokens"]) for s in shapes)
    return rows + [row("stream", "batches_over_max_tokens", too_big, "batches")]


def resolve(model: torch.nn.Module, *, walk: bool) -> tuple[Optional[torch.nn.Module], list]:
    """``rebuild.resolve_layer_model`` and the warnings it logs."""
    with captured_logs(rebuild.__name__) as logs:
        found = rebuild.resolve_layer_model(model, walk=walk)
    return found, [m for level, m in logs if level == "WARNING"]


RESOLVERS = {"pr24662": False, "walk_chain": True}  # resolver name: walk=


# -- the traced pass: after the timed passes, one prefill per runner and request count at
# launch_token_count tokens; the 3-request prefills of "before" and "after" are the events sidecar
def launch_numbers(ev: pd.DataFrame) -> dict:
    """Host launches and device kernels of one prefill (``ev``: the events of one phase)."""
    rt = ev[ev.category == "runtime"]
    return dict(host_kernel_launches=int(rt.name.str.contains("LaunchKernel").sum()),
                host_graph_launches=int(rt.name.str.contains("GraphLaunch").sum()),
                device_kernels=int((trace.on_device(ev.lane) & (ev.category == "kernel")).sum()))


def profile_pass(p: dict, model, before, after, batch_for, on_gpu: bool) -> tuple[list, dict]:
    """The traced pass: (launch rows, sidecars: the events and the Perfetto file)."""
    n = int(p["launch_token_count"])
    fns = {}
    for bs in (int(b) for b in p["launch_batch_sizes"]):
        batch = batch_for(n, bs)
        fns[f"eager {bs}"] = partial(rebuild.run_eager, model, batch)
        fns[f"before {bs}"] = partial(before.forward, batch)
        fns[f"after {bs}"] = partial(after.forward, batch)
    events, perfetto = trace.trace_variants(fns, "batch_size", cuda=on_gpu,
                                            perfetto_prefix="sglab-bcg-")
    rows = [
        _row("launches", variant, metric, value, "count", num_tokens=n, batch_size=int(bs))
        for (variant, bs), ev in events.groupby(["variant", "batch_size"], sort=False)
        for metric, value in launch_numbers(ev).items()
    ]
    keep = (events.batch_size == 3) & events.variant.isin(("before", "after"))
    sidecars = {"events": events[keep].reset_index(drop=True)}
    if perfetto is not None:
        sidecars["trace"] = perfetto
    return rows, sidecars


# -- the run ---------------------------------------------------------------------------------------
def three_requests(model, before, after, batch, on_gpu: bool = False) -> list:
    """Part a: the before and after graphs replayed for a 3-request batch, and eager."""
    eager3 = rebuild.run_eager(model, batch)
    got, aft3 = before.replay(batch).clone(), after.replay(batch).clone()
    if on_gpu:
        torch.cuda.synchronize()
    row = partial(_row, "a_bs3", num_tokens=batch.num_tokens, batch_size=batch.batch_size)
    return [
        row("eager", "logit_rows", eager3.shape[0], "rows"),
        row("before", "logit_rows", got.shape[0], "rows"),
        row("after", "logit_rows", aft3.shape[0], "rows"),
        row("before", "row0_max_abs_diff", (got[0].float() - eager3[0].float()).abs().max(),
            "logit"),
        row("after", "max_abs_diff", (aft3.float() - eager3.float()).abs().max(), "logit"),
        row("before", "can_run", int(before.can_run(batch)), "bool"),
        row("after", "can_run", int(after.can_run(batch)), "bool")
    ]


def _matches(model, after, p: dict, batch_for) -> list:
    """Part b: the after graph against eager at bucket-sized and padded token counts."""
    rows = []
    sweep = [(n, 0) for n in p["token_counts"]] + [(n, 1) for n in p["padded_token_counts"]]
    for n, padded in sweep:
        for bs in p["batch_sizes"]:
            batch = batch_for(n, bs)
            ref = rebuild.run_eager(model, batch).float()
            out = after.replay(batch).float()
            row = partial(_row, "b_match", num_tokens=n, batch_size=bs, padded=padded)
            rows += [
                row("after", "logit_rows", out.shape[0], "rows"),
                row("after", "max_abs_diff", (out - ref).abs().max(), "logit"),
                row("eager", "max_abs_logit",
                    ref.abs().max(), "logit")
            ]
    return rows


def timer_for(dev, on_gpu: bool):
    """What times part d: CUDA events on ``dev``, or the host's clock where it is the CPU."""
    return partial(timing.cuda_time, device=dev) if on_gpu else partial(
        timing.host_time, sync=False)


def _latency(model, before, after, p: dict, batch_for, timer) -> list:
    """Part d: eager, before and after prefill latency in interleaved rounds, per cell."""
    rows = []
    for n, bs in [(n, bs) for n in p["token_counts"] for bs in p["batch_sizes"]]:
        batch = batch_for(n, bs)
        fns = dict(eager=partial(rebuild.run_eager, model, batch),
                   before=partial(before.forward, batch), after=partial(after.forward, batch))
        kw = dict(num_tokens=n, batch_size=bs)
        timed = timing.interleaved(fns, rounds=int(p["rounds"]), warmup=int(p["warmup"]),
                                   repeat=int(p["repeat"]), timer=timer)
        for name, t in timed.items():
            rows += t.rows(**{**_DEFAULTS, **kw, "part": "d_latency", "variant": name})
        rows += [
            _row("d_latency", v, "used_graph", int(r.can_run(batch)), "bool", **kw)
            for v, r in (("before", before), ("after", after))
        ]
    return rows


def run(params: Optional[dict] = None, *, progress: bool = True,
        device: Optional[torch.device | str] = None) -> runs.Measured:
    """The run on one GPU (``device=None``: the current one; ``"cpu"``: emulated, for the tests)."""
    if device is None:
        if not torch.cuda.is_available():
            raise RuntimeError("the breakable_graph experiment needs a CUDA GPU")
        device = torch.device("cuda", torch.cuda.current_device())
    p = {**DEFAULT_PARAMS, **(params or {})}
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    dtype = getattr(torch, p["dtype"]) if on_gpu else torch.float32
    cfg, seed = model_config(p), int(p["seed"])
    caps = sorted(int(n) for n in p["capture_num_tokens"])
    say = print if progress else (lambda *a, **k: None)
    where = torch.cuda.get_device_name(dev) if on_gpu else "cpu"
    say(f"[breakable_graph] model {asdict(cfg)} {dtype} on {where}")
    with timing.phase("build"):
        model = rebuild.build_model(cfg, device=dev, dtype=dtype, seed=seed,
                                    draw_on="device" if on_gpu else "cpu")
    with timing.phase("capture"):
        say(f"[breakable_graph] capturing {len(caps)} buckets {caps}, boundary=before and after")
        pool = torch.cuda.graph_pool_handle() if on_gpu else None  # one pool for both runners
        before, after = (rebuild.BreakableGraphRunner(model, boundary=b, capture_num_tokens=caps,
                                                      pool=pool) for b in rebuild.BOUNDARIES)
    rows = [
        _row("launches", name, metric, x, "count", num_tokens=n) for n in caps
        for name, r in (("before", before), ("after", after))
        for metric, x in zip(("graph_segments", "eager_breaks"), r.segments(n))
    ]

    def batch_for(n_tokens: int, bs: int) -> rebuild.PrefillBatch:
        return rebuild.make_batch(split_tokens(n_tokens, bs, seed), vocab_size=cfg.vocab_size,
                                  device=dev, seed=seed + n_tokens + bs)

    with timing.phase("correctness"):
        say("[breakable_graph] (a) 3 requests through the before and after graphs; (b) after vs "
            "eager")
        rows += three_requests(model, before, after, batch_for(p["token_counts"][0], 3), on_gpu)
        rows += _matches(model, after, p, batch_for)
    with timing.phase("hit rate"):
        say("[breakable_graph] (c) hit rate of the mixed prefill stream")
        rows += hit_rate_rows(p, model=model)
    with timing.phase("timing"):
        say("[breakable_graph] (d) latency of eager, before and after, interleaved")
        rows += _latency(model, before, after, p, batch_for, timer_for(dev, on_gpu))
    with timing.phase("profile"):
        say("[breakable_graph] traced pass (torch.profiler)")
        launch_rows, sidecars = profile_pass(p, model, before, after, batch_for, on_gpu)
    rows += launch_rows
    del before, after, model, pool
    gc.collect()
    if on_gpu:
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    say("[breakable_graph] done")
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=sidecars)
