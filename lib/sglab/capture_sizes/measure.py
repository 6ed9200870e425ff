"""The dense-TP1 boundary on ``world_size`` ranks (a GPU each, NCCL; ``gloo``: CPU, no graphs),
captured as the piecewise runner does (:func:`loop_order`): ``before`` (stops at the first bad
size), ``before_probe`` (no shard check), ``pr_filter``, ``round_up`` (replayed); a traced pass."""

from __future__ import annotations

import contextlib
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as tdist

from sglab.capture_sizes import rebuild as fx
from sglab.core import dist, runs, timing as phases, trace


EXPERIMENT = "capture_sizes"
# 1: capture loop, replay check and probe rows; 2: plus per-phase wall times and a traced pass of
# the capture loop (the `events` and `trace` sidecars)
METHOD_VERSION = 2
GPUS = 2
# world_size: the attention-TP group (a GPU each); sizes: "scaled" (default list x world_size/8: the
# tp-8 failures) or "default"; backend "gloo": the same on the CPU, no graphs; start_method
# "forkserver": ranks fork from a server that imported torch once, "spawn": a fresh interpreter
DEFAULT_PARAMS = dict(world_size=2, sizes="scaled", max_tokens=2048, hidden=1024, dtype="bfloat16",
                      seed=0, backend="nccl", timeout_s=420, collective_timeout_s=60, profile=True,
                      start_method="forkserver")
FORKSERVER_PRELOAD = ("torch", "sglab.capture_sizes.measure")
VARIANTS = ("before", "before_probe", "pr_filter", "round_up")
TOL = 1e-4  # max abs error accepted per replay (float32 per-token op on exact integer sums)
# the traced pass: (variant, size list, keep going after a refusal)
TRACED = (("before", "before", True), ("after", "pr_filter", False))
EVENT_COLUMNS = [*trace.COLUMNS, "variant", "rank"]
COLLECTIVE_OP = r"^c10d::.*(?:reduce_scatter|allgather|all_gather)"  # the boundary's two
CAPTURE_RUNTIME = r"BeginCapture|EndCapture|GraphInstantiate"
DEVICE = ("kernel", "memcpy", "memset")


def gpus(params: dict) -> int:
    return int(params["world_size"])


