"""What one breakable capture consists of: the modules in each graph segment and the eager break between them.

:func:`capture_structure` runs a runner's own capture path (``_build_capture_forward_batch``, ``_run_forward``,
the model's ``@eager_on_graph`` attention) inside :class:`StructureCapture`, a
:class:`~sglab.fixes.breakable_graph.BreakableCUDAGraphCapture` that opens a list of module names where the real
one opens a CUDA graph. Runs on any device, so the slide can draw the structure of the model the GPU run measured
(same layer count, small widths); on a GPU the segment and break counts equal the real capture's (tested).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from sglab.fixes import breakable_graph as bg

CAPTURE_TOKENS = 16


class StructureCapture(bg.BreakableCUDAGraphCapture):
    """A capture that records module names per segment instead of capturing CUDA graphs."""

    def __init__(self):
        super().__init__(bg.BreakableCUDAGraph())
        self.segments: list[list[str]] = []
        self.breaks: list[str] = []
        self.stack: list[str] = []

    def _begin_new_segment(self) -> None:
        if self.segments:  # called right after an eager break ran, inside the module that broke
            self.breaks.append(self.stack[-1] if self.stack else "?")
        self.segments.append([])

    def _end_current_segment(self) -> None:
        pass

    @contextmanager
    def hooks(self, model: torch.nn.Module):
        """Record every module entered (into the open segment) while the capture runs."""
        handles = []
        for name, mod in model.named_modules():
            if not name:
                continue

            def pre(_m, _args, name=name):
                self.stack.append(name)
                if self.segments:
                    self.segments[-1].append(name)

            def post(_m, _args, _out):
                self.stack.pop()

            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


@dataclass
class Structure:
    boundary: str
    segments: list = field(default_factory=list)   # per segment: module names, in call order
    breaks: list = field(default_factory=list)     # per break: the module that broke

    @property
    def tail_in_graph(self) -> bool:
        """Does a captured segment contain the logits tail (the one-request gather)?"""
        return any("logits_processor" in n for seg in self.segments for n in seg)

    def labels(self) -> list[str]:
        return [segment_label(s) for s in self.segments]


def small_config(num_layers: int) -> bg.ModelConfig:
    """The measured model's layer count at widths a CPU builds in milliseconds."""
    return bg.ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, head_dim=16, intermediate_size=64,
                          num_layers=int(num_layers), max_position=64)


def capture_structure(boundary: str, num_layers: int = 16, model=None) -> Structure:
    """The segments and breaks of one capture with the given boundary ("before" or "after")."""
    model = model if model is not None else bg.build_model(small_config(num_layers))
    runner = bg.BreakableGraphRunner(model, boundary=boundary, capture_num_tokens=[CAPTURE_TOKENS], capture=False)
    if boundary == bg.AFTER and runner.layer_model is None:
        return Structure(boundary)
    batch = runner._build_capture_forward_batch(CAPTURE_TOKENS)
    meta = bg.build_attn_metadata(batch.extend_seq_lens_cpu, CAPTURE_TOKENS, runner.device)
    cap = StructureCapture()
    with cap.hooks(model), bg.set_forward_context(meta), torch.no_grad(), cap:
        runner._run_forward(batch, CAPTURE_TOKENS)
    return Structure(boundary, cap.segments, cap.breaks)


_LAYER = re.compile(r"layers\.(\d+)\.(.*)")
_WORDS = {"input_layernorm": "norm", "self_attn.qkv_proj": "qkv", "self_attn.o_proj": "o_proj",
          "post_attention_layernorm": "norm", "mlp": "MLP"}


def segment_label(names: list[str]) -> str:
    """A short description of one segment, e.g. ``"L0 o_proj·norm·MLP | L1 norm·qkv"``."""
    parts: list[tuple[str, list[str]]] = []
    for n in names:
        n = n.removeprefix("model.").removeprefix("language_model.model.")
        m = _LAYER.search(n)
        if m:
            word = _WORDS.get(m.group(2))
            where = f"L{m.group(1)}"
        else:
            leaf = n.split(".")[-1]
            word = {"embed_tokens": "embed", "embed_positions": None, "norm": "final norm",
                    "logits_processor": "logits tail"}.get(leaf)
            where = ""
        if word is None:
            continue
        if parts and parts[-1][0] == where:
            if word not in parts[-1][1]:
                parts[-1][1].append(word)
        else:
            parts.append((where, [word]))
    return " | ".join((f"{w} " if w else "") + "·".join(ws) for w, ws in parts)
