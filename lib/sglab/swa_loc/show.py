"""Tables and figures of notebook 04, from the rebuild (CPU) or a run (recorded or live; a NoRun
says its one line): the tables the claims read, the mechanism, the figures, the real engine's."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from typing import Dict, Optional

import pandas as pd
from matplotlib.ticker import FixedLocator, ScalarFormatter

from sglab.core import notebook, plots, text
from sglab.core import engine_records, engine_stats, engine_view
from sglab.swa_loc import rebuild
from sglab.swa_loc.measure import HEADLINE_CONFIG, SWA_WRITE, kv_write_ops
from sglab.swa_loc.model_config import your_setup  # noqa: F401 (the notebook's last cell)


VARIANT_LABELS = dict(before="before (translate inside the graph)",
                      pr23552="#23552 (preset, int64 buffer)",
                      pr24743="#24743 (preset, int32, zeroed on pad)")
COLORS = dict(before=plots.PALETTE["before"], pr23552=plots.PALETTE["accent"],
              pr24743=plots.PALETTE["after"])
STYLES = ["-", "--", ":", "-."]
_CFG = ["swa_per_full", "num_layers", "n_swa_layers"]


# -- tables of a run -------------------------------------------------------------------------------
def variants_table() -> pd.DataFrame:
    """The three states of the one switch (:func:`rebuild.runner_config`), a missing setting "—"."""
    df = pd.DataFrame([{"variant": v, **vars(rebuild.runner_config(v))} for v in rebuild.VARIANTS
                       ]).set_index("variant")
    return df.astype(object).where(df.notna(), "—")


def sweep_rows(df):
    """The rows of the layout sweep (not those of the padding scenario)."""
    return df[df.num_layers.isin(df[df.metric == "graph_kernel_nodes"].num_layers.unique())
              & ~df.metric.str.startswith("pad_")]


def kernel_counts(df):
    """Per (layout, batch size): each variant's kernel nodes and profiled kernels per replay."""
    d = sweep_rows(df)
    idx = _CFG + ["batch_size"]
    return tuple(
        d[d.metric == m].pivot_table(index=idx, columns="variant", values="value").astype(int)
        for m in ("graph_kernel_nodes", "profiled_kernels"))


def extra_per_swa_layer(df):
    """Kernel nodes before minus #24743's, per SWA layer, for every (layout, batch size)."""
    nodes, _ = kernel_counts(df)
    return (nodes["before"] - nodes["pr24743"]) / nodes.index.get_level_values("n_swa_layers")


def kernel_table(df):
    """One row per layout: each variant's kernel nodes, the extra per SWA layer, the checks."""
    nodes, prof = kernel_counts(df)
    d = sweep_rows(df)
    calls = d[d.metric == "translate_calls_capture"].pivot_table(index=_CFG, columns="variant",
                                                                 values="value", aggfunc="max")
    per_layout = nodes.groupby(level=_CFG)
    out = per_layout.first()
    out.columns = [f"kernels {c}" for c in out.columns]
    n_swa = out.index.get_level_values("n_swa_layers")
    out["same for every batch size"] = (per_layout.nunique() == 1).all(axis=1)
    before, pr23552, pr24743 = (out[f"kernels {v}"] for v in rebuild.VARIANTS)
    out["+ per SWA layer: before vs #24743"] = (before - pr24743) / n_swa
    out["+ per SWA layer: #24743 vs #23552"] = (pr24743 - pr23552) / n_swa
    out["profiler = static (all bs)"] = (prof == nodes).all(axis=1).groupby(level=_CFG).all()
    out["translate calls in capture (before)"] = calls["before"].astype(int)
    return out


def profiler_agreement(df) -> Dict[str, int]:
    """How many (layout, batch size, variant) cells count alike both ways; the widest gap."""
    nodes, prof = kernel_counts(df)
    gap = (prof - nodes).abs()
    return dict(cells=int(gap.size), equal=int((gap == 0).sum().sum()),
                max_abs_diff=int(gap.max().max()))


def time_table(df):
    """Per layout × bs: median replay time per variant (µs), ratios, µs saved per SWA layer."""
    d = sweep_rows(df)
    med = d[d.metric == "time_median"].pivot_table(index=_CFG + ["batch_size"], columns="variant",
                                                   values="value") * 1e3
    out = pd.DataFrame({f"{v} µs": med[v] for v in med.columns})
    out["before / #24743"] = med["before"] / med["pr24743"]
    out["#24743 / #23552"] = med["pr24743"] / med["pr23552"]
    n_swa = med.index.get_level_values("n_swa_layers")
    out["µs saved per SWA layer"] = (med["before"] - med["pr24743"]) / n_swa
    return out


