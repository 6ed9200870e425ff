"""What every grid_thw run must show (``sglab verify grid_thw``): five claims a reader checks, the
instrument and hygiene checks folded under them, the review card and the real engine's claims.
Numbers are NVML's per-process MiB on one GPU: 0 exactly where the fix promises nothing, "more than
0" where a context's size depends on the GPU and driver; what a run cannot show is n/a with why."""

from __future__ import annotations

from sglab.core.card import Card
from sglab.core.claims import Claim, Headline, engine_claims, holds
from sglab.core.runs import gpu_short, newest
from sglab.core.text import count
from sglab.grid_thw import series, show
from sglab.grid_thw.measure import EXPERIMENT, GPUS  # noqa: F401 (GPUS: Workbook)
from sglab.grid_thw.series import KERNEL_STEPS


CLAIM = ("A `grid_thws` tensor left on cuda:0 makes every TP rank ≥ 1 open a CUDA context on GPU "
         "0; `.cpu()` removes it, and the `image_grid_thw` rename lets the vision cache hit per "
         "image.")
SPREAD_TOLERANCE_MIB = 8.0  # four allocator segments: what repeats may differ by
# a rerun's engine context per rank >= 1 against the record (522 vs 520 MiB seen across GPUs and
# machines): 2 %, 10 MiB a context; a count or a 0 MiB after the fix stays exact
CONTEXT_DRIFT = 0.02
# what depends on the machine (how many GPUs the ranks saw), shown but not compared with a record
MACHINE = ("tp", "gpus", "stray_contexts", "stray_mib")


def _gpu0(run, variant: str, phase: str | None = None) -> list[float]:
    """MiB every rank >= 1 held on GPU 0 in one variant and phase; a missing reading is an error."""
    s = show.stray(run.df)
    s = s[s.variant == variant]
    s = s if phase is None else s[s.phase == phase]
    if s.empty:
        raise ValueError(f"no GPU-0 reading of a rank ≥ 1 in `{variant}` at `{phase or 'any'}`")
    repeats = int(run.manifest.params.get("repeats", run.df.repeat.max() + 1))
    want = (_tp(run) - 1) * repeats * (1 if phase else s.phase.nunique())
    if len(s) != want:
        raise ValueError(f"`{variant}` has {len(s)} GPU-0 readings of ranks ≥ 1, expected "
                         f"{want} ({_tp(run) - 1} ranks × {repeats} repeats)")
    return list(s.value)


def _tp(run) -> int:
    return int(run.manifest.params.get("tp_size", run.df.tp_size.max()))


def _has_variant(name: str):
    return lambda run: None if name in set(run.df.variant) else f"the run has no `{name}` variant"


# -- the stray context and the fix -----------------------------------------------------------------
def _before_stray(run):
    got = _gpu0(run, "before", "received")
    return holds(
        min(got) > 0, f"{count(got)} MiB per rank ≥ 1 at `received` ({len(got)} readings)",
        {"received_min_mib": min(got), "received_max_mib": max(got)})


def _before_grows(run):
    rec, ker = _gpu0(run, "before", "received"), _gpu0(run, "before", "kernel")
    s = show.stray(run.df)
    total = float(s[(s.variant == "before")
                    & (s.phase == "kernel")].groupby("repeat").value.sum().median())
    growth = min(k - r for r, k in zip(rec, ker))
    contexts, mib = show.stray_contexts(run.df)
    value = dict(kernel_min_mib=min(ker), kernel_max_mib=max(ker), growth_mib=growth,
                 gpu0_total_mib=total, tp=_tp(run), gpus=show.visible_gpus(run.df),
                 stray_contexts=contexts, stray_mib=mib)
    return holds(
        growth > 0, f"{count(rec)} → {count(ker)} MiB (+{growth:.0f} at least); GPU-0 "
        f"total {total:.0f} MiB", value)


def _after_zero(run):
    got = _gpu0(run, "after")
    return holds(
        max(got) == 0, f"max {max(got):.0f} MiB over {len(got)} readings (every phase)",
        {"max_mib": max(got)})


