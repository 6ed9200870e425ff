"""Tables and figures of notebook 03: the tables the claims read, the GPU sections, the picture of
one capture (:func:`mechanism`), the rebuild beside the engine, the engine's section (:data:`VIEW`)
and "your own setup"."""

from __future__ import annotations

import re
from contextlib import contextmanager

import pandas as pd
import torch

from sglab.breakable_graph import measure, rebuild
from sglab.core import engine_records, engine_stats, engine_view, notebook, plots, runs, text

# up to here a prefill of this model is mostly kernel launches (the claims' launch-bound cells);
# above, the gain is eager's host overhead alone and shrinks on a faster host
LAUNCH_BOUND = 512
STYLES = {"eager": ("tab:gray", "o"), "before": ("tab:red", "s"), "after": ("tab:blue", "^")}


# -- tables of a run -------------------------------------------------------------------------------
def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median latency per (num_tokens, batch_size) and variant, with speedups over eager."""
    d = df[(df["part"] == "d_latency") & (df["metric"] == "time_median")]
    t = d.pivot_table(index=["num_tokens", "batch_size"], columns="variant",
                      values="value").reset_index()
    return t.assign(speedup_after=t["eager"] / t["after"], speedup_before=t["eager"] / t["before"])


def latency_of(run) -> pd.DataFrame:
    """:func:`latency_table` of a run, worked out once per run."""
    return run.memo("latency_table", lambda: latency_table(run.df))


def hit_rates(df: pd.DataFrame) -> dict:
    """{variant: {"hit_rate", "token_hit_rate", "graph_batches", "batches"}} of part c."""
    c = df[(df["part"] == "c_hit_rate") & df["variant"].isin(["before", "after"])]
    return {v: dict(zip(g["metric"], g["value"])) for v, g in c.groupby("variant")}


def bs3_table(df: pd.DataFrame) -> pd.DataFrame:
    """Part a: the before graph replayed for 3 requests, against eager and the after graph."""
    return df[df["part"] == "a_bs3"].pivot_table(index="variant", columns="metric", values="value")


def bs3_view(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`bs3_table` for reading: ``can_run`` yes/no, logit rows a count, blanks for none."""
    t = bs3_table(df)
    out = text.counts(text.blank(t, [c for c in t if c != "logit_rows"]), ["logit_rows"])
    if "can_run" in t:
        out["can_run"] = t["can_run"].map(lambda v: "" if pd.isna(v) else ("yes" if v else "no"))
    return out


def match_table(df: pd.DataFrame) -> pd.DataFrame:
    """Part b per token count: one logit row per request in every batch, and the largest diff."""
    b = df[df["part"] == "b_match"].pivot_table(index=["num_tokens", "padded", "batch_size"],
                                                columns="metric", values="value").reset_index()
    g = b.assign(ok=b["logit_rows"] == b["batch_size"]).groupby(["num_tokens", "padded"])
    return pd.DataFrame({
        "requests": g["batch_size"].agg(lambda s: f"{s.min()}..{s.max()}"),
        "rows == requests": g["ok"].all(), "max abs diff": g["max_abs_diff"].max(),
        "max abs logit (eager)": g["max_abs_logit"].max()
    }).reset_index().astype({"num_tokens": int, "padded": bool})


