"""A forward captured as CUDA-graph segments separated by eager break points.

Mirrors ``python/sglang/srt/model_executor/breakable_cuda_graph/breakable_cuda_graph.py`` at the PR era of SGLang
#24662: ``eager_on_graph`` (a decorated function ends the current segment during a capture, runs eagerly, and is
recorded as a replay closure), ``BreakableCUDAGraph`` (segments + break closures, replayed alternately) and
``BreakableCUDAGraphCapture`` (one memory pool for every segment).

Tensors captured at a break point are held with strong references (SGLang held weak references at the PR era;
SGLang issues #30584 / #37606 later found that unsafe). There is no side-stream ``wait_stream`` hook because the
toy model forks no streams. :class:`EmulatedReplay` stands in for a captured graph on a machine without CUDA.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_current_capture: "BreakableCUDAGraphCapture | None" = None


def _copy_output(dst: Any, src: Any) -> Any:
    if torch.is_tensor(dst) and torch.is_tensor(src):
        dst.copy_(src)
        return dst
    return src


def eager_on_graph(enable: bool = True):
    """Decorate a function that must run eagerly: during a breakable capture it ends the current graph
    segment, runs once eagerly, records a replay closure and starts a new segment."""

    def decorator(inner: Callable):
        if not enable:
            return inner

        def wrapper(*args, **kwargs):
            capture = _current_capture
            if capture is None:
                return inner(*args, **kwargs)
            capture._end_current_segment()
            output = inner(*args, **kwargs)
            # Strong references: the segment before the break wrote these inputs, the segment after it
            # reads this output; both addresses must stay owned for the lifetime of the graph.
            captured_args, captured_kwargs, captured_output = args, dict(kwargs), output

            def replay_fn():
                new_out = inner(*captured_args, **captured_kwargs)
                return _copy_output(captured_output, new_out)

            capture.cuda_graph._break_fns.append(replay_fn)
            capture._begin_new_segment()
            return output

        wrapper.__name__ = getattr(inner, "__name__", "eager_fn")
        wrapper.__wrapped__ = inner
        return wrapper

    return decorator


class BreakableCUDAGraph:
    """One ``torch.cuda.CUDAGraph`` per segment plus one eager function between consecutive segments."""

    def __init__(self) -> None:
        self._segments: list[torch.cuda.CUDAGraph] = []
        self._break_fns: list[Callable[[], Any]] = []

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    @property
    def num_breaks(self) -> int:
        return len(self._break_fns)

    def replay(self) -> None:
        for i, seg in enumerate(self._segments):
            seg.replay()
            if i < len(self._break_fns):
                self._break_fns[i]()


class BreakableCUDAGraphCapture:
    """Capture the enclosed code as graph segments, all allocating from the one ``pool``."""

    def __init__(self, cuda_graph: BreakableCUDAGraph, pool=None, stream: torch.cuda.Stream | None = None):
        self.cuda_graph = cuda_graph
        self._pool = pool
        self._stream = stream
        self._stream_ctx = None

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
        if getattr(self, "_segment_open", False):  # not twice when an eager break raised
            self._segment_open = False
            self.cuda_graph._segments[-1].capture_end()


class EmulatedReplay:
    """CPU stand-in for a captured graph: replay re-runs the captured closure over the same static buffers
    and the same capture-time batch object, then copies into the captured output buffer."""

    num_segments = 0
    num_breaks = 0

    def __init__(self, run_once: Callable[[], torch.Tensor], output: torch.Tensor):
        self._run_once = run_once
        self._output = output

    @torch.no_grad()
    def replay(self) -> None:
        self._output.copy_(self._run_once())
