"""Your own traffic -> workspace re-creations per policy (``sglab workspace``, notebook 02's last
cell), from a CSV or an SGLang server log, or on a generated cold start (:func:`your_setup`)."""

from __future__ import annotations

import bisect
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from sglab.core import notebook, runs
from sglab.sglang.server_args import piecewise_cuda_graph_tokens
from sglab.workspace_floor import rebuild, traces
from sglab.workspace_floor.measure import EXPERIMENT, run_hidden
from sglab.workspace_floor.rebuild import MiB


LOG_LINES = (("Prefill", re.compile(r"Prefill batch\b.*?#new-token:\s*(\d+)"), "#new-token"),
             ("Decode", re.compile(r"Decode batch\b.*?#running-req:\s*(\d+)"), "#running-req"))


class TraceError(ValueError):
    """A trace file that cannot be read (the message names file, line and what was expected)."""


@dataclass
class Trace:
    tokens: list[int]
    kind: str  # "csv" | "log"
    source: str
    prefill_lines: int = 0
    decode_lines: int = 0


def read_trace(path, *, pcg_max_tokens: int = 4096) -> Trace:
    """The token count of every forward step, from a CSV or an SGLang server log."""
    path = Path(path)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
    if any("Prefill batch" in ln or "Decode batch" in ln for ln in lines):
        buckets = piecewise_cuda_graph_tokens(pcg_max_tokens) if pcg_max_tokens else []
        tokens, n = [], {"Prefill": 0, "Decode": 0}
        for i, ln in enumerate(lines, 1):
            for kind, rx, field in LOG_LINES:
                if f"{kind} batch" not in ln:
                    continue
                if not (m := rx.search(ln)):
                    raise TraceError(f"{path}:{i}: a '{kind} batch' line without '{field}: "
                                     f"<int>': {ln.strip()[:120]}")
                t, n[kind] = int(m.group(1)), n[kind] + 1
                j = bisect.bisect_left(buckets, t)
                if t > 0:
                    tokens.append(buckets[j] if kind == "Prefill" and j < len(buckets) else t)
                break
        return Trace(tokens, "log", str(path), n["Prefill"], n["Decode"])
    if any(re.search(r"\b(INFO|WARNING|ERROR)\b|\[\d{4}-\d\d-\d\d", ln) for ln in lines[:50]):
        raise TraceError(f"{path}: looks like a log but has no 'Prefill batch' or 'Decode batch' "
                         "line (expected SGLang scheduler lines such as 'Prefill batch, #new-seq: "
                         "1, #new-token: 512, ...'; is the server's log level below INFO?)")
    rows = list(csv.reader(lines))
    if not rows:
        raise TraceError(f"{path}: empty file (expected a 'tokens' column or one token count per "
                         "line)")
    header = [h.strip().lower() for h in rows[0]]
    if "tokens" in header:
        col, body, first = header.index("tokens"), rows[1:], 2
    elif len(header) == 1 and not header[0].isdigit():
        raise TraceError(f"{path}:1: header {rows[0][0]!r}: expected a column named 'tokens' (or "
                         "no header)")
    else:
        col, body, first = 0, rows, 1
    tokens = []
    for i, row in enumerate(body, first):
        if not "".join(row).strip():
            continue
        cell = row[col].strip() if col < len(row) else ""
        if not cell.isdigit() or int(cell) < 1:
            raise TraceError(f"{path}:{i}: expected a positive integer token count in column "
                             f"{col + 1}, got {cell!r}")
        tokens.append(int(cell))
    if not tokens:
        raise TraceError(f"{path}: no token counts found")
    return Trace(tokens, "csv", str(path))


def describe(trace: Trace) -> str:
    most = max(trace.tokens) if trace.tokens else 0
    if trace.kind == "csv":
        return f"{trace.source}: {len(trace.tokens)} forward steps (CSV), max {most} tokens"
    note = ("; decode lines are logged every --decode-log-interval steps, so decode-driven "
            "re-creations are a lower bound") if trace.decode_lines else ""
    return (f"{trace.source}: {trace.prefill_lines} prefill and {trace.decode_lines} decode lines "
            f"→ {len(trace.tokens)} forward steps, max {most} tokens{note}")


@dataclass
class CostModel:
    """Median creation + destruction ms against workspace bytes per rank, measured on GPUs."""

    points: list  # (bytes per rank, create + destroy ms), sorted by bytes
    label: str
    world_size: int = 0  # of the run the times come from

    def ms(self, nbytes: float) -> float:
        """Log-log interpolation between the measured points; the end segments extend beyond."""
        xs, ys = ([math.log(b) for b, _ in self.points], [math.log(m) for _, m in self.points])
        x = math.log(max(nbytes, 1.0))
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] != xs[i - 1] else 0.0
        return math.exp(ys[i - 1] + t * (ys[i] - ys[i - 1]))