def launch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Host launches and device kernels per prefill, by request count and variant."""
    ln = df[(df["part"] == "launches") & (df["batch_size"] > 0)]
    return ln.pivot_table(index=["batch_size", "variant"], columns="metric",
                          values="value").astype(int)


def segment_table(df: pd.DataFrame) -> pd.DataFrame:
    """Graph segments and eager breaks per captured bucket, per boundary."""
    seg = df[(df["part"] == "launches") & df["metric"].isin(["graph_segments", "eager_breaks"])]
    return seg.pivot_table(index="num_tokens", columns=["variant", "metric"],
                           values="value").astype(int)


def hit_table(rows: list[dict]) -> pd.DataFrame:
    """The rows of :func:`~sglab.breakable_graph.measure.hit_rate_rows`, one row per runner."""
    hits = pd.DataFrame(hit_rates(pd.DataFrame(rows))).T
    return hits[["batches", "graph_batches", "hit_rate", "token_hit_rate"]]


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count: after and before vs eager over 2+ requests; after's own latency."""
    lat = latency_table(df)
    multi, every = lat[lat["batch_size"] > 1].groupby("num_tokens"), lat.groupby("num_tokens")
    return pd.DataFrame({
        "requests": multi["batch_size"].agg(lambda s: f"{s.min()}..{s.max()}"),
        "after vs eager ×, min": multi["speedup_after"].min(),
        "after vs eager ×, max": multi["speedup_after"].max(),
        "before vs eager ×, min": multi["speedup_before"].min(),
        "before vs eager ×, max": multi["speedup_before"].max(),
        "after ms, min (any requests)": every["after"].min(),
        "after ms, max (any requests)": every["after"].max()
    })


def speedups(df: pd.DataFrame) -> dict:
    """After vs eager over the timed prefills of 2+ requests, with the A/A gap (eager ÷ before)."""
    t = latency_table(df)
    multi = t[t["batch_size"] > 1]
    s = multi["speedup_after"]
    small = multi[multi["num_tokens"] <= LAUNCH_BOUND]["speedup_after"]
    if s.empty:
        return {}
    gap = (multi["speedup_before"] - 1).abs()  # the same eager code, timed twice
    clear = (s - 1 - gap).dropna()
    return dict(min=float(s.min()), max=float(s.max()), median=float(s.median()),
                min_launch_bound=float(small.min()) if len(small) else None,
                median_launch_bound=float(small.median()) if len(small) else None,
                aa_noise=float(gap.max()) if gap.notna().any() else None,
                aa_margin=float(clear.min()) if len(clear) else None)


# -- the GPU sections of the notebook, each shown from the run (or its NoRun line) -----------------
@notebook.needs_run
def correctness(run) -> None:
    """Per GPU: 3 requests through each graph (part a), the after graph against eager (part b)."""
    for r in run:
        print(r.label)
        notebook.show_table(bs3_view(r.df))
        notebook.show_table(match_table(r.df))


@notebook.needs_run
def latency(run) -> None:
    """Per GPU: latency by request count, the speedups over eager, the mixed stream's hit rate."""
    for r in run:
        notebook.show_figure(latency_figure(r))
        notebook.show_table(speedup_table(r.df).round(2))
        hits = pd.DataFrame(hit_rates(r.df)).T
        notebook.show_table(text.counts(hits, ["graph_batches", "batches"]))


@notebook.needs_run
def launches(run) -> None:
    """Per GPU: host launches and device kernels per prefill, segments and breaks per bucket."""
    for r in run:
        print(f"{r.label}, {int(r.manifest.params['launch_token_count'])} tokens per prefill:")
        notebook.show_table(launch_table(r.df))
        notebook.show_table(segment_table(r.df))


@notebook.needs_run
def profiler(run) -> None:
    """Per GPU: the traced 3-request prefill of the before and after runners on one time axis."""
    for r in run:
        if notebook.predates_traces(r):
            continue
        notebook.show_figure(timeline(r))


# -- the structure of one capture (the slide's picture) --------------------------------------------
class StructureCapture(rebuild.BreakableCUDAGraphCapture):
    """A capture that records module names per segment where the real one opens a CUDA graph."""

    def __init__(self, boundary: str):
        super().__init__(rebuild.BreakableCUDAGraph())
        self.boundary = boundary
        self.segments: list[list[str]] = []  # per segment: module names, in call order
        self.breaks: list[str] = []  # per break: the module that broke
        self.stack: list[str] = []

    @property
    def tail_in_graph(self) -> bool:
        """Does a captured segment contain the logits tail (the one-request gather)?"""
        return any("logits_processor" in n for seg in self.segments for n in seg)

    def _begin_new_segment(self) -> None:
        if self.segments:  # called right after an eager break ran, inside the module that broke
            self.breaks.append(self.stack[-1] if self.stack else "?")
        self.segments.append([])

    def _end_current_segment(self) -> None:
        pass

    @contextmanager
    def hooks(self, model: torch.nn.Module):
        """Record every module entered (into the open segment) while the capture runs."""
        handles = []
        for name, mod in list(model.named_modules())[1:]:  # not the model itself

            def pre(_m, _args, name=name):
                self.stack.append(name)
                if self.segments:
                    self.segments[-1].append(name)

            def post(_m, _args, _out):
                self.stack.pop()

            handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


