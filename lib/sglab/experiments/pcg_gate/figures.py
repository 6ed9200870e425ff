"""Every figure of notebook 01: the slide's mechanism picture, latency and speed-up per token count, the profiler
timelines."""

from __future__ import annotations

import pandas as pd

from sglab.core import plots
from sglab.core import plots as dg
from sglab.core import plots as tl
from sglab.experiments.pcg_gate import analysis as an
from sglab.experiments.pcg_gate.profile import COPY

SHOWN = ("no_alias", "plain_alias", "property_only", "property_guard")
HOW = {"no_alias": "no .model", "plain_alias": "self.model =\nself.language_model.model",
       "property_only": "@property model", "property_guard": "@property model\n+ __setattr__ guard"}


def mechanism_facts(run=None) -> pd.DataFrame:
    """Per wrapper variant: gate decision and what ends up registered. From the run's gate rows (the measured
    LLM) when it has them, else from the CPU rebuild (the tiny LLM)."""
    if run is not None:
        g = an.gate_table(run.df)
        if not g.empty:
            return g.assign(source="the measured LLM")
    from sglab.experiments.pcg_gate.variants import gate_facts
    from sglab.fixes import pcg_gate as gate

    rows = {}
    for v in SHOWN:
        f = gate_facts(gate.build_wrapper(v), gate.TINY_LM.num_layers)
        rows[v] = {"gate_enabled": int(f["result"].enabled), "lm_keys": f["lm_keys"],
                   "state_dict_keys_after_gate": f["keys_after"], "model_keys_after_gate": f["model_keys_after"]}
    return pd.DataFrame(rows).T.assign(source="the CPU rebuild (2-layer LLM)")


def _write_back(v: str, on: bool, dup: int) -> tuple[str, str]:
    if not on:
        return "not reached", "neutral"
    if v == "plain_alias":
        return "text model already in _modules['model']\n(registered in __init__)", "before"
    if v == "property_guard":
        return "dropped by __setattr__\n(nothing registered)", "kept"
    return ("nn.Module.__setattr__ puts the LLM\nin _modules['model']" if dup else "no duplicate"), \
        ("before" if dup else "kept")


def mechanism(facts: pd.DataFrame | None = None):
    """Kimi-shaped wrapper → the gate's ``hasattr(model, "model")`` → its write-back ``model.model = ...`` → where
    the LLM's weights are registered, one row per variant."""
    facts = mechanism_facts() if facts is None else facts
    fig, ax = dg.canvas(12.0, 5.0, xlim=(0, 12), ylim=(0, 5.0))
    for x, title in ((0.05, "wrapper (.model is …)"), (2.75, "gate: hasattr(wrapper, 'model')"),
                     (5.35, "write-back: wrapper.model = LLM"), (8.45, "state_dict() after the gate")):
        dg.label(ax, x, 4.75, title, fontsize=9)
    for i, v in enumerate(v for v in SHOWN if v in facts.index):
        y = 3.85 - i * 1.1
        f = facts.loc[v]
        on, lm, dup = bool(int(f.gate_enabled)), int(f.lm_keys), int(f.model_keys_after_gate)
        dg.box(ax, 0.05, y, 2.3, 0.75, f"{v}\n{HOW[v]}", color="neutral", fontsize=7.5)
        dg.arrow(ax, (2.4, y + 0.37), (2.75, y + 0.37))
        dg.box(ax, 2.75, y, 2.2, 0.75, "True → PCG on\n(piecewise prefill)" if on else
               "False → 'not a language model'\nPCG off (eager prefill)", color="after" if on else "removed",
               fontsize=7.5)
        dg.arrow(ax, (5.0, y + 0.37), (5.35, y + 0.37))
        text, color = _write_back(v, on, dup)
        dg.box(ax, 5.35, y, 2.7, 0.75, text, color=color, fontsize=7.5)
        dg.arrow(ax, (8.1, y + 0.37), (8.45, y + 0.37))
        dg.box(ax, 8.45, y + 0.4, 3.4, 0.33, f"language_model.*  {lm} keys", color="kept", fontsize=7.5)
        if dup:
            what = "its text model" if v == "plain_alias" else "the LLM"
            dg.box(ax, 8.45, y + 0.02, 3.4, 0.33, f"model.*  {dup} keys ({what} again)", color="before", fontsize=7.5)
        else:
            ax.text(8.5, y + 0.18, "model.*  none", fontsize=7.5, color="#555555", va="center")
    ax.text(0.05, 0.1, f"Key counts from {facts['source'].iloc[0]}. Only the PR's variant (property + guard) passes "
            "the gate and registers the LLM once.", fontsize=8, color="#555555")
    return fig


def latency(shown: list):
    """Prefill latency (median, p10–p90 band) and eager/piecewise per token count, one colour per GPU."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    lats = {an.gpu_short(r): an.latency_table(r.df) for r in shown}
    fig, axes = plots.figure(ncols=2, width=11.5)
    ax, ax2 = axes.flat
    for (gpu, lat), color in zip(lats.items(), plots.CYCLE):
        x = lat.index.values
        for mode, style in (("eager", "s--"), ("piecewise", "o-")):
            ax.plot(x, lat[f"{mode} median ms"], style, color=color, label=f"{gpu} {mode}",
                    mfc="white" if mode == "eager" else color)
            ax.fill_between(x, lat[f"{mode} p10 ms"], lat[f"{mode} p90 ms"], color=color, alpha=0.12)
        ax2.plot(x, lat["speedup"], "o-", color=color, label=f"{gpu} piecewise")
        if "speedup_direct" in lat:
            d = lat["speedup_direct"].dropna()
            ax2.plot(d.index, d.values, "D", color=color, mfc="white", label=f"{gpu} without the copies")
    top = pd.concat([lat["speedup"] for lat in lats.values()], axis=1).max(axis=1)
    for n, b in next(iter(lats.values()))["bucket"].items():
        if b != n:  # padded token counts
            ax2.annotate(f"pad→{b}", (n, top[n]), textcoords="offset points", xytext=(0, 6), ha="center",
                         fontsize=7, color="#555555")
    ax.set(xscale="log", yscale="log", xlabel="prefill tokens (one sequence)", ylabel="prefill latency (ms)",
           title="Prefill latency: eager (dashed) vs piecewise CUDA graphs")
    ax.legend(ncol=2)
    ax2.axhline(1.0, color="#999999", lw=1)
    ax2.set(xscale="log", xlabel="prefill tokens (one sequence)", ylabel="eager / piecewise (median latency)",
            title="Speed-up from passing the gate")
    ax2.legend()
    for a in (ax, ax2):
        a.xaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    plots.caption(fig, shown[0], extra="; ".join([plots.provenance_text(r) for r in shown[1:]] + ["bands: p10–p90"]))
    return fig


def timeline(run, num_tokens: int, variants=("eager", "piecewise", "piecewise_direct")):
    """The traced prefill at ``num_tokens``: one swim-lane group per variant, the hand-off copies highlighted."""
    ev = run.sidecar("events")
    ev = ev[ev.num_tokens == num_tokens]
    tables = {v: tl.window(ev[ev.variant == v]) for v in variants if (ev.variant == v).any()}
    fig = tl.timeline(tables, highlight=COPY, highlight_label="hand-off copies",
                      categories=("kernel", "memcpy", "memset", "runtime"),
                      title=f"One prefill of {num_tokens} tokens ({an.gpu_short(run)})")
    plots.caption(fig, run, extra="torch.profiler; each variant from its own first event")
    return fig
