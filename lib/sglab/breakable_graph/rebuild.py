"""Breakable CUDA graph for multi-request prefill (SGLang #24662), rebuilt PR-era: each section
headed by the upstream file (``python/sglang/srt/...``) and symbols it mirrors; the before/after
switch is the runner's ``boundary`` (:data:`BOUNDARIES`). Without CUDA a captured graph is an
:class:`EmulatedReplay`, so routing, the layer swap and the one-request tail run on a CPU.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sglab.core.toy_decoder import (CausalAttention, CausalLM, DecoderConfig, DecoderStack,
                                    LogitsProcessor, init_normal_)


logger = logging.getLogger(__name__)


# -- 1. model_executor/forward_batch_info.py · ForwardBatch (prefill fields); the attention metadata
@dataclass
class PrefillBatch:
    """Token-major prefill batch: the tokens of all requests concatenated."""

    input_ids: torch.Tensor  # (num_tokens,) int64
    positions: torch.Tensor  # (num_tokens,) int64, restart at 0 for every request
    extend_seq_lens: torch.Tensor  # (batch_size,) int64, on the model's device
    extend_seq_lens_cpu: list[int]
    batch_size = property(lambda self: len(self.extend_seq_lens_cpu))
    num_tokens = property(lambda self: int(self.input_ids.shape[0]))  # padded to a bucket, or not


@dataclass(frozen=True)
class BatchShape:
    """Only the shape of a prefill batch (request lengths): what ``can_run`` decides on."""

    extend_seq_lens_cpu: tuple[int, ...]
    batch_size = property(lambda self: len(self.extend_seq_lens_cpu))
    num_tokens = property(lambda self: int(sum(self.extend_seq_lens_cpu)))


def make_batch(seq_lens: Sequence[int], *, vocab_size: int, device: torch.device | str = "cpu",
               seed: int = 0) -> PrefillBatch:
    """A prefill batch of ``len(seq_lens)`` requests with seeded random token ids."""
    seq_lens = [int(n) for n in seq_lens]
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"every request needs at least one token, got {seq_lens}")
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (sum(seq_lens),), generator=g, dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in seq_lens])
    return PrefillBatch(input_ids=input_ids.to(device), positions=positions.to(device),
                        extend_seq_lens=torch.tensor(seq_lens, dtype=torch.int64).to(device),
                        extend_seq_lens_cpu=seq_lens)


@dataclass
class AttnMetadata:
    """The attention backend's ``forward_metadata``: each token's request (padding: ``batch_size``)
    and ``mask[i, j]``, token ``i`` may attend to ``j`` (same request, ``j <= i``)."""

    num_tokens: int
    batch_size: int
    token_req: torch.Tensor
    mask: torch.Tensor


def build_attn_metadata(extend_seq_lens_cpu: Sequence[int], num_tokens: int,
                        device: torch.device | str) -> AttnMetadata:
    lens = [int(n) for n in extend_seq_lens_cpu]
    real = sum(lens)
    if real > num_tokens:
        raise ValueError(f"batch has {real} tokens, more than the {num_tokens} slots")
    bs = len(lens)
    token_req = torch.repeat_interleave(torch.arange(bs, dtype=torch.int64),
                                        torch.tensor(lens, dtype=torch.int64))
    if num_tokens > real:
        token_req = torch.cat([token_req, torch.full((num_tokens - real,), bs, dtype=torch.int64)])
    device = torch.device(device)
    on_gpu = device.type == "cuda"  # then no stream sync for the host-to-device copy
    token_req = (token_req.pin_memory() if on_gpu else token_req).to(device, non_blocking=on_gpu)
    same = token_req[:, None] == token_req[None, :]
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril_()
    return AttnMetadata(num_tokens=num_tokens, batch_size=bs, token_req=token_req,
                        mask=same & causal)


_forward_metadata: AttnMetadata | None = None


@contextlib.contextmanager
def set_forward_context(metadata: AttnMetadata):
    """Make ``metadata`` what attention break points read (SGLang: ``set_forward_context``)."""
    global _forward_metadata
    previous, _forward_metadata = _forward_metadata, metadata
    try:
        yield
    finally:
        _forward_metadata = previous


def get_forward_metadata() -> AttnMetadata:
    if _forward_metadata is None:
        raise RuntimeError("attention called outside set_forward_context(...)")
    return _forward_metadata


# -- 2. model_executor/breakable_cuda_graph/breakable_cuda_graph.py · eager_on_graph,
#    BreakableCUDAGraph, BreakableCUDAGraphCapture
# Tensors captured at a break point are held with strong references (SGLang held weak references at
# the PR era; SGLang issues #30584 / #37606 later found that unsafe). No side-stream wait_stream
# hook: the toy model forks no streams.
_current_capture: "BreakableCUDAGraphCapture | None" = None


def eager_on_graph(enable: bool = True):
    """Decorate a function that must run eagerly: during a breakable capture it ends the current
    graph segment, runs once eagerly, records a replay closure and starts a new segment."""

    def decorator(inner: Callable):
        if not enable:
            return inner

        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            capture = _current_capture
            if capture is None:
                return inner(*args, **kwargs)
            capture._end_current_segment()
            # the inputs (written by the segment before) and this output (read by the one after)
            # must stay owned for the lifetime of the graph
            output = inner(*args, **kwargs)
            captured_args, captured_kwargs = args, dict(kwargs)

            def replay_fn():
                new_out = inner(*captured_args, **captured_kwargs)
                if torch.is_tensor(output) and torch.is_tensor(new_out):
                    return output.copy_(new_out)
                return new_out

            capture.cuda_graph._break_fns.append(replay_fn)
            capture._begin_new_segment()
            return output

        return wrapper

    return decorator


class BreakableCUDAGraph:
    """One ``torch.cuda.CUDAGraph`` per segment, one eager function between two segments."""

    def __init__(self) -> None:
        self._segments: list[torch.cuda.CUDAGraph] = []
        self._break_fns: list[Callable[[], Any]] = []

    def replay(self) -> None:
        for i, seg in enumerate(self._segments):
            seg.replay()
            if i < len(self._break_fns):
                self._break_fns[i]()


class BreakableCUDAGraphCapture:
    """Capture the enclosed code as graph segments, all allocating from the one ``pool``."""

    def __init__(self, cuda_graph: BreakableCUDAGraph, pool=None,
                 stream: torch.cuda.Stream | None = None):
        self.cuda_graph, self._pool, self._stream = cuda_graph, pool, stream
        self._stream_ctx = None
        self._segment_open = False

    def __enter__(self):
        global _current_capture
        if _current_capture is not None:
            raise RuntimeError("nested breakable captures are not supported")
        if self._stream is not None:
            self._stream_ctx = torch.cuda.stream(self._stream)
            self._stream_ctx.__enter__()
        _current_capture = self
        self._begin_new_segment()
        return self

    def __exit__(self, *exc):
        global _current_capture
        try:
            self._end_current_segment()
        finally:
            _current_capture = None
            if self._stream_ctx is not None:
                self._stream_ctx.__exit__(*exc)
                self._stream_ctx = None
        return False

    def _begin_new_segment(self) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self._pool)
        self.cuda_graph._segments.append(graph)
        self._segment_open = True

    def _end_current_segment(self) -> None:
        if self._segment_open:  # not twice when an eager break raised
            self._segment_open = False
            self.cuda_graph._segments[-1].capture_end()


class EmulatedReplay:
    """CPU stand-in for a captured graph: replay re-runs the captured closure over the same static
    buffers and the same capture-time batch, then copies into the captured output buffer."""

    _segments = _break_fns = ()

    def __init__(self, run_once: Callable[[], torch.Tensor], output: torch.Tensor):
        self._run_once, self._output = run_once, output

    @torch.no_grad()
    def replay(self) -> None:
        self._output.copy_(self._run_once())


# -- 3. no upstream file · the attention break and the models --------------------------------------
# The shared toy decoder with learned positions; its attention op, varlen_attention, is decorated
# @eager_on_graph(True) like SGLang's attention layers and stands in for its varlen backend: one
# dense SDPA with a block-diagonal causal mask from the live extend_seq_lens.
ModelConfig = DecoderConfig  # the name this notebook's parameters and tests use
TINY_CONFIG = ModelConfig(vocab_size=128, hidden_size=64, num_heads=4, head_dim=16,
                          intermediate_size=128, num_layers=2, max_position=512)


@eager_on_graph(True)
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention within each request from the live forward metadata, q, k, v (num_tokens,
    heads, head_dim): the graph break, since its mask changes with every batch's requests."""
    meta = get_forward_metadata()
    n = q.shape[0]
    if n != meta.num_tokens:
        raise RuntimeError(f"attention got {n} tokens, metadata was built for {meta.num_tokens}")
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.mask)
    return out.squeeze(0).transpose(0, 1).reshape(n, -1)