CAPTURE_TOKENS = 16


def capture_structure(boundary: str, num_layers: int = 16, model=None) -> StructureCapture:
    """The segments and breaks of one capture with the given boundary, on a small CPU model."""
    if model is None:
        model = rebuild.build_model(
            rebuild.ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, head_dim=16,
                                intermediate_size=64, num_layers=int(num_layers), max_position=64))
    runner = rebuild.BreakableGraphRunner(model, boundary=boundary,
                                          capture_num_tokens=[CAPTURE_TOKENS], capture=False)
    cap = StructureCapture(boundary)
    if boundary == rebuild.AFTER and runner.layer_model is None:
        return cap
    batch = runner._build_capture_forward_batch(CAPTURE_TOKENS)
    meta = rebuild.build_attn_metadata(batch.extend_seq_lens_cpu, CAPTURE_TOKENS, runner.device)
    with cap.hooks(model), rebuild.set_forward_context(meta), torch.no_grad(), cap:
        runner._run_forward(batch, CAPTURE_TOKENS)
    return cap


_LAYER = re.compile(r"layers\.(\d+)\.(.*)")
_WORDS = {
    "input_layernorm": "norm", "self_attn.qkv_proj": "qkv", "self_attn.o_proj": "o_proj",
    "post_attention_layernorm": "norm", "mlp": "MLP"
}
_LEAVES = dict(embed_tokens="embed", embed_positions=None, norm="final norm",
               logits_processor="logits tail")


def segment_label(names: list[str]) -> str:
    """A short description of one segment, e.g. ``"L0 o_proj·norm·MLP | L1 norm·qkv"``."""
    parts: list[tuple[str, list[str]]] = []
    for n in names:
        n = n.removeprefix("model.").removeprefix("language_model.model.")
        m = _LAYER.search(n)
        word, where = (_WORDS.get(m.group(2)), f"L{m.group(1)}") if m else \
            (_LEAVES.get(n.split(".")[-1]), "")
        if word is None:
            continue
        if parts and parts[-1][0] == where:
            if word not in parts[-1][1]:
                parts[-1][1].append(word)
        else:
            parts.append((where, [word]))
    return " | ".join((f"{w} " if w else "") + "·".join(ws) for w, ws in parts)


# -- figures ---------------------------------------------------------------------------------------
EDGE = 2  # segments drawn at each end of a row; the middle is summarised


def _draw_row(ax, y: float, s: StructureCapture) -> float:
    """Segments and breaks left to right, the middle one gap."""
    full = []
    for i, label in enumerate(segment_label(seg) for seg in s.segments):
        full.append(("segment", f"graph {i}\n" + label.replace(" | ", "\n"),
                     "before" if "logits tail" in label else "after"))
        if i < len(s.breaks):
            layer = s.breaks[i].split("layers.")[-1].split(".")[0] if "layers." in s.breaks[i] \
                else "?"
            full.append(("break", f"attn\nL{layer}\neager", "neutral"))
    head, tail = 2 * EDGE, 2 * EDGE - 1
    if len(full) > head + tail + 1:
        hidden = full[head:-tail]
        n_seg = sum(k == "segment" for k, _, _ in hidden)
        gap = ("gap", f"… {n_seg} more segments\nand {len(hidden) - n_seg} breaks …", "none")
        full = full[:head] + [gap] + full[-tail:]
    x, widths = 0.1, {"segment": 1.55, "break": 0.55, "gap": 1.6}
    for kind, text, color in full:
        w = widths[kind]
        if kind == "gap":
            ax.text(x + w / 2, y + 0.4, text, ha="center", va="center", fontsize=7.5,
                    color="#555555")
        else:
            plots.box(ax, x, y, w, 0.8, text, color=color, fontsize=6.8)
        x += w + 0.08
    return x


