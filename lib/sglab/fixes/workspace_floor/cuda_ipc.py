"""The device calls of the IPC workspace: FlashInfer's ``cuda_ipc`` layer, and a host stand-in for CPU tests.

Mirrors FlashInfer ``flashinfer/comm/cuda_ipc.py`` (``CudaRTLibrary`` and ``create_shared_buffer`` /
``free_shared_buffer``): ``cudaMalloc``, ``cudaIpcGetMemHandle`` (a 64-byte handle), ``cudaIpcOpenMemHandle`` with
lazy peer access, ``cudaIpcCloseMemHandle``, ``cudaFree``; plus the Lamport fill of ``trtllm_lamport_initialize``
(every fp16 element set to -0.0, here one ``cuMemsetD16``), the 5-int flag word and the int64 pointer table of
``trtllm_create_ipc_workspace_for_all_reduce_fusion``.

:class:`CudartOps` makes these calls through ``cuda.bindings`` (the profiler sees them as CUDA runtime / driver
calls); :class:`HostOps` keeps the same bookkeeping with integers, so the rank logic of the IPC creator (handle
exchange, opens, destroy order) runs over gloo on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import pickle
from typing import Optional

from sglab.fixes.workspace_floor.sizes import LAMPORT_NEG_ZERO_FP16


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
