"""Capture the dense-TP1 layer boundary over piecewise capture sizes, before and after SGLang PR #23972.

Live part (NCCL, one rank per GPU, ``world_size`` ranks forming the attention-TP group): each rank runs the
boundary of :mod:`sglab.fixes.capture_sizes` (``tensor_split`` shard + ``reduce_scatter_tensor`` into it, a
per-token stand-in for the dense MLP, ``all_gather_into_tensor`` back) the way the piecewise runner does:
a warm-up at the smallest size, then per size, largest first, two eager warm-ups and a CUDA-graph capture.
Four variants:

``before``        the PR-era list, unfiltered, with a shard check before the collective: the loop stops at the
                  first bad size with :class:`~sglab.fixes.capture_sizes.UnequalShards` (the server crashed at
                  startup the same way).
``before_probe``  every size of the unfiltered list on its own, eager, *without* the shard check: what the
                  collective library says about unequal shards (torch's NCCL backend refuses them on every
                  rank before calling NCCL, so this cannot hang; see :func:`_probe_is_safe`).
``pr_filter``     the PR's filter: only sizes divisible by ``mul_base``; all are captured, then replayed.
``round_up``      today's alternative: sizes rounded up to ``mul_base``; all are captured, then replayed.

Replay check: for every captured bucket ``b`` and real token counts ``t`` in ``{prev+1, b-1, b}``, the static
input holds ``t`` real rows and ``b - t`` zero rows; after ``graph.replay()`` the first ``t`` output rows must
equal an eager all-reduce reference (all-reduce the ``t`` real rows, apply the same per-token op).

The sizes: attention TP 8 (the crash report) breaks the default list at 4, 12, 20, 28; with fewer GPUs the
default list is scaled by ``world_size / 8`` so the same four sizes break (at 4 ranks: 2, 6, 10, 14; at 2: 1, 3,
5, 7). ``sizes="default"`` uses the unscaled list (which has no bad size at 2 or 4 ranks).

Pure-Python tables for the notebook: :func:`alignment_table`, :func:`review_table`, :func:`size_table`.
"""

from __future__ import annotations

import time
import warnings

from sglab import runs
from sglab.fixes import capture_sizes as fx

EXPERIMENT = "capture_sizes"
METHOD_VERSION = 1
GPUS = 2
DEFAULT_PARAMS = {
    "world_size": 2,        # ranks = attention-TP group size (one GPU each)
    "sizes": "scaled",      # "scaled": default list x world_size/8 (the tp-8 failures); "default": as is
    "max_tokens": 2048,     # piecewise_cuda_graph_max_tokens (2048 = the MLA default)
    "hidden": 1024,
    "dtype": "bfloat16",
    "seed": 0,
    "backend": "nccl",      # "gloo" runs the same logic on the CPU (no graphs) for tests
    "timeout_s": 420,       # the whole multi-rank run
    "collective_timeout_s": 60,
}
VARIANTS = ("before", "before_probe", "pr_filter", "round_up")
TOL = 1e-4  # max abs error accepted in the replay check (float32 per-token op on exact integer sums)


# --------------------------------------------------------------------------------------------------------------
# size lists
# --------------------------------------------------------------------------------------------------------------
def raw_sizes(world_size: int, sizes: str = "scaled", max_tokens: int = 2048) -> list[int]:
    if sizes == "default":
        return fx.default_piecewise_capture_sizes(max_tokens)
    if sizes == "scaled":
        if 8 % world_size == 0:
            return fx.scaled_default_sizes(world_size, max_tokens, reference_tp=8)
        return fx.default_piecewise_capture_sizes(max_tokens)  # e.g. 3 or 6 ranks: the default list breaks as is
    raise ValueError(f"sizes must be 'scaled' or 'default', got {sizes!r}")


def size_lists(world_size: int, sizes: str = "scaled", max_tokens: int = 2048) -> dict[str, list[int]]:
    """The capture list of each variant (attention TP = ``world_size``, attention CP 1)."""
    raw = raw_sizes(world_size, sizes, max_tokens)
    base = fx.piecewise_mul_base(world_size, 1)
    return {
        "before": raw,
        "before_probe": raw,
        "pr_filter": fx.filter_piecewise_capture_sizes(raw, world_size, 1),
        "round_up": fx.round_up_capture_sizes(raw, base),
    }