def mechanism(run=None):
    """One captured forward as graph segments and eager breaks, before and after #24662."""
    params = run.manifest.params if run else {}
    layers = int(params.get("num_layers", measure.DEFAULT_PARAMS["num_layers"]))
    before, after = (capture_structure(b, layers) for b in rebuild.BOUNDARIES)
    if run:
        bs3 = bs3_table(run.df)
    else:  # the rebuild's 3-request batch on the CPU
        model = rebuild.build_model(rebuild.TINY_CONFIG)
        runners = (rebuild.BreakableGraphRunner(model, boundary=b, capture_num_tokens=[16, 32, 64])
                   for b in rebuild.BOUNDARIES)
        batch = rebuild.make_batch([10, 12, 10], vocab_size=rebuild.TINY_CONFIG.vocab_size, seed=1)
        bs3 = bs3_table(pd.DataFrame(measure.three_requests(model, *runners, batch)))
    rows, can = bs3["logit_rows"].astype(int), bs3["can_run"].astype(bool)
    fig, ax = plots.canvas(12.5, 4.3, xlim=(0, 12.5), ylim=(0, 4.3))
    for s, y, title in ((before, 2.55, "before #24662: capture model.forward (bs=1)"),
                        (after, 0.75, "after #24662: capture layer_model.forward")):
        plots.label(ax, 0.1, y + 1.15, f"{title} — {len(s.segments)} graph segments, "
                    f"{len(s.breaks)} eager breaks", fontsize=9)
        x = _draw_row(ax, y, s)
        if s.boundary == rebuild.AFTER:
            plots.arrow(ax, (x - 0.05, y + 0.4), (x + 0.3, y + 0.4))
            plots.box(ax, x + 0.32, y, 1.7, 0.8,
                      "logits tail, eager:\nlast token of each\nrequest, lm_head", color="kept",
                      fontsize=6.8)
    said = dict(before=f"runs eagerly (replayed anyway: {rows['before']} logit row)",
                after=f"replays the segments, {rows['after']} logit rows")
    for y, v in ((2.2, "before"), (0.4, "after")):
        ax.text(0.1, y, f"3-request batch: can_run = {can[v]} → {said[v]}", fontsize=8,
                color=plots.PALETTE[v])
    ax.text(
        0.1, 0.05, "Segments and breaks recorded from the runner's own capture path (model of "
        "the run's layer count); red: the segment that bakes in the one-request gather.",
        fontsize=7.5, color="#555555")
    return fig


def latency_figure(run):
    """Per token count: eager / before / after latency by request count; speed-ups over eager."""
    lat = latency_of(run)
    token_counts = sorted(lat["num_tokens"].unique())
    fig, axes = plots.figure(ncols=len(token_counts) + 1, width=4.2 * (len(token_counts) + 1))
    axes = list(axes.ravel())
    d = run.df[run.df["part"] == "d_latency"]
    spread = d.pivot_table(index=["variant", "num_tokens", "batch_size"], columns="metric",
                           values="value")
    for ax, n in zip(axes, token_counts):
        for variant, (color, marker) in STYLES.items():
            s = spread.loc[(variant, n)].reset_index()
            ax.errorbar(s["batch_size"], s["time_median"],
                        yerr=[s["time_median"] - s["time_p10"], s["time_p90"] - s["time_median"]],
                        color=color, marker=marker, capsize=2, label=variant)
        ax.set_title(f"{runs.gpu_short(run.manifest)}: {n} tokens per prefill")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("prefill latency, ms (median, p10–p90)")
    axes[0].legend()
    ax = axes[-1]
    for n, g in lat.groupby("num_tokens"):
        line, = ax.plot(g["batch_size"], g["speedup_after"], marker="^", label=f"after, {n} tok")
        ax.plot(g["batch_size"], g["speedup_before"], marker="s", ls="--", color=line.get_color(),
                alpha=0.6, label=f"before, {n} tok")
    ax.axhline(1.0, color="#999999", lw=1)
    ax.set(title=f"{runs.gpu_short(run.manifest)}: speedup over eager",
           ylabel="eager / runner latency, × (medians)")
    ax.set_ylim(bottom=0)
    ax.legend(ncol=2, fontsize=7)
    for ax in axes:
        ax.set_xlabel("requests in the batch")
        ax.set_xticks(sorted(lat["batch_size"].unique()))
    plots.caption(fig, run, extra="before = graph only for 1 request, eager otherwise")
    return fig