def pad_table(df):
    """The padding scenario per variant: corrupted, predicted (layer, slot) pairs, exact match."""
    return df[df.metric.str.startswith("pad_")].pivot_table(index="variant", columns="metric",
                                                            values="value").astype(int)


def translation_kernels(graph_kernels) -> Dict[str, int]:
    """Kernel names with more nodes in the graph before than in #24743's, and how many more."""
    a, b = (graph_kernels[graph_kernels.variant == v] for v in ("before", "pr24743"))
    return dict(
        Counter(dict(zip(a.kernel, a.nodes.astype(int)))) -
        Counter(dict(zip(b.kernel, b.nodes.astype(int)))))


def name_pattern(names) -> Optional[str]:
    """A regular expression matching exactly these kernel names (for a timeline's highlight)."""
    names = sorted(set(names))
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$" if names else None


def trace_counts(events, pattern: Optional[str] = None) -> Dict[str, Dict[str, int]]:
    """Per variant of a traced replay: kernels on the device, and how many match ``pattern``."""
    kernels = events[events.category == "kernel"].groupby("variant", sort=False)
    return {
        v: dict(kernels=len(ev),
                matching=int(ev.name.str.contains(pattern).sum()) if pattern else 0)
        for v, ev in kernels
    }


_KEY_PARTS = [  # the last: the innermost functor (MulFunctor, not AUnaryFunctor)
    (r"index_put_kernel_impl<at::native::OpaqueType<(\d+)>", r"index_put<\1B>"),
    (r"index_kernel_impl<at::native::OpaqueType<(\d+)>", r"index gather<\1B>"),
    (r"direct_copy_kernel_cuda.*?\{lambda\((?:c10::)?(\w+)\)#1\}", r"copy -> \1"),
    (r"(\w+Functor\w*)(?!.*Functor)", r"\1")
]


def short_kernel(name: str) -> str:
    """A readable kernel name: the template and what tells it apart (``... · index gather<8B>``)."""
    base = re.sub(r"^void\s+", "", str(name))
    head = re.split(r"[<(]", base, maxsplit=1)[0].split("::")[-1]
    for rx, repl in _KEY_PARTS:
        if m := re.search(rx, base):
            return f"{head} · {m.expand(repl)}"
    return head if len(base) > 60 else base


def eager_table(t):
    """Eager kernel table per (variant, scope, step, op, kernel): calls, median µs by backend."""
    t = t.assign(kernel=t.kernel.map(short_kernel),
                 scope=t.scope.fillna("").replace("", "rest of the step"))
    wide = t.pivot_table(index=["variant", "scope", "step", "op", "kernel"], columns="backend",
                         values=["calls", "median_us"], aggfunc="first", sort=False)
    wide.columns = [f"{m} · {b}" for m, b in wide.columns]
    return text.counts(wide, [c for c in wide.columns if c.startswith("calls · ")])


def kv_write_kernels(table, variant: str):
    """One variant's SWA KV write (its first backend) in op order: step, op, kernel, calls, µs."""
    t = table[(table.variant == variant) & (table.scope == SWA_WRITE)]
    t = t[t.backend == t.backend.iloc[0]] if len(t) else t
    return t.sort_values("step")[["step", "op", "kernel", "calls",
                                  "median_us"]].reset_index(drop=True)


# -- the GPU sections of the notebook, each shown from the run (or its NoRun line) -----------------
@notebook.needs_run
def kernels(run) -> None:
    """Kernel nodes per replay, a row per layout; the profiler's agreement on every run shown."""
    print(f"{engine_records.run_label(run.first)} (method {run.first.manifest.method_version}):")
    table = kernel_table(run.first.df)
    extra = [c for c in table if c.startswith("+ per SWA layer")]
    notebook.show_table(text.counts(table, extra, where_whole=True))  # 2, not 2.0
    for r in run.shown:
        a = profiler_agreement(r.df)
        print(f"{engine_records.run_label(r)}: profiler = static in {a['equal']}/{a['cells']} "
              "(layout, bs, variant) cells")
    notebook.show_figure(kernels_per_replay(run))