# -- size lists ------------------------------------------------------------------------------------
def raw_sizes(world_size: int, sizes: str = "scaled", max_tokens: int = 2048) -> list[int]:
    """The default list, or (``scaled``, ``world_size`` dividing 8) it times ``world_size / 8``."""
    if sizes not in ("scaled", "default"):
        raise ValueError(f"sizes must be 'scaled' or 'default', got {sizes!r}")
    default = fx.default_piecewise_capture_sizes(max_tokens)
    if sizes == "default" or 8 % world_size:
        return default  # e.g. 3 ranks: breaks as is
    return [s // (8 // world_size) for s in default if s % (8 // world_size) == 0]


def size_lists(world_size: int, sizes: str = "scaled",
               max_tokens: int = 2048) -> dict[str, list[int]]:
    """The capture list of each variant (attention TP = ``world_size``, attention CP 1)."""
    raw = raw_sizes(world_size, sizes, max_tokens)
    return {"before_probe": raw, **fx.policy_lists(raw, world_size)}


def loop_order(sizes: list[int]) -> list[tuple[str, int]]:
    """The piecewise runner's order: a JIT warm-up at the smallest size, then largest first."""
    return [("jit_warmup", sizes[0])] + [("capture", n) for n in reversed(sizes)]


def replay_token_counts(buckets: list[int]) -> dict[int, list[int]]:
    """Real token counts per bucket: the smallest mapping to it, one below it, the bucket."""
    out, prev = {}, 0
    for b in sorted(buckets):
        out[b] = sorted({prev + 1, max(prev + 1, b - 1), b})
        prev = b
    return out


# -- one rank's work -------------------------------------------------------------------------------
class RankWork:
    """One rank's side of the boundary: a piecewise runner's static buffers, the rows it reports."""

    def __init__(self, ctx, params: dict):
        self.ctx, self.rank, self.w, self.dev = ctx, ctx.rank, ctx.world_size, ctx.device
        self.hidden, self.seed = int(params["hidden"]), int(params["seed"])
        self.dtype = getattr(torch, params["dtype"])
        torch.manual_seed(self.seed)
        self.lists = size_lists(self.w, params["sizes"], int(params["max_tokens"]))
        max_n = max(max(v) for v in self.lists.values())
        self.use_graphs = self.dev.type == "cuda"
        self.static_in = torch.zeros(max_n, self.hidden, dtype=self.dtype, device=self.dev)
        self.static_out = torch.zeros(max_n, self.hidden, dtype=torch.float32, device=self.dev)
        self.weight = ((torch.arange(self.hidden, device=self.dev) % 7) + 1).float() / 4
        self.rows: list[dict] = []

    def sync(self, barrier: bool = True) -> None:
        """Device synchronisation, then (as the runner's ``tp_group.barrier()``) a barrier."""
        if self.use_graphs:
            torch.cuda.synchronize(self.dev)
        if barrier:
            self.ctx.barrier()

    def boundary(self, n: int, check: bool = True) -> None:
        local = fx.scatter_to_attn_tp(self.static_in[:n], self.rank, self.w, self.ctx.group,
                                      check=check)
        y = fx.dense_tp1_stand_in(local, self.weight)
        fx.gather_from_attn_tp(self.static_out[:n], y, self.ctx.group)

    def row(self, variant, size, metric, value, unit="", **extra) -> None:
        self.rows.append(
            dict(variant=variant, world_size=self.w, size=int(size), metric=metric,
                 value=float(value), unit=unit, **extra))

    def release(self, graphs: dict) -> None:
        graphs.clear()
        if self.use_graphs:
            torch.cuda.synchronize(self.dev)
            torch.cuda.empty_cache()

    def _capture_one(self, n: int, pool):
        """Two eager runs, then a CUDA-graph capture at ``n`` tokens (None without CUDA)."""
        for _ in range(2):
            self.boundary(n)
            self.sync()
        if not self.use_graphs:
            return None
        g = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call from another thread (the NCCL watchdog polling events of
        # finished work) must not invalidate this capture
        with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
            self.boundary(n)
        return g

    def capture_all(self, variant: str, sizes: list[int], *, record: bool = True,
                    traced: bool = False, keep_going: bool = False) -> dict:
        """The runner's loop (:func:`loop_order`), stopped by a refusal unless ``keep_going``."""
        graphs: dict = {}
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        phase = trace.phase if traced else (lambda name: contextlib.nullcontext())
        for stage, n in loop_order(sizes):
            with phase(f"{'warmup' if stage == 'jit_warmup' else 'capture'} {n}"):
                try:
                    self.sync()
                    if stage == "jit_warmup":
                        self.boundary(n)
                        self.sync()  # its kernels end inside its own range
                        continue
                    graphs[n] = self._capture_one(n, pool)
                    self.sync()
                except fx.UnequalShards as e:
                    with phase(f"refused {n}"):
                        if record:
                            self.row(variant, n, "failed", 1, error=f"{type(e).__name__}: {e}",
                                     stage=stage)
                            for m in (m for m in sizes if m not in graphs and m != n):
                                self.row(variant, m, "not_reached", 1)
                    if keep_going:
                        continue
                    return graphs
            if record:
                self.row(variant, n, "captured", 1)
        return graphs

    def replay_check(self, variant: str, graphs: dict) -> None:
        """Replay each bucket with real token counts padded to it against an eager all-reduce."""
        for b, ts in replay_token_counts(sorted(graphs)).items():
            worst, ok = 0.0, True
            for t in ts:
                g = torch.Generator(device=self.dev).manual_seed(
                    (((self.seed * 131 + self.rank) * 65537 + b) * 8191 + t) % (2**31))
                # small integers: every sum over ranks is exact in bfloat16, so reduce-scatter and
                # all-reduce agree bitwise; drawn on the device (the host took most of the time)
                x = torch.randint(-3, 4, (t, self.hidden), generator=g,
                                  device=self.dev).to(self.dtype)
                self.static_in[:t].copy_(x)
                self.static_in[t:b].zero_()
                graphs[b].replay() if self.use_graphs else self.boundary(b)
                self.sync(barrier=False)  # the collectives pair up in issue order
                got, ref = self.static_out[:t].clone(), x.clone()
                tdist.all_reduce(ref, group=self.ctx.group)
                ref = fx.dense_tp1_stand_in(ref, self.weight)
                err = (got - ref).abs().max().item() if t else 0.0
                worst = max(worst, err)
                ok = ok and bool(torch.isfinite(got).all().item()) and err <= TOL
            self.row(variant, b, "replay_max_abs_err", worst, "abs")
            self.row(variant, b, "replay_ok", int(ok))
            self.row(variant, b, "replay_checks", len(ts))

    def probe(self, variant: str, sizes: list[int]) -> None:
        """Each size eager, without the shard check: the collective's own answer."""
        for n in sizes:
            self.sync()
            try:
                self.boundary(n, check=False)  # torch's size check fails before NCCL is called
                self.sync()
                self.row(variant, n, "ok", 1)
            except Exception as e:  # noqa: BLE001 - the collective's complaint is the measurement
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                self.row(variant, n, "failed", 1, error=f"{type(e).__name__}: {msg}"[:300],
                         stage="eager")
                self.sync()

    def close(self) -> None:
        del self.static_in, self.static_out
        if self.use_graphs:
            torch.cuda.empty_cache()


# -- the traced pass: the capture loop once more under torch.profiler, before and after the filter -
def traced_pass(work: RankWork, *, perfetto=None):
    """The :data:`TRACED` loops under one profiler (``before`` goes on after refusals); events."""
    with contextlib.ExitStack() as stack:
        with phases.phase("profile: start"):  # the profiler's own warm-up session, then this one
            rec = stack.enter_context(
                trace.Recorder(perfetto=perfetto, keep_ops=True, cuda=work.use_graphs))
        with phases.phase("profile: traced loops"):
            for variant, key, keep_going in TRACED:
                with trace.phase(variant):
                    graphs = work.capture_all(variant, work.lists[key], record=False, traced=True,
                                              keep_going=keep_going)
                work.release(graphs)
        t0 = time.perf_counter()
    phases.add("profile: collect", time.perf_counter() - t0)  # torch's events, the Perfetto file
    with phases.phase("profile: reduce"):
        return reduce_events(rec.events, rank=work.rank)


def reduce_events(ev, *, rank: int, variants=tuple(v for v, _, _ in TRACED)):
    """Ranges, collectives, device work and capture calls per variant (:data:`EVENT_COLUMNS`)."""
    device_lane = ev.lane.str.startswith("stream") | (ev.lane == "device")
    names = ev.name.str.replace(trace.PHASE_PREFIX, "", regex=False)
    is_range = (ev.category == "range") & ev.name.str.startswith(trace.PHASE_PREFIX)
    tops = ev[is_range & ~device_lane & names.isin(variants)]
    starts = sorted((float(r.start_us), names[i]) for i, r in tops.iterrows())
    if not starts:
        return pd.DataFrame(columns=EVENT_COLUMNS)
    keep = ((is_range & ~names.isin(variants))
            | ((ev.category == "op") & ev.name.str.contains(COLLECTIVE_OP))
            | ev.category.isin(DEVICE)
            | ((ev.category == "runtime") & ev.name.str.contains(CAPTURE_RUNTIME)))
    out = ev[keep].copy()
    out["variant"] = ""
    for t0, variant in starts:  # each event gets the last variant started before it
        out.loc[out.start_us >= t0, "variant"] = variant
    out = out[out.variant != ""]
    for t0, variant in starts:
        out.loc[out.variant == variant, "start_us"] -= t0
    out["rank"] = int(rank)
    return out[EVENT_COLUMNS].sort_values(["variant", "start_us"],
                                          kind="stable").reset_index(drop=True)


# -- the run ---------------------------------------------------------------------------------------
def _rank_main(ctx, params: dict, trace_dir: str | None, launched_at: float) -> dict:
    """One rank: capture + replay the fixed lists, the raw list, the probe, the traced pass."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's rename
    phases.take()
    phases.add("spawn + init", time.time() - launched_at)  # start, imports, CUDA, NCCL
    work = RankWork(ctx, params)
    for variant in ("before", "pr_filter", "round_up"):
        with phases.phase("capture"):
            graphs = work.capture_all(variant, work.lists[variant])
        if variant != "before":
            with phases.phase("correctness"):
                work.replay_check(variant, graphs)
        work.release(graphs)
    with phases.phase("probe"):
        work.probe("before_probe", work.lists["before_probe"])  # the unguarded collectives last
    events, perfetto = None, None
    if trace_dir is not None:
        with phases.phase("profile"):
            perfetto = (Path(trace_dir) / "capture_sizes.rank0.trace.json.gz"
                        if ctx.rank == 0 else None)
            events = traced_pass(work, perfetto=perfetto)
    work.close()
    return dict(rows=work.rows, phases=phases.take(), events=events,
                trace=str(perfetto) if perfetto else None)


def _merge(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (variant, size, metric): flags must agree on every rank, errors are the max."""
    keyed: dict = {}
    for x in (x for rows in per_rank for x in rows):
        keyed.setdefault((x["variant"], x["size"], x["metric"]), []).append(x)
    out = []
    for k, xs in keyed.items():
        if len(xs) != len(per_rank):
            raise RuntimeError(f"row {xs[0]} came from fewer than {len(per_rank)} ranks")
        values = [x["value"] for x in xs]
        pick = {"replay_max_abs_err": max, "replay_ok": min}.get(k[2])
        if pick is None and len(set(values)) > 1:
            raise RuntimeError(f"ranks disagree on {k}: {values}")
        out.append(dict(xs[0], value=(pick or min)(values)))
    return out


def run(params: dict | None = None, *, progress: bool = True) -> runs.Measured:
    """Measure on ``world_size`` ranks: rows, and with ``profile`` the ``events`` and ``trace``."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    w = int(p["world_size"])
    if w < 2:
        raise ValueError("the boundary needs at least 2 ranks (world_size >= 2)")
    lists = size_lists(w, p["sizes"], int(p["max_tokens"]))
    if progress:
        bad = [n for n in lists["before"] if n % w]
        print(
            f"[capture_sizes] {w} ranks ({p['backend']}): {len(lists['before'])} PR-era sizes "
            f"({len(bad)} not divisible by {w}: {bad}), {len(lists['pr_filter'])} after the "
            f"PR's filter, {len(lists['round_up'])} rounded up", flush=True)
        print(
            "[capture_sizes] capturing, replaying, probing"
            + (", then a traced pass" if p["profile"] else "") + " ...", flush=True)
    t0 = time.perf_counter()
    trace_dir = tempfile.mkdtemp(prefix="sglab-capture-sizes-") if p["profile"] else None
    if p["start_method"] == "forkserver":
        dist.forkserver(FORKSERVER_PRELOAD)
    try:
        with phases.phase("ranks"):
            per_rank = dist.launch(_rank_main, w, args=(p, trace_dir, time.time()),
                                   backend=p["backend"], timeout_s=float(p["timeout_s"]),
                                   collective_timeout_s=float(p["collective_timeout_s"]),
                                   start_method=p["start_method"])
    finally:
        if p["start_method"] == "forkserver":
            dist.stop_forkserver()
    for r, out in enumerate(per_rank):
        phases.merge(out["phases"], prefix=f"rank{r}/")
    merged = _merge([out["rows"] for out in per_rank])
    rows = [dict(r, error=r.get("error", ""), stage=r.get("stage", "")) for r in merged]
    df = runs.tidy(EXPERIMENT, rows)
    if progress:
        print(f"[capture_sizes] done in {time.perf_counter() - t0:.1f} s", flush=True)
    if not p["profile"]:
        return runs.Measured(df)
    events = pd.concat([out["events"] for out in per_rank], ignore_index=True)
    return runs.Measured(df, sidecars={"events": events, "trace": per_rank[0]["trace"]})
