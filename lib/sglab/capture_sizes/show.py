"""Tables and figures of notebook 06: a run's tables (per variant and size, per traced capture
range), the rebuild's CPU tables, the figures, and the real engine's section (``VIEW``); your own
setup is in :mod:`.server_args`."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from typing import Sequence

import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from sglab.capture_sizes import rebuild as fx
from sglab.capture_sizes import sglang
from sglab.capture_sizes.measure import VARIANTS
from sglab.capture_sizes.server_args import your_setup  # noqa: F401 (the notebook's control)
from sglab.core import engine_records, engine_stats, engine_view, notebook, plots, runs, text
from sglab.sglang.releases import parse_version


# -- tables of a run -------------------------------------------------------------------------------
def first_of(sizes: Sequence[int], head: int = 6) -> str:
    """The first ``head`` sizes; where more follow, ``…`` and how many there are in all."""
    shown = ", ".join(map(str, sizes[:head]))
    return shown + (f", …, {len(sizes)} in all" if len(sizes) > head else "")


def summary(df):
    """Per variant and world size: sizes, captured, failed, not reached, replayed, worst error."""
    out = []
    for (variant, w), g in df.groupby(["variant", "world_size"], sort=False):
        n = Counter(g.groupby("metric").value.sum().astype(int).to_dict())
        failed = g[g.metric == "failed"]
        first = failed.iloc[0] if len(failed) else {}
        stage, errs = first.get("stage", ""), g.value[g.metric == "replay_max_abs_err"]
        bad = [int(x) for x in failed["size"]]
        out.append(
            dict(variant=variant, world_size=int(w), sizes=int(
                g["size"].nunique()), captured_or_ok=n["captured"] + n["ok"], failed=len(bad),
                 failed_sizes=bad, first_failure=bad[0] if bad else None,
                 failed_at="" if pd.isna(stage) else str(stage), not_reached=n["not_reached"],
                 replayed_ok=n["replay_ok"], replay_checks=n["replay_checks"],
                 worst_replay_err=float(errs.max()) if len(errs) else None, error=first.get(
                     "error", "")))
    out = pd.DataFrame(out)
    if len(out):
        rank = {v: i for i, v in enumerate(VARIANTS)}
        out = out.sort_values(["world_size", "variant"], kind="stable", key=lambda c: c.map(rank)
                              if c.name == "variant" else c)
        out = out.reset_index(drop=True).astype({"first_failure": "Int64"})
    return out


def summary_view(df) -> pd.DataFrame:
    """:func:`summary` for reading: no error text, blanks where there is nothing."""
    view = text.blank(summary(df).drop(columns=["error"], errors="ignore"))
    if "failed_sizes" in view:  # no size failed: a blank, not "[]"
        view["failed_sizes"] = [v if len(v) else "" for v in view["failed_sizes"]]
    return view


def run_facts(run) -> dict:
    """One run's facts: world size, the sizes refused, where the raw loop stopped, each list's."""
    return run.memo("run_facts", lambda: _run_facts(run))


def _run_facts(run) -> dict:
    s = summary(run.df).set_index("variant")
    before, probe = s.loc["before"], s.loc["before_probe"]
    facts = dict(
        world_size=int(run.manifest.params["world_size"]), raw_sizes=int(before.sizes),
        before_captured=int(before.captured_or_ok),
        before_stopped_at=None if pd.isna(before.first_failure) else int(before.first_failure),
        before_stage=before.failed_at, refused_sizes=list(probe.failed_sizes),
        refused_error=probe.error)
    for v in ("pr_filter", "round_up"):
        r = s.loc[v]
        facts.update({
            f"{v}_buckets": int(r.sizes), f"{v}_captured": int(r.captured_or_ok),
            f"{v}_replayed_ok": int(r.replayed_ok), f"{v}_replays": int(r.replay_checks),
            f"{v}_max_abs_err": float(r.worst_replay_err)
        })
    return facts


_SIZE_RANGE = re.compile(r"^phase::(warmup|capture|refused) (\d+)$")
RANGE_COLUMNS = ("rank", "variant", "stage", "size", "refused", "reduce_scatters", "all_gathers",
                 "nccl_kernels", "kernels", "start_us", "dur_us")


def capture_ranges(events):
    """Per traced ``warmup n`` / ``capture n`` range: refused or not, collectives, kernels."""
    if events is None or not len(events):
        return pd.DataFrame(columns=list(RANGE_COLUMNS))
    host = ~(events.lane.str.startswith("stream") | (events.lane == "device"))
    rows = []
    for (rank, variant), ev in events.groupby(["rank", "variant"], sort=True):
        h = host.loc[ev.index].to_numpy()
        start, end = ev.start_us.to_numpy(), (ev.start_us + ev.dur_us).to_numpy()
        parsed = ev.name.map(lambda s: _SIZE_RANGE.match(s))
        is_range = (ev.category == "range").to_numpy() & h & parsed.notna().to_numpy()
        kind = np.array([m.group(1) if m else "" for m in parsed])
        ops, kern = (ev.category == "op").to_numpy() & h, (ev.category == "kernel").to_numpy()
        rs = ops & ev.name.str.contains("reduce_scatter").to_numpy()
        ag = ops & ev.name.str.contains("allgather|all_gather").to_numpy()
        nccl = kern & ev.name.str.contains("nccl", case=False).to_numpy()
        for i in np.flatnonzero(is_range & (kind != "refused")):
            inside = (start >= start[i]) & (start <= end[i])
            refused = bool((inside & is_range & (kind == "refused")).any())
            counts = [int((inside & x).sum()) for x in (rs, ag, nccl, kern)]
            size, dur = int(parsed.iloc[i].group(2)), float(end[i] - start[i])
            rows.append((int(rank), variant, kind[i], size, refused, *counts, float(start[i]), dur))
    out = pd.DataFrame(rows, columns=list(RANGE_COLUMNS))
    return out.sort_values(["rank", "variant", "start_us"]).reset_index(drop=True)


def trace_summary(events):
    """Per rank, variant and kind of range: how many, their collectives and kernels (min–max)."""
    cr = capture_ranges(events)
    if not len(cr):
        return cr
    cr = cr.assign(kind=cr.stage.where(~cr.refused, cr.stage + " (refused)"))
    g = cr.groupby(["rank", "variant", "kind"], sort=True)
    out = g.size().rename("ranges").to_frame()
    for col in ("reduce_scatters", "all_gathers", "nccl_kernels", "kernels"):
        out[col] = g[col].agg(text.count)
    return out.reset_index()


# -- CPU tables of the rebuild ---------------------------------------------------------------------
def padding_waste(buckets: Sequence[int], max_tokens: int) -> dict:
    """Token counts 1..``max_tokens`` on ``buckets``: covered, eager, pad tokens and fraction."""
    bs, t = np.sort(buckets), np.arange(1, max_tokens + 1)
    i = np.searchsorted(bs, t)  # each count's smallest bucket at or above it
    t = t[i < len(bs)]  # the counts a bucket covers (a prefix: i only grows)
    real_, pad = int(t.sum()), int((bs[i[:len(t)]] - t).sum())
    return dict(covered=len(t), eager=max_tokens - len(t), pad_tokens=pad,
                pad_frac=pad / real_ if real_ else float("nan"))


def alignment_table(max_tokens: int = 2048):
    """Per attention TP 1-8 x CP 1-4 x overlap: each policy's bases, buckets and padding."""
    default, out = fx.default_piecewise_capture_sizes(max_tokens), []
    for tp, cp, tbo in itertools.product(range(1, 9), range(1, 5), (False, True)):
        pr, lcm = fx.piecewise_mul_base(tp, cp), fx.lcm_base(tp, cp)
        dec = fx.decode_mul_base(tp, cp, two_batch_overlap=tbo)
        kept = [n for n in default if n % pr == 0]
        rounded = fx.today_capture_sizes(default, tp, cp, two_batch_overlap=tbo)
        w_pr = padding_waste(kept, max_tokens) if kept else {"pad_frac": None, "eager": max_tokens}
        w_rd = padding_waste(rounded, max_tokens)
        out.append(
            dict(attn_tp=tp, attn_cp=cp, two_batch_overlap=tbo, mul_base_pr=pr, mul_base_decode=dec,
                 lcm=lcm, tp_x_cp=tp * cp, n_default=len(default), n_pr=len(kept),
                 n_decode_style=sum(n % dec == 0 for n in default), n_lcm=sum(
                     n % lcm == 0 for n in default), n_round_up=len(rounded),
                 lost_pr=len(default) - len(kept), lost_round_up=len(default) - len(rounded),
                 pr_below_decode_base=sum(n % dec != 0 for n in kept), pad_frac_pr=w_pr["pad_frac"],
                 pad_frac_round_up=w_rd["pad_frac"], eager_pr=w_pr["eager"],
                 eager_round_up=w_rd["eager"], pr_asserts=not kept))
    return pd.DataFrame(out)


