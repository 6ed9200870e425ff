"""Notebook controls for the "your own setup" questions, and the static table they become where nothing is live.

``explore(fn, controls, static=[...])`` shows sliders and drop-downs (ipywidgets) in a live notebook, calling
``fn(**settings) -> DataFrame`` on every change. In a headless run (``sglab run``, the HTML report, the tests:
``SGLAB_HEADLESS=1``) or without ipywidgets, it shows one table of ``fn`` over the ``static`` settings instead, so the
report still answers the question for a few representative cases.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence


from sglab.core.notebook import explore, interactive_here, static_table  # noqa: F401,E402


# --------------------------------------------------------------------------------------------------------------
# the "your own setup" controls of notebook 06
# --------------------------------------------------------------------------------------------------------------
def capture_rules():
    """06: attention TP, CP, dense TP 1 and two-batch overlap -> the piecewise sizes per rule and the refused ones
    (:func:`sglab.investigate.capture_sizes.rule_table`)."""
    from sglab.investigate.capture_sizes import rule_table

    return explore(rule_table, {"attn_tp": [1, 2, 3, 4, 5, 6, 7, 8], "attn_cp": [1, 2, 3, 4],
                                "dense_tp1": [True, False], "tbo": [False, True]},
                   static=[{"attn_tp": 8, "attn_cp": 1, "dense_tp1": True, "tbo": False},
                           {"attn_tp": 8, "attn_cp": 1, "dense_tp1": True, "tbo": True},
                           {"attn_tp": 3, "attn_cp": 1, "dense_tp1": True, "tbo": False}],
                   title="Your parallel layout: piecewise capture sizes per rule, and the refused ones")
