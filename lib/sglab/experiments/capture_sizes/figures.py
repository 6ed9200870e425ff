"""Every figure of notebook 06, drawn from the rebuild's functions or a run's tables (no numbers typed in)."""

from __future__ import annotations

from typing import Sequence

from sglab.core import plots
from sglab.fixes import capture_sizes as fx
from sglab.core import plots as diagram

from sglab.experiments.capture_sizes.analysis import STATUSES, capture_ranges, policy_lists, size_status

_SHARD_COLORS = {"equal": "#aed6f1", "more": "#e6b0aa", "fewer": "#fadbd8"}


# --------------------------------------------------------------------------------------------------------------
# the mechanism picture (the slide)
# --------------------------------------------------------------------------------------------------------------
def _columns(sizes: list[int], tp: int, max_cols: int) -> list[int]:
    """The sizes drawn one per column: up to one past the last refused size among the first ``max_cols``."""
    bad = [i for i, n in enumerate(sizes[:max_cols]) if n % tp]
    last = min(len(sizes), (bad[-1] + 2) if bad else 4, max_cols)
    return sizes[:last]


def mechanism(attn_tp: int = 8, max_tokens: int = 2048, sizes: Sequence[int] | None = None, *,
              attn_cp: int = 1, max_cols: int = 12):
    """The capture sizes against the attention-TP ranks: each size's ``tensor_split`` shard per rank (rows), the
    sizes with unequal shards (which the reduce-scatter refuses) marked, and below them what the PR's filter keeps
    and what rounding up to ``mul_base`` makes of each size. Computed with :mod:`sglab.fixes.capture_sizes`."""
    sizes = list(sizes) if sizes is not None else fx.default_piecewise_capture_sizes(max_tokens)
    lists = policy_lists(sizes, attn_tp, attn_cp)
    base = fx.piecewise_mul_base(attn_tp, attn_cp)
    cols = _columns(sizes, attn_tp, max_cols)
    rest = sizes[len(cols):]
    cw, x0, rh = 0.98, 1.7, 0.42
    width = x0 + cw * (len(cols) + (1.6 if rest else 0)) + 0.2
    height = rh * (attn_tp + 2) + 2.35
    fig, ax = diagram.canvas(min(13.0, 1.0 + width * 0.95), 1.2 + height * 0.62, xlim=(0, width), ylim=(0, height))
    top = height - 1.05
    for j, n in enumerate(cols):
        _size_column(ax, x0 + j * cw, top, n, attn_tp, rh, lists, base, set(sizes))
    yb = top - rh * attn_tp
    for i in range(attn_tp):
        diagram.label(ax, 0.05, top - rh * (i + 0.5), f"rank {i}", fontsize=8, weight="normal")
    diagram.label(ax, 0.05, yb - 0.45, "PR filter", fontsize=8)
    diagram.label(ax, 0.05, yb - 0.45 - rh - 0.04, f"round up (×{base})", fontsize=8)
    if rest:
        _rest_column(ax, x0 + len(cols) * cw, top, yb, rest, attn_tp, lists, rh)
    _mechanism_title(ax, width, height, sizes, attn_tp, attn_cp, lists)
    return fig


def _size_column(ax, x, top, n, tp, rh, lists, base, original) -> None:
    refused = n % tp != 0
    ax.text(x + 0.44, top + 0.12, str(n), ha="center", va="bottom", fontsize=9, fontweight="bold",
            color=plots.PALETTE["before"] if refused else plots.PALETTE["neutral"])
    if refused:
        ax.text(x + 0.44, top + 0.42, "✗ refused", ha="center", va="bottom", fontsize=7,
                color=plots.PALETTE["before"])
    shards = fx.shard_sizes(n, tp)
    for i, s in enumerate(shards):
        color = "equal" if not refused else ("more" if s > min(shards) else "fewer")
        diagram.box(ax, x, top - rh * (i + 1) + 0.04, 0.88, rh - 0.08, str(s), color=_SHARD_COLORS[color],
                    fontsize=7.5)
    yb = top - rh * tp
    kept = n in lists["pr_filter"]
    diagram.box(ax, x, yb - 0.45 - rh / 2 + 0.04, 0.88, rh - 0.08, str(n) if kept else "dropped",
                color="kept" if kept else "neutral", fontsize=7)
    up = fx.ceil_align(n, base)
    text = str(up) if up == n else f"→ {up}" + (", merged" if up in original else "")
    diagram.box(ax, x, yb - 0.45 - rh * 1.5 + 0.0, 0.88, rh - 0.08, text,
                color="kept" if up == n else "accent", fontsize=7)