# -- figures ---------------------------------------------------------------------------------------
_SHARD_COLORS = {"equal": "#aed6f1", "more": "#e6b0aa", "fewer": "#fadbd8"}


def mechanism(attn_tp: int = 8, max_tokens: int = 2048, sizes: Sequence[int] | None = None):
    """Each capture size's shard per attention-TP rank, and what the filter and rounding up do."""
    sizes = list(sizes) if sizes is not None else fx.default_piecewise_capture_sizes(max_tokens)
    lists = fx.policy_lists(sizes, attn_tp)
    bad = [i for i, n in enumerate(sizes[:12]) if n % attn_tp]
    cols = sizes[:min(len(sizes), (bad[-1] + 2) if bad else 4, 12)]
    rest = sizes[len(cols):]
    cw, x0, rh = 0.98, 1.7, 0.42
    width = x0 + cw * (len(cols) + (1.6 if rest else 0)) + 0.2
    height = rh * (attn_tp + 2) + 2.35
    fig, ax = plots.canvas(min(13.0, 1.0 + width * 0.95), 1.2 + height * 0.62, xlim=(0, width),
                           ylim=(0, height))
    top = height - 1.05
    yb = top - rh * attn_tp
    for j, n in enumerate(cols):  # a column per size: its shards, the filter, the round-up
        x, refused = x0 + j * cw, n % attn_tp != 0
        ax.text(x + 0.44, top + 0.12, str(n), ha="center", va="bottom", fontsize=9,
                fontweight="bold",
                color=plots.PALETTE["before"] if refused else plots.PALETTE["neutral"])
        if refused:
            ax.text(x + 0.44, top + 0.42, "✗ refused", ha="center", va="bottom", fontsize=7,
                    color=plots.PALETTE["before"])
        shards = fx.shard_sizes(n, attn_tp)
        for i, s in enumerate(shards):
            color = "equal" if not refused else ("more" if s > min(shards) else "fewer")
            plots.box(ax, x, top - rh * (i + 1) + 0.04, 0.88, rh - 0.08, str(s),
                      color=_SHARD_COLORS[color], fontsize=7.5)
        kept = n in lists["pr_filter"]
        plots.box(ax, x, yb - 0.45 - rh / 2 + 0.04, 0.88, rh - 0.08,
                  str(n) if kept else "dropped", color="kept" if kept else "neutral", fontsize=7)
        up = fx.ceil_align(n, attn_tp)
        said = str(up) if up == n else f"→ {up}" + (", merged" if up in sizes else "")
        plots.box(ax, x, yb - 0.45 - rh * 1.5, 0.88, rh - 0.08, said,
                  color="kept" if up == n else "accent", fontsize=7)
    for i in range(attn_tp):
        plots.label(ax, 0.05, top - rh * (i + 0.5), f"rank {i}", fontsize=8, weight="normal")
    plots.label(ax, 0.05, yb - 0.45, "PR filter", fontsize=8)
    plots.label(ax, 0.05, yb - 0.45 - rh - 0.04, f"round up (×{attn_tp})", fontsize=8)
    if rest:  # the sizes past the columns, summed up in one column
        x, refused = x0 + len(cols) * cw + 0.1, [n for n in rest if n % attn_tp]
        kept = [n for n in rest if n in lists["pr_filter"]]
        plots.box(
            ax, x, yb + 0.04, 1.3, top - yb - 0.08,
            f"{rest[0]} … {rest[-1]}\n{len(rest)} more sizes\n"
            + (f"{len(refused)} refused" if refused else "all split equally"),
            color="removed" if refused else _SHARD_COLORS["equal"], fontsize=7.5)
        plots.box(ax, x, yb - 0.45 - rh / 2 + 0.04, 1.3, rh - 0.08, f"{len(kept)} kept",
                  color="kept", fontsize=7)
        moved = [n for n in rest if n not in lists["round_up"]]
        plots.box(ax, x, yb - 0.45 - rh * 1.5, 1.3, rh - 0.08,
                  f"{len(moved)} rounded up" if moved else "unchanged",
                  color="accent" if moved else "kept", fontsize=7)
    dropped = [n for n in sizes if n not in lists["pr_filter"]]
    moved = [n for n in sizes if n not in lists["round_up"]]
    merged = [n for n in moved if fx.ceil_align(n, attn_tp) in sizes]
    ax.text(
        0.05, height - 0.12, f"{len(sizes)} capture sizes split over attention TP {attn_tp} "
        "(tensor_split: the first n % TP ranks get one row more)", fontsize=10, fontweight="bold",
        va="top", color=plots.PALETTE["neutral"])
    drops = ", ".join(map(str, dropped[:8])) + (" …" if len(dropped) > 8 else "")
    note = (f"PR filter keeps {len(lists['pr_filter'])} of {len(sizes)}"
            + (f" (drops {drops})" if dropped else "")
            + f"; rounding up gives {len(lists['round_up'])} buckets"
            + (f" ({len(merged)} of the {len(moved)} rounded sizes land on a size already in the "
               "list)" if moved else ""))
    ax.text(0.05, 0.42, note, fontsize=8, va="bottom", color="#555555")
    legend = [
        Patch(facecolor=_SHARD_COLORS[k], edgecolor="#566573", label=text)
        for k, text in (("equal", "rows per rank, equal shards"), ("more", "unequal: one row more"),
                        ("fewer", "unequal: one row fewer"))
    ]
    ax.legend(handles=legend, loc="lower left", ncol=3, fontsize=7.5, bbox_to_anchor=(0.0, -0.03))
    return fig