@notebook.needs_run
def times(run) -> None:
    """Replay times at every cell (the first run shown), the before/#24743 ratio per GPU."""
    print(f"{engine_records.run_label(run.first)}, every cell:")
    notebook.show_table(time_table(run.first.df).round(2))
    if len(run.shown) > 1:
        print("before / #24743 on each GPU (newest run per GPU), batch size in the columns:")
        ratios = {
            r.manifest.gpu: time_table(r.df)["before / #24743"].unstack("batch_size")
            for r in run.shown
        }
        notebook.show_table(pd.concat(ratios, axis=1).round(3))
    notebook.show_figure(replay_times(run.shown))


@notebook.needs_run
def padding(run) -> None:
    """The padding scenario on real graphs, per GPU: (layer, slot) pairs corrupted and predicted."""
    notebook.show_table(pd.concat({r.manifest.gpu: pad_table(r.df) for r in run.shown}, axis=1))


@notebook.needs_run
def profiler(run) -> None:
    """The first run shown: a traced replay before and after on one axis, the eager kernel table."""
    run = run.first
    fig = replay_timeline(run)
    if fig is not None:
        counts = trace_counts(run.sidecar("events"))
        notebook.file_link(run.sidecar("trace"), "Perfetto file")
        print("; ".join(
            f"{v}: {c['kernels']} kernels in the traced replay" for v, c in counts.items()))
        notebook.show_figure(fig)
    if notebook.predates_traces(run, "eager_kernels", where=" on one H100 / H200"):
        return
    info = run.manifest.eager_kernels
    print(f"eager kernel table · backends: {', '.join(info.get('backends', []))}; nsight-python: "
          f"{info.get('nsight')} ({info.get('nsight_reason')})")
    notebook.show_table(eager_table(run.sidecar("eager_kernels")).round(2))


# -- figures ---------------------------------------------------------------------------------------
_OP_TEXT = {
    "index": "gather\nfull_to_swa[loc]", "_to_copy->int32": "cast\nto int32",
    "_to_copy->int64": "cast\nto int64", "index_put_": "store\n{kv}"
}


def one_layer_ops(variant: str) -> list:
    """The op names of the first SWA layer's KV write in ``variant``'s captured step (CPU)."""
    calls = [c for c in kv_write_ops(variant) if c.scope == SWA_WRITE]
    ends = [i for i, c in enumerate(calls) if i > 0 and c.step == 0]
    return [c.op for c in calls[:ends[0] if ends else len(calls)]]


def mechanism(run=None):
    """One SWA layer's KV write inside the decode graph, before and after: a box per kernel node."""
    a, b = variants = ("before", "pr24743")
    ops = {v: one_layer_ops(v) for v in variants}
    table = run.first.sidecar("eager_kernels") if run else None
    kernels_ = {  # short kernel names of the SWA KV write's ops, from a run's eager table
        v: {} if table is None else
        {int(r.step): short_kernel(r.kernel)
         for r in kv_write_kernels(table, v).itertuples()}
        for v in variants
    }
    matcher = difflib.SequenceMatcher(a=ops[a], b=ops[b], autojunk=False)
    spans = [range(i1, i2) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]
    removed = set().union(*spans)  # an insert's span in ``a`` is empty
    offset = {a: 0.0, b: float(len(ops[a]) - len(ops[b]))}  # right-aligned: store under store
    fig, ax = plots.canvas(11.5, 3.6, xlim=(0, 11.5), ylim=(0, 3.6))
    w, gap, x0 = 1.25, 0.12, 3.0
    for row, (v, y) in enumerate(((a, 2.1), (b, 0.55))):
        color = "before" if row == 0 else "after"
        cfg = rebuild.runner_config(v)
        dtype = str(cfg.swa_loc_dtype).removeprefix("torch.")
        caption = (f"swa_loc = out_cache_loc_swa[:bs]\n(static {dtype} buffer) set "
                   "before capture" if cfg.preset_swa_loc else
                   "swa_loc unset at capture:\nthe graph records the translation")
        plots.label(ax, 0.1, y + 0.42, VARIANT_LABELS[v].split(" (")[0], color=plots.PALETTE[color])
        plots.label(ax, 0.1, y + 0.05, caption, fontsize=7.5, weight="normal")
        stores = iter("KV" * len(ops[v]))
        for i, op in enumerate(ops[v]):
            text = _OP_TEXT.get(op, op)
            text = text.format(kv=next(stores)) if op == "index_put_" else text
            x = x0 + (i + offset[v]) * (w + gap)
            plots.box(ax, x, y, w, 0.85, text,
                      color="removed" if row == 0 and i in removed else "kept", fontsize=8)
            if kname := kernels_[v].get(i):
                ax.text(x + w / 2, y - 0.08, kname.replace(" · ", "\n"), ha="center", va="top",
                        fontsize=5.5, color="#555555")
    xs = [x0 + i * (w + gap) for i in sorted(removed)]
    if xs:
        ax.annotate("", xy=(xs[0], 3.12), xytext=(xs[-1] + w, 3.12),
                    arrowprops={"arrowstyle": "-", "color": plots.PALETTE["before"], "lw": 1.2})
        ax.text((xs[0] + xs[-1] + w) / 2, 3.18, f"translate_loc_from_full_to_swa: {len(removed)} "
                "kernels, in every SWA layer of every replay", ha="center", va="bottom", fontsize=8,
                color=plots.PALETTE["before"])
    ax.set_title(
        f"One SWA layer's KV write inside the decode graph: {len(ops[a])} kernel nodes before, "
        f"{len(ops[b])} with the preset", fontsize=10)
    return fig


