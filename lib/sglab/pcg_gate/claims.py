"""What every pcg_gate run must show (see :mod:`sglab.core.claims`): five claims a reader checks,
the instrument checks folded under them, ``ENGINE`` (the real engine's claims) and ``CARD``. From
method 3 the launch-bound claims read relative to the host's per-launch cost measured in the run."""

from __future__ import annotations

import math

from sglab.core import engine_records, engine_stats, runs
from sglab.core.card import Card
from sglab.core.claims import NA, Claim, Headline, Outcome, engine_claims, holds, not_applicable
from sglab.core.text import span
from sglab.pcg_gate import rebuild, serving, sglang, tables
from sglab.pcg_gate.measure import EXPERIMENT, GPUS  # noqa: F401 (GPUS: read by Workbook)
from sglab.sglang.releases import parse_version


CLAIM = ("A `model` property + `__setattr__` guard lets the Kimi-shaped wrapper pass the PCG gate "
         "with no duplicate `model.*` weights.")
SMALL = 512  # "small" prefills: every timed count up to here gains from piecewise graphs
LAUNCH_BOUND = tables.LAUNCH_BOUND  # ... and up to here eager is its launches
MIN_SMALL_RATIO = 2.0  # methods 1-2: eager/piecewise at <= LAUNCH_BOUND (moves with the host)
EAGER_X = (1.5, 8.0)  # method 3: eager µs per launch over the host's per-launch cost
EXPLAINED = (0.8, 1.2)  # method 3: piecewise's gain over what its removed launches cost
DUPLICATING = ("plain_alias", "property_only", "property_setter")
CLEAN = ("no_alias", "property_guard")


def _method(run) -> int:
    return int(run.manifest.method_version)


# -- the gate and the keys -------------------------------------------------------------------------
def _gate_decision(run):
    f = tables.run_facts(run.df)
    off, on = f[("eager", "gate_enabled")], f[("piecewise", "gate_enabled")]
    ok = off == 0 and on == 1
    text = (f"no_alias: {'on' if off else 'off'} (eager prefill); property_guard: "
            f"{'on' if on else 'off'}")
    value = {"no_alias": int(off), "property_guard": int(on)}
    g = tables.gate_table(run.df)
    if not g.empty:  # method 2 on: every wrapper variant around the measured LLM
        decided = {v: int(g.loc[v, "gate_enabled"]) for v in g.index}
        every = {v: int(v != "no_alias") for v in decided}
        ok = ok and decided == every and set(decided) >= set(rebuild.VARIANTS)
        text = ", ".join(f"{v}: {'on' if d else 'off'}" for v, d in decided.items())
        value = decided
    return holds(ok, text, value)


def _duplicate_keys(run):
    g = tables.gate_table(run.df)
    if g.empty:
        return not_applicable("this run has no per-variant gate rows")
    missing = [v for v in (*DUPLICATING, *CLEAN) if v not in g.index]
    if missing:
        return holds(False, f"variants missing: {missing}", why_not=f"no gate rows for {missing}")
    lm = int(g.loc["no_alias", "lm_keys"])
    dup = {v: int(g.loc[v, "model_keys_after_gate"]) for v in g.index}
    base = int(g.loc["no_alias", "state_dict_keys_after_gate"])
    ok = (all(dup[v] == lm for v in DUPLICATING) and all(dup[v] == 0 for v in CLEAN)
          and all(int(g.loc[v, "state_dict_keys_after_gate"]) == base + dup[v] for v in g.index))
    return holds(
        ok, f"LLM has {lm} keys; model.* keys after the gate: " + ", ".join(
            f"{v} {n}" for v, n in dup.items()), {"lm_keys": lm, **dup})


# -- correctness, and the graphs it rests on -------------------------------------------------------
def _equals_eager(run):
    lat = tables.latency_of(run)
    # recomputed, and as the run recorded it
    within = (lat["max_abs_diff"] <= lat["tolerance"]) & lat["within_tol"]
    ok, n, worst = int(within.sum()), len(lat), float(lat["max_abs_diff"].max())
    return holds(ok == n, f"{ok}/{n} token counts within tolerance (max abs diff {worst:.3g})",
                 {"points": n, "within": ok, "max_abs_diff": worst})


