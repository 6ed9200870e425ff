"""Measure where the grid lands and what each process then holds on each GPU (NVML), per variant
(:data:`VARIANTS`). A *group* is one variant × repeat of fresh processes (a tokenizer building the
request on ``cuda:0``, ``tp_size`` ranks), all groups at once; rank 0 reads NVML at the
:data:`PHASES` barriers, and every process marks its steps for the parent's NVML time series."""

from __future__ import annotations

import ctypes
import gc
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Client, Listener

import psutil
import torch
import torch.distributed as tdist

from sglab.core import dist, hardware, memory, runs, timing as phases
from sglab.grid_thw import rebuild


EXPERIMENT = "grid_thw"
METHOD_VERSION = 2  # 1: groups one after the other, no time series; 2: at once, NVML series, marks
GPUS = 2
# settle_s: barrier -> NVML reading; step_pause_s: between kernel steps, so a 100 Hz series tells
# them apart; timeout_s: per group; cache_*: the cache point
DEFAULT_PARAMS = dict(tp_size=2, repeats=2, n_images=4, settle_s=0.1, step_pause_s=0.1,
                      sample_hz=100, timeout_s=120, start_method="forkserver", cache_requests=200,
                      cache_pool=24, cache_max_images=4, seed=0,
                      variants=["before", "after", "ipc", "eager"])
# the rank and tokenizer functions below are pickled by name: the server imports this module
FORKSERVER_PRELOAD = ("torch", "sglab.grid_thw.measure")
PHASES = ("init", "received", "kernel", "released")
CONNECT_TIMEOUT_S = 120.0
TOKENIZER_DEADLINE_S = 300.0  # a tokenizer process ends itself after this long, whatever happens


def gpus(params: dict) -> int:
    return int(params.get("tp_size", DEFAULT_PARAMS["tp_size"]))


def tp_sizes(sizes) -> list[int]:
    """The TP sizes this machine has the GPUs for (none without CUDA)."""
    return [int(n) for n in sizes if hardware.meets(int(n))[0]]


@dataclass(frozen=True)
class Variant:
    """The PR's switch, the wire of the first hop, the ranks' environment."""

    name: str
    fixed: bool  # _gpu_call after the PR (grid .cpu(), key image_grid_thw)
    wire: rebuild.Wire  # the tokenizer -> scheduler hop; per receiver: ranks read the tokenizer
    rank_env: tuple = ()  # (key, value) pairs set in the ranks before CUDA starts


VARIANTS = dict(
    before=Variant("before", False, rebuild.PICKLE),
    after=Variant("after", True, rebuild.PICKLE),
    ipc=Variant("ipc", False, rebuild.CUDA_IPC),
    # every module of the ranks loaded when their contexts are created
    eager=Variant("eager", False, rebuild.PICKLE, (("CUDA_MODULE_LOADING", "EAGER"),)))

_DEFAULTS = {"tp_size": -1, "repeat": -1, "process": "", "rank": -1, "gpu": -1, "phase": ""}


def _row(variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, **_DEFAULTS, **kw}
    return {**row, "metric": metric, "value": float(value), "unit": unit}