def _rest_column(ax, x, top, yb, rest, tp, lists, rh) -> None:
    bad = [n for n in rest if n % tp]
    kept = [n for n in rest if n in lists["pr_filter"]]
    what = "all split equally" if not bad else f"{len(bad)} refused"
    diagram.box(ax, x + 0.1, yb + 0.04, 1.3, top - yb - 0.08,
                f"{rest[0]} … {rest[-1]}\n{len(rest)} more sizes\n{what}",
                color=_SHARD_COLORS["equal"] if not bad else "removed",
                fontsize=7.5)
    diagram.box(ax, x + 0.1, yb - 0.45 - rh / 2 + 0.04, 1.3, rh - 0.08, f"{len(kept)} kept", color="kept",
                fontsize=7)
    moved = [n for n in rest if n not in lists["round_up"]]
    diagram.box(ax, x + 0.1, yb - 0.45 - rh * 1.5, 1.3, rh - 0.08,
                f"{len(moved)} rounded up" if moved else "unchanged", color="accent" if moved else "kept", fontsize=7)


def _mechanism_title(ax, width, height, sizes, tp, cp, lists) -> None:
    dropped = [n for n in sizes if n not in lists["pr_filter"]]
    moved = [n for n in sizes if n not in lists["round_up"]]
    merged = [n for n in moved if fx.ceil_align(n, fx.piecewise_mul_base(tp, cp)) in sizes]
    cp_text = f", attention CP {cp}" if cp != 1 else ""
    ax.text(0.05, height - 0.12, f"{len(sizes)} capture sizes split over attention TP {tp}{cp_text} "
                                 "(tensor_split: the first n % TP ranks get one row more)",
            fontsize=10, fontweight="bold", va="top", color=plots.PALETTE["neutral"])
    drops = ", ".join(map(str, dropped[:8])) + (" …" if len(dropped) > 8 else "")
    note = (f"PR filter keeps {len(lists['pr_filter'])} of {len(sizes)}"
            + (f" (drops {drops})" if dropped else "") + f"; rounding up gives {len(lists['round_up'])} buckets"
            + (f" ({len(merged)} of the {len(moved)} rounded sizes land on a size already in the list)" if moved
               else ""))
    ax.text(0.05, 0.42, note, fontsize=8, va="bottom", color="#555555")
    from matplotlib.patches import Patch

    legend = [Patch(facecolor=_SHARD_COLORS["equal"], edgecolor="#566573", label="rows per rank, equal shards"),
              Patch(facecolor=_SHARD_COLORS["more"], edgecolor="#566573", label="unequal: one row more"),
              Patch(facecolor=_SHARD_COLORS["fewer"], edgecolor="#566573", label="unequal: one row fewer")]
    ax.legend(handles=legend, loc="lower left", ncol=3, fontsize=7.5, bbox_to_anchor=(0.0, -0.03))


# --------------------------------------------------------------------------------------------------------------
# a run: status of every size per variant
# --------------------------------------------------------------------------------------------------------------
STATUS_COLORS = dict(zip(STATUSES, (plots.PALETTE["after"], plots.PALETTE["graph"], plots.PALETTE["eager"],
                                    plots.PALETTE["before"], "#d5d8dc")))
ORDER = ("before", "before_probe", "pr_filter", "round_up")


