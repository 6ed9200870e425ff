"""What every breakable_graph run must show (see :mod:`sglab.core.claims`)."""

from __future__ import annotations

from sglab.breakable_graph.sglang import FIX

import statistics

from sglab.core.claims import Claim, holds, not_applicable, values
from sglab.experiments.breakable_graph import analysis as an

EXPERIMENT = "breakable_graph"
GPUS = FIX.gpus

CLAIM = "Capturing only the layer stack lets one breakable CUDA graph serve prefill batches of any request count."

# after vs eager, every timed prefill of 2+ requests: launch-bound up to LAUNCH_BOUND tokens; above, the gain is
# eager's host overhead alone and shrinks on a faster host
LAUNCH_BOUND = 512
MIN_LAUNCH_BOUND_SPEEDUP = 1.8
MIN_SPEEDUP = 1.1
PADDED_TOL = 0.0          # padded token counts: the recorded runs show bit-equal logits there too


def _bs3(run):
    a = an.bs3_table(run.df)
    rows = {v: int(a.loc[v, "logit_rows"]) for v in ("eager", "before", "after")}
    can = {v: int(a.loc[v, "can_run"]) for v in ("before", "after")}
    ok = rows == {"eager": 3, "before": 1, "after": 3} and can == {"before": 0, "after": 1}
    return holds(ok, f"3 requests: before graph returns {rows['before']} row, can_run {bool(can['before'])}; after "
                     f"{rows['after']} rows, can_run {bool(can['after'])}", {**rows, **{f"can_run_{k}": v
                                                                                  for k, v in can.items()}})


def _matches(run):
    m = an.match_table(run.df)
    exact, padded = m[~m["padded"]], m[m["padded"]]
    worst_exact = float(exact["max abs diff"].max())
    worst_padded = float(padded["max abs diff"].max()) if len(padded) else 0.0
    ok = bool(m["rows == requests"].all()) and worst_exact == 0.0 and worst_padded <= PADDED_TOL
    return holds(ok, f"one row per request in every batch; max abs diff {worst_exact:g} at bucket-sized token counts, "
                     f"{worst_padded:g} padded", {"exact": worst_exact, "padded": worst_padded})


def _expected_hits(run) -> dict:
    """Recompute the stream and the routing from the run's parameters (the stream is seeded)."""
    from sglab.experiments.breakable_graph.routing import prefill_stream

    p = run.manifest.get("params", {})
    shapes = prefill_stream(int(p["stream_batches"]), seed=int(p["seed"]), max_bs=int(p["stream_max_bs"]),
                            p_single=float(p["stream_p_single"]), min_len=int(p["stream_min_len"]),
                            max_len=int(p["stream_max_len"]))
    cap = max(int(n) for n in p["capture_num_tokens"])
    fits = [s for s in shapes if s.num_tokens <= cap]
    return {"before": sum(s.batch_size == 1 for s in fits), "after": len(fits), "batches": len(shapes)}


def _hit_rate(run):
    h = an.hit_rates(run.df)
    want = _expected_hits(run)
    got = {v: int(h[v]["graph_batches"]) for v in ("before", "after")}
    ok = got == {"before": want["before"], "after": want["after"]} and got["before"] < got["after"]
    hb, ha = h["before"]["hit_rate"], h["after"]["hit_rate"]
    return holds(ok, f"{got['before']} → {got['after']} of {want['batches']} batches ({hb:.1%} → {ha:.1%}); the "
                     f"stream predicts {want['before']} → {want['after']}", {"before": hb, "after": ha})


def _speedup(run):
    t = an.latency_table(run.df)
    t = t[t["batch_size"] > 1]
    if t.empty:
        return not_applicable("no prefill with 2+ requests was timed")
    s, small = t["speedup_after"], t[t["num_tokens"] <= LAUNCH_BOUND]["speedup_after"]
    ok = bool((s > MIN_SPEEDUP).all() and (small >= MIN_LAUNCH_BOUND_SPEEDUP).all())
    return holds(ok, f"after vs eager, 2+ requests: {s.min():.2f}–{s.max():.2f}× (median {s.median():.2f}×; "
                     f"≥{small.min():.2f}× up to {LAUNCH_BOUND} tok)",
                 {"min": float(s.min()), "max": float(s.max()), "median": float(statistics.median(s)),
                  "min_launch_bound": float(small.min()) if len(small) else None})


def _segments(run):
    seg = an.segment_table(run.df)
    layers = int(run.manifest.get("params", {}).get("num_layers", 16))
    ok = all((seg[(b, "graph_segments")] == layers + 1).all() and (seg[(b, "eager_breaks")] == layers).all()
             for b in ("before", "after"))
    return holds(ok, f"{len(seg)} buckets × 2 boundaries: {layers + 1} segments, {layers} breaks each" if ok
                 else f"segments/breaks per bucket: {seg.to_dict()}", {"buckets": len(seg)})


def _routing(run):
    d = run.df[(run.df["part"] == "d_latency") & (run.df["metric"] == "used_graph")]
    before = {int(r.batch_size): int(r.value) for r in d[d.variant == "before"].itertuples()}
    after = {int(r.batch_size): int(r.value) for r in d[d.variant == "after"].itertuples()}
    ok = all(v == int(bs == 1) for bs, v in before.items()) and all(v == 1 for v in after.values())
    return holds(ok, f"before uses its graph for {sorted(b for b, v in before.items() if v)} request(s), after for "
                     f"{sorted(b for b, v in after.items() if v)}", {"before": before, "after": after})


