"""Tables: from a run (per variant, per size, per traced capture range) and from the rebuild alone (CPU).

The CPU tables take the capture sizes as an argument (default: the PR-era default list) so that any list — a
SGLang release's, or one derived from a reader's server arguments — can be laid out the same way.
"""

from __future__ import annotations

import re
from typing import Sequence

from sglab.core import runs
from sglab.fixes import capture_sizes as fx

from sglab.experiments.capture_sizes import VARIANTS


# --------------------------------------------------------------------------------------------------------------
# from a run
# --------------------------------------------------------------------------------------------------------------
def summary(df):
    """Per variant and world size (in :data:`VARIANTS` order): sizes in the list, captured, failed (every failed
    size; the first one, and its stage), not reached, replayed correctly, worst replay error."""
    import pandas as pd

    out = []
    for (variant, w), g in df.groupby(["variant", "world_size"], sort=False):
        def count(metric):
            return int(g.loc[g.metric == metric, "value"].sum())

        failed = g[g.metric == "failed"]
        errs = g.loc[g.metric == "replay_max_abs_err", "value"]
        stage = failed["stage"].iloc[0] if len(failed) and "stage" in failed else ""
        out.append({
            "variant": variant, "world_size": int(w),
            "sizes": int(g["size"].nunique()),
            "captured_or_ok": count("captured") + count("ok"),
            "failed": len(failed),
            "failed_sizes": [int(n) for n in failed["size"]],
            "first_failure": int(failed["size"].iloc[0]) if len(failed) else None,
            "failed_at": "" if pd.isna(stage) else str(stage),
            "not_reached": count("not_reached"),
            "replayed_ok": count("replay_ok"),
            "replay_checks": count("replay_checks"),
            "worst_replay_err": float(errs.max()) if len(errs) else None,
            "error": failed["error"].iloc[0] if len(failed) else "",
        })
    out = pd.DataFrame(out)
    if len(out):
        rank = {v: i for i, v in enumerate(VARIANTS)}
        out = out.sort_values(["world_size", "variant"], key=lambda c: c.map(rank) if c.name == "variant" else c,
                              kind="stable").reset_index(drop=True)
        out["first_failure"] = out["first_failure"].astype("Int64")
    return out


def run_facts(run) -> dict:
    """The facts of one run: world size, machine, the sizes torch refused, where the unfiltered loop stopped, and
    per fixed list how many buckets captured and replayed, with the worst replay error."""
    s = summary(run.df).set_index("variant")
    m = run.manifest
    stopped = s.loc["before", "first_failure"]
    facts = {
        "run": run.path.name, "gpu": runs.gpu_short(m), "world_size": int(m["params"]["world_size"]),
        "gpus_on_machine": int(m.get("gpu_count_machine", m.get("gpu_count", 0))),
        "date": str(m.get("created_utc", ""))[:10],
        "raw_sizes": int(s.loc["before", "sizes"]),
        "before_captured": int(s.loc["before", "captured_or_ok"]),
        "before_stopped_at": None if str(stopped) == "<NA>" else int(stopped),
        "before_stage": s.loc["before", "failed_at"],
        "refused_sizes": list(s.loc["before_probe", "failed_sizes"]),
        "refused_error": s.loc["before_probe", "error"],
    }
    for v in ("pr_filter", "round_up"):
        facts[f"{v}_buckets"] = int(s.loc[v, "sizes"])
        facts[f"{v}_captured"] = int(s.loc[v, "captured_or_ok"])
        facts[f"{v}_replayed_ok"] = int(s.loc[v, "replayed_ok"])
        facts[f"{v}_replays"] = int(s.loc[v, "replay_checks"])
        facts[f"{v}_max_abs_err"] = float(s.loc[v, "worst_replay_err"])
    return facts


def runs_table(runs_: list):
    """One row per run (oldest first): what failed before and what the fixed lists did."""
    import pandas as pd

    return pd.DataFrame([run_facts(r) for r in runs_])