def replay_token_counts(buckets: list[int]) -> dict[int, list[int]]:
    """Real token counts checked on each bucket: the smallest that maps to it, one below it, and the bucket."""
    out, prev = {}, 0
    for b in sorted(buckets):
        out[b] = sorted({prev + 1, max(prev + 1, b - 1), b})
        prev = b
    return out


def _probe_is_safe(n: int, world_size: int) -> bool:
    """Calling the collective on unequal shards is safe only if *every* rank fails torch's local size check
    (``input.numel() == output.numel() * world_size``) before NCCL is called; true whenever n % w != 0, since
    each shard is floor(n/w) or ceil(n/w) rows and neither times w equals n."""
    return all(s * world_size != n for s in fx.shard_sizes(n, world_size)) or n % world_size == 0


# --------------------------------------------------------------------------------------------------------------
# the per-rank work
# --------------------------------------------------------------------------------------------------------------
def _real_rows(seed: int, rank: int, b: int, t: int, hidden: int, dtype, device):
    import torch

    g = torch.Generator().manual_seed((((seed * 131 + rank) * 65537 + b) * 8191 + t) % (2**31))
    # small integers: every sum over ranks is exact in bfloat16, so reduce-scatter and all-reduce agree bitwise
    return torch.randint(-3, 4, (t, hidden), generator=g).to(dtype=dtype, device=device)


def _rank_main(ctx, params: dict) -> list[dict]:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's rename in new torch
    rank, w, dev = ctx.rank, ctx.world_size, ctx.device
    hidden, seed = int(params["hidden"]), int(params["seed"])
    dtype = getattr(torch, params["dtype"])
    torch.manual_seed(seed)
    lists = size_lists(w, params["sizes"], int(params["max_tokens"]))
    max_n = max(max(v) for v in lists.values())
    use_graphs = dev.type == "cuda"
    static_in = torch.zeros(max_n, hidden, dtype=dtype, device=dev)
    static_out = torch.zeros(max_n, hidden, dtype=torch.float32, device=dev)
    weight = ((torch.arange(hidden, device=dev) % 7) + 1).float() / 4
    rows: list[dict] = []

    def sync():
        if use_graphs:
            torch.cuda.synchronize(dev)
        ctx.barrier()

    def boundary(n: int, check: bool = True) -> None:
        x = static_in[:n]
        local = fx.scatter_to_attn_tp(x, rank, w, ctx.group, check=check)
        y = fx.dense_tp1_stand_in(local, weight)
        fx.gather_from_attn_tp(static_out[:n], y, ctx.group)

    def row(variant, size, metric, value, unit="", **extra):
        rows.append({"variant": variant, "world_size": w, "size": int(size), "metric": metric,
                     "value": float(value), "unit": unit, **extra})

    def capture_all(variant: str, sizes: list[int]) -> dict:
        """The runner's loop: warm-up at the smallest size, then largest first: 2 eager runs + capture."""
        graphs: dict = {}
        pool = torch.cuda.graph_pool_handle() if use_graphs else None
        order = [sizes[0]] + list(reversed(sizes))
        stage = ["jit_warmup"] + ["capture"] * len(sizes)
        done: set[int] = set()
        for n, what in zip(order, stage):
            try:
                sync()
                if what == "jit_warmup":
                    boundary(n)
                    continue
                for _ in range(2):
                    boundary(n)
                    sync()
                if use_graphs:
                    g = torch.cuda.CUDAGraph()
                    # thread_local: a CUDA call from another thread (e.g. the NCCL watchdog polling events of
                    # finished work) must not invalidate this capture
                    with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
                        boundary(n)
                    graphs[n] = g
                else:
                    graphs[n] = None
                sync()
                done.add(n)
                row(variant, n, "captured", 1)
            except fx.UnequalShards as e:
                row(variant, n, "failed", 1, error=f"{type(e).__name__}: {e}", stage=what)
                for m in sizes:
                    if m not in done and m != n:
                        row(variant, m, "not_reached", 1)
                return graphs
        return graphs

    def replay_check(variant: str, graphs: dict) -> None:
        for b, ts in replay_token_counts(sorted(graphs)).items():
            worst, ok = 0.0, True
            for t in ts:
                x = _real_rows(seed, rank, b, t, hidden, dtype, dev)
                sync()
                static_in[:t].copy_(x)
                static_in[t:b].zero_()
                if use_graphs:
                    graphs[b].replay()
                else:
                    boundary(b)
                sync()
                got = static_out[:t].clone()
                ref = x.clone()
                dist.all_reduce(ref, group=ctx.group)
                ref = fx.dense_tp1_stand_in(ref, weight)
                err = (got - ref).abs().max().item() if t else 0.0
                worst = max(worst, err)
                ok = ok and bool(torch.isfinite(got).all().item()) and err <= TOL
            row(variant, b, "replay_max_abs_err", worst, "abs")
            row(variant, b, "replay_ok", int(ok))
            row(variant, b, "replay_checks", len(ts))

    def probe(variant: str, sizes: list[int]) -> None:
        for n in sizes:
            if not _probe_is_safe(n, w):  # never true; kept as the stated precondition
                row(variant, n, "skipped_unsafe", 1)
                continue
            sync()
            try:
                boundary(n, check=False)
                sync()
                row(variant, n, "ok", 1)
            except Exception as e:  # noqa: BLE001 - the collective's own complaint is the measurement
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                row(variant, n, "failed", 1, error=f"{type(e).__name__}: {msg}"[:300], stage="eager")
                sync()

    for variant in ("before", "pr_filter", "round_up"):
        graphs = capture_all(variant, lists[variant])
        if variant != "before":
            replay_check(variant, graphs)
        del graphs
        if use_graphs:
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
    probe("before_probe", lists["before_probe"])  # last: only the unguarded collective calls follow here
    del static_in, static_out
    if use_graphs:
        torch.cuda.empty_cache()
    return rows