@contextmanager
def mark(marks: list, name: str):
    """Add ``(name, start, end)`` on the machine-wide monotonic clock to ``marks``."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        marks.append((name, t0, time.monotonic()))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the processes of a group (forked from the server, which imported this module once) ------------
def tokenizer_main(variant: str, n_clients: int, address: str, n_images: int, device: str,
                   marks_path: str) -> None:
    """Send a multi-image request built on ``device`` to ``n_clients``, kept till all are done."""
    # never outlive a dead parent: unconnected, a tokenizer would wait in accept() forever
    deadline = threading.Timer(TOKENIZER_DEADLINE_S, os._exit, args=(3,))
    deadline.daemon = True
    deadline.start()
    v, marks = VARIANTS[variant], []
    dev = torch.device(device)
    if dev.type == "cuda":
        with mark(marks, "cuda init"):
            torch.cuda.set_device(dev)
    listener = Listener(address, family="AF_UNIX")
    try:
        images = [rebuild.synthetic_image(i) for i in range(n_images)]
        with mark(marks, "preprocess"):  # includes grid_thws.cpu() in `after`
            out = rebuild.process_mm_data(rebuild.prompt_for(n_images), images, fixed=v.fixed,
                                          device=dev)
            _sync(dev)
        data = None if v.wire.per_receiver else v.wire.dumps(out)
        conns = [listener.accept() for _ in range(n_clients)]
        with mark(marks, "send"):
            for c in conns:  # one dump per receiver where the wire counts references (CUDA IPC)
                c.send_bytes(data or v.wire.dumps(out))
        for c in conns:
            if c.poll(CONNECT_TIMEOUT_S):
                c.recv()
            c.close()
        del out
    finally:
        listener.close()
        with open(marks_path, "w") as f:
            json.dump({"pid": os.getpid(), "marks": marks}, f)


class Snapshots:
    """Rank 0's NVML readings at the barriers: this group's processes and others', on every GPU."""

    def __init__(self, ctx, variant: str, labels: dict[int, str], settle_s: float):
        self.ctx, self.variant, self.labels, self.settle_s = ctx, variant, labels, settle_s
        self.reads = ctx.device.type == "cuda" and ctx.rank == 0  # NVML opens no CUDA context
        self.n_gpus = torch.cuda.device_count() if self.reads else 0
        self.rows: list[dict] = []

    def __call__(self, phase: str) -> None:
        with phases.phase("snapshots"):
            self.ctx.barrier()
            if self.reads:
                time.sleep(self.settle_s)
                self._read(phase)
            self.ctx.barrier()

    def _read(self, phase: str) -> None:
        every = memory.all_processes()
        for pid, who in self.labels.items():
            rank = -1 if who == "tokenizer" else int(who.split()[1])
            for gpu in range(self.n_gpus):
                used = sum(r["used_mib"] for r in every if r["pid"] == pid and r["gpu"] == gpu)
                self.rows.append(
                    _row(self.variant, "gpu_memory", used, "MiB", process=who, rank=rank, gpu=gpu,
                         phase=phase))
        for gpu in range(self.n_gpus):
            others = {r["pid"] for r in every if r["gpu"] == gpu and r["pid"] not in self.labels}
            self.rows.append(
                _row(self.variant, "other_processes", len(others), "count", process="others",
                     gpu=gpu, phase=phase))


def _receive(ctx, v: Variant, address: str, marks: list):
    """Rank 0 (each rank on a per-receiver wire) reads the tokenizer's bytes; others a broadcast."""
    w, conn, deadline = v.wire, None, time.monotonic() + CONNECT_TIMEOUT_S
    while conn is None and (ctx.rank == 0 or w.per_receiver):
        try:
            conn = Client(address, family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tokenizer socket {address} did not open within "
                                   f"{CONNECT_TIMEOUT_S:g} s")
            time.sleep(0.02)
    data = conn.recv_bytes() if conn is not None else None
    if not w.per_receiver:
        ctx.barrier()  # rank 0 holds the bytes: the mark spans the broadcast and the unpickling
    with mark(marks, "unpickle"):
        if w.per_receiver:
            return w.loads(data), conn
        sent = [w.loads(data)] if ctx.rank == 0 else []
        return rebuild.broadcast_pyobj(sent, ctx.rank, ctx.cpu_group)[0], conn


def stack_limit(device) -> int:
    """``CU_LIMIT_STACK_SIZE`` of ``device``'s primary context, bytes per thread (-1: not read)."""
    if device.type != "cuda":
        return -1
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return -1
    value = ctypes.c_size_t(0)
    with torch.cuda.device(device):
        rc = lib.cuCtxGetLimit(ctypes.byref(value), 0)  # 0 = CU_LIMIT_STACK_SIZE
    return int(value.value) if rc == 0 else -1


def _kernel_steps(ctx, grid, n_rows: int, marks: list, pause_s: float) -> dict[str, int]:
    """What a model does with the grid, a mark each, a pause between; the stack limit after each."""
    held: dict = {}
    stack: dict[str, int] = {}

    def step(name: str, fn, sync=None) -> None:  # sync: the device to synchronise after fn
        with mark(marks, name):
            fn()
            if sync is not None:
                _sync(sync)
        stack[name] = stack_limit(grid.device)
        time.sleep(pause_s)

    step("first kernel", lambda: held.update(p=torch.prod(grid, dim=-1)), grid.device)
    step("reduce", lambda: held.update(s=held["p"].sum()), grid.device)
    step("item", lambda: held.update(n=int(held["s"].item())))
    step("copy to own GPU", lambda: held.update(own=grid.to(ctx.device)), ctx.device)
    step("own-GPU kernel",
         lambda: held.update(n_own=int(torch.prod(held["own"], dim=-1).sum().item())))
    assert held["n"] == held["n_own"] == n_rows, (held["n"], held["n_own"], n_rows)
    return stack


