"""Tables and figures of notebook 01, from the rebuild (CPU) or a run (recorded or live), "your own
setup", and the real engine's section (:data:`VIEW`)."""

from __future__ import annotations

from typing import Optional

import pandas as pd

from sglab.core import engine_records, engine_stats, engine_view, notebook, plots, runs, text
from sglab.pcg_gate import rebuild, sglang
from sglab.pcg_gate.measure import COPY, GATE_METRICS, gate_facts
from sglab.sglang.releases import parse_version
from sglab.pcg_gate.tables import (CHECKS, STAT, _swept, captured_over_off, copy_explanation,
                                   gate_table, host_line, kernel_summary, latency_of, launch_counts,
                                   launch_table, prefill_sides, reading, summary, trace_table,
                                   width_gains, full_width_gains, FULL_WIDTH)


@notebook.needs_run
def latency(rs) -> None:
    """Per GPU shown: the gate, the latency table beside the host's per-launch cost, the figure."""
    for r in rs.shown:
        print(summary(r))
        print(host_line(r))
        lat = latency_of(r)
        cols = [c for c in lat if c.endswith(" ms") or c in ("bucket", "speedup", "speedup_direct")]
        # the direct hand-off is timed above the capture sizes only
        notebook.show_table(text.blank(lat[cols].round(3), ["direct median ms", "speedup_direct"]))
    notebook.show_figure(latency_figure(rs.shown))
    for r in rs.shown:
        print(reading(r))


@notebook.needs_run
def launches(rs) -> None:
    """Method 3: the launch-bound figures relative to the host's per-launch cost, per GPU."""
    for r in rs.shown:
        lt = launch_table(r.df)
        print(host_line(r))
        if not lt.empty:
            notebook.show_table(text.counts(lt.round(2), ["eager launches", "piecewise launches"]))


@notebook.needs_run
def correctness(rs) -> None:
    """Piecewise against eager on every GPU shown, and one line per run."""
    cols = ("bucket", *CHECKS)
    per_gpu = {c: pd.DataFrame({r.manifest.gpu: latency_of(r)[c] for r in rs.shown}) for c in cols}
    notebook.show_table(pd.concat(per_gpu, axis=1))
    for r in rs.shown:
        lat = latency_of(r)
        nonzero = lat.index[lat["max_abs_diff"] > 0].tolist()
        print(f"{r.manifest.gpu}: piecewise vs eager "
              f"{'within' if lat['within_tol'].all() else 'NOT within'} bf16 tolerance at all "
              f"{len(lat)} token counts; largest difference {lat['max_abs_diff'].max():.3g} "
              f"(tolerance {lat['tolerance'].min():.3g}); " +
              (f"bit-identical except at {nonzero} tokens"
               if nonzero else "bit-identical at every count") +
              f"; vs the same padded shape: largest {lat['max_abs_diff_same_shape'].max():.3g}")


@notebook.needs_run
def profiler(rs) -> None:
    """Per GPU shown: the traced prefills, what the trace counted, the copies, the kernel table."""
    for r in rs.shown:
        if notebook.predates_traces(r):
            continue
        for n in sorted(trace_table(r.df).index.get_level_values(0).unique()):
            notebook.show_figure(timeline(r, int(n)))
        if r.sidecar("trace") is not None:
            notebook.file_link(r.sidecar("trace"), f"{r.label}: the Perfetto trace")
        counted = ["kernels", "kernel_launches", "graph_launches", "copy_ops"]
        notebook.show_table(text.counts(trace_table(r.df).round(1), counted))
        notebook.show_table(text.counts(copy_explanation(r.df).round(3), ["extra copy ops"]))
        table, kt = r.sidecar("kernels"), r.manifest.kernel_table
        if table is not None:
            print(f"{r.label}: per-kernel table by {kt.get('backend')} — {kt.get('reason')}")
            # the "(N more)" row sums kernels of different lengths: no median of its own
            top = text.counts(kernel_summary(table).round(3), ["calls"])
            notebook.show_table(text.blank(top, ["median_us"]))


# -- figures ---------------------------------------------------------------------------------------
HOW = dict(no_alias="no .model", plain_alias="self.model =\nself.language_model.model",
           property_only="@property model", property_guard="@property model\n+ __setattr__ guard")


