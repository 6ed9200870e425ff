"""Notebook 01 · a VLM wrapper through the piecewise-CUDA-graph gate without registering its LLM
twice (SGLang #26382, part A): ``rebuild``, ``measure``, ``tables``, ``show``, ``claims``,
``sglang``, ``serving`` (see docs/structure.md)."""
