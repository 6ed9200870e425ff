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
# the "your own setup" control of notebook 02
# --------------------------------------------------------------------------------------------------------------
def workspace_floor():
    """02: a floor, a world size and a prompt length -> re-creations, time and MiB per policy on a generated cold
    start (:func:`sglab.investigate.workspace.floor_table`)."""
    from sglab.investigate.workspace import floor_table

    return explore(floor_table, {"floor": [0, 256, 512, 1024, 2048, 4096], "world_size": [2, 4, 8],
                                 "prompt_length": [16, 48, 128, 512, 1200, 4096]},
                   static=[{"floor": 2048, "world_size": 4, "prompt_length": 48},
                           {"floor": 512, "world_size": 8, "prompt_length": 48},
                           {"floor": 2048, "world_size": 4, "prompt_length": 1200}],
                   title="Your traffic: workspace re-creations per policy on a generated cold start")

