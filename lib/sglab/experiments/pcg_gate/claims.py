"""What every pcg_gate run must show (see :mod:`sglab.core.claims`)."""

from __future__ import annotations

from sglab.pcg_gate.sglang import FIX

from sglab.core.claims import Claim, holds, not_applicable, values
from sglab.experiments.pcg_gate import analysis as an

EXPERIMENT = "pcg_gate"
GPUS = FIX.gpus

CLAIM = ("A `model` property + `__setattr__` guard lets the Kimi-shaped wrapper pass the PCG gate with no duplicate "
         "`model.*` weights.")

SMALL = 512           # "small" prefills: every timed token count up to here must gain from piecewise graphs
LAUNCH_BOUND = 128    # ... and up to here by at least MIN_SMALL_RATIO
MIN_SMALL_RATIO = 2.0  # eager is host-bound there: the ratio moves with the host's speed
DUPLICATING = ("plain_alias", "property_only", "property_setter")
CLEAN = ("no_alias", "property_guard")


def _facts(run) -> dict:
    return an.run_facts(run.df)


def _gate_decision(run):
    f = _facts(run)
    off, on = f[("eager", "gate_enabled")], f[("piecewise", "gate_enabled")]
    ok = off == 0 and on == 1
    text = f"no_alias: {'on' if off else 'off'} (eager prefill); property_guard: {'on' if on else 'off'}"
    value = {"no_alias": int(off), "property_guard": int(on)}
    g = an.gate_table(run.df)
    if not g.empty:  # method 2: every wrapper variant around the measured LLM
        decided = {v: int(g.loc[v, "gate_enabled"]) for v in g.index}
        want = {v: int(v != "no_alias") for v in decided}
        ok = ok and decided == want and set(decided) >= {"no_alias", "plain_alias", "property_only",
                                                          "property_guard"}
        text = ", ".join(f"{v}: {'on' if d else 'off'}" for v, d in decided.items())
        value = decided
    return holds(ok, text, value)


def _duplicate_keys(run):
    g = an.gate_table(run.df)
    if g.empty:
        return not_applicable("this run has no per-variant gate rows")
    missing = [v for v in (*DUPLICATING, *CLEAN) if v not in g.index]
    if missing:
        return holds(False, f"variants missing: {missing}", why_not=f"no gate rows for {missing}")
    lm = int(g.loc["no_alias", "lm_keys"])
    dup = {v: int(g.loc[v, "model_keys_after_gate"]) for v in g.index}
    ok = all(dup[v] == lm for v in DUPLICATING) and all(dup[v] == 0 for v in CLEAN)
    ok = ok and all(int(g.loc[v, "state_dict_keys_after_gate"]) == int(g.loc["no_alias", "state_dict_keys_after_gate"])
                    + dup[v] for v in g.index)
    text = f"LLM has {lm} keys; model.* keys after the gate: " + ", ".join(f"{v} {n}" for v, n in dup.items())
    return holds(ok, text, {"lm_keys": lm, **dup})


def _equals_eager(run):
    lat = an.latency_table(run.df)
    within = (lat["max_abs_diff"] <= lat["tolerance"]) & lat["within_tol"]  # recomputed, and as the run recorded it
    ok, n = int(within.sum()), len(lat)
    worst = float(lat["max_abs_diff"].max())
    return holds(ok == n, f"{ok}/{n} token counts within tolerance (max abs diff {worst:.3g})",
                 {"points": n, "within": ok, "max_abs_diff": worst})


def _small_speedup(run):
    sp = an.latency_table(run.df)["speedup"]
    small, launch = sp[sp.index <= SMALL], sp[sp.index <= LAUNCH_BOUND]
    if small.empty or launch.empty:
        return not_applicable(f"no timed token count at or below {LAUNCH_BOUND}")
    ok = bool((small > 1.0).all() and (launch >= MIN_SMALL_RATIO).all())
    start = an.slowdown_start(sp)
    value = {"min_small": float(small.min()), "min_launch_bound": float(launch.min()), "max": float(sp.max()),
             "max_at": int(sp.idxmax()), "min": float(sp.min()), "slowdown_from": start,
             "tokens_lo": int(sp.index.min()), "tokens_hi": int(sp.index.max())}
    return holds(ok, f"eager/piecewise {small.min():.2f}–{small.max():.2f}× up to {SMALL} tok "
                     f"(≥{launch.min():.2f}× up to {LAUNCH_BOUND}); {sp.min():.2f}× at worst", value)


def _graph_count(run):
    f = _facts(run)
    layers = int(run.manifest.get("params", {}).get("num_layers", 16))
    want = int(f[("piecewise", "buckets")]) * (layers + 1)
    got = int(f[("piecewise", "graphs")])
    return holds(got == want, f"{got} graphs = {int(f[('piecewise', 'buckets')])} buckets × {layers + 1} segments"
                 if got == want else f"{got} graphs, expected {want}", {"graphs": got})


def _trace(run):
    t = an.trace_table(run.df)
    if t.empty:
        raise KeyError("no trace_* rows")
    return t


def _launch_gaps(run):
    t = _trace(run)
    n = min(i[0] for i in t.index)
    e, p = t.loc[(n, "eager"), "busy"], t.loc[(n, "piecewise"), "busy"]
    return holds(e < 0.5 and p > e, f"at {n} tok the GPU is busy {e:.0%} of the eager forward, {p:.0%} of the "
                 "piecewise one", {"tokens": int(n), "eager_busy": float(e), "piecewise_busy": float(p)})