def _graph_count(run):
    f = tables.run_facts(run.df)
    layers = int(run.manifest.params.get("num_layers", 16))
    buckets, got = int(f[("piecewise", "buckets")]), int(f[("piecewise", "graphs")])
    want = buckets * (layers + 1)
    return holds(
        got == want, f"{got} graphs = {buckets} buckets × {layers + 1} pieces"
        if got == want else f"{got} graphs, expected {want}", {"graphs": got})


# -- small prefills: the speed-up and the launches behind it ---------------------------------------
def _ratios(sp) -> dict:
    """The raw eager/piecewise ratios: range, the largest's place, where piecewise loses."""
    return dict(max=float(sp.max()), max_at=int(sp.idxmax()), min=float(sp.min()),
                slowdown_from=tables.slowdown_start(sp), tokens_lo=int(sp.index.min()),
                tokens_hi=int(sp.index.max()))


def _small_speedup(run):
    sp = tables.latency_of(run)["speedup"]
    small, launch = sp[sp.index <= SMALL], sp[sp.index <= LAUNCH_BOUND]
    if launch.empty:
        return not_applicable(f"no timed token count at or below {LAUNCH_BOUND}")
    if _method(run) < 3:  # raw ratios (they move with the host)
        ok = bool((small > 1.0).all() and (launch >= MIN_SMALL_RATIO).all())
        value = dict(min_small=float(small.min()), min_launch_bound=float(launch.min()),
                     **_ratios(sp))
        return holds(
            ok, f"eager/piecewise {small.min():.2f}–{small.max():.2f}× up to {SMALL} tok "
            f"(≥{launch.min():.2f}× up to {LAUNCH_BOUND}); {sp.min():.2f}× at worst", value)
    # method 3: eager is its launches, and piecewise gains what the launches it removes cost
    lt = tables.launch_table(run.df)
    lb = lt[lt.index <= LAUNCH_BOUND]
    if lb.empty:
        raise KeyError("no launch rows at or below the launch-bound count")
    x, explained = lb["eager ÷ host cost"], lb["gain explained"]
    ok = bool((small > 1.0).all() and x.between(*EAGER_X).all()
              and explained.between(*EXPLAINED).all())
    first = lb.iloc[0]
    value = dict(explained=float(explained.median()), launches_eager=int(first["eager launches"]),
                 launches_piecewise=int(first["piecewise launches"]),
                 explained_min=float(explained.min()), explained_max=float(explained.max()))
    return holds(
        ok, f"eager/piecewise > 1 at {int((small > 1).sum())}/{len(small)} counts ≤ {SMALL} tok; "
        f"at ≤ {LAUNCH_BOUND} tok eager = {value['launches_eager']} launches × "
        f"{span(x, '{:.1f}', '×')} the host's per-launch cost, and piecewise "
        f"({value['launches_piecewise']} launches) gains {span(explained)} of what the "
        "removed launches cost", value)


def _launch_gaps(run):
    t = tables.trace_table(run.df)
    if t.empty:
        raise KeyError("no trace_* rows")
    n = min(i[0] for i in t.index)
    e, p = t.loc[(n, "eager")], t.loc[(n, "piecewise")]
    ok = e.busy < 0.5 and p.busy > e.busy
    text = (f"at {n} tok the GPU is busy {e.busy:.0%} of the eager forward, {p.busy:.0%} of the "
            "piecewise one")
    if _method(run) < 3:
        busy = {"tokens": int(n), "eager_busy": float(e.busy), "piecewise_busy": float(p.busy)}
        return holds(ok, text, busy)
    # method 3: the device work per eager launch against the host's time per launch
    lt = tables.launch_table(run.df)
    if not e.kernel_launches or not e.device_us:
        raise KeyError(f"no eager kernels in the trace at {n} tok")
    kernel_us = e.device_us / e.kernel_launches
    # timed where the count was timed, else as traced (under the profiler)
    host_us = float(lt.get("eager µs/launch", {}).get(n, e.host_us / e.kernel_launches))
    value = dict(tokens=int(n), kernel_us=float(kernel_us),
                 device_ratio=float(p.device_us / e.device_us))
    return holds(
        ok and kernel_us < host_us, f"{text}: {kernel_us:.1f} µs of GPU work per eager "
        f"launch, {host_us:.1f} µs of host time", value)


