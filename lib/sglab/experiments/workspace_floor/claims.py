"""What every workspace_floor run must show, as executable claims (``sglab verify workspace_floor``).

The expected counts come from the simulation of this checkout's rebuild over the run's own trace, world size,
hidden size and pre-initialisation, never from numbers typed in here. Claims on the profiler trace cover method
version 2 on (runs with an ``events`` sidecar); claims that need 4 ranks say n/a on smaller runs.
"""

from __future__ import annotations

from sglab.workspace_floor.sglang import FIX

from sglab.core.claims import Claim, holds, not_applicable
from sglab.fixes import workspace_floor as wf

from sglab.experiments.workspace_floor import analysis
from sglab.experiments.workspace_floor.simulation import MiB, simulated
from sglab.experiments.workspace_floor.traces import calls_over, trace_tokens

EXPERIMENT = "workspace_floor"
GPUS = FIX.gpus

CLAIM = ("A 2048-token floor removes the allreduce-fusion workspace's warm-up re-creations below 2048 tokens (the "
         "manager only grows, so fluctuating batches alone do not re-create), at the cost of a workspace of at "
         "least 2048 tokens from the first call.")
SHAPE, FLOOR = "floor_0", "floor_2048"
SHORT, MIXED = "short_ramp", "mixed"
PEAK_SLACK_MIB = 2.0  # one caching-allocator segment: the int64 pointer table


# --------------------------------------------------------------------------------------------- reading a run
def _params(run) -> dict:
    return run.manifest.get("params", {}) or {}


def _gpu(run, metric: str):
    d = run.df
    return d[(d.source == "gpu") & (d.metric == metric) & d.variant.isin(wf.POLICIES)]


def _cells(run) -> list[tuple[str, str]]:
    p = _params(run)
    return [(t, n) for t in p.get("traces", []) for n in p.get("policies", [])]


def expected(run, trace: str, policy: str) -> dict:
    """The simulation of one (trace, policy) cell with this run's settings: re-creations, peak MiB, refused."""
    p = _params(run)
    W, H, pre = analysis.run_world_size(run), analysis.run_hidden(run), int(p.get("pre_initialize", 0) or 0)
    steps = int(p.get("gpu_trace_steps", 0) or 0)
    if steps:
        mgr, refused = wf.simulate(wf.POLICIES[policy], trace_tokens(trace)[:steps], world_size=W, hidden_dim=H,
                                   pre_initialize=pre or None)
    else:
        mgr, refused = simulated(trace, policy, W, H, pre)
    return {"recreations": sum(e.step >= 0 for e in mgr.events), "peak": mgr.peak_bytes_per_rank / MiB,
            "refused": refused}


def per_rank(run, metric: str, trace: str, policy: str) -> dict:
    """``{rank: value}`` of one GPU metric in one cell; a missing rank is simply absent."""
    d = _gpu(run, metric)
    d = d[(d.trace == trace) & (d.variant == policy)]
    return {int(r): float(v) for r, v in zip(d["rank"], d.value)}


def _compare_cells(run, metric: str, want) -> tuple[list[str], dict]:
    """Every (trace, policy) cell on every rank against ``want(trace, policy)``: (problems, value per cell)."""
    W = analysis.run_world_size(run)
    problems, value = [], {}
    for t, n in _cells(run):
        got, exp = per_rank(run, metric, t, n), want(t, n)
        value[f"{t}/{n}"] = exp
        missing = sorted(set(range(W)) - set(got))
        if missing:
            problems.append(f"{t}/{n}: no row for rank(s) {missing}")
        problems += [f"{t}/{n} rank {r}: {v:g} vs {exp:g}" for r, v in sorted(got.items()) if v != exp]
    return problems, value


def _slowest(run, metric: str, trace: str, policy: str) -> float:
    v = per_rank(run, metric, trace, policy)
    if not v:
        raise KeyError(f"no {metric} rows for {trace}/{policy}")
    return max(v.values())


