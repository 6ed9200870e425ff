"""FlashInfer's own workspace creation behind the creator interface (optional: only where ``flashinfer`` imports).

Mirrors what SGLang's ``FlashInferWorkspaceManager.initialize`` calls: FlashInfer ``flashinfer/comm/allreduce.py``
``create_allreduce_fusion_workspace(backend=..., world_size, rank, max_token_num, hidden_dim, dtype)`` and the
returned workspace's ``destroy()``. :class:`FlashInferWorkspace` adapts it to what the manager reads (``metadata``,
``bytes_per_rank``, ``phases_ms``), so the same manager and trace replay can run FlashInfer's real creation beside
the rebuild (:mod:`.trtllm_ar`); the experiment labels such rows ``creator=flashinfer``.
"""

from __future__ import annotations

from typing import Optional

from sglab.fixes.workspace_floor.creator import Mark, PhaseClock
from sglab.fixes.workspace_floor.sizes import workspace_bytes_per_rank


class FlashInferWorkspace:
    def __init__(self, inner, metadata: dict, phases_ms: dict):
        self.inner = inner
        self.metadata = metadata
        # what FlashInfer's sizes say; the experiment measures the real footprint (cudaMemGetInfo) beside it
        self.bytes_per_rank = workspace_bytes_per_rank(metadata["tp_size"], metadata["max_token_num"],
                                                       metadata["hidden_dim"])
        self.phases_ms = phases_ms

    def destroy(self) -> None:
        if self.inner is not None and hasattr(self.inner, "destroy"):
            self.inner.destroy()
        self.inner = None


class FlashInferCreator:
    """``create_allreduce_fusion_workspace`` (trtllm backend by default) as a creator."""

    def __init__(self, backend: str = "trtllm", mark: Optional[Mark] = None):
        import flashinfer.comm as comm  # fails fast where FlashInfer is absent

        self.comm = comm
        self.backend = backend
        self.mark = mark

    @staticmethod
    def available() -> bool:
        try:
            import flashinfer.comm as comm

            return hasattr(comm, "create_allreduce_fusion_workspace")
        except Exception:
            return False

    def create(self, *, world_size, rank, max_token_num, hidden_dim, group=None):
        import torch

        ph = PhaseClock(self.mark)
        with ph("create", "flashinfer create"):
            ws = self.comm.create_allreduce_fusion_workspace(backend=self.backend, world_size=world_size, rank=rank,
                                                            max_token_num=max_token_num, hidden_dim=hidden_dim,
                                                            dtype=torch.bfloat16)
        metadata = dict(getattr(ws, "metadata", None) or {})
        metadata.update({"tp_rank": rank, "tp_size": world_size, "max_token_num": max_token_num,
                         "hidden_dim": hidden_dim})
        return FlashInferWorkspace(ws, metadata, ph.ms)
