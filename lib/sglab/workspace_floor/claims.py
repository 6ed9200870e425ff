"""What every workspace_floor run must show (:mod:`sglab.core.claims`): five claims, the checks
folded under them, the headline, the review card and the real engine's claims (``ENGINE``)."""

from __future__ import annotations

from typing import Optional

from sglab.core import runs, text
from sglab.core.card import Card
from sglab.core.claims import Claim, Headline, engine_claims, holds
from sglab.workspace_floor import rebuild, sglang, show, traces
from sglab.workspace_floor.measure import COST_VARIANT, EXPERIMENT, GPUS, run_hidden  # noqa: F401
from sglab.workspace_floor.rebuild import MiB, label


CLAIM = (
    "On a cold start (no pre-initialisation) the merged floor, `max(x.shape[0], 2048)`, creates "
    "the allreduce-fusion workspace once where the PR's first draft, `x.shape[0]`, re-creates it "
    "at every new batch maximum, for a workspace of at least 2048 tokens from the first call.")
SHAPE, FLOOR = "floor_0", "floor_2048"
SHORT, MIXED = "short_ramp", "mixed"
PEAK_SLACK_MIB = 2.0  # one caching-allocator segment: the int64 pointer table
TRACE_METHODS = (2, None)


# -- reading a run ---------------------------------------------------------------------------------
def _int(run, key: str) -> int:
    return int(run.manifest.params.get(key, 0) or 0)


def _cells(run) -> list[tuple[str, str]]:
    p = run.manifest.params
    return [(t, n) for t in p.get("traces", []) for n in p.get("policies", [])]


def _values(mgr, refused) -> dict:
    return dict(recreations=traces.in_trace(mgr), peak_workspace=mgr.peak_bytes_per_rank / MiB,
                refused_calls=refused)


def expected(run, trace: str, policy: str) -> dict:
    """The simulation of one (trace, policy) cell with this run's settings, by metric name."""
    W, H, pre = run.manifest.tp, run_hidden(run), _int(run, "pre_initialize")
    if steps := _int(run, "gpu_trace_steps"):
        return _values(*rebuild.simulate(rebuild.POLICIES[policy],
                                         traces.trace_tokens(trace)[:steps], world_size=W,
                                         hidden_dim=H, pre_initialize=pre or None))
    return _values(*traces.simulated(trace, policy, W, H, pre))


def per_rank(run, metric: str, trace: str, policy: str) -> dict:
    """``{rank: value}`` of one GPU metric in one cell; a missing rank is simply absent."""
    d = run.df
    d = d[(d.source == "gpu") & (d.metric == metric) & (d.trace == trace) & (d.variant == policy)]
    return {int(r): float(v) for r, v in zip(d["rank"], d.value)}


def _slowest(run, metric: str, trace: str, policy: str) -> float:
    if not (v := per_rank(run, metric, trace, policy)):
        raise KeyError(f"no {metric} rows for {trace}/{policy}")
    return max(v.values())


def _needs(run, names=(), policies=()) -> Optional[str]:
    p = run.manifest.params
    if _int(run, "pre_initialize"):
        return "the run pre-initialises the workspace; these claims are about a cold start"
    miss = ([t for t in names if t not in p.get("traces", [])]
            + [n for n in policies if n not in p.get("policies", [])])
    return f"the run has no {', '.join(miss)}" if miss else None


def _events(run):
    if (ev := run.sidecar("events")) is None:
        raise LookupError("the run has no events sidecar")
    return ev


def _traced(run) -> Optional[str]:
    if run.manifest.params.get("profile") is False:
        return "the run was recorded without the traced pass (profile=False)"
    if run.manifest.sidecars.get("events") is None:
        return "the run has no profiler events (recorded before traces)"
    return None