def _needs(run, traces=(), policies=()) -> str | None:
    p = _params(run)
    if int(p.get("pre_initialize", 0) or 0):
        return "the run pre-initialises the workspace; these claims are about a cold start"
    miss = [t for t in traces if t not in p.get("traces", [])] + [n for n in policies if n not in p.get("policies", [])]
    return f"the run has no {', '.join(miss)}" if miss else None


# --------------------------------------------------------------------------------------------- checks
def _simulation_reproduced(run):
    d = run.df[(run.df.source == "simulated") & run.df.metric.isin(["recreations", "peak_workspace", "refused_calls"])]
    if d.empty:
        return holds(False, "no simulated rows", why_not="the run holds no simulation")
    p, bad = _params(run), []
    for r in d.itertuples():
        pre = 0 if r.scenario == "cold" else int(str(r.scenario).split("_")[-1])
        mgr, refused = simulated(r.trace, r.variant, int(r.world_size), int(p.get("hidden_dim", 7168)), pre)
        fresh = {"recreations": sum(e.step >= 0 for e in mgr.events), "peak_workspace": mgr.peak_bytes_per_rank / MiB,
                 "refused_calls": refused}[r.metric]
        if float(r.value) != float(fresh):
            bad.append(f"{r.trace}/{r.scenario}/{r.variant} {r.metric}: stored {r.value:g}, now {fresh:g}")
    return holds(not bad, f"{len(d)} stored values reproduced" if not bad else "; ".join(bad[:3]),
                 {"values": len(d), "differ": len(bad)})


def _counts_equal(run):
    problems, value = _compare_cells(run, "recreations", lambda t, n: expected(run, t, n)["recreations"])
    W = analysis.run_world_size(run)
    text = f"{len(value)} cells × {W} ranks equal" if not problems else "; ".join(problems[:3])
    return holds(bool(value) and not problems, text, {k: int(v) for k, v in value.items()})


def _short_cold_start(run):
    shape = per_rank(run, "recreations", SHORT, SHAPE)
    floor = per_rank(run, "recreations", SHORT, FLOOR)
    sim = expected(run, SHORT, SHAPE)["recreations"]
    ok = (set(floor.values()) == {1} and set(shape.values()) == {sim} and sim > 1
          and len(shape) == len(floor) == analysis.run_world_size(run))
    def said(v):
        return "/".join(f"{x:g}" for x in sorted(set(v.values()))) or "none"

    return holds(ok, f"x.shape[0] {said(shape)}× (simulation {sim}), floor 2048 {said(floor)}× on {len(floor)} ranks",
                 {"x.shape[0]": int(max(shape.values())), "floor 2048": int(max(floor.values()))})


def _floor_saves_time(run):
    value = {f"{t}/{n}": _slowest(run, "recreate_time_total", t, n) for t in (SHORT, MIXED) for n in (SHAPE, FLOOR)
             if (t, n) in _cells(run)}
    a, b = value[f"{SHORT}/{SHAPE}"], value[f"{SHORT}/{FLOOR}"]
    return holds(b < a, f"x.shape[0] {a:.1f} ms, floor 2048 {b:.1f} ms", value)


def _peak_memory(run):
    bad, extra = [], []
    for t, n in _cells(run):
        exp = expected(run, t, n)["peak"]
        comp, meas = per_rank(run, "peak_workspace", t, n), per_rank(run, "peak_workspace_measured", t, n)
        for r in sorted(comp):
            if comp[r] != exp:
                bad.append(f"{t}/{n} rank {r}: computed {comp[r]:g} MiB, simulation {exp:g}")
            x = meas.get(r, float("nan")) - comp[r]
            extra.append(x)
            if not 0 <= x <= PEAK_SLACK_MIB:
                bad.append(f"{t}/{n} rank {r}: measured - computed = {x:g} MiB")
    value = {k: _slowest(run, "peak_workspace", SHORT, n) for k, n in
             (("floor 2048 MiB", FLOOR), ("floor 512 MiB", "floor_512")) if (SHORT, n) in _cells(run)}
    value["extra max MiB"] = max(extra) if extra else None
    text = (f"measured - computed in [{min(extra):g}, {max(extra):g}] MiB over {len(extra)} cells×ranks"
            if extra and not bad else "; ".join(bad[:3]) or "no rows")
    return holds(bool(extra) and not bad, text, value)


