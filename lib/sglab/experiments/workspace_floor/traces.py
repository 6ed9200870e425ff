"""The token-count traces the call site sees: a seeded serving simulation, stored in ``data/traces/``.

:func:`generate_trace` gives the ``x.shape[0]`` that ``_forward_with_allreduce_fusion`` sees per forward step of a
small serving simulation (Poisson arrivals with bursts, chunked prefill, extend batches padded to
piecewise-CUDA-graph buckets up to 4096, decode batches). Each stored trace is a CSV plus a JSON of its
parameters and checksum; :func:`load_trace` regenerates it and insists on a byte-for-byte match, so the stored
file and the generator cannot drift apart.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from pathlib import Path
from typing import Optional

from sglab.core import runs

TRACE_PARAMS = {
    "seed": 0,
    "steps": 3000,  # forward steps recorded (idle steps are not calls and are skipped)
    "max_running": 256,  # max concurrent decode requests
    "chunked_prefill_size": 4096,
    "pcg_max_tokens": 4096,  # extend batches up to this many tokens are padded to a piecewise bucket
    "prompt_median": 1200,
    "prompt_sigma": 1.0,
    "prompt_max": 32768,
    "output_median": 300,
    "output_sigma": 0.8,
    "output_max": 4096,
    "base_rate": 0.15,  # mean arrivals per step outside bursts
    "burst_rate": 2.0,  # mean arrivals per step inside bursts
    "burst_every": 700,
    "burst_len": 60,
    "ramp_steps": 0,  # arrival rate grows linearly from 0 over this many simulated steps (0: no ramp)
}

# Two stored traces: a mixed serving load, and a cold server warming up on short prompts.
TRACES = {
    "mixed": {},
    "short_ramp": {"seed": 1, "prompt_median": 48, "prompt_sigma": 0.6, "output_median": 600,
                   "base_rate": 0.4, "burst_rate": 3.0, "ramp_steps": 1500},
}

TRACE_DIR = runs.repo_root() / "data" / "traces"
TRACE_PREFIX = "workspace_floor_"
GENERATOR = "sglab.experiments.workspace_floor.generate_trace"  # as stored in the traces' JSON


def pcg_buckets(max_tokens: int = 4096) -> list[int]:
    """Piecewise-CUDA-graph token buckets, fine at small sizes and coarser up to ``max_tokens``."""
    b = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
         + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, 8193, 512)))
    return [x for x in b if x <= max_tokens]


def generate_trace(**overrides):
    """The trace as a DataFrame: ``step, kind, tokens_raw, tokens, running, waiting`` (``tokens`` = x.shape[0]).

    A step either prefills (chunks of waiting prompts up to ``chunked_prefill_size`` tokens, prefill first as in
    SGLang's default scheduler; padded up to the next piecewise bucket when <= ``pcg_max_tokens``) or decodes
    one token for every running request. Deterministic for a given parameter set.
    """
    import bisect

    import numpy as np
    import pandas as pd

    p = {**TRACE_PARAMS, **overrides}
    rng = np.random.default_rng(p["seed"])
    buckets = pcg_buckets(p["pcg_max_tokens"])
    waiting: list[list[int]] = []  # [remaining prompt tokens, output tokens]
    running: list[int] = []  # remaining output tokens
    rows = []
    t_sim = 0
    while len(rows) < p["steps"]:
        in_burst = (t_sim % p["burst_every"]) < p["burst_len"] and t_sim >= p["burst_every"] // 2
        ramp = min(1.0, (t_sim + 1) / p["ramp_steps"]) if p["ramp_steps"] else 1.0
        n_new = int(rng.poisson(ramp * (p["burst_rate"] if in_burst else p["base_rate"])))
        for _ in range(n_new):
            L = int(np.clip(round(rng.lognormal(np.log(p["prompt_median"]), p["prompt_sigma"])), 16,
                            p["prompt_max"]))
            O = int(np.clip(round(rng.lognormal(np.log(p["output_median"]), p["output_sigma"])), 1,
                            p["output_max"]))
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
                if req[0] == 0:
                    running.append(req[1])
                    waiting.pop(0)
                else:
                    chunked = True
                    break
            tokens = raw
            if raw <= p["pcg_max_tokens"]:
                tokens = buckets[bisect.bisect_left(buckets, raw)]
            kind = "chunked_prefill" if chunked else "prefill"
        elif running:
            raw = tokens = len(running)
            running = [r - 1 for r in running if r > 1]
            kind = "decode"
        else:
            continue  # idle: no forward, no call
        rows.append({"step": len(rows), "kind": kind, "tokens_raw": raw, "tokens": tokens,
                     "running": len(running), "waiting": len(waiting)})
    return pd.DataFrame(rows)


def _csv_bytes(df) -> bytes:
    return df.to_csv(index=False, lineterminator="\n").encode()


def trace_params(name: str) -> dict:
    return {**TRACE_PARAMS, **TRACES[name]}


def write_trace(name: str = "mixed", directory: Optional[Path] = None) -> Path:
    """Write ``workspace_floor_<name>.csv`` and ``.json`` (parameters, generator, sha256 of the CSV)."""
    d = Path(directory or TRACE_DIR)
    d.mkdir(parents=True, exist_ok=True)
    TRACE_NAME = TRACE_PREFIX + name
    params = trace_params(name)
    df = generate_trace(**params)
    data = _csv_bytes(df)
    (d / f"{TRACE_NAME}.csv").write_bytes(data)
    meta = {"generator": GENERATOR, "params": params,
            "rows": len(df), "sha256": hashlib.sha256(data).hexdigest(),
            "columns": list(df.columns),
            "meaning": "tokens = x.shape[0] seen by _forward_with_allreduce_fusion per forward step; "
                       "tokens_raw = before piecewise-bucket padding"}
    (d / f"{TRACE_NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return d / f"{TRACE_NAME}.csv"


def load_trace(name: str = "mixed", directory: Optional[Path] = None, *, verify: bool = True):
    """The stored trace; with ``verify`` it is regenerated from its stored parameters and must match byte for byte."""
    import pandas as pd

    d = Path(directory or TRACE_DIR)
    TRACE_NAME = TRACE_PREFIX + name
    meta = json.loads((d / f"{TRACE_NAME}.json").read_text())
    data = (d / f"{TRACE_NAME}.csv").read_bytes()
    if verify:
        regen = _csv_bytes(generate_trace(**meta["params"]))
        if regen != data or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise ValueError(f"{d / TRACE_NAME}.csv does not match generate_trace({meta['params']})")
    return pd.read_csv(io.BytesIO(data)), meta


def trace_tokens(name: str) -> list[int]:
    """``x.shape[0]`` per step of a named trace (regenerated from its parameters; cached)."""
    return list(_tokens(name))


@functools.lru_cache(maxsize=None)
def _tokens(name: str) -> tuple:
    return tuple(int(x) for x in generate_trace(**trace_params(name))["tokens"])


def calls_over(name: str, max_token_num: int) -> int:
    """How many calls of a trace carry more tokens than ``max_token_num`` (what the callee's assert refuses)."""
    return sum(t > max_token_num for t in _tokens(name))


def summary():
    """One row per stored trace, each regenerated from its stored parameters and compared byte for byte."""
    import pandas as pd

    rows = []
    for name in TRACES:
        tr, meta = load_trace(name)
        rows.append({"trace": name, "steps": meta["rows"], "sha256": meta["sha256"][:12] + "…",
                     **{f"{k} steps": v for k, v in tr.kind.value_counts().sort_index().items()},
                     "max x.shape[0]": int(tr.tokens.max()), "calls over 2048": int((tr.tokens > 2048).sum())})
    return pd.DataFrame(rows).set_index("trace").fillna(0)
