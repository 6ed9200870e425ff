"""Notebook 06: Piecewise capture sizes aligned to the attention-TP group (#23972)."""