# -- the re-creations ------------------------------------------------------------------------------
def _short_cold_start(run):
    shape, floor = (per_rank(run, "recreations", SHORT, n) for n in (SHAPE, FLOOR))
    sim = expected(run, SHORT, SHAPE)["recreations"]
    ok = (set(floor.values()) == {1} and set(shape.values()) == {sim} and sim > 1
          and len(shape) == len(floor) == run.manifest.tp)
    return holds(
        ok, f"{label(SHAPE)} {text.count(shape.values()) or 'none'}× (simulation {sim}), "
        f"{label(FLOOR)} {text.count(floor.values()) or 'none'}× on {len(floor)} ranks",
        {SHAPE: int(max(shape.values())), FLOOR: int(max(floor.values()))})


def _simulation_reproduced(run):
    d = run.df[(run.df.source == "simulated")
               & run.df.metric.isin(["recreations", "peak_workspace", "refused_calls"])]
    if d.empty:
        return holds(False, "no simulated rows", why_not="the run holds no simulation")
    bad = []
    for r in d.itertuples():
        pre = 0 if r.scenario == "cold" else int(str(r.scenario).split("_")[-1])
        fresh = _values(*traces.simulated(r.trace, r.variant, int(r.world_size), run_hidden(run),
                                          pre))[r.metric]
        if float(r.value) != float(fresh):
            bad.append(f"{r.trace}/{r.scenario}/{label(r.variant)} {r.metric}: stored "
                       f"{r.value:g}, now {fresh:g}")
    return holds(not bad, "; ".join(bad[:3]) or f"{len(d)} stored values reproduced",
                 {"values": len(d), "differ": len(bad)})


def _counts_equal(run):
    W, problems, value = run.manifest.tp, [], {}
    for t, n in _cells(run):
        got, exp = per_rank(run, "recreations", t, n), expected(run, t, n)["recreations"]
        value[f"{t}/{n}"] = int(exp)
        if missing := sorted(set(range(W)) - set(got)):
            problems.append(f"{t}/{label(n)}: no row for rank(s) {missing}")
        problems += [
            f"{t}/{label(n)} rank {r}: {v:g} vs {exp:g}" for r, v in sorted(got.items()) if v != exp
        ]
    return holds(
        bool(value) and not problems, "; ".join(problems[:3])
        or f"{len(value)} cells × {W} ranks equal", value)


def _ranges_equal_simulation(run):
    W, p = run.manifest.tp, run.manifest.params
    r = show.creation_ranges(_events(run))
    got = r[r.variant != COST_VARIANT].groupby(["variant", "rank"]).size()
    problems, value = [], {}
    for n in p.get("profile_policies", []):
        value[n] = sim = traces.recreations(p.get("profile_trace", SHORT), n, W, run_hidden(run))
        problems += [
            f"{label(n)} rank {rank}: {int(got.get((n, rank), 0))} ranges vs {sim}"
            for rank in range(W) if int(got.get((n, rank), 0)) != sim
        ]
    said = ", ".join(f"{label(n)}: {v} range{'s' if v != 1 else ''}" for n, v in value.items())
    return holds(
        bool(value) and not problems, "; ".join(problems[:3]) or f"{said} on each of {W} ranks",
        value)


def _ipc_calls(run):
    W, t = run.manifest.tp, show.ipc_calls_per_creation(_events(run))
    want = {"ipc get handle": 3, "ipc open": 3 * (W - 1)}
    got = t.reindex(columns=list(want), fill_value=0)
    rows = zip(t.index, got.itertuples(index=False))
    bad = [f"{k}: {dict(zip(want, row))}" for k, row in rows if tuple(row) != tuple(want.values())]
    said = (f"{len(bad)} of {len(t)} creations differ, e.g. {bad[0]}" if bad else
            f"{len(t)} traced creations (all ranks): each 3 handle exports, {3 * (W - 1)} opens")
    return holds(len(t) > 0 and not bad, said, {"creations": len(t), "differ": len(bad)})


# -- the time --------------------------------------------------------------------------------------
def _floor_saves_time(run):
    cells = [(t, n) for t in (SHORT, MIXED) for n in (SHAPE, FLOOR) if (t, n) in _cells(run)]
    value = {f"{t}/{n}": _slowest(run, "recreate_time_total", t, n) for t, n in cells}
    a, b = value[f"{SHORT}/{SHAPE}"], value[f"{SHORT}/{FLOOR}"]
    return holds(b < a, f"{label(SHAPE)} {a:.1f} ms, {label(FLOOR)} {b:.1f} ms", value)