STATUS_COLORS = {
    "captured + replayed": plots.PALETTE["after"], "captured": plots.PALETTE["graph"],
    "ok (eager)": plots.PALETTE["eager"], "failed": plots.PALETTE["before"],
    "not reached": "#d5d8dc"
}


def size_status_plot(run):
    """A dot per (variant, size), coloured by its first metric that holds; failed sizes labelled."""
    said = dict(failed="failed", not_reached="not reached", replay_ok="captured + replayed",
                captured="captured", ok="ok (eager)")
    held = run.df.groupby(["variant", "size", "metric"]).value.last().unstack()
    held = held.reindex(columns=list(said)).fillna(0).astype(bool)
    status = held.idxmax(axis=1).map(said).where(held.any(axis=1), "?")
    st = status.rename("status").reset_index().astype({"size": int})
    fig, ax = plots.figure(width=10, height=2.8)
    for y, v in enumerate(VARIANTS):
        sub = st[st.variant == v]
        for status, color in STATUS_COLORS.items():
            pts = sub[sub.status == status]
            if len(pts):
                ax.scatter(pts["size"], [y] * len(pts), color=color, s=28, label=status)
        for n in sub[sub.status == "failed"]["size"]:
            ax.annotate(str(n), (n, y), textcoords="offset points", xytext=(0, 6), ha="center",
                        fontsize=7, color=STATUS_COLORS["failed"])
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yticks(range(len(VARIANTS)), VARIANTS)
    ax.set_ylim(-0.5, len(VARIANTS) - 0.3)
    ax.set_xlabel("capture size (tokens, log scale)")
    w = run.manifest.params["world_size"]
    ax.set_title(f"capture sizes at attention TP {w}")
    plots.caption(fig, run, f"world size {w}")
    return fig


