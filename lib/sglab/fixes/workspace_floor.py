"""The allreduce-fusion workspace and the ``max_token_num`` floor (SGLang PR #26382, part B).

Mirrors, PR-era:

- ``python/sglang/srt/layers/flashinfer_comm_fusion.py``: ``FlashInferWorkspaceManager`` (``initialize``,
  ``is_buffer_size_sufficient``, ``cleanup``, the high-water mark ``_max_token_num_seen``) and
  ``ensure_workspace_initialized`` (re-create when uninitialised, when world size / rank / group change, or
  when the buffer is too small for ``token_num``);
- ``python/sglang/srt/layers/layernorm.py``: ``_forward_with_allreduce_fusion``, whose call into
  ``flashinfer_allreduce_residual_rmsnorm`` passed no ``max_token_num`` before the PR (callee default 2048,
  with ``assert input_tensor.shape[0] <= max_token_num``) and ``max_token_num=max(x.shape[0], 2048)`` after;
- FlashInfer ``flashinfer/comm/trtllm_ar.py``: ``trtllm_create_ipc_workspace_for_all_reduce_fusion`` (three
  per-rank buffers ``W*T*H*2``, ``W*256*4`` flags and ``3*W*T*H*2`` Lamport bytes, each rounded up to 2 MiB;
  IPC handle exchange; Lamport fill with -0.0; a 5-int flag word; the int64 pointer table; a barrier) and
  ``check_trtllm_allreduce_fusion_workspace_metadata`` (the size rule behind ``is_buffer_size_sufficient``).

The creation goes through a *creator* object so the same manager runs against:

- :class:`FakeCreator` - no memory at all, counts and sizes only (CPU tests, full-trace simulation);
- :class:`IpcWorkspaceCreator` - the real work on GPUs, written after FlashInfer's legacy
  ``create_shared_buffer`` path (``cudaMalloc`` + ``cudaIpcGetMemHandle`` + all-gather over the gloo group +
  ``cudaIpcOpenMemHandle``) through ``cuda.bindings.runtime``; its device calls sit behind a small ops object,
  so the rank logic also runs on the CPU with :class:`HostOps` over gloo;
- :class:`FlashInferCreator` - optional, FlashInfer's own ``create_allreduce_fusion_workspace`` when
  ``flashinfer`` is importable (not needed for anything here).

Two differences from upstream, both deliberate: the replica's ``destroy`` closes the peers' mappings before
freeing its own buffer (FlashInfer's ``free_shared_buffer`` only frees and barriers), so the leak check at the
end is exact; and the preflight is a free-memory vote (``cudaMemGetInfo`` + a gloo all-reduce) where SGLang
probes the same ``cuMemCreate`` sequence - both decide collectively whether all ranks go ahead.
"""

from __future__ import annotations

import ctypes
import pickle
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

ALIGN = 1 << 21  # FlashInfer rounds every workspace buffer up to 2 MiB
BARRIER_FLAG_COUNT = 256  # flashinfer.comm.trtllm_ar.BarrierFlagCount
MAX_COMM_SIZE = 2147483647 & ~((1 << 21) - 1)  # INT32_MAX rounded down to 2 MiB
LAMPORT_NEG_ZERO_FP16 = 0x8000  # trtllm_lamport_initialize fills with -0.0
CALLEE_DEFAULT_MAX_TOKEN_NUM = 2048  # flashinfer_allreduce_residual_rmsnorm(max_token_num=2048)
PR_FLOOR = 2048  # layernorm.py after the PR: max(x.shape[0], 2048)


def round_up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