def kernels_per_replay(run):
    """Kernel nodes per replay against the layer count, a panel per layout (the first run shown)."""
    kt = kernel_table(run.first.df).reset_index()
    fig, axes = plots.figure(ncols=2)
    for ax, ratio in zip(axes.ravel(), sorted(kt.swa_per_full.unique(), reverse=True)):
        sub = kt[kt.swa_per_full == ratio]
        for v in rebuild.VARIANTS:
            ax.plot(sub.num_layers, sub[f"kernels {v}"], marker="o", label=VARIANT_LABELS[v],
                    color=COLORS[v])
        ax.set(title=f"{ratio} SWA : 1 full", xlabel="layers",
               ylabel="kernels per replay (graph kernel nodes)")
        ax.legend()
    counts = [kernel_counts(r.df)[0] for r in run.shown]
    same_gpu = len(run.shown) > 1 and all(c.equals(counts[0]) for c in counts)
    plots.caption(
        fig, run.first, extra="static count via cuda-bindings"
        + ("; identical for every captured batch size"
           if kt["same for every batch size"].all() else "; smallest batch size shown")
        + ("; identical on " + " and ".join(r.manifest.gpu for r in run.shown) if same_gpu else ""))
    return fig


def replay_times(shown: list):
    """Replay time by batch size and layer count at the headline layout; µs saved per SWA layer."""
    h = HEADLINE_CONFIG
    fig, axes = plots.figure(ncols=3, width=16)
    axes = axes.ravel()
    for gi, r in enumerate(shown):
        gpu, style = r.manifest.gpu, STYLES[gi % len(STYLES)]
        d = sweep_rows(r.df)
        d = d[d.metric.str.startswith("time_")].pivot_table(
            index=["swa_per_full", "num_layers", "batch_size", "variant"], columns="metric",
            values="value")
        for ax, (xname, fixed) in zip(axes[:2], [("batch_size", ("swa_per_full", "num_layers")),
                                                 ("num_layers", ("swa_per_full", "batch_size"))]):
            sub = d.xs(tuple(h[k] for k in fixed), level=fixed).reset_index()
            for v in rebuild.VARIANTS:
                s = sub[sub.variant == v].sort_values(xname)
                err = [(s.time_median - s.time_p10) * 1e3, (s.time_p90 - s.time_median) * 1e3]
                ax.errorbar(s[xname], s.time_median * 1e3, yerr=err, marker="o", capsize=3,
                            color=COLORS[v], ls=style, label=f"{v} · {gpu}")
            ax.set_title(", ".join(f"{k.replace('_', ' ')} = {h[k]}" for k in fixed))
            ax.set_ylabel("replay time, µs (median, p10–p90)")
        tab = time_table(r.df).reset_index()
        for ratio, marker in zip(sorted(tab.swa_per_full.unique(), reverse=True), "os^"):
            d = tab[(tab.swa_per_full == ratio) & (tab.num_layers == h["num_layers"])]
            d = d.sort_values("batch_size")
            axes[2].plot(d.batch_size, d["µs saved per SWA layer"], marker=marker, ls=style,
                         color=plots.CYCLE[(2 + 2 * gi) % len(plots.CYCLE)],
                         label=f"{ratio}:1 · {gpu}")
    bss = sorted(int(b) for b in sweep_rows(shown[0].df).batch_size.unique() if b > 0)
    for ax in (axes[0], axes[2]):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(bss))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("batch size")
    axes[1].set_xlabel("layers")
    axes[2].set(ylim=(0, None), title=f"before − #24743, {h['num_layers']} layers",
                ylabel="µs saved per SWA layer per replay")
    for ax in axes:
        ax.legend(fontsize=7, ncol=2 if ax is not axes[2] else 1)
    plots.caption(
        fig, shown[0], extra=" · ".join(plots.provenance_text(r) for r in shown[1:])
        + ("; line style = GPU" if len(shown) > 1 else ""))
    return fig


