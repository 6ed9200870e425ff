"""Every figure of notebook 03: the slide's picture of one capture (segments and breaks, before vs after), latency
and speed-up per request count, the profiler timeline of a 3-request prefill."""

from __future__ import annotations

from sglab.core import plots
from sglab.core import plots as dg
from sglab.core import plots as tl
from sglab.experiments.breakable_graph import analysis as an
from sglab.experiments.breakable_graph.structure import Structure

STYLES = {"eager": ("tab:gray", "o"), "before": ("tab:red", "s"), "after": ("tab:blue", "^")}
EDGE = 2  # segments drawn at each end of a row; the middle is summarised


def _row_items(s: Structure) -> list[tuple[str, str, str]]:
    """(kind, text, colour) left to right: segments and breaks, the middle collapsed into one gap."""
    labels, full = s.labels(), []
    for i, label in enumerate(labels):
        full.append(("segment", f"graph {i}\n" + label.replace(" | ", "\n"),
                     "before" if "logits tail" in label else "after"))
        if i < len(s.breaks):
            layer = s.breaks[i].split("layers.")[-1].split(".")[0] if "layers." in s.breaks[i] else "?"
            full.append(("break", f"attn\nL{layer}\neager", "neutral"))
    head, tail = 2 * EDGE, 2 * EDGE - 1
    if len(full) <= head + tail + 1:
        return full
    hidden = full[head:-tail]
    n_seg = sum(k == "segment" for k, _, _ in hidden)
    gap = ("gap", f"… {n_seg} more segments\nand {len(hidden) - n_seg} breaks …", "none")
    return full[:head] + [gap] + full[-tail:]


def _draw_row(ax, y: float, s: Structure) -> float:
    x = 0.1
    widths = {"segment": 1.55, "break": 0.55, "gap": 1.6}
    for kind, text, color in _row_items(s):
        w = widths[kind]
        if kind == "gap":
            ax.text(x + w / 2, y + 0.4, text, ha="center", va="center", fontsize=7.5, color="#555555")
        else:
            dg.box(ax, x, y, w, 0.8, text, color=color, fontsize=6.8)
        x += w + 0.08
    return x


def mechanism(before: Structure, after: Structure, bs3: dict | None = None):
    """One captured forward as graph segments and eager breaks: before #24662 (whole forward, logits tail inside
    the last segment, captured for one request) and after (layer stack only, the tail eager)."""
    fig, ax = dg.canvas(12.5, 4.3, xlim=(0, 12.5), ylim=(0, 4.3))
    rows = ((before, 2.55, "before #24662: capture model.forward (bs=1)"),
            (after, 0.75, "after #24662: capture layer_model.forward"))
    for s, y, title in rows:
        dg.label(ax, 0.1, y + 1.15, f"{title} — {len(s.segments)} graph segments, {len(s.breaks)} eager breaks",
                 fontsize=9)
        x = _draw_row(ax, y, s)
        if s.boundary == "after":
            dg.arrow(ax, (x - 0.05, y + 0.4), (x + 0.3, y + 0.4))
            dg.box(ax, x + 0.32, y, 1.7, 0.8, "logits tail, eager:\nlast token of each\nrequest, lm_head", color="kept",
                   fontsize=6.8)
    if bs3:
        ax.text(0.1, 2.2, f"3-request batch: can_run = {bool(bs3.get('can_run_before'))} → runs eagerly "
                f"(replayed anyway: {bs3.get('before', '?')} logit row)", fontsize=8, color=plots.PALETTE["before"])
        ax.text(0.1, 0.4, f"3-request batch: can_run = {bool(bs3.get('can_run_after'))} → replays the segments, "
                f"{bs3.get('after', '?')} logit rows", fontsize=8, color=plots.PALETTE["after"])
    ax.text(0.1, 0.05, "Segments and breaks recorded from the runner's own capture path (model of the run's layer "
            "count); red: the segment that bakes in the one-request gather.", fontsize=7.5, color="#555555")
    return fig


