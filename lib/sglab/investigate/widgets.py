"""Notebook controls for the "your own setup" questions, and the static table they become where nothing is live.

``explore(fn, controls, static=[...])`` shows sliders and drop-downs (ipywidgets) in a live notebook, calling
``fn(**settings) -> DataFrame`` on every change. In a headless run (``sglab run``, the HTML report, the tests:
``SGLAB_HEADLESS=1``) or without ipywidgets, it shows one table of ``fn`` over the ``static`` settings instead, so the
report still answers the question for a few representative cases.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence


def interactive_here() -> bool:
    """True in a notebook with a frontend that can show widgets (not headless, ipywidgets importable)."""
    if os.environ.get("SGLAB_HEADLESS") == "1":
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def static_table(fn: Callable, static: Sequence[dict]):
    """``fn`` over each settings dict, one block of rows per setting, the settings as leading columns."""
    import pandas as pd

    parts = []
    for s in static:
        df = fn(**s)
        df = df.reset_index() if any(df.index.names) else df.reset_index(drop=True)   # keep a named index only
        for i, (k, v) in enumerate(s.items()):
            df.insert(i, k, v)
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def explore(fn: Callable, controls: dict, *, static: Sequence[dict], title: str = ""):
    """Controls when interactive, else the static table (returned, so a notebook cell displays it)."""
    if not interactive_here():
        if title:
            print(f"{title} — static table (run the notebook in JupyterLab for the controls):")
        return static_table(fn, static)
    import ipywidgets as w
    from IPython.display import display

    widgets = {}
    for name, spec in controls.items():
        if isinstance(spec, (list, tuple)) and all(isinstance(x, (int, float)) for x in spec) and len(spec) > 3:
            widgets[name] = w.SelectionSlider(options=list(spec), value=static[0].get(name, spec[0]),
                                              description=name, continuous_update=False)
        else:
            widgets[name] = w.Dropdown(options=list(spec), value=static[0].get(name, list(spec)[0]), description=name)
    out = w.interactive_output(lambda **kw: display(fn(**kw)), widgets)
    if title:
        display(w.HTML(f"<b>{title}</b>"))
    display(w.VBox([w.HBox(list(widgets.values())[i:i + 3]) for i in range(0, len(widgets), 3)]), out)
    return None


# --------------------------------------------------------------------------------------------------------------
# the three "your own setup" controls of notebooks 02, 04 and 06
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


def swa_layout():
    """04: layers, SWA layers per full layer, decode batch size and captured slots -> extra kernels and µs per decode
    step without the preset, int64 bytes wasted (:func:`sglab.investigate.swa_cost.pattern_table`)."""
    from sglab.investigate.swa_cost import pattern_table

    return explore(pattern_table, {"layers": [8, 16, 24, 32, 48, 62, 80], "swa_per_full": [1, 2, 3, 5, 7],
                                   "batch_size": [1, 8, 32, 128, 256], "max_bs": [64, 128, 256, 512]},
                   static=[{"layers": 62, "swa_per_full": 5, "batch_size": 32, "max_bs": 256},
                           {"layers": 48, "swa_per_full": 3, "batch_size": 32, "max_bs": 256},
                           {"layers": 24, "swa_per_full": 1, "batch_size": 1, "max_bs": 256}],
                   title="Your model: what the SWA location preset saves per decode step")


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
