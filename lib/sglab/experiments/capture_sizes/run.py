"""The live run: the dense-TP1 boundary captured over each variant's capture sizes on ``world_size`` ranks.

One rank per GPU (NCCL); the ranks form the attention-TP group. Each rank runs the boundary of
:mod:`sglab.fixes.capture_sizes` (``tensor_split`` shard + ``reduce_scatter_tensor`` into it, a per-token stand-in
for the dense MLP, ``all_gather_into_tensor`` back) the way the piecewise runner does: a warm-up at the smallest
size, then per size, largest first, two eager runs and a CUDA-graph capture. Variants:

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

Then, unless ``profile`` is off, a separate traced pass (:mod:`.profile`) runs the capture loop once more under
torch.profiler, so that profiling never touches the rows above.

The sizes: attention TP 8 (the crash report) breaks the default list at 4, 12, 20, 28; with fewer GPUs the
default list is scaled by ``world_size / 8`` so the same four sizes break (at 4 ranks: 2, 6, 10, 14; at 2: 1, 3,
5, 7). ``sizes="default"`` uses the unscaled list (which has no bad size at 2 or 4 ranks).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import warnings
from pathlib import Path

from sglab.core import runs
from sglab.fixes import capture_sizes as fx
from sglab.core import timing as phases

from sglab.experiments.capture_sizes import DEFAULT_PARAMS, EXPERIMENT, TOL


# --------------------------------------------------------------------------------------------------------------
# size lists
# --------------------------------------------------------------------------------------------------------------
def scaled_default_sizes(world_size: int, max_tokens: int = fx.MLA_MAX_TOKENS, reference_tp: int = 8) -> list[int]:
    """The default list scaled by ``world_size / reference_tp`` so that, at attention TP ``world_size``, exactly
    the sizes that break at ``reference_tp`` break (at 8: 4, 12, 20, 28; scaled to 4 ranks: 2, 6, 10, 14).

    Used where the machine has fewer GPUs than the crash needed: the residues modulo the group size are what
    matter, and scaling keeps them."""
    if reference_tp % world_size != 0:
        raise ValueError(f"world_size {world_size} must divide {reference_tp}")
    f = reference_tp // world_size
    return [s // f for s in fx.default_piecewise_capture_sizes(max_tokens) if s % f == 0]


def raw_sizes(world_size: int, sizes: str = "scaled", max_tokens: int = 2048) -> list[int]:
    if sizes == "default":
        return fx.default_piecewise_capture_sizes(max_tokens)
    if sizes == "scaled":
        if 8 % world_size == 0:
            return scaled_default_sizes(world_size, max_tokens, reference_tp=8)
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


def loop_order(sizes: list[int]) -> list[tuple[str, int]]:
    """The piecewise runner's order: a JIT warm-up at the smallest size, then every size largest first."""
    return [("jit_warmup", sizes[0])] + [("capture", n) for n in reversed(sizes)]


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
# one rank's work
# --------------------------------------------------------------------------------------------------------------
def _real_rows(seed: int, rank: int, b: int, t: int, hidden: int, dtype, device):
    import torch

    g = torch.Generator(device=device).manual_seed((((seed * 131 + rank) * 65537 + b) * 8191 + t) % (2**31))
    # small integers: every sum over ranks is exact in bfloat16, so reduce-scatter and all-reduce agree bitwise;
    # drawn on the device (up to 2048 x hidden per replay: on the host that was most of the check's time)
    return torch.randint(-3, 4, (t, hidden), generator=g, device=device).to(dtype=dtype)


def _range(name: str, traced: bool):
    """A profiler phase range in the traced pass; nothing otherwise."""
    if not traced:
        return contextlib.nullcontext()
    from sglab.core import trace

    return trace.phase(name)