def _back_to_baseline(run):
    d = run.df[(run.df.source == "gpu") & run.df.metric.isin(["mem_after_cleanup", "rank_mem_delta_cudart",
                                                              "rank_mem_delta_nvml", "rank_nvml_other_gpus_end"])]
    # (the traced pass's own check, variant traced_pass, is measured against a baseline inside the profiler)
    W = analysis.run_world_size(run)
    ranks = sorted(int(r) for r in d["rank"].dropna().unique())
    worst = float(d.value.abs().max()) if len(d) else float("nan")
    ok = len(d) > 0 and worst == 0 and ranks == list(range(W))
    return holds(ok, f"max {worst:g} MiB over {len(d)} readings, ranks {ranks}", {"max MiB": worst})


def _no_rank_left(run):
    d = run.df[run.df.metric.isin(["rank_processes_left", "gpu_mem_of_rank_pids_after"])].set_index("metric").value
    left, mib = float(d.get("rank_processes_left", float("nan"))), float(d.get("gpu_mem_of_rank_pids_after",
                                                                                float("nan")))
    return holds(left == 0 and mib == 0, f"{left:g} processes, {mib:g} MiB left",
                 {"processes": left, "MiB": mib})


def _before_pr_refuses(run):
    steps = int(_params(run).get("gpu_trace_steps", 0) or 0)

    def want(t, n):
        return float(calls_over(t, wf.CALLEE_DEFAULT_MAX_TOKEN_NUM) if not steps else
                     sum(x > wf.CALLEE_DEFAULT_MAX_TOKEN_NUM for x in trace_tokens(t)[:steps]))

    p = _params(run)
    problems, value = [], {}
    for t in p.get("traces", []):
        got, exp = per_rank(run, "refused_calls", t, "before_pr"), want(t, "before_pr")
        value[t] = int(exp)
        if set(got) != set(range(analysis.run_world_size(run))) or any(v != exp for v in got.values()):
            problems.append(f"{t}: {sorted(got.values())} vs {exp:g} calls over 2048")
    return holds(not problems, ", ".join(f"{t}: {v}" for t, v in value.items()) + " refused on every rank"
                 if not problems else "; ".join(problems), value)


def _tp4_workspace(run):
    meas = per_rank(run, "peak_workspace_measured", SHORT, FLOOR)
    comp = wf.workspace_bytes_per_rank(4, wf.PR_FLOOR, analysis.run_hidden(run)) / MiB
    ok = bool(meas) and all(comp <= v <= comp + PEAK_SLACK_MIB for v in meas.values())
    return holds(ok, f"computed {comp:g} MiB, measured {sorted(set(meas.values()))} MiB per rank",
                 {"computed MiB": comp, "measured MiB": max(meas.values()) if meas else None})


def _tp4_applies(run):
    if analysis.run_world_size(run) != 4:
        return f"needs a 4-rank run (this run has {analysis.run_world_size(run)})"
    if analysis.run_hidden(run) != 7168:
        return "the 450 MiB figure is for Kimi-K2.5's hidden size 7168"
    return _needs(run, (SHORT,), (FLOOR,))


from sglab.experiments.workspace_floor.trace_claims import TRACE_CLAIMS  # noqa: E402  (they use the helpers above)

