"""What every breakable_graph run must show (see :mod:`sglab.core.claims`): four claims a reader
checks, the checks folded under them; the engine's two (``ENGINE``); the review card."""

from __future__ import annotations

from sglab.breakable_graph import show
from sglab.breakable_graph.measure import EXPERIMENT, GPUS, launch_numbers, stream
from sglab.core import engine_records, engine_stats, runs
from sglab.core.card import Card
from sglab.core.claims import Claim, Headline, engine_claims, holds, not_applicable
from sglab.sglang.releases import parse_version


CLAIM = ("Capturing only the layer stack lets one breakable CUDA graph serve prefill batches of "
         "any request count.")
LAUNCH_BOUND = show.LAUNCH_BOUND  # after vs eager, 2+ requests: launch-bound up to here
MIN_LAUNCH_BOUND_SPEEDUP, MIN_SPEEDUP = 1.8, 1.1
# not held against a rerun: single cells move with the host, and the A/A gap is the run's own noise
RERUN_MOVES = ("min", "max", "min_launch_bound", "aa_noise", "aa_margin", "margin")
PADDED_TOL = 0.0  # padded token counts: the recorded runs show bit-equal logits there too


def _layers(run) -> int:
    return int(run.manifest.params.get("num_layers", 16))


# -- the claims a reader checks --------------------------------------------------------------------
def _bs3(run):
    a = show.bs3_table(run.df)
    rows = {v: int(a.loc[v, "logit_rows"]) for v in ("eager", "before", "after")}
    can = {v: int(a.loc[v, "can_run"]) for v in ("before", "after")}
    ok = rows == {"eager": 3, "before": 1, "after": 3} and can == {"before": 0, "after": 1}
    value = {**rows, **{f"can_run_{k}": v for k, v in can.items()}}
    return holds(
        ok, f"3 requests: before graph returns {rows['before']} row, can_run "
        f"{bool(can['before'])}; after {rows['after']} rows, can_run {bool(can['after'])}", value)


def _matches(run):
    m = show.match_table(run.df)
    exact, padded = m[~m["padded"]], m[m["padded"]]
    worst_exact = float(exact["max abs diff"].max())
    worst_padded = float(padded["max abs diff"].max()) if len(padded) else 0.0
    ok = bool(m["rows == requests"].all()) and worst_exact == 0.0 and worst_padded <= PADDED_TOL
    return holds(
        ok, f"one row per request in every batch; max abs diff {worst_exact:g} at "
        f"bucket-sized token counts, {worst_padded:g} padded",
        {"exact": worst_exact, "padded": worst_padded, "worst": max(worst_exact, worst_padded)})


def _hit_rate(run):
    """Each runner's graph batches against the (seeded) stream recomputed from the run's params."""
    h, p = show.hit_rates(run.df), run.manifest.params
    shapes = stream(p)
    fits = [s for s in shapes if s.num_tokens <= max(int(n) for n in p["capture_num_tokens"])]
    want = {"before": sum(s.batch_size == 1 for s in fits), "after": len(fits)}
    got = {v: int(h[v]["graph_batches"]) for v in ("before", "after")}
    ok = got == want and got["before"] < got["after"]
    hb, ha = h["before"]["hit_rate"], h["after"]["hit_rate"]
    return holds(
        ok, f"{got['before']} → {got['after']} of {len(shapes)} batches ({hb:.1%} → "
        f"{ha:.1%}); the stream predicts {want['before']} → {want['after']}",
        {"before": hb, "after": ha})


def _speedup(run):
    v = show.speedups(run.df)
    if not v:
        return not_applicable("no prefill with 2+ requests was timed")
    t = show.latency_of(run)
    multi = t[t["batch_size"] > 1]  # the cells speedups() reads
    bs, n = multi["batch_size"], multi["num_tokens"]
    small, aa = v["min_launch_bound"], v["aa_noise"]
    # every cell clears the bar, and 1 + its own A/A gap (the same eager code timed beside it)
    margin = min(v["min"] - MIN_SPEEDUP, v["aa_margin"] if aa is not None else float("inf"))
    ok = margin > 0 and (small is None or small >= MIN_LAUNCH_BOUND_SPEEDUP)
    bound = "none" if small is None else f"≥{small:.2f}×"
    noise = "no A/A" if aa is None else f"A/A ≤ {aa:.1%}, cleared by {v['aa_margin']:+.2f}×"
    return holds(
        ok, f"after vs eager, 2+ requests: {v['min']:.2f}–{v['max']:.2f}× (median "
        f"{v['median']:.2f}×; {bound} up to {LAUNCH_BOUND} tok; {noise})",
        dict(**v, margin=margin, requests_min=int(bs.min()), requests_max=int(bs.max()),
             tokens_min=int(n.min()), tokens_max=int(n.max())))