def _time_in_recreation(run):
    t = show.trace_recreation_table(_events(run))
    shape, floor = float(t.loc[SHAPE, "total_ms"]), float(t.loc[FLOOR, "total_ms"])
    return holds(
        floor < shape, f"{label(SHAPE)} {shape:.1f} ms, {label(FLOOR)} {floor:.1f} ms in "
        "'recreate workspace' (slowest rank)", {"floor_0 ms": shape, "floor_2048 ms": floor})


def _both_profiled(run) -> Optional[str]:
    lacks = not {SHAPE, FLOOR} <= set(run.manifest.params.get("profile_policies", []))
    return _traced(run) or (f"the traced pass lacks {label(SHAPE)} or {label(FLOOR)}"
                            if lacks else None)


# -- the memory ------------------------------------------------------------------------------------
def _peak_memory(run):
    bad, extra = [], []
    for t, n in _cells(run):
        exp = expected(run, t, n)["peak_workspace"]
        comp = per_rank(run, "peak_workspace", t, n)
        meas = per_rank(run, "peak_workspace_measured", t, n)
        for r in sorted(comp):
            if comp[r] != exp:
                bad.append(f"{t}/{label(n)} rank {r}: computed {comp[r]:g} MiB, simulation {exp:g}")
            extra.append(meas.get(r, float("nan")) - comp[r])
            if not 0 <= extra[-1] <= PEAK_SLACK_MIB:
                bad.append(f"{t}/{label(n)} rank {r}: measured - computed = {extra[-1]:g} MiB")
    floors = [(k, n) for k, n in (("floor 2048 MiB", FLOOR),
                                  ("floor 512 MiB", "floor_512")) if (SHORT, n) in _cells(run)]
    value = {k: _slowest(run, "peak_workspace", SHORT, n) for k, n in floors}
    value["extra max MiB"] = max(extra) if extra else None
    said = (f"measured - computed in [{min(extra):g}, {max(extra):g}] MiB over {len(extra)} "
            "cells×ranks" if extra and not bad else "; ".join(bad[:3]) or "no rows")
    return holds(bool(extra) and not bad, said, value)


def _back_to_baseline(run):
    # (the traced pass's own check, variant traced_pass, is against a baseline inside the profiler)
    metrics = ("mem_after_cleanup", "rank_mem_delta_cudart", "rank_mem_delta_nvml",
               "rank_nvml_other_gpus_end")
    d = run.df[(run.df.source == "gpu") & run.df.metric.isin(metrics)]
    ranks = sorted(int(r) for r in d["rank"].dropna().unique())
    worst = float(d.value.abs().max()) if len(d) else float("nan")
    ok = len(d) > 0 and worst == 0 and ranks == list(range(run.manifest.tp))
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
    if run.manifest.tp != 4:
        return f"needs a 4-rank run (this run has {run.manifest.tp})"
    if run_hidden(run) != 7168:
        return "the 450 MiB figure is for Kimi-K2.5's hidden size 7168"
    return _needs(run, (SHORT,), (FLOOR,))


def _before_pr_refuses(run):
    steps, W = _int(run, "gpu_trace_steps"), run.manifest.tp
    problems, value = [], {}
    for t in run.manifest.params.get("traces", []):
        over = traces.calls_over(t, rebuild.CALLEE_DEFAULT_MAX_TOKEN_NUM, steps)
        got, value[t] = per_rank(run, "refused_calls", t, "before_pr"), over
        if set(got) != set(range(W)) or any(v != over for v in got.values()):
            problems.append(f"{t}: {sorted(got.values())} vs {over} calls over 2048")
    said = ", ".join(f"{t}: {v}" for t, v in value.items()) + " refused on every rank"
    return holds(not problems, "; ".join(problems) or said, value)