def _launches(run):
    lt = an.launch_table(run.df)
    layers = int(run.manifest.get("params", {}).get("num_layers", 16))
    after = lt.xs("after", level="variant")
    multi = lt[lt.index.get_level_values("batch_size") > 1].xs("before", level="variant")
    ok = (after["host_graph_launches"] == layers + 1).all() and after["host_kernel_launches"].nunique() == 1
    ok = ok and (multi["host_graph_launches"] == 0).all()
    return holds(bool(ok), f"after: {int(after['host_graph_launches'].iloc[0])} graph + "
                           f"{int(after['host_kernel_launches'].iloc[0])} kernel launches at every request count; before "
                           f"with 2+ requests: {int(multi['host_graph_launches'].max())} graph launches, "
                           f"{int(multi['host_kernel_launches'].min())} kernel launches",
                 {"after_kernel_launches": int(after["host_kernel_launches"].iloc[0])})


def _trace(run):
    ev = run.sidecar("events")
    if ev is None:
        return not_applicable("this run has no events sidecar (it predates profiler traces)")
    from sglab.experiments.breakable_graph.profile import launch_numbers

    layers = int(run.manifest.get("params", {}).get("num_layers", 16))
    n = {v: launch_numbers(g) for v, g in ev.groupby("variant")}
    ok = n["before"]["host_graph_launches"] == 0 and n["after"]["host_graph_launches"] == layers + 1
    ok = ok and n["after"]["host_kernel_launches"] < n["before"]["host_kernel_launches"]
    return holds(ok, f"3-request prefill: before {n['before']['host_graph_launches']} graph / "
                     f"{n['before']['host_kernel_launches']} kernel launches, after "
                     f"{n['after']['host_graph_launches']} / {n['after']['host_kernel_launches']}", n)


CLAIMS = [
    Claim(f"{EXPERIMENT}.before_bs3_one_row", "The graph captured with the logits tail returns one logit row for "
          "3 requests, so can_run rejects the batch", "before: 1 row, can_run False; after and eager: 3 rows (exact)",
          _bs3),
    Claim(f"{EXPERIMENT}.after_equals_eager", "The layer-stack graph's logits equal eager prefill for every request "
          "count", "one row per request; max abs diff 0 (bucket-sized and padded token counts)", _matches),
    Claim(f"{EXPERIMENT}.hit_rate", "On the seeded mixed stream only single-request batches hit the before graph; "
          "every batch that fits a bucket hits the after graph", "graph batches == recomputed from the stream "
          "(exact), before < after", _hit_rate),
    Claim(f"{EXPERIMENT}.multi_request_speedup", "Prefills of 2+ requests run faster through the after graph than "
          "eagerly", f"eager/after > {MIN_SPEEDUP}× for every timed batch of 2+ requests, ≥ {MIN_LAUNCH_BOUND_SPEEDUP}× "
          f"up to {LAUNCH_BOUND} tokens", _speedup, drift=0.25),
    Claim(f"{EXPERIMENT}.segments_per_bucket", "Every capture is one segment more than the layers, one break per "
          "layer", "segments == layers + 1, breaks == layers, every bucket, both boundaries (exact)", _segments),
    Claim(f"{EXPERIMENT}.routing", "The before runner replays only one-request batches; the after runner every "
          "batch", "used_graph: before iff 1 request; after always (exact)", _routing),
    Claim(f"{EXPERIMENT}.launches", "The after runner launches the same graphs and kernels for any request count",
          "after: layers + 1 graph launches and equal kernel launches at every request count; before with 2+ "
          "requests: 0 graph launches (exact)", _launches),
    Claim(f"{EXPERIMENT}.trace_3_requests", "In the profiler, the 3-request prefill is eager before and graph "
          "segments after", "before: 0 graph launches; after: layers + 1, fewer kernel launches (exact)", _trace,
          methods=(3, None)),
]


def shown(runs: list) -> list:
    """The newest run of each GPU model."""
    return an.newest_per_gpu(runs)


def headline(runs: list) -> str:
    parts, ns, bss, diffs = [], set(), set(), []
    hit = None
    for r in runs:
        v = values(EXPERIMENT, r)
        s = v[f"{EXPERIMENT}.multi_request_speedup"].value
        if s is not None:
            parts.append(f"{an.gpu_short(r)} {s['min']:.2f}–{s['max']:.2f}× (median {s['median']:.2f}×)")
        t = an.latency_table(r.df)
        ns |= {int(n) for n in t["num_tokens"]}
        bss |= {int(b) for b in t["batch_size"] if b > 1}
        m = v[f"{EXPERIMENT}.after_equals_eager"].value
        if m is not None:
            diffs.append(max(m["exact"], m["padded"]))
        hit = v[f"{EXPERIMENT}.hit_rate"].value or hit
    if not parts:
        return "no run with timings yet"
    ns_, bss_ = sorted(ns), sorted(bss)
    return (f"Graph hit rate {hit['before']:.0%} → {hit['after']:.0%} of a mixed prefill stream; "
            f"{bss_[0]}–{bss_[-1]}-request prefills of {ns_[0]}–{ns_[-1]} tokens vs eager: {'; '.join(parts)}; "
            f"logits max abs diff vs eager {max(diffs):.3g}.")