# -- the checks folded under them ------------------------------------------------------------------
def _routing(run):
    d = run.df[(run.df["part"] == "d_latency") & (run.df["metric"] == "used_graph")]
    before, after = ({int(r.batch_size): int(r.value)
                      for r in d[d.variant == v].itertuples()} for v in ("before", "after"))
    ok = all(v == int(bs == 1) for bs, v in before.items()) and all(v == 1 for v in after.values())
    return holds(
        ok, f"before uses its graph for {sorted(b for b, v in before.items() if v)} "
        f"request(s), after for {sorted(b for b, v in after.items() if v)}",
        {"before": before, "after": after})


def _segments(run):
    seg, layers = show.segment_table(run.df), _layers(run)
    ok = all((seg[(b, "graph_segments")] == layers + 1).all() and (seg[(
        b, "eager_breaks")] == layers).all() for b in ("before", "after"))
    return holds(
        ok, f"{len(seg)} buckets × 2 boundaries: {layers + 1} segments, {layers} breaks "
        "each" if ok else f"segments/breaks per bucket: {seg.to_dict()}", {"buckets": len(seg)})


def _launches(run):
    lt, layers = show.launch_table(run.df), _layers(run)
    after = lt.xs("after", level="variant")
    multi = lt[lt.index.get_level_values("batch_size") > 1].xs("before", level="variant")
    ok = (after["host_graph_launches"] == layers + 1).all() and \
        after["host_kernel_launches"].nunique() == 1 and (multi["host_graph_launches"] == 0).all()
    return holds(
        bool(ok), f"after: {int(after['host_graph_launches'].iloc[0])} graph + "
        f"{int(after['host_kernel_launches'].iloc[0])} kernel launches at every request count; "
        f"before with 2+ requests: {int(multi['host_graph_launches'].max())} graph launches, "
        f"{int(multi['host_kernel_launches'].min())} kernel launches",
        {"after_kernel_launches": int(after["host_kernel_launches"].iloc[0])})


def _trace(run):
    ev = run.sidecar("events")
    if ev is None:
        return not_applicable("this run has no events sidecar (it predates profiler traces)")
    layers = _layers(run)
    n = {v: launch_numbers(g) for v, g in ev.groupby("variant")}
    ok = n["before"]["host_graph_launches"] == 0 and n["after"]["host_graph_launches"] == layers + 1
    ok = ok and n["after"]["host_kernel_launches"] < n["before"]["host_kernel_launches"]
    return holds(
        ok, f"3-request prefill: before {n['before']['host_graph_launches']} graph / "
        f"{n['before']['host_kernel_launches']} kernel launches, after "
        f"{n['after']['host_graph_launches']} / {n['after']['host_kernel_launches']}", n)


_ID = EXPERIMENT + "."
_ROUTING = Claim(
    _ID + "routing", "The before runner replays only one-request batches; the after runner every "
    "batch", "used_graph: before iff 1 request; after always (exact)", _routing)
_SEGMENTS = Claim(
    _ID + "segments_per_bucket", "Every capture is one segment more than the layers, one break "
    "per layer", "segments == layers + 1, breaks == layers, every bucket, both boundaries (exact)",
    _segments)
_LAUNCHES = Claim(
    _ID + "launches", "The after runner launches the same graphs and kernels for any request "
    "count", "after: layers + 1 graph launches and equal kernel launches at every request count; "
    "before with 2+ requests: 0 graph launches (exact)", _launches)
_TRACE = Claim(
    _ID + "trace_3_requests", "In the profiler, the 3-request prefill is eager before and graph "
    "segments after", "before: 0 graph launches; after: layers + 1, fewer kernel launches (exact)",
    _trace, methods=(3, None))