def newest_per_world_size(runs_: list) -> list:
    """The newest run of each (GPU model, world size), ordered by GPU model then world size."""
    return list(runs.newest_by(runs_, lambda r: (runs.gpu_short(r), int(r.manifest["params"]["world_size"]))).values())


STATUSES = ("captured + replayed", "captured", "ok (eager)", "failed", "not reached")


def size_status(df):
    """One status per (variant, size): the per-size picture of a run."""
    import pandas as pd

    out = []
    for (v, n), g in df.groupby(["variant", "size"]):
        m = dict(zip(g.metric, g.value))
        if m.get("failed"):
            s = "failed"
        elif m.get("not_reached"):
            s = "not reached"
        elif m.get("replay_ok"):
            s = "captured + replayed"
        elif m.get("captured"):
            s = "captured"
        else:
            s = "ok (eager)" if m.get("ok") else "?"
        out.append({"variant": v, "size": int(n), "status": s})
    return pd.DataFrame(out)


def describe_run(run) -> str:
    """Before vs after in a few sentences, every number from the run."""
    f = run_facts(run)
    p = run.manifest["params"]
    lines = [f"world size {f['world_size']} ({run.label}):",
             f"  before: {f['before_captured']} of {f['raw_sizes']} sizes captured; the loop stopped at size "
             f"{f['before_stopped_at']} in its {f['before_stage']} stage (UnequalShards, before any collective)",
             f"  without the shard check the collective refused {len(f['refused_sizes'])} of {f['raw_sizes']} sizes "
             f"{f['refused_sizes']}: {f['refused_error'][:110]}"]
    for v in ("pr_filter", "round_up"):
        lines.append(f"  {v}: {f[f'{v}_captured']} of {f[f'{v}_buckets']} buckets captured, {f[f'{v}_replayed_ok']} "
                     f"replayed correctly over {f[f'{v}_replays']} padded replays (worst |error| "
                     f"{f[f'{v}_max_abs_err']:.2e})")
    lists = policy_lists(sorted(run.df.loc[run.df.variant == "before", "size"].astype(int).unique()),
                         int(p["world_size"]))
    if lists["pr_filter"] == lists["round_up"]:
        lines.append("  the PR's list and the rounded-up list are identical here (every dropped size rounds onto a "
                     "bucket already in the list): this run shows that both work, not which is better")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# from the traced pass (the `events` sidecar)
# --------------------------------------------------------------------------------------------------------------
_SIZE_RANGE = re.compile(r"^phase::(warmup|capture|refused) (\d+)$")


def capture_ranges(events):
    """One row per traced ``warmup n`` / ``capture n`` range, per rank and variant: whether a ``refused n`` mark
    lies inside it, the collective calls the host issued in it (reduce-scatters, all-gathers) and the device
    kernels that ran in it (NCCL ones and all). Device work is placed by time: each size's range ends with a
    synchronisation, so what it launched ran inside it."""
    import numpy as np
    import pandas as pd

    cols = ["rank", "variant", "stage", "size", "refused", "reduce_scatters", "all_gathers", "nccl_kernels",
            "kernels", "start_us", "dur_us"]
    if events is None or not len(events):
        return pd.DataFrame(columns=cols)
    host = ~(events.lane.str.startswith("stream") | (events.lane == "device"))
    rows = []
    for (rank, variant), ev in events.groupby(["rank", "variant"], sort=True):
        h = host.loc[ev.index].to_numpy()
        start, end = ev.start_us.to_numpy(), (ev.start_us + ev.dur_us).to_numpy()
        parsed = ev.name.map(lambda s: _SIZE_RANGE.match(s))
        is_range = (ev.category == "range").to_numpy() & h & parsed.notna().to_numpy()
        kind = np.array([m.group(1) if m else "" for m in parsed])
        ops, kern = (ev.category == "op").to_numpy() & h, (ev.category == "kernel").to_numpy()
        rs = ops & ev.name.str.contains("reduce_scatter").to_numpy()
        ag = ops & ev.name.str.contains("allgather|all_gather").to_numpy()
        nccl = kern & ev.name.str.contains("nccl", case=False).to_numpy()
        for i in np.flatnonzero(is_range & (kind != "refused")):
            inside = (start >= start[i]) & (start <= end[i])
            n = int(parsed.iloc[i].group(2))
            refused = bool((inside & is_range & (kind == "refused")).any())
            rows.append({"rank": int(rank), "variant": variant, "stage": kind[i], "size": n, "refused": refused,
                         "reduce_scatters": int((inside & rs).sum()), "all_gathers": int((inside & ag).sum()),
                         "nccl_kernels": int((inside & nccl).sum()), "kernels": int((inside & kern).sum()),
                         "start_us": float(start[i]), "dur_us": float(end[i] - start[i])})
    return pd.DataFrame(rows, columns=cols).sort_values(["rank", "variant", "start_us"]).reset_index(drop=True)


