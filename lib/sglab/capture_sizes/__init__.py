"""Notebook 06 · piecewise capture sizes aligned to the attention-TP group (SGLang #23972)."""
