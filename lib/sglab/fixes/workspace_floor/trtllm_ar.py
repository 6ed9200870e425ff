"""FlashInfer's workspace creation, rebuilt: ``trtllm_create_ipc_workspace_for_all_reduce_fusion`` over CUDA IPC.

Mirrors FlashInfer ``flashinfer/comm/trtllm_ar.py`` (the ``create_shared_buffer`` path of
``trtllm_create_ipc_workspace_for_all_reduce_fusion`` and ``trtllm_destroy_ipc_workspace_for_all_reduce_fusion``)
plus what SGLang's ``flashinfer_comm_fusion.py`` wraps around it. Per rank, per creation:

1. preflight: a collective go / no-go before anyone allocates (SGLang ``_preflight_check_workspace_memory``);
2. for each of the three buffers (:data:`~.sizes.BUFFER_NAMES`): allocate, get its IPC handle, all-gather the
   handles over the gloo group, open every peer's handle;
3. the Lamport fill (-0.0) of this rank's Lamport buffer, the flag word and the int64 pointer table;
4. a barrier ("must sync after create_workspace"), then SGLang's ``_sync_allreduce_unavailable_across_tp``, a CPU
   all-reduce.

Two differences from upstream, both deliberate: :meth:`IpcWorkspace.destroy` closes the peers' mappings before
freeing its own buffers (FlashInfer's ``free_shared_buffer`` only frees and barriers), so the leak check at the
end is exact; and the preflight is a free-memory vote (``cudaMemGetInfo`` + a gloo all-reduce) where SGLang probes
the same ``cuMemCreate`` sequence - both decide collectively whether all ranks go ahead.

Each phase is timed (``phases_ms``) and, when the creator has a ``mark``, wrapped in a named range: ``preflight``,
``alloc <buffer>``, ``ipc get handle <buffer>``, ``exchange handles <buffer>``, ``ipc open <buffer>``,
``lamport fill``, ``metadata``, ``barrier``; destroying: ``ipc close``, ``free``, ``destroy barrier``.
"""

from __future__ import annotations

from typing import Optional

from sglab.fixes.workspace_floor.creator import Mark, PhaseClock
from sglab.fixes.workspace_floor.cuda_ipc import CudartOps
from sglab.fixes.workspace_floor.sizes import BUFFER_NAMES, workspace_sizes


class IpcWorkspace:
    def __init__(self, ops, group, rank, world_size, metadata, ipc_ptrs, table, flag_ptr, phases_ms,
                 mark: Optional[Mark] = None):
        self.ops, self.group, self.rank, self.world_size = ops, group, rank, world_size
        self.metadata = metadata
        self.ipc_ptrs = ipc_ptrs  # [buffer][peer] -> pointer valid in this process
        self.workspace_tensor = table
        self.flag_ptr = flag_ptr
        self.phases_ms = phases_ms
        self.mark = mark
        self.bytes_per_rank = sum(workspace_sizes(world_size, metadata["max_token_num"], metadata["hidden_dim"])
                                  ["aligned"])
        self._destroyed = False

    def destroy(self) -> None:
        import torch.distributed as tdist

        if self._destroyed:
            return
        self._destroyed = True
        ph = PhaseClock(self.mark)
        self.ops.synchronize()
        self.workspace_tensor = None
        with ph("close", "ipc close"):
            for ptrs in self.ipc_ptrs:  # close the peers' mappings first ...
                for r, p in enumerate(ptrs):
                    if r != self.rank:
                        self.ops.close(p)
        with ph("barrier", "destroy barrier"):
            tdist.barrier(group=self.group)  # ... everyone has let go of everyone's buffers ...
        with ph("free", "free"):
            for ptrs in self.ipc_ptrs:
                self.ops.free(ptrs[self.rank])  # ... then free our own (free_shared_buffer)
            self.ops.free(self.flag_ptr)
        with ph("barrier", "destroy barrier"):
            tdist.barrier(group=self.group)


class IpcWorkspaceCreator:
    """``trtllm_create_ipc_workspace_for_all_reduce_fusion`` replica over CUDA IPC and a gloo group."""

    def __init__(self, ops=None, *, preflight: bool = True, post_sync: bool = True, mark: Optional[Mark] = None):
        self.ops = ops if ops is not None else CudartOps()
        self.preflight = preflight
        self.post_sync = post_sync
        self.mark = mark

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        sizes = workspace_sizes(world_size, max_token_num, hidden_dim)
        ph = PhaseClock(self.mark)
        with ph("preflight"):
            if self.preflight:
                self._preflight(group, sizes["bytes_per_rank"])
        ipc_ptrs = [self._shared_buffer(ph, name, nbytes, group, world_size, rank)
                    for name, nbytes in zip(BUFFER_NAMES, sizes["aligned"])]
        with ph("fill", "lamport fill"):
            self.ops.fill_lamport(ipc_ptrs[2][rank], sizes["aligned"][2])
        with ph("metadata"):
            flag_ptr = self.ops.flag_word(sizes["lamport_comm_size"])
            table = self.ops.pointer_table([p for ptrs in ipc_ptrs for p in ptrs] + [flag_ptr])
            self.ops.synchronize()
        with ph("barrier"):
            self._final_sync(group)
        metadata = {"tp_rank": rank, "tp_size": world_size, "max_token_num": max_token_num,
                    "hidden_dim": hidden_dim, "use_fp32_lamport": False, **{k: sizes[k] for k in (
                        "buffer_size", "flag_size", "lamport_comm_size", "lamport_buffer_size")}}
        return IpcWorkspace(self.ops, group, rank, world_size, metadata, ipc_ptrs, table, flag_ptr, ph.ms,
                            self.mark)

    def _preflight(self, group, nbytes: int) -> None:
        """Collective go/no-go before anyone allocates (SGLang: ``_preflight_check_workspace_memory``)."""
        import torch
        import torch.distributed as tdist

        flag = torch.tensor([1 if self.ops.free_bytes() >= nbytes else 0], dtype=torch.int32)
        tdist.all_reduce(flag, op=tdist.ReduceOp.MIN, group=group)
        if int(flag.item()) == 0:
            raise MemoryError(f"workspace of {nbytes / 2**20:.0f} MiB/rank does not fit on every rank")

    def _shared_buffer(self, ph: PhaseClock, name: str, nbytes: int, group, world_size: int, rank: int) -> list:
        """``create_shared_buffer``: allocate, export, all-gather the handles, open every peer's."""
        import torch.distributed as tdist

        with ph("alloc", f"alloc {name}"):
            own = self.ops.malloc(nbytes)
        with ph("export", f"ipc get handle {name}"):
            handle = self.ops.export(own)
        with ph("exchange", f"exchange handles {name}"):
            handles = [None] * world_size
            tdist.all_gather_object(handles, handle, group=group)
        with ph("open", f"ipc open {name}"):
            return [own if r == rank else self.ops.open(h) for r, h in enumerate(handles)]

    def _final_sync(self, group) -> None:
        import torch
        import torch.distributed as tdist

        tdist.barrier(group=group)  # "must sync after create_workspace"
        if self.post_sync:
            # SGLang: _sync_allreduce_unavailable_across_tp, a CPU all-reduce after every (re)initialisation
            ok = torch.tensor([0], dtype=torch.int32)
            tdist.all_reduce(ok, op=tdist.ReduceOp.MAX, group=group)