def _ipc(run):
    d = run.df[(run.df.variant == "ipc") & (run.df.metric == "grid_device")]
    got, ker = _gpu0(run, "ipc", "received"), _gpu0(run, "ipc", "kernel")
    if d.empty:
        raise ValueError("no `ipc` landing")
    on0 = bool((d.value == 0).all())
    return holds(
        on0 and min(got) > 0, f"grid on {'cuda:0' if on0 else 'not only cuda:0'} in every rank; "
        f"{count(got)} MiB per rank ≥ 1 at `received`, {count(ker)} after a kernel",
        {"received_min_mib": min(got), "kernel_min_mib": min(ker), "kernel_max_mib": max(ker)})


def _landing(run):
    d = run.df[run.df.metric.isin(["grid_device", "grid_key_is_image_grid_thw"])]
    bad = []
    for variant, device, key in (("before", 0, 0), ("after", -1, 1)):
        v = d[d.variant == variant]
        if v.empty:
            raise ValueError(f"no landing rows for `{variant}`")
        dev, k = (v[v.metric == m].value for m in ("grid_device", "grid_key_is_image_grid_thw"))
        if not ((dev == device).all() and (k == key).all()):
            bad.append(variant)
    n = int((d.metric == "grid_device").sum())
    pixels = run.df[run.df.metric == "pixel_values_device"].value
    return holds(
        not bad, f"{n} landings: before cuda:0 / grid_thws, after cpu / image_grid_thw"
        + (f"; wrong in {bad}" if bad else ""),
        dict(landings=n, pixel_values_landings=len(pixels), pixel_values_on_cpu=int(
            (pixels == -1).sum())))


def _no_process_left(run):
    alive = run.df[run.df.metric == "processes_alive"].value
    listed = run.df[run.df.metric == "nvml_processes_listed"].value
    if alive.empty:
        raise ValueError("no leftover check in the run")
    nvml = float(listed.max()) if len(listed) else -1.0
    ok = alive.max() == 0 and nvml <= 0  # -1: not checked (a CPU run)
    return holds(
        ok, f"{len(alive)} groups: max {alive.max():.0f} alive, max {nvml:.0f} listed by NVML",
        {"alive": float(alive.max()), "listed": nvml, "groups": len(alive)})


def _cache(run):
    t = show.cache_table(run.df)
    b, a = t.loc["before"], t.loc["after"]
    rates = {
        f"{k}_{v}": round(float(t.loc[v, f"cache_{m}"]), 6)
        for k, m in (("hit_rate", "item_hit_rate"), ("image_hit_rate", "image_hit_rate"))
        for v in ("before", "after")
    }
    return holds(
        a.cache_item_hit_rate > b.cache_item_hit_rate,
        f"images from the cache {b.cache_image_hit_rate:.1%} per request → "
        f"{a.cache_image_hit_rate:.1%} per image (items hit {b.cache_item_hit_rate:.1%} → "
        f"{a.cache_item_hit_rate:.1%}); images encoded {b.images_encoded:.0f} → "
        f"{a.images_encoded:.0f} of {a.images_requested:.0f}",
        dict(rates, encoded_before=float(b.images_encoded), encoded_after=float(a.images_encoded),
             images=float(a.images_requested), requests=float(b.cache_lookups)))


def _spread(run):
    per = show.gpu0_per_rank(run.df)
    spread = float((per.max_mib - per.min_mib).max()) if len(per) else 0.0
    return holds(spread <= SPREAD_TOLERANCE_MIB,
                 f"{spread:.0f} MiB over {int(run.df.repeat.max()) + 1} repeats",
                 {"spread_mib": spread})


# -- more GPUs, more ranks -------------------------------------------------------------------------
def _needs_other_gpus(run):
    n = show.visible_gpus(run.df)
    return None if n > 2 else (f"the ranks saw {n} GPUs: no GPU is neither GPU 0 nor a rank's own "
                               "(needs a machine with more than 2 GPUs)")