def rank_main(ctx, spec: dict) -> dict:
    """One scheduler rank; ``spec``: variant, address, tokenizer_pid, settle_s, step_pause_s."""
    t_entry = time.monotonic()
    v, marks = VARIANTS[spec["variant"]], []
    # the rank's own context on its own GPU (NCCL init by the launcher is already done)
    with phases.phase("own context"), mark(marks, "own context"):
        if ctx.device.type == "cuda":
            torch.ones(1, device=ctx.device).add_(1).sum().item()
            torch.cuda.synchronize(ctx.device)
    pids: list = [None] * ctx.world_size
    tdist.all_gather_object(pids, os.getpid(), group=ctx.cpu_group)
    labels = {pid: f"rank {r}" for r, pid in enumerate(pids)}
    labels[spec["tokenizer_pid"]] = "tokenizer"
    snap = Snapshots(ctx, v.name, labels, float(spec["settle_s"]))
    snap("init")
    with phases.phase("receive"):
        req, conn = _receive(ctx, v, spec["address"], marks)
    key = rebuild.grid_key(req)
    grid = req[key]
    landed = dict(rank=ctx.rank, pid=os.getpid(), grid_key=key, grid_device=str(grid.device),
                  pixel_values_device=str(req["pixel_values"].device))
    snap("received")
    with phases.phase("kernel steps"):
        landed["stack"] = _kernel_steps(ctx, grid, int(req["pixel_values"].shape[0]), marks,
                                        float(spec["step_pause_s"]))
    snap("kernel")
    with phases.phase("release"), mark(marks, "release"):
        del grid, req
        gc.collect()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
            torch.cuda.empty_cache()
        if conn is not None:
            conn.send("done")
            conn.close()
    snap("released")
    return dict(landed=landed, memory_rows=snap.rows, marks=marks, t_entry=t_entry,
                phases=phases.take())


# -- one group, from the parent --------------------------------------------------------------------
def _device_index(dev: str) -> int:
    """-1 for the CPU, k for cuda:k."""
    return -1 if dev == "cpu" else int(dev.split(":")[1]) if ":" in dev else 0


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _stop(proc, wait_s: float = 60.0):
    """Join within ``wait_s``, then terminate, then kill; the exit code (None if it never ended)."""
    proc.join(timeout=wait_s)
    for end in (proc.terminate, proc.kill):
        if not proc.is_alive():
            break
        end()
        proc.join(timeout=5)
    return proc.exitcode


def _group_rows(variant: str, results: list[dict], pids: list[int], nccl: bool, common: dict,
                tok_exit) -> list[dict]:
    """Where the grid landed per rank; the processes alive and listed by NVML after 10 s."""
    rows = []
    for r in results:
        rows += [{**m, **common} for m in r["memory_rows"]]
        land = r["landed"]
        base = dict(common, process=f"rank {land['rank']}", rank=land["rank"], phase="received")
        gpu = _device_index(land["grid_device"])
        rows += (_row(variant, "grid_device", gpu, "device index (-1 = cpu)", **base),
                 _row(variant, "pixel_values_device", _device_index(land["pixel_values_device"]),
                      "device index (-1 = cpu)", **base),
                 _row(variant, "grid_key_is_image_grid_thw", land["grid_key"] == "image_grid_thw",
                      "bool", **base))
        for step, value in (land.get("stack") or {}).items():
            if value >= 0:  # the grid's device is a GPU: its context's stack after each step
                rows.append(
                    _row(variant, "stack_limit_bytes", value, "bytes per thread",
                         **dict(base, gpu=gpu, phase=step)))
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive, listed = sum(_alive(p) for p in pids), -1
    while nccl:
        listed = len(memory.process_gpu_memory(pids))
        if listed == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    kw = dict(common, process="all", phase="exited")
    return rows + [
        _row(variant, "processes_alive", alive, "count", **kw),
        _row(variant, "nvml_processes_listed", listed, "count (-1 = not checked)", **kw),
        _row(variant, "tokenizer_exitcode", -99 if tok_exit is None else tok_exit, "code", **kw)
    ]


