"""The processes of one measured group: a tokenizer and ``tp_size`` scheduler ranks (GPU driver code).

A *group* is one variant × repeat: a tokenizer process that builds the processor output on ``cuda:0`` and sends it,
and ``tp_size`` ranks started by :func:`sglab.core.dist.launch` (rank r bound to GPU r, every GPU visible). Every process
takes *marks* (``time.monotonic()`` ranges, the machine-wide clock the parent's NVML sampler also uses) around the
steps that can open or grow a CUDA context, so the memory time series can say which step did it. A pause between the
kernel steps keeps them apart at a 100 Hz sampling rate.

Rank 0 of the group reads NVML for every process of the group on every GPU at four barriers (``PHASES``): ``init``
(each rank holds its own context), ``received`` (unpickled), ``kernel`` (kernel steps done), ``released`` (tensors
deleted, cache emptied — a CUDA context lives as long as its process). It also counts the processes of *other*
groups it sees on each GPU: groups run concurrently, and NVML's per-process numbers must not mix (the experiment
checks that they do not).
"""

from __future__ import annotations

import gc
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sglab.fixes import grid_thw as fx
from sglab.core import timing as phases

PHASES = ("init", "received", "kernel", "released")
KERNEL_STEPS = ("first kernel", "reduce", "item", "copy to own GPU", "own-GPU kernel")
CONNECT_TIMEOUT_S = 120.0
TOKENIZER_DEADLINE_S = 300.0  # a tokenizer process ends itself after this long, whatever happens


@dataclass(frozen=True)
class Variant:
    """What differs between the measured paths: the PR's switch, the wire of the first hop, the ranks' env."""

    name: str
    fixed: bool  # _gpu_call after the PR (grid .cpu(), key image_grid_thw)
    wire: str  # fx.WIRES key of the tokenizer -> scheduler hop
    rank_env: tuple = ()  # (key, value) pairs set in the ranks before CUDA starts

    @property
    def fanout(self) -> str:
        """How ranks >= 1 get the request: from rank 0 (``broadcast_pyobj``) or straight from the tokenizer."""
        return "tokenizer" if fx.wire(self.wire).per_receiver else "broadcast"


VARIANTS = {
    "before": Variant("before", False, "pickle"),
    "after": Variant("after", True, "pickle"),
    "ipc": Variant("ipc", False, "cuda_ipc"),
    # `before` with every module of the ranks loaded when their contexts are created: does the growth at the first
    # kernel steps come from lazy module loading?
    "eager": Variant("eager", False, "pickle", (("CUDA_MODULE_LOADING", "EAGER"),)),
}


