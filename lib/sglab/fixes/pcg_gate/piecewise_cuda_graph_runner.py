"""Piecewise CUDA graphs for prefill: what the gate switches on.

Mirrors what ``python/sglang/srt/model_executor/piecewise_cuda_graph_runner.py`` (``PiecewiseCudaGraphRunner``)
does at run time — one CUDA graph per piece between two attention calls, attention eager on the real token count,
one set of graphs per token-count bucket of ``ServerArgs._generate_piecewise_cuda_graph_tokens``, the batch padded
up to its bucket, every capture in one shared graph memory pool — without torch.compile: the layers of
:class:`sglab.core.toy_decoder.DecoderStack` expose their two halves (``pre_attn`` / ``post_attn``) and the runner
captures them directly.

How activations cross from one piece to the next (``handoff``):

``"copy"``    (the recorded runs) every piece copies what the next one reads — the residual, q, k, v, and the last
              piece's output — into fixed buffers sized for the largest bucket, so nothing allocated inside a
              capture has to outlive it. Five extra ``tokens x hidden`` copies per layer (the attention output is
              copied into its buffer as well): the price of handing over through fixed buffers.
``"direct"``  each piece's outputs are the tensors it allocated inside its capture, kept alive with the graph (what
              SGLang's torch.compile pieces do, with weak references so buckets can share the memory). Only the
              attention output is still copied into a fixed buffer (SDPA has no ``out=``). Every bucket holds its
              own activations, so this mode is for a few buckets, not the whole list.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from sglab.fixes.pcg_gate.server_args import bucket_for

HANDOFFS = ("copy", "direct")


class PiecewiseRunner:
    """Piecewise prefill over a :class:`~sglab.core.toy_decoder.DecoderStack` (one sequence).

    Segment ``i`` (0..L) is: ``post_attn`` of layer i-1 (or the embedding for i=0), then ``pre_attn`` of layer i
    (or the final norm for i=L). Attention runs eagerly between segment replays on the first ``n`` rows only (the
    real tokens); padded rows never mix with real ones, because every other op works row by row.

    ``use_graphs=False`` runs the same segments eagerly on the same padded buffers (the same-shape reference, and
    what the CPU tests exercise; copy hand-off only).
    """

    def __init__(self, text_model, attention_layers: list, capture_tokens: list[int], *, use_graphs: bool = True,
                 handoff: str = "copy"):
        if handoff not in HANDOFFS:
            raise ValueError(f"handoff must be one of {HANDOFFS}, got {handoff!r}")
        if handoff == "direct" and not use_graphs:
            raise ValueError("handoff='direct' hands over tensors captured in graphs: it needs use_graphs=True")
        self.m = text_model
        self.layers = list(text_model.layers)
        self.attention_layers = list(attention_layers)
        if len(self.attention_layers) != len(self.layers):
            raise ValueError("one attention layer per decoder layer expected")
        self.sizes = sorted(capture_tokens)
        self.use_graphs, self.handoff = use_graphs, handoff
        w = text_model.embed_tokens.weight
        dev, dt = w.device, w.dtype
        n_max, hidden = self.sizes[-1], w.shape[1]
        sa = self.layers[0].self_attn
        self.ids = torch.zeros(n_max, dtype=torch.long, device=dev)
        self.pos = torch.arange(n_max, dtype=torch.long, device=dev)
        self.attn_out = torch.zeros(n_max, sa.num_heads * sa.head_dim, dtype=dt, device=dev)
        if handoff == "copy":
            self.res = torch.zeros(n_max, hidden, dtype=dt, device=dev)
            self.q = torch.zeros(n_max, sa.num_heads, sa.head_dim, dtype=dt, device=dev)
            self.k = torch.zeros_like(self.q)
            self.v = torch.zeros_like(self.q)
            self.out = torch.zeros(n_max, hidden, dtype=dt, device=dev)
        self.graphs: dict[int, list] = {}
        self.handed: dict[int, list] = {}  # direct: per bucket, per segment, the tensors the segment produced
        self.capture_s = 0.0

    @property
    def static_bytes(self) -> int:
        names = ("ids", "pos", "attn_out") + (("res", "q", "k", "v", "out") if self.handoff == "copy" else ())
        return sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in names)

    @property
    def num_graphs(self) -> int:
        return sum(len(g) for g in self.graphs.values())

    # -- the pieces -----------------------------------------------------------------------------------------------
    def _hidden_in(self, i: int, N: int, residual):
        """The residual stream entering piece ``i``: the embedding, or layer i-1 finished after its attention."""
        if i == 0:
            return self.m.embed(self.ids[:N], self.pos[:N])
        return self.layers[i - 1].post_attn(self.attn_out[:N], residual)

    def _segment(self, i: int, N: int) -> None:
        """Copy hand-off: read the fixed buffers, write the fixed buffers."""
        h = self._hidden_in(i, N, self.res[:N])
        if i < len(self.layers):
            self.res[:N].copy_(h)
            q, k, v = self.layers[i].pre_attn(h, self.pos[:N], self.m.rotary)
            self.q[:N].copy_(q)
            self.k[:N].copy_(k)
            self.v[:N].copy_(v)
        else:
            self.out[:N].copy_(self.m.norm(h))

    def _segment_direct(self, i: int, N: int, prev: Optional[tuple]) -> tuple:
        """Direct hand-off: return what the next piece and the attention read (kept alive by the caller)."""
        h = self._hidden_in(i, N, prev[0] if prev else None)
        if i < len(self.layers):
            return (h, *self.layers[i].pre_attn(h, self.pos[:N], self.m.rotary))
        return (self.m.norm(h),)

    def _attention(self, i: int, n: int, q, k, v) -> None:
        self.attn_out[:n].copy_(self.attention_layers[i](q[:n], k[:n], v[:n]))

    def _eager_pass(self, N: int, n: int) -> None:
        for i in range(len(self.layers)):
            self._segment(i, N)
            self._attention(i, n, self.q, self.k, self.v)
        self._segment(len(self.layers), N)

    # -- capture --------------------------------------------------------------------------------------------------
    def capture(self, progress: bool = False) -> None:
        """One graph per segment per bucket, largest bucket first, all in one memory pool."""
        from tqdm.auto import tqdm

        if not self.use_graphs:
            return
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        torch.cuda.synchronize()
        for N in tqdm(sorted(self.sizes, reverse=True), desc="capture buckets", disable=not progress, leave=False):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._warm(N)  # at this shape on the capture stream (cuBLAS workspaces)
            stream.synchronize()
            with torch.cuda.stream(stream):
                self.graphs[N] = self._capture_bucket(N, pool)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0

    def _warm(self, N: int) -> None:
        if self.handoff == "copy":
            self._eager_pass(N, N)
            return
        prev = None
        for i in range(len(self.layers) + 1):
            prev = self._segment_direct(i, N, prev)
            if i < len(self.layers):
                self._attention(i, N, *prev[1:])

    def _capture_bucket(self, N: int, pool) -> list:
        graphs, handed, prev = [], [], None
        for i in range(len(self.layers) + 1):
            g = torch.cuda.CUDAGraph()
            g.capture_begin(pool=pool)
            try:
                if self.handoff == "copy":
                    self._segment(i, N)
                else:
                    prev = self._segment_direct(i, N, prev)
                    handed.append(prev)
            finally:
                g.capture_end()
            graphs.append(g)
        if self.handoff == "direct":
            self.handed[N] = handed
        return graphs

    # -- run ------------------------------------------------------------------------------------------------------
    def bucket(self, n: int) -> Optional[int]:
        return bucket_for(n, self.sizes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Prefill one sequence; returns a view of a static output (clone it to keep it)."""
        n = input_ids.shape[0]
        N = self.bucket(n)
        if N is None:
            raise ValueError(f"{n} tokens exceed the largest capture ({self.sizes[-1]})")
        self.ids[:n].copy_(input_ids)
        if not self.use_graphs:
            self._eager_pass(N, n)
            return self.out[:n]
        graphs, L = self.graphs[N], len(self.layers)
        if self.handoff == "copy":
            for i in range(L):
                graphs[i].replay()
                self._attention(i, n, self.q, self.k, self.v)
            graphs[-1].replay()
            return self.out[:n]
        handed = self.handed[N]
        for i in range(L):
            graphs[i].replay()
            self._attention(i, n, *handed[i][1:])
        graphs[-1].replay()
        return handed[-1][0][:n]