def run_group(variant: str, tp_size: int, *, repeat: int = 0, n_images: int = 4,
              settle_s: float = 0.3, step_pause_s: float = 0.1, backend: str = "nccl",
              timeout_s: float = 120.0, start_method: str = "spawn") -> dict:
    """One group, a tokenizer and ``tp_size`` ranks, measured and torn down: rows, series inputs."""
    v = VARIANTS[variant]
    tmp = tempfile.mkdtemp(prefix="sglab-grid-")
    address, marks_path = os.path.join(tmp, "tokenizer.sock"), os.path.join(tmp, "tokenizer.json")
    t_start = time.monotonic()
    tok = mp.get_context(start_method).Process(
        target=tokenizer_main, name=f"sglab-tokenizer-{variant}-{repeat}",
        args=(variant, tp_size if v.wire.per_receiver else 1, address, n_images,
              "cuda:0" if backend == "nccl" else "cpu", marks_path))
    tok.start()
    try:
        spec = dict(variant=variant, address=address, tokenizer_pid=tok.pid, settle_s=settle_s,
                    step_pause_s=step_pause_s)
        results = dist.launch(rank_main, tp_size, args=(spec,), backend=backend,
                              timeout_s=timeout_s, collective_timeout_s=min(120.0, timeout_s),
                              env=dict(v.rank_env), start_method=start_method)
        tok_exit = _stop(tok)
        try:  # none when the tokenizer died first: the group's other checks say why
            with open(marks_path) as f:
                tok_marks = json.load(f)["marks"]
        except (OSError, ValueError, KeyError):
            tok_marks = []
    finally:
        _stop(tok, wait_s=0)
        shutil.rmtree(tmp, ignore_errors=True)
    common = {"tp_size": tp_size, "repeat": repeat}
    landed = [r["landed"] for r in results]
    pids = [x["pid"] for x in landed] + [tok.pid]
    rows = _group_rows(variant, results, pids, backend == "nccl", common, tok_exit)
    procs = {x["pid"]: (f"rank {x['rank']}", x["rank"]) for x in landed}
    procs = {tok.pid: ("tokenizer", -1), **procs}
    marks = [(*procs[tok.pid], *m) for m in tok_marks]
    marks += [(*procs[x["pid"]], *m) for r, x in zip(results, landed) for m in r["marks"]]
    t_entry = [r["t_entry"] - t_start for r in results]
    return dict(variant=variant, repeat=repeat, rows=rows, t_start=t_start, t_end=time.monotonic(),
                procs=procs, marks=marks, phases=[r["phases"] for r in results], t_entry=t_entry)


# -- the cache point (CPU) -------------------------------------------------------------------------
def simulate_cache(stream: list[list[int]], *, fixed: bool) -> rebuild.CacheStats:
    """Each request of ``stream`` through the processor path (CPU) and the embedding cache."""
    cache, images = rebuild.EmbeddingCache(), {}
    for image_ids in stream:
        imgs = [images.setdefault(i, rebuild.synthetic_image(i)) for i in image_ids]
        result = rebuild.process_mm_data(rebuild.prompt_for(len(imgs)), imgs, fixed=fixed,
                                         device="cpu")
        cache.lookup_request(rebuild.items_for_request(result))
    return cache.stats


def cache_rows(*, n_requests: int = 200, pool: int = 24, max_images: int = 4,
               seed: int = 0) -> list[dict]:
    """Embedding-cache hits of one seeded stream, bundled (before) vs split per image (after)."""
    stream = rebuild.request_stream(n_requests, pool, max_images, seed)
    rows = []
    for variant, fixed in (("before", False), ("after", True)):
        s = simulate_cache(stream, fixed=fixed)
        kw = {"process": "cache", "phase": "cache"}
        rows += (_row(variant, "cache_item_hit_rate", s.hit_rate, "fraction", **kw),
                 _row(variant, "cache_image_hit_rate", s.image_hit_rate, "fraction", **kw),
                 _row(variant, "cache_lookups", s.lookups, "count", **kw),
                 _row(variant, "images_encoded", s.images_encoded, "count", **kw),
                 _row(variant, "images_requested", s.images, "count", **kw))
    return rows


