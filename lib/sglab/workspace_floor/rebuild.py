"""The allreduce-fusion workspace and its ``max_token_num`` floor (SGLang #26382, part B), rebuilt
PR-era, one section per upstream file and symbol. The manager calls a creator: a fake one on the CPU
(exact counts), FlashInfer's IPC creation over ``cuda.bindings`` on the GPUs. The before/after
switch is the call site's :class:`Policy` (:data:`POLICIES`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Callable, ContextManager, Optional

import torch
import torch.distributed as tdist


MiB = 2**20

# -- 1. flashinfer/comm/trtllm_ar.py · trtllm_create_ipc_workspace_for_all_reduce_fusion (sizes),
#    check_trtllm_allreduce_fusion_workspace_metadata
ALIGN = 1 << 21  # FlashInfer rounds every workspace buffer up to 2 MiB
BARRIER_FLAG_COUNT = 256  # flashinfer.comm.trtllm_ar.BarrierFlagCount
MAX_COMM_SIZE = 2147483647 & ~((1 << 21) - 1)  # INT32_MAX rounded down to 2 MiB
LAMPORT_NEG_ZERO_FP16 = 0x8000  # trtllm_lamport_initialize fills with -0.0
BUFFER_NAMES = ("data", "flags", "lamport")  # the order of the buffers (and of the pointer table)


def workspace_sizes(world_size: int, max_token_num: int, hidden_dim: int) -> dict:
    """The three per-rank bf16 buffers, each rounded up to 2 MiB: data ``W*T*H*2`` bytes, flags
    ``W*256*4``, Lamport ``3*W*T*H*2`` (comm size capped at :data:`MAX_COMM_SIZE`)."""
    buffer_size = world_size * max_token_num * hidden_dim * 2
    flag_size = world_size * BARRIER_FLAG_COUNT * 4
    lamport_comm_size = min(buffer_size, MAX_COMM_SIZE)
    aligned = [
        (s + ALIGN - 1) // ALIGN * ALIGN for s in (buffer_size, flag_size, lamport_comm_size * 3)
    ]
    return {
        "buffer_size": buffer_size, "flag_size": flag_size, "lamport_comm_size": lamport_comm_size,
        "lamport_buffer_size": lamport_comm_size * 3, "aligned": aligned,
        "bytes_per_rank": sum(aligned)
    }


def workspace_bytes_per_rank(world_size: int, max_token_num: int, hidden_dim: int) -> int:
    return workspace_sizes(world_size, max_token_num, hidden_dim)["bytes_per_rank"]


def size_sufficient(metadata: dict, token_num: int, hidden_dim: int, world_size: int) -> bool:
    """FlashInfer's metadata check: same world size, ``token_num * hidden_dim`` fits."""
    return (world_size == metadata["tp_size"]
            and token_num * hidden_dim <= metadata["max_token_num"] * metadata["hidden_dim"])


# -- 2. sglang/srt/layers/flashinfer_comm_fusion.py · FlashInferWorkspaceManager,
#    ensure_workspace_initialized, flashinfer_allreduce_residual_rmsnorm
CALLEE_DEFAULT_MAX_TOKEN_NUM = 2048  # flashinfer_allreduce_residual_rmsnorm(max_token_num=2048)
RECREATE_RANGE = "recreate workspace"  # the profiler range around each creation
DESTROY_RANGE = "destroy old workspace"
Mark = Callable[[str], ContextManager]


def no_mark(name: str) -> ContextManager:
    return nullcontext()


@dataclasses.dataclass
class CreationEvent:
    """One creation (bookkeeping for the experiment, not upstream)."""

    step: int
    max_token_num: int
    bytes_per_rank: int
    create_ms: float
    destroy_ms: float  # of the workspace it replaced (0 when there was none)
    reason: str


