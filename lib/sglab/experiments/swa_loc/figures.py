"""Every figure of notebook 04, drawn from the rebuild (CPU) or from a run (recorded or live).

- :func:`mechanism` -- the slide: the ops of one SWA layer's KV write inside the decode graph, before and after
  the preset, from the rebuild itself, with the run's kernel names under them where the run has them;
- :func:`kernels_per_replay`, :func:`replay_times` -- the sweep;
- :func:`replay_timeline` -- one traced replay before and after, the translation's kernels highlighted.
"""

from __future__ import annotations

import difflib
from typing import Optional

from sglab.core import plots
from sglab.fixes import swa_loc as fx
from sglab.core import plots as diagram
from sglab.experiments.swa_loc import HEADLINE_CONFIG, analysis

COLORS = {"before": plots.PALETTE["before"], "pr23552": plots.PALETTE["accent"], "pr24743": plots.PALETTE["after"]}
STYLES = ["-", "--", ":", "-."]
_OP_TEXT = {"index": "gather\nfull_to_swa[loc]", "_to_copy->int32": "cast\nto int32", "_to_copy->int64":
            "cast\nto int64", "index_put_": "store\n{kv}"}


# ---------------------------------------------------------------------------------------------------------------
# the slide picture
# ---------------------------------------------------------------------------------------------------------------
def one_layer_ops(variant: str) -> list:
    """The op names of the first SWA layer's KV write in ``variant``'s captured step (rebuild, CPU)."""
    from sglab.experiments.swa_loc.profile import SWA_WRITE, kv_write_ops

    calls = [c for c in kv_write_ops(variant) if c.scope == SWA_WRITE]
    ends = [i for i, c in enumerate(calls) if i > 0 and c.step == 0]
    return [c.op for c in calls[: ends[0] if ends else len(calls)]]


def _kernel_names(table, variant: str, n_ops: int) -> list:
    """Short kernel names of the SWA KV write's ops from a run's eager table, in op order (blank when absent)."""
    if table is None:
        return [""] * n_ops
    kw = analysis.kv_write_kernels(table, variant)
    names = {int(r.step): analysis.short_kernel(r.kernel) for r in kw.itertuples()}
    return [names.get(i, "") for i in range(n_ops)]


def _op_boxes(ops: list) -> list:
    stores = iter(["K", "V"] * len(ops))
    return [_OP_TEXT.get(op, op).format(kv=next(stores)) if op == "index_put_" else _OP_TEXT.get(op, op)
            for op in ops]


