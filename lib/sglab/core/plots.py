"""One house style for every figure, and captions that say where the data came from."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


PALETTE = dict(before="#c0392b", after="#2471a3", eager="#7f8c8d", graph="#2471a3",
               neutral="#34495e", accent="#d68910")
CYCLE = ["#2471a3", "#c0392b", "#229954", "#d68910", "#7d3c98", "#17a589", "#5d6d7e", "#a04000"]


def apply_style() -> None:
    import matplotlib as mpl

    mpl.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 150, "figure.facecolor": "white", "axes.grid": True,
        "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
        "axes.titlesize": 11, "axes.titleweight": "bold", "axes.labelsize": 10,
        "legend.fontsize": 9, "legend.frameon": False, "xtick.labelsize": 9, "ytick.labelsize": 9,
        "axes.prop_cycle": mpl.cycler(color=CYCLE), "lines.linewidth": 1.8, "lines.markersize": 5
    })


def figure(ncols: int = 1, nrows: int = 1, *, width: float | None = None,
           height: float | None = None, **kw):
    import matplotlib.pyplot as plt

    apply_style()
    width = width or (5.2 * ncols if ncols > 1 else 6.4)
    height = height or 3.6 * nrows
    return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=ncols * nrows == 1,
                        constrained_layout=True, **kw)


def provenance_text(source: Any) -> str:
    """"GPU ×count · driver · torch · date" of a Run; the CPU of this machine for None."""
    if source is None:
        return "computed on the CPU of this machine"
    m = source.manifest
    where = "measured live" if source.live else "recorded run"
    return (f"{where}: {m.gpu_name} ×{m.gpu_count} · driver {m.driver} · torch {m.torch} · "
            f"{m.date}")


def caption(fig, source: Any = None, extra: str = "") -> str:
    """Put the data's provenance under ``fig``; returns the text."""
    text = provenance_text(source) + (f" · {extra}" if extra else "")
    fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=8, color="#555555")
    return text


# -- diagram: drawing primitives for the mechanism pictures on each notebook's first screen -------
BOX_COLORS = dict(before="#f5b7b1", after="#aed6f1", neutral="#e5e8e8", accent="#f9e79f",
                  removed="#f5b7b1", kept="#d5f5e3")


def canvas(width: float = 10.0, height: float = 3.0, *, xlim=(0, 10), ylim=(0, 3)):
    """A figure with one axis in data units and no frame, for boxes and arrows."""
    import matplotlib.pyplot as plt

    apply_style()
    fig, ax = plt.subplots(figsize=(width, height), constrained_layout=True)
    ax.set(xlim=xlim, ylim=ylim)
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", *, color: str = "neutral",
        edge: str = "#566573", fontsize: float = 8, hatch: str | None = None, **text_kw):
    """A rounded box with centred text, ``color`` a :data:`BOX_COLORS` key or any colour."""
    from matplotlib.patches import FancyBboxPatch

    face = BOX_COLORS.get(color, color)
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06", facecolor=face,
                       edgecolor=edge, linewidth=0.9, hatch=hatch))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **text_kw)


def arrow(ax, start: tuple[float, float], end: tuple[float, float]):
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": "-|>", "color": "#566573", "lw": 1.1})


def label(ax, x: float, y: float, text: str, *, fontsize: float = 9, weight: str = "bold",
          color: str | None = None, **kw):
    """A left-aligned label (row titles, 'before' / 'after')."""
    ax.text(x, y, text, fontsize=fontsize, fontweight=weight, color=color or PALETTE["neutral"],
            va="center", **kw)


# -- timeline: before and after as aligned swim-lanes on one time axis, as a profiler shows them --
CATEGORY_COLORS = dict(kernel="#5d6d7e", memcpy="#17a589", memset="#48c9b0", runtime="#a9cce3",
                       op="#d5d8dc", range="none")
LANE_ORDER = ("host", "runtime", "stream", "device")


def window(events):
    """The events re-zeroed to the first of them."""
    return events.assign(
        start_us=events.start_us - events.start_us.min()) if len(events) else events


def timeline(tables: Mapping[str, object], *, highlight: str | None = None,
             highlight_label: str = "mechanism",
             categories: Sequence[str] = ("kernel", "memcpy", "memset", "runtime",
                                          "range"), title: str = "", ax=None):
    """Swim-lanes per variant on one µs axis; events matching ``highlight`` in the accent colour."""
    from matplotlib.patches import Patch

    rows, first = [], {}
    for variant, ev in tables.items():
        ev = ev[ev.category.isin(categories)]
        order = {
            lane: next((i for i, p in enumerate(LANE_ORDER) if lane.startswith(p)), len(LANE_ORDER))
            for lane in ev.lane.unique()
        }
        for lane in sorted(order, key=lambda lane: (order[lane], lane)):
            first.setdefault(variant, len(rows))
            rows.append((variant, lane, ev[ev.lane == lane]))
    if ax is None:
        _, ax = figure(width=11.0, height=0.9 + 0.42 * max(1, len(rows)))
    fig = ax.figure
    for y, (variant, lane, ev) in enumerate(rows):
        y = len(rows) - 1 - y
        for cat, g in ev.groupby("category"):
            if cat == "range":
                for r in g.itertuples():  # phase ranges: an outline with the phase name
                    ax.broken_barh([(r.start_us, r.dur_us)], (y - 0.42, 0.84), facecolors="none",
                                   edgecolors="#7f8c8d", linewidth=0.8)
                    ax.text(r.start_us, y + 0.46, r.name.replace("phase::", ""), fontsize=7,
                            va="bottom", color="#555555", clip_on=True)
                continue
            hit = g.name.str.contains(highlight) if highlight else g.name.map(lambda n: False)
            for sel, color in ((~hit, CATEGORY_COLORS.get(cat,
                                                          "#999999")), (hit, PALETTE["accent"])):
                part = g[sel]
                if len(part):
                    ax.broken_barh(list(zip(part.start_us, part.dur_us.clip(lower=0.05))),
                                   (y - 0.3, 0.6), facecolors=color, edgecolors="none")
    ax.set_yticks(range(len(rows)), [f"{variant} · {lane}" for variant, lane, _ in rows[::-1]])
    ax.set_xlabel("time from the first event (µs)")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    for variant, ev in tables.items():  # each variant's totals beside its first lane
        if variant in first:
            span = (ev.start_us + ev.dur_us).max() - ev.start_us.min() if len(ev) else 0.0
            text = f"{span:.0f} µs · {(ev.category == 'kernel').sum()} kernels"
            if highlight:
                marked = ev[ev.name.str.contains(highlight) & (ev.category != "range")]
                text += f" · {highlight_label}: {len(marked)} ({marked.dur_us.sum():.0f} µs)"
            ax.annotate(text, (1.005, len(rows) - 1 - first[variant]),
                        xycoords=("axes fraction", "data"), va="center", fontsize=8,
                        color=PALETTE["before" if variant == list(tables)[0] else "after"])
    drawn = [c for c in categories if CATEGORY_COLORS.get(c, "none") != "none"]
    handles = [Patch(facecolor=CATEGORY_COLORS[c], label=c) for c in drawn]
    if highlight and highlight_label:
        handles.append(Patch(facecolor=PALETTE["accent"], label=highlight_label))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(handles),
              fontsize=8)
    return fig