# -- run() -----------------------------------------------------------------------------------------
def check_params(p: dict) -> None:
    unknown = [v for v in p["variants"] if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if int(p["tp_size"]) < 2:
        raise ValueError(f"tp_size must be >= 2 (the effect is on ranks >= 1), got {p['tp_size']}")
    if p["start_method"] not in ("spawn", "forkserver"):
        raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {p['start_method']!r}")
    if int(p["repeats"]) < 1:
        raise ValueError(f"repeats must be >= 1, got {p['repeats']}")


def _run_groups(plan: list[tuple[str, int]], p: dict, backend: str, progress: bool,
                cache_job) -> tuple:
    """All groups and the CPU cache point at once, a thread each; a failure raised at the end."""
    kw = dict(tp_size=int(p["tp_size"]), n_images=int(p["n_images"]), settle_s=float(p["settle_s"]),
              step_pause_s=float(p["step_pause_s"]), backend=backend,
              timeout_s=float(p["timeout_s"]), start_method=p["start_method"])
    groups, errors = [], []
    if progress:
        print(f"grid_thw tp={p['tp_size']}: {len(plan)} groups at once")
    with ThreadPoolExecutor(max_workers=len(plan) + 1, thread_name_prefix="sglab-group") as pool:
        cache = pool.submit(cache_job)
        futures = {pool.submit(run_group, v, repeat=rep, **kw): (v, rep) for v, rep in plan}
        for fut in as_completed(futures):
            v, rep = futures[fut]
            try:
                groups.append(fut.result())
                status = "done"
            except Exception as e:  # noqa: BLE001 - collected, raised below
                errors.append(((v, rep), e))
                status = "failed"
            if progress:
                print(f"  group {v} · repeat {rep}: {status} "
                      f"({len(groups) + len(errors)}/{len(plan)})")
        cache_rows_ = cache.result()
    if errors:
        (v, rep), e = errors[0]
        raise RuntimeError(f"grid_thw group {v} (repeat {rep}) failed: {e}") from e
    return sorted(groups, key=lambda g: plan.index((g["variant"], g["repeat"]))), cache_rows_


def run(params: dict | None = None, *, progress: bool = True,
        backend: str = "nccl") -> runs.Measured:
    """Every variant × repeat at one TP size as concurrent groups, plus the cache point."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    check_params(p)
    tp = int(p["tp_size"])
    plan = [(v, rep) for rep in range(int(p["repeats"])) for v in p["variants"]]

    def cache_job():
        with phases.phase("cache point (CPU)"):
            return cache_rows(n_requests=int(p["cache_requests"]), pool=int(p["cache_pool"]),
                              max_images=int(p["cache_max_images"]), seed=int(p["seed"]))

    if p["start_method"] == "forkserver":
        with phases.phase("fork server"):  # torch imported once, in the server
            dist.forkserver(FORKSERVER_PRELOAD)
    sampler = memory.Sampler(float(p["sample_hz"])).start() if backend == "nccl" else None
    try:
        with phases.phase("groups (all at once)"):
            groups, cache = _run_groups(plan, p, backend, progress, cache_job)
    finally:
        if sampler is not None:
            sampler.stop()
        if p["start_method"] == "forkserver":
            dist.stop_forkserver()
    per: dict[str, list[float]] = {}  # rank phases: the mean over the groups (side by side)
    for g in groups:
        for r, (d, t_entry) in enumerate(zip(g["phases"], g["t_entry"])):
            for k, val in {**d, "start (process, CUDA, NCCL init)": t_entry}.items():
                per.setdefault(f"rank{r}/{k}", []).append(val)
    phases.merge({k: sum(v) / len(v) for k, v in per.items()})
    rows = [r for g in groups for r in g["rows"]] + [dict(r, tp_size=tp) for r in cache]
    extra = {}
    if sampler is not None:
        with phases.phase("time series"):
            kw = {"tp_size": tp, "process": "sampler", "phase": "series"}
            rows += (_row("all", "sampler_hz", sampler.achieved_hz(), "Hz", **kw),
                     _row("all", "sampler_ticks", len(sampler.ticks), "count", **kw),
                     _row("all", "sampler_errors", sampler.errors, "count", **kw))
            from sglab.grid_thw import series  # it reads this module's steps

            extra = series.sidecars(groups, sampler.samples(), sampler.ticks)
    if progress:
        print(f"grid_thw tp={tp}: {len(rows)} rows")
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=extra,
                         extra={"concurrent_groups": len(plan)})