class RankWork:
    """One rank's side of the boundary, with the static buffers a piecewise runner captures into, and the rows it
    reports (one per variant, size and metric)."""

    def __init__(self, ctx, params: dict):
        import torch

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

    # -- primitives -------------------------------------------------------------------------------------------
    def sync(self, barrier: bool = True) -> None:
        """Device synchronisation, then (as the runner's ``synchronize(); tp_group.barrier()``) a barrier."""
        import torch

        if self.use_graphs:
            torch.cuda.synchronize(self.dev)
        if barrier:
            self.ctx.barrier()

    def boundary(self, n: int, check: bool = True) -> None:
        x = self.static_in[:n]
        local = fx.scatter_to_attn_tp(x, self.rank, self.w, self.ctx.group, check=check)
        y = fx.dense_tp1_stand_in(local, self.weight)
        fx.gather_from_attn_tp(self.static_out[:n], y, self.ctx.group)

    def row(self, variant, size, metric, value, unit="", **extra) -> None:
        self.rows.append({"variant": variant, "world_size": self.w, "size": int(size), "metric": metric,
                          "value": float(value), "unit": unit, **extra})

    def release(self, graphs: dict) -> None:
        import torch

        graphs.clear()
        if self.use_graphs:
            torch.cuda.synchronize(self.dev)
            torch.cuda.empty_cache()

    # -- the runner's capture loop ----------------------------------------------------------------------------
    def _capture_one(self, n: int, pool):
        """Two eager runs, then a CUDA-graph capture of the boundary at ``n`` tokens (None without CUDA)."""
        import torch

        for _ in range(2):
            self.boundary(n)
            self.sync()
        if not self.use_graphs:
            return None
        g = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call from another thread (e.g. the NCCL watchdog polling events of finished work)
        # must not invalidate this capture
        with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
            self.boundary(n)
        return g

    def capture_all(self, variant: str, sizes: list[int], *, record: bool = True, traced: bool = False,
                    keep_going: bool = False) -> dict:
        """The runner's loop (:func:`loop_order`). A size with unequal shards raises before any collective; the
        loop stops there (as the server did) unless ``keep_going`` (the traced pass, to show every refused size).

        ``record``: report rows (captured / failed with its stage / not_reached). ``traced``: a ``warmup n`` or
        ``capture n`` profiler range per size, and a ``refused n`` range where the error is caught."""
        import torch

        graphs: dict = {}
        pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        for stage, n in loop_order(sizes):
            with _range(f"{'warmup' if stage == 'jit_warmup' else 'capture'} {n}", traced):
                try:
                    self.sync()
                    if stage == "jit_warmup":
                        self.boundary(n)
                        self.sync()  # its kernels end inside its own range (the trace attributes them by time)
                        continue
                    graphs[n] = self._capture_one(n, pool)
                    self.sync()
                except fx.UnequalShards as e:
                    with _range(f"refused {n}", traced):
                        if record:
                            self._failed(variant, sizes, n, e, stage, done=set(graphs))
                    if keep_going:
                        continue
                    return graphs
            if record:
                self.row(variant, n, "captured", 1)
        return graphs

    def _failed(self, variant, sizes, n, e, stage, done) -> None:
        self.row(variant, n, "failed", 1, error=f"{type(e).__name__}: {e}", stage=stage)
        for m in sizes:
            if m not in done and m != n:
                self.row(variant, m, "not_reached", 1)

    # -- replay with padding, and the unguarded collective ----------------------------------------------------
    def replay_check(self, variant: str, graphs: dict) -> None:
        """Replay each bucket with real token counts padded to it; compare with an eager all-reduce reference.

        No barrier between replays: the collectives inside the graphs and the reference pair up in issue order on
        every rank, and each replay's output is read back (``.item()``) before the next input is written."""
        import torch
        import torch.distributed as dist

        for b, ts in replay_token_counts(sorted(graphs)).items():
            worst, ok = 0.0, True
            for t in ts:
                x = _real_rows(self.seed, self.rank, b, t, self.hidden, self.dtype, self.dev)
                self.static_in[:t].copy_(x)
                self.static_in[t:b].zero_()
                if self.use_graphs:
                    graphs[b].replay()
                else:
                    self.boundary(b)
                self.sync(barrier=False)
                got = self.static_out[:t].clone()
                ref = x.clone()
                dist.all_reduce(ref, group=self.ctx.group)
                ref = fx.dense_tp1_stand_in(ref, self.weight)
                err = (got - ref).abs().max().item() if t else 0.0
                worst = max(worst, err)
                ok = ok and bool(torch.isfinite(got).all().item()) and err <= TOL
            self.row(variant, b, "replay_max_abs_err", worst, "abs")
            self.row(variant, b, "replay_ok", int(ok))
            self.row(variant, b, "replay_checks", len(ts))

    def probe(self, variant: str, sizes: list[int]) -> None:
        """Each size on its own, eager, without the shard check: the collective library's own answer."""
        for n in sizes:
            if not _probe_is_safe(n, self.w):  # never true; kept as the stated precondition
                self.row(variant, n, "skipped_unsafe", 1)
                continue
            self.sync()
            try:
                self.boundary(n, check=False)
                self.sync()
                self.row(variant, n, "ok", 1)
            except Exception as e:  # noqa: BLE001 - the collective's own complaint is the measurement
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                self.row(variant, n, "failed", 1, error=f"{type(e).__name__}: {msg}"[:300], stage="eager")
                self.sync()

    def close(self) -> None:
        import torch

        del self.static_in, self.static_out
        if self.use_graphs:
            torch.cuda.empty_cache()