def timeline(run):
    """The 3-request prefill in the profiler: before (all eager) vs after (graph launches)."""
    ev = run.sidecar("events")
    shown = [v for v in ("before", "after") if (ev.variant == v).any()]
    tables = {f"{v} (3 req)": plots.window(ev[ev.variant == v]) for v in shown}
    fig = plots.timeline(
        tables, highlight="GraphLaunch", highlight_label="graph launch",
        categories=("kernel", "memcpy", "memset", "runtime"), title=f"One 3-request prefill of "
        f"{int(run.manifest.params['launch_token_count'])} tokens ({runs.gpu_short(run)})")
    plots.caption(fig, run, extra="torch.profiler; each runner from its own first event")
    return fig


# -- your own setup: a prefill traffic mix -> the graph hit rate of each runner --------------------
def traffic_table(p_single: float, max_requests: int, max_len: int,
                  largest_bucket: int) -> pd.DataFrame:
    """1000 seeded prefill batches of this mix routed by each runner's ``can_run`` (no GPU)."""
    p = dict(measure.DEFAULT_PARAMS, stream_p_single=p_single, stream_max_bs=max_requests,
             stream_max_len=max_len, capture_num_tokens=[largest_bucket])
    rows = measure.hit_rate_rows(p)
    t = hit_table(rows).astype({"batches": int, "graph_batches": int})
    t = t.rename_axis(index="runner", columns=None).reset_index()
    t["batches over the largest bucket"] = int(
        next(r["value"] for r in rows if r["metric"] == "batches_over_max_tokens"))
    return t


def your_setup(interactive: bool = False):
    """Your prefill traffic -> the share of batches (and tokens) on each runner's graph."""
    controls = dict(p_single=[0.0, 0.1, 0.35, 0.6, 0.9], max_requests=[2 << i for i in range(5)],
                    max_len=[256 << i for i in range(6)],
                    largest_bucket=[1024 << i for i in range(5)])
    mixes = [
        dict(p_single=0.35, max_requests=8, max_len=2048, largest_bucket=4096),
        dict(p_single=0.8, max_requests=4, max_len=1024, largest_bucket=4096),
        dict(p_single=0.2, max_requests=16, max_len=8192, largest_bucket=8192)
    ]
    return notebook.explore(
        traffic_table, controls, static=mixes, interactive=interactive,
        title="Your traffic: prefill batches served by the graph, before and after #24662")


