"""Per-rank GPU-0 memory when the Kimi-K2.5 image grid travels to the TP ranks on cuda:0 (SGLang #22858).

One variant = fresh processes: a *tokenizer* process (uses ``cuda:0``, builds the processor output with
:func:`sglab.fixes.grid_thw.process_mm_data`) and ``tp_size`` scheduler ranks started by
:func:`sglab.dist.launch` (rank r bound to GPU r, all GPUs visible).

- ``before``: the grid stays on ``cuda:0`` under ``grid_thws``; tokenizer -> rank 0 as pickled bytes over a
  Unix socket (ZMQ ``send_pyobj``), rank 0 -> ranks 1.. with ``broadcast_pyobj`` over the gloo group.
- ``after``: ``grid_thws.cpu()`` under ``image_grid_thw``; same transport.
- ``ipc``: the ``before`` output, sent by the tokenizer to every rank the way a ``torch.multiprocessing``
  queue sends it (``ForkingPickler``: a CUDA IPC handle instead of bytes).

Rank 0 reads NVML memory of every process (ranks and tokenizer) on every GPU at fixed points, all ranks
held at a barrier: ``init`` (each rank has its own context), ``received`` (after unpickling),
``kernel`` (after a kernel ran on the grid where it landed, then on the rank's own GPU), ``released``
(tensors deleted, cache emptied; a CUDA context lives as long as its process). Each rank reports where its
grid landed. After each variant the launcher checks that no process of it is alive or listed by NVML.

The per-image cache point runs on the CPU: :func:`cache_rows` (seeded request stream).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from typing import Any

import pandas as pd

from .. import runs
from ..fixes import grid_thw as fx

EXPERIMENT = "grid_thw"
METHOD_VERSION = 1
GPUS = 2
DEFAULT_PARAMS = {
    "tp_size": 2,
    "variants": ["before", "after", "ipc"],
    "repeats": 3,
    "n_images": 4,
    "settle_s": 0.3,
    # per-image cache point (CPU)
    "cache_requests": 200,
    "cache_pool": 24,
    "cache_max_images": 4,
    "seed": 0,
}
VARIANTS = ("before", "after", "ipc")
PHASES = ("init", "received", "kernel", "released")
CONNECT_TIMEOUT_S = 120.0


def _row(variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, "tp_size": -1, "repeat": -1, "process": "", "rank": -1, "gpu": -1, "phase": ""}
    row.update(kw)
    row.update(metric=metric, value=float(value), unit=unit)
    return row


def _device_index(device) -> int:
    """-1 for the CPU, k for cuda:k."""
    return -1 if device.type == "cpu" else int(device.index if device.index is not None else 0)


# ------------------------------------------------------------------------------------------------------
# The tokenizer process
# ------------------------------------------------------------------------------------------------------


def _tokenizer_main(variant: str, n_clients: int, address: str, n_images: int, device: str) -> None:
    """Build one multi-image request on ``device`` and send it to ``n_clients`` connections."""
    from multiprocessing.connection import Listener

    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    listener = Listener(address, family="AF_UNIX")
    try:
        images = [fx.synthetic_image(i) for i in range(n_images)]
        out = fx.process_mm_data(fx.prompt_for(n_images), images, fixed=(variant == "after"), device=device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        data = None if variant == "ipc" else fx.send_pyobj(out)
        conns = [listener.accept() for _ in range(n_clients)]
        for c in conns:
            # ipc: one dump per receiver, as one queue.put per consumer would (each dump counts one reference)
            c.send_bytes(fx.ipc_dumps(out) if variant == "ipc" else data)
        # Keep the tensors alive until every receiver is done (required for CUDA IPC; harmless otherwise).
        for c in conns:
            if c.poll(CONNECT_TIMEOUT_S):
                c.recv()
            c.close()
        del out
    finally:
        listener.close()


def _connect(address: str):
    from multiprocessing.connection import Client

    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            return Client(address, family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tokenizer socket {address} did not open within {CONNECT_TIMEOUT_S:g} s")
            time.sleep(0.05)


# ------------------------------------------------------------------------------------------------------
# One scheduler rank
# ------------------------------------------------------------------------------------------------------


def _rank_main(ctx, variant: str, address: str, tokenizer_pid: int, settle_s: float) -> dict:
    import torch
    import torch.distributed as tdist

    cuda = ctx.device.type == "cuda"
    if cuda:  # the rank's own context on its own GPU (the baseline)
        torch.ones(1, device=ctx.device).add_(1).sum().item()
        torch.cuda.synchronize(ctx.device)
    pids: list[Any] = [None] * ctx.world_size
    tdist.all_gather_object(pids, os.getpid(), group=ctx.cpu_group)
    labels = {pid: f"rank {r}" for r, pid in enumerate(pids)}
    labels[tokenizer_pid] = "tokenizer"

    memory_rows: list[dict] = []
    nvml_ok = cuda and ctx.rank == 0  # rank 0 reads NVML for everyone (NVML opens no CUDA context)
    if nvml_ok:
        from ..measure import memory

    def snapshot(phase: str) -> None:
        ctx.barrier()
        if nvml_ok:
            time.sleep(settle_s)
            df = memory.process_gpu_memory(list(labels))
            n_gpus = torch.cuda.device_count()
            for pid, who in labels.items():
                for gpu in range(n_gpus):
                    used = df[(df.pid == pid) & (df.gpu == gpu)].used_mib.sum()
                    rank = -1 if who == "tokenizer" else int(who.split()[1])
                    memory_rows.append(_row(variant, "gpu_memory", used, "MiB", process=who, rank=rank,
                                            gpu=gpu, phase=phase))
        ctx.barrier()

    snapshot("init")

    # --- receive -----------------------------------------------------------------------------------
    conn = _connect(address) if (ctx.rank == 0 or variant == "ipc") else None
    if variant == "ipc":
        req = fx.recv_pyobj(conn.recv_bytes())  # each rank gets its own copy of the IPC handles
    else:
        req = fx.recv_pyobj(conn.recv_bytes()) if ctx.rank == 0 else None
        req = fx.broadcast_pyobj([req] if ctx.rank == 0 else [], ctx.rank, ctx.cpu_group, src=0)[0]
    key = fx.grid_key(req)
    grid = req[key]
    landed = {"rank": ctx.rank, "pid": os.getpid(), "grid_key": key,
              "grid_device": str(grid.device), "pixel_values_device": str(req["pixel_values"].device)}
    snapshot("received")

    # --- a kernel on the grid where it landed, then on the rank's own device -----------------------
    n_patches = int(torch.prod(grid, dim=-1).sum().item())
    n_patches_own = int(torch.prod(grid.to(ctx.device), dim=-1).sum().item())
    assert n_patches == n_patches_own == req["pixel_values"].shape[0]
    snapshot("kernel")

    # --- release ------------------------------------------------------------------------------------
    del grid, req
    gc.collect()
    if cuda:
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()
    if conn is not None:
        conn.send("done")
        conn.close()
    snapshot("released")
    return {"landed": landed, "memory_rows": memory_rows}


# ------------------------------------------------------------------------------------------------------
# One variant, fresh processes
# ------------------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def run_variant(variant: str, tp_size: int, *, n_images: int = 4, settle_s: float = 0.3,
                backend: str = "nccl", repeat: int = 0) -> list[dict]:
    """Start a tokenizer and ``tp_size`` ranks, measure, tear everything down; tidy row dicts."""
    import multiprocessing as mp

    from .. import dist

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    device = "cuda:0" if backend == "nccl" else "cpu"
    tmp = tempfile.mkdtemp(prefix="sglab-grid-")
    address = os.path.join(tmp, "tokenizer.sock")
    n_clients = tp_size if variant == "ipc" else 1
    tok = mp.get_context("spawn").Process(target=_tokenizer_main, name="sglab-tokenizer",
                                          args=(variant, n_clients, address, n_images, device))
    tok.start()
    try:
        results = dist.launch(_rank_main, tp_size, args=(variant, address, tok.pid, settle_s), backend=backend,
                              timeout_s=240, collective_timeout_s=120)
        tok.join(timeout=60)
        tok_exit = tok.exitcode
    finally:
        if tok.is_alive():
            tok.terminate()
            tok.join(timeout=5)
            if tok.is_alive():
                tok.kill()
                tok.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)

    common = {"tp_size": tp_size, "repeat": repeat}
    rows: list[dict] = []
    for r in results:
        for m in r["memory_rows"]:
            m.update(common)
            rows.append(m)
        land = r["landed"]
        dev = land["grid_device"]
        idx = -1 if dev == "cpu" else int(dev.split(":")[1]) if ":" in dev else 0
        pv = land["pixel_values_device"]
        pv_idx = -1 if pv == "cpu" else int(pv.split(":")[1]) if ":" in pv else 0
        base = dict(common, process=f"rank {land['rank']}", rank=land["rank"], phase="received")
        rows.append(_row(variant, "grid_device", idx, "device index (-1 = cpu)", **base))
        rows.append(_row(variant, "pixel_values_device", pv_idx, "device index (-1 = cpu)", **base))
        rows.append(_row(variant, "grid_key_is_image_grid_thw", land["grid_key"] == "image_grid_thw", "bool",
                         **base))

    # Every process of this variant must be gone, and NVML must no longer list any of them.
    pids = [r["landed"]["pid"] for r in results] + [tok.pid]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = sum(_alive(p) for p in pids)
    listed = -1
    if backend == "nccl":
        from ..measure import memory

        while time.monotonic() < deadline:
            listed = len(memory.process_gpu_memory(pids))
            if listed == 0:
                break
            time.sleep(0.2)
    after = dict(common, process="all", phase="exited")
    rows.append(_row(variant, "processes_alive", alive, "count", **after))
    rows.append(_row(variant, "nvml_processes_listed", listed, "count (-1 = not checked)", **after))
    rows.append(_row(variant, "tokenizer_exitcode", -99 if tok_exit is None else tok_exit, "code", **after))
    return rows


# ------------------------------------------------------------------------------------------------------
# The per-image cache point (CPU)
# ------------------------------------------------------------------------------------------------------


def cache_rows(*, n_requests: int = 200, pool: int = 24, max_images: int = 4, seed: int = 0) -> list[dict]:
    """Embedding-cache hits for the same seeded stream, bundled (before) vs split per image (after)."""
    stream = fx.request_stream(n_requests, pool, max_images, seed)
    rows = []
    for variant, fixed in (("before", False), ("after", True)):
        s = fx.simulate_cache(stream, fixed=fixed)
        kw = {"process": "cache", "phase": "cache"}
        rows += [_row(variant, "cache_item_hit_rate", s.hit_rate, "fraction", **kw),
                 _row(variant, "cache_image_hit_rate", s.image_hit_rate, "fraction", **kw),
                 _row(variant, "cache_lookups", s.lookups, "count", **kw),
                 _row(variant, "images_encoded", s.images_encoded, "count", **kw),
                 _row(variant, "images_requested", s.images, "count", **kw)]
    return rows


# ------------------------------------------------------------------------------------------------------
# run() and analysis helpers
# ------------------------------------------------------------------------------------------------------


def run(params: dict | None = None, *, progress: bool = True, backend: str = "nccl") -> pd.DataFrame:
    """All variants × repeats at one TP size (fresh processes each), plus the cache point."""
    from tqdm.auto import tqdm

    p = dict(DEFAULT_PARAMS)
    p.update(params or {})
    tp = int(p["tp_size"])
    plan = [(rep, v) for rep in range(int(p["repeats"])) for v in p["variants"]]
    rows: list[dict] = []
    bar = tqdm(plan, desc=f"grid_thw tp={tp}", disable=not progress)
    for rep, variant in bar:
        bar.set_postfix_str(f"repeat {rep} {variant}")
        rows += run_variant(variant, tp, n_images=int(p["n_images"]), settle_s=float(p["settle_s"]),
                            backend=backend, repeat=rep)
    rows += [dict(r, tp_size=tp) for r in cache_rows(n_requests=int(p["cache_requests"]), pool=int(p["cache_pool"]),
                                                     max_images=int(p["cache_max_images"]), seed=int(p["seed"]))]
    return runs.tidy(EXPERIMENT, rows)


def run_name(run) -> str:
    """Short, unique name of one run: GPU, TP size, GPUs on the machine, start time (UTC)."""
    m = run.manifest
    gpu = str(m.get("gpu_name", "?")).replace("NVIDIA ", "")
    tp = int(m.get("params", {}).get("tp_size", m.get("gpu_count", 0)))
    mem = run.df[run.df.metric == "gpu_memory"]
    visible = int(mem.gpu.max()) + 1 if len(mem) else int(m.get("gpu_count", tp))  # GPUs the ranks saw
    box = int(m.get("gpu_count_machine", visible))
    created = str(m.get("created_utc", ""))
    return f"{gpu} TP {tp}, {box}-GPU machine, {created[:10]} {created[11:16]}Z"


def frame(runs_: list) -> pd.DataFrame:
    """All runs in one tidy frame with a ``run`` column (:func:`run_name`), oldest run first."""
    frames = [r.df.assign(run=run_name(r)) for r in runs_]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _by_run(df: pd.DataFrame) -> list[str]:
    return ["run"] if "run" in df.columns else []


def memory_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.metric == "gpu_memory"]


def heatmap(df: pd.DataFrame, variant: str, phase: str = "kernel") -> pd.DataFrame:
    """Process × GPU MiB (median over repeats) for one variant and phase, of ONE run."""
    m = memory_frame(df)
    m = m[(m.variant == variant) & (m.phase == phase)]
    t = m.groupby(["rank", "process", "gpu"]).value.median().reset_index()
    t = t.sort_values(["rank"], key=lambda s: s.where(s >= 0, 10**6))
    table = t.pivot_table(index="process", columns="gpu", values="value", sort=False)
    table = table[sorted(table.columns)]
    table.columns = [f"GPU {int(c)}" for c in table.columns]
    table.index.name = None
    return table


def gpu0_per_rank(df: pd.DataFrame) -> pd.DataFrame:
    """MiB each rank >= 1 holds on GPU 0 (where it has no business), per run (when ``df`` has a ``run`` column),
    variant, TP size and phase: median, min and max over repeats and ranks, and how many values."""
    m = memory_frame(df)
    m = m[(m.gpu == 0) & (m["rank"] >= 1)]
    g = m.groupby(_by_run(m) + ["variant", "tp_size", "phase"]).value
    out = pd.DataFrame({"median_mib": g.median(), "min_mib": g.min(), "max_mib": g.max(), "n": g.size()})
    return out.reset_index()


def waste_vs_tp(df: pd.DataFrame, phase: str = "kernel") -> pd.DataFrame:
    """Total MiB on GPU 0 held by ranks 1..N-1, per run (when ``df`` has a ``run`` column), variant and TP size
    (median, min, max over repeats; runs are never summed together)."""
    m = memory_frame(df)
    m = m[(m.gpu == 0) & (m["rank"] >= 1) & (m.phase == phase)]
    keys = _by_run(m) + ["variant", "tp_size"]
    per_rep = m.groupby(keys + ["repeat"]).value.sum().reset_index()
    g = per_rep.groupby(keys).value
    return pd.DataFrame({"median_mib": g.median(), "min_mib": g.min(), "max_mib": g.max(),
                         "repeats": g.size()}).reset_index()


def off_rank_gpus(df: pd.DataFrame) -> pd.DataFrame:
    """MiB ranks >= 1 hold on GPUs that are neither GPU 0 nor their own, per run, variant and phase: how many
    (rank, GPU) pairs hold anything, the median MiB of those, and the total per repeat (median)."""
    m = memory_frame(df)
    m = m[(m["rank"] >= 1) & (m.gpu != 0) & (m.gpu != m["rank"])]
    keys = _by_run(m) + ["variant", "tp_size", "phase"]
    rows = []
    for key, g in m.groupby(keys):
        held = g[g.value > 0]
        per_rep = g.groupby("repeat").value.sum()
        pairs = held.groupby(["rank", "gpu"]).ngroups
        rows.append(dict(zip(keys, key), gpus_per_run=int(m.gpu.max()) + 1 if len(m) else 0,
                         pairs_holding=pairs, pairs=g.groupby(["rank", "gpu"]).ngroups,
                         median_mib_per_pair=float(held.value.median()) if len(held) else 0.0,
                         total_mib=float(per_rep.median())))
    return pd.DataFrame(rows)


def repeatability(df: pd.DataFrame, variants=("before", "ipc", "after")) -> pd.DataFrame:
    """MiB per rank >= 1 on GPU 0, one column per run, one row per variant and phase: the value when every repeat
    and rank agree, "lo–hi" when they do not (the spread within a run); ``n`` values per cell."""
    per = gpu0_per_rank(df)
    cell = [f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}" for lo, hi in zip(per.min_mib, per.max_mib)]
    per = per.assign(mib=[f"{c} (n={n})" for c, n in zip(cell, per.n)])
    cols = _by_run(per) or ["tp_size"]
    t = per.pivot_table(index=["variant", "phase"], columns=cols, values="mib", aggfunc="first")
    order = [(v, p) for v in variants for p in PHASES if (v, p) in t.index]
    t = t.loc[order]
    t.columns.name = None
    return t


def landing(df: pd.DataFrame) -> pd.DataFrame:
    """Where each rank's grid landed (one row per variant × TP × rank; the set of devices over repeats and runs)."""
    d = df[df.metric.isin(["grid_device", "grid_key_is_image_grid_thw"])]
    idx = _by_run(d) + ["variant", "tp_size", "rank", "repeat"]
    out = d.pivot_table(index=idx, columns="metric", values="value").reset_index()
    out["grid_device"] = ["cpu" if v < 0 else f"cuda:{int(v)}" for v in out["grid_device"]]
    out["grid_key"] = ["image_grid_thw" if v else "grid_thws" for v in out["grid_key_is_image_grid_thw"]]
    out["repeat_id"] = out[_by_run(out) + ["repeat"]].astype(str).agg("/".join, axis=1)
    agg = out.groupby(["variant", "tp_size", "rank"]).agg(
        grid_key=("grid_key", lambda s: "/".join(sorted(set(s)))),
        grid_device=("grid_device", lambda s: "/".join(sorted(set(s)))),
        repeats=("repeat_id", "nunique")).reset_index()
    return agg


