"""What every capture_sizes run must show (see :mod:`sglab.core.claims`): four claims, the checks
they rest on folded under them, the review card and the real engine's claims. Trace checks read the
``events`` sidecar (method 2+); the ``cpu_*`` checks are computed from the rebuild."""

from __future__ import annotations

from sglab.capture_sizes import rebuild as fx
from sglab.capture_sizes import show
from sglab.capture_sizes.measure import EXPERIMENT, GPUS, loop_order, size_lists  # noqa: F401
from sglab.core import runs
from sglab.core.card import Card
from sglab.core.claims import Claim, Headline, engine_claims, holds


CLAIM = ("With `--moe-dense-tp-size 1`, a piecewise capture size not divisible by the attention-TP "
         "size splits into unequal shards that the reduce-scatter refuses, which crashed start-up; "
         "dropping those sizes (the PR) or rounding them up (SGLang today) leaves only sizes that "
         "capture and replay exactly.")
SCALED = "the default list scaled by W/8 (so TP 8's bad sizes recur)"


def _w(run) -> int:
    return int(run.manifest.params["world_size"])


def _lists(run) -> dict:
    p = run.manifest.params
    return size_lists(_w(run), p.get("sizes", "scaled"), int(p.get("max_tokens", 2048)))


def _join(sizes) -> str:
    return ", ".join(str(n) for n in sizes) or "none"


def _probe_sizes(run, metric: str | None = None) -> list[int]:
    d = run.df[run.df.variant == "before_probe"]
    if metric:
        d = d[d.metric == metric]
    return sorted(d["size"].astype(int).unique())


# -- the claims a reader checks --------------------------------------------------------------------
def _refused(run):
    w, f = _w(run), show.run_facts(run)
    raw, accepted, refused = _probe_sizes(run), _probe_sizes(run, "ok"), sorted(f["refused_sizes"])
    want = [n for n in raw if n % w]
    scaled = run.manifest.params.get("sizes", "scaled") == "scaled"
    value = dict(refused=_join(refused), n_refused=len(refused), n_accepted=len(accepted),
                 sizes=len(raw), list=SCALED if scaled else "the default list")
    return holds(
        refused == want and accepted == [n for n in raw if n % w == 0],
        f"refused {_join(refused)} of {len(raw)} sizes at W={w}", value,
        why_not=f"refused {_join(refused)}, accepted {len(accepted)}; expected refused "
        f"= {_join(want)}")


def _stops_first_bad(run):
    w, f = _w(run), show.run_facts(run)
    raw = _lists(run)["before"]
    order = loop_order(raw)
    first = next(i for i, (_, n) in enumerate(order) if n % w)
    stage, n = order[first]
    captured = [m for s, m in order[:first] if s == "capture"]
    d = run.df[run.df.variant == "before"]
    err = str(d.loc[d.metric == "failed", "error"].iloc[0])
    not_reached = int(d.loc[d.metric == "not_reached", "value"].sum())
    ok = (f["before_stopped_at"] == n and f["before_stage"] == stage
          and err.startswith("UnequalShards") and f["before_captured"] == len(captured)
          and f["before_captured"] + 1 + not_reached == len(raw))
    value = dict(stopped_at=f["before_stopped_at"], stage=f["before_stage"],
                 captured=f["before_captured"])
    return holds(
        ok, f"stopped at {f['before_stopped_at']} ({f['before_stage']}), "
        f"{err.split(':')[0]}; {f['before_captured']} captured before it", value,
        why_not=f"expected a stop at {n} ({stage}) with UnequalShards after "
        f"{len(captured)} captures")


def _has_bad(run) -> str | None:
    w = _w(run)
    return None if any(n % w for n in _lists(run)["before"]) else (
        f"no raw size is indivisible by W={w} here (sizes={run.manifest.params.get('sizes')!r}): "
        "nothing to stop at")