def _other_gpus(run):
    s = show.stray(run.df, gpu0_only=False)
    s = s[(s.gpu != 0) & (s.phase == "kernel")]
    before, after = s[s.variant == "before"], s[s.variant == "after"]
    if before.empty or after.empty:
        raise ValueError("no readings on other GPUs")
    held = before.groupby(["rank", "gpu"]).value.min()
    ok = bool((held > 0).all()) and float(after.value.max()) == 0
    return holds(
        ok, f"before: {int((held > 0).sum())}/{len(held)} (rank, GPU) pairs hold "
        f"{count(held)} MiB; after: max {after.value.max():.0f} MiB",
        {"pairs_holding": int((held > 0).sum()), "pairs": len(held), "min_mib": float(held.min())})


def _needs_tp3(run):
    return None if _tp(run) >= 3 else (f"TP {_tp(run)} has a single rank ≥ 1: the GPU-0 total "
                                       "cannot grow with it")


def _scales(run):
    s = show.stray(run.df)
    s = s[(s.variant == "before") & (s.phase == "kernel")]
    n, totals, per = _tp(run) - 1, s.groupby("repeat").value.sum(), float(s.value.median())
    off = float((totals - n * per).abs().max())
    return holds(off <= SPREAD_TOLERANCE_MIB * n,
                 f"{count(totals)} MiB on GPU 0 = {n} × {per:.0f} MiB (off by {off:.0f})",
                 {"total_mib": float(totals.median()), "per_rank_mib": per, "ranks": n})


# -- method 2: concurrent groups, the time series, eager module loading ----------------------------
def _no_mixing(run):
    c = show.concurrency(run.df)
    if c.empty:
        raise ValueError("no `other_processes` readings")
    others, mine = int(c.others_on_gpu0.max()), float(c.ranks_ge1_on_gpu0_mib.max())
    return holds(
        others >= 1 and mine == 0,
        f"up to {others} other processes on GPU 0 at `init`; ranks ≥ 1 held {mine:.0f} MiB there",
        {"others_on_gpu0": others, "ranks_ge1_init_mib": mine}, why_not=""
        if others >= 1 else "no other group's process was on GPU 0 at any `init`: not shown")


def _rate(run):
    d = run.df[run.df.metric.isin(["sampler_hz", "sampler_errors"])].set_index("metric").value
    if "sampler_hz" not in d:
        raise ValueError("no sampler rows (a CPU run has no NVML)")
    hz, errors = float(d["sampler_hz"]), float(d.get("sampler_errors", 0))
    return holds(hz >= 50 and errors == 0, f"{hz:.0f} Hz, {errors:.0f} failed reads",
                 {"hz": round(hz, 1)})


def _deltas(run, variant: str):
    d = series.step_deltas(run)
    if d is None:
        raise ValueError("the run has no `memory` / `marks` sidecars")
    return d[(d.variant == variant) & (d["rank"] >= 1)]


def _needs_series(run):
    return None if run.sidecar("memory") is not None else ("the run has no memory time series "
                                                           "(sidecar `memory`)")


def _during_unpickle(run):
    u = _deltas(run, "before")
    u = u[u["mark"] == "unpickle"]
    if u.empty:
        raise ValueError("no `unpickle` mark of a rank >= 1 in `before`")
    ok = bool(((u.before_mib == 0) & (u.after_mib > 0)).all())
    return holds(
        ok, f"{len(u)} ranks: {count(u.before_mib)} MiB on GPU 0 when unpickling began, "
        f"{count(u.after_mib)} MiB when the next step began",
        {"ranks": len(u), "after_min_mib": float(u.after_mib.min())})


def _growth_step(run):
    d = _deltas(run, "before")
    k = d[d["mark"].isin(KERNEL_STEPS)]
    if k.empty:
        raise ValueError("no kernel-step marks of a rank >= 1 in `before`")
    big = k[k.delta_mib >= 32]
    per_rank = big.groupby(["repeat", "process"]).size()
    ranks = k.groupby(["repeat", "process"]).ngroups
    marks = sorted(set(big["mark"]))
    ok = len(marks) == 1 and len(per_rank) == ranks and bool((per_rank == 1).all())
    return holds(
        ok, f"+{count(big.delta_mib) if len(big) else '0'} MiB during "
        f"`{'`/`'.join(marks) or '—'}` ({len(per_rank)}/{ranks} ranks, one step each)",
        dict(step_mib=float(big.delta_mib.median()) if len(big) else 0.0,
             mark=marks[0] if len(marks) == 1 else "/".join(marks)))