# --------------------------------------------------------------------------------------------- sizes
def workspace_sizes(world_size: int, max_token_num: int, hidden_dim: int, use_fp32_lamport: bool = False) -> dict:
    """The three buffers of ``trtllm_create_ipc_workspace_for_all_reduce_fusion``, logical and 2 MiB aligned."""
    elem = 4 if use_fp32_lamport else 2
    buffer_size = world_size * max_token_num * hidden_dim * 2
    flag_size = world_size * BARRIER_FLAG_COUNT * 4
    lamport_comm_size = min(world_size * max_token_num * hidden_dim * elem, MAX_COMM_SIZE)
    lamport_buffer_size = lamport_comm_size * 3
    aligned = [round_up(s) for s in (buffer_size, flag_size, lamport_buffer_size)]
    return {
        "buffer_size": buffer_size,
        "flag_size": flag_size,
        "lamport_comm_size": lamport_comm_size,
        "lamport_buffer_size": lamport_buffer_size,
        "aligned": aligned,
        "bytes_per_rank": sum(aligned),
    }


def workspace_bytes_per_rank(world_size: int, max_token_num: int, hidden_dim: int) -> int:
    return workspace_sizes(world_size, max_token_num, hidden_dim)["bytes_per_rank"]


def size_sufficient(metadata: dict, token_num: int, hidden_dim: int, world_size: int) -> bool:
    """``check_trtllm_allreduce_fusion_workspace_metadata`` as a boolean (bf16, no fp32 Lamport)."""
    return (world_size == metadata["tp_size"]
            and token_num * hidden_dim <= metadata["max_token_num"] * metadata["hidden_dim"])


# --------------------------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class Policy:
    """What the call site passes as ``max_token_num`` and whether the manager keeps a high-water mark."""

    name: str
    floor: Optional[int]  # None: the callee default (2048) - the call before the PR
    high_water: bool = True
    label: str = ""

    def max_token_num(self, token_num: int) -> int:
        if self.floor is None:
            return CALLEE_DEFAULT_MAX_TOKEN_NUM
        return max(token_num, self.floor)


POLICIES: dict[str, Policy] = {
    "before_pr": Policy("before_pr", None, label="no max_token_num (callee default 2048): before the PR"),
    "shape_no_hwm": Policy("shape_no_hwm", 0, high_water=False, label="x.shape[0], no high-water mark"),
    "floor_0": Policy("floor_0", 0, label="x.shape[0] (with high-water mark)"),
    "floor_512": Policy("floor_512", 512, label="max(x.shape[0], 512)"),
    "floor_1024": Policy("floor_1024", 1024, label="max(x.shape[0], 1024)"),
    "floor_2048": Policy("floor_2048", 2048, label="max(x.shape[0], 2048)  (the PR)"),
    "floor_4096": Policy("floor_4096", 4096, label="max(x.shape[0], 4096)"),
}


# --------------------------------------------------------------------------------------------- manager
@dataclass
class CreationEvent:
    step: int
    max_token_num: int
    bytes_per_rank: int
    create_ms: float
    destroy_ms: float  # of the workspace it replaced (0 when there was none)
    reason: str
    phases_ms: dict = field(default_factory=dict)


