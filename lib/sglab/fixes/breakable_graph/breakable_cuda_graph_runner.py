"""The breakable-graph prefill runner, before and after SGLang #24662 ("Breakable Cuda Graph Support for bs > 1").

Mirrors ``python/sglang/srt/model_executor/breakable_cuda_graph_runner.py`` (``BreakableCudaGraphRunner``:
``__init__``, ``_run_forward``, ``_build_capture_forward_batch``, ``_capture_one``, ``can_run``, ``replay``) in both
states:

* ``boundary="before"`` (parent of #24662): the runner captures ``model.forward`` -- the whole forward
  *including* the logits tail -- with a one-request (bs=1) capture batch whose per-request fields are
  slices ``[:1]`` of static ``(max_bs,)`` buffers (``static_seq_lens``, ``static_extend_seq_lens``, ...).
  The tail's gather ``hidden[cumsum(extend_seq_lens) - 1]`` is therefore baked in for one request, and
  ``can_run`` rejects every batch with ``batch_size > 1`` (they run eagerly).
* ``boundary="after"`` (#24662): the runner captures only ``layer_model`` -- the inner transformer stack
  resolved as ``getattr(model, "language_model", model).model`` when it has ``.layers`` (else ``None``
  plus a warning, and the runner is disabled). ``_run_forward`` is ``@torch.no_grad``; the bs=1 capture
  batch is only a metadata placeholder; ``replay`` runs the outer ``model.forward`` eagerly with the live
  batch while ``layer_model.forward`` is swapped for "replay the graph of this token bucket and return its
  output buffer". The static bs buffers are gone and ``can_run`` no longer looks at ``batch_size``.

Without CUDA every captured graph is an :class:`~.breakable_cuda_graph.EmulatedReplay` (same static buffers, same
capture-time batch object): routing, the layer swap and the bs=1 tail run on a CPU; timings and segment counts
only mean something on a GPU.
"""

from __future__ import annotations

import bisect
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from sglab.fixes.breakable_graph.breakable_cuda_graph import BreakableCUDAGraph, BreakableCUDAGraphCapture, EmulatedReplay
from sglab.fixes.breakable_graph.forward_batch import AttnMetadata, BatchShape, PrefillBatch, build_attn_metadata, set_forward_context
from sglab.fixes.breakable_graph.models import run_eager

logger = logging.getLogger(__name__)

BEFORE = "before"
AFTER = "after"
BOUNDARIES = (BEFORE, AFTER)


def resolve_layer_model(model: nn.Module, *, walk: bool = False) -> nn.Module | None:
    """The inner transformer stack the "after" runner captures, or ``None`` with a warning.

    ``walk=False`` is the #24662 form: ``getattr(model, "language_model", model).model`` if it has
    ``.layers``. ``walk=True`` is the later form (cf. SGLang #30006): follow the ``.model`` chain below the
    language model to any depth until a module with ``.layers`` is found.
    """
    language_model = getattr(model, "language_model", model)
    if not walk:
        if hasattr(language_model, "model") and hasattr(language_model.model, "layers"):
            return language_model.model
    else:
        node, seen = getattr(language_model, "model", None), set()
        while isinstance(node, nn.Module) and id(node) not in seen:
            if hasattr(node, "layers"):
                return node
            seen.add(id(node))
            node = getattr(node, "model", None)
    logger.warning(
        "[BCG] Could not resolve inner layer_model on %s. BCG is disabled for this model; "
        "prefill will fall back to eager.",
        type(language_model).__name__,
    )
    return None


# --------------------------------------------------------------------------------------------------------
# The runner (breakable_cuda_graph_runner.py, BreakableCudaGraphRunner)
# --------------------------------------------------------------------------------------------------------
@dataclass
class _Captured:
    graph: Any
    output: torch.Tensor
    capture_batch: PrefillBatch
    capture_metadata: AttnMetadata