def _eager(run):
    rec, ker = _gpu0(run, "eager", "received"), _gpu0(run, "eager", "kernel")
    lazy = _gpu0(run, "before", "kernel")
    growth = max(k - r for r, k in zip(rec, ker))
    ok = growth <= 2 and min(rec) > max(lazy)
    return holds(
        ok, f"eager: {count(rec)} MiB at `received`, +{growth:.0f} after the kernel steps "
        f"(lazy: {count(lazy)} after them)",
        {"eager_received_mib": min(rec), "eager_growth_mib": growth, "lazy_kernel_mib": max(lazy)})


M2 = (2, None)
_STRAY, _GROWS = "grid_thw.before.stray_context_gpu0", "grid_thw.before.context_grows"
_IPC, _AFTER = "grid_thw.ipc.lands_on_cuda0", "grid_thw.after.gpu0_untouched"
_CACHE, _SPREAD = "grid_thw.cache.per_image_hits", "grid_thw.repeatable"
_LANDING = "grid_thw.landing"
_UNDER_STRAY = [
    Claim(
        _LANDING, "Before, every rank's grid lands on cuda:0 under `grid_thws`; after, on the "
        "CPU under `image_grid_thw`", "every rank and repeat", _landing,
        context=("pixel_values_landings", "pixel_values_on_cpu")),
    Claim(
        "grid_thw.series.context_at_unpickle", "The stray GPU-0 context appears while a rank "
        "unpickles the request, not before and not later",
        "0 MiB when `unpickle` begins, > 0 MiB when the next step begins", _during_unpickle,
        methods=M2, applies=_needs_series, drift=1.0),
    Claim("grid_thw.tp_scaling", "The GPU-0 waste grows by one context per extra rank",
          f"total = (N − 1) × per-rank, ± {SPREAD_TOLERANCE_MIB:.0f} MiB per rank", _scales,
          applies=_needs_tp3, drift=0.05),
    Claim(
        "grid_thw.other_gpus", "With more GPUs than GPU 0 and its own, every rank ≥ 1 also holds "
        "a context on each other GPU after the kernel steps before the fix; none after",
        "every pair > 0 before; 0 after", _other_gpus, applies=_needs_other_gpus, drift=0.05),
    Claim(_SPREAD, "Repeats (and ranks ≥ 1) of one run read the same GPU-0 memory",
          f"spread ≤ {SPREAD_TOLERANCE_MIB:.0f} MiB", _spread, drift=1.0)
]
_UNDER_GROWS = [
    Claim("grid_thw.series.rate", "The NVML sampler followed every process often enough to "
          "separate the steps", "≥ 50 Hz, no failed read", _rate, methods=M2, applies=_needs_series,
          drift=0.25),
    Claim("grid_thw.series.growth_step", "The stray context's growth comes in one step of tens of "
          "MiB during one kernel step", "≥ 32 MiB, the same step in every rank and repeat",
          _growth_step, methods=M2, applies=_needs_series, drift=0.05),
    Claim(
        "grid_thw.eager.no_growth", "With every module loaded at context creation "
        "(CUDA_MODULE_LOADING=EAGER) the stray context is whole at unpickling and larger, and "
        "the kernel steps do not grow it", "growth ≤ 2 MiB; eager `received` > lazy `kernel`",
        _eager, methods=M2, applies=_has_variant("eager"), drift=0.05)
]
_UNDER_AFTER = [
    Claim(
        "grid_thw.concurrent.no_mixing", "Groups measured side by side do not mix: ranks ≥ 1 "
        "read exactly 0 MiB on GPU 0 at `init` while other groups' processes held memory there",
        "≥ 1 other process; 0 MiB", _no_mixing, methods=M2, drift=1.0),
    Claim("grid_thw.no_process_left", "After every group, none of its processes is alive or "
          "listed by NVML", "0 alive, 0 listed", _no_process_left, drift=1.0)
]
CLAIMS = [
    Claim(
        _STRAY, "Before the fix, every rank ≥ 1 holds memory on GPU 0 once it has unpickled the "
        "grid (a CUDA context for a few dozen bytes)", "> 0 MiB for every rank ≥ 1 and repeat",
        _before_stray, drift=0.05, folded=tuple(_UNDER_STRAY)),
    Claim(_GROWS, "Before the fix, that GPU-0 context grows once kernels have run on the grid",
          "`kernel` > `received` for every rank ≥ 1 and repeat", _before_grows, drift=0.05,
          folded=tuple(_UNDER_GROWS), context=MACHINE),
    Claim(
        _IPC, "Through CUDA IPC (a torch.multiprocessing queue) the grid lands on cuda:0 too, "
        "and every rank ≥ 1 holds memory on GPU 0", "every rank on cuda:0; > 0 MiB", _ipc,
        applies=_has_variant("ipc"), drift=0.05),
    Claim(_AFTER, "After `.cpu()`, no rank ≥ 1 holds anything on GPU 0, in any phase",
          "== 0 MiB exactly", _after_zero, folded=tuple(_UNDER_AFTER)),
    Claim(
        _CACHE, "On the seeded request stream, per-image items hit the vision cache more often "
        "than per-request items", "item hit rate after > before (exact values)", _cache)
]