# -- the real engine, before and after -------------------------------------------------------------
def beside_rows(run, engine_run) -> list[dict]:
    """Eager over graph for prefills of several requests, by the rebuild and by the engine."""
    found = []  # (source, measures, figure)
    df = engine_records.frame(engine_run.shown) if engine_run else None
    if run:
        multi = launch_table(run.df).query("batch_size > 1")["host_graph_launches"]
        got = {v: text.count(g) for v, g in multi.groupby(level="variant") if v != "eager"}
        if len(got) == 2:
            found.append(
                (f"rebuild ({runs.gpu_short(run)})", "graph launches per prefill of 2+ "
                 "requests, before → after #24662 (profiler)", f"{got['before']} → {got['after']}"))
    if engine_run:
        share = engine_stats.numbers(df, "prefill_graph")
        for rel, g in share[share.case == "bcg"].groupby("release"):
            several = g[g.requests > 1].value
            found.append((f"SGLang {rel} engine (llama_32x512)", "prefill batches on the breakable "
                          "graph, 1 request | 2+ requests (the scheduler's 'Prefill batch' log)",
                          f"{text.span(g[g.requests == 1].value * 100, '{:.0f}')}% | "
                          f"{text.span(several * 100, '{:.0f}')}%"))
    if run:
        multi = latency_of(run)[lambda t: t["batch_size"] > 1]
        where = (f"{text.count([multi.batch_size.min(), multi.batch_size.max()])} requests, "
                 f"{', '.join(str(n) for n in sorted(multi.num_tokens.unique()))} tokens")
        for variant, label in (("after", "with #24662"), ("before", "before #24662")):
            found.append((f"rebuild {label} ({runs.gpu_short(run)})",
                          f"eager ÷ graph, prefill forward only (CUDA events), {where}",
                          text.span(multi[f"speedup_{variant}"], unit="×")))
    starts = engine_stats.starts_in(df, "latency") if engine_run else 1
    for rel, per in (eager_over_graph(df) if engine_run else {}).items():
        cost = engine_records.host_us(engine_run, rel, "llama_32x512")  # the host that ran it
        several = {n: x for n, x in per.items() if n > 1}
        widest = [y for x in several.values() for y in x[1:]]
        figure = (f"{text.span([per[1][0]] if 1 in per else [], unit='×')} | "
                  f"{text.span([x[0] for x in several.values()], unit='×')}")
        found.append((f"SGLang {rel} engine (llama_32x512)", "eager ÷ "
                      "--enable-breakable-cuda-graph, whole Engine.generate call, 1 output token: "
                      f"1 request | {text.count([min(several), max(several)])} requests; "
                      f"{engine_stats.timing_source(starts, cost, engine_stats.STAT)}",
                      figure + (f" (starts {text.span(widest, unit='×')})" if starts > 1 else "")))
    found = [dict(zip(("source", "measures", "figure"), f)) for f in found]
    return engine_view.missing_rows(run, engine_run) + found


def eager_over_graph(df: pd.DataFrame) -> dict:
    """``{release: {requests: (eager / bcg, lo, hi)}}`` of Engine.generate, each side its STAT."""
    pairs = engine_stats.ratios(df, "latency", "requests", "eager", engine_stats.STAT)
    return {rel: r for (_, rel, case), r in pairs.items() if case == "bcg"}


def engine_figure(df):
    """Latency per request count, a line per release and case; filled where on the graph."""
    import matplotlib.pyplot as plt

    lat = engine_stats.numbers(df, "latency", only_started=True)
    graph = engine_stats.numbers(df, "prefill_graph", only_started=True)
    on = {(r.release, r.case, int(r.requests)): r.value == 1 for r in graph.itertuples()}
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for (rel, case), g in lat.groupby(["release", "case"]):
        g = g.sort_values("requests")
        line, = ax.plot(g.requests, g.value, ls="-" if case == "bcg" else ":",
                        label=f"{rel} {case}")
        for n, v in zip(g.requests, g.value):
            filled = on.get((rel, case, int(n)), False)
            ax.plot(n, v, "o", color=line.get_color(), mfc=line.get_color() if filled else "white")
    ticks = sorted(int(n) for n in lat.requests.unique())
    ax.set(xlabel="requests in the prefill batch", ylabel="Engine.generate, ms (median)",
           xscale="log", xticks=ticks, xticklabels=[str(n) for n in ticks])
    ax.minorticks_off()  # no "3×10⁰" between the request counts
    ax.legend(fontsize=8, title="filled: on the graph", title_fontsize=8)
    fig.tight_layout()
    return fig


VIEW = engine_view.EngineView(
    what="Llama-style 32 × 512", facts=("bcg", "pcg"),
    tables=(engine_view.Table("prefill_graph", "requests", "{:.0%}"),
            engine_view.Table("latency", "requests", "{:.1f}")), pairs=(engine_view.Pair(
                "latency", "requests", "eager", "eager ÷ breakable graph"),), figure=engine_figure)