def _rank_main(ctx, params: dict, trace_dir: str | None = None, launched_at: float | None = None) -> dict:
    """One rank: capture + replay the fixed lists, stop on the raw list, probe the collective, then the traced
    pass. Returns ``{"rows", "phases", "events", "trace"}``."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's rename in new torch
    phases.take()
    if launched_at is not None:
        phases.add("spawn + init", time.time() - launched_at)  # process start, imports, CUDA and NCCL init
    work = RankWork(ctx, params)
    for variant in ("before", "pr_filter", "round_up"):
        with phases.phase("capture"):
            graphs = work.capture_all(variant, work.lists[variant])
        if variant != "before":
            with phases.phase("correctness"):
                work.replay_check(variant, graphs)
        work.release(graphs)
    with phases.phase("probe"):
        work.probe("before_probe", work.lists["before_probe"])  # after it only the unguarded collectives
    events, perfetto = None, None
    if trace_dir is not None:
        from sglab.experiments.capture_sizes.profile import traced_pass

        with phases.phase("profile"):
            perfetto = Path(trace_dir) / "capture_sizes.rank0.trace.json.gz" if ctx.rank == 0 else None
            events = traced_pass(work, perfetto=perfetto)
    work.close()
    return {"rows": work.rows, "phases": phases.take(), "events": events,
            "trace": str(perfetto) if perfetto else None}


def _merge(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (variant, size, metric): flags must agree on every rank, errors are the max over ranks."""
    keyed: dict = {}
    for rows in per_rank:
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


def run(params: dict | None = None, *, progress: bool = True) -> runs.Measured:
    """Measure on ``world_size`` ranks; the tidy rows, plus the ``events`` table (every rank) and rank 0's
    Perfetto ``trace`` of the traced pass when ``profile`` is on."""
    from sglab.core import dist

    p = {**DEFAULT_PARAMS, **(params or {})}
    w = int(p["world_size"])
    if w < 2:
        raise ValueError("the boundary needs at least 2 ranks (world_size >= 2)")
    lists = size_lists(w, p["sizes"], int(p["max_tokens"]))
    if progress:
        bad = [n for n in lists["before"] if n % w]
        print(f"{w} ranks ({p['backend']}): {len(lists['before'])} PR-era sizes ({len(bad)} not divisible by {w}: "
              f"{bad}), {len(lists['pr_filter'])} after the PR's filter, {len(lists['round_up'])} rounded up; "
              f"capturing and replaying{', then a traced pass' if p['profile'] else ''} ...", flush=True)
    t0 = time.perf_counter()
    trace_dir = tempfile.mkdtemp(prefix="sglab-capture-sizes-") if p["profile"] else None
    with phases.phase("ranks"):
        per_rank = dist.launch(_rank_main, w, args=(p, trace_dir, time.time()), backend=p["backend"],
                               timeout_s=float(p["timeout_s"]), collective_timeout_s=float(p["collective_timeout_s"]))
    for r, out in enumerate(per_rank):
        phases.merge(out["phases"], prefix=f"rank{r}/")
    rows = _merge([out["rows"] for out in per_rank])
    for r in rows:
        r.setdefault("error", "")
        r.setdefault("stage", "")
    df = runs.tidy(EXPERIMENT, rows)
    if progress:
        print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    if not p["profile"]:
        return runs.Measured(df)
    import pandas as pd

    events = pd.concat([out["events"] for out in per_rank], ignore_index=True)
    return runs.Measured(df, sidecars={"events": events, "trace": per_rank[0]["trace"]})