def trace_summary(events):
    """Per rank, variant and kind of range: how many ranges, and the collective calls and NCCL kernels in each
    (min–max), from :func:`capture_ranges`."""
    cr = capture_ranges(events)
    if not len(cr):
        return cr
    cr = cr.assign(kind=cr.stage.where(~cr.refused, cr.stage + " (refused)"))
    g = cr.groupby(["rank", "variant", "kind"], sort=True)

    def span(col):
        return g[col].agg(lambda x: f"{x.min()}" if x.min() == x.max() else f"{x.min()}–{x.max()}")

    out = g.size().rename("ranges").to_frame()
    for col in ("reduce_scatters", "all_gathers", "nccl_kernels", "kernels"):
        out[col] = span(col)
    return out.reset_index()


# --------------------------------------------------------------------------------------------------------------
# CPU tables of the rebuild
# --------------------------------------------------------------------------------------------------------------
def policy_lists(sizes: Sequence[int], attn_tp: int, attn_cp: int = 1,
                 two_batch_overlap: bool = False) -> dict[str, list[int]]:
    """What each policy captures from ``sizes`` at attention TP/CP: ``before`` (as given), ``pr_filter`` (the
    PR's filter; empty where the PR's assertion fires) and ``round_up`` (rounded up as SGLang 0.5.23 does: to the
    PR's ``mul_base``, twice that under two-batch overlap, :func:`~sglab.fixes.capture_sizes.today_capture_sizes`)."""
    try:
        kept = fx.filter_piecewise_capture_sizes(sizes, attn_tp, attn_cp)
    except fx.NoCaptureSizes:
        kept = []
    return {"before": list(sizes), "pr_filter": kept,
            "round_up": fx.today_capture_sizes(sizes, attn_tp, attn_cp, two_batch_overlap=two_batch_overlap)}


def size_table(attn_tp: int, max_tokens: int = 2048, sizes: list[int] | None = None, attn_cp: int = 1):
    """One row per capture size (default: the PR-era default list): its shards at ``attn_tp``, whether the
    reduce-scatter accepts them, whether the PR keeps the size, and where rounding up sends it."""
    import pandas as pd

    sizes = sizes if sizes is not None else fx.default_piecewise_capture_sizes(max_tokens)
    base = fx.piecewise_mul_base(attn_tp, attn_cp)
    kept = set(policy_lists(sizes, attn_tp, attn_cp)["pr_filter"])
    return pd.DataFrame([{
        "size": n, "shards": fx.shard_sizes(n, attn_tp) if attn_tp <= 8 else None,
        "equal_shards": n % attn_tp == 0, "kept_by_pr": n in kept, "rounded_up_to": fx.ceil_align(n, base),
    } for n in sizes])