def _host_launch_cost(run):
    value, t = _ratios(tables.latency_of(run)["speedup"]), tables.trace_table(run.df)
    if not t.empty:
        n = min(i[0] for i in t.index)
        value.update(eager_busy=float(t.loc[(n, "eager"), "busy"]),
                     piecewise_busy=float(t.loc[(n, "piecewise"), "busy"]))
    text = (f"eager/piecewise {value['min']:.2f}–{value['max']:.2f}× (max at {value['max_at']} "
            "tok)")
    lt = tables.launch_table(run.df)
    if lt.empty:
        return Outcome(
            NA, text, value, f"this run (method {_method(run)}) predates the "
            "host's per-launch cost: its host-bound figures stand without it")
    lb = lt[lt.index <= LAUNCH_BOUND]
    host, events = float(lt["host µs/launch"].median()), lt["host µs/launch (CUDA events)"]
    value.update(launch_us=host, launch_event_us=float(events.median()),
                 eager_x=float(lb["eager ÷ host cost"].median()),
                 eager_ms=float(lb["eager ms"].median()))
    ok = host > 0 and abs(value["launch_event_us"] / host - 1) <= 0.25
    return holds(
        ok, f"{host:.1f} µs per launch by time.perf_counter, {value['launch_event_us']:.1f} by "
        f"CUDA events; {text}; eager at ≤ {LAUNCH_BOUND} tok {value['eager_ms']:.2f} ms, "
        f"{value['eager_x']:.1f}× that cost per launch", value)


# -- large prefills: the copies, and the instrument they are counted with --------------------------
def _copies(run):
    x, lat = tables.copy_explanation(run.df), tables.latency_of(run)
    n = int(x.index.max())
    share = float(x.loc[n, "copy share of extra device time"])
    if "speedup_direct" not in lat.columns:
        raise KeyError("no piecewise_direct timings")
    direct = lat["speedup_direct"].dropna()
    ok = share >= 0.5 and bool((direct >= 0.99).all())
    return holds(
        ok, f"at {n} tok the extra copies take {share:.0%} of piecewise's extra device "
        f"time; without them eager/piecewise is {direct.min():.3f}–"
        f"{direct.max():.3f}× at {list(direct.index)} tok",
        {"share": share, "direct_min": float(direct.min())})


def _kernel_counts(run):
    kt = run.manifest.kernel_table
    if kt.get("backend") not in ("cupti", "ncu"):
        return not_applicable(f"the per-kernel table came from {kt.get('backend', 'nowhere')}: "
                              f"{kt.get('reason', 'no kernel table in this run')}")
    d = tables._per_token(run.df)
    calls = d[(d.metric == "kernel_table_calls") & (d.variant == "eager")]
    n = int(calls.num_tokens.iloc[0])
    traced = d[(d.metric == "trace_kernels") & (d.variant == "eager") & (d.num_tokens == n)]
    a, b = float(calls.value.iloc[0]), float(traced.value.iloc[0])
    return holds(
        a == b, f"eager prefill at {n} tok: nsight-python {a:.0f} kernels, torch.profiler {b:.0f}",
        {"nsight": a, "profiler": b})


_E = f"{EXPERIMENT}."
GRAPH_COUNT = Claim(_E + "graph_count", "One graph per piece and bucket",
                    "graphs == buckets × (layers + 1)", _graph_count)
LAUNCH_GAPS = Claim(
    _E + "trace_launch_gaps", "A small eager prefill leaves the GPU idle between launches; "
    "piecewise replays keep it busier", "eager busy < 50% of the forward at the smallest traced "
    "count, piecewise busier (method 3: each eager launch's GPU work shorter than its host time)",
    _launch_gaps, methods=(2, None), drift=0.25)
HOST_COST = Claim(
    _E + "host_launch_cost", "The host-bound figures (small-prefill times, speed-ups, busy shares) "
    "with the host's per-launch cost measured in the same run: they scale with it and are not "
    "compared across machines", "> 0 µs, CUDA events within 25% of time.perf_counter (method 3 "
    "on)", _host_launch_cost, drift=math.inf)
KERNEL_COUNTS = Claim(
    _E + "kernel_counts_agree", "nsight-python and torch.profiler count the same kernels in the "
    "eager prefill", "equal (exact)", _kernel_counts, methods=(2, None))