def alignment_heatmaps(table, max_tokens: int, n_default: int):
    """Buckets kept per (attention TP, CP) by each rule, and the PR filter's padding."""
    off = table[~table.two_batch_overlap]
    off = off.assign(n_pr=off.n_pr.where(~off.pr_asserts))  # no bucket: the assertion fires
    fig, axes = plots.figure(ncols=3, width=13.5, height=3.6)
    axes = np.ravel(axes)
    for ax, col, title in [(axes[0], "n_pr", "buckets kept: PR filter"),
                           (axes[1], "n_round_up", "buckets kept: rounded up"),
                           (axes[2], "pad_frac_pr",
                            "padding overhead: PR filter\n(token counts ≤ largest bucket)")]:
        grid = off.pivot(index="attn_cp", columns="attn_tp", values=col).astype(float)
        ax.imshow(grid.values, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(grid.shape[1]), grid.columns)
        ax.set_yticks(range(grid.shape[0]), grid.index)
        ax.set(xlabel="attention TP", ylabel="attention CP", title=title)
        ax.grid(False)
        for (i, j), v in np.ndenumerate(grid.values):
            txt = "assert" if np.isnan(v) else (f"{v:.0%}" if col.startswith("pad") else f"{v:.0f}")
            ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                    color="red" if np.isnan(v) else "white")
    plots.caption(
        fig, None, f"default list of {n_default} sizes up to {max_tokens}; two-batch overlap off; "
        f"padding = padded / real tokens, token counts 1..{max_tokens} equally likely")
    return fig