def rule_table(sizes: Sequence[int], combos=((8, 1, False), (8, 1, True), (4, 6, False), (3, 1, False))):
    """For a few (attn_tp, attn_cp, two-batch overlap) settings: what the PR's rule, the decode runner's rule and
    rounding up make of ``sizes``."""
    import pandas as pd

    rows = []
    for tp, cp, tbo in combos:
        lists = policy_lists(sizes, tp, cp, tbo)
        dec = fx.filter_decode_batch_sizes(sizes, tp, cp, two_batch_overlap=tbo)
        rows.append({"attn_tp": tp, "attn_cp": cp, "two_batch_overlap": tbo,
                     "PR mul_base": fx.piecewise_mul_base(tp, cp), "PR keeps": len(lists["pr_filter"]),
                     "PR drops": [n for n in sizes if n not in lists["pr_filter"]][:6],
                     "decode mul_base": fx.decode_mul_base(tp, cp, two_batch_overlap=tbo),
                     "decode rule keeps": len(dec), "rounded up": len(lists["round_up"]),
                     "first rounded buckets": lists["round_up"][:6]})
    return pd.DataFrame(rows)


def padding_waste(buckets: Sequence[int], max_tokens: int) -> dict:
    """Padding cost of replaying token counts 1..``max_tokens`` (each equally likely) on ``buckets``.

    Returns ``covered`` (token counts that find a bucket), ``eager`` (those above the largest bucket, which run
    eagerly), ``pad_tokens`` (sum of bucket - t over covered t) and ``pad_frac`` (pad_tokens / sum of covered t).
    """
    bs = sorted(buckets)
    pad = real = covered = 0
    i = 0
    for t in range(1, max_tokens + 1):
        while i < len(bs) and bs[i] < t:
            i += 1
        if i == len(bs):
            continue
        covered += 1
        real += t
        pad += bs[i] - t
    return {"covered": covered, "eager": max_tokens - covered, "pad_tokens": pad,
            "pad_frac": pad / real if real else float("nan")}


def alignment_table(max_tokens: int = 2048, attn_tps=range(1, 9), attn_cps=range(1, 5),
                    sizes: Sequence[int] | None = None):
    """For attn_tp x attn_cp x two-batch overlap: the bases, surviving buckets and padding of each policy.

    Padding assumes every token count 1..max_tokens is equally likely (a simple, stated model, not a trace);
    ``eager_*`` counts the token counts above the largest bucket, which fall back to eager.
    """
    import pandas as pd

    default = list(sizes) if sizes is not None else fx.default_piecewise_capture_sizes(max_tokens)
    base_waste = padding_waste(default, max_tokens)
    out = []
    for tp in attn_tps:
        for cp in attn_cps:
            for tbo in (False, True):
                pr = fx.piecewise_mul_base(tp, cp)
                dec = fx.decode_mul_base(tp, cp, two_batch_overlap=tbo)
                lcm = fx.lcm_base(tp, cp)
                kept_pr = [n for n in default if n % pr == 0]
                kept_dec = [n for n in default if n % dec == 0]
                kept_lcm = [n for n in default if n % lcm == 0]
                rounded = fx.today_capture_sizes(default, tp, cp, two_batch_overlap=tbo)
                w_pr = padding_waste(kept_pr, max_tokens) if kept_pr else None
                w_rd = padding_waste(rounded, max_tokens)
                out.append({
                    "attn_tp": tp, "attn_cp": cp, "two_batch_overlap": tbo,
                    "mul_base_pr": pr, "mul_base_decode": dec, "lcm": lcm, "tp_x_cp": tp * cp,
                    "n_default": len(default), "n_pr": len(kept_pr), "n_decode_style": len(kept_dec),
                    "n_lcm": len(kept_lcm), "n_round_up": len(rounded),
                    "lost_pr": len(default) - len(kept_pr), "lost_round_up": len(default) - len(rounded),
                    "pr_below_decode_base": len([n for n in kept_pr if n % dec]),
                    "pad_frac_default": base_waste["pad_frac"],
                    "pad_frac_pr": w_pr["pad_frac"] if w_pr else None,
                    "pad_frac_round_up": w_rd["pad_frac"],
                    "eager_pr": w_pr["eager"] if w_pr else max_tokens,
                    "eager_round_up": w_rd["eager"],
                    "pr_asserts": not kept_pr,
                })
    return pd.DataFrame(out)