class VarlenAttention(CausalAttention):
    """``layer.self_attn.attn``: q, k, v made contiguous inside the segment, then the break."""

    def forward(self, q, k, v):
        return varlen_attention(q.contiguous(), k.contiguous(), v.contiguous())


class TinyCausalLM(CausalLM):
    """Plain causal LM: ``.model.layers`` + ``lm_head`` + ``logits_processor``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, VarlenAttention)


class TinyVLM(nn.Module):
    """VLM-style wrapper: the causal LM under ``.language_model`` next to a vision tower."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.vision_tower = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.language_model = TinyCausalLM(cfg)

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        return self.language_model(input_ids, positions, forward_batch)


class TinyGPTStyleLM(nn.Module):
    """The stack under ``.transformer`` (GPT-2 naming): no ``.model.layers`` to find."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = DecoderStack(cfg, VarlenAttention)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.logits_processor = LogitsProcessor()

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.transformer(input_ids, positions, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)


class TinyNestedWrapper(nn.Module):
    """One wrapper level more (``.model`` a causal LM): the stack at ``.model.model.layers``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = TinyCausalLM(cfg)

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch):
        return self.model(input_ids, positions, forward_batch)


MODEL_SHAPES: dict[str, type[nn.Module]] = {
    "causal_lm": TinyCausalLM, "vlm_language_model": TinyVLM, "no_model_layers": TinyGPTStyleLM,
    "nested_wrapper": TinyNestedWrapper
}


