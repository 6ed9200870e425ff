"""Exact re-creation counts and workspace sizes over the full traces, on the fake creator (CPU, any machine).

The GPU replay must re-create at exactly these steps; the claims compare the two cell by cell, and the slide
draws the schedule from here (:func:`schedule`), so a reader without a GPU sees the same picture.
"""

from __future__ import annotations

import functools
from typing import Optional

from sglab.fixes import workspace_floor as wf

from sglab.experiments.workspace_floor.traces import trace_tokens

MiB = 2**20


def simulate_rows(params: Optional[dict] = None, *, world_sizes=None, scenarios=(0, 2048)) -> list[dict]:
    """Tidy rows per trace x world size x scenario (cold / pre-initialised) x policy: re-creations (trace calls
    that created), creations in all, peak MiB per rank, the final size, refused calls, and one
    ``event_workspace`` row per creation (its step and size). ``params`` default to the experiment's."""
    from sglab.experiments.workspace_floor import DEFAULT_PARAMS

    params = {**DEFAULT_PARAMS, **(params or {})}
    rows = []
    for tname in params["traces"]:
        for W in (world_sizes or [params["world_size"]]):
            for pre in scenarios:
                for name in params["policies"]:
                    rows += _policy_rows(tname, W, params["hidden_dim"], pre, name)
    return rows


def _policy_rows(tname: str, W: int, H: int, pre: int, name: str) -> list[dict]:
    mgr, refused = simulated(tname, name, W, H, pre)
    runtime_events = [e for e in mgr.events if e.step >= 0]
    base = {"variant": name, "trace": tname, "world_size": W, "scenario": "cold" if not pre else f"preinit_{pre}",
            "source": "simulated"}
    rows = [
        {**base, "metric": "recreations", "value": len(runtime_events), "unit": "count"},
        {**base, "metric": "creations_total", "value": mgr.recreations, "unit": "count"},
        {**base, "metric": "peak_workspace", "value": mgr.peak_bytes_per_rank / MiB, "unit": "MiB"},
        {**base, "metric": "final_max_token_num", "value": mgr.max_token_num or 0, "unit": "tokens"},
        {**base, "metric": "refused_calls", "value": refused, "unit": "count"},
    ]
    for e in mgr.events:
        rows.append({**base, "step": e.step, "tokens": e.max_token_num,
                     "metric": "event_workspace", "value": e.bytes_per_rank / MiB, "unit": "MiB"})
    return rows


@functools.lru_cache(maxsize=256)
def simulated(trace_name: str, policy: str, world_size: int, hidden_dim: int, pre_initialize: int = 0):
    """``(manager, refused)`` of one policy over one stored trace (cached: the claims ask for the same cells)."""
    return wf.simulate(wf.POLICIES[policy], trace_tokens(trace_name), world_size=world_size, hidden_dim=hidden_dim,
                       pre_initialize=pre_initialize or None)


def recreations(trace_name: str, policy: str, world_size: int, hidden_dim: int, pre_initialize: int = 0) -> int:
    """How many trace calls create a workspace (the pre-initialisation itself not counted)."""
    mgr, _ = simulated(trace_name, policy, world_size, hidden_dim, pre_initialize)
    return sum(e.step >= 0 for e in mgr.events)


def simulated_frame(world_sizes=(2, 4), params: Optional[dict] = None):
    """Tidy frame of :func:`simulate_rows` for both stored traces and the given world sizes."""
    from sglab.core import runs

    from sglab.experiments.workspace_floor import EXPERIMENT

    return runs.tidy(EXPERIMENT, simulate_rows(params, world_sizes=list(world_sizes)))


def schedule(trace_name: str, policies, *, world_size: int, hidden_dim: int):
    """One row per creation of each policy over a trace, cold start: ``policy, step, tokens, MiB, reason``."""
    import pandas as pd

    rows = []
    for name in policies:
        mgr, _ = simulated(trace_name, name, world_size, hidden_dim, 0)
        rows += [{"policy": name, "step": e.step, "tokens": e.max_token_num, "MiB": e.bytes_per_rank / MiB,
                  "reason": e.reason} for e in mgr.events]
    return pd.DataFrame(rows, columns=["policy", "step", "tokens", "MiB", "reason"])