def _replays(variant: str):

    def check(run):
        f = show.run_facts(run)
        n, cap, ok, err = (f[f"{variant}_buckets"], f[f"{variant}_captured"],
                           f[f"{variant}_replayed_ok"], f[f"{variant}_max_abs_err"])
        return holds(
            n == cap == ok == len(_lists(run)[variant]) and err == 0.0,
            f"{min(cap, ok)}/{n} buckets captured + replayed "
            f"({f[f'{variant}_replays']} replays), max abs err {err:g}",
            {"buckets": n, "replayed_ok": ok, "max_abs_err": err})

    return check


# -- the checks folded under them ------------------------------------------------------------------
def _pr_keeps_accepted(run):
    accepted = _probe_sizes(run, "ok")
    kept = sorted(run.df.loc[run.df.variant == "pr_filter", "size"].astype(int).unique())
    return holds(
        kept == accepted, f"PR list {len(kept)} sizes, accepted {len(accepted)}",
        {"kept": len(kept)}, why_not="PR list differs from the accepted sizes: "
        f"{sorted(set(kept) ^ set(accepted))}")


def _cpu_tp8(run):
    d = fx.default_piecewise_capture_sizes(2048)
    kept = fx.policy_lists(d, 8)["pr_filter"]
    dropped = [n for n in d if n not in kept]
    return holds(dropped == [4, 12, 20, 28],
                 f"computed: drops {_join(dropped)}; keeps {len(kept)} of {len(d)}",
                 {"dropped": _join(dropped), "kept": len(kept), "sizes": len(d)})


def _cpu_mul_base(run):
    tp, cp, d = 4, 6, fx.default_piecewise_capture_sizes(2048)
    base, lcm = fx.piecewise_mul_base(tp, cp), fx.lcm_base(tp, cp)
    return holds((base, lcm) == (24, 12), f"computed: mul_base {base}, lcm {lcm}",
                 dict(mul_base=base, lcm=lcm, tp=tp, cp=cp, kept=sum(n % base == 0 for n in d),
                      kept_lcm=sum(n % lcm == 0 for n in d), cp_divides=2,
                      base_cp_divides=fx.piecewise_mul_base(tp, 2), product=fx.comment_base(tp, 2)))


def _traced(run) -> str | None:
    off = run.manifest.params.get("profile") is False
    return "run without the traced pass (profile=False)" if off else None


def _graphs(run) -> bool:
    """CUDA-graph capture happened (NCCL on GPUs); gloo runs on the CPU capture nothing."""
    return run.manifest.params.get("backend", "nccl") == "nccl"


def _needs_graphs(run) -> str | None:
    return _traced(run) or (None if _graphs(run) else
                            "gloo run on the CPU: no CUDA graph, no NCCL kernel")


def _ranges(run):

    def make():
        ev = run.sidecar("events")
        if ev is None:
            raise ValueError("the run has no `events` sidecar (the traced pass's event table)")
        return show.capture_ranges(ev)

    return run.memo("capture_ranges", make)


def _trace_marks(run):
    w, lists, cr = _w(run), _lists(run), _ranges(run)
    bad = []
    for rank in range(w):
        for variant, sizes in {"before": lists["before"], "after": lists["pr_filter"]}.items():
            got = cr[(cr["rank"] == rank) & (cr.variant == variant)]
            if [(s, int(n)) for s, n in zip(got.stage, got["size"])] != [
                ("warmup" if s == "jit_warmup" else "capture", n) for s, n in loop_order(sizes)
            ]:
                bad.append(f"rank {rank} {variant}: ranges differ from the loop order")
            marks = sorted(set(got.loc[got.refused, "size"].astype(int)))
            if marks != sorted({n for n in sizes if n % w}):
                bad.append(f"rank {rank} {variant}: refused {_join(marks)}")
    marks = sorted(
        set(cr.loc[(cr["rank"] == 0) & (cr.variant == "before") & cr.refused, "size"].astype(int)))
    text = "; ".join(bad) or f"{w} ranks; refused marks before: {_join(marks)}; after: none"
    return holds(not bad, text, {"refused_marks": _join(marks), "ranks": int(cr["rank"].nunique())})