def mechanism_facts(rs=None) -> pd.DataFrame:
    """Per wrapper variant: the gate's decision and key counts, from the first run or rebuild."""
    if rs:
        g = gate_table(rs.first.df)
        if not g.empty:
            return g.assign(source="the measured LLM")
    facts = [
        gate_facts(rebuild.build_wrapper(v), rebuild.TINY_LM.num_layers) for v in rebuild.VARIANTS
    ]
    table = pd.DataFrame([{m: f[m] for m in GATE_METRICS} for f in facts], index=rebuild.VARIANTS)
    return table.assign(source="the CPU rebuild (2-layer LLM)")


# the gate's write-back as each wrapper takes it (the others: nn.Module.__setattr__'s)
WRITE_BACK = dict(
    plain_alias=("text model already in _modules['model']\n(registered in __init__)", "before"),
    property_guard=("dropped by __setattr__\n(nothing registered)", "kept"))


def mechanism(rs=None):
    """Wrapper → the gate's ``hasattr`` → its write-back → where the LLM's weights end up."""
    facts = mechanism_facts(rs)
    fig, ax = plots.canvas(12.0, 5.0, xlim=(0, 12), ylim=(0, 5.0))
    titles = ("wrapper (.model is …)", "gate: hasattr(wrapper, 'model')",
              "write-back: wrapper.model = LLM", "state_dict() after the gate")
    for x, title in zip((0.05, 2.75, 5.35, 8.45), titles):
        plots.label(ax, x, 4.75, title, fontsize=9)
    for i, v in enumerate(v for v in rebuild.VARIANTS if v in facts.index):
        y, f = 3.85 - i * 1.1, facts.loc[v]
        on, lm, dup = bool(int(f.gate_enabled)), int(f.lm_keys), int(f.model_keys_after_gate)
        plots.box(ax, 0.05, y, 2.3, 0.75, f"{v}\n{HOW[v]}", color="neutral", fontsize=7.5)
        plots.arrow(ax, (2.4, y + 0.37), (2.75, y + 0.37))
        plots.box(
            ax, 2.75, y, 2.2, 0.75, "True → PCG on\n(piecewise prefill)"
            if on else "False → 'not a language model'\nPCG off (eager prefill)",
            color="after" if on else "removed", fontsize=7.5)
        plots.arrow(ax, (5.0, y + 0.37), (5.35, y + 0.37))
        what, color = (("not reached", "neutral") if not on else WRITE_BACK.get(v) or
                       (("nn.Module.__setattr__ puts the LLM\nin _modules['model']",
                         "before") if dup else ("no duplicate", "kept")))
        plots.box(ax, 5.35, y, 2.7, 0.75, what, color=color, fontsize=7.5)
        plots.arrow(ax, (8.1, y + 0.37), (8.45, y + 0.37))
        plots.box(ax, 8.45, y + 0.4, 3.4, 0.33, f"language_model.*  {lm} keys", color="kept",
                  fontsize=7.5)
        if dup:
            llm = "its text model" if v == "plain_alias" else "the LLM"
            plots.box(ax, 8.45, y + 0.02, 3.4, 0.33, f"model.*  {dup} keys ({llm} again)",
                      color="before", fontsize=7.5)
        else:
            ax.text(8.5, y + 0.18, "model.*  none", fontsize=7.5, color="#555555", va="center")
    ax.text(
        0.05, 0.1, f"Key counts from {facts['source'].iloc[0]}. Only the PR's variant "
        "(property + guard) passes the gate and registers the LLM once.", fontsize=8,
        color="#555555")
    return fig


