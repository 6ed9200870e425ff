"""Before and after as aligned swim-lanes on one time axis: what a profiler shows, drawn from an event table.

The input is :mod:`sglab.core.trace`'s table (``lane, name, category, start_us, dur_us, phase``), live or read
back from a recorded run, so a reader without a GPU sees the same picture. The mechanism's kernels or calls are
highlighted (a regular expression over event names) and each variant's totals are written at its right.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from sglab.core.plots import PALETTE, figure

CATEGORY_COLORS = {"kernel": "#5d6d7e", "memcpy": "#17a589", "memset": "#48c9b0", "runtime": "#a9cce3",
                   "op": "#d5d8dc", "range": "none"}
LANE_ORDER = ("host", "runtime", "stream", "device")


def window(events, phase: str | None = None, *, names: str | None = None):
    """The events of one phase (or matching ``names``), re-zeroed to the first of them."""
    d = events
    if phase is not None:
        d = d[d.phase == phase]
    if names is not None:
        d = d[_matches(d.name, names)]
    if len(d):
        d = d.assign(start_us=d.start_us - d.start_us.min())
    return d


def _matches(names, pattern: str):
    rx = re.compile(pattern)
    return names.map(lambda n: bool(rx.search(n)))


def _lane_key(lane: str):
    for i, prefix in enumerate(LANE_ORDER):
        if lane.startswith(prefix):
            return (i, lane)
    return (len(LANE_ORDER), lane)


def totals(events, highlight: str | None = None) -> dict:
    """Span, device activity and highlighted events of one table: the numbers the plot annotates."""
    dev = events[events.category.isin(["kernel", "memcpy", "memset"])]
    hit = events[_matches(events.name, highlight)] if highlight else events.iloc[0:0]
    hit = hit[hit.category != "range"]
    span = float((events.start_us + events.dur_us).max() - events.start_us.min()) if len(events) else 0.0
    return {"span_us": span, "kernels": int((dev.category == "kernel").sum()), "device_us": float(dev.dur_us.sum()),
            "highlighted": int(len(hit)), "highlighted_us": float(hit.dur_us.sum())}


def timeline(tables: Mapping[str, object], *, highlight: str | None = None, highlight_label: str = "mechanism",
             categories: Sequence[str] = ("kernel", "memcpy", "memset", "runtime", "range"),
             title: str = "", width: float = 11.0, ax=None, annotate: bool = True):
    """One group of swim-lanes per variant (e.g. ``{"before": ev_a, "after": ev_b}``), on one shared µs axis.

    ``highlight``: a regular expression over event names; matching events are drawn in the accent colour and
    counted in the annotation. Returns the figure.
    """
    rows, labels = [], []
    for variant, ev in tables.items():
        ev = ev[ev.category.isin(categories)]
        for lane in sorted(ev.lane.unique(), key=_lane_key):
            rows.append((variant, lane, ev[ev.lane == lane]))
            labels.append(f"{variant} · {lane}")
    if ax is None:
        fig, ax = figure(width=width, height=0.9 + 0.42 * max(1, len(rows)))
    else:
        fig = ax.figure
    pattern = re.compile(highlight) if highlight else None
    for y, (variant, lane, ev) in enumerate(rows):
        _draw_lane(ax, len(rows) - 1 - y, ev, pattern)
    ax.set_yticks(range(len(rows)), list(reversed(labels)))
    ax.set_xlabel("time from the first event (µs)")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    if annotate:
        _annotate(ax, tables, rows, highlight, highlight_label)
    _legend(ax, categories, highlight_label if pattern else None)
    return fig


def _draw_lane(ax, y: float, ev, pattern) -> None:
    for cat, g in ev.groupby("category"):
        if cat == "range":
            for r in g.itertuples():  # phase ranges: an outline with the phase name
                ax.broken_barh([(r.start_us, r.dur_us)], (y - 0.42, 0.84), facecolors="none",
                               edgecolors="#7f8c8d", linewidth=0.8)
                ax.text(r.start_us, y + 0.46, r.name.replace("phase::", ""), fontsize=7, va="bottom",
                        color="#555555", clip_on=True)
            continue
        hit = g.name.map(lambda n: bool(pattern.search(n))) if pattern else g.name.map(lambda n: False)
        for sel, color in ((~hit, CATEGORY_COLORS.get(cat, "#999999")), (hit, PALETTE["accent"])):
            part = g[sel]
            if len(part):
                ax.broken_barh(list(zip(part.start_us, part.dur_us.clip(lower=0.05))), (y - 0.3, 0.6),
                               facecolors=color, edgecolors="none")


def _annotate(ax, tables, rows, highlight, label) -> None:
    first_row = {}
    for i, (variant, _, _) in enumerate(rows):
        first_row.setdefault(variant, len(rows) - 1 - i)
    for variant, ev in tables.items():
        if variant not in first_row:
            continue
        t = totals(ev, highlight)
        text = f"{t['span_us']:.0f} µs · {t['kernels']} kernels"
        if highlight:
            text += f" · {label}: {t['highlighted']} ({t['highlighted_us']:.0f} µs)"
        ax.annotate(text, (1.005, first_row[variant]), xycoords=("axes fraction", "data"), va="center",
                    fontsize=8, color=PALETTE["before"] if variant == list(tables)[0] else PALETTE["after"])


def _legend(ax, categories, highlight_label) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=CATEGORY_COLORS[c], label=c) for c in categories if c in CATEGORY_COLORS
               and CATEGORY_COLORS[c] != "none"]
    if highlight_label:
        handles.append(Patch(facecolor=PALETTE["accent"], label=highlight_label))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(handles), fontsize=8)
