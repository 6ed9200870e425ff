"""Release × fix timeline figures, one colour per state, drawn from the release table.

Both functions take the table (default: the committed ``data/upstream/releases.csv``), so the CLI, the notebooks
and the tests draw the same picture. The house style comes from :mod:`sglab.core.plots`, imported here lazily to keep
this package at the bottom layer.
"""

from __future__ import annotations

from sglab.sglang.upstream import RELEASE_STATES, registered

STATE_COLOURS = {"absent": "#d5d8dc", "before": "#c0392b", "pr-era": "#2471a3", "changed": "#229954",
                 "regressed": "#d68910", "unknown": "#ffffff"}
assert set(STATE_COLOURS) == set(RELEASE_STATES)


def _table(frame):
    if frame is None:
        from sglab.sglang.wheels import load_table

        frame = load_table()
    return frame.reset_index(drop=True)


def _caption(fig, frame, extra: str = "") -> str:
    first, last = frame["build_date"].iloc[0][:10], frame["build_date"].iloc[-1][:10]
    text = (f"read from the released SGLang wheels {frame['version'].iloc[0]} (built {first}) to "
            f"{frame['version'].iloc[-1]} (built {last}) by sglab.sglang.upstream" + (f" · {extra}" if extra else ""))
    fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=8, color="#555555")
    return text


def _legend(ax, states, ncol):
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=STATE_COLOURS[s], edgecolor="#7f8c8d", label=s) for s in states]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=ncol, frameon=False)


def timeline_figure(frame=None, *, fixes=None, ax=None):
    """Releases left to right, one row per fix, each cell coloured by that fix's state in that release."""
    from matplotlib.patches import Rectangle

    from sglab.core import plots

    frame = _table(frame)
    fixes = list(fixes or registered())
    if ax is None:
        fig, ax = plots.figure(width=max(7.0, 0.48 * len(frame) + 2.5), height=0.42 * len(fixes) + 1.9)
    fig = ax.figure
    for y, fix in enumerate(fixes):
        for x, state in enumerate(frame[fix]):
            ax.add_patch(Rectangle((x, y), 0.94, 0.86, facecolor=STATE_COLOURS.get(state, "#ffffff"),
                                   edgecolor="#7f8c8d" if state == "unknown" else "none",
                                   hatch="//" if state == "unknown" else None))
    ax.set_xlim(-0.1, len(frame))
    ax.set_ylim(len(fixes), -0.15)
    ax.set_xticks([x + 0.47 for x in range(len(frame))], frame["version"], rotation=60, ha="right")
    ax.set_yticks([y + 0.43 for y in range(len(fixes))], fixes)
    ax.grid(False)
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("Which SGLang release has which fix")
    present = [s for s in STATE_COLOURS if s in set(frame[fixes].to_numpy().ravel())]
    _legend(ax, present, ncol=len(present))
    _caption(fig, frame)
    return fig


def timeline_row_figure(fix: str, frame=None, *, ax=None):
    """One fix across the releases: a coloured strip, each run of equal states labelled where it starts."""
    from sglab.core import plots

    frame = _table(frame)
    if fix not in frame.columns:
        raise KeyError(f"no column {fix!r} in the release table; fixes: {list(registered())}")
    if ax is None:
        fig, ax = plots.figure(width=max(7.0, 0.45 * len(frame) + 1.5), height=1.9)
    fig = ax.figure
    states = list(frame[fix])
    ax.bar(range(len(states)), [1] * len(states), width=0.94, align="edge",
           color=[STATE_COLOURS.get(s, "#ffffff") for s in states], edgecolor="none")
    start = 0
    for i in range(1, len(states) + 1):
        if i == len(states) or states[i] != states[start]:
            ax.text((start + i) / 2, 0.5, states[start], ha="center", va="center", fontsize=9,
                    color="black" if states[start] in ("absent", "unknown") else "white", fontweight="bold")
            start = i
    ax.set_xlim(0, len(states))
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xticks([x + 0.47 for x in range(len(states))], frame["version"], rotation=60, ha="right", fontsize=8)
    ax.grid(False)
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"{fix}: {registered().get(fix, '')}", fontsize=10)
    _caption(fig, frame)
    return fig