def latency_figure(shown: list):
    """Prefill latency (median, p10–p90) and eager/piecewise per token count, by GPU."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    lats = {r.manifest.gpu: latency_of(r) for r in shown}
    fig, axes = plots.figure(ncols=2, width=11.5)
    ax, ax2 = axes.flat
    for (gpu, lat), color in zip(lats.items(), plots.CYCLE):
        x = lat.index.values
        for mode, style in (("eager", "s--"), ("piecewise", "o-")):
            ax.plot(x, lat[f"{mode} median ms"], style, color=color, label=f"{gpu} {mode}",
                    mfc="white" if mode == "eager" else color)
            ax.fill_between(x, lat[f"{mode} p10 ms"], lat[f"{mode} p90 ms"], color=color,
                            alpha=0.12)
        ax2.plot(x, lat["speedup"], "o-", color=color, label=f"{gpu} piecewise")
        if "speedup_direct" in lat:
            d = lat["speedup_direct"].dropna()
            ax2.plot(d.index, d.values, "D", color=color, mfc="white",
                     label=f"{gpu} without the copies")
    top = pd.concat([lat["speedup"] for lat in lats.values()], axis=1).max(axis=1)
    for n, b in next(iter(lats.values()))["bucket"].items():
        if b != n:  # padded token counts
            ax2.annotate(f"pad→{b}", (n, top[n]), textcoords="offset points", xytext=(0, 6),
                         ha="center", fontsize=7, color="#555555")
    ax.set(xscale="log", yscale="log", xlabel="prefill tokens (one sequence)",
           ylabel="prefill latency (ms)", title="Prefill latency: eager (dashed) vs piecewise")
    ax.legend(ncol=2)
    ax2.axhline(1.0, color="#999999", lw=1)
    ax2.set(xscale="log", xlabel="prefill tokens (one sequence)",
            ylabel="eager / piecewise (median latency)", title="Speed-up from passing the gate")
    ax2.legend()
    for a in (ax, ax2):
        a.xaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    plots.caption(
        fig, shown[0],
        extra="; ".join([plots.provenance_text(r)
                         for r in shown[1:]] + ["bands: p10–p90; small prefills: host-bound"]))
    return fig


def timeline(run, num_tokens: int, variants=("eager", "piecewise", "piecewise_direct")):
    """The traced prefill at ``num_tokens``: a lane group per variant, copies highlighted."""
    ev = run.sidecar("events")
    ev = ev[ev.num_tokens == num_tokens]
    tables = {v: plots.window(ev[ev.variant == v]) for v in variants if (ev.variant == v).any()}
    fig = plots.timeline(tables, highlight=COPY, highlight_label="hand-off copies",
                         categories=("kernel", "memcpy", "memset", "runtime"),
                         title=f"One prefill of {num_tokens} tokens ({run.manifest.gpu})")
    plots.caption(fig, run, extra="torch.profiler; each variant from its own first event")
    return fig


# -- your own setup: a prefill length and --piecewise-cuda-graph-max-tokens ------------------------
def setup_table(tokens: int, max_tokens: int = 4096, shown: Optional[list] = None):
    """Per recorded GPU run: the bucket ``tokens`` pads to, and the medians at the nearest count."""
    sizes = rebuild.piecewise_cuda_graph_tokens(int(max_tokens))
    bucket = rebuild.bucket_for(int(tokens), sizes)
    shown = (runs.newest(runs.load_all_recorded("pcg_gate"), runs.gpu_short)
             if shown is None else shown)
    rows = []
    for r in shown:
        lat, lt = latency_of(r), launch_table(r.df)
        near = min(lat.index, key=lambda n: (abs(n - int(tokens)), n))
        rows.append({
            "GPU": r.manifest.gpu, "runs as": f"piecewise, {len(sizes)} buckets"
            if bucket else "eager (above the largest capture)", "bucket": bucket or "-",
            "padded share": round(1 - int(tokens) / bucket, 3) if bucket else 0.0,
            "measured at": near, "eager ms": round(lat.loc[near, "eager median ms"], 3),
            "piecewise ms": round(lat.loc[near, "piecewise median ms"], 3), "host µs/launch": round(
                lt["host µs/launch"].median(), 1) if len(lt) else "not measured", "run": r.path.name
        })
    return pd.DataFrame(rows)


def your_setup(interactive: bool = False):
    """Prefill tokens and ``--piecewise-cuda-graph-max-tokens`` → :func:`setup_table`."""
    controls = dict(tokens=[1, 16, 100, 300, 1000, 3000, 5000], max_tokens=[512, 2048, 4096, 8192])
    static = [{"tokens": 100, "max_tokens": 4096}, {"tokens": 3000, "max_tokens": 4096},
              {"tokens": 3000, "max_tokens": 2048}]
    return notebook.explore(setup_table, controls, static=static,
                            title="Your prefill: its bucket and the recorded times nearby",
                            interactive=interactive)


# -- the real engine, before and after (data/recorded/engine_pcg_gate/) ----------------------------
def launch_savings(df: pd.DataFrame, host_us) -> pd.DataFrame:
    """Per captured case and input length: the launches removed, their cost, the measured saving."""
    counts = launch_counts(df)
    if counts.empty:
        return pd.DataFrame()
    prefill = {k: x[0] for k, x in prefill_sides(df).items()}
    launches = counts["launches"].to_dict()
    rows = []
    for (model, rel, case, n), row in counts.iterrows():
        off = launches.get((model, rel, "pcg-off", n))
        removed = off - row["launches"] if off is not None else 0
        if case == "pcg-off" or removed <= 0 or row["pcg"] != "captured":
            continue
        measured = (prefill.get((model, rel, "pcg-off", n), float("nan")) - prefill.get(
            (model, rel, case, n), float("nan")))
        per_launch = measured * 1e3 / removed
        cost = host_us(rel, model, case)
        alone, times = (removed * cost / 1e3, per_launch / cost) if cost else (None, None)
        rows.append({
            "model": model, "release": rel, "case": case, "tokens": n, "launches, pcg-off": off,
            "launches, piecewise": row["launches"], "removed": removed,
            "launch cost alone (ms)": alone and round(alone, 3), "measured saving (ms)": round(
                measured, 3), "host µs per removed launch": round(per_launch, 1),
            "× bare launch cost": times and round(times, 1)
        })
    return (pd.DataFrame(rows).set_index(["model", "release", "case", "tokens"])
            if rows else pd.DataFrame())


def _launch_cells(rs) -> None:
    """The view's own table: the launch pass's counts per prefill step (exact)."""
    counts = launch_counts(engine_records.frame(rs.shown))
    if counts.empty:
        return
    cells = counts.assign(
        cell=[f"{k} + {g} graphs" if g else f"{k}" for k, g in zip(counts.kernels, counts.graphs)])
    cells = cells["cell"].unstack("tokens").fillna("")
    cells.columns.name = "launches per prefill step (kernels + graph replays; exact) by tokens"
    notebook.show_table(cells)


def buckets_line(buckets: list[int]) -> str:
    """The token-count buckets in a sentence (``4 buckets from 4 to 16 tokens, in steps of 4``)."""
    b = sorted(buckets)
    if len(b) < 2:
        return f"{len(b)} bucket{'s' * (len(b) != 1)}: {', '.join(map(str, b))} tokens"
    steps: list[tuple[int, int]] = []  # (step, up to)
    for lo, hi in zip(b, b[1:]):
        if steps and steps[-1][0] == hi - lo:
            steps[-1] = (hi - lo, hi)
        else:
            steps.append((hi - lo, hi))
    said = [f"{step} up to {top}" for step, top in steps]
    said = (str(steps[0][0]) if len(steps) == 1 else ", ".join(said[:-1]) + f" and {said[-1]}")
    return f"{len(b)} buckets from {b[0]} to {b[-1]} tokens, in steps of {said}"


def scope(rs) -> None:
    """:func:`engine_scope` shown whole (nothing without a run)."""
    t = engine_scope(rs)
    if not t.empty:
        with pd.option_context("display.max_colwidth", None):
            notebook.show_table(t)


CASE_ORDER = ("default", "enforce", "pcg", "pcg-off", "pcg-off-again")


def engine_scope(rs) -> pd.DataFrame:
    """Per model and tool of the section's runs: the releases and their cases, the prompt tokens."""
    df = engine_records.frame(rs.shown) if rs else pd.DataFrame()
    d = df[df["input_len"].notna()] if "input_len" in df else df
    if d.empty:
        return pd.DataFrame()

    def order(case: str) -> tuple:
        return (CASE_ORDER.index(case) if case in CASE_ORDER else len(CASE_ORDER), case)

    def said(cases) -> str:
        plain = sorted((c for c in set(cases) if not sglang.WIDTH_CASE.match(c)), key=order)
        widths = sorted({int(m["hidden"]) for m in map(sglang.WIDTH_CASE.match, set(cases)) if m})
        if widths:
            plain.append(f"the width sweep (hidden {text.count(widths)}, pcg and off)")
        return ", ".join(plain)

    rows = []
    for (model, tool), g in d.groupby(["model", "tool"], sort=True):
        releases = sorted(set(g.release), key=parse_version)
        cases = "; ".join(f"{rel}: {said(g[g.release == rel].case)}" for rel in releases)
        rows.append({
            "model": model, "tool": engine_records.TOOL_NAMES.get(tool, tool),
            "releases: cases": cases, "prompt tokens": text.count(g["input_len"])
        })
    return pd.DataFrame(rows).set_index(["model", "tool"])