def _trace_no_collective(run):
    cr = _ranges(run)
    refused, accepted = cr[cr.refused], cr[~cr.refused & (cr.stage == "capture")]
    calls = int(refused.reduce_scatters.sum() + refused.all_gathers.sum())
    kernels = int(refused.kernels.sum())
    want = 2 + int(_graphs(run))  # two eager runs, plus the call made under capture
    got = sorted(set(accepted.reduce_scatters) | set(accepted.all_gathers))
    return holds(
        calls == 0 and kernels == 0 and len(accepted) > 0 and got == [want],
        f"refused: {calls} collective calls, {kernels} kernels; accepted captures: "
        f"{_join(got)} reduce-scatters / all-gathers each",
        {"refused_collectives": calls, "refused_kernels": kernels, "calls_per_capture": _join(got)},
        why_not=f"expected 0 in refused ranges and {want} of each per accepted capture")


def _trace_capture_runs_nothing(run):
    cr = _ranges(run)
    accepted = cr[~cr.refused & (cr.stage == "capture")]
    got = sorted(set(accepted.nccl_kernels))
    return holds(
        len(accepted) > 0 and got == [4],
        f"{_join(got)} NCCL kernels per accepted capture ({len(accepted)} ranges)",
        {"nccl_kernels": _join(got)})


_TRACE = dict(methods=(2, None), applies=_traced)
CLAIMS = [
    Claim(
        "capture_sizes.refused_iff_indivisible",
        "Without the shard check, the reduce-scatter refuses exactly the raw capture sizes not "
        "divisible by the world size W (attention TP) and accepts every other",
        "refused == {n : n % W ≠ 0} (exact; W=2: 1, 3, 5, 7; W=4: 2, 6, 10, 14 on the scaled list)",
        _refused, folded=(Claim(
            "capture_sizes.trace_refused_marked",
            "In the traced capture loop, every rank has one range per size in the runner's order, "
            "and the refused marks are exactly the sizes not divisible by W before the filter, "
            "and none after", "ranges == loop order; marks == {n : n % W ≠ 0} before, none after "
            "(exact)", _trace_marks, **_TRACE),)),
    Claim(
        "capture_sizes.before_stops_at_first_bad",
        "The unfiltered capture loop (warm-up at the smallest size, then largest first) stops at "
        "the first size not divisible by W, with UnequalShards raised before any collective; the "
        "rest is never reached", "stop size, stage and captures before it == the loop order's "
        "first indivisible size (exact)", _stops_first_bad, applies=_has_bad, folded=(Claim(
            "capture_sizes.trace_refused_no_collective",
            "A refused size's range issues no collective and runs no kernel; every accepted "
            "capture issues the boundary's reduce-scatter and all-gather for each eager run and "
            "for the call under capture", "refused: 0 calls, 0 kernels; accepted: 3 of each (2 on "
            "gloo, no capture) (exact)", _trace_no_collective, **_TRACE),)),
    Claim(
        "capture_sizes.pr_filter_replays_exactly",
        "Every bucket of the PR-filtered list captures, and replays real token counts padded to "
        "it exactly", "captured = replayed = buckets; max abs err == 0 (exact)",
        _replays("pr_filter"), folded=(
            Claim("capture_sizes.pr_filter_keeps_accepted",
                  "The PR's filter keeps exactly the raw sizes the reduce-scatter accepts",
                  "PR list == accepted (exact)", _pr_keeps_accepted),
            Claim(
                "capture_sizes.cpu_tp8_drops_4_12_20_28",
                "Computed from the rebuild: at attention TP 8 the PR's filter drops exactly 4, 12, "
                "20 and 28 of the 42 default sizes (max 2048)",
                "== 4, 12, 20, 28 (exact; holds on any run)", _cpu_tp8),
            Claim(
                "capture_sizes.cpu_mul_base_not_lcm",
                "Computed from the rebuild: at attention TP 4, CP 6 the PR's mul_base is 24, twice "
                "the least common multiple 12", "mul_base 24, lcm 12 (exact; holds on any run)",
                _cpu_mul_base),
            Claim(
                "capture_sizes.trace_capture_launches_nothing",
                "On the GPU, each accepted capture runs the NCCL kernels of its two eager runs "
                "only: the collectives called under graph capture are recorded into the graph, not "
                "run", "== 4 NCCL kernels per accepted capture (exact)",
                _trace_capture_runs_nothing, methods=(2, None), applies=_needs_graphs))),
    Claim(
        "capture_sizes.round_up_replays_exactly",
        "Every bucket of the rounded-up list captures, and replays real token counts padded to "
        "it exactly", "captured = replayed = buckets; max abs err == 0 (exact)",
        _replays("round_up")),
]


