"""What the workspace manager asks of a *creator*, and the phase clock creators share.

The manager (:mod:`.flashinfer_comm_fusion`) never allocates anything itself: upstream it calls FlashInfer's
``create_allreduce_fusion_workspace``; here it calls ``creator.create(...)``, so one manager runs against

- :class:`~.fake.FakeCreator` (no memory: counts and sizes, for the CPU simulation),
- :class:`~.trtllm_ar.IpcWorkspaceCreator` (the real work on GPUs, FlashInfer's creation rebuilt), and
- :class:`~.flashinfer_allreduce.FlashInferCreator` (FlashInfer's own creation, where it is installed).

A creator may be given a ``mark(name)`` context-manager factory: it then opens one named range around each
phase of a creation (alloc, IPC handle get / exchange / open, Lamport fill, barrier, ...). The experiment passes a
profiler range there for its traced pass; without one the phases are only timed, so the timed passes carry no
profiler ranges at all.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import Callable, ContextManager, Optional, Protocol

Mark = Callable[[str], ContextManager]


class Workspace(Protocol):
    """A created workspace, as the manager uses it."""

    metadata: dict  # tp_size, max_token_num, hidden_dim: what is_buffer_size_sufficient reads
    bytes_per_rank: int  # device bytes this rank allocated for it (the three aligned buffers)
    phases_ms: dict  # milliseconds per creation phase (may be empty)

    def destroy(self) -> None: ...


class Creator(Protocol):
    mark: Optional[Mark]

    def create(self, *, world_size: int, rank: int, max_token_num: int, hidden_dim: int,
               group=None) -> Workspace: ...


def marker(mark: Optional[Mark], name: str) -> ContextManager:
    """``mark(name)``, or nothing when no marker is set."""
    return mark(name) if mark is not None else nullcontext()


class PhaseClock:
    """Milliseconds per phase of one creation (``ms``), each phase inside ``mark(label)`` when a marker is set.

    A phase entered several times (one alloc per buffer) accumulates; ``label`` names the marker range (e.g.
    ``"ipc open lamport"``) while ``key`` is the timed phase (``"open"``), so the per-phase table stays small and
    the profiler still tells the buffers apart.
    """

    def __init__(self, mark: Optional[Mark] = None, clock: Callable[[], float] = time.perf_counter):
        self.mark = mark
        self.clock = clock
        self.ms: dict[str, float] = {}

    @contextmanager
    def __call__(self, key: str, label: Optional[str] = None):
        with marker(self.mark, label or key):
            t0 = self.clock()
            try:
                yield
            finally:
                self.ms[key] = self.ms.get(key, 0.0) + (self.clock() - t0) * 1e3