CLAIMS = [
    Claim(
        _E + "gate_decision", "The gate keeps the wrapper without `.model` on eager prefill and "
        "lets every aliased wrapper through", "no_alias off, every alias variant on (exact)",
        _gate_decision),
    Claim(
        _E + "duplicate_keys", "`model.*` keys appear only for the plain alias and the property "
        "without guard, each the LLM's whole key list again", "model.* keys == LLM keys for "
        "plain_alias / property_only (/ property_setter), 0 for no_alias / property_guard "
        "(exact)", _duplicate_keys, methods=(2, None)),
    Claim(_E + "piecewise_equals_eager", "Piecewise prefill computes the eager result at every "
          "token count", "max |piecewise − eager| ≤ 8 bf16 ulps of the output's max, every token "
          "count", _equals_eager, drift=None, folded=(GRAPH_COUNT,)),
    Claim(
        _E + "small_prefill_speedup", f"Piecewise graphs speed up every prefill up to {SMALL} "
        "tokens: at small ones eager is its launches, and piecewise gains what the launches it "
        f"removes cost", f"eager/piecewise > 1 at every count ≤ {SMALL} tok; at ≤ {LAUNCH_BOUND} "
        f"tok (method 3) eager ms / (launches × host µs per launch) in {EAGER_X[0]}–"
        f"{EAGER_X[1]} and the gain {EXPLAINED[0]}–{EXPLAINED[1]} of the removed launches' cost "
        f"(methods 1–2: ≥ {MIN_SMALL_RATIO}×)", _small_speedup, drift=0.25,
        context=("explained_min", "explained_max"), folded=(LAUNCH_GAPS, HOST_COST)),
    Claim(
        _E + "copies_explain_slowdown", "The large-prefill slowdown is the copy hand-off between "
        "pieces", "copies ≥ 50% of piecewise's extra device time at the largest traced count; "
        "without them eager/piecewise ≥ 0.99", _copies, methods=(2, None), drift=0.25,
        folded=(KERNEL_COUNTS,))
]


def shown(runs_: list) -> list:
    """The newest run of each GPU model, by GPU name."""
    return runs.newest(runs_, runs.gpu_short)


_H, _S, _Q = _E + "host_launch_cost", _E + "small_prefill_speedup", _E + "piecewise_equals_eager"
HEADLINE = Headline(
    parts=(f"Prefill eager/piecewise (median, {{lo[{_H}][tokens_lo]}}–{{hi[{_H}][tokens_hi]}} "
           "tok): {runs}", f"below 1× from {{lo[{_H}][slowdown_from]}} tok",
           f"at ≤ {LAUNCH_BOUND} tok the gain is {{lo[{_S}][explained_min]:.2f}}–"
           f"{{hi[{_S}][explained_max]:.2f}} of what the removed launches cost, at "
           f"{{lo[{_H}][launch_us]:.1f}}–{{hi[{_H}][launch_us]:.1f}} µs per launch on the host",
           f"piecewise = eager within bf16 tolerance at {{lo[{_Q}][within]}}/{{hi[{_Q}][points]}}"
           f" token counts on each GPU (max abs diff {{hi[{_Q}][max_abs_diff]:.3f}})."),
    per_run=f"{{gpu}} {{v[{_H}][min]:.2f}}–{{v[{_H}][max]:.2f}}× (max at {{v[{_H}][max_at]}} tok"
    "{across})", across=f"; the max {{lo[{_H}][max]:.2f}}–{{hi[{_H}][max]:.2f}}× over {{n}} runs")

# -- the real engine (``sglab engine --plan 01``: data/recorded/engine_pcg_gate/) ------------------
KIMI, FIXED_RELEASE = "kimi_k25_tiny", "0.5.13"  # the first release with #26382 part A


def _kimi(run, case: str) -> tuple[dict, dict]:
    """``{release: pcg}``, ``{release: reason}`` of the started Kimi-K2.5 variants of ``case``."""
    df = engine_records.frame([run])
    ok, pcg = engine_stats.started(df, KIMI), engine_stats.texts(df, "pcg")
    why = engine_stats.texts(df, "pcg_reason")
    keys = [k for k, started in ok.items() if started and k[2] == case]
    return {k[1]: pcg.get(k, "") for k in keys}, {k[1]: why.get(k, "") for k in keys}