def shown(runs: list) -> list:
    """The newest run per GPU model and TP size."""
    return newest(runs, lambda r: (gpu_short(r), _tp(r)))


HEADLINE = Headline(
    parts=(f"Each rank ≥ 1 holds {{lo[{_STRAY}][received_min_mib]:.0f}}–"
           f"{{hi[{_STRAY}][received_max_mib]:.0f}} MiB on GPU 0 once it unpickles the grid and "
           f"{{lo[{_GROWS}][kernel_min_mib]:.0f}}–{{hi[{_GROWS}][kernel_max_mib]:.0f}} MiB after a "
           f"kernel, {{hi[{_AFTER}][max_mib]:.0f}} MiB with `.cpu()`",
           "Stray contexts (ranks ≥ 1 on GPUs not their own) before the fix: {runs}",
           f"Via CUDA IPC: {{lo[{_IPC}][kernel_min_mib]:.0f}}–{{hi[{_IPC}][kernel_max_mib]:.0f}} "
           "MiB after a kernel",
           f"Vision cache: {{v[{_CACHE}][image_hit_rate_after]:.1%}} of images served from it "
           f"per image vs {{v[{_CACHE}][image_hit_rate_before]:.1%}} per request."),
    per_run=(f"{{gpu}} TP {{v[{_GROWS}][tp]}} on {{v[{_GROWS}][gpus]}} GPUs: "
             f"{{v[{_GROWS}][stray_contexts]}}, {{v[{_GROWS}][stray_mib]:,.0f}} MiB"), sep=". ",
    run_sep="; ")


# -- the real engine (``scripts/engine_gpu.sh --plan 05``: data/recorded/engine_grid_thw/) ---------
def _engine_applies(run):
    got = show.engine_gpu0(run)
    return None if {"released", "before"} <= set(got) else (
        "this run has no 'released' and 'before' Kimi-K2.5 engines that both started and "
        "recorded their GPU memory")


def _engine_before(run):
    got = show.engine_gpu0(run)
    before, after = got["before"], got["released"]
    ok = bool(before) and all(m > 0 for m in before.values()) and all(
        m == 0 for m in after.values()) and set(before) == set(after)
    contexts, mib = show.engine_stray(run, "before")
    mibs, after_max = list(before.values()), max(after.values(), default=0)
    value = dict(before_min_mib=min(mibs, default=0), before_max_mib=max(mibs, default=0),
                 after_max_mib=after_max, ranks=len(before), gpu0_total_mib=sum(mibs),
                 after_stray_contexts=show.engine_stray(run, "released")[0], tp=show.engine_tp(run),
                 gpus=show.engine_gpus(run), stray_contexts=contexts, stray_mib=mib)
    return holds(
        ok, "GPU 0 held by ranks ≥ 1: " + ", ".join(
            f"TP{r} {m:.0f} MiB" for r, m in sorted(before.items())) + " with #22858 reverted; "
        + ", ".join(f"TP{r} {m:.0f} MiB" for r, m in sorted(after.items())) + " as released", value)