def replay_timeline(run):
    """A traced replay per variant, the translation marked; None (saying why) without traces."""
    if notebook.predates_traces(run, "events", "graph_kernels", where=" on one H100 / H200"):
        return None
    events, gk = run.sidecar("events"), run.sidecar("graph_kernels")
    pattern = name_pattern(translation_kernels(gk))
    device = events[events.lane.str.startswith("stream")]  # what one cudaGraphLaunch runs
    tables = {
        VARIANT_LABELS[v].split(" (")[0]: plots.window(device[device.variant == v])
        for v in ("before", "pr24743")
    }
    tc = run.manifest.params.get("trace_config", {})
    fig, ax = plots.figure(width=11, height=3.0)
    plots.timeline(
        tables, highlight=pattern, highlight_label="translation (gather + int32 cast)",
        categories=("kernel", "range"), ax=ax,
        title=f"One decode-graph replay on the GPU, {tc.get('num_layers')} layers "
        f"{tc.get('swa_per_full')}:1, bs {tc.get('batch_size')}")
    ax.get_legend().set_bbox_to_anchor((0.5, -0.3))
    plots.caption(fig, run,
                  extra="torch.profiler, times under the profiler; host side in the Perfetto file")
    return fig


# -- the real engine, before and after -------------------------------------------------------------
def beside_rows(run, engine_run) -> list[dict]:
    """Kernels a replay gains per SWA layer without the preset, in the rebuild and the engine."""
    rows = engine_view.missing_rows(run, engine_run)
    if run:
        run = run.first
        source, extra = f"rebuild ({run.manifest.gpu})", extra_per_swa_layer(run.df)
        saved = time_table(run.df)["µs saved per SWA layer"]
        rows += [
            dict(
                source=source, measures="kernel nodes per decode-graph replay, before − with "
                f"#24743, per SWA layer ({len(extra)} layouts × batch sizes)",
                figure=", ".join(f"{x:g}" for x in sorted(set(extra)))),
            dict(source=source, measures="replay time saved per SWA layer (CUDA events, median)",
                 figure=text.span(saved, "{:.1f}", " µs"))
        ]
    if engine_run:
        df = engine_records.frame(engine_run.shown)
        per = engine_stats.texts(df, "decode_kernels_per_replay")
        n_swa = engine_swa_layers(engine_run.shown)
        for model, rel in sorted({(m, r) for m, r, c in per if c == "before"}):
            before, released = per[(model, rel, "before")], per.get((model, rel, "released"))
            if released is None or not n_swa:
                continue
            extra = (float(before) - float(released)) / n_swa
            rows.append(
                dict(
                    source=f"SGLang {rel} engine ({model})",
                    measures="kernels per decode-graph replay (bench_one_batch's trace), #23552 "
                    f"reverted − released, per SWA layer (({float(before):g} − "
                    f"{float(released):g}) / {n_swa})", figure=f"{extra:g}"))
    return rows


def engine_swa_layers(shown: list) -> int:
    """The sliding-window layers of the first engine model that lists its layer types (or 0)."""
    kinds = ((e.get("model") or {}).get("config", {}).get("layer_types") for r in shown
             for e in r.manifest.engine_runs)
    return sum(k == "sliding_attention" for k in next(filter(None, kinds), []))


VIEW = engine_view.EngineView(what="GPT-OSS-style 8 layers (4 sliding-window)",
                              facts=("decode_kernels_per_replay", "decode_kernels_per_layer"),
                              tables=(engine_view.Table("decode", "batch_size"),))