def _kimi_ran(case: str):
    return lambda run: None if _kimi(run, case)[0] else f"no Kimi-K2.5 '{case}' case in this run"


def _kimi_gate(run):
    pcg, why = _kimi(run, "enforce")
    good = all((p == "captured") if parse_version(rel) >= parse_version(FIXED_RELEASE) else (
        p == "disabled" and "not a language model" in why[rel]) for rel, p in pcg.items())
    said = "; ".join(
        f"{rel}: {pcg[rel]}" + (f" ({why[rel]})" if why[rel] else "") for rel in sorted(pcg))
    return holds(good, f"--enforce-piecewise-cuda-graph on Kimi-K2.5: {said}", pcg)


def _default_off(run):
    pcg, _ = _kimi(run, "default")
    said = "; ".join(f"{rel}: {pcg[rel]}" for rel in sorted(pcg))
    return holds(
        all(p == "disabled" for p in pcg.values()), f"default flags on Kimi-K2.5: {said} (no flag "
        "asked for it: ServerArgs' own rules turned piecewise graphs off)", pcg)


def _speedup(run):
    """Each captured case over pcg-off of its model and release, against that release's A/A gap."""
    df = engine_records.frame([run])
    starts = engine_stats.starts_in(df, "prefill")
    gaps = engine_stats.aa_gap(df, "prefill", "input_len", tables.STAT)
    worst = max(gaps.values(), default=0.0)  # a pair without its own control: the run's widest
    pairs, said = {}, []
    for (model, rel, case), r in tables.engine_ratios(df).items():
        noise = gaps.get((model, rel), worst)
        lo, hi = min(r.values()), max(r.values())
        pairs[f"{model} {rel} {case}"] = dict(lo=lo, hi=hi, aa_noise=noise, margin=lo - 1.0 - noise)
        bar = f"A/A {noise:.1%}, bar {1 + noise:.2f}×" if starts > 1 else "no A/A control"
        said.append(f"{model} {rel} {case}: {lo:.2f}–{hi:.2f}× ({bar})")
    margin = min(p["margin"] for p in pairs.values())
    return holds(
        margin > 0, f"prefill pcg-off / piecewise over 128–1024 tokens (bench_one_batch, "
        f"{engine_stats.starts_how(starts, tables.STAT)}): {'; '.join(said)}", {
            "min": min(p["lo"] for p in pairs.values()), "aa_noise": worst, "margin": margin,
            "starts": starts, "pairs": pairs
        })


def _paired(run):
    pairs = tables.engine_ratios(engine_records.frame([run]))
    return None if pairs else "no captured + pcg-off pair"


def _launches(run):
    """Captured: layers + 1 graphs and one kernel count up to the largest capture; else pcg-off."""
    counts = tables.launch_counts(engine_records.frame([run]))
    if counts.empty:
        return not_applicable("no launch pass in this run")
    plain = {(m, rel, n): r.launches
             for (m, rel, case, n), r in counts.iterrows() if case == "pcg-off"}

    def as_off(g):
        return all(plain.get((m, rel, n)) == r.launches for (m, rel, _, n), r in g.iterrows())

    bad, said, value = [], [], {}
    for (model, rel, case), g in counts.groupby(level=[0, 1, 2]):
        kernels, graphs = sorted(set(g.kernels)), sorted(set(g.graphs))
        key = f"{model} {rel} {case}"
        value[key] = {"kernels_min": kernels[0], "kernels_max": kernels[-1], "graphs": graphs[-1]}
        if g.pcg.iloc[0] == "captured":
            want, cap = tables.layers_of(model) + 1, int(g.cap.iloc[0])
            tokens = g.index.get_level_values("tokens")
            inside, beyond = (g, g.iloc[:0]) if not cap else (g[tokens <= cap], g[tokens > cap])
            kin, gin = sorted(set(inside.kernels)), sorted(set(inside.graphs))
            if gin != [want] or len(kin) != 1:
                bad.append(f"{key}: {gin} graphs, {kin} kernels (want {want} graphs and one "
                           "kernel count)")
            elif len(beyond) and (set(beyond.graphs) != {0} or not as_off(beyond)):
                bad.append(f"{key}: beyond its largest capture ({cap} tokens), not the pcg-off "
                           "launches")
            value[key].update(kernels_min=kin[0], kernels_max=kin[-1], graphs=want)
            said.append(f"{key}: {kin[0]} kernels + {want} graphs ({want - 1} layers + 1) at "
                        "every length" + (f" up to {cap} tokens, the pcg-off launches beyond"
                                          if len(beyond) else ""))
        elif case != "pcg-off":
            if graphs != [0] or not as_off(g):
                bad.append(f"{key}: not captured, yet not the pcg-off launches")
            elif case == "enforce":
                said.append(f"{key}: no graph, the pcg-off launches ({kernels[0]}–{kernels[-1]})")
    return holds(not bad, f"launches per prefill step (the launch pass): {'; '.join(bad or said)}",
                 value)