def _merge(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (variant, size, metric): flags must agree on every rank, errors are the max over ranks."""
    keyed: dict = {}
    for r, rows in enumerate(per_rank):
        for x in rows:
            k = (x["variant"], x["size"], x["metric"])
            if k not in keyed:
                keyed[k] = dict(x, ranks=1)
                continue
            y = keyed[k]
            y["ranks"] += 1
            if x["metric"] == "replay_max_abs_err":
                y["value"] = max(y["value"], x["value"])
            elif x["metric"] == "replay_ok":
                y["value"] = min(y["value"], x["value"])
            elif y["value"] != x["value"]:
                raise RuntimeError(f"ranks disagree on {k}: {y['value']} vs {x['value']}")
    w = len(per_rank)
    out = []
    for y in keyed.values():
        if y.pop("ranks") != w:
            raise RuntimeError(f"row {y} came from fewer than {w} ranks")
        out.append(y)
    return out


def run(params: dict | None = None, *, progress: bool = True):
    from sglab import dist

    p = {**DEFAULT_PARAMS, **(params or {})}
    w = int(p["world_size"])
    if w < 2:
        raise ValueError("the boundary needs at least 2 ranks (world_size >= 2)")
    lists = size_lists(w, p["sizes"], int(p["max_tokens"]))
    if progress:
        bad = [n for n in lists["before"] if n % w]
        print(f"{w} ranks ({p['backend']}): {len(lists['before'])} PR-era sizes ({len(bad)} not divisible by {w}: "
              f"{bad}), {len(lists['pr_filter'])} after the PR's filter, {len(lists['round_up'])} rounded up; "
              f"capturing and replaying ...", flush=True)
    t0 = time.perf_counter()
    per_rank = dist.launch(_rank_main, w, args=(p,), backend=p["backend"], timeout_s=float(p["timeout_s"]),
                           collective_timeout_s=float(p["collective_timeout_s"]))
    rows = _merge(per_rank)
    for r in rows:
        r.setdefault("error", "")
        r.setdefault("stage", "")
    df = runs.tidy(EXPERIMENT, rows)
    if progress:
        print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    return df


# --------------------------------------------------------------------------------------------------------------
# reading a run
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
    """The headline facts of one recorded run: world size, machine, the sizes torch refused, where the unfiltered
    loop stopped, and per fixed list how many buckets captured and replayed, with the worst replay error."""
    s = summary(run.df).set_index("variant")
    m = run.manifest
    facts = {
        "run": run.path.name, "gpu": str(m.get("gpu_name", "?")).replace("NVIDIA ", ""),
        "world_size": int(m["params"]["world_size"]),
        "gpus_on_machine": int(m.get("gpu_count_machine", m.get("gpu_count", 0))),
        "date": str(m.get("created_utc", ""))[:10],
        "raw_sizes": int(s.loc["before", "sizes"]),
        "before_captured": int(s.loc["before", "captured_or_ok"]),
        "before_stopped_at": s.loc["before", "first_failure"],
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
    if facts["before_stopped_at"] is not None:
        facts["before_stopped_at"] = None if str(facts["before_stopped_at"]) == "<NA>" else int(
            facts["before_stopped_at"])
    return facts


def runs_table(runs_: list):
    """One row per recorded run (oldest first): what failed before and what the fixed lists did."""
    import pandas as pd

    return pd.DataFrame([run_facts(r) for r in runs_])


def newest_per_world_size(runs_: list) -> list:
    """The newest run of each (GPU, world size), ordered by GPU name then world size."""
    key = lambda r: (r.manifest.get("gpu_name", "?"), int(r.manifest["params"]["world_size"]))  # noqa: E731
    return list(runs.newest_by(runs_, key).values())


_SAME = ("raw_sizes", "before_captured", "before_stopped_at", "refused_sizes", "pr_filter_buckets",
         "pr_filter_captured", "pr_filter_replayed_ok", "round_up_buckets", "round_up_captured",
         "round_up_replayed_ok")


def headline(runs_: list) -> str:
    """The README line: the claim plus, per GPU and world size, the sizes torch refused and how many buckets of the
    fixed lists captured and replayed correctly, from every recorded run (runs of one GPU and world size are merged
    when they agree on every count; otherwise the newest is quoted and the disagreement is said)."""
    groups: dict = {}
    for r in runs_:
        f = run_facts(r)
        groups.setdefault((f["gpu"], f["world_size"]), []).append((str(r.manifest.get("created_utc", "")), f))
    parts = []
    for (gpu, w), items in sorted(groups.items()):
        items.sort(key=lambda x: x[0])
        f = items[-1][1]
        agree = all(all(g[k] == f[k] for k in _SAME) for _, g in items)
        used = [g for _, g in items] if agree else [f]
        n = len(items)
        tag = f"{gpu} TP {w}" + ("" if n == 1 else f" ({n} runs)" if agree else f" (newest of {n}; runs differ)")
        ok = {v: f"{min(f[f'{v}_captured'], f[f'{v}_replayed_ok'])}/{f[f'{v}_buckets']}"
              for v in ("pr_filter", "round_up")}
        fixed = (f"PR filter and round-up {ok['pr_filter']} buckets" if ok["pr_filter"] == ok["round_up"]
                 else f"PR filter {ok['pr_filter']}, round-up {ok['round_up']} buckets")
        err = max(max(g["pr_filter_max_abs_err"], g["round_up_max_abs_err"]) for g in used)
        refused = ", ".join(str(x) for x in f["refused_sizes"]) or "none"
        parts.append(f"{tag}: refused {refused}; {fixed} captured + replayed, max abs err {err:g}")
    scaled = {g["raw_sizes"] for items in groups.values() for _, g in items}
    n_raw = f"{scaled.pop()}-size" if len(scaled) == 1 else "the"
    return ("Capture sizes not divisible by attention TP break the dense-TP1 reduce-scatter "
            f"({n_raw} default list ×TP/8, so TP 8's bad sizes recur). " + "; ".join(parts) + ".")


# --------------------------------------------------------------------------------------------------------------
# CPU tables
# --------------------------------------------------------------------------------------------------------------
def size_table(attn_tp: int, max_tokens: int = 2048, sizes: list[int] | None = None):
    """One row per PR-era default size: shards at ``attn_tp``, kept by the PR, where rounding up sends it."""
    import pandas as pd

    sizes = sizes if sizes is not None else fx.default_piecewise_capture_sizes(max_tokens)
    base = fx.piecewise_mul_base(attn_tp, 1)
    kept = set(fx.filter_piecewise_capture_sizes(sizes, attn_tp, 1))
    return pd.DataFrame([{
        "size": n, "shards": fx.shard_sizes(n, attn_tp) if attn_tp <= 8 else None,
        "equal_shards": n % attn_tp == 0, "kept_by_pr": n in kept, "rounded_up_to": fx.ceil_align(n, base),
    } for n in sizes])


def alignment_table(max_tokens: int = 2048, attn_tps=range(1, 9), attn_cps=range(1, 5)):
    """For attn_tp x attn_cp x two-batch overlap: the bases, surviving buckets and padding of each policy.

    Padding assumes every token count 1..max_tokens is equally likely (a simple, stated model, not a trace);
    ``eager_*`` counts the token counts above the largest bucket, which fall back to eager.
    """
    import pandas as pd

    default = fx.default_piecewise_capture_sizes(max_tokens)
    base_waste = fx.padding_waste(default, max_tokens)
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
                rounded = fx.round_up_capture_sizes(default, pr)
                w_pr = fx.padding_waste(kept_pr, max_tokens) if kept_pr else None
                w_rd = fx.padding_waste(rounded, max_tokens)
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


def review_table(max_tokens: int = 2048):
    """The design-review findings, each with a worked example computed on the default list."""
    import pandas as pd

    d = fx.default_piecewise_capture_sizes(max_tokens)

    def kept(base):
        return [n for n in d if n % base == 0]

    rows = []
    tp, cp = 4, 2
    code, comment = fx.piecewise_mul_base(tp, cp), fx.comment_base(tp, cp)
    rows.append({"finding": "comment vs code", "attn_tp": tp, "attn_cp": cp,
                 "comment (tp*cp)": comment, "code mul_base": code, "lcm": fx.lcm_base(tp, cp),
                 "sizes kept by code": len(kept(code)), "sizes kept by comment's rule": len(kept(comment)),
                 "what it means": f"the comment says 'divisible by attn_tp_size * attn_cp_size' = {comment}; "
                                  f"the code keeps multiples of {code} when cp divides tp"})
    tp, cp = 4, 6
    code, lcm = fx.piecewise_mul_base(tp, cp), fx.lcm_base(tp, cp)
    rows.append({"finding": "common multiple, not least", "attn_tp": tp, "attn_cp": cp,
                 "comment (tp*cp)": fx.comment_base(tp, cp), "code mul_base": code, "lcm": lcm,
                 "sizes kept by code": len(kept(code)), "sizes kept by comment's rule": len(kept(tp * cp)),
                 "what it means": f"{len(kept(lcm)) - len(kept(code))} sizes divisible by lcm {lcm} but not by "
                                  f"{code} are dropped without need"})
    tp = 8
    dec = fx.decode_mul_base(tp, 1, two_batch_overlap=True)
    rows.append({"finding": "two-batch overlap not folded in", "attn_tp": tp, "attn_cp": 1,
                 "comment (tp*cp)": tp, "code mul_base": fx.piecewise_mul_base(tp, 1), "lcm": tp,
                 "sizes kept by code": len(kept(tp)), "sizes kept by comment's rule": len(kept(tp)),
                 "what it means": f"the decode runner uses {dec} under TBO; "
                                  f"{len(kept(tp)) - len(kept(dec))} piecewise sizes are not multiples of {dec}"})
    tp = 3
    rows.append({"finding": "drop vs round up", "attn_tp": tp, "attn_cp": 1,
                 "comment (tp*cp)": tp, "code mul_base": tp, "lcm": tp,
                 "sizes kept by code": len(kept(tp)), "sizes kept by comment's rule": len(kept(tp)),
                 "what it means": f"dropping keeps {len(kept(tp))} of {len(d)} buckets; rounding up keeps "
                                  f"{len(fx.round_up_capture_sizes(d, tp))}"})
    return pd.DataFrame(rows)