def leftovers(df: pd.DataFrame) -> pd.DataFrame:
    """Per run, variant and TP size: processes still alive / still listed by NVML after each variant (max over
    repeats), and how many variant runs were checked."""
    d = df[df.metric.isin(["processes_alive", "nvml_processes_listed"])]
    idx = _by_run(d) + ["variant", "tp_size"]
    t = d.pivot_table(index=idx, columns="metric", values="value", aggfunc="max").reset_index()
    checked = d[d.metric == "processes_alive"].groupby(idx).size().rename("variant_runs_checked").reset_index()
    t = t.merge(checked, on=idx)
    t.columns.name = None
    return t


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"


def headline(runs_: list) -> str:
    """The README line: per GPU model, MiB each rank >= 1 holds on GPU 0 before (after unpickling, after one kernel)
    and after the fix, the GPU-0 total per TP size, over every recorded run and repeat, and the largest spread
    between repeats of one run."""
    if not runs_:
        return "A `grid_thws` tensor left on cuda:0 makes every TP rank open a CUDA context on GPU 0 (no run yet)."
    by_gpu: dict = {}
    for r in runs_:
        by_gpu.setdefault(str(r.manifest.get("gpu_name", "?")).replace("NVIDIA ", ""), []).append(r)
    parts = []
    for gpu_name, rs in sorted(by_gpu.items()):
        df = frame(rs)
        per = gpu0_per_rank(df)
        m = memory_frame(df)
        m = m[(m.gpu == 0) & (m["rank"] >= 1)]

        def vals(variant, phase=None):
            sel = m[(m.variant == variant) & ((m.phase == phase) if phase else (m.phase != "init"))]
            return list(sel.value)

        waste = waste_vs_tp(df)
        waste = waste[waste.variant == "before"]
        tps = ", ".join(f"TP {tp}: {_span(list(g.min_mib) + list(g.max_mib))} MiB"
                        for tp, g in waste.groupby("tp_size"))
        spread = float((per.max_mib - per.min_mib).max())
        kernel = _span(vals("before", "kernel"))
        ipc = _span(vals("ipc", "kernel")) if vals("ipc", "kernel") else None
        ipc_note = "" if ipc is None else " (same via CUDA IPC)" if ipc == kernel else f" ({ipc} MiB via CUDA IPC)"
        parts.append(
            f"{gpu_name}, per rank ≥1 on GPU 0: {_span(vals('before', 'received'))} MiB once unpickled, "
            f"{kernel} MiB after a kernel{ipc_note} → {_span(vals('after'))} MiB with `.cpu()`; GPU-0 total at "
            f"{tps} ({len(rs)} runs × {int(df.repeat.max()) + 1} repeats, spread within a run {spread:.0f} MiB)")
    return ("A `grid_thws` tensor left on cuda:0 makes every TP rank ≥1 open a CUDA context on GPU 0. "
            + "; ".join(parts) + ".")