def alignment_summary(table, max_tokens: int = 2048) -> str:
    """What the alignment table says with two-batch overlap off: buckets kept, assertions, eager fallback and
    padding of the PR's filter vs rounding up."""
    off = table[~table.two_batch_overlap]
    ok = off[~off.pr_asserts]
    n = int(off.n_default.iloc[0])
    return "\n".join([
        f"over {len(off)} (attn_tp, attn_cp) pairs, TBO off, {n} default buckets:",
        f"  PR filter keeps median {ok.n_pr.median():.0f} (min {ok.n_pr.min()}), asserts in "
        f"{int(off.pr_asserts.sum())} pair(s); otherwise up to {ok.eager_pr.max()} of {max_tokens} token counts "
        "fall back to eager",
        f"  rounding up keeps median {off.n_round_up.median():.0f} (min {off.n_round_up.min()}), never asserts, "
        f"eager fallback: {off.eager_round_up.max()}; padding {off.pad_frac_round_up.min():.1%}–"
        f"{off.pad_frac_round_up.max():.1%} vs {ok.pad_frac_pr.min():.1%}–{ok.pad_frac_pr.max():.1%} for the PR"])


def review_table(max_tokens: int = 2048):
    """The design-review findings, each with a worked example computed on the default list."""
    import pandas as pd

    d = fx.default_piecewise_capture_sizes(max_tokens)

    def kept(base):
        return [n for n in d if n % base == 0]

    def finding(name, tp, cp, comment, code, lcm, by_comment, means):
        return {"finding": name, "attn_tp": tp, "attn_cp": cp, "comment (tp*cp)": comment, "code mul_base": code,
                "lcm": lcm, "sizes kept by code": len(kept(code)), "sizes kept by comment's rule": by_comment,
                "what it means": means}

    rows = []
    tp, cp = 4, 2
    code, comment = fx.piecewise_mul_base(tp, cp), fx.comment_base(tp, cp)
    rows.append(finding("comment vs code", tp, cp, comment, code, fx.lcm_base(tp, cp), len(kept(comment)),
                        f"the comment says 'divisible by attn_tp_size * attn_cp_size' = {comment}; "
                        f"the code keeps multiples of {code} when cp divides tp"))
    tp, cp = 4, 6
    code, lcm = fx.piecewise_mul_base(tp, cp), fx.lcm_base(tp, cp)
    rows.append(finding("common multiple, not least", tp, cp, fx.comment_base(tp, cp), code, lcm,
                        len(kept(tp * cp)), f"{len(kept(lcm)) - len(kept(code))} sizes divisible by lcm {lcm} but "
                                            f"not by {code} are dropped without need"))
    tp = 8
    dec = fx.decode_mul_base(tp, 1, two_batch_overlap=True)
    rows.append(finding("two-batch overlap not folded in", tp, 1, tp, fx.piecewise_mul_base(tp, 1), tp,
                        len(kept(tp)), f"the decode runner uses {dec} under TBO; "
                                       f"{len(kept(tp)) - len(kept(dec))} piecewise sizes are not multiples of {dec}"))
    tp = 3
    rows.append(finding("drop vs round up", tp, 1, tp, tp, tp, len(kept(tp)),
                        f"dropping keeps {len(kept(tp))} of {len(d)} buckets; rounding up keeps "
                        f"{len(fx.round_up_capture_sizes(d, tp))}"))
    return pd.DataFrame(rows)
