"""The CPU parts of notebook 03: prefill batches and a seeded mixed stream, the graph hit rate of a runner's routing
(``can_run``), and ``layer_model`` resolution on four model shapes (with the warnings it logs)."""

from __future__ import annotations

import logging
import math
import random
from typing import Any, Iterable

import pandas as pd
import torch

from sglab.fixes import breakable_graph as bg

_DEFAULTS = {"part": "", "num_tokens": -1, "batch_size": -1, "padded": -1, "model_shape": "", "resolver": "",
             "layer_model": ""}


def _row(part: str, variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, **_DEFAULTS, "part": part}
    row.update(kw)
    row.update(metric=metric, value=float(value), unit=unit)
    return row


# --------------------------------------------------------------------------------------------------------
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
    from sglab.experiments.breakable_graph.run import DEFAULT_PARAMS

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


def hit_table(rows: list[dict]) -> pd.DataFrame:
    """The hit-rate rows of :func:`hit_rate_rows` as a table per runner."""
    hit = pd.DataFrame(rows)
    return (hit[hit["variant"].isin(["before", "after"])].pivot_table(index="variant", columns="metric", values="value")
            [["batches", "graph_batches", "hit_rate", "token_hit_rate"]])


def three_requests(capture_tokens=(16, 32, 64), lens=(10, 12, 10)) -> pd.DataFrame:
    """On the CPU (replay emulated): the before graph replayed anyway for three requests, the after graph, eager."""
    model = bg.build_model(bg.TINY_CONFIG)
    before = bg.BreakableGraphRunner(model, boundary="before", capture_num_tokens=list(capture_tokens))
    after = bg.BreakableGraphRunner(model, boundary="after", capture_num_tokens=list(capture_tokens))
    batch = bg.make_batch(list(lens), vocab_size=bg.TINY_CONFIG.vocab_size, seed=1)
    eager, b, a = bg.run_eager(model, batch), before.replay(batch), after.replay(batch)
    return pd.DataFrame([
        {"path": "eager", "logits shape": tuple(eager.shape), "max |diff| vs eager": "0", "can_run": "-"},
        {"path": "before graph, replayed anyway", "logits shape": tuple(b.shape),
         "max |diff| vs eager": f"row 0: {(b[0] - eager[0]).abs().max().item():.2e}; rows 1, 2 missing",
         "can_run": before.can_run(batch)},
        {"path": "after graph", "logits shape": tuple(a.shape),
         "max |diff| vs eager": f"{(a - eager).abs().max().item():.2e}", "can_run": after.can_run(batch)},
    ]).set_index("path")