class WorkspaceManager:
    """``FlashInferWorkspaceManager`` (PR-era), creation delegated to ``creator``."""

    def __init__(self, creator, *, high_water: bool = True, clock: Callable[[], float] = time.perf_counter):
        self.creator = creator
        self.high_water = high_water
        self.clock = clock
        self.workspace = None
        self.world_size = None
        self.rank = None
        self.group = None
        self.max_token_num = None
        self.hidden_dim = None
        self.initialized = False
        self._max_token_num_seen: Optional[int] = None
        self._max_hidden_dim_seen: Optional[int] = None
        # bookkeeping for the experiment (not upstream)
        self.events: list[CreationEvent] = []
        self.step = -1
        self.peak_bytes_per_rank = 0
        self._pending_destroy_ms = 0.0

    def initialize(self, world_size: int, rank: int, max_token_num: int, hidden_dim: int, group=None,
                   reason: str = "") -> None:
        if self.high_water:
            # Track the high-water mark so allocations only grow
            self._max_token_num_seen = max(max_token_num, self._max_token_num_seen or 0)
            self._max_hidden_dim_seen = max(hidden_dim, self._max_hidden_dim_seen or 0)
        # Reuse existing workspace if it already covers this problem size
        if (self.initialized and self.world_size == world_size
                and self.is_buffer_size_sufficient(max_token_num, hidden_dim)):
            return
        # Same world_size but buffer too small: free old workspace before creating new one
        self._pending_destroy_ms = 0.0
        if self.initialized and self.world_size == world_size:
            self.cleanup()
        if self.high_water:
            alloc_token_num = max(max_token_num, self._max_token_num_seen or 0)
            alloc_hidden_dim = max(hidden_dim, self._max_hidden_dim_seen or 0)
        else:
            alloc_token_num, alloc_hidden_dim = max_token_num, hidden_dim
        t0 = self.clock()
        self.workspace = self.creator.create(world_size=world_size, rank=rank, max_token_num=alloc_token_num,
                                             hidden_dim=alloc_hidden_dim, group=group)
        create_ms = (self.clock() - t0) * 1e3
        self.world_size, self.rank, self.group = world_size, rank, group
        self.max_token_num, self.hidden_dim = alloc_token_num, alloc_hidden_dim
        self.initialized = True
        nbytes = workspace_bytes_per_rank(world_size, alloc_token_num, alloc_hidden_dim)
        self.peak_bytes_per_rank = max(self.peak_bytes_per_rank, nbytes)
        self.events.append(CreationEvent(self.step, alloc_token_num, nbytes, create_ms, self._pending_destroy_ms,
                                         reason, dict(getattr(self.workspace, "phases_ms", {}) or {})))

    def is_buffer_size_sufficient(self, token_num: int, hidden_dim: int) -> bool:
        if not self.initialized or self.workspace is None:
            return False
        return size_sufficient(self.workspace.metadata, token_num, hidden_dim, self.world_size)

    def cleanup(self) -> None:
        if self.workspace is not None:
            t0 = self.clock()
            try:
                self.workspace.destroy()
            finally:
                self._pending_destroy_ms = (self.clock() - t0) * 1e3
                self.workspace = None
                self.initialized = False
                self.world_size = None
                self.rank = None
                self.group = None
                self.max_token_num = None
                self.hidden_dim = None

    @property
    def recreations(self) -> int:
        return len(self.events)


def ensure_workspace_initialized(manager: WorkspaceManager, *, world_size: int, rank: int, max_token_num: int,
                                 hidden_dim: int, token_num: Optional[int] = None, group=None) -> bool:
    """``ensure_workspace_initialized`` (PR-era): the re-create rule."""
    if world_size <= 1:
        return False
    token_num = token_num or max_token_num
    reason = None
    if not manager.initialized:
        reason = "uninitialised"
    elif manager.world_size != world_size or manager.rank != rank:
        reason = "world/rank changed"
    elif manager.group is not group:
        reason = "group changed"
    elif not manager.is_buffer_size_sufficient(token_num, hidden_dim):
        reason = "too small"
    if reason is not None:
        manager.initialize(world_size, rank, max_token_num, hidden_dim, group=group, reason=reason)
    return manager.initialized


def fused_norm_call(manager: WorkspaceManager, policy: Policy, token_num: int, *, world_size: int, rank: int,
                    hidden_dim: int, group=None) -> bool:
    """One ``_forward_with_allreduce_fusion`` -> ``flashinfer_allreduce_residual_rmsnorm`` call, workspace part.

    Returns False where the callee would refuse the shape (before the PR: more tokens than 2048 trips the
    ``assert input_tensor.shape[0] <= max_token_num``).
    """
    max_token_num = policy.max_token_num(token_num)
    if token_num > max_token_num:
        return False
    return ensure_workspace_initialized(manager, world_size=world_size, rank=rank, max_token_num=max_token_num,
                                        hidden_dim=hidden_dim, token_num=token_num, group=group)