class WorkspaceManager:
    """``FlashInferWorkspaceManager``: reuse a workspace that covers the request, else create at
    ``max(max_token_num, high-water mark)`` (``high_water=False``: 0.5.12.post1, 0.5.13); added per
    creation: ``before_create()`` (a barrier), a :data:`RECREATE_RANGE` mark, a CreationEvent."""

    def __init__(self, creator, *, high_water: bool = True,
                 clock: Callable[[], float] = time.perf_counter, mark: Mark = no_mark,
                 before_create: Callable[[], None] = lambda: None):
        self.creator, self.high_water, self.clock, self.mark = creator, high_water, clock, mark
        self.before_create = before_create
        self.workspace = self.world_size = self.rank = self.group = None
        self.max_token_num = self.hidden_dim = None
        self.initialized = False
        self._max_token_num_seen = self._max_hidden_dim_seen = 0
        self.events: list[CreationEvent] = []  # bookkeeping (not upstream) from here on
        self.step = -1
        self.peak_bytes_per_rank = 0
        self._pending_destroy_ms = 0.0

    def initialize(self, world_size: int, rank: int, max_token_num: int, hidden_dim: int,
                   group=None, reason: str = "") -> None:
        if self.high_water:  # track the high-water mark so allocations only grow
            self._max_token_num_seen = max(max_token_num, self._max_token_num_seen)
            self._max_hidden_dim_seen = max(hidden_dim, self._max_hidden_dim_seen)
        if (self.initialized and self.world_size == world_size
                and self.is_buffer_size_sufficient(max_token_num, hidden_dim)):
            return
        self.before_create()
        with self.mark(RECREATE_RANGE):
            self._pending_destroy_ms = 0.0
            if self.initialized and self.world_size == world_size:  # too small: free it first
                with self.mark(DESTROY_RANGE):
                    self.cleanup()
            if self.high_water:
                max_token_num = max(max_token_num, self._max_token_num_seen)
                hidden_dim = max(hidden_dim, self._max_hidden_dim_seen)
            t0 = self.clock()
            self.workspace = self.creator.create(world_size=world_size, rank=rank,
                                                 max_token_num=max_token_num, hidden_dim=hidden_dim,
                                                 group=group)
            create_ms = (self.clock() - t0) * 1e3
            self.world_size, self.rank, self.group = world_size, rank, group
            self.max_token_num, self.hidden_dim = max_token_num, hidden_dim
            self.initialized = True
            nbytes = workspace_bytes_per_rank(world_size, max_token_num, hidden_dim)
            self.peak_bytes_per_rank = max(self.peak_bytes_per_rank, nbytes)
            self.events.append(
                CreationEvent(self.step, max_token_num, nbytes, create_ms, self._pending_destroy_ms,
                              reason))

    def is_buffer_size_sufficient(self, token_num: int, hidden_dim: int) -> bool:
        return (self.initialized and self.workspace is not None and size_sufficient(
            self.workspace.metadata, token_num, hidden_dim, self.world_size))

    def cleanup(self) -> None:
        if self.workspace is not None:
            t0 = self.clock()
            try:
                self.workspace.destroy()
            finally:
                self._pending_destroy_ms = (self.clock() - t0) * 1e3
                self.workspace = self.world_size = self.rank = self.group = None
                self.max_token_num = self.hidden_dim = None
                self.initialized = False

    @property
    def recreations(self) -> int:
        return len(self.events)


def ensure_workspace_initialized(manager: WorkspaceManager, *, world_size: int, rank: int,
                                 max_token_num: int, hidden_dim: int,
                                 token_num: Optional[int] = None, group=None) -> bool:
    """PR-era: re-create when uninitialised, when world size, rank or group change, or when the
    buffer is too small for ``token_num`` (``x.shape[0]``); the reason goes to the event."""
    if world_size <= 1:
        return False
    if not manager.initialized:
        reason = "uninitialised"
    elif manager.world_size != world_size or manager.rank != rank:
        reason = "world/rank changed"
    elif manager.group is not group:
        reason = "group changed"
    elif not manager.is_buffer_size_sufficient(token_num or max_token_num, hidden_dim):
        reason = "too small"
    else:
        return True
    manager.initialize(world_size, rank, max_token_num, hidden_dim, group=group, reason=reason)
    return manager.initialized