_ID = "workspace_floor."
_COLD = (SHORT,), (SHAPE, FLOOR)
CLAIMS = [
    Claim(
        _ID + "floor_recreates_once",
        f"On the short-prompt cold start, the {label(FLOOR)} creates the workspace once and the "
        f"{label(SHAPE)} re-creates it at every new maximum (the simulation's count), on every "
        "rank", f"{label(FLOOR)}: 1; {label(SHAPE)}: == simulation, > 1 (exact)", _short_cold_start,
        applies=lambda r: _needs(r, *_COLD), folded=(
            Claim(
                _ID + "simulation_reproduced", "The simulation stored with the run equals the "
                "simulation of this checkout's rebuild",
                "every stored count, size and refusal equal (exact)", _simulation_reproduced),
            Claim(
                _ID + "gpu_counts_equal_simulation", "GPU re-creation counts equal the CPU "
                "simulation in every (trace, policy) cell, on every rank",
                "== simulation, every cell and rank (exact)", _counts_equal),
            Claim(
                _ID + "trace_ranges_equal_simulation", "In the profiler trace every rank shows "
                "one 'recreate workspace' range per re-creation the simulation predicts, for each "
                "profiled policy", "== simulation per policy and rank (exact)",
                _ranges_equal_simulation, methods=TRACE_METHODS, applies=_traced),
            Claim(
                _ID + "trace_ipc_calls_per_creation", "Every traced creation exports 3 CUDA IPC "
                "handles and opens 3·(W-1), one per buffer and peer",
                "3 exports, 3(W-1) opens per creation and rank (exact)", _ipc_calls,
                methods=TRACE_METHODS, applies=_traced))),
    Claim(
        _ID + "floor_saves_recreation_time",
        f"On the short-prompt cold start the {label(FLOOR)} spends less host-blocking time "
        f"creating than the {label(SHAPE)} (slowest rank)",
        f"{label(FLOOR)} < {label(SHAPE)} (ms drift ±50%)", _floor_saves_time, drift=0.5,
        applies=lambda r: _needs(r, *_COLD), folded=(Claim(
            _ID + "trace_time_in_recreation", "Time in 'recreate workspace' ranges, read from the "
            f"trace: the {label(FLOOR)} spends less than the {label(SHAPE)} (slowest rank)",
            f"{label(FLOOR)} < {label(SHAPE)} (ms drift ±50%)", _time_in_recreation,
            methods=TRACE_METHODS, applies=_both_profiled, drift=0.5),)),
    Claim(
        _ID + "peak_memory_as_computed",
        "Each rank's measured peak (cudaMemGetInfo above its baseline) is FlashInfer's three "
        "aligned buffers for the simulated size, plus at most one 2 MiB allocator segment",
        f"0 <= measured - computed <= {PEAK_SLACK_MIB:g} MiB, computed == simulation", _peak_memory,
        folded=(Claim(
            _ID + "memory_back_to_baseline", "Every rank's device memory is back to its "
            "baseline after every policy and at the end (cudaMemGetInfo and NVML, own GPU "
            "and others)", "0 MiB on every rank (exact)", _back_to_baseline),
                Claim(
                    _ID + "no_rank_left",
                    "No rank process and none of their GPU memory is left once "
                    "the run returns", "0 processes, 0 MiB (exact)", _no_rank_left))),
    Claim(
        _ID + "tp4_pr_workspace_450mib",
        f"At TP 4 with Kimi-K2.5's hidden size the {label(FLOOR)}'s 2048-token workspace takes "
        "450 MiB per rank, measured", f"computed 450 MiB, measured within +{PEAK_SLACK_MIB:g} MiB",
        _tp4_workspace, applies=_tp4_applies),
    Claim(
        _ID + "before_pr_refuses_over_2048",
        f"With the {label('before_pr')}, every call over 2048 tokens trips the callee's assert: "
        "the refused count equals the trace's calls over 2048, on every rank",
        "== calls over 2048 in the trace (exact)", _before_pr_refuses, applies=lambda r: None
        if "before_pr" in r.manifest.params.get("policies", []) else "the run has no before_pr")
]


