"""Notebook 06 · piecewise capture sizes aligned to the attention-TP group (SGLang #23972).

``rebuild`` (the PR-era rules and the dense-TP1 boundary), ``measure`` (the boundary on 2-4 GPUs),
``show`` and ``server_args`` (tables, figures, your own setup), ``claims`` (what every run must
show, the review card), ``sglang`` and ``release_probe`` (the fix's record and the real releases).
"""