# -- 3. sglang/srt/layers/layernorm.py · RMSNorm._forward_with_allreduce_fusion (the call site) ----
PR_FLOOR = 2048  # after the PR: max_token_num=max(x.shape[0], 2048)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the call site passes as ``max_token_num`` (``floor=None``: nothing, the callee's default
    2048), the manager's high-water mark, its short name (``label``) and code (``call``)."""

    name: str
    floor: Optional[int]
    high_water: bool = True
    label: str = ""
    call: str = ""

    def max_token_num(self, token_num: int) -> int:
        return CALLEE_DEFAULT_MAX_TOKEN_NUM if self.floor is None else max(token_num, self.floor)


def floor_policy(n: int, label: str = "") -> Policy:
    """``max(x.shape[0], n)``, named ``floor n`` unless ``label`` says otherwise."""
    return Policy(f"floor_{n}", n, label=label or f"floor {n}", call=f"max(x.shape[0], {n})")


# released before (<= 0.5.12.post1); the PR's first draft (x.shape[0], changed in review, never
# released); merged (0.5.13 on); the other floors the notebook weighs
POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("before_pr", None, label="released before", call="none: the callee's default 2048"),
        Policy("shape_no_hwm", 0, False, "draft x.shape[0] (no hwm)", "x.shape[0]"),
        Policy("floor_0", 0, label="draft x.shape[0]", call="x.shape[0]"), floor_policy(512),
        floor_policy(1024), floor_policy(PR_FLOOR, "merged floor 2048"), floor_policy(4096))
}


def label(name: str) -> str:
    """The short name of a policy id (``floor_0`` -> ``draft x.shape[0]``); an unknown id as is."""
    return POLICIES[name].label if name in POLICIES else name.replace("_", " ")


def fused_norm_call(manager: WorkspaceManager, policy: Policy, token_num: int, *, world_size: int,
                    rank: int, hidden_dim: int, group=None) -> bool:
    """One call site -> ``flashinfer_allreduce_residual_rmsnorm`` call, workspace part: False where
    the callee asserts ``x.shape[0] <= max_token_num``, else ``ensure_workspace_initialized``."""
    max_token_num = policy.max_token_num(token_num)
    return token_num <= max_token_num and ensure_workspace_initialized(
        manager, world_size=world_size, rank=rank, max_token_num=max_token_num,
        hidden_dim=hidden_dim, token_num=token_num, group=group)


# -- 3b. sglang/srt/layers/communicator.py · apply_flashinfer_allreduce_fusion (the gate before the
#    call site; the same in 0.5.11-0.5.14) and model_runner.py ·
#    _pre_initialize_flashinfer_allreduce_workspace (before any CUDA-graph capture)
FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048  # communicator.py; also the size pre-initialised at start-up
ENGINE_MANAGERS = 2  # flashinfer_comm_fusion.py keeps one manager for attention TP, one for MoE TP


def fusion_applies(token_num: int) -> bool:
    """The gate's token part: larger steps all-reduce unfused and never reach the call site."""
    return 0 < token_num <= FUSE_ALLREDUCE_MAX_BATCH_SIZE


# -- 4. creators: ``creator.create(world_size=, rank=, max_token_num=, hidden_dim=, group=)``
#    returns a workspace with ``metadata`` and ``destroy()``
class PhaseClock:
    """Ms per phase of one creation (``ms``, summed over a ``key``'s repeats), each in a mark."""

    def __init__(self, mark: Mark = no_mark):
        self.mark, self.ms = mark, {}

    @contextmanager
    def __call__(self, key: str, label: Optional[str] = None):
        with self.mark(label or key):
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.ms[key] = self.ms.get(key, 0.0) + (time.perf_counter() - t0) * 1e3


def _metadata(world_size, rank, max_token_num, hidden_dim, **sizes) -> dict:
    return {
        "tp_rank": rank, "tp_size": world_size, "max_token_num": max_token_num,
        "hidden_dim": hidden_dim, "use_fp32_lamport": False, **sizes
    }


class FakeCreator:
    """Creates workspaces that allocate nothing (the CPU simulation)."""

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        return SimpleNamespace(metadata=_metadata(world_size, rank, max_token_num, hidden_dim),
                               destroy=lambda: None)