VIEW = engine_view.EngineView(
    what="Kimi-K2.5 (a tiny model, its real widths, one TP-4 rank's widths) and Llama-style "
    "32-layer models", facts=("pcg", "pcg_reason"),
    pairs=(engine_view.Pair("prefill", "input_len", "pcg-off", "pcg-off ÷ this case",
                            cases=("enforce", "pcg")),), extra=_launch_cells)


@notebook.needs_run
def engine_times(rs) -> None:
    """The appendix's engine tables: prefill per input length, the launches' cost and saving."""
    df = engine_records.frame(rs.shown)
    notebook.show_table(
        engine_view.table(df[~df["case"].map(_swept)], engine_view.Table("prefill", "input_len")))
    table = launch_savings(df, lambda *variant: engine_records.host_us(rs, *variant))
    if not table.empty:
        print("What the removed launches cost at this host's bare per-launch cost, and the saving "
              "measured: eager spends several times the bare launch cost per kernel (the op's "
              "Python and dispatch work), and the graphs remove that too")
        notebook.show_table(table)


def width_sweep(rs) -> None:
    """Off ÷ captured prefill by tokens: a line per hidden size, a panel per GPU model."""
    by_gpu = {rs.first.manifest.gpu: list(rs.shown)} if rs else {}
    for r in rs.elsewhere if rs else []:
        by_gpu.setdefault(r.manifest.gpu, []).append(r)
    panels = []  # (gpu, df, gains, (lo, hi) µs per bare launch or None, full-width gains)
    for gpu, found in by_gpu.items():
        df = engine_records.frame(found)
        gains, full = width_gains(df), full_width_gains(df)
        if not gains.empty or not full.empty:
            swept = [r for r in found if r.df["case"].map(_swept).any()]
            costs = [c for c in map(engine_records.run_host_us, swept) if c is not None]
            panels.append((gpu, df, gains, (min(costs), max(costs)) if costs else None, full))
    if not panels:
        print("no width sweep recorded yet: on a GPU box, bash scripts/engine_gpu.sh --scenario "
              "01-llama-width")
        return
    fig, axes = plots.figure(ncols=len(panels), sharey=True, width=1.6 + 5.6 * len(panels),
                             height=4.2)
    axes = axes[0] if len(panels) > 1 else [axes]
    for i, (ax, (gpu, df, gains, cost, full)) in enumerate(zip(axes, panels)):
        both = pd.concat([t[["starts", "tokens"]] for t in (gains, full) if not t.empty])
        starts, mixed = int(both["starts"].min()), both["starts"].nunique() > 1
        widths = gains["hidden"].nunique()
        for k, (h, g) in enumerate(gains.groupby("hidden")):
            n = int(g["starts"].min())  # widths recorded apart may differ: each says its own
            nudge = 2**(0.05 * (k - (widths - 1) / 2))  # side by side, so the bars do not overlap
            ax.errorbar(
                g["tokens"] * nudge, g["gain"], yerr=abs(g[["lo", "hi"]].T.values - g.gain.values),
                marker="o", capsize=3, elinewidth=0.8,
                label=f"hidden {h}" + (f" ({n} start{'s' if n > 1 else ''})" if mixed else ""))
        # Kimi-K2.5's own widths (1 dense + 1 MoE layer), squares; hollow where the enforced step
        # replayed no graph (beyond the release's capture cap: eager on both sides)
        for (label, n), g in full.groupby(["label", "starts"], sort=False):
            line = ax.errorbar(
                g["tokens"], g["gain"], yerr=abs(g[["lo", "hi"]].T.values - g.gain.values),
                marker="s", ls=":", capsize=3, elinewidth=0.8,
                label=label + (f" ({n} start{'s' if n > 1 else ''})" if mixed else ""))
            eager = g[g["replayed"] == False]  # noqa: E712 - None (no launch pass) is not eager
            ax.plot(eager["tokens"], eager["gain"], "s", mfc="white", mec=line[0].get_color(), ms=7)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="prefill tokens (batch 1)", ylabel="" if i else "pcg-off / piecewise prefill")
        shown = df["case"].map(_swept) | (df["model"].isin(FULL_WIDTH) & (not full.empty))
        rel = ", ".join(sorted(set(df.loc[shown, "release"])))
        how = (f"{engine_stats.STAT_NAMES[STAT]};\nbars: the starts' range"
               if mixed else f"{engine_stats.starts_how(starts, STAT)};\nbars: the starts' range"
               if starts > 1 else "one engine start: no spread measured")
        host = f" · a bare launch {text.span(cost, '{:.1f}')} µs" if cost else ""
        what = ", ".join(
            w for w, t in (("Llama 32 layers", gains), ("Kimi-K2.5 widths", full)) if not t.empty)
        ax.set_title(f"{gpu}{host}\nSGLang {rel} bench_one_batch: {what}\n{how}", fontsize=9)
        tokens = sorted({int(t) for t in both["tokens"]})
        ax.set_xticks(tokens, [str(t) for t in tokens])
    # one legend for every panel's lines (a GPU model may lack the sweep or the full width)
    lines = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    axes[-1].legend(lines.values(), lines.keys(), fontsize=8, loc="center left",
                    bbox_to_anchor=(1.0, 0.5))
    notebook.show_figure(fig)