def tail_window(events, rank: int = 0) -> dict:
    """Per variant, one rank's small capture ranges and refused marks (:func:`plots.timeline`)."""
    cr = capture_ranges(events)
    before = cr[(cr["rank"] == rank) & (cr.variant == "before") & (cr.stage == "capture")]
    refused = before.loc[before.refused, "size"]
    if len(refused):  # up to the first accepted size above the largest refused one
        above = before.loc[~before.refused & (before["size"] > refused.max()), "size"]
        up_to = int(above.min()) if len(above) else int(refused.max())
    else:
        up_to = int(before["size"].nsmallest(6).max()) if len(before) else 0
    out = {}
    for variant in ("before", "after"):
        rs = cr[(cr["rank"] == rank) & (cr.variant == variant) & (cr.stage == "capture")
                & (cr["size"] <= up_to)]
        if not len(rs):
            continue
        t0, t1 = rs.start_us.min(), (rs.start_us + rs.dur_us).max()
        ev = events[(events["rank"] == rank) & (events.variant == variant)
                    & (events.start_us >= t0) & (events.start_us <= t1)].copy()
        device = ev.lane.str.startswith("stream") | (ev.lane == "device")
        ev = ev[~(device & (ev.category == "range"))]
        ev.loc[device, "lane"] = "device"
        bad = rs.loc[rs.refused, "size"]
        marks = ev[ev.name.isin({f"phase::refused {n}" for n in bad})]
        ev = ev[~ev.name.isin({f"phase::{k} {n}" for n in bad for k in ("capture", "refused")})]
        ev["name"] = ev.name.str.replace(r"^phase::capture ", "phase::", regex=True)
        out[f"{variant} · rank {rank}"] = (ev.assign(start_us=ev.start_us - t0),
                                           marks.assign(start_us=marks.start_us - t0))
    return out