class Marks:
    """``(name, start, end)`` ranges on the machine-wide monotonic clock."""

    def __init__(self) -> None:
        self.items: list[tuple[str, float, float]] = []

    @contextmanager
    def mark(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.items.append((name, t0, time.monotonic()))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------------------------
# the tokenizer
# ------------------------------------------------------------------------------------------------------------------
def tokenizer_main(variant: str, n_clients: int, address: str, n_images: int, device: str, marks_path: str) -> None:
    """Build one multi-image request on ``device``, send it to ``n_clients`` connections, keep it alive until every
    receiver is done (CUDA IPC needs that), write the marks to ``marks_path``."""
    import threading
    from multiprocessing.connection import Listener

    import torch

    # Never outlive a parent that died: a tokenizer no rank ever connects to would wait in accept() forever.
    deadline = threading.Timer(TOKENIZER_DEADLINE_S, os._exit, args=(3,))
    deadline.daemon = True
    deadline.start()
    v, marks = VARIANTS[variant], Marks()
    dev = torch.device(device)
    if dev.type == "cuda":
        with marks.mark("cuda init"):
            torch.cuda.set_device(dev)
    listener = Listener(address, family="AF_UNIX")
    try:
        images = [fx.synthetic_image(i) for i in range(n_images)]
        with marks.mark("preprocess"):  # includes grid_thws.cpu() in `after`
            out = fx.process_mm_data(fx.prompt_for(n_images), images, fixed=v.fixed, device=dev)
            _sync(dev)
        w = fx.wire(v.wire)
        data = None if w.per_receiver else w.dumps(out)
        conns = [listener.accept() for _ in range(n_clients)]
        with marks.mark("send"):
            for c in conns:  # one dump per receiver where the wire counts references per dump (CUDA IPC)
                c.send_bytes(w.dumps(out) if w.per_receiver else data)
        for c in conns:
            if c.poll(CONNECT_TIMEOUT_S):
                c.recv()
            c.close()
        del out
    finally:
        listener.close()
        with open(marks_path, "w") as f:
            json.dump({"pid": os.getpid(), "marks": marks.items}, f)


def _connect(address: str):
    from multiprocessing.connection import Client

    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            return Client(address, family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tokenizer socket {address} did not open within {CONNECT_TIMEOUT_S:g} s")
            time.sleep(0.02)


# ------------------------------------------------------------------------------------------------------------------
# one scheduler rank
# ------------------------------------------------------------------------------------------------------------------
def _row(variant: str, metric: str, value: float, unit: str, **kw) -> dict:
    row = {"variant": variant, "tp_size": -1, "repeat": -1, "process": "", "rank": -1, "gpu": -1, "phase": ""}
    row.update(kw)
    row.update(metric=metric, value=float(value), unit=unit)
    return row


class Snapshots:
    """Rank 0's NVML readings at the barriers, for the labelled processes of this group on every GPU, plus the number
    of other processes (of concurrent groups) listed on each GPU."""

    def __init__(self, ctx, variant: str, labels: dict[int, str], settle_s: float):
        import torch

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
        from sglab.core import memory

        every = memory.all_processes()
        for pid, who in self.labels.items():
            rank = -1 if who == "tokenizer" else int(who.split()[1])
            for gpu in range(self.n_gpus):
                used = sum(r["used_mib"] for r in every if r["pid"] == pid and r["gpu"] == gpu)
                self.rows.append(_row(self.variant, "gpu_memory", used, "MiB", process=who, rank=rank, gpu=gpu,
                                      phase=phase))
        for gpu in range(self.n_gpus):
            others = {r["pid"] for r in every if r["gpu"] == gpu and r["pid"] not in self.labels}
            self.rows.append(_row(self.variant, "other_processes", len(others), "count", process="others",
                                  gpu=gpu, phase=phase))


def _own_context(ctx) -> None:
    """The rank's own context on its own GPU (the baseline every variant shares)."""
    import torch

    if ctx.device.type == "cuda":
        torch.ones(1, device=ctx.device).add_(1).sum().item()
        torch.cuda.synchronize(ctx.device)


def _labels(ctx, tokenizer_pid: int) -> dict[int, str]:
    import torch.distributed as tdist

    pids: list[Any] = [None] * ctx.world_size
    tdist.all_gather_object(pids, os.getpid(), group=ctx.cpu_group)
    labels = {pid: f"rank {r}" for r, pid in enumerate(pids)}
    labels[tokenizer_pid] = "tokenizer"
    return labels


def _receive(ctx, v: Variant, address: str, marks: Marks):
    """Rank 0 (every rank on a per-receiver wire) reads the tokenizer's bytes; the rest get ``broadcast_pyobj``."""
    w = fx.wire(v.wire)
    conn = _connect(address) if (ctx.rank == 0 or v.fanout == "tokenizer") else None
    data = conn.recv_bytes() if conn is not None else None
    if v.fanout == "broadcast":
        ctx.barrier()  # rank 0 holds the bytes: the mark below spans the broadcast and the unpickling only
    with marks.mark("unpickle"):
        if v.fanout == "tokenizer":
            req = w.loads(data)
        else:
            req = w.loads(data) if ctx.rank == 0 else None
            req = fx.broadcast_pyobj([req] if ctx.rank == 0 else [], ctx.rank, ctx.cpu_group, src=0)[0]
    return req, conn


def stack_limit(device) -> int:
    """``CU_LIMIT_STACK_SIZE`` of ``device``'s primary context, in bytes per thread (-1 off CUDA or on error).

    Why: the driver raises this limit when a launched kernel needs more local memory per thread than is reserved,
    and reserves that much for every thread the GPU can hold at once — memory NVML counts for the process. Reading it
    around each kernel step tells a local-memory resize apart from other growth."""
    import ctypes

    import torch

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


def _kernel_steps(ctx, grid, n_rows: int, marks: Marks, pause_s: float) -> dict[str, int]:
    """What a model does with the grid: a kernel where it landed, a reduction, ``.item()``, a copy to the rank's own
    GPU and a kernel there — one mark each, a pause between, so that the time series can tell them apart. Returns the
    stack limit of the grid's device after each step."""
    import torch

    held: dict = {}
    stack: dict[str, int] = {}  # (read after kernels only: before the first launch the reading is not meaningful)

    def step(name: str, fn) -> None:
        with marks.mark(name):
            fn()
        stack[name] = stack_limit(grid.device)
        time.sleep(pause_s)

    def first():
        held["p"] = torch.prod(grid, dim=-1)
        _sync(grid.device)

    def reduce():
        held["s"] = held["p"].sum()
        _sync(grid.device)

    def copy():
        held["own"] = grid.to(ctx.device)
        _sync(ctx.device)

    step("first kernel", first)
    step("reduce", reduce)
    step("item", lambda: held.__setitem__("n", int(held["s"].item())))
    step("copy to own GPU", copy)
    step("own-GPU kernel", lambda: held.__setitem__("n_own", int(torch.prod(held["own"], dim=-1).sum().item())))
    assert held["n"] == held["n_own"] == n_rows, (held["n"], held["n_own"], n_rows)
    return stack


def rank_main(ctx, spec: dict) -> dict:
    """One scheduler rank of one group; ``spec``: variant, address, tokenizer_pid, settle_s, step_pause_s."""
    import torch

    t_entry = time.monotonic()
    v, marks = VARIANTS[spec["variant"]], Marks()
    with phases.phase("own context"), marks.mark("own context"):  # NCCL init (by the launcher) is already done
        _own_context(ctx)
    snap = Snapshots(ctx, v.name, _labels(ctx, spec["tokenizer_pid"]), float(spec["settle_s"]))
    snap("init")
    with phases.phase("receive"):
        req, conn = _receive(ctx, v, spec["address"], marks)
    key = fx.grid_key(req)
    grid = req[key]
    landed = {"rank": ctx.rank, "pid": os.getpid(), "grid_key": key, "grid_device": str(grid.device),
              "pixel_values_device": str(req["pixel_values"].device)}
    snap("received")
    with phases.phase("kernel steps"):
        landed["stack"] = _kernel_steps(ctx, grid, int(req["pixel_values"].shape[0]), marks,
                                        float(spec["step_pause_s"]))
    if grid.device.type == "cuda":
        props = torch.cuda.get_device_properties(grid.device)
        landed["resident_threads"] = props.multi_processor_count * props.max_threads_per_multi_processor
    snap("kernel")
    with phases.phase("release"), marks.mark("release"):
        del grid, req
        gc.collect()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
            torch.cuda.empty_cache()
        if conn is not None:
            conn.send("done")
            conn.close()
    snap("released")
    return {"landed": landed, "memory_rows": snap.rows, "marks": marks.items, "t_entry": t_entry,
            "phases": phases.take()}