CLAIMS = [
    Claim("workspace_floor.simulation_reproduced",
          "The simulation stored with the run equals the simulation of this checkout's rebuild",
          "every stored count, size and refusal equal (exact)", _simulation_reproduced),
    Claim("workspace_floor.gpu_counts_equal_simulation",
          "GPU re-creation counts equal the CPU simulation in every (trace, policy) cell, on every rank",
          "== simulation, every cell and rank (exact)", _counts_equal),
    Claim("workspace_floor.floor_recreates_once",
          "On the short-prompt cold start, max(x.shape[0], 2048) re-creates the workspace once and x.shape[0] "
          "re-creates it at every new maximum (the simulation's count), on every rank",
          "floor 2048: 1; x.shape[0]: == simulation, > 1 (exact)", _short_cold_start,
          applies=lambda r: _needs(r, (SHORT,), (SHAPE, FLOOR))),
    Claim("workspace_floor.floor_saves_recreation_time",
          "On the short-prompt cold start the floor spends less host-blocking time re-creating than x.shape[0] "
          "(slowest rank)", "floor 2048 < x.shape[0] (ms drift ±50%)", _floor_saves_time, drift=0.5,
          applies=lambda r: _needs(r, (SHORT,), (SHAPE, FLOOR))),
    Claim("workspace_floor.peak_memory_as_computed",
          "Each rank's measured peak (cudaMemGetInfo above its baseline) is FlashInfer's three aligned buffers "
          "for the simulated size, plus at most one 2 MiB allocator segment",
          f"0 <= measured - computed <= {PEAK_SLACK_MIB:g} MiB, computed == simulation", _peak_memory),
    Claim("workspace_floor.memory_back_to_baseline",
          "Every rank's device memory is back to its baseline after every policy and at the end (cudaMemGetInfo "
          "and NVML, own GPU and others)", "0 MiB on every rank (exact)", _back_to_baseline),
    Claim("workspace_floor.no_rank_left", "No rank process and none of their GPU memory is left once the run returns",
          "0 processes, 0 MiB (exact)", _no_rank_left),
    Claim("workspace_floor.before_pr_refuses_over_2048",
          "Before the PR every call over 2048 tokens trips the callee's assert: the refused count equals the "
          "trace's calls over 2048, on every rank", "== calls over 2048 in the trace (exact)", _before_pr_refuses,
          applies=lambda r: None if "before_pr" in _params(r).get("policies", []) else "the run has no before_pr"),
    Claim("workspace_floor.tp4_pr_workspace_450mib",
          "At TP 4 with Kimi-K2.5's hidden size the PR's 2048-token workspace takes 450 MiB per rank, measured",
          f"computed 450 MiB, measured within +{PEAK_SLACK_MIB:g} MiB", _tp4_workspace, applies=_tp4_applies),
    *TRACE_CLAIMS,
]


def shown(runs_: list) -> list:
    """The runs a reader sees: the newest per world size, smallest world first."""
    return list(analysis.newest_per_world(runs_).values())


def headline(runs_: list) -> str:
    """The numbers sentence (README index, slide): counts, ms and MiB per world size, from the claims' values."""
    from sglab.core import claims as engine
    from sglab.core.runs import gpu_short

    vals = [engine.values("workspace_floor", r) for r in runs_]

    def v(claim, key, fmt="{:.0f}"):
        out = []
        for x in vals:
            val = (x[f"workspace_floor.{claim}"].value or {}).get(key)
            out.append("?" if val is None else fmt.format(val))
        return "/".join(out)

    def n(claim, key):  # counts that agree across world sizes are said once
        return "/".join(sorted(set(v(claim, key).split("/")), key=str))

    gpus = ", ".join(sorted({gpu_short(r) for r in runs_}))
    ws = "/".join(str(analysis.run_world_size(r)) for r in runs_)
    c = "gpu_counts_equal_simulation"
    return (f"Cold start on short prompts ({gpus}, TP {ws}, ms on the slowest rank): `x.shape[0]` re-creates the "
            f"workspace {n(c, 'short_ramp/floor_0')}× ({v('floor_saves_recreation_time', 'short_ramp/floor_0')} ms), "
            f"`max(x.shape[0], 2048)` {n(c, 'short_ramp/floor_2048')}× "
            f"({v('floor_saves_recreation_time', 'short_ramp/floor_2048')} ms) at "
            f"{v('peak_memory_as_computed', 'floor 2048 MiB')} MiB/rank (floor 512: {n(c, 'short_ramp/floor_512')}×, "
            f"{v('peak_memory_as_computed', 'floor 512 MiB')} MiB). With 4096-token chunks both re-create "
            f"{n(c, 'mixed/floor_2048')}× ({v('floor_saves_recreation_time', 'mixed/floor_2048')} ms); before the "
            f"PR, the {n('before_pr_refuses_over_2048', 'mixed')} calls over 2048 tokens trip the callee's assert.")