def _full_ran(run):
    return serving.served(run) and serving.benched(run)


_G, _D = "engine_pcg_gate.kimi_gate", "engine_pcg_gate.kimi_default_off"
_C, _L = "engine_pcg_gate.captured_prefill_faster", "engine_pcg_gate.prefill_launches"
_T, _P, _DE, _A = (
    f"engine_pcg_gate.full_width_{k}" for k in ("ttft", "prefill", "decode", "attention"))
_FULL_PREFILL = Claim(
    _P, "bench_one_batch at the real widths and at one TP-4 rank's: pcg-off ÷ enforced prefill "
    "above 1 at 128 tokens, below 1 at 2048", "> 1 + the A/A gap at 128, < 1 − it at 2048; ±15% "
    "or the A/A gap on a rerun", serving.full_prefill, drift=0.15, noise="aa_noise",
    applies=serving.benched, context=("aa_noise", "starts"))
_FULL_DECODE = Claim(
    _DE, "Decode does not change: the decode step (bench_one_batch) and TPOT with one request in "
    "flight (bench_serving), enforced ÷ off",
    f"each within ±{serving.DECODE_SAME:.0%} or twice its own A/A gap, whichever is larger; ±5% "
    "on a rerun", serving.full_decode, drift=0.05,
    context=("aa_noise", "tpot_worst", "tpot_bound", "decode_worst", "decode_bound",
             "busy_moved"), noise="aa_noise", applies=_full_ran)
_FULL_ATTENTION = Claim(
    _A, "Why: inside a piecewise graph the release runs Kimi-K2.5's attention absorbed (MLA), "
    "eager prefill runs it as MHA; from 512 tokens to the largest capture the captured step's "
    "attention kernels take at least twice the eager step's GPU time, the MoE kernels the same",
    "attention ≥ 2× up to 2048 tokens, the same (±10%) at 4096 and for MoE (the launch pass's "
    "kernel time); ±10% on a rerun", serving.full_attention, drift=0.1,
    applies=serving.kernel_timed)
_K = f"{KIMI} {FIXED_RELEASE}"  # the fixed release's Kimi-K2.5 variants: "<_K> enforce", ...
_FULL = serving.MODEL  # Kimi-K2.5 at its real widths
_KF = f"{_FULL} {FIXED_RELEASE}"
_TINY_TOKENS = "–".join(str(f(sglang.ENGINE[0].input_lens)) for f in (min, max))


def _per_release(cid: str) -> str:
    """A claim's value per release of 01-kimi-pcg, as a headline's template."""
    return ", ".join(f"{{v[{cid}][{rel}]}} on {rel}" for rel in sglang.ENGINE[0].releases)