def shown(runs_: list) -> list:
    """The newest run per GPU model and world size, by GPU model then world size."""
    return runs.newest(runs_, lambda r: (runs.gpu_short(r), _w(r)))


_R, _S = "capture_sizes.refused_iff_indivisible", "capture_sizes.before_stops_at_first_bad"
_P, _U = "capture_sizes.pr_filter_replays_exactly", "capture_sizes.round_up_replays_exactly"
HEADLINE = Headline(
    parts=(f"On {{v[{_R}][list]}}: {{runs}}.",),
    per_run=(f"{{gpu}} TP {{world}}: refused {{v[{_R}][refused]}} of {{v[{_R}][sizes]}} sizes, the "
             f"unfiltered loop stopped at {{v[{_S}][stopped_at]}}; PR filter "
             f"{{v[{_P}][replayed_ok]}}/{{v[{_P}][buckets]}} and round-up "
             f"{{v[{_U}][replayed_ok]}}/{{v[{_U}][buckets]}} buckets captured + replayed, max abs "
             f"err {{v[{_P}][max_abs_err]:g}}"))


# -- the real engine (``scripts/engine_gpu.sh --plan 06``: data/recorded/engine_capture_sizes/) ----
def _unfiltered(run) -> list[dict]:
    facts = show.engine_facts(run)
    return [f for f in facts if f["rule"] == "before" and any(n % f["attn_tp"] for n in f["asked"])]


def _filtered(run) -> list[dict]:
    return [f for f in show.engine_facts(run) if f["rule"] == "pr_filter"]


def _tps(facts) -> str:
    return " and ".join(dict.fromkeys(str(f["attn_tp"]) for f in facts))


def _engine_fails(run):
    facts = _unfiltered(run)
    bad = [f for f in facts if f["status"] == "ok" or not show.UNEQUAL.search(f["status"])]
    first = show.first_line(facts[0]) if facts else ""
    releases = ", ".join(dict.fromkeys(f["release"] for f in facts))  # once each, as asked
    return holds(
        not bad, f"{releases} at attention TP {facts[0]['attn_tp'] if facts else '?'}: {first}", {
            "releases": releases, "message": first, "tps": _tps(facts),
            "asked": _join(facts[0]["asked"]) if facts else ""
        }, why_not="; ".join(f"{f['release']}: {f['status'][:120]}" for f in bad))


def _engine_filter(run):
    facts = _filtered(run)
    keeps = fx.filter_piecewise_capture_sizes
    want = {f["release"]: keeps(f["asked"], f["attn_tp"]) for f in facts}
    bad = [f for f in facts if f["status"] != "ok" or f["captured"] != want[f["release"]]]
    f0 = facts[0] if facts else {}
    asked, captured = _join(f0.get("asked", [])), _join(f0.get("captured") or [])
    each = "; ".join(
        f"{_join(f['asked'])} → {_join(f['captured'] or [])} at TP {f['attn_tp']}" for f in facts)
    value = dict(release=f0.get("release"), asked=asked, captured=captured,
                 rebuild=_join(want.get(f0.get("release"), [])), tps=_tps(facts), each=each)
    return holds(
        not bad, f"{f0.get('release')} asked {asked} at attention TP {f0.get('attn_tp')}: captured "
        f"{captured}", value, why_not="; ".join(
            f"{f['release']}: {f['status'][:80]}, captured {f['captured']}, the rebuild's filter "
            f"keeps {want[f['release']]}" for f in bad))


