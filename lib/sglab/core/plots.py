"""One house style for every figure, and captions that say where the data came from."""

from __future__ import annotations

from typing import Any

PALETTE = {"before": "#c0392b", "after": "#2471a3", "eager": "#7f8c8d", "graph": "#2471a3",
           "neutral": "#34495e", "accent": "#d68910"}
CYCLE = ["#2471a3", "#c0392b", "#229954", "#d68910", "#7d3c98", "#17a589", "#5d6d7e", "#a04000"]


def apply_style() -> None:
    import matplotlib as mpl

    mpl.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 150, "figure.facecolor": "white",
        "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
        "axes.titlesize": 11, "axes.titleweight": "bold", "axes.labelsize": 10, "legend.fontsize": 9,
        "legend.frameon": False, "xtick.labelsize": 9, "ytick.labelsize": 9,
        "axes.prop_cycle": mpl.cycler(color=CYCLE), "lines.linewidth": 1.8, "lines.markersize": 5,
    })


def figure(ncols: int = 1, nrows: int = 1, *, width: float | None = None, height: float | None = None, **kw):
    import matplotlib.pyplot as plt

    apply_style()
    width = width or (5.2 * ncols if ncols > 1 else 6.4)
    height = height or 3.6 * nrows
    fig, ax = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=ncols * nrows == 1,
                           constrained_layout=True, **kw)
    return fig, ax


def provenance_text(source: Any) -> str:
    """"GPU ×count · driver · torch · date" from a Run or a manifest dict; "CPU (this machine)" for None."""
    if source is None:
        return "computed on the CPU of this machine"
    m = source.manifest if hasattr(source, "manifest") else dict(source)
    live = getattr(source, "live", False)
    where = "measured live" if live else "recorded run"
    return (f"{where}: {m.get('gpu_name')} ×{m.get('gpu_count')} · driver {m.get('driver')} · "
            f"torch {m.get('torch')} · {str(m.get('created_utc', ''))[:10]}")


def caption(fig, source: Any = None, extra: str = "") -> str:
    """Put the data's provenance under ``fig``; returns the text."""
    text = provenance_text(source) + (f" · {extra}" if extra else "")
    fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=8, color="#555555")
    return text