def capture_timeline(events, rank: int = 0, run=None):
    """Before and after swim-lanes of one rank's small capture sizes, refusals marked."""
    windows = tail_window(events, rank)
    fig = plots.timeline({k: ev
                          for k, (ev, _) in windows.items()}, highlight=r"c10d::|nccl",
                         highlight_label="collective (host call / NCCL kernel)",
                         categories=("kernel", "runtime", "range", "op"),
                         title=f"capture loop, small sizes, rank {rank}: before (raw list) vs "
                         "after (PR filter)")
    ax = fig.axes[0]
    rows = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    for name, (_, marks) in windows.items():
        y = rows.get(f"{name} · host")
        if y is None or not len(marks):
            continue
        ax.scatter(marks.start_us, [y] * len(marks), marker="x", color=plots.PALETTE["before"],
                   s=60, zorder=5)
        for r in marks.itertuples():
            ax.annotate(r.name.replace("phase::", ""), (r.start_us, y), textcoords="offset points",
                        xytext=(0, -16), ha="center", fontsize=7, color=plots.PALETTE["before"])
    if run is not None:
        plots.caption(fig, run, "traced pass, separate from the measured one; range labels: "
                      "capture size")
    return fig


# -- the GPU sections of the notebook (its appendix), each shown from the runs or their NoRun line
@notebook.needs_run
def measured(rs) -> None:
    """Per run shown: its summary, the status of each size, and before vs after in words."""
    for r in rs.shown:
        print(f"\n— {r.label} (world size {r.manifest.params['world_size']}) —")
        notebook.show_table(summary_view(r.df))
        notebook.show_figure(size_status_plot(r))
        f = run_facts(r)  # the collective's own words, and whether the two fixed lists differ
        raw = sorted(r.df.loc[r.df.variant == "before", "size"].astype(int).unique())
        lists = fx.policy_lists(raw, f["world_size"])
        print(f"without the shard check the collective refused {f['refused_sizes']}: "
              f"{f['refused_error'][:110]}")
        if lists["pr_filter"] == lists["round_up"]:
            print("the PR's list and the rounded-up list are identical here (every dropped size "
                  "rounds onto a bucket already in the list): this run shows that both work, not "
                  "which is better")


@notebook.needs_run
def profiler(rs) -> None:
    """Per run shown: the traced capture loop's small sizes, its collectives, the Perfetto link."""
    for r in rs.shown:
        if notebook.predates_traces(r, where=f" on {r.manifest.params['world_size']} GPUs"):
            continue
        events = r.sidecar("events")
        notebook.show_figure(capture_timeline(events, rank=0, run=r))
        notebook.show_table(trace_summary(events))
        if r.sidecar("trace") is not None:
            notebook.file_link(r.sidecar("trace"), "Perfetto trace of rank 0 (ui.perfetto.dev)")


# -- the real engine at each recorded TP size (data/recorded/engine_capture_sizes/) ----------------
# SGLang's own words for a reduce-scatter handed a size that does not split evenly over the ranks
UNEQUAL = re.compile(r"same size|world size|divisib|unequal|shard|multiple of", re.I)
RULE = dict(before="no filter (before #23972, or lost)", pr_filter="#23972's filter",
            today="rounded up")