def size_status_plot(run):
    """One dot per (variant, size), coloured by what happened to it; failed sizes labelled."""
    import matplotlib.ticker

    st = size_status(run.df)
    fig, ax = plots.figure(width=10, height=2.8)
    for y, v in enumerate(ORDER):
        sub = st[st.variant == v]
        for status, color in STATUS_COLORS.items():
            pts = sub[sub.status == status]
            if len(pts):
                ax.scatter(pts["size"], [y] * len(pts), color=color, s=28, label=status)
        for n in sub[sub.status == "failed"]["size"]:
            ax.annotate(str(n), (n, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                        color=STATUS_COLORS["failed"])
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yticks(range(len(ORDER)), ORDER)
    ax.set_ylim(-0.5, len(ORDER) - 0.3)
    ax.set_xlabel("capture size (tokens, log scale)")
    w = run.manifest["params"]["world_size"]
    ax.set_title(f"capture sizes at attention TP {w}")
    plots.caption(fig, run, f"world size {w}")
    return fig


# --------------------------------------------------------------------------------------------------------------
# CPU: buckets kept and padding over attention TP x CP
# --------------------------------------------------------------------------------------------------------------
def alignment_heatmaps(table, max_tokens: int, n_default: int):
    """Buckets kept by the PR filter and by rounding up, and the PR filter's padding, per (attn_tp, attn_cp),
    two-batch overlap off; ``assert`` where the PR's assertion fires."""
    import numpy as np

    off = table[~table.two_batch_overlap]
    off = off.assign(n_pr=off.n_pr.where(~off.pr_asserts))  # no bucket at all: the PR's assertion fires
    fig, axes = plots.figure(ncols=3, width=13.5, height=3.6)
    axes = np.ravel(axes)
    for ax, col, title in [(axes[0], "n_pr", "buckets kept: PR filter"),
                           (axes[1], "n_round_up", "buckets kept: rounded up"),
                           (axes[2], "pad_frac_pr", "padding overhead: PR filter\n(token counts ≤ largest bucket)")]:
        grid = off.pivot(index="attn_cp", columns="attn_tp", values=col).astype(float)
        ax.imshow(grid.values, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(grid.shape[1]), grid.columns)
        ax.set_yticks(range(grid.shape[0]), grid.index)
        ax.set_xlabel("attention TP")
        ax.set_ylabel("attention CP")
        ax.set_title(title)
        ax.grid(False)
        for (i, j), v in np.ndenumerate(grid.values):
            txt = "assert" if np.isnan(v) else (f"{v:.0%}" if col.startswith("pad") else f"{v:.0f}")
            ax.text(j, i, txt, ha="center", va="center", fontsize=7, color="red" if np.isnan(v) else "white")
    plots.caption(fig, None, f"default list of {n_default} sizes up to {max_tokens}; two-batch overlap off; "
                             f"padding = padded / real tokens, token counts 1..{max_tokens} equally likely")
    return fig


# --------------------------------------------------------------------------------------------------------------
# the profiler picture
# --------------------------------------------------------------------------------------------------------------
def _window_limit(cr, rank: int) -> int:
    """The largest size drawn: the first accepted size above the largest refused one (8 at W=2, 16 at W=4)."""
    before = cr[(cr["rank"] == rank) & (cr.variant == "before") & (cr.stage == "capture")]
    refused = before.loc[before.refused, "size"]
    if not len(refused):
        return int(before["size"].nsmallest(6).max()) if len(before) else 0
    above = before.loc[~before.refused & (before["size"] > refused.max()), "size"]
    return int(above.min()) if len(above) else int(refused.max())


def tail_window(events, rank: int = 0, up_to: int | None = None) -> dict:
    """One rank's capture ranges of sizes <= ``up_to`` (default: :func:`_window_limit`), per variant, ready for
    :func:`sglab.core.plots.timeline`: host ranges named by their size, refused sizes' ranges left out (the
    figure marks them), device-side copies of the ranges dropped and all CUDA streams on one ``device`` lane;
    times re-zeroed per variant."""
    cr = capture_ranges(events)
    up_to = _window_limit(cr, rank) if up_to is None else up_to
    out = {}
    for variant in ("before", "after"):
        rs = cr[(cr["rank"] == rank) & (cr.variant == variant) & (cr.stage == "capture") & (cr["size"] <= up_to)]
        if not len(rs):
            continue
        t0, t1 = rs.start_us.min(), (rs.start_us + rs.dur_us).max()
        ev = events[(events["rank"] == rank) & (events.variant == variant) & (events.start_us >= t0)
                    & (events.start_us <= t1)].copy()
        device = ev.lane.str.startswith("stream") | (ev.lane == "device")
        ev = ev[~(device & (ev.category == "range"))]
        ev.loc[device, "lane"] = "device"
        refused = {f"phase::{k} {n}" for n in rs.loc[rs.refused, "size"] for k in ("capture", "refused")}
        marks = ev[ev.name.isin({f"phase::refused {n}" for n in rs.loc[rs.refused, "size"]})]
        ev = ev[~ev.name.isin(refused)]
        ev["name"] = ev.name.str.replace(r"^phase::capture ", "phase::", regex=True)
        ev = ev.assign(start_us=ev.start_us - t0)
        out[f"{variant} · rank {rank}"] = (ev, marks.assign(start_us=marks.start_us - t0))
    return out


def capture_timeline(events, rank: int = 0, up_to: int | None = None, run=None):
    """Before and after swim-lanes of one rank's small capture sizes (where the refusals are): each size's range
    on the host (labelled by its size), the collective calls and NCCL kernels highlighted, and a red ✗ where a
    size was refused (the error caught before any collective)."""
    from sglab.core import plots as tl

    windows = tail_window(events, rank, up_to)
    fig = tl.timeline({k: ev for k, (ev, _) in windows.items()}, highlight=r"c10d::|nccl",
                      highlight_label="collective (host call / NCCL kernel)",
                      categories=("kernel", "runtime", "range", "op"),
                      title=f"capture loop, small sizes, rank {rank}: before (raw list) vs after (PR filter)")
    ax = fig.axes[0]
    rows = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    for name, (_, marks) in windows.items():
        y = rows.get(f"{name} · host")
        if y is None or not len(marks):
            continue
        ax.scatter(marks.start_us, [y] * len(marks), marker="x", color=plots.PALETTE["before"], s=60, zorder=5)
        for r in marks.itertuples():
            ax.annotate(r.name.replace("phase::", ""), (r.start_us, y), textcoords="offset points",
                        xytext=(0, -16), ha="center", fontsize=7, color=plots.PALETTE["before"])
    if run is not None:
        plots.caption(fig, run, "traced pass, separate from the measured one; range labels: capture size")
    return fig