CLAIMS = [
    Claim(
        _ID + "before_bs3_one_row", "The graph captured with the logits tail returns one logit "
        "row for 3 requests, so can_run rejects the batch",
        "before: 1 row, can_run False; after and eager: 3 rows (exact)", _bs3, folded=(_ROUTING,)),
    Claim(_ID + "after_equals_eager",
          "The layer-stack graph's logits equal eager prefill for every "
          "request count", "one row per request; max abs diff 0 (bucket-sized and padded token "
          "counts)", _matches, folded=(_SEGMENTS,)),
    Claim(
        _ID + "hit_rate", "On the seeded mixed stream only single-request batches hit the before "
        "graph; every batch that fits a bucket hits the after graph", "graph batches == "
        "recomputed from the stream (exact), before < after", _hit_rate),
    Claim(
        _ID + "multi_request_speedup", "Prefills of 2+ requests run faster through the after "
        "graph than eagerly", f"eager/after > {MIN_SPEEDUP}× and > 1 + its A/A gap (before ÷ "
        f"eager) for every timed batch of 2+ requests, ≥ {MIN_LAUNCH_BOUND_SPEEDUP}× up to "
        f"{LAUNCH_BOUND} tokens", _speedup, drift=0.25, context=RERUN_MOVES, noise="aa_noise",
        folded=(_LAUNCHES, _TRACE))
]


def shown(runs_: list) -> list:
    """The newest run of each GPU model, ordered by GPU name."""
    return runs.newest(runs_, runs.gpu_short)


_H, _S, _M = _ID + "hit_rate", _ID + "multi_request_speedup", _ID + "after_equals_eager"
HEADLINE = Headline(
    parts=(f"Graph hit rate {{v[{_H}][before]:.0%}} → {{v[{_H}][after]:.0%}} of a "
           "mixed prefill stream", f"{{lo[{_S}][requests_min]}}–{{hi[{_S}][requests_max]}}-request "
           f"prefills of {{lo[{_S}][tokens_min]}}–{{hi[{_S}][tokens_max]}} tokens "
           "vs eager: {runs}", f"logits max abs diff vs eager {{hi[{_M}][worst]:.3g}}."),
    per_run=f"{{gpu}} {{v[{_S}][min]:.2f}}–{{v[{_S}][max]:.2f}}× (median {{v[{_S}][median]:.2f}}×"
    "{across})", across=f"; medians {{lo[{_S}][median]:.2f}}–{{hi[{_S}][median]:.2f}}× over {{n}} "
    "runs")

# -- the real engine (``sglab engine --plan 03``: data/recorded/engine_breakable_graph/) -----------
# the last release without #24662, and the release with it that the engine runs use
BEFORE_RELEASE, AFTER_RELEASE = "0.5.11", "0.5.12.post1"


def _on_graph(run) -> dict:
    """``{release: {requests: fraction of prefill batches on the graph}}`` of the bcg case."""
    d = engine_stats.numbers(engine_records.frame([run]), "prefill_graph", only_started=True)
    d = d[d.case == "bcg"]
    return {
        r: dict(zip(g.requests.astype(int), g.value.astype(float)))
        for r, g in d.groupby("release")
    }


def _engine_graph(run):
    found = _on_graph(run)
    expect = {
        rel: {n: float(n == 1 or parse_version(rel) >= parse_version(AFTER_RELEASE))
              for n in per}
        for rel, per in found.items()
    }
    on = {rel: [n for n, x in per.items() if x == 1] for rel, per in found.items()}
    text = "; ".join(f"{rel}: on the graph for {', '.join(map(str, on[rel]))} of "
                     f"{', '.join(map(str, per))} requests" for rel, per in found.items())
    most = {r: max(ns, default=0) for r, ns in on.items()}  # the most requests a graph prefill held
    return holds(found == expect, text, {**{r: len(ns) for r, ns in on.items()}, "most": most})


def _ratios(run) -> dict:
    """``{requests: eager / bcg}`` on the release with #24662."""
    per = show.eager_over_graph(engine_records.frame([run])).get(AFTER_RELEASE, {})
    return {n: x[0] for n, x in per.items()}


def _engine_faster(run):
    ratios = _ratios(run)
    lo, hi = min(ratios.values()), max(ratios.values())
    df = engine_records.frame([run])  # the gain must clear the A/A gap (eager started twice)
    noise, starts, how = engine_stats.bar(df[df.release == AFTER_RELEASE], "latency", "requests",
                                          engine_stats.STAT)
    return holds(
        lo > 1.0 + noise, f"{AFTER_RELEASE}: eager / breakable graph {lo:.2f}–{hi:.2f}× over "
        f"{', '.join(map(str, ratios))} requests (Engine.generate, 1 output token, {how})",
        dict(min=lo, max=hi, aa_noise=noise, margin=lo - 1.0 - noise, starts=starts,
             requests_min=min(ratios), requests_max=max(ratios)))


