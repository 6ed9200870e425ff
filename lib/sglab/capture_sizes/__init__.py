"""Notebook 06 · piecewise capture sizes aligned to the attention-TP group (SGLang #23972).

- :mod:`.rebuild`  the PR-era rules, one section per upstream file; the switch ``policy_lists``
  (``before``, ``pr_filter``, ``round_up``) and the dense-TP1 boundary
- :mod:`.measure`  the boundary on 2–4 GPUs: the runner's capture loop per variant, padded replays,
  the collective's own answer, a traced pass
- :mod:`.show`     tables and figures of a run (or its NoRun line); "your own setup": the notebook
  control and ``sglab capture-sizes``
- :mod:`.claims`   what every run must show, and the headline
- :mod:`.sglang`   the fix's record, its source check, its real-release probe (the runners' code on
  configured lists or on your server arguments) and the comparison
"""