def build_model(cfg: ModelConfig = TINY_CONFIG, *, shape: str = "causal_lm",
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0, draw_on: str = "cpu") -> nn.Module:
    """A model of one shape, weights from :func:`~sglab.core.toy_decoder.init_normal_` seeded with
    ``seed``: drawn on the CPU and moved (``draw_on="cpu"``, the runs before method 3, bit for bit),
    or the same distributions drawn on ``device`` in ``dtype`` (``"device"``: milliseconds)."""
    if cfg.positions != "learned":
        raise ValueError("the breakable-graph model uses learned positions (positions='learned')")
    if draw_on not in ("cpu", "device"):
        raise ValueError(f"draw_on must be 'cpu' or 'device', got {draw_on!r}")
    torch.manual_seed(seed)
    if draw_on == "cpu":
        return init_normal_(MODEL_SHAPES[shape](cfg)).to(device=device, dtype=dtype).eval()
    with torch.device(device):
        model = MODEL_SHAPES[shape](cfg).to(dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0 if "norm" in name else 0.0)
    return init_normal_(model).eval()


@torch.no_grad()
def run_eager(model: nn.Module, batch: PrefillBatch) -> torch.Tensor:
    """Plain eager prefill with the live batch: logits of shape (batch_size, vocab)."""
    meta = build_attn_metadata(batch.extend_seq_lens_cpu, batch.num_tokens, batch.input_ids.device)
    with set_forward_context(meta):
        return model.forward(batch.input_ids, batch.positions, batch)


# -- 4. model_executor/breakable_cuda_graph_runner.py · BreakableCudaGraphRunner (__init__,
#    _run_forward, _build_capture_forward_batch, _capture_one, can_run, replay)
BEFORE, AFTER = "before", "after"
BOUNDARIES = (BEFORE, AFTER)