def mechanism(run=None, *, variants=("before", "pr24743")):
    """One SWA layer's KV write inside the decode graph, before and after: one box per kernel node, the ones the
    preset removes highlighted (found by aligning the two op sequences, not listed by hand). ``run``: a run whose
    ``eager_kernels`` sidecar names the CUDA kernel of each op (method 2), else the boxes show the ops only."""
    a, b = variants
    ops = {v: one_layer_ops(v) for v in variants}
    table = run.sidecar("eager_kernels") if run is not None else None
    kernels = {v: _kernel_names(table, v if v in ("before", "pr24743") else "pr24743", len(ops[v]))
               for v in variants}
    matcher = difflib.SequenceMatcher(a=ops[a], b=ops[b], autojunk=False)
    removed = {i for tag, i1, i2, _, _ in matcher.get_opcodes() if tag in ("delete", "replace")
               for i in range(i1, i2)}
    offset = {a: 0.0, b: float(len(ops[a]) - len(ops[b]))}  # right-align: the store stays under the store
    fig, ax = diagram.canvas(11.5, 3.6, xlim=(0, 11.5), ylim=(0, 3.6))
    w, gap, x0 = 1.25, 0.12, 3.0
    for row, (v, y) in enumerate(((a, 2.1), (b, 0.55))):
        color = "before" if row == 0 else "after"
        diagram.label(ax, 0.1, y + 0.42, f"{analysis.VARIANT_LABELS[v].split(' (')[0]}", color=plots.PALETTE[color])
        diagram.label(ax, 0.1, y + 0.05, _row_caption(v), fontsize=7.5, weight="normal")
        for i, (text, kname) in enumerate(zip(_op_boxes(ops[v]), kernels[v])):
            x = x0 + (i + offset[v]) * (w + gap)
            hit = row == 0 and i in removed
            diagram.box(ax, x, y, w, 0.85, text, color="removed" if hit else "kept", fontsize=8)
            if kname:
                ax.text(x + w / 2, y - 0.08, kname.replace(" · ", "\n"), ha="center", va="top", fontsize=5.5,
                        color="#555555")
    n_removed = len(removed)
    xs = [x0 + i * (w + gap) for i in sorted(removed)]
    if xs:
        ax.annotate("", xy=(xs[0], 3.12), xytext=(xs[-1] + w, 3.12),
                    arrowprops={"arrowstyle": "-", "color": plots.PALETTE["before"], "lw": 1.2})
        ax.text((xs[0] + xs[-1] + w) / 2, 3.18, f"translate_loc_from_full_to_swa: {n_removed} kernels, "
                "in every SWA layer of every replay", ha="center", va="bottom", fontsize=8,
                color=plots.PALETTE["before"])
    ax.set_title(f"One SWA layer's KV write inside the decode graph: {len(ops[a])} kernel nodes before, "
                 f"{len(ops[b])} with the preset", fontsize=10)
    return fig


def _row_caption(variant: str) -> str:
    cfg = fx.runner_config(variant)
    if not cfg.preset_swa_loc:
        return "swa_loc unset at capture:\nthe graph records the translation"
    dtype = str(cfg.swa_loc_dtype).replace("torch.", "")
    return f"swa_loc = out_cache_loc_swa[:bs]\n(static {dtype} buffer) set before capture"


# ---------------------------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------------------------
def kernels_per_replay(run, shown: list):
    """Kernel nodes per replay against the layer count, one panel per layout."""
    kt = analysis.kernel_table(run.df).reset_index()
    fig, axes = plots.figure(ncols=2)
    for ax, ratio in zip(axes.ravel(), sorted(kt.swa_per_full.unique(), reverse=True)):
        sub = kt[kt.swa_per_full == ratio]
        for v in fx.VARIANTS:
            ax.plot(sub.num_layers, sub[f"kernels {v}"], marker="o", label=analysis.VARIANT_LABELS[v],
                    color=COLORS[v])
        ax.set_title(f"{ratio} SWA : 1 full")
        ax.set_xlabel("layers")
        ax.set_ylabel("kernels per replay (graph kernel nodes)")
        ax.legend()
    counts = [analysis.kernel_counts(r.df)[0] for r in shown]
    same_gpu = len(shown) > 1 and all(c.equals(counts[0]) for c in counts)
    plots.caption(fig, run, extra="static count via cuda-bindings"
                  + ("; identical for every captured batch size" if kt["same for every batch size"].all()
                     else "; smallest batch size shown")
                  + ("; identical on " + " and ".join(analysis.short_gpu(r) for r in shown) if same_gpu else ""))
    return fig


def _time_panels(axes, r, style: str, gpu: str, h: dict) -> None:
    for ax, (xname, fixed) in zip(axes[:2], [("batch_size", ("swa_per_full", "num_layers")),
                                             ("num_layers", ("swa_per_full", "batch_size"))]):
        d = analysis.sweep_rows(r.df)
        d = d[d.metric.str.startswith("time_")].pivot_table(
            index=["swa_per_full", "num_layers", "batch_size", "variant"], columns="metric", values="value")
        sub = d.xs(tuple(h[k] for k in fixed), level=fixed).reset_index()
        for v in fx.VARIANTS:
            s = sub[sub.variant == v].sort_values(xname)
            err = [(s.time_median - s.time_p10) * 1e3, (s.time_p90 - s.time_median) * 1e3]
            ax.errorbar(s[xname], s.time_median * 1e3, yerr=err, marker="o", capsize=3, color=COLORS[v], ls=style,
                        label=f"{v} · {gpu}")
        ax.set_title(", ".join(f"{k.replace('_', ' ')} = {h[k]}" for k in fixed))
        ax.set_ylabel("replay time, µs (median, p10–p90)")