def latency(run):
    """Per token count: latency of eager / before / after over request counts (median, p10–p90), and the speed-ups
    over eager."""
    lat = an.latency_table(run.df)
    token_counts = sorted(lat["num_tokens"].unique())
    fig, axes = plots.figure(ncols=len(token_counts) + 1, width=4.2 * (len(token_counts) + 1))
    axes = list(axes.ravel())
    for ax, n in zip(axes, token_counts):
        for variant, (color, marker) in STYLES.items():
            s = an.spread(run.df, variant)
            s = s[s["num_tokens"] == n]
            ax.errorbar(s["batch_size"], s["time_median"],
                        yerr=[s["time_median"] - s["time_p10"], s["time_p90"] - s["time_median"]],
                        color=color, marker=marker, capsize=2, label=variant)
        ax.set_title(f"{an.gpu_short(run.manifest)}: {n} tokens per prefill")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("prefill latency, ms (median, p10–p90)")
    axes[0].legend()
    ax = axes[-1]
    for n, g in lat.groupby("num_tokens"):
        line, = ax.plot(g["batch_size"], g["speedup_after"], marker="^", label=f"after, {n} tok")
        ax.plot(g["batch_size"], g["speedup_before"], marker="s", ls="--", color=line.get_color(), alpha=0.6,
                label=f"before, {n} tok")
    ax.axhline(1.0, color="#999999", lw=1)
    ax.set_title(f"{an.gpu_short(run.manifest)}: speedup over eager")
    ax.set_ylabel("eager / runner latency, × (medians)")
    ax.set_ylim(bottom=0)
    ax.legend(ncol=2, fontsize=7)
    for ax in axes:
        ax.set_xlabel("requests in the batch")
        ax.set_xticks(sorted(lat["batch_size"].unique()))
    plots.caption(fig, run, extra="before = graph only for 1 request, eager otherwise")
    return fig


def timeline(run):
    """The 3-request prefill in the profiler: before (rejected, every kernel launched eagerly) vs after (graph
    launches with eager attention between them)."""
    ev = run.sidecar("events")
    tables = {f"{v} (3 req)": tl.window(ev[ev.variant == v]) for v in ("before", "after") if (ev.variant == v).any()}
    fig = tl.timeline(tables, highlight="GraphLaunch", highlight_label="graph launch",
                      categories=("kernel", "memcpy", "memset", "runtime"),
                      title=f"One 3-request prefill of {int(run.manifest['params']['launch_token_count'])} tokens "
                            f"({an.gpu_short(run)})")
    plots.caption(fig, run, extra="torch.profiler; each runner from its own first event")
    return fig


def slide_picture(run=None):
    """The slide's picture for ``run`` (its layer count and its 3-request outcome), or for the default parameters
    and the CPU rebuild when there is no run."""
    from sglab.experiments.breakable_graph.run import DEFAULT_PARAMS
    from sglab.experiments.breakable_graph.structure import capture_structure

    params = (run.manifest.get("params") or {}) if run is not None else {}
    layers = int(params.get("num_layers", DEFAULT_PARAMS["num_layers"]))
    if run is not None:
        a = an.bs3_table(run.df)
        bs3 = {"before": int(a.loc["before", "logit_rows"]), "after": int(a.loc["after", "logit_rows"]),
               "can_run_before": int(a.loc["before", "can_run"]), "can_run_after": int(a.loc["after", "can_run"])}
    else:
        from sglab.experiments.breakable_graph.routing import three_requests

        t = three_requests()
        bs3 = {"before": t.loc["before graph, replayed anyway", "logits shape"][0],
               "after": t.loc["after graph", "logits shape"][0],
               "can_run_before": int(t.loc["before graph, replayed anyway", "can_run"]),
               "can_run_after": int(t.loc["after graph", "can_run"])}
    return mechanism(capture_structure("before", layers), capture_structure("after", layers), bs3)