ENGINE = engine_claims(
    EXPERIMENT="engine_pcg_gate",
    CLAIM="In SGLang's own engine (dummy weights), piecewise graphs reach Kimi-K2.5 only where "
    "they are asked for, and only from #26382 on: by default ServerArgs turns them off for a "
    "multimodal model before the gate is asked.",
    CLAIMS=[
        Claim(
            _G, "With --enforce-piecewise-cuda-graph, 0.5.12.post1 refuses Kimi-K2.5 ('not a "
            "language model') and 0.5.13 captures it",
            "before: disabled, 'not a language model'; after: captured (exact)", _kimi_gate,
            applies=_kimi_ran("enforce")),
        Claim(
            _D, "With default flags neither release uses piecewise graphs for Kimi-K2.5: "
            "ServerArgs' own rules turn them off before the gate is asked",
            "disabled on every release (exact)", _default_off, applies=_kimi_ran("default")),
        Claim(
            _C, "Where piecewise graphs are captured, prefill is faster than with them off at "
            "every input length (128–1024 tokens), each side its fastest repeat of any engine "
            "start", "pcg-off / piecewise > 1 + the A/A gap everywhere", _speedup, drift=0.25,
            context=("min", "aa_noise", "margin", "starts"), noise="aa_noise", applies=_paired),
        Claim(
            _L, "Counted, not timed: a captured prefill step replays one graph per piece (layers "
            "+ 1) and launches the same kernels outside them at every token count; where the "
            "release refuses the graphs (0.5.12.post1 with --enforce-piecewise-cuda-graph on "
            "Kimi-K2.5) the step launches exactly what pcg-off launches", "captured: layers + 1 "
            "graphs and one kernel count; refused: 0 graphs and the pcg-off launches (exact, the "
            "launch pass's profiler trace)", _launches),
        Claim(
            _T, "At Kimi-K2.5's real widths (1 dense + 1 MoE layer, the release's server and "
            "bench_serving, the PR's own metric), piecewise graphs do not cut TTFT: enforced ÷ off "
            "is above 1 at 2048 tokens, the largest capture, and at 128 tokens no slower than off, "
            "at 1 and 4 requests in flight (a gain there is a small share of a TTFT and need not "
            "clear the A/A gap)",
            "> 1 + the A/A gap at 2048 tokens, < 1 + it at 128; ±10% or the A/A gap on a rerun",
            serving.ttft, drift=0.1, context=("aa_noise", "starts"), noise="aa_noise",
            applies=serving.served, folded=(_FULL_PREFILL, _FULL_DECODE, _FULL_ATTENTION))
    ],
    # the card's engine answer, one merged run per GPU model: real widths, the gate, the tiny model
    HEADLINE=Headline(
        parts=(
            f"At Kimi-K2.5's real widths (2 of its 61 layers, {FIXED_RELEASE}'s server and "
            f"bench_serving, one GPU) enforcing the graphs makes TTFT at 128- / 2048-token "
            f"prompts {{ttft}}, and decode does not change: on {{gpu}}, TPOT with one "
            f"request in flight within {{v[{_DE}][tpot_worst]:.1%}} of off (bound "
            f"{{v[{_DE}][tpot_bound]:.1%}}), the decode step within {{v[{_DE}][decode_worst]:.1%}} "
            f"(bound {{v[{_DE}][decode_bound]:.1%}})",
            f"bench_one_batch's prefill step there, at 128 / 2048 tokens: {{step}}; a captured "
            f"step launches {{v[{_L}][{_KF} enforce][kernels_min]}} kernels + {{v[{_L}][{_KF} "
            f"enforce][graphs]}} graphs instead of {{v[{_L}][{_KF} pcg-off][kernels_min]}}–"
            f"{{v[{_L}][{_KF} pcg-off][kernels_max]}}",
            "why: inside the graphs the release runs its attention absorbed (MLA), eager as MHA; "
            "absorbed over eager attention's GPU time at 2048 tokens: {absorbed}",
            f"default flags: {_per_release(_D)}",
            f"`--enforce-piecewise-cuda-graph`: {_per_release(_G)}",
            f"on the tiny Kimi-K2.5 ({KIMI}), a captured prefill step launches {{v[{_L}][{_K} "
            f"enforce][kernels_min]}} kernels + {{v[{_L}][{_K} enforce][graphs]}} graphs instead "
            f"of {{v[{_L}][{_K} pcg-off][kernels_min]}}–{{v[{_L}][{_K} pcg-off][kernels_max]}}, "
            f"and pcg-off ÷ captured prefill at {_TINY_TOKENS} tokens is {{runs}}."),
        per_run=dict(
            runs=f"{{v[{_C}][pairs][{_K} enforce][lo]:.2f}}–{{v[{_C}][pairs][{_K} "
            f"enforce][hi]:.2f}}× on {{gpu}} (A/A gap {{v[{_C}][pairs][{_K} "
            f"enforce][aa_noise]:.0%}})",
            ttft=f"{{v[{_T}][128x1]:%lower|higher}} / {{v[{_T}][2048x1]:%lower|higher}} on {{gpu}}",
            step=f"{{v[{_P}][{_FULL}][128 tokens]:/%shorter|longer}} / {{v[{_P}][{_FULL}][2048 "
            f"tokens]:/%shorter|longer}} on {{gpu}}",
            absorbed=f"{{v[{_A}][{_FULL} 2048]:.1f}}× on {{gpu}}"), run_sep=", ",
        sep="\n"))  # a list on the card (one clause each in the README's row)