def _graph_ran(run):
    return None if _on_graph(run) else "no bcg case of this run started"


def _timed(run):
    return None if _ratios(run) else f"no {AFTER_RELEASE} bcg and eager cases"


_G = "engine_breakable_graph.graph_per_request_count"
_F = "engine_breakable_graph.faster_than_eager"
ENGINE = engine_claims(
    EXPERIMENT="engine_breakable_graph",
    CLAIM="In SGLang's own engine (Llama-style 32 x 512, dummy weights), "
    "`--enable-breakable-cuda-graph` runs a prefill of several requests on the graph only from "
    "#24662 on.", CLAIMS=[
        Claim(
            _G, f"With the breakable CUDA graph on, {BEFORE_RELEASE} puts a prefill on the graph "
            f"only when it holds one request; {AFTER_RELEASE} (with #24662) for every request "
            "count", "before #24662: 1 request only; after: all (exact, the scheduler's own "
            "'Prefill batch' log)", _engine_graph, applies=_graph_ran),
        Claim(
            _F, f"On {AFTER_RELEASE}, the breakable graph beats eager prefill at every request "
            "count", "eager / graph > 1 at every count", _engine_faster, applies=_timed, drift=0.25,
            noise="aa_noise", context=("aa_noise", "margin", "starts", "requests_min",
                                       "requests_max"))
    ], HEADLINE=Headline(
        parts=(f"The scheduler's own log: {BEFORE_RELEASE} puts a prefill on the graph only with "
               f"{{v[{_G}][most][{BEFORE_RELEASE}]}} request, {AFTER_RELEASE} with up to "
               f"{{v[{_G}][most][{AFTER_RELEASE}]}}", f"eager ÷ breakable graph on "
               f"{AFTER_RELEASE}, {{lo[{_F}][requests_min]}}–{{hi[{_F}][requests_max]}} requests, "
               "one `Engine.generate` call of 1 output token: {runs}."),
        per_run=f"{{gpu}} {{v[{_F}][min]:.2f}}–{{v[{_F}][max]:.2f}}× (A/A gap "
        f"{{v[{_F}][aa_noise]:.1%}})"))

# -- the review card -------------------------------------------------------------------------------
_B = _ID + "before_bs3_one_row"
CARD = Card(
    bug="Before #24662 the breakable CUDA graph captured the whole forward, logits tail included, "
    "for one request, so `can_run` refused every prefill batch of two or more requests: they ran "
    "eagerly.",
    affects="Servers started with `--enable-breakable-cuda-graph` (experimental) whose prefill "
    "batches hold several requests; with #24662, a model whose layer stack is not at "
    "`.model.layers` gets no graph at all (a `[BCG]` warning).",
    found=(("Its title: “Breakable Cuda Graph Support for bs > 1”.",
            f"In the engine {AFTER_RELEASE} runs prefills of up to "
            f"{{e[{_G}][most][{AFTER_RELEASE}]}} requests on the graph ({BEFORE_RELEASE}: "
            f"{{e[{_G}][most][{BEFORE_RELEASE}]}} request only), a whole `Engine.generate` call "
            f"{{e[{_F}][min]:.2f}}–{{e[{_F}][max]:.2f}}× faster than eager on {{gpu}}; the "
            f"rebuild's forward alone {{r[{_S}][min]:.2f}}–{{r[{_S}][max]:.2f}}× on {{rgpu}} (the "
            "engine's call also tokenizes, schedules and decodes, off the graph)."),
           ("The code: capture only `layer_model`; the logits tail runs eagerly with the live "
            "batch.",
            f"The rebuild's layer-stack graph returns one logit row per request, equal to "
            f"eager (max abs diff {{r[{_M}][worst]:g}}); the whole-forward graph replayed for 3 "
            f"requests returns {{r[{_B}][before]}} row."),
           ("The review: finding `layer_model` by attribute names is fragile; a failure must at "
            "least say so.", "It says so: the released runner (0.5.12.post1, 0.5.13, run on the "
            "CPU) turns itself off with a `[BCG]` warning where the stack is under `.transformer` "
            "or one wrapper deeper; later SGLang walks the `.model` chain (#30006).")))