def replay(manager: WorkspaceManager, policy: Policy, trace, *, world_size: int, rank: int, hidden_dim: int,
           group=None, pre_initialize: Optional[int] = None, before_create: Optional[Callable[[], None]] = None):
    """Feed a token-count trace through the call site; returns the number of refused calls.

    ``pre_initialize``: a token count to create the workspace with before the trace (SGLang's
    ``pre_initialize_workspaces(max_token_num=2048)`` ahead of CUDA-graph capture), step -1.
    ``before_create``: called (on every rank alike) just before a step that will re-create, e.g. a barrier
    so that all ranks start the creation together.
    """
    refused = 0
    if pre_initialize:
        manager.step = -1
        if before_create is not None:
            before_create()
        ensure_workspace_initialized(manager, world_size=world_size, rank=rank, max_token_num=pre_initialize,
                                     hidden_dim=hidden_dim, group=group)
    for i, t in enumerate(trace):
        t = int(t)
        manager.step = i
        if before_create is not None and will_recreate(manager, policy, t, world_size, rank, hidden_dim, group):
            before_create()
        if not fused_norm_call(manager, policy, t, world_size=world_size, rank=rank, hidden_dim=hidden_dim,
                               group=group):
            refused += 1
    return refused


def will_recreate(manager: WorkspaceManager, policy: Policy, token_num: int, world_size: int, rank: int,
                  hidden_dim: int, group=None) -> bool:
    """Would this call re-create the workspace? (pure; mirrors the two checks above)."""
    m = policy.max_token_num(token_num)
    if token_num > m or world_size <= 1:
        return False
    if (not manager.initialized or manager.world_size != world_size or manager.rank != rank
            or manager.group is not group or not manager.is_buffer_size_sufficient(token_num, hidden_dim)):
        return not (manager.initialized and manager.world_size == world_size
                    and manager.is_buffer_size_sufficient(m, hidden_dim))
    return False


# --------------------------------------------------------------------------------------------- creators
class FakeWorkspace:
    def __init__(self, creator, world_size, rank, max_token_num, hidden_dim):
        self.creator = creator
        self.metadata = {"tp_rank": rank, "tp_size": world_size, "max_token_num": max_token_num,
                         "hidden_dim": hidden_dim, "use_fp32_lamport": False}
        self.bytes_per_rank = workspace_bytes_per_rank(world_size, max_token_num, hidden_dim)
        self.phases_ms: dict = {}
        self.destroyed = False

    def destroy(self) -> None:
        if not self.destroyed:
            self.destroyed = True
            self.creator.live_bytes -= self.bytes_per_rank
            self.creator.destroyed += 1


class FakeCreator:
    """Counts creations and live bytes; allocates nothing."""

    def __init__(self):
        self.created = 0
        self.destroyed = 0
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.sizes: list[int] = []

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        ws = FakeWorkspace(self, world_size, rank, max_token_num, hidden_dim)
        self.created += 1
        self.sizes.append(max_token_num)
        self.live_bytes += ws.bytes_per_rank
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        return ws


def simulate(policy: Policy, trace, *, world_size: int, hidden_dim: int, pre_initialize: Optional[int] = None):
    """Full-trace replay on the fake creator: (manager, refused)."""
    manager = WorkspaceManager(FakeCreator(), high_water=policy.high_water, clock=lambda: 0.0)
    refused = replay(manager, policy, trace, world_size=world_size, rank=0, hidden_dim=hidden_dim,
                     pre_initialize=pre_initialize)
    return manager, refused


