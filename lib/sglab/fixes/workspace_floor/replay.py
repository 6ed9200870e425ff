"""Feeding a token-count trace through the call site (not upstream: the driver of the rebuild).

Each trace entry is the ``x.shape[0]`` one forward step hands to ``_forward_with_allreduce_fusion``; the
workspace decision is the same for every layer of a step, so one call per step stands for all of them.
:func:`simulate` runs the replay on the fake creator (exact counts and sizes, no memory); the GPU experiment runs
the same :func:`replay` with the IPC creator on every rank.
"""

from __future__ import annotations

from typing import Callable, Optional

from sglab.fixes.workspace_floor.fake import FakeCreator
from sglab.fixes.workspace_floor.flashinfer_comm_fusion import WorkspaceManager, ensure_workspace_initialized
from sglab.fixes.workspace_floor.layernorm import Policy, fused_norm_call, will_recreate


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


def simulate(policy: Policy, trace, *, world_size: int, hidden_dim: int, pre_initialize: Optional[int] = None):
    """Full-trace replay on the fake creator: (manager, refused)."""
    manager = WorkspaceManager(FakeCreator(), high_water=policy.high_water, clock=lambda: 0.0)
    refused = replay(manager, policy, trace, world_size=world_size, rank=0, hidden_dim=hidden_dim,
                     pre_initialize=pre_initialize)
    return manager, refused