def resolve_layer_model(model: nn.Module, *, walk: bool = False) -> nn.Module | None:
    """The inner stack the "after" runner captures, else ``None`` with a warning: #24662's
    ``getattr(model, "language_model", model).model`` if it has ``.layers``, or (``walk``, cf.
    SGLang #30006) the first module with ``.layers`` down the ``.model`` chain."""
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
        "[BCG] Could not resolve inner layer_model on %s. BCG is disabled for this "
        "model; prefill will fall back to eager.",
        type(language_model).__name__)
    return None


@dataclass
class _Captured:
    graph: Any
    output: torch.Tensor
    capture_batch: PrefillBatch  # kept alive: the captured graph reads its tensors' addresses


class BreakableGraphRunner:
    """The breakable-graph prefill runner with the capture boundary of before or after #24662.

    * ``"before"``: captures ``model.forward``, logits tail included, with a bs=1 capture batch of
      ``[:1]`` slices of static ``(max_bs,)`` buffers, so ``can_run`` rejects ``batch_size > 1``.
    * ``"after"``: captures only ``layer_model`` (``None`` disables the runner); ``replay`` runs the
      outer ``model.forward`` eagerly with ``layer_model.forward`` swapped for the replay.

    ``capture=False`` builds the routing state only (``can_run``).
    """

    def __init__(self, model: nn.Module, *, boundary: str, capture_num_tokens: Sequence[int],
                 max_bs: int = 64, capture: bool = True, pool=None):
        if boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")
        self.model, self.boundary = model, boundary
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
        self._captured_forward: Callable | None = None  # bound: a later swap of .forward misses it
        if boundary == BEFORE:
            # static per-request buffers, read by the captured logits tail via their [:bs] slices
            with torch.device(self.device):
                self.static_seq_lens = torch.zeros((self.max_bs,), dtype=torch.int64)
                self.static_extend_seq_lens = torch.zeros((self.max_bs,), dtype=torch.int64)
            self._captured_forward = self.model.forward
        else:
            self.layer_model = resolve_layer_model(model)
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

    # -- capture -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _run_forward(self, forward_batch: PrefillBatch, num_tokens: int) -> torch.Tensor:
        # before: the whole forward, logits tail included; after: only the token-major layer stack
        return self._captured_forward(forward_batch.input_ids, forward_batch.positions,
                                      forward_batch)

    def _build_capture_forward_batch(self, num_tokens: int) -> PrefillBatch:
        bs = 1
        if self.boundary == BEFORE:
            self.static_seq_lens[:bs].fill_(num_tokens)
            self.static_extend_seq_lens[:bs].fill_(num_tokens)
            extend_seq_lens = self.static_extend_seq_lens[:bs]
        else:
            # bs=1 is only a placeholder for the attention metadata; nothing captured reads it
            extend_seq_lens = torch.full((bs,), num_tokens, dtype=torch.int64, device=self.device)
        return PrefillBatch(input_ids=self.input_ids[:num_tokens],
                            positions=self.positions[:num_tokens], extend_seq_lens=extend_seq_lens,
                            extend_seq_lens_cpu=[num_tokens])

    def _warmup(self) -> None:
        n = self.capture_num_tokens[0]
        batch = self._build_capture_forward_batch(n)
        with set_forward_context(build_attn_metadata(batch.extend_seq_lens_cpu, n, self.device)):
            self._run_forward(batch, n)

    def _capture_all(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.is_cuda else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for n in reversed(self.capture_num_tokens):  # largest first, as SGLang does
                self.captured[n] = self._capture_one(n, stream)
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def _capture_one(self, num_tokens: int, stream) -> _Captured:
        forward_batch = self._build_capture_forward_batch(num_tokens)
        # the bs=1 placeholder metadata is in force only while capturing; at replay the attention
        # breaks read whatever metadata the replaying caller has put in the forward context
        meta = build_attn_metadata(forward_batch.extend_seq_lens_cpu, num_tokens, self.device)

        def run_once():
            return self._run_forward(forward_batch, num_tokens)

        with set_forward_context(meta):
            if not self.is_cuda:
                output = run_once()
                return _Captured(EmulatedReplay(run_once, output), output, forward_batch)
            for _ in range(2):
                torch.cuda.synchronize(self.device)
                run_once()
            graph = BreakableCUDAGraph()
            with BreakableCUDAGraphCapture(cuda_graph=graph, pool=self.pool, stream=stream):
                output = run_once()
        return _Captured(graph, output, forward_batch)

    # -- routing -----------------------------------------------------------------------------------
    def can_run(self, forward_batch: PrefillBatch | BatchShape) -> bool:
        if self.boundary == BEFORE:
            # captured with batch_size=1: the captured logits gather yields one row; a
            # multi-request prefill would silently get wrong-shaped logits. Reject: it runs eagerly
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

    # -- replay ------------------------------------------------------------------------------------
    def replay_prepare(self, forward_batch: PrefillBatch, static_num_tokens: int) -> PrefillBatch:
        n = forward_batch.num_tokens
        self.raw_num_tokens = n
        self.input_ids[:n].copy_(forward_batch.input_ids)
        self.positions[:n].copy_(forward_batch.positions)
        if static_num_tokens > n:
            self.input_ids[n:static_num_tokens].zero_()
            self.positions[n:static_num_tokens].zero_()
        return PrefillBatch(input_ids=self.input_ids[:static_num_tokens],
                            positions=self.positions[:static_num_tokens],
                            extend_seq_lens=forward_batch.extend_seq_lens,
                            extend_seq_lens_cpu=list(forward_batch.extend_seq_lens_cpu))

    @torch.no_grad()
    def replay(self, forward_batch: PrefillBatch) -> torch.Tensor:
        """Replay for ``forward_batch`` (does not consult ``can_run``; see :meth:`forward`)."""
        if not self.captured:
            raise RuntimeError("nothing captured (capture=False, or layer_model could not be "
                               "resolved)")
        static_num_tokens = self.bucket(forward_batch.num_tokens)
        entry = self.captured[static_num_tokens]
        static_forward_batch = self.replay_prepare(forward_batch, static_num_tokens)
        # the live request structure, padded to the bucket: what the attention breaks read
        meta = build_attn_metadata(static_forward_batch.extend_seq_lens_cpu, static_num_tokens,
                                   self.device)
        if self.boundary == BEFORE:
            bs = forward_batch.batch_size
            if bs > self.max_bs:
                raise ValueError(f"batch of {bs} requests exceeds max_bs={self.max_bs}")
            # the graph reads these addresses, but only the [:1] slice that was captured
            self.static_seq_lens[:bs].copy_(forward_batch.extend_seq_lens)
            self.static_extend_seq_lens[:bs].copy_(forward_batch.extend_seq_lens)
            with set_forward_context(meta):
                entry.graph.replay()
            return entry.output

        captured_graph, captured_hidden = entry.graph, entry.output

        def replay_layer_forward(*args, **kwargs):
            captured_graph.replay()
            return captured_hidden

        # swap layer_model.forward for the replay while the outer forward (logits tail included)
        # runs eagerly with the live, multi-request batch
        had_instance_forward = "forward" in vars(self.layer_model)
        original_layer_forward = self.layer_model.forward
        self.layer_model.forward = replay_layer_forward
        try:
            with set_forward_context(meta):
                output = self.model.forward(static_forward_batch.input_ids,
                                            static_forward_batch.positions, static_forward_batch)
        finally:
            if had_instance_forward:
                self.layer_model.forward = original_layer_forward
            else:  # back to the class's forward (SGLang re-assigns the bound method; same effect)
                del self.layer_model.forward
        return output

    def forward(self, forward_batch: PrefillBatch) -> tuple[torch.Tensor, bool]:
        """What the model runner does: replay when ``can_run``, else eager: (logits, used_graph)."""
        if self.can_run(forward_batch):
            return self.replay(forward_batch), True
        return run_eager(self.model, forward_batch), False

    def segments(self, num_tokens: int) -> tuple[int, int]:
        """(graph segments, eager breaks) captured for a bucket (0, 0 in CPU emulation)."""
        g = self.captured[num_tokens].graph
        return len(g._segments), len(g._break_fns)