# -- the rebuild beside the real engine and the PR -------------------------------------------------
def beside_rows(rs, engine) -> list[dict]:
    """How much piecewise graphs buy as the rebuild, the engine and the PR measure it."""
    df = engine_records.frame(engine.shown) if engine else pd.DataFrame()
    pairs = captured_over_off(df) if engine else {}
    lo = min((min(r) for r in pairs.values()), default=128)
    hi = max((max(r) for r in pairs.values()), default=1024)
    found = []  # (source, measures, figure)
    lt = launch_table(rs.first.df).loc[lo:hi] if rs else pd.DataFrame()
    if not lt.empty:
        found.append(
            (f"rebuild ({rs.first.manifest.gpu})", "launches per prefill forward, eager "
             f"→ piecewise (profiler), {lo}–{hi} tokens", f"{text.count(lt['eager launches'])} → "
             f"{text.count(lt['piecewise launches'])}"))
    counts = launch_counts(df)
    variants = {k[:3] for k in counts.index}
    for (model, rel, case), g in (counts.groupby(level=[0, 1, 2]) if variants else []):
        if g.pcg.iloc[0] != "captured" or (model, rel, "pcg-off") not in variants:
            continue
        cap = int(g.cap.iloc[0])  # beyond its largest capture the step runs eager
        tokens = g.index.get_level_values("tokens")
        g = g[tokens <= cap] if cap else g
        off = counts.loc[(model, rel, "pcg-off")].loc[g.index.get_level_values("tokens")]
        found.append(
            (f"SGLang {rel} engine ({model}, {case})", "launches per prefill step, pcg-off → "
             "piecewise (kernels + graph replays; bench_one_batch under the profiler)"
             + (f", up to its largest capture ({cap} tokens)" if tokens.max() > cap > 0 else ""),
             f"{text.count(off.launches)} → {text.count(g.kernels)} + "
             f"{text.count(g.graphs)} graphs"))
    sp = latency_of(rs.first)["speedup"].loc[lo:hi] if rs else pd.Series(dtype=float)
    if not sp.empty:
        found.append((f"rebuild ({rs.first.manifest.gpu})", "eager ÷ piecewise, forward only "
                      f"(CUDA events), 16-layer bf16 decoder, {lo}–{hi} tokens",
                      text.span(sp.values, unit="×")))
    starts = engine_stats.starts_in(df, "prefill") if engine else 1
    for (model, rel, case), r in pairs.items():
        cost = engine_records.host_us(engine, rel, model, case)  # the host that ran it
        spread = [y for x in r.values() for y in x[1:]]
        found.append((f"SGLang {rel} engine ({model}, {case})", "pcg-off ÷ piecewise, whole "
                      f"prefill step (bench_one_batch, dummy weights), {min(r)}–{max(r)} tokens; "
                      f"{engine_stats.timing_source(starts, cost, STAT)}",
                      text.span([x[0] for x in r.values()], unit="×")
                      + (f" (starts {text.span(spread, unit='×')})" if starts > 1 else "")))
    unit, before, after = sglang.PR_BENCHMARK["metrics"]["TTFT"]
    found.append((f"#26382's description ({sglang.PR_BENCHMARK['where']})",
                  f"TTFT before ÷ after on Kimi-K2.5, real weights ({before} {unit} → {after} "
                  f"{unit})", f"{before / after:.2f}×"))
    found = [dict(zip(("source", "measures", "figure"), f)) for f in found]
    return engine_view.missing_rows(rs, engine) + found