def shown(runs_: list) -> list:
    """The runs a reader sees: the newest per world size, smallest world first."""
    return runs.newest(runs_, lambda r: r.manifest.tp)


_C, _T, _P, _R = (_ID + c for c in ("gpu_counts_equal_simulation", "floor_saves_recreation_time",
                                    "peak_memory_as_computed", "before_pr_refuses_over_2048"))


def _span(claim: str, key: str, unit: str) -> str:
    return f"{{lo[{claim}][{key}]:.0f}}–{{hi[{claim}][{key}]:.0f}} {unit}"


HEADLINE = Headline(
    parts=(f"Cold start on short prompts ({{runs}}; slowest rank): the "
           f"{label(SHAPE)} re-creates the workspace {{v[{_C}][short_ramp/floor_0]}}× "
           f"({_span(_T, 'short_ramp/floor_0', 'ms')}), the {label(FLOOR)} "
           f"{{v[{_C}][short_ramp/floor_2048]}}× ({_span(_T, 'short_ramp/floor_2048', 'ms')}) at "
           f"{_span(_P, 'floor 2048 MiB', 'MiB/rank')} (floor 512: "
           f"{{v[{_C}][short_ramp/floor_512]}}×, {_span(_P, 'floor 512 MiB', 'MiB')}).",
           f"With 4096-token chunks both re-create {{v[{_C}][mixed/floor_2048]}}× "
           f"(draft {_span(_T, 'mixed/floor_0', 'ms')}, floor "
           f"{_span(_T, 'mixed/floor_2048', 'ms')}); with the {label('before_pr')}, the assert "
           f"refuses the {{v[{_R}][mixed]}} calls over 2048 tokens."), per_run="{gpu} TP {world}",
    sep=" ", run_sep=", ")


# -- the real engine (``scripts/engine_gpu.sh --plan 02``: data/recorded/engine_workspace_floor/) --
def _engine_applies(run):
    return None if sglang.engine_facts(
        run) else "no engine variant with the workspace trace started"


