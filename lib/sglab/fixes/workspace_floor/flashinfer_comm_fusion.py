"""The workspace manager and its re-create rule.

Mirrors ``python/sglang/srt/layers/flashinfer_comm_fusion.py``:

- ``FlashInferWorkspaceManager``: ``initialize`` (the high-water mark ``_max_token_num_seen``, the early return
  when the existing workspace already covers the request, the cleanup of a too-small one, then creation at
  ``max(max_token_num, high-water mark)``), ``is_buffer_size_sufficient`` and ``cleanup``. The high-water mark is
  SGLang's from 0.5.14 on: the released managers around the fix (0.5.12.post1 without the floor, 0.5.13 with it)
  keep none and create at ``max_token_num`` itself, which is ``high_water=False`` here (the real-release probe
  drives both; on the workbook's traces the re-creation counts are the same either way);
- ``ensure_workspace_initialized``: re-create when uninitialised, when world size / rank / group change, or when
  the buffer is too small for ``token_num`` (``x.shape[0]``);
- the workspace part of ``flashinfer_allreduce_residual_rmsnorm``: ``assert input_tensor.shape[0] <=
  max_token_num`` (default ``max_token_num=2048``), then ``ensure_workspace_initialized``.

Creation goes through a creator (:mod:`.creator`). Two additions for the experiment, neither changing a
decision: the manager records one :class:`CreationEvent` per creation (step, size, ms), and when given a ``mark``
it opens a ``"recreate workspace"`` range around each creation (with ``"destroy old workspace"`` inside it) for
the profiler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from sglab.fixes.workspace_floor.creator import Mark, marker
from sglab.fixes.workspace_floor.sizes import size_sufficient, workspace_bytes_per_rank

CALLEE_DEFAULT_MAX_TOKEN_NUM = 2048  # flashinfer_allreduce_residual_rmsnorm(max_token_num=2048)
RECREATE_RANGE = "recreate workspace"  # one marker range per creation
DESTROY_RANGE = "destroy old workspace"


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
    """``FlashInferWorkspaceManager``, creation delegated to ``creator``; ``high_water=False`` is the manager as
    released in 0.5.12.post1 and 0.5.13, ``True`` (the default) SGLang's from 0.5.14."""

    def __init__(self, creator, *, high_water: bool = True, clock: Callable[[], float] = time.perf_counter,
                 mark: Optional[Mark] = None):
        self.creator = creator
        self.high_water = high_water
        self.clock = clock
        self.mark = mark
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
        with marker(self.mark, RECREATE_RANGE):
            self._recreate(world_size, rank, max_token_num, hidden_dim, group, reason)

    def _recreate(self, world_size, rank, max_token_num, hidden_dim, group, reason) -> None:
        # Same world_size but buffer too small: free old workspace before creating new one
        self._pending_destroy_ms = 0.0
        if self.initialized and self.world_size == world_size:
            with marker(self.mark, DESTROY_RANGE):
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


def allreduce_residual_rmsnorm_workspace(manager: WorkspaceManager, token_num: int, max_token_num: int, *,
                                         world_size: int, rank: int, hidden_dim: int, group=None) -> bool:
    """The workspace part of ``flashinfer_allreduce_residual_rmsnorm``: False where the callee refuses the shape
    (its ``assert input_tensor.shape[0] <= max_token_num``), else ``ensure_workspace_initialized``."""
    if token_num > max_token_num:
        return False
    return ensure_workspace_initialized(manager, world_size=world_size, rank=rank, max_token_num=max_token_num,
                                        hidden_dim=hidden_dim, token_num=token_num, group=group)


def would_recreate(manager: WorkspaceManager, max_token_num: int, token_num: int, world_size: int, rank: int,
                   hidden_dim: int, group=None) -> bool:
    """Would :func:`allreduce_residual_rmsnorm_workspace` re-create the workspace? (pure; the checks above)."""
    if token_num > max_token_num or world_size <= 1:
        return False
    if (not manager.initialized or manager.world_size != world_size or manager.rank != rank
            or manager.group is not group or not manager.is_buffer_size_sufficient(token_num, hidden_dim)):
        return not (manager.initialized and manager.world_size == world_size
                    and manager.is_buffer_size_sufficient(max_token_num, hidden_dim))
    return False