class CudartOps:
    """Device side of the IPC creator through ``cuda.bindings.runtime`` (what FlashInfer's ``cuda_ipc`` does)."""

    def __init__(self, device: Optional[int] = None):
        from cuda.bindings import driver, runtime

        self.rt, self.drv = runtime, driver
        if device is not None:  # bind this library's runtime to the rank's GPU too (torch's set_device aside)
            self._ok(runtime.cudaSetDevice(int(device)), "cudaSetDevice")

    def _ok(self, res, what):
        err = res[0]
        if int(err) != 0:
            raise RuntimeError(f"{what} failed: {err}")
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
        return int(self._ok(self.rt.cudaIpcOpenMemHandle(h, self.rt.cudaIpcMemLazyEnablePeerAccess),
                            "cudaIpcOpenMemHandle"))

    def close(self, ptr: int) -> None:
        self._ok(self.rt.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")

    def fill_lamport(self, ptr: int, nbytes: int) -> None:
        # trtllm_lamport_initialize: every fp16 element set to -0.0
        err = self.drv.cuMemsetD16(ptr, LAMPORT_NEG_ZERO_FP16, nbytes // 2)[0]
        if int(err) != 0:
            raise RuntimeError(f"cuMemsetD16 failed: {err}")

    def flag_word(self, lamport_comm_size: int) -> int:
        ptr = self.malloc(5 * 4)
        self._ok(self.rt.cudaMemset(ptr, 0, 5 * 4), "cudaMemset")
        buf = ctypes.create_string_buffer(int(lamport_comm_size).to_bytes(4, "little"), 4)
        self._ok(self.rt.cudaMemcpy(ptr + 12, ctypes.addressof(buf), 4,
                                    self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        return ptr

    def pointer_table(self, pointers: list[int]):
        import torch

        return torch.tensor(pointers, dtype=torch.int64, device=torch.device("cuda"))

    def synchronize(self) -> None:
        self._ok(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def free_bytes(self) -> int:
        return int(self._ok(self.rt.cudaMemGetInfo(), "cudaMemGetInfo"))


class HostOps:
    """Stand-in for :class:`CudartOps` on the CPU: tracks live 'allocations' and open mappings by id."""

    def __init__(self, capacity: int = 1 << 50):
        import os

        self.pid = os.getpid()
        self.next = 1
        self.live: dict[int, int] = {}
        self.opened: dict[int, bytes] = {}
        self.filled: list[int] = []
        self.capacity = capacity

    def malloc(self, nbytes):
        p = self.next
        self.next += 1
        self.live[p] = nbytes
        return p

    def free(self, ptr):
        del self.live[ptr]

    def export(self, ptr):
        return pickle.dumps((self.pid, ptr)).ljust(64, b"\0")[:64]

    def open(self, handle):
        p = self.next
        self.next += 1
        self.opened[p] = handle
        return p

    def close(self, ptr):
        del self.opened[ptr]

    def fill_lamport(self, ptr, nbytes):
        self.filled.append(ptr)

    def flag_word(self, lamport_comm_size):
        return self.malloc(20)

    def pointer_table(self, pointers):
        return list(pointers)

    def synchronize(self):
        pass

    def free_bytes(self):
        return self.capacity - sum(self.live.values())


class IpcWorkspace:
    def __init__(self, ops, group, rank, world_size, metadata, ipc_ptrs, table, flag_ptr, phases_ms):
        self.ops, self.group, self.rank, self.world_size = ops, group, rank, world_size
        self.metadata = metadata
        self.ipc_ptrs = ipc_ptrs  # [buffer][peer] -> pointer valid in this process
        self.workspace_tensor = table
        self.flag_ptr = flag_ptr
        self.phases_ms = phases_ms
        self.bytes_per_rank = sum(workspace_sizes(world_size, metadata["max_token_num"], metadata["hidden_dim"])
                                  ["aligned"])
        self._destroyed = False

    def destroy(self) -> None:
        import torch.distributed as tdist

        if self._destroyed:
            return
        self._destroyed = True
        self.ops.synchronize()
        self.workspace_tensor = None
        for ptrs in self.ipc_ptrs:  # close the peers' mappings first ...
            for r, p in enumerate(ptrs):
                if r != self.rank:
                    self.ops.close(p)
        tdist.barrier(group=self.group)  # ... everyone has let go of everyone's buffers ...
        for ptrs in self.ipc_ptrs:
            self.ops.free(ptrs[self.rank])  # ... then free our own (free_shared_buffer)
        self.ops.free(self.flag_ptr)
        tdist.barrier(group=self.group)


class IpcWorkspaceCreator:
    """``trtllm_create_ipc_workspace_for_all_reduce_fusion`` replica over CUDA IPC and a gloo group."""

    def __init__(self, ops=None, *, preflight: bool = True, post_sync: bool = True):
        self.ops = ops if ops is not None else CudartOps()
        self.preflight = preflight
        self.post_sync = post_sync

    def _share(self, group, world_size, rank, ptr):
        import torch.distributed as tdist

        handle = self.ops.export(ptr)
        gathered = [None] * world_size
        tdist.all_gather_object(gathered, handle, group=group)
        return gathered

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        import torch
        import torch.distributed as tdist

        clock = time.perf_counter
        ph: dict[str, float] = {}
        t = clock()
        sizes = workspace_sizes(world_size, max_token_num, hidden_dim)
        if self.preflight:
            # collective go/no-go before anyone allocates (SGLang: _preflight_check_workspace_memory)
            flag = torch.tensor([1 if self.ops.free_bytes() >= sizes["bytes_per_rank"] else 0], dtype=torch.int32)
            tdist.all_reduce(flag, op=tdist.ReduceOp.MIN, group=group)
            if int(flag.item()) == 0:
                raise MemoryError(f"workspace of {sizes['bytes_per_rank'] / 2**20:.0f} MiB/rank does not fit "
                                  f"on every rank")
        ph["preflight"] = (clock() - t) * 1e3
        ipc_ptrs: list[list[int]] = []
        ph["alloc"] = ph["exchange"] = ph["open"] = 0.0
        for nbytes in sizes["aligned"]:  # create_shared_buffer, per buffer
            t = clock()
            own = self.ops.malloc(nbytes)
            t1 = clock()
            handles = self._share(group, world_size, rank, own)
            t2 = clock()
            ptrs = [own if r == rank else self.ops.open(h) for r, h in enumerate(handles)]
            t3 = clock()
            ph["alloc"] += (t1 - t) * 1e3
            ph["exchange"] += (t2 - t1) * 1e3
            ph["open"] += (t3 - t2) * 1e3
            ipc_ptrs.append(ptrs)
        t = clock()
        self.ops.fill_lamport(ipc_ptrs[2][rank], sizes["aligned"][2])
        ph["fill"] = (clock() - t) * 1e3
        t = clock()
        flag_ptr = self.ops.flag_word(sizes["lamport_comm_size"])
        pointers = [p for ptrs in ipc_ptrs for p in ptrs] + [flag_ptr]
        table = self.ops.pointer_table(pointers)
        self.ops.synchronize()
        ph["metadata"] = (clock() - t) * 1e3
        t = clock()
        tdist.barrier(group=group)  # "must sync after create_workspace"
        if self.post_sync:
            # SGLang: _sync_allreduce_unavailable_across_tp, a CPU all-reduce after every (re)initialisation
            ok = torch.tensor([0], dtype=torch.int32)
            tdist.all_reduce(ok, op=tdist.ReduceOp.MAX, group=group)
        ph["barrier"] = (clock() - t) * 1e3
        metadata = {"tp_rank": rank, "tp_size": world_size, "max_token_num": max_token_num,
                    "hidden_dim": hidden_dim, "use_fp32_lamport": False, **{k: sizes[k] for k in (
                        "buffer_size", "flag_size", "lamport_comm_size", "lamport_buffer_size")}}
        return IpcWorkspace(self.ops, group, rank, world_size, metadata, ipc_ptrs, table, flag_ptr, ph)


class FlashInferCreator:
    """Optional: FlashInfer's own creation (``create_allreduce_fusion_workspace``, trtllm backend).

    Only used when ``flashinfer`` is importable and asked for; the experiment labels its rows ``flashinfer``.
    """

    def __init__(self, backend: str = "trtllm"):
        import flashinfer.comm as comm  # noqa: F401 - fails fast where FlashInfer is absent

        self.comm = comm
        self.backend = backend

    @staticmethod
    def available() -> bool:
        try:
            import flashinfer.comm as comm

            return hasattr(comm, "create_allreduce_fusion_workspace")
        except Exception:
            return False

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        import torch

        ws = self.comm.create_allreduce_fusion_workspace(backend=self.backend, world_size=world_size, rank=rank,
                                                        max_token_num=max_token_num, hidden_dim=hidden_dim,
                                                        dtype=torch.bfloat16)
        if not hasattr(ws, "metadata"):
            ws.metadata = {"tp_size": world_size, "max_token_num": max_token_num, "hidden_dim": hidden_dim}
        return ws
