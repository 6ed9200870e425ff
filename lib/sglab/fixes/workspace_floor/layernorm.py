"""The call site: what ``_forward_with_allreduce_fusion`` passes as ``max_token_num``, before and after the PR.

Mirrors ``python/sglang/srt/layers/layernorm.py``, ``RMSNorm._forward_with_allreduce_fusion``: before PR #26382
the call ``flashinfer_allreduce_residual_rmsnorm(...)`` passed no ``max_token_num`` (the callee's default, 2048);
after it, ``max_token_num=max(x.shape[0], 2048)``. The other policies are the alternatives the notebook weighs:
``x.shape[0]`` alone (with and without the manager's high-water mark) and other floors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglab.fixes.workspace_floor.flashinfer_comm_fusion import (
    CALLEE_DEFAULT_MAX_TOKEN_NUM,
    WorkspaceManager,
    allreduce_residual_rmsnorm_workspace,
    would_recreate,
)

PR_FLOOR = 2048  # layernorm.py after the PR: max(x.shape[0], 2048)


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
    "floor_2048": Policy("floor_2048", PR_FLOOR, label="max(x.shape[0], 2048)  (the PR)"),
    "floor_4096": Policy("floor_4096", 4096, label="max(x.shape[0], 4096)"),
}


def fused_norm_call(manager: WorkspaceManager, policy: Policy, token_num: int, *, world_size: int, rank: int,
                    hidden_dim: int, group=None) -> bool:
    """One ``_forward_with_allreduce_fusion`` -> ``flashinfer_allreduce_residual_rmsnorm`` call, workspace part.

    Returns False where the callee would refuse the shape (before the PR: more tokens than 2048 trips the
    ``assert input_tensor.shape[0] <= max_token_num``).
    """
    return allreduce_residual_rmsnorm_workspace(manager, token_num, policy.max_token_num(token_num),
                                                world_size=world_size, rank=rank, hidden_dim=hidden_dim,
                                                group=group)


def will_recreate(manager: WorkspaceManager, policy: Policy, token_num: int, world_size: int, rank: int,
                  hidden_dim: int, group=None) -> bool:
    """Would this call re-create the workspace? (pure)."""
    return would_recreate(manager, policy.max_token_num(token_num), token_num, world_size, rank, hidden_dim, group)
