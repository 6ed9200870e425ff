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