def engine_facts(run) -> list[dict]:
    """Per variant of one engine run: its rule, the sizes asked for, its status, those captured."""
    df = engine_records.frame([run])
    status, tokens = engine_stats.texts(df, "status"), engine_stats.texts(df, "pcg_tokens")
    out, seen = [], set()
    for e in run.manifest.engine_runs:
        key = next((k for k in status if k[1] == e["release"] and k[2] == e["case"]), None)
        # a variant the harness cut off (timeout) gave no answer of SGLang's: not a fact
        if key is None or key in seen or str(status[key]).startswith("timeout"):
            continue
        seen.add(key)
        asked = flag_list(e["server_args"],
                          ("--piecewise-cuda-graph-tokens", "--cuda-graph-bs-prefill"))
        if not asked:  # no size flag: the release's default list, as its ServerArgs resolved it
            res = e.get("resolved") or {}
            asked = list(
                res.get("piecewise_cuda_graph_tokens") or fx.default_piecewise_capture_sizes(
                    res.get("piecewise_cuda_graph_max_tokens") or fx.MLA_MAX_TOKENS))
        got = tokens.get(key)
        out.append(
            dict(release=e["release"], case=e["case"], rule=sglang.VARIANT.get(e["release"]),
                 asked=asked, attn_tp=e["tp"], status=str(status[key]),
                 captured=sorted(int(x) for x in str(got).split()) if got else None))
    return sorted(out, key=lambda f: (f["attn_tp"], parse_version(f["release"])))


def flag_list(argv, names) -> list[int]:
    """The integers after the first of ``names`` in ``argv``, up to the next flag."""
    argv = list(argv)
    i = next((i for i, a in enumerate(argv) if a in names), len(argv))
    return [int(v) for v in itertools.takewhile(lambda v: not v.startswith("--"), argv[i + 1:])]


def _words(sizes) -> str:
    return " ".join(map(str, sizes or []))


def first_line(fact: dict) -> str:
    """SGLang's own first error line of a variant that stopped (its status, without the log)."""
    return fact["status"].removeprefix("error: ").split(" (log:")[0]


def engine_table(run) -> pd.DataFrame:
    """Per release and attention-TP size: the rule, sizes asked, the engine, the rebuild's list."""
    rows = []
    for f in engine_facts(run):
        rule = {"today": "round_up"}.get(f["rule"], f["rule"])  # the rebuild's rule of its release
        keeps = fx.policy_lists(f["asked"], f["attn_tp"]).get(rule, f["asked"])
        said = RULE.get(f["rule"], str(f["rule"]))
        rows.append({
            "release": f["release"], "rule (read from its source)": said,
            "attention TP": f["attn_tp"], "asked": _words(f["asked"]),
            "engine": "started" if f["status"] == "ok" else "stopped at start-up: " + first_line(f),
            "captured": _words(f["captured"]) or "-", "rebuild keeps": _words(keeps)
        })
    return pd.DataFrame(rows).set_index("release") if rows else pd.DataFrame()


def _engine_extra(rs) -> None:
    with pd.option_context("display.max_colwidth", None):
        notebook.show_table(engine_table(engine_records.merged(rs.shown)))


VIEW = engine_view.EngineView(what="DeepSeek-V3-style 2 layers, --moe-dense-tp-size 1",
                              extra=_engine_extra)


def beside_rows(run, engine_run) -> list[dict]:
    """The capture sizes as the rebuild's NCCL runs and SGLang's engine see them."""
    rows = engine_view.missing_rows(run, engine_run)
    if run:
        two = [r for r in run.shown if int(r.manifest.params["world_size"]) == 2] or [run.first]
        rows.append({
            "source": f"rebuild ({runs.gpu_short(two[0].manifest)} ×2, NCCL)",
            "measures": "sizes the reduce-scatter refuses without the filter, on the default list "
            "scaled by W/8",
            "figure": ", ".join(map(str, sorted(run_facts(two[0])["refused_sizes"]))) or "none"
        })
    if engine_run:
        for f in engine_facts(engine_records.merged(engine_run.shown)):
            asked = _words(f["asked"])
            if f["rule"] == "before":
                fig, what = first_line(f), f"start-up with sizes {asked}: the PR's failure"
            else:
                fig = "captured " + _words(f["captured"])
                keep = _words(fx.filter_piecewise_capture_sizes(f["asked"], f["attn_tp"]))
                what = (f"start-up with sizes {asked}: the sizes it captures (the rebuild's filter "
                        f"keeps {keep})")
            rows.append(
                dict(source=f"SGLang {f['release']} engine (TP {f['attn_tp']})", measures=what,
                     figure=fig))
    return rows