# -- 5. flashinfer/comm/cuda_ipc.py · CudaRTLibrary, create_shared_buffer / free_shared_buffer -----
class CudartOps:
    """The CUDA calls of a creation through ``cuda.bindings`` (so the profiler sees them): malloc,
    IPC export / open / close, free, the Lamport fill, flag word and pointer table."""

    def __init__(self, device: Optional[int] = None):
        from cuda.bindings import driver, runtime  # optional: only where the GPU path runs

        self.rt, self.drv = runtime, driver
        if device is not None:  # bind this library's runtime to the rank's GPU too
            self._ok(runtime.cudaSetDevice(int(device)), "cudaSetDevice")

    def _ok(self, res, what):
        if int(res[0]) != 0:
            raise RuntimeError(f"{what} failed: {res[0]}")
        return res[1] if len(res) > 1 else None

    def malloc(self, nbytes: int) -> int:
        return int(self._ok(self.rt.cudaMalloc(nbytes), "cudaMalloc"))

    def free(self, ptr: int) -> None:
        self._ok(self.rt.cudaFree(ptr), "cudaFree")

    def export(self, ptr: int) -> bytes:
        h = self._ok(self.rt.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
        return ctypes.string_at(h.getPtr(), 64)  # cudaIpcMemHandle_t is 64 opaque bytes

    def open(self, handle: bytes) -> int:
        h = self.rt.cudaIpcMemHandle_t()
        ctypes.memmove(h.getPtr(), handle, 64)
        return int(
            self._ok(self.rt.cudaIpcOpenMemHandle(h, self.rt.cudaIpcMemLazyEnablePeerAccess),
                     "cudaIpcOpenMemHandle"))

    def close(self, ptr: int) -> None:
        self._ok(self.rt.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")

    def fill_lamport(self, ptr: int, nbytes: int) -> None:
        self._ok(self.drv.cuMemsetD16(ptr, LAMPORT_NEG_ZERO_FP16, nbytes // 2), "cuMemsetD16")

    def flag_word(self, lamport_comm_size: int) -> int:
        ptr = self.malloc(5 * 4)
        self._ok(self.rt.cudaMemset(ptr, 0, 5 * 4), "cudaMemset")
        buf = ctypes.create_string_buffer(int(lamport_comm_size).to_bytes(4, "little"), 4)
        self._ok(
            self.rt.cudaMemcpy(ptr + 12, ctypes.addressof(buf), 4,
                               self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        return ptr

    def pointer_table(self, pointers: list[int]):
        return torch.tensor(pointers, dtype=torch.int64, device=torch.device("cuda"))

    def synchronize(self) -> None:
        self._ok(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def free_bytes(self) -> int:
        return int(self._ok(self.rt.cudaMemGetInfo(), "cudaMemGetInfo"))


# -- 6. flashinfer/comm/trtllm_ar.py · trtllm_create_ipc_workspace_for_all_reduce_fusion,
#    trtllm_destroy_ipc_workspace_for_all_reduce_fusion (+ what SGLang wraps around them)
class IpcWorkspace:

    def __init__(self, ops, group, rank, metadata, ipc_ptrs, table, flag_ptr, phases_ms, mark):
        self.ops, self.group, self.rank, self.metadata = ops, group, rank, metadata
        self.ipc_ptrs = ipc_ptrs  # [buffer][peer]: this process's mappings
        self.workspace_tensor, self.flag_ptr = table, flag_ptr
        self.phases_ms, self.mark = phases_ms, mark
        self._destroyed = False

    def destroy(self) -> None:
        """Close the peers' mappings, barrier, free our own buffers, barrier (FlashInfer only frees
        and barriers; closing first makes the leak check exact)."""
        if self._destroyed:
            return
        self._destroyed = True
        ph = PhaseClock(self.mark)
        self.ops.synchronize()
        self.workspace_tensor = None
        with ph("close", "ipc close"):
            for ptrs in self.ipc_ptrs:
                for r, p in enumerate(ptrs):
                    if r != self.rank:
                        self.ops.close(p)
        with ph("barrier", "destroy barrier"):
            tdist.barrier(group=self.group)
        with ph("free", "free"):
            for ptrs in self.ipc_ptrs:
                self.ops.free(ptrs[self.rank])
            self.ops.free(self.flag_ptr)
        with ph("barrier", "destroy barrier"):
            tdist.barrier(group=self.group)


class IpcWorkspaceCreator:
    """Per rank, each phase timed and named: SGLang's free-memory vote; per buffer, allocate,
    export, exchange, open; fill, flag word, pointer table; a barrier and SGLang's all-reduce."""

    def __init__(self, ops, *, mark: Mark = no_mark):
        self.ops, self.mark = ops, mark

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        sizes = workspace_sizes(world_size, max_token_num, hidden_dim)
        ph = PhaseClock(self.mark)
        with ph("preflight"):
            flag = torch.tensor([int(self.ops.free_bytes() >= sizes["bytes_per_rank"])],
                                dtype=torch.int32)
            tdist.all_reduce(flag, op=tdist.ReduceOp.MIN, group=group)
            if int(flag.item()) == 0:
                raise MemoryError(f"workspace of {sizes['bytes_per_rank'] / MiB:.0f} MiB/rank does "
                                  "not fit on every rank")
        ipc_ptrs = []
        for name, nbytes in zip(BUFFER_NAMES, sizes["aligned"]):  # create_shared_buffer
            with ph("alloc", f"alloc {name}"):
                own = self.ops.malloc(nbytes)
            with ph("export", f"ipc get handle {name}"):
                handle = self.ops.export(own)
            with ph("exchange", f"exchange handles {name}"):
                handles = [None] * world_size
                tdist.all_gather_object(handles, handle, group=group)
            with ph("open", f"ipc open {name}"):
                ipc_ptrs.append([
                    own if r == rank else self.ops.open(h) for r, h in enumerate(handles)
                ])
        with ph("fill", "lamport fill"):
            self.ops.fill_lamport(ipc_ptrs[2][rank], sizes["aligned"][2])
        with ph("metadata"):
            flag_ptr = self.ops.flag_word(sizes["lamport_comm_size"])
            table = self.ops.pointer_table([p for ptrs in ipc_ptrs for p in ptrs] + [flag_ptr])
            self.ops.synchronize()
        with ph("barrier"):
            tdist.barrier(group=group)
            tdist.all_reduce(torch.tensor([0], dtype=torch.int32), op=tdist.ReduceOp.MAX,
                             group=group)
        keys = ("buffer_size", "flag_size", "lamport_comm_size", "lamport_buffer_size")
        metadata = _metadata(world_size, rank, max_token_num, hidden_dim,
                             **{k: sizes[k]
                                for k in keys})
        return IpcWorkspace(self.ops, group, rank, metadata, ipc_ptrs, table, flag_ptr, ph.ms,
                            self.mark)


# -- 7. the driver (not upstream): a token-count trace through the call site -----------------------
def replay(manager: WorkspaceManager, policy: Policy, trace, *, world_size: int, rank: int,
           hidden_dim: int, group=None, pre_initialize: Optional[int] = None) -> int:
    """Feed a trace through the call site (``pre_initialize``: first, as step -1); refused calls."""
    refused = 0
    if pre_initialize:
        manager.step = -1
        ensure_workspace_initialized(manager, world_size=world_size, rank=rank,
                                     max_token_num=pre_initialize, hidden_dim=hidden_dim,
                                     group=group)
    for i, t in enumerate(trace):
        t, manager.step = int(t), i
        refused += not fused_norm_call(manager, policy, t, world_size=world_size, rank=rank,
                                       hidden_dim=hidden_dim, group=group)
    return refused


def simulate(policy: Policy, trace, *, world_size: int, hidden_dim: int,
             pre_initialize: Optional[int] = None):
    """The whole trace on the fake creator: ``(manager, refused)`` (exact counts and sizes)."""
    manager = WorkspaceManager(FakeCreator(), high_water=policy.high_water, clock=lambda: 0.0)
    refused = replay(manager, policy, trace, world_size=world_size, rank=0, hidden_dim=hidden_dim,
                     pre_initialize=pre_initialize)
    return manager, refused