_F = "engine_capture_sizes.unfiltered_release_fails"
_K = "engine_capture_sizes.filtered_release_captures_pr_filter"
ENGINE = engine_claims(
    EXPERIMENT="engine_capture_sizes",
    CLAIM="SGLang's own engine (a DeepSeek-V3-style tiny model, dummy weights, "
    "`--moe-dense-tp-size 1`): a release without #23972's filter fails at start-up on capture "
    "sizes the attention-TP size does not divide; a release with it starts and captures exactly "
    "the sizes the rebuild's filter keeps.", CLAIMS=[
        Claim(
            _F, "A release without the filter, asked for piecewise sizes the attention-TP size "
            "does not divide, stops at start-up with SGLang's own message about unequal sizes",
            "status == error naming unequal shards or sizes (exact)", _engine_fails,
            applies=lambda r: None if _unfiltered(r) else "no release without the filter was "
            "asked for sizes the attention-TP size does not divide"),
        Claim(
            _K, "A release with the filter starts and captures exactly the sizes the rebuild's "
            "PR filter keeps of the same list at the same attention-TP size",
            "captured == filter_piecewise_capture_sizes(asked, attn TP) (exact)", _engine_filter,
            applies=lambda r: None if _filtered(r) else "no release with the PR's filter in this "
            "run")
    ], HEADLINE=Headline(
        parts=(f"{{v[{_F}][releases]}} fails at start-up at attention TP {{v[{_F}][tps]}}: "
               f"`{{v[{_F}][message]}}`.",
               f"{{v[{_K}][release]}} starts at TP {{v[{_K}][tps]}} and captures what the "
               f"rebuild's filter keeps ({{v[{_K}][each]}})."), sep=" "))

# -- the review card (sglab.core.card): the PR's words are its own code comment --------------------
_T8, _MB = "capture_sizes.cpu_tp8_drops_4_12_20_28", "capture_sizes.cpu_mul_base_not_lcm"
CARD = Card(
    bug="With dense layers at TP 1 (`--moe-dense-tp-size 1`) the layer communicator "
    "reduce-scatters tokens over the attention-TP ranks, and the piecewise CUDA-graph runner "
    "captured a dummy batch of every configured size: a size the attention-TP size does not divide "
    "splits into unequal shards, the reduce-scatter refuses them and the server fails at start-up.",
    affects="DeepSeek-V3-style models served with `--moe-dense-tp-size 1` and piecewise CUDA "
    "graphs, at an attention-TP size that does not divide every capture size (TP 8 does not divide "
    "the smallest default sizes). The releases that lost the fix fail at start-up again:",
    found=((
        "\"Drop captures that would violate this (mirrors the filter used by the regular CUDA "
        "graph runner)\"", f"It drops sizes: {{r[{_T8}][dropped]}} of the {{r[{_T8}][sizes]}} "
        f"default sizes at attention TP 8, and every bucket it keeps captures and replays exactly "
        f"({{r[{_P}][replayed_ok]}}/{{r[{_P}][buckets]}} in the rebuild's NCCL run). The filter "
        f"was lost when the runners were unified: {{e[{_F}][releases]}} fails at start-up again at "
        f"TP {{e[{_F}][tps]}}; the rewrite after it rounds every size up instead of dropping it."),
           ("\"the model's reduce_scatter requires the token count to be divisible by "
            "attn_tp_size * attn_cp_size\"",
            f"The code asks for a common multiple of attention TP and CP, not always that product "
            f"nor the least one: at TP {{r[{_MB}][tp]}}, CP {{r[{_MB}][cp_divides]}} it keeps "
            f"multiples of {{r[{_MB}][base_cp_divides]}}, not {{r[{_MB}][product]}}; at TP "
            f"{{r[{_MB}][tp]}}, CP {{r[{_MB}][cp]}} multiples of {{r[{_MB}][mul_base]}} where "
            f"{{r[{_MB}][lcm]}} would do ({{r[{_MB}][kept]}} sizes kept, not "
            f"{{r[{_MB}][kept_lcm]}})."),
           ("\"mirrors the filter used by the regular CUDA graph runner\"",
            "Not under two-batch overlap: the decode runner doubles its base there, the piecewise "
            "filter does not (tables in the appendix).")))
