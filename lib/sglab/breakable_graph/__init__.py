"""Notebook 03 · the breakable CUDA graph captures only the layer stack, so one graph serves prefill
batches of any request count (SGLang #24662): ``rebuild``, ``measure``, ``show``, ``claims``,
``sglang`` (see docs/structure.md)."""