def _engine_needs_tp3(run):
    tp = show.engine_tp(run)
    return _engine_applies(run) or (None if tp >= 3 else (
        f"TP {tp} has a single rank ≥ 1: GPU 0's total cannot grow with the rank count"))


def _engine_scales(run):
    before = show.engine_gpu0(run)["before"]
    n, total = len(before), sum(before.values())
    per = sorted(before.values())[len(before) // 2]
    off = abs(total - n * per)
    return holds(
        n == show.engine_tp(run) - 1 and off <= SPREAD_TOLERANCE_MIB * n,
        f"TP {show.engine_tp(run)}: {total:.0f} MiB on GPU 0 = {n} ranks × {per:.0f} MiB "
        f"(off by {off:.0f})", {"total_mib": float(total), "per_rank_mib": float(per), "ranks": n})


def _engine_sees_more(run):
    n = show.engine_gpus(run)
    return _engine_applies(run) or (None if n >= 3 else (
        f"a machine of {n} GPUs: no GPU besides GPU 0 and a rank's own to look at"))


def _engine_every_gpu(run):
    mem, n, held = show.engine_memory(run), show.engine_gpus(run), show.gpus_held(run)
    before, after = held.get("before", {}), held.get("released", {})
    ok = bool(before) and all(g == list(range(n)) for g in before.values()) and bool(after) and all(
        g == [r] for r, g in after.items())
    others = mem[(mem["case"] == "before") & (mem["rank"].fillna(0) >= 1) & (mem["gpu"] != 0)
                 & (mem["gpu"] != mem["rank"])]["MiB"].astype(float).tolist()

    def where(held):
        return ", ".join(f"TP{r} on GPU {', '.join(map(str, g))}" for r, g in sorted(held.items()))

    return holds(
        ok, f"{n} GPUs; with #22858 reverted: {where(before)}; as released: {where(after)}",
        dict(gpus=n, ranks=len(before), other_gpu_min_mib=min(others, default=0.0),
             other_gpu_max_mib=max(others, default=0.0)))


_E0 = "engine_grid_thw.rank_contexts_on_gpu0"
_E2 = "engine_grid_thw.contexts_on_every_visible_gpu"
ENGINE = engine_claims(
    EXPERIMENT="engine_grid_thw",
    CLAIM="In SGLang's own engine (Kimi-K2.5 tiny, dummy weights, one image, TP 2 and 4), every "
    "scheduler rank ≥ 1 holds memory on GPU 0 when #22858's `.cpu()` is reverted, and none "
    "as released.",
    CLAIMS=[
        Claim(
            _E0, "With #22858's line reverted, every scheduler rank ≥ 1 holds a CUDA context on "
            "GPU 0 (NVML, after the image request); with it, no rank ≥ 1 holds anything there",
            "before: > 0 MiB per rank ≥ 1; released: 0 MiB (exact)", _engine_before,
            applies=_engine_applies, drift=CONTEXT_DRIFT, context=MACHINE),
        Claim(
            "engine_grid_thw.gpu0_total_per_rank", "With #22858's line reverted, GPU 0's total "
            "grows with the rank count: one context per rank ≥ 1 (TP 4: three)",
            f"total = (TP − 1) × per-rank, ± {SPREAD_TOLERANCE_MIB:.0f} MiB per rank",
            _engine_scales, applies=_engine_needs_tp3, drift=CONTEXT_DRIFT),
        Claim(
            _E2, "With #22858's line reverted, a scheduler rank ≥ 1 holds a context on every GPU "
            "of the machine, not only GPU 0 and its own; as released, only on its own (the "
            "rebuild's grid_thw.other_gpus, in the real engine)",
            "before: every rank ≥ 1 on GPUs 0…N−1; released: each rank on its own GPU (exact)",
            _engine_every_gpu, applies=_engine_sees_more, drift=CONTEXT_DRIFT)
    ],
    # one sentence per GPU model, from its runs merged (the newest answer per case)
    HEADLINE=Headline(
        parts=("{runs}",), run_sep="; ",
        per_run=(f"{{gpu}} TP {{v[{_E0}][tp]}} on {{v[{_E0}][gpus]}} GPUs, `.cpu()` reverted: "
                 f"each of the {{v[{_E0}][ranks]}} ranks ≥ 1 holds "
                 f"{{v[{_E0}][before_min_mib]:.0f}}–{{v[{_E0}][before_max_mib]:.0f}} MiB on GPU "
                 f"0 ({{v[{_E0}][gpu0_total_mib]:,.0f}} MiB there), and "
                 f"{{v[{_E0}][stray_contexts]}} stray contexts hold {{v[{_E0}][stray_mib]:,.0f}} "
                 f"MiB on GPUs not their own; as released, {{v[{_E0}][after_stray_contexts]}}.")))

CARD = Card(
    bug="Kimi-K2.5's GPU image preprocessing built the image grid (`grid_thws`, a few dozen bytes) "
    "on `cuda:0` and left it there. Pickled to every TP rank, a tensor is re-created on the device "
    "it was on, so each rank ≥ 1 opened a whole CUDA context on GPU 0; and under Kimi's own key a "
    "request's images could only be cached together.",
    affects="Kimi-K2.5 at TP ≥ 2 with GPU image preprocessing. No release shipped it (the GPU path "
    "arrived with the fix, below); builds of main between the two did, and so does any processor "
    "that returns a CUDA tensor outside `FEATURE_NAMES`. The contexts land on GPU 0 after "
    "start-up, when rank 0 has already sized its KV cache there.",
    found=(("“Fixes redundant CUDA context allocation on device 0 across all TP ranks” (#22858)",
            f"Not on device 0 only: in the engine with `.cpu()` reverted each rank ≥ 1 holds "
            f"{{e[{_E0}][before_max_mib]:.0f}} MiB on GPU 0 and, on a machine of "
            f"{{e[{_E2}][gpus]}} GPUs, a context on every other GPU it can see: "
            f"{{e[{_E0}][stray_contexts]}} stray contexts, {{e[{_E0}][stray_mib]:,.0f}} MiB."),
           ("`grid_thws` “is not in that list [`FEATURE_NAMES`] and stays on `cuda:0`”",
            f"Staying on cuda:0 costs nothing by itself; the hop does: pickle writes a tensor by "
            f"value with its device, each rank re-creates it on cuda:0, and that opens a context "
            f"({{r[{_STRAY}][received_min_mib]:.0f}} MiB at unpickling in the rebuild, "
            f"{{r[{_GROWS}][kernel_max_mib]:.0f}} after a kernel). CUDA IPC lands on cuda:0 too."),
           ("`pixel_values` is built on `cuda:0` too, and `process_mm_data` moves it to the CPU "
            "(`FEATURE_NAMES`)", "It is moved: `pixel_values` reached the ranks on the CPU in "
            f"{{r[{_LANDING}][pixel_values_on_cpu]}} of the rebuild's "
            f"{{r[{_LANDING}][pixel_values_landings]}} landings, and the released engine "
            "(`pixel_values` still built on cuda:0) leaves "
            f"{{e[{_E0}][after_max_mib]:.0f}} MiB on GPU 0 per rank ≥ 1."),
           ("“Enable per-image ViT cache”: `image_grid_thw` lets `get_new_expanded_mm_items` "
            "split per image", f"On a seeded stream of {{r[{_CACHE}][images]:.0f}} images the "
            f"vision tower encodes {{r[{_CACHE}][encoded_before]:.0f}} of them per request and "
            f"{{r[{_CACHE}][encoded_after]:.0f}} per image: "
            f"{{r[{_CACHE}][image_hit_rate_before]:.1%}} of images come from the cache "
            f"before, {{r[{_CACHE}][image_hit_rate_after]:.1%}} after.")))