class BreakableGraphRunner:
    """Breakable-graph prefill runner with the capture boundary of before or after #24662.

    ``capture=False`` builds the routing state only (``can_run``), nothing is captured.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        boundary: str,
        capture_num_tokens: Sequence[int],
        max_bs: int = 64,
        capture: bool = True,
        walk_layer_model: bool = False,
        pool=None,
    ):
        if boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")
        self.model = model
        self.boundary = boundary
        self.device = next(model.parameters()).device
        self.is_cuda = self.device.type == "cuda"
        self.captured: dict[int, _Captured] = {}
        self.capture_num_tokens = sorted(int(n) for n in capture_num_tokens)
        if not self.capture_num_tokens:
            raise ValueError("capture_num_tokens is empty")
        self.max_num_tokens = max(self.capture_num_tokens)
        self.max_bs = int(max_bs)
        self.raw_num_tokens = 0
        self.pool = None

        with torch.device(self.device):
            self.input_ids = torch.zeros((self.max_num_tokens,), dtype=torch.int64)
            self.positions = torch.zeros((self.max_num_tokens,), dtype=torch.int64)

        self.layer_model: nn.Module | None = None
        self._captured_forward: Callable | None = None  # bound method; a later swap of .forward misses it
        if boundary == BEFORE:
            # Static per-request buffers, read by the captured logits tail through their [:bs] slices.
            with torch.device(self.device):
                self.static_seq_lens = torch.zeros((self.max_bs,), dtype=torch.int64)
                self.static_extend_seq_lens = torch.zeros((self.max_bs,), dtype=torch.int64)
            self._captured_forward = self.model.forward
        else:
            self.layer_model = resolve_layer_model(model, walk=walk_layer_model)
            if self.layer_model is None:
                return  # disabled: can_run is False for every batch
            self._captured_forward = self.layer_model.forward

        if not capture:
            return
        if self.is_cuda:
            self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self._warmup()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        self._capture_all()

    # -- capture ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _run_forward(self, forward_batch: PrefillBatch, num_tokens: int) -> torch.Tensor:
        # before: model.forward, the whole forward with the logits tail.
        # after: layer_model.forward, only the token-major layer stack: nothing in it depends on the
        # batch size.
        return self._captured_forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def _build_capture_forward_batch(self, num_tokens: int) -> PrefillBatch:
        bs = 1
        if self.boundary == BEFORE:
            self.static_seq_lens[:bs].fill_(num_tokens)
            self.static_extend_seq_lens[:bs].fill_(num_tokens)
            extend_seq_lens = self.static_extend_seq_lens[:bs]
        else:
            # bs=1 is only a placeholder for the attention metadata; nothing captured reads it.
            extend_seq_lens = torch.full((bs,), num_tokens, dtype=torch.int64, device=self.device)
        return PrefillBatch(
            input_ids=self.input_ids[:num_tokens],
            positions=self.positions[:num_tokens],
            extend_seq_lens=extend_seq_lens,
            extend_seq_lens_cpu=[num_tokens],
        )

    def _warmup(self) -> None:
        n = self.capture_num_tokens[0]
        batch = self._build_capture_forward_batch(n)
        with set_forward_context(build_attn_metadata(batch.extend_seq_lens_cpu, n, self.device)):
            self._run_forward(batch, n)

    def _capture_all(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.is_cuda else None
        ctx = torch.cuda.stream(stream) if stream is not None else _null_context()
        with ctx:
            for n in reversed(self.capture_num_tokens):  # largest first, as SGLang does
                self.captured[n] = self._capture_one(n, stream)
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def _capture_one(self, num_tokens: int, stream) -> _Captured:
        forward_batch = self._build_capture_forward_batch(num_tokens)
        # The bs=1 placeholder metadata is in force only while capturing; at replay the attention breaks
        # read whatever metadata the replaying caller has put in the forward context.
        meta = build_attn_metadata(forward_batch.extend_seq_lens_cpu, num_tokens, self.device)

        def run_once():
            return self._run_forward(forward_batch, num_tokens)

        with set_forward_context(meta):
            if not self.is_cuda:
                output = run_once()
                return _Captured(EmulatedReplay(run_once, output), output, forward_batch, meta)
            for _ in range(2):
                torch.cuda.synchronize(self.device)
                run_once()
            graph = BreakableCUDAGraph()
            with BreakableCUDAGraphCapture(cuda_graph=graph, pool=self.pool, stream=stream):
                output = run_once()
        return _Captured(graph, output, forward_batch, meta)

    # -- routing ------------------------------------------------------------------------------------------
    def can_run(self, forward_batch: PrefillBatch | BatchShape) -> bool:
        if self.boundary == BEFORE:
            # Captured with batch_size=1: the captured logits gather yields one row; a multi-request
            # prefill would silently get wrong-shaped logits. Reject so it runs eagerly.
            if forward_batch.batch_size > 1:
                return False
        elif self.layer_model is None:
            return False
        return forward_batch.num_tokens <= self.max_num_tokens

    def bucket(self, num_tokens: int) -> int:
        index = bisect.bisect_left(self.capture_num_tokens, num_tokens)
        if index == len(self.capture_num_tokens):
            raise ValueError(f"{num_tokens} tokens exceed the largest bucket {self.max_num_tokens}")
        return self.capture_num_tokens[index]

    # -- replay -------------------------------------------------------------------------------------------
    def replay_prepare(self, forward_batch: PrefillBatch, static_num_tokens: int) -> PrefillBatch:
        n = forward_batch.num_tokens
        self.raw_num_tokens = n
        self.input_ids[:n].copy_(forward_batch.input_ids)
        self.positions[:n].copy_(forward_batch.positions)
        if static_num_tokens > n:
            self.input_ids[n:static_num_tokens].zero_()
            self.positions[n:static_num_tokens].zero_()
        return PrefillBatch(
            input_ids=self.input_ids[:static_num_tokens],
            positions=self.positions[:static_num_tokens],
            extend_seq_lens=forward_batch.extend_seq_lens,
            extend_seq_lens_cpu=list(forward_batch.extend_seq_lens_cpu),
        )

    @torch.no_grad()
    def replay(self, forward_batch: PrefillBatch) -> torch.Tensor:
        """Replay for ``forward_batch`` (does not consult ``can_run``; see :meth:`forward`)."""
        if not self.captured:
            raise RuntimeError("nothing captured (capture=False, or layer_model could not be resolved)")
        static_num_tokens = self.bucket(forward_batch.num_tokens)
        entry = self.captured[static_num_tokens]
        static_forward_batch = self.replay_prepare(forward_batch, static_num_tokens)
        # The live request structure, padded to the bucket: what the attention breaks read.
        meta = build_attn_metadata(static_forward_batch.extend_seq_lens_cpu, static_num_tokens, self.device)

        if self.boundary == BEFORE:
            bs = forward_batch.batch_size
            if bs > self.max_bs:
                raise ValueError(f"batch of {bs} requests exceeds max_bs={self.max_bs}")
            # The graph reads these addresses -- but only the [:1] slice that was captured.
            self.static_seq_lens[:bs].copy_(forward_batch.extend_seq_lens)
            self.static_extend_seq_lens[:bs].copy_(forward_batch.extend_seq_lens)
            with set_forward_context(meta):
                entry.graph.replay()
            return entry.output

        captured_graph, captured_hidden = entry.graph, entry.output

        def replay_layer_forward(*args, **kwargs):
            captured_graph.replay()
            return captured_hidden

        # Swap layer_model.forward for the replay while the outer forward (logits tail included) runs
        # eagerly with the live, multi-request batch.
        had_instance_forward = "forward" in vars(self.layer_model)
        original_layer_forward = self.layer_model.forward
        self.layer_model.forward = replay_layer_forward
        try:
            with set_forward_context(meta):
                output = self.model.forward(
                    static_forward_batch.input_ids, static_forward_batch.positions, static_forward_batch
                )
        finally:
            if had_instance_forward:
                self.layer_model.forward = original_layer_forward
            else:  # back to the class's forward (SGLang re-assigns the bound method; same effect)
                del self.layer_model.forward
        return output

    def forward(self, forward_batch: PrefillBatch) -> tuple[torch.Tensor, bool]:
        """What the model runner does: replay when ``can_run``, else eager. Returns (logits, used_graph)."""
        if self.can_run(forward_batch):
            return self.replay(forward_batch), True
        return run_eager(self.model, forward_batch), False

    # -- introspection ------------------------------------------------------------------------------------
    def segments(self, num_tokens: int) -> tuple[int, int]:
        """(graph segments, eager breaks) captured for a bucket (0, 0 in CPU emulation)."""
        g = self.captured[num_tokens].graph
        return g.num_segments, g.num_breaks


@contextmanager
def _null_context():
    yield
