"""A creator that allocates nothing: the manager's decisions, counted and sized exactly, on any machine.

Stands in for FlashInfer's ``create_allreduce_fusion_workspace`` in the CPU simulation and the unit tests; its
workspaces carry the same ``metadata`` and byte count (from :mod:`.sizes`) as a real one would.
"""

from __future__ import annotations

from typing import Optional

from sglab.fixes.workspace_floor.creator import Mark
from sglab.fixes.workspace_floor.sizes import workspace_bytes_per_rank


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

    def __init__(self, mark: Optional[Mark] = None):
        self.mark = mark
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
