"""Small drawing primitives for the mechanism pictures on each notebook's first screen.

A mechanism picture is drawn by code (no image files), from the rebuild's own structure or a run's numbers, so it
stays true when the code changes. These helpers keep the pictures in one style: rounded boxes in a row, arrows,
a caption line.
"""

from __future__ import annotations

from typing import Sequence

from sglab.core.plots import PALETTE, apply_style

BOX_COLORS = {"before": "#f5b7b1", "after": "#aed6f1", "neutral": "#e5e8e8", "accent": "#f9e79f",
              "removed": "#f5b7b1", "kept": "#d5f5e3"}


def canvas(width: float = 10.0, height: float = 3.0, *, xlim=(0, 10), ylim=(0, 3)):
    """A figure with one axis in data units and no frame, for boxes and arrows."""
    import matplotlib.pyplot as plt

    apply_style()
    fig, ax = plt.subplots(figsize=(width, height), constrained_layout=True)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", *, color: str = "neutral",
        edge: str = "#566573", fontsize: float = 8, hatch: str | None = None, **text_kw):
    """A rounded box with centred text; ``color`` is a :data:`BOX_COLORS` key or any matplotlib colour."""
    from matplotlib.patches import FancyBboxPatch

    face = BOX_COLORS.get(color, color)
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06", facecolor=face,
                                edgecolor=edge, linewidth=0.9, hatch=hatch))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **text_kw)


def row(ax, x: float, y: float, items: Sequence[tuple[str, str]], *, w: float = 0.9, h: float = 0.5,
        gap: float = 0.08, fontsize: float = 7.5) -> float:
    """Boxes ``(text, color)`` left to right from ``x``; returns the x after the last box."""
    for text, color in items:
        box(ax, x, y, w, h, text, color=color, fontsize=fontsize)
        x += w + gap
    return x


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str = "", *, color: str = "#566573",
          fontsize: float = 8, style: str = "-|>"):
    """An arrow from ``start`` to ``end`` with an optional label at its middle."""
    ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": style, "color": color, "lw": 1.1})
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.08, text, ha="center", va="bottom",
                fontsize=fontsize, color=color)


def label(ax, x: float, y: float, text: str, *, fontsize: float = 9, weight: str = "bold", color: str | None = None,
          **kw):
    """A left-aligned label (row titles, 'before' / 'after')."""
    ax.text(x, y, text, fontsize=fontsize, fontweight=weight, color=color or PALETTE["neutral"], va="center", **kw)
