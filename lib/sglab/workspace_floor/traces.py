"""The traces a call site sees and the exact simulation over them: ``x.shape[0]`` per forward step
of a seeded serving simulation (:func:`generate_trace`), stored in ``data/traces/`` and regenerated
byte for byte (:func:`load_trace`), and each policy's creations along one (:func:`simulated`)."""

from __future__ import annotations

import bisect
import functools
import hashlib
import io
import json

import numpy as np
import pandas as pd

from sglab.core import runs
from sglab.sglang.server_args import piecewise_cuda_graph_tokens
from sglab.workspace_floor import rebuild

# extend batches up to pcg_max_tokens are padded to a piecewise bucket; rates are mean arrivals per
# step (outside and inside bursts); the arrival rate ramps up from 0 over ramp_steps (0: none)
TRACE_PARAMS = {
    "seed": 0, "steps": 3000, "max_running": 256, "chunked_prefill_size": 4096,
    "pcg_max_tokens": 4096, "prompt_median": 1200, "prompt_sigma": 1.0, "prompt_max": 32768,
    "output_median": 300, "output_sigma": 0.8, "output_max": 4096, "base_rate": 0.15,
    "burst_rate": 2.0, "burst_every": 700, "burst_len": 60, "ramp_steps": 0
}
# a mixed serving load, and a cold server warming up on short prompts
TRACES = {
    "mixed": {}, "short_ramp": dict(seed=1, prompt_median=48, prompt_sigma=0.6, output_median=600,
                                    base_rate=0.4, burst_rate=3.0, ramp_steps=1500)
}
TRACE_DIR = runs.repo_root() / "data" / "traces"


def _lognormal(rng, median, sigma, lo, hi) -> int:
    return int(np.clip(round(rng.lognormal(np.log(median), sigma)), lo, hi))


def generate_trace(**overrides) -> pd.DataFrame:
    """``step, kind, tokens_raw, tokens, running, waiting`` per forward step (seeded serving)."""
    p = {**TRACE_PARAMS, **overrides}
    rng = np.random.default_rng(p["seed"])
    buckets = piecewise_cuda_graph_tokens(p["pcg_max_tokens"])
    waiting: list[list[int]] = []  # [remaining prompt tokens, output tokens]
    running: list[int] = []  # remaining output tokens
    rows, t_sim = [], 0
    while len(rows) < p["steps"]:
        in_burst = (t_sim % p["burst_every"]) < p["burst_len"] and t_sim >= p["burst_every"] // 2
        ramp = min(1.0, (t_sim + 1) / p["ramp_steps"]) if p["ramp_steps"] else 1.0
        for _ in range(int(rng.poisson(ramp * (p["burst_rate"] if in_burst else p["base_rate"])))):
            L = _lognormal(rng, p["prompt_median"], p["prompt_sigma"], 16, p["prompt_max"])
            O = _lognormal(rng, p["output_median"], p["output_sigma"], 1, p["output_max"])
            waiting.append([L, O])
        t_sim += 1
        if waiting and len(running) < p["max_running"]:
            budget, raw, chunked = p["chunked_prefill_size"], 0, False
            while waiting and budget > 0 and len(running) < p["max_running"]:
                req = waiting[0]
                take = min(req[0], budget)
                req[0] -= take
                budget -= take
                raw += take
                if req[0]:
                    chunked = True
                    break
                running.append(req[1])
                waiting.pop(0)
            tokens = buckets[bisect.bisect_left(buckets, raw)] if raw <= p["pcg_max_tokens"] \
                else raw
            kind = "chunked_prefill" if chunked else "prefill"
        elif running:
            raw = tokens = len(running)
            running = [r - 1 for r in running if r > 1]
            kind = "decode"
        else:
            continue  # idle: no forward, no call
        rows.append(
            dict(step=len(rows), kind=kind, tokens_raw=raw, tokens=tokens, running=len(running),
                 waiting=len(waiting)))
    return pd.DataFrame(rows)


def trace_params(name: str) -> dict:
    return {**TRACE_PARAMS, **TRACES[name]}


def load_trace(name: str = "mixed", *, verify: bool = True):
    """``(frame, meta)`` of a stored trace (``verify``: regenerated, equal byte for byte)."""
    stem = TRACE_DIR / f"workspace_floor_{name}"
    meta = json.loads(stem.with_suffix(".json").read_text())
    data = stem.with_suffix(".csv").read_bytes()
    if verify and (generate_trace(**meta["params"]).to_csv(index=False,
                                                           lineterminator="\n").encode() != data
                   or hashlib.sha256(data).hexdigest() != meta["sha256"]):
        raise ValueError(f"{stem}.csv does not match generate_trace({meta['params']})")
    return pd.read_csv(io.BytesIO(data)), meta


@functools.lru_cache(maxsize=None)
def _tokens(name: str) -> tuple:
    return tuple(int(x) for x in generate_trace(**trace_params(name))["tokens"])


def trace_tokens(name: str) -> list[int]:
    """``x.shape[0]`` per step of a named trace (regenerated from its parameters; cached)."""
    return list(_tokens(name))


def calls_over(name: str, max_token_num: int, steps: int = 0) -> int:
    """Calls of a trace (its first ``steps``, 0: all) over ``max_token_num``: the assert refuses."""
    return sum(t > max_token_num for t in _tokens(name)[:steps or None])


def summary() -> pd.DataFrame:
    """One row per stored trace, each regenerated and compared byte for byte."""
    rows = []
    for name in TRACES:
        tr, meta = load_trace(name)
        kinds = {f"{k} steps": v for k, v in tr.kind.value_counts().sort_index().items()}
        rows.append({
            "trace": name, "steps": meta["rows"], "sha256": meta["sha256"][:12] + "…",
            **kinds, "max x.shape[0]": int(tr.tokens.max()),
            "calls over 2048": calls_over(name, rebuild.CALLEE_DEFAULT_MAX_TOKEN_NUM)
        })
    out = pd.DataFrame(rows).set_index("trace").fillna(0)
    steps = [c for c in out.columns if c.endswith(" steps")]  # a trace without a kind: 0 steps
    out[steps] = out[steps].astype(int)
    return out


@functools.lru_cache(maxsize=256)
def simulated(trace_name: str, policy: str, world_size: int, hidden_dim: int,
              pre_initialize: int = 0):
    """``(manager, refused)`` of one policy over one stored trace (cached)."""
    return rebuild.simulate(rebuild.POLICIES[policy], trace_tokens(trace_name),
                            world_size=world_size, hidden_dim=hidden_dim,
                            pre_initialize=pre_initialize or None)


def in_trace(manager) -> int:
    """The creations a trace's calls made (SGLang's pre-initialisation, step -1, not counted)."""
    return sum(e.step >= 0 for e in manager.events)


def recreations(trace_name: str, policy: str, world_size: int, hidden_dim: int,
                pre_initialize: int = 0) -> int:
    return in_trace(simulated(trace_name, policy, world_size, hidden_dim, pre_initialize)[0])
