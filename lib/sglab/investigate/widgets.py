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
        df = fn(**s).reset_index()
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