def _engine_equal(run):
    facts = sglang.engine_facts(run)
    good = [
        f for f in facts
        if f["per_rank"] and set(f["managers"].values()) == {rebuild.ENGINE_MANAGERS} and all(
            n == f["sim"] * f["managers"][r] for r, n in f["per_rank"].items())
        and f["sizes"] == f["sim_sizes"] and len(f["per_rank"]) == f["world"]
    ]
    value = {f["variant"]: f"{max(f['per_rank'].values())}/rank" for f in facts}
    value.update({f"{f['variant']} sim": f["sim"] for f in facts})
    order = list(sglang.ENGINE_POLICY.values())  # each policy once, in the engine's order
    names = [label(p) for p in sorted({f["policy"] for f in facts}, key=order.index)]
    # read by the headline and the card, not compared with a reference
    value["per_rank"] = text.count([n for f in facts for n in f["per_rank"].values()])
    value["sizes"] = show.joined(s for f in facts for s in f["sizes"])
    value["sim"] = text.count([f["sim"] for f in facts])
    value["tp"] = show.joined((f["world"] for f in facts), " and ")
    value["policies"] = ", ".join(
        names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
    return holds(
        len(good) == len(facts),
        "; ".join(f"{f['variant']} ({label(f['policy'])}): {max(f['per_rank'].values())} per "
                  f"rank = {f['managers'][0]} managers × {f['sim']} simulated, at "
                  f"{show.joined(f['sizes'])}" for f in facts), value,
        why_not="; ".join(f"{f['variant']}: per rank {f['per_rank']}, managers "
                          f"{f['managers']}, sizes {f['sizes']}, simulated {f['sim']} at "
                          f"{f['sim_sizes']}" for f in facts if f not in good))


def _engine_none_per_step(run):
    facts = sglang.engine_facts(run)
    n, calls = sum(f["in_calls"] for f in facts), sum(f["calls"] for f in facts)
    return holds(n == 0, f"{n} creations during {calls} generate calls ({len(facts)} variants)",
                 {"in_calls": n, "calls": calls})


_EQ, _NONE = "engine_workspace_floor.creations_equal_simulation", \
    "engine_workspace_floor.no_creation_per_forward_step"
ENGINE = engine_claims(
    EXPERIMENT="engine_workspace_floor",
    CLAIM="In the shipped engine the floor changes nothing: `pre_initialize_workspaces` creates "
    "every rank's workspaces before graph capture, and a larger step is never fused, so no forward "
    "step creates one.",
    CLAIMS=[
        Claim(
            _EQ, "Per rank, the engine creates each of its two workspaces (attention TP, MoE TP) "
            "as often and at the sizes the rebuild's simulation of the same trace gives, for the "
            f"{label('before_pr')} call, the {label(FLOOR)} and the {label('shape_no_hwm')}",
            "creations per rank == 2 managers × simulated; sizes == simulated (exact)",
            _engine_equal, applies=_engine_applies, context=("per_rank", "sizes", "sim", "tp",
                                                             "policies")),
        Claim(
            _NONE, "No workspace is created during a forward step of the short-prompt trace (the "
            "timed generate calls, prompts of 4 to 3000 tokens)",
            "== 0 creations inside the calls (exact)", _engine_none_per_step,
            applies=_engine_applies, context=("calls",))
    ],
    # one sentence per GPU model, from its runs merged
    HEADLINE=Headline(
        parts=("{runs}.",), run_sep="; ",
        per_run=f"{{gpu}} TP {{v[{_EQ}][tp]}}: {{v[{_EQ}][per_rank]}} creations per rank, all at "
        f"{{v[{_EQ}][sizes]}} tokens at start-up and {{v[{_NONE}][in_calls]}} in "
        f"{{v[{_NONE}][calls]}} generate calls, for the {{v[{_EQ}][policies]}} alike (the "
        f"rebuild's simulation with that pre-initialisation: {{v[{_EQ}][sim]}} per manager)"))

# -- the review card -------------------------------------------------------------------------------
_FOUND = ((
    "`max_token_num=max(x.shape[0], 2048)`: the workspace sized to the batch, 2048 tokens at least",
    f"As shipped, the line sizes nothing: every creation happens at start-up at "
    f"{{e[{_EQ}][sizes]}} tokens ({{e[{_NONE}][in_calls]}} in {{e[{_NONE}][calls]}} generate "
    "calls), with any of the three call sites; a step above 2048 tokens is not fused at all."
), (
    "The first draft, `max_token_num=x.shape[0]` (changed in review, never released)",
    f"Without the pre-initialisation it re-creates at every new maximum: "
    f"{{r[{_C}][short_ramp/floor_0]}}× on the short-prompt cold start "
    f"({{r[{_T}][short_ramp/floor_0]:.0f}} ms on the slowest rank) against "
    f"{{r[{_C}][short_ramp/floor_2048]}}× ({{r[{_T}][short_ramp/floor_2048]:.0f}} ms) with the "
    "floor, in the rebuild on real IPC workspaces."
), ("Released before: no `max_token_num`, the callee's default 2048 and its assert",
    f"The assert would refuse {{r[{_R}][mixed]}} calls of the mixed trace, but in the engine none "
    "reaches it: `apply_flashinfer_allreduce_fusion` sends steps above 2048 tokens to the unfused "
    "all-reduce."))
CARD = Card(
    bug="Released before #26382 (part B), the fused all-reduce + RMSNorm call passed no "
    "`max_token_num`: the callee's default, 2048, sized the workspace, and its assert refused a "
    "larger batch. The PR's first draft passed `x.shape[0]`, which re-creates the workspace, "
    "blocking every rank, at each new batch maximum; the merged line passes `max(x.shape[0], "
    "2048)`.",
    affects="`--enable-flashinfer-allreduce-fusion` at TP ≥ 2 (SM90 or SM100, no DP attention). "
    "The engine pre-initialises the workspaces at start-up, so the floor changes nothing as "
    "shipped; it guards paths that skip that.", found=_FOUND)
