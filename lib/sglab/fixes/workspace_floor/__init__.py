"""The allreduce-fusion workspace and the ``max_token_num`` floor (SGLang PR #26382, part B), rebuilt.

One module per concern, each named after the upstream file it mirrors:

- :mod:`.sizes` - FlashInfer ``trtllm_ar.py``: the three buffers' sizes and the sufficiency rule;
- :mod:`.flashinfer_comm_fusion` - SGLang ``layers/flashinfer_comm_fusion.py``: ``FlashInferWorkspaceManager``,
  ``ensure_workspace_initialized`` and the callee's ``assert`` (the re-create rule);
- :mod:`.layernorm` - SGLang ``layers/layernorm.py``: the call site's ``max_token_num``, before and after the PR
  (:data:`POLICIES`);
- :mod:`.replay` - the trace driver and the CPU simulation (not upstream);
- creators (:mod:`.creator` says what a creator is): :mod:`.fake` (no memory), :mod:`.trtllm_ar` with
  :mod:`.cuda_ipc` (FlashInfer's IPC creation rebuilt over ``cuda.bindings``), :mod:`.flashinfer_allreduce`
  (FlashInfer's own, optional).
"""

from sglab.fixes.workspace_floor.creator import Creator, PhaseClock, Workspace
from sglab.fixes.workspace_floor.cuda_ipc import CudartOps, HostOps
from sglab.fixes.workspace_floor.fake import FakeCreator, FakeWorkspace
from sglab.fixes.workspace_floor.flashinfer_allreduce import FlashInferCreator, FlashInferWorkspace
from sglab.fixes.workspace_floor.flashinfer_comm_fusion import (
    CALLEE_DEFAULT_MAX_TOKEN_NUM,
    DESTROY_RANGE,
    RECREATE_RANGE,
    CreationEvent,
    WorkspaceManager,
    allreduce_residual_rmsnorm_workspace,
    ensure_workspace_initialized,
    would_recreate,
)
from sglab.fixes.workspace_floor.layernorm import POLICIES, PR_FLOOR, Policy, fused_norm_call, will_recreate
from sglab.fixes.workspace_floor.replay import replay, simulate
from sglab.fixes.workspace_floor.sizes import (
    ALIGN,
    BARRIER_FLAG_COUNT,
    BUFFER_NAMES,
    LAMPORT_NEG_ZERO_FP16,
    MAX_COMM_SIZE,
    round_up,
    size_sufficient,
    workspace_bytes_per_rank,
    workspace_sizes,
)
from sglab.fixes.workspace_floor.trtllm_ar import IpcWorkspace, IpcWorkspaceCreator

__all__ = [
    "ALIGN", "BARRIER_FLAG_COUNT", "BUFFER_NAMES", "CALLEE_DEFAULT_MAX_TOKEN_NUM", "DESTROY_RANGE",
    "LAMPORT_NEG_ZERO_FP16", "MAX_COMM_SIZE", "POLICIES", "PR_FLOOR", "RECREATE_RANGE", "CreationEvent", "Creator",
    "CudartOps", "FakeCreator", "FakeWorkspace", "FlashInferCreator", "FlashInferWorkspace", "HostOps",
    "IpcWorkspace", "IpcWorkspaceCreator", "PhaseClock", "Policy", "Workspace", "WorkspaceManager",
    "allreduce_residual_rmsnorm_workspace", "ensure_workspace_initialized", "fused_norm_call", "replay",
    "round_up", "simulate", "size_sufficient", "will_recreate", "workspace_bytes_per_rank", "workspace_sizes",
    "would_recreate",
]