def _copies(run):
    x = an.copy_explanation(run.df)
    lat = an.latency_table(run.df)
    n = int(x.index.max())
    share = float(x.loc[n, "copy share of extra device time"])
    if "speedup_direct" not in lat.columns:
        raise KeyError("no piecewise_direct timings")
    direct = lat["speedup_direct"].dropna()
    ok = share >= 0.5 and bool((direct >= 0.99).all())
    return holds(ok, f"at {n} tok the extra copies take {share:.0%} of piecewise's extra device time; without them "
                     f"eager/piecewise is {direct.min():.3f}–{direct.max():.3f}× at {list(direct.index)} tok",
                 {"share": share, "direct_min": float(direct.min())})


def _kernel_counts(run):
    kt = (run.manifest.get("kernel_table") or {})
    if kt.get("backend") not in ("cupti", "ncu"):
        return not_applicable(f"the per-kernel table came from {kt.get('backend', 'nowhere')}: "
                              f"{kt.get('reason', 'no kernel table in this run')}")
    d = an._per_token(run.df)
    calls = d[(d.metric == "kernel_table_calls") & (d.variant == "eager")]
    n = int(calls.num_tokens.iloc[0])
    traced = d[(d.metric == "trace_kernels") & (d.variant == "eager") & (d.num_tokens == n)]
    a, b = float(calls.value.iloc[0]), float(traced.value.iloc[0])
    return holds(a == b, f"eager prefill at {n} tok: nsight-python {a:.0f} kernels, torch.profiler {b:.0f}",
                 {"nsight": a, "profiler": b})


CLAIMS = [
    Claim(f"{EXPERIMENT}.gate_decision", "The gate keeps the wrapper without `.model` on eager prefill and lets "
          "every aliased wrapper through", "no_alias off, every alias variant on (exact)", _gate_decision),
    Claim(f"{EXPERIMENT}.duplicate_keys", "`model.*` keys appear only for the plain alias and the property without "
          "guard, each the LLM's whole key list again", "model.* keys == LLM keys for plain_alias / property_only "
          "(/ property_setter), 0 for no_alias / property_guard (exact)", _duplicate_keys, methods=(2, None)),
    Claim(f"{EXPERIMENT}.piecewise_equals_eager", "Piecewise prefill computes the eager result at every token count",
          "max |piecewise − eager| ≤ 8 bf16 ulps of the output's max, every token count", _equals_eager, drift=None),
    Claim(f"{EXPERIMENT}.small_prefill_speedup", f"Piecewise graphs speed up every prefill up to {SMALL} tokens",
          f"eager/piecewise > 1 at every count ≤ {SMALL} tok and ≥ {MIN_SMALL_RATIO}× at ≤ {LAUNCH_BOUND} tok",
          _small_speedup, drift=0.25),
    Claim(f"{EXPERIMENT}.graph_count", "One graph per segment and bucket", "graphs == buckets × (layers + 1)",
          _graph_count),
    Claim(f"{EXPERIMENT}.trace_launch_gaps", "A small eager prefill leaves the GPU idle between launches; piecewise "
          "replays keep it busier", "eager busy < 50% of the forward at the smallest traced count, piecewise busier",
          _launch_gaps, methods=(2, None), drift=0.25),
    Claim(f"{EXPERIMENT}.copies_explain_slowdown", "The large-prefill slowdown is the copy hand-off between pieces",
          "copies ≥ 50% of piecewise's extra device time at the largest traced count; without them eager/piecewise "
          "≥ 0.99", _copies, methods=(2, None), drift=0.25),
    Claim(f"{EXPERIMENT}.kernel_counts_agree", "nsight-python and torch.profiler count the same kernels in the "
          "eager prefill", "equal (exact)", _kernel_counts, methods=(2, None)),
]


def shown(runs: list) -> list:
    """The newest run of each GPU model."""
    return an.newest_per_gpu(runs)


def _span(lo: float, hi: float) -> str:
    a, b = f"{lo:.2f}", f"{hi:.2f}"
    return f"{a}×" if a == b else f"{a}–{b}×"


def headline(runs: list) -> str:
    parts, points, within, worst, lo, hi = [], 0, 0, 0.0, [], []
    for r in runs:
        v = values(EXPERIMENT, r)
        s, e = v[f"{EXPERIMENT}.small_prefill_speedup"].value, v[f"{EXPERIMENT}.piecewise_equals_eager"].value
        if s is None or e is None:
            continue
        text = f"{an.gpu_short(r)} {_span(s['min'], s['max'])} (max at {s['max_at']} tok"
        text += f"; <1 from {s['slowdown_from']} tok)" if s["slowdown_from"] is not None else ")"
        parts.append(text)
        lo.append(s["tokens_lo"])
        hi.append(s["tokens_hi"])
        points, within, worst = points + e["points"], within + e["within"], max(worst, e["max_abs_diff"])
    if not parts:
        return "no run with timings yet"
    return (f"Prefill eager/piecewise (median, {min(lo)}–{max(hi)} tok): " + "; ".join(parts)
            + f"; piecewise = eager within bf16 tolerance at {within}/{points} points (max abs diff {worst:.3f}).")
