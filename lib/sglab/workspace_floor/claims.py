"""What every workspace_floor run must show (see :mod:`sglab.core.claims`): five claims a reader
checks, the instrument and cleanup checks folded under them.

The expected counts come from the simulation of this checkout's rebuild over the run's own trace,
world size, hidden size and pre-initialisation, never from numbers typed in here. Checks on the
profiler trace (a second, independent witness: one ``recreate workspace`` range per creation, the
creator's CUDA calls inside it) cover method version 2 on; the TP-4 claim says n/a on smaller runs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

from sglab.core import runs
from sglab.core.claims import Claim, Headline, holds
from sglab.workspace_floor import measure, rebuild, show
from sglab.workspace_floor.measure import COST_VARIANT, EXPERIMENT, GPUS  # noqa: F401 (interface)
from sglab.workspace_floor.rebuild import MiB
from sglab.workspace_floor.show import run_hidden, run_world_size


CLAIM = ("A 2048-token floor removes the allreduce-fusion workspace's warm-up re-creations below "
         "2048 tokens (the manager only grows, so fluctuating batches alone do not re-create), at "
         "the cost of a workspace of at least 2048 tokens from the first call.")
SHAPE, FLOOR = "floor_0", "floor_2048"
SHORT, MIXED = "short_ramp", "mixed"
PEAK_SLACK_MIB = 2.0  # one caching-allocator segment: the int64 pointer table
TRACE_METHODS = (2, None)


# --------------------------------------------------------------------------------------------------
# reading a run
# --------------------------------------------------------------------------------------------------
def _params(run) -> dict:
    return run.manifest.params


def _cells(run) -> list[tuple[str, str]]:
    p = _params(run)
    return [(t, n) for t in p.get("traces", []) for n in p.get("policies", [])]


def expected(run, trace: str, policy: str) -> dict:
    """The simulation of one (trace, policy) cell with this run's settings: re-creations, peak MiB,
    refused calls."""
    p = _params(run)
    W, H, pre = run_world_size(run), run_hidden(run), int(p.get("pre_initialize", 0) or 0)
    steps = int(p.get("gpu_trace_steps", 0) or 0)
    if steps:
        mgr, refused = rebuild.simulate(rebuild.POLICIES[policy],
                                        measure.trace_tokens(trace)[:steps], world_size=W,
                                        hidden_dim=H, pre_initialize=pre or None)
    else:
        mgr, refused = measure.simulated(trace, policy, W, H, pre)
    return {
        "recreations": sum(e.step >= 0 for e in mgr.events), "peak": mgr.peak_bytes_per_rank / MiB,
        "refused": refused
    }


def per_rank(run, metric: str, trace: str, policy: str) -> dict:
    """``{rank: value}`` of one GPU metric in one cell; a missing rank is simply absent."""
    d = run.df
    d = d[(d.source == "gpu") & (d.metric == metric) & (d.trace == trace) & (d.variant == policy)]
    return {int(r): float(v) for r, v in zip(d["rank"], d.value)}


def _slowest(run, metric: str, trace: str, policy: str) -> float:
    v = per_rank(run, metric, trace, policy)
    if not v:
        raise KeyError(f"no {metric} rows for {trace}/{policy}")
    return max(v.values())


def _needs(run, traces=(), policies=()) -> Optional[str]:
    p = _params(run)
    if int(p.get("pre_initialize", 0) or 0):
        return "the run pre-initialises the workspace; these claims are about a cold start"
    miss = ([t for t in traces if t not in p.get("traces", [])]
            + [n for n in policies if n not in p.get("policies", [])])
    return f"the run has no {', '.join(miss)}" if miss else None


def _events(run):
    ev = run.sidecar("events")
    if ev is None:
        raise LookupError("the run has no events sidecar")
    return ev


def _traced(run) -> Optional[str]:
    if _params(run).get("profile") is False:
        return "the run was recorded without the traced pass (profile=False)"
    if run.manifest.sidecars.get("events") is None:
        return "the run has no profiler events (recorded before traces)"
    return None


# --------------------------------------------------------------------------------------------------
# the re-creations
# --------------------------------------------------------------------------------------------------
def _short_cold_start(run):
    shape, floor = per_rank(run, "recreations", SHORT,
                            SHAPE), per_rank(run, "recreations", SHORT, FLOOR)
    sim = expected(run, SHORT, SHAPE)["recreations"]
    ok = (set(floor.values()) == {1} and set(shape.values()) == {sim} and sim > 1
          and len(shape) == len(floor) == run_world_size(run))

    def said(v):
        return "/".join(f"{x:g}" for x in sorted(set(v.values()))) or "none"

    return holds(
        ok, f"x.shape[0] {said(shape)}× (simulation {sim}), floor 2048 {said(floor)}× on "
        f"{len(floor)} ranks",
        {"x.shape[0]": int(max(shape.values())), "floor 2048": int(max(floor.values()))})


def _simulation_reproduced(run):
    d = run.df[(run.df.source == "simulated")
               & run.df.metric.isin(["recreations", "peak_workspace", "refused_calls"])]
    if d.empty:
        return holds(False, "no simulated rows", why_not="the run holds no simulation")
    bad = []
    for r in d.itertuples():
        pre = 0 if r.scenario == "cold" else int(str(r.scenario).split("_")[-1])
        mgr, refused = measure.simulated(r.trace, r.variant, int(r.world_size), run_hidden(run),
                                         pre)
        fresh = {
            "recreations": sum(e.step >= 0 for e in mgr.events),
            "peak_workspace": mgr.peak_bytes_per_rank / MiB, "refused_calls": refused
        }[r.metric]
        if float(r.value) != float(fresh):
            bad.append(f"{r.trace}/{r.scenario}/{r.variant} {r.metric}: stored {r.value:g}, now "
                       f"{fresh:g}")
    return holds(not bad, "; ".join(bad[:3]) or f"{len(d)} stored values reproduced",
                 {"values": len(d), "differ": len(bad)})


def _counts_equal(run):
    W, problems, value = run_world_size(run), [], {}
    for t, n in _cells(run):
        got, exp = per_rank(run, "recreations", t, n), expected(run, t, n)["recreations"]
        value[f"{t}/{n}"] = int(exp)
        missing = sorted(set(range(W)) - set(got))
        if missing:
            problems.append(f"{t}/{n}: no row for rank(s) {missing}")
        problems += [
            f"{t}/{n} rank {r}: {v:g} vs {exp:g}" for r, v in sorted(got.items()) if v != exp
        ]
    return holds(
        bool(value) and not problems, "; ".join(problems[:3])
        or f"{len(value)} cells × {W} ranks equal", value)


def _ranges_equal_simulation(run):
    W, ev = run_world_size(run), _events(run)
    trace, policies = _params(run).get("profile_trace",
                                       SHORT), _params(run).get("profile_policies", [])
    r = show.creation_ranges(ev)
    got = r[r.variant != COST_VARIANT].groupby(["variant", "rank"]).size()
    problems, value = [], {}
    for n in policies:
        value[n] = sim = measure.recreations(trace, n, W, run_hidden(run))  # whole trace, cold
        problems += [
            f"{n} rank {rank}: {int(got.get((n, rank), 0))} ranges vs {sim}"
            for rank in range(W) if int(got.get((n, rank), 0)) != sim
        ]
    text = (", ".join(f"{n}: {v} range{'s' if v != 1 else ''}" for n, v in value.items())
            + f" on each of {W} ranks")
    return holds(bool(value) and not problems, "; ".join(problems[:3]) or text, value)


def _ipc_calls(run):
    W, t = run_world_size(run), show.ipc_calls_per_creation(_events(run))
    want = {"ipc get handle": 3, "ipc open": 3 * (W - 1)}
    bad = [
        f"{k}: {dict(zip(want, row))}"
        for k, row in zip(t.index,
                          t.reindex(columns=list(want), fill_value=0).itertuples(
                              index=False)) if tuple(row) != tuple(want.values())
    ]
    text = (f"{len(bad)} of {len(t)} creations differ, e.g. {bad[0]}" if bad else
            f"{len(t)} traced creations (all ranks): each 3 handle exports, {3 * (W - 1)} opens")
    return holds(len(t) > 0 and not bad, text, {"creations": len(t), "differ": len(bad)})


# --------------------------------------------------------------------------------------------------
# the time
# --------------------------------------------------------------------------------------------------
def _floor_saves_time(run):
    value = {
        f"{t}/{n}": _slowest(run, "recreate_time_total", t, n)
        for t in (SHORT, MIXED)
        for n in (SHAPE, FLOOR) if (t, n) in _cells(run)
    }
    a, b = value[f"{SHORT}/{SHAPE}"], value[f"{SHORT}/{FLOOR}"]
    return holds(b < a, f"x.shape[0] {a:.1f} ms, floor 2048 {b:.1f} ms", value)


def _time_in_recreation(run):
    t = show.trace_recreation_table(_events(run))
    shape, floor = float(t.loc[SHAPE, "total_ms"]), float(t.loc[FLOOR, "total_ms"])
    return holds(
        floor < shape, f"x.shape[0] {shape:.1f} ms, floor 2048 {floor:.1f} ms in "
        "'recreate workspace' (slowest rank)", {"floor_0 ms": shape, "floor_2048 ms": floor})


def _both_profiled(run) -> Optional[str]:
    if _traced(run):
        return _traced(run)
    return (None if {SHAPE, FLOOR} <= set(_params(run).get("profile_policies", [])) else
            "the traced pass lacks floor_0 or floor_2048")


# --------------------------------------------------------------------------------------------------
# the memory
# --------------------------------------------------------------------------------------------------
def _peak_memory(run):
    bad, extra = [], []
    for t, n in _cells(run):
        exp = expected(run, t, n)["peak"]
        comp, meas = per_rank(run, "peak_workspace", t, n), per_rank(run, "peak_workspace_measured",
                                                                     t, n)
        for r in sorted(comp):
            if comp[r] != exp:
                bad.append(f"{t}/{n} rank {r}: computed {comp[r]:g} MiB, simulation {exp:g}")
            extra.append(meas.get(r, float("nan")) - comp[r])
            if not 0 <= extra[-1] <= PEAK_SLACK_MIB:
                bad.append(f"{t}/{n} rank {r}: measured - computed = {extra[-1]:g} MiB")
    value = {
        k: _slowest(run, "peak_workspace", SHORT, n)
        for k, n in (("floor 2048 MiB", FLOOR), ("floor 512 MiB",
                                                 "floor_512")) if (SHORT, n) in _cells(run)
    }
    value["extra max MiB"] = max(extra) if extra else None
    text = (f"measured - computed in [{min(extra):g}, {max(extra):g}] MiB over {len(extra)} "
            "cells×ranks" if extra and not bad else "; ".join(bad[:3]) or "no rows")
    return holds(bool(extra) and not bad, text, value)


def _back_to_baseline(run):
    # (the traced pass's own check, variant traced_pass, is against a baseline inside the profiler)
    d = run.df[(run.df.source == "gpu")
               & run.df.metric.isin([
                   "mem_after_cleanup", "rank_mem_delta_cudart", "rank_mem_delta_nvml",
                   "rank_nvml_other_gpus_end"
               ])]
    ranks = sorted(int(r) for r in d["rank"].dropna().unique())
    worst = float(d.value.abs().max()) if len(d) else float("nan")
    ok = len(d) > 0 and worst == 0 and ranks == list(range(run_world_size(run)))
    return holds(ok, f"max {worst:g} MiB over {len(d)} readings, ranks {ranks}", {"max MiB": worst})


def _no_rank_left(run):
    d = run.df[run.df.metric.isin(["rank_processes_left", "gpu_mem_of_rank_pids_after"])]
    d = d.set_index("metric").value
    left = float(d.get("rank_processes_left", float("nan")))
    mib = float(d.get("gpu_mem_of_rank_pids_after", float("nan")))
    return holds(left == 0 and mib == 0, f"{left:g} processes, {mib:g} MiB left",
                 {"processes": left, "MiB": mib})


def _tp4_workspace(run):
    meas = per_rank(run, "peak_workspace_measured", SHORT, FLOOR)
    comp = rebuild.workspace_bytes_per_rank(4, rebuild.PR_FLOOR, run_hidden(run)) / MiB
    ok = bool(meas) and all(comp <= v <= comp + PEAK_SLACK_MIB for v in meas.values())
    return holds(ok, f"computed {comp:g} MiB, measured {sorted(set(meas.values()))} MiB per rank",
                 {"computed MiB": comp, "measured MiB": max(meas.values()) if meas else None})


def _tp4_applies(run) -> Optional[str]:
    if run_world_size(run) != 4:
        return f"needs a 4-rank run (this run has {run_world_size(run)})"
    if run_hidden(run) != 7168:
        return "the 450 MiB figure is for Kimi-K2.5's hidden size 7168"
    return _needs(run, (SHORT,), (FLOOR,))


# --------------------------------------------------------------------------------------------------
# before the PR
# --------------------------------------------------------------------------------------------------
def _before_pr_refuses(run):
    steps, W = int(_params(run).get("gpu_trace_steps", 0) or 0), run_world_size(run)
    problems, value = [], {}
    for t in _params(run).get("traces", []):
        over = sum(x > rebuild.CALLEE_DEFAULT_MAX_TOKEN_NUM
                   for x in measure.trace_tokens(t)[:steps or None])
        got, value[t] = per_rank(run, "refused_calls", t, "before_pr"), over
        if set(got) != set(range(W)) or any(v != over for v in got.values()):
            problems.append(f"{t}: {sorted(got.values())} vs {over} calls over 2048")
    text = ", ".join(f"{t}: {v}" for t, v in value.items()) + " refused on every rank"
    return holds(not problems, "; ".join(problems) or text, value)


CLAIMS = [
    Claim(
        "workspace_floor.floor_recreates_once",
        "On the short-prompt cold start, max(x.shape[0], 2048) re-creates the workspace once and "
        "x.shape[0] re-creates it at every new maximum (the simulation's count), on every rank",
        "floor 2048: 1; x.shape[0]: == simulation, > 1 (exact)", _short_cold_start,
        applies=lambda r: _needs(r, (SHORT,), (SHAPE, FLOOR)),
        folded=(Claim(
            "workspace_floor.simulation_reproduced",
            "The simulation stored with the run equals the simulation of this "
            "checkout's rebuild", "every stored count, size and refusal equal (exact)",
            _simulation_reproduced),
                Claim(
                    "workspace_floor.gpu_counts_equal_simulation",
                    "GPU re-creation counts equal the CPU simulation in every (trace, policy) "
                    "cell, on every rank", "== simulation, every cell and rank (exact)",
                    _counts_equal),
                Claim(
                    "workspace_floor.trace_ranges_equal_simulation",
                    "In the profiler trace every rank shows one 'recreate workspace' range per "
                    "re-creation the simulation predicts, for each profiled policy",
                    "== simulation per policy and rank (exact)", _ranges_equal_simulation,
                    methods=TRACE_METHODS, applies=_traced),
                Claim(
                    "workspace_floor.trace_ipc_calls_per_creation",
                    "Every traced creation exports 3 CUDA IPC handles and opens 3·(W-1), one "
                    "per buffer and peer", "3 exports, 3(W-1) opens per creation and rank "
                    "(exact)", _ipc_calls, methods=TRACE_METHODS, applies=_traced))),
    Claim(
        "workspace_floor.floor_saves_recreation_time",
        "On the short-prompt cold start the floor spends less host-blocking time re-creating "
        "than x.shape[0] (slowest rank)", "floor 2048 < x.shape[0] (ms drift ±50%)",
        _floor_saves_time, drift=0.5, applies=lambda r: _needs(r, (SHORT,), (SHAPE, FLOOR)),
        folded=(Claim(
            "workspace_floor.trace_time_in_recreation",
            "Time in 'recreate workspace' ranges, read from the trace: the floor "
            "spends less than x.shape[0] (slowest rank)", "floor 2048 < x.shape[0] (ms drift ±50%)",
            _time_in_recreation, methods=TRACE_METHODS, applies=_both_profiled, drift=0.5),)),
    Claim(
        "workspace_floor.peak_memory_as_computed",
        "Each rank's measured peak (cudaMemGetInfo above its baseline) is FlashInfer's three "
        "aligned buffers for the simulated size, plus at most one 2 MiB allocator segment",
        f"0 <= measured - computed <= {PEAK_SLACK_MIB:g} MiB, computed == simulation", _peak_memory,
        folded=(Claim(
            "workspace_floor.memory_back_to_baseline",
            "Every rank's device memory is back to its baseline after every policy and "
            "at the end (cudaMemGetInfo and NVML, own GPU and others)",
            "0 MiB on every rank (exact)", _back_to_baseline),
                Claim(
                    "workspace_floor.no_rank_left",
                    "No rank process and none of their GPU memory is left once the run "
                    "returns", "0 processes, 0 MiB (exact)", _no_rank_left))),
    Claim(
        "workspace_floor.tp4_pr_workspace_450mib",
        "At TP 4 with Kimi-K2.5's hidden size the PR's 2048-token workspace takes 450 MiB per "
        "rank, measured", f"computed 450 MiB, measured within +{PEAK_SLACK_MIB:g} MiB",
        _tp4_workspace, applies=_tp4_applies),
    Claim(
        "workspace_floor.before_pr_refuses_over_2048",
        "Before the PR every call over 2048 tokens trips the callee's assert: the refused count "
        "equals the trace's calls over 2048, on every rank",
        "== calls over 2048 in the trace (exact)", _before_pr_refuses, applies=lambda r: None
        if "before_pr" in _params(r).get("policies", []) else "the run has no before_pr"),
]


def shown(runs_: list) -> list:
    """The runs a reader sees: the newest per world size, smallest world first."""
    best = runs.newest_by(runs_, run_world_size)
    return [best[k] for k in sorted(best)]


_C, _T, _P, _R = (f"workspace_floor.{c}"
                  for c in ("gpu_counts_equal_simulation", "floor_saves_recreation_time",
                            "peak_memory_as_computed", "before_pr_refuses_over_2048"))


def _span(claim: str, key: str, unit: str) -> str:
    """``lo–hi unit`` of one value over the runs shown (one world size each)."""
    return f"{{lo[{claim}][{key}]:.0f}}–{{hi[{claim}][{key}]:.0f}} {unit}"


HEADLINE = Headline(
    parts=(f"Cold start on short prompts ({{runs}}; ms on the slowest rank): `x.shape[0]` "
           f"re-creates the workspace {{v[{_C}][short_ramp/floor_0]}}× "
           f"({_span(_T, 'short_ramp/floor_0', 'ms')}), `max(x.shape[0], 2048)` "
           f"{{v[{_C}][short_ramp/floor_2048]}}× ({_span(_T, 'short_ramp/floor_2048', 'ms')}) at "
           f"{_span(_P, 'floor 2048 MiB', 'MiB/rank')} (floor 512: "
           f"{{v[{_C}][short_ramp/floor_512]}}×, {_span(_P, 'floor 512 MiB', 'MiB')}).",
           f"With 4096-token chunks both re-create {{v[{_C}][mixed/floor_2048]}}× "
           f"({_span(_T, 'mixed/floor_2048', 'ms')}); before the PR, the {{v[{_R}][mixed]}} "
           "calls over 2048 tokens trip the callee's assert."), per_run="{gpu} TP {world}", sep=" ",
    run_sep=", ")


# --------------------------------------------------------------------------------------------------
# the real engine (``scripts/engine_gpu.sh --plan 02``: data/recorded/engine_workspace_floor/)
# --------------------------------------------------------------------------------------------------
def _engine_applies(run):
    return None if show.engine_facts(run) else "no engine variant with the workspace trace started"


def _engine_equal(run):
    facts = show.engine_facts(run)
    good = [
        f for f in facts
        if f["per_rank"] and set(f["managers"].values()) == {rebuild.ENGINE_MANAGERS} and all(
            n == f["sim"] * f["managers"][r] for r, n in f["per_rank"].items())
        and f["sizes"] == f["sim_sizes"] and len(f["per_rank"]) == f["world"]
    ]
    value = {f["variant"]: f"{max(f['per_rank'].values())}/rank" for f in facts}
    value.update({f"{f['variant']} sim": f["sim"] for f in facts})
    return holds(
        len(good) == len(facts),
        "; ".join(f"{f['variant']} ({f['policy']}): {max(f['per_rank'].values())} per "
                  f"rank = {f['managers'][0]} managers × {f['sim']} simulated, at "
                  f"{'/'.join(map(str, f['sizes']))}" for f in facts), value,
        why_not="; ".join(f"{f['variant']}: per rank {f['per_rank']}, managers "
                          f"{f['managers']}, sizes {f['sizes']}, simulated {f['sim']} at "
                          f"{f['sim_sizes']}" for f in facts if f not in good))


def _engine_none_per_step(run):
    facts = show.engine_facts(run)
    n = sum(f["in_calls"] for f in facts)
    return holds(
        n == 0, f"{n} creations during {sum(f['calls'] for f in facts)} generate calls "
        f"({len(facts)} variants)", {"in_calls": n, "calls": sum(f["calls"] for f in facts)})


ENGINE = SimpleNamespace(
    EXPERIMENT="engine_workspace_floor",
    CLAIM="In SGLang's own engine (DeepSeek-style tiny model, dummy weights, TP 2 and 4, "
    "--enable-flashinfer-allreduce-fusion), each rank creates its two workspaces once, at "
    "2048 tokens before graph capture, with or without the floor: the rebuild's simulation "
    "of the same trace with that pre-initialisation says the same.",
    CLAIMS=[
        Claim(
            "engine_workspace_floor.creations_equal_simulation",
            "Per rank, the engine creates each of its two workspaces (attention TP, MoE TP) as "
            "often and at the sizes the rebuild's simulation of the same trace gives, for the "
            "release without the floor, the release with it, and the floor replaced by x.shape[0]",
            "creations per rank == 2 managers × simulated; sizes == simulated (exact)",
            _engine_equal, applies=_engine_applies),
        Claim(
            "engine_workspace_floor.no_creation_per_forward_step",
            "No workspace is created during a forward step of the short-prompt trace (the "
            "timed generate calls, prompts of 4 to 3000 tokens)",
            "== 0 creations inside the calls (exact)", _engine_none_per_step,
            applies=_engine_applies, context=("calls",))
    ],
    shown=lambda runs_: list(runs_),
)