def cost_model(world_size: int) -> Optional[CostModel]:
    """From the newest recorded run of this world size (else of the nearest one), or None."""
    if not (recorded := runs.load_all_recorded(EXPERIMENT)):
        return None
    run = max(recorded, key=lambda r:
              (-abs(r.manifest.tp - world_size), str(r.manifest.created_utc)))
    c = run.df[(run.df.variant == "cost_sweep") & (run.df.metric == "time_median")
               & run.df.phase.isin(["create", "destroy"])]
    if c.empty:
        return None
    per = c.groupby(["tokens", "phase"]).value.max().unstack("phase").sum(axis=1)  # slowest rank
    W, H = run.manifest.tp, run_hidden(run)
    points = sorted(
        (rebuild.workspace_bytes_per_rank(W, int(T), H), float(ms)) for T, ms in per.items())
    borrowed = (f"; NO recorded run at world size {world_size}: these are the ×{W} run's times "
                f"(a creation's cost grows with the world size)" if W != world_size else "")
    return CostModel(
        points, f"{run.path.name} ({run.manifest.gpu} ×{W}, {run.manifest.date}), interpolated by "
        f"workspace bytes{borrowed}", W)


def traffic_table(tokens: list[int], *, world_size: int, hidden_dim: int, policies=None,
                  pre_initialize: int = 0) -> pd.DataFrame:
    """Per policy: re-creations, refused calls, peak MiB/rank and estimated host-blocking ms."""
    model = cost_model(world_size)
    rows = []
    for pol in policies or rebuild.POLICIES:
        pol = rebuild.POLICIES[pol] if isinstance(pol, str) else pol
        mgr, refused = rebuild.simulate(pol, tokens, world_size=world_size, hidden_dim=hidden_dim,
                                        pre_initialize=pre_initialize or None)
        events = [e for e in mgr.events if e.step >= 0]
        est = sum(model.ms(e.bytes_per_rank) for e in events) if model else float("nan")
        rows.append({
            "policy": pol.label, "max_token_num": pol.call, "re-creations": len(events),
            "refused calls": refused, "peak MiB/rank": mgr.peak_bytes_per_rank / MiB, "est. ms": est
        })
    df = pd.DataFrame(rows).set_index("policy")
    if model:  # whose creation times the estimate uses (another world size's where none is here)
        df["times of"] = f"the ×{model.world_size} run" + (f" (none at ×{world_size})" if
                                                           model.world_size != world_size else "")
    df.attrs["cost_model"] = model.label if model else "no recorded GPU run: times not estimated"
    return df


def generated_trace(prompt_length: int, *, steps: int = 1500) -> list[int]:
    """``x.shape[0]`` per step of the ``short_ramp`` cold start, median prompt ``prompt_length``."""
    params = {**traces.TRACES["short_ramp"], "prompt_median": int(prompt_length), "steps": steps}
    return [int(t) for t in traces.generate_trace(**params).tokens]


def floor_table(floor: int, world_size: int, prompt_length: int, *,
                hidden_dim: int = 7168) -> pd.DataFrame:
    """``max(x.shape[0], floor)`` on a generated cold start, beside the draft, merged and before."""
    mine = rebuild.POLICIES.get(f"floor_{int(floor)}") or rebuild.floor_policy(int(floor))
    names = list(dict.fromkeys(["before_pr", "floor_0", mine.name, "floor_2048"]))
    return traffic_table(generated_trace(prompt_length), world_size=int(world_size),
                         hidden_dim=hidden_dim,
                         policies=[mine if n == mine.name else n for n in names]).round(1)


def your_setup(interactive: bool = False):
    """A floor, a world size and a prompt length -> re-creations, ms and MiB per policy."""
    choices = dict(floor=[0, 256, 512, 1024, 2048, 4096], world_size=[2, 4, 8],
                   prompt_length=[16, 48, 128, 512, 1200, 4096])
    static = [
        dict(floor=floor, world_size=world, prompt_length=prompt)
        for floor, world, prompt in ((2048, 4, 48), (512, 8, 48), (2048, 4, 1200))
    ]
    title = "Your traffic: workspace re-creations per policy on a generated cold start"
    return notebook.explore(floor_table, choices, static=static, title=title,
                            interactive=interactive)