def replay_times(shown: list, h: Optional[dict] = None):
    """Replay time against batch size and layer count at the headline layout, and the µs saved per SWA layer."""
    from matplotlib.ticker import FixedLocator, ScalarFormatter

    h = h or HEADLINE_CONFIG
    fig, axes = plots.figure(ncols=3, width=16)
    axes = axes.ravel()
    for gi, r in enumerate(shown):
        gpu, style = analysis.short_gpu(r), STYLES[gi % len(STYLES)]
        _time_panels(axes, r, style, gpu, h)
        tab = analysis.time_table(r.df).reset_index()
        for ratio, marker in zip(sorted(tab.swa_per_full.unique(), reverse=True), "os^"):
            d = tab[(tab.swa_per_full == ratio) & (tab.num_layers == h["num_layers"])].sort_values("batch_size")
            axes[2].plot(d.batch_size, d["µs saved per SWA layer"], marker=marker, ls=style,
                         color=plots.CYCLE[(2 + 2 * gi) % len(plots.CYCLE)], label=f"{ratio}:1 · {gpu}")
    bss = sorted(int(b) for b in analysis.sweep_rows(shown[0].df).batch_size.unique() if b > 0)
    for ax in (axes[0], axes[2]):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(bss))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("batch size")
    axes[1].set_xlabel("layers")
    axes[2].set_ylim(bottom=0)
    axes[2].set_title(f"before − #24743, {h['num_layers']} layers")
    axes[2].set_ylabel("µs saved per SWA layer per replay")
    for ax in axes:
        ax.legend(fontsize=7, ncol=2 if ax is not axes[2] else 1)
    plots.caption(fig, shown[0], extra=" · ".join(plots.provenance_text(r) for r in shown[1:])
                  + ("; line style = GPU" if len(shown) > 1 else ""))
    return fig


# ---------------------------------------------------------------------------------------------------------------
# the profiler
# ---------------------------------------------------------------------------------------------------------------
NO_TRACE = ("this run predates profiler traces (method {mv}); a new recording adds them "
            "(`sglab record swa_loc` on one H100 / H200).")


def replay_timeline(run, variants=("before", "pr24743")):
    """``(figure, None)``: one traced replay per variant on one µs axis, the translation's kernels highlighted;
    ``(None, why)`` when the run has no trace."""
    from sglab.core import plots as timeline

    events, gk = run.sidecar("events"), run.sidecar("graph_kernels")
    if events is None or gk is None:
        return None, NO_TRACE.format(mv=run.manifest.get("method_version", "?"))
    pattern = analysis.name_pattern(analysis.translation_kernels(gk))
    device = events[events.lane.str.startswith("stream")]  # the replay itself: what one cudaGraphLaunch runs
    tables = {analysis.VARIANT_LABELS[v].split(" (")[0]: timeline.window(device[device.variant == v])
              for v in variants}
    tc = (run.manifest.get("params") or {}).get("trace_config", {})
    fig, ax = plots.figure(width=11, height=3.0)
    timeline.timeline(tables, highlight=pattern, highlight_label="translation (gather + int32 cast)",
                      categories=("kernel", "range"), ax=ax,
                      title=f"One decode-graph replay on the GPU, {tc.get('num_layers')} layers "
                            f"{tc.get('swa_per_full')}:1, bs {tc.get('batch_size')}")
    ax.get_legend().set_bbox_to_anchor((0.5, -0.3))
    plots.caption(fig, run, extra="torch.profiler, times under the profiler; host side in the Perfetto file")
    return fig, None