_B = sglang.PR_BENCHMARK
_TTFT, _TPOT, _E2E = (_B["metrics"][m] for m in ("TTFT", "TPOT", "E2E"))
_R, _CUT = f"{EXPERIMENT}.duplicate_keys", f"{1 - _TTFT[2] / _TTFT[1]:.0%} lower"  # the PR's
_SAME = f"{serving.DECODE_SAME:.0%}"  # the decode bound's floor
CARD = Card(
    bug="SGLang's piecewise-CUDA-graph gate asks `hasattr(model, \"model\")`. Kimi-K2.5's wrapper "
    "keeps its LLM under `language_model`, so the gate refused it (\"not a language model\") and "
    "its prefill ran eager; a plain `self.model = ...` alias passes the gate but registers the "
    "LLM's weights a second time.",
    affects="Kimi-K2.5 served with `--enforce-piecewise-cuda-graph`, and any VLM wrapper without "
    "`.model` that asks for piecewise graphs; with default flags SGLang keeps them off for "
    "multimodal models anyway.",
    found=(("Kimi-K2.5 gets piecewise CUDA graphs: the wrapper now passes the gate",
            f"Only where they are asked for: with default flags they stay "
            f"{{e[{_D}][{FIXED_RELEASE}]}} on {FIXED_RELEASE} (ServerArgs turns them off for a "
            "multimodal model before the gate is asked); with `--enforce-piecewise-cuda-graph` "
            f"{FIXED_RELEASE} has them {{e[{_G}][{FIXED_RELEASE}]}}"),
           (f"TTFT {_TTFT[1]} → {_TTFT[2]} {_TTFT[0]}, {_CUT} ({_B['setup']})",
            f"At Kimi-K2.5's real widths on one {{gpu}} (2 of 61 layers, dummy weights, "
            f"bench_serving) enforcing piecewise graphs makes TTFT "
            f"{{e[{_T}][128x1]:%lower|higher}} at 128-token prompts but "
            f"{{e[{_T}][2048x1]:%lower|higher}} at 2048; bench_one_batch's prefill step at 128 "
            f"tokens is {{e[{_P}][kimi_k25_full][128 tokens]:/%shorter|longer}} at full width (A/A "
            f"gap {{e[{_P}][kimi_k25_full][aa_noise]:.0%}}) and {{e[{_P}][kimi_k25_tp4rank][128 "
            f"tokens]:/%shorter|longer}} at one TP-4 rank's widths, but "
            f"{{e[{_P}][kimi_k25_full][2048 tokens]:/%|}} and {{e[{_P}][kimi_k25_tp4rank][2048 "
            f"tokens]:/%|}} longer at 2048"),
           (f"TPOT {_TPOT[1]} → {_TPOT[2]} {_TPOT[0]}, E2E {_E2E[1]} → {_E2E[2]} {_E2E[0]}",
            f"Not reproduced: TPOT with one request in flight stays within "
            f"{{e[{_DE}][tpot_worst]:.1%}} of off and bench_one_batch's decode step within "
            f"{{e[{_DE}][decode_worst]:.1%}}, each inside its bound: ±{_SAME} or twice its own "
            f"A/A gap, whichever is larger ({{e[{_DE}][tpot_bound]:.1%}} and "
            f"{{e[{_DE}][decode_bound]:.1%}}; decode replays its own CUDA graphs either way); with "
            f"4 in flight TPOT moves up to {{e[{_DE}][busy_moved]:.0%}} as other "
            f"requests' prefills land inside a request's decode; E2E follows TTFT"),
           ("A `__setattr__` guard keeps the LLM registered once",
            f"The rebuild around the measured LLM: {{r[{_R}][property_guard]}} `model.*` keys "
            f"after the gate with the guard, {{r[{_R}][property_only]}} (the LLM's whole key list) "
            "with the property alone; the guard also drops a deliberate `wrapper.model = x` "
            "without an error")))
