"""Your traffic: how many allreduce-fusion workspace re-creations would it cause, per ``max_token_num`` policy?

``sglab workspace --trace FILE`` reads the token count of every forward step — a CSV (a ``tokens`` column, or one
number per line), or the "Prefill batch" / "Decode batch" lines of an SGLang server log — and replays it through
the PR-era manager (:func:`sglab.fixes.workspace_floor.simulate`, exact, no GPU). For each policy it reports the
re-creations, the peak workspace per rank (FlashInfer's sizes, exact) and an estimate of the host-blocking time,
from the creation cost measured on GPUs in the newest recorded ``workspace_floor`` run (interpolated by workspace
bytes; the run is named in the output).

What a log can and cannot tell: a prefill line gives the batch's new tokens (``#new-token``), padded here to the
piecewise-CUDA-graph bucket the runner would replay (``--pcg-max-tokens``, 0 = no padding); a decode line gives
``#running-req`` (one token per request). SGLang logs decode statistics only every ``--decode-log-interval`` steps
(40 by default), so decode sizes between two logged lines are unseen: re-creations driven by decode growth are a
lower bound. Prefill lines are logged for every prefill batch.
"""

from __future__ import annotations

import bisect
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from sglab.fixes import workspace_floor as wf

PREFILL = re.compile(r"Prefill batch\b.*?#new-token:\s*(\d+)")
DECODE = re.compile(r"Decode batch\b.*?#running-req:\s*(\d+)")
MiB = 2**20


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file, the line and what was expected."""


@dataclass
class Trace:
    tokens: list[int]
    kind: str  # "csv" | "log"
    source: str
    prefill_lines: int = 0
    decode_lines: int = 0


def pcg_buckets(max_tokens: int) -> list[int]:
    """The piecewise-CUDA-graph token buckets up to ``max_tokens`` (ServerArgs' default list)."""
    from sglab.capture_sizes.rebuild import default_piecewise_capture_sizes

    return default_piecewise_capture_sizes(max_tokens)


def _pad(tokens: int, buckets: list[int]) -> int:
    i = bisect.bisect_left(buckets, tokens)
    return buckets[i] if i < len(buckets) else tokens


def read_trace(path: str | Path, *, pcg_max_tokens: int = 4096) -> Trace:
    """A trace from a CSV or an SGLang server log (decided by content: any "Prefill batch" / "Decode batch" line
    makes it a log)."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
    lines = text.splitlines()
    if any("Prefill batch" in ln or "Decode batch" in ln for ln in lines):
        return _from_log(path, lines, pcg_max_tokens)
    if any(re.search(r"\b(INFO|WARNING|ERROR)\b|\[\d{4}-\d\d-\d\d", ln) for ln in lines[:50]):
        raise TraceError(f"{path}: looks like a log but has no 'Prefill batch' or 'Decode batch' line (expected "
                         "SGLang scheduler lines such as 'Prefill batch, #new-seq: 1, #new-token: 512, ...'; is "
                         "the server's log level below INFO?)")
    return _from_csv(path, lines)


def _from_log(path: Path, lines: list[str], pcg_max_tokens: int) -> Trace:
    buckets = pcg_buckets(pcg_max_tokens) if pcg_max_tokens else []
    tokens, n_pre, n_dec = [], 0, 0
    for i, ln in enumerate(lines, 1):
        if "Prefill batch" in ln:
            m = PREFILL.search(ln)
            if not m:
                raise TraceError(f"{path}:{i}: a 'Prefill batch' line without '#new-token: <int>': {ln.strip()[:120]}")
            n = int(m.group(1))
            if n > 0:
                tokens.append(_pad(n, buckets) if buckets else n)
            n_pre += 1
        elif "Decode batch" in ln:
            m = DECODE.search(ln)
            if not m:
                raise TraceError(f"{path}:{i}: a 'Decode batch' line without '#running-req: <int>': {ln.strip()[:120]}")
            n = int(m.group(1))
            if n > 0:
                tokens.append(n)
            n_dec += 1
    return Trace(tokens, "log", str(path), n_pre, n_dec)


def _from_csv(path: Path, lines: list[str]) -> Trace:
    rows = list(csv.reader(lines))
    if not rows:
        raise TraceError(f"{path}: empty file (expected a 'tokens' column or one token count per line)")
    header = [h.strip().lower() for h in rows[0]]
    if "tokens" in header:
        col, body, first = header.index("tokens"), rows[1:], 2
    elif len(header) == 1 and not header[0].isdigit():
        raise TraceError(f"{path}:1: header {rows[0][0]!r}: expected a column named 'tokens' (or no header)")
    else:
        col, body, first = 0, rows, 1
    tokens = []
    for i, row in enumerate(body, first):
        if not row or not "".join(row).strip():
            continue
        cell = row[col].strip() if col < len(row) else ""
        if not cell.isdigit() or int(cell) < 1:
            raise TraceError(f"{path}:{i}: expected a positive integer token count in column {col + 1}, got {cell!r}")
        tokens.append(int(cell))
    if not tokens:
        raise TraceError(f"{path}: no token counts found")
    return Trace(tokens, "csv", str(path))


# --------------------------------------------------------------------------------------------------------------
# creation cost, from the recorded GPU runs
# --------------------------------------------------------------------------------------------------------------
@dataclass
class CostModel:
    """Median creation + destruction ms against workspace bytes per rank, measured on GPUs (one recorded run)."""

    points: list[tuple[float, float]]  # (bytes per rank, create + destroy ms), sorted by bytes
    label: str

    def ms(self, nbytes: float) -> float:
        """Log-log interpolation between measured points; the end segments extend beyond them."""
        xs = [math.log(b) for b, _ in self.points]
        ys = [math.log(m) for _, m in self.points]
        x = math.log(max(nbytes, 1.0))
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] != xs[i - 1] else 0.0
        return math.exp(ys[i - 1] + t * (ys[i] - ys[i - 1]))


def cost_model(world_size: int) -> CostModel | None:
    """From the newest recorded workspace_floor run of this world size (else the nearest one), or None."""
    from sglab.core import runs

    recorded = runs.load_all_recorded("workspace_floor")
    if not recorded:
        return None
    ws = lambda r: int(r.manifest.get("params", {}).get("world_size", 0))  # noqa: E731
    recorded.sort(key=lambda r: (abs(ws(r) - world_size), str(r.manifest.get("created_utc", ""))), reverse=False)
    best = min(abs(ws(r) - world_size) for r in recorded)
    run = [r for r in recorded if abs(ws(r) - world_size) == best][-1]
    d = run.df
    c = d[(d.variant == "cost_sweep") & (d.metric == "time_median") & d.phase.isin(["create", "destroy"])]
    if c.empty:
        return None
    per = c.groupby(["tokens", "phase"]).value.max().unstack("phase").sum(axis=1)  # slowest rank
    H, W = int(run.manifest["params"]["hidden_dim"]), ws(run)
    points = sorted((wf.workspace_bytes_per_rank(W, int(T), H), float(ms)) for T, ms in per.items())
    label = (f"{run.path.name} ({runs.gpu_short(run.manifest)} ×{W}, {str(run.manifest.get('created_utc'))[:10]}), "
             "interpolated by workspace bytes")
    return CostModel(points, label)


# --------------------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------------------
def simulate(tokens: list[int], *, world_size: int, hidden_dim: int, policies=None, pre_initialize: int = 0):
    """One row per policy (names of ``wf.POLICIES`` or :class:`~sglab.fixes.workspace_floor.Policy` objects):
    re-creations, refused calls, peak workspace MiB/rank, estimated ms (slowest rank)."""
    import pandas as pd

    model = cost_model(world_size)
    rows = []
    for pol in policies or list(wf.POLICIES):
        pol = wf.POLICIES[pol] if isinstance(pol, str) else pol
        name = pol.name
        mgr, refused = wf.simulate(pol, tokens, world_size=world_size, hidden_dim=hidden_dim,
                                   pre_initialize=pre_initialize or None)
        events = [e for e in mgr.events if e.step >= 0]
        est = sum(model.ms(e.bytes_per_rank) for e in events) if model else float("nan")
        rows.append({"policy": name, "what": pol.label, "re-creations": len(events), "refused calls": refused,
                     "peak MiB/rank": mgr.peak_bytes_per_rank / MiB, "est. ms": est})
    df = pd.DataFrame(rows).set_index("policy")
    df.attrs["cost_model"] = model.label if model else "no recorded GPU run: times not estimated"
    return df


def generated_trace(prompt_length: int, *, steps: int = 1500) -> list[int]:
    """``x.shape[0]`` per forward step of a cold server warming up (the stored ``short_ramp`` scenario of
    :mod:`sglab.experiments.workspace_floor.traces`: arrivals ramping up over 1500 steps) with a median prompt of
    ``prompt_length`` tokens."""
    from sglab.experiments.workspace_floor import traces

    params = {**traces.TRACES["short_ramp"], "prompt_median": int(prompt_length), "steps": int(steps)}
    return [int(t) for t in traces.generate_trace(**params).tokens]


def floor_table(floor: int, world_size: int, prompt_length: int, *, hidden_dim: int = 7168):
    """The notebook's question as a table: on a generated cold start with prompts of ``prompt_length`` tokens, what
    a ``max(x.shape[0], floor)`` policy costs next to no floor, the PR's 2048 and the call before the PR."""
    floor = int(floor)
    mine = wf.POLICIES.get(f"floor_{floor}") or wf.Policy(f"floor_{floor}", floor, label=f"max(x.shape[0], {floor})")
    policies = list(dict.fromkeys(["before_pr", "floor_0", mine.name, "floor_2048"]))
    pols = [mine if n == mine.name else wf.POLICIES[n] for n in policies]
    tokens = generated_trace(prompt_length)
    df = simulate(tokens, world_size=int(world_size), hidden_dim=hidden_dim, policies=pols)
    df = df.round(1)
    df.attrs["trace"] = f"{len(tokens)} forward steps, max {max(tokens)} tokens"
    return df


def describe(trace: Trace) -> str:
    if trace.kind == "csv":
        return f"{trace.source}: {len(trace.tokens)} forward steps (CSV), max {max(trace.tokens)} tokens"
    note = ""
    if trace.decode_lines:
        note = ("; decode lines are logged every --decode-log-interval steps, so decode-driven re-creations are a "
                "lower bound")
    return (f"{trace.source}: {trace.prefill_lines} prefill and {trace.decode_lines} decode lines → "
            f"{len(trace.tokens)} forward steps, max {max(trace.tokens) if trace.tokens else 0} tokens{note}")


# --------------------------------------------------------------------------------------------------------------
# the shipped example: a server log written from the workbook's stored cold-start trace
# --------------------------------------------------------------------------------------------------------------
EXAMPLE_LOG = Path(__file__).resolve().parents[3] / "data" / "examples" / "sglang_server_short_prompts.log"


def example_log_lines(steps: int = 1500, decode_log_interval: int = 40) -> list[str]:
    """Scheduler lines in SGLang's format for the first ``steps`` forward steps of the stored ``short_ramp`` trace
    (data/traces/): every prefill batch, and every ``decode_log_interval``-th decode step, as a server logs them."""
    import pandas as pd

    trace = pd.read_csv(Path(__file__).resolve().parents[3] / "data" / "traces" / "workspace_floor_short_ramp.csv")
    lines, decodes = [], 0
    for r in trace.head(steps).itertuples():
        ts = f"[2026-11-20 10:{r.step // 60:02d}:{r.step % 60:02d}]"
        if r.kind != "decode":
            lines.append(f"{ts} Prefill batch, #new-seq: 1, #new-token: {r.tokens_raw}, #cached-token: 0, "
                         f"token usage: 0.01, #running-req: {r.running}, #queue-req: {r.waiting}, ")
        else:
            decodes += 1
            if decodes % decode_log_interval == 0:
                lines.append(f"{ts} Decode batch, #running-req: {r.tokens_raw}, #token: {r.tokens_raw * 64}, "
                             f"token usage: 0.01, cuda graph: True, gen throughput (token/s): 0.00, "
                             f"#queue-req: {r.waiting}, ")
    return lines
