"""A fix's real-engine section, declared (``VIEW`` in its ``show.py``): :func:`section` draws where
the numbers come from, facts per variant, the tables, each timed pair against its A/A control, the
fix's own figure or table, then one verdict line per GPU model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pandas as pd

from sglab.core import claims as C, text
from sglab.core.engine_records import (AGAIN, KEYS, adjustments, by_gpu, frame, host_medians, label,
                                       per_gpu, tools)
from sglab.core.engine_stats import STAT, STAT_NAMES, aa_gap, numbers, ratios, unit_of
from sglab.core.notebook import display, show_figure, show_table


METHODS = "07_how_we_measure.ipynb"


@dataclass(frozen=True)
class Table:
    """``metric`` per variant and per value of ``across`` (cells: median [lowest–highest start])."""

    metric: str
    across: str
    fmt: str = "{:.2f}"


@dataclass(frozen=True)
class Pair:
    """A timed speed-up: ``base`` ÷ every other case of the same model and release."""

    metric: str
    across: str
    base: str
    label: str
    cases: tuple = ()  # the cases compared with base (default: every other case but A/A copies)

    def ratios(self, df: pd.DataFrame, stat: str = STAT) -> dict:
        """:func:`~sglab.core.engine_stats.ratios` of ``base`` ÷ each of its cases."""
        return {
            k: per
            for k, per in ratios(df, self.metric, self.across, self.base, stat).items()
            if not k[2].endswith(AGAIN) and (not self.cases or k[2] in self.cases)
        }


@dataclass(frozen=True)
class EngineView:
    """What a fix's engine section shows (see the module docstring)."""

    what: str = ""  # what ran: the model and its width, TP, the flags that matter
    facts: tuple = ()  # text metrics per (model, release, case): "pcg", "bcg", ...
    tables: tuple = ()  # Table ...
    pairs: tuple = ()  # Pair ...
    figure: Optional[Callable] = None  # frame -> a matplotlib figure
    extra: Optional[Callable] = None  # RunSet -> None: the fix's own table


def header(rs, what: str = "") -> bool:
    """Where the section's numbers come from; False (and the NoRun line) without a run."""
    if not rs:
        print(rs.line)
        return False
    print(f"real SGLang engines, dummy weights{', ' + what if what else ''}, measured by SGLang's "
          f"own {' and '.join(tools(rs))} (recorded: {'; '.join(sorted({label(r) for r in rs}))})")
    if rs.elsewhere:
        print(f"also recorded: {len(rs.elsewhere)} run(s) on "
              f"{'; '.join(sorted({label(r) for r in rs.elsewhere}))}: the tables show one GPU "
              "model; every run is in the methods notebook (07)")
    for line in adjustments(rs):
        print(f"harness adjustment {line}")
    for gpu, got in by_gpu(rs).items():  # one line per GPU model: the span of its host costs
        costs = [c for r in got for c in host_medians(r)]
        if costs:
            print(f"host per-launch cost beside the {gpu} runs: {text.span(costs)} µs "
                  "(before and after each run; per run in the methods notebook, 07)")
    return True


def facts(df: pd.DataFrame, metrics) -> pd.DataFrame:
    """Per (model, release, case): the status, each of ``metrics`` (as recorded) and its run."""
    d = df[df.metric.isin(["status", *metrics])]
    wide = d.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="first")
    wide = wide.reindex(columns=["status", *metrics])
    wide["run"] = d.groupby(KEYS)["run"].first()
    return wide.fillna("").map(text.whole)


def table(df: pd.DataFrame, t: Table) -> pd.DataFrame:
    """``t.metric`` per variant and value of ``t.across``: median [lowest–highest] of the starts."""
    d = numbers(df, t.metric)
    if d.empty:
        return pd.DataFrame()
    d[t.across] = d[t.across].astype(int)
    iqr = numbers(df, f"{t.metric}_iqr")
    spread = {(*k, int(x)): v
              for *k, x, v in iqr[[*KEYS, t.across, "value"]].itertuples(index=False)}
    starts, f = int(d["starts"].max()), t.fmt.format
    if starts > 1:  # the spread that matters: between engine starts, not within one
        cells = zip(d["value"], d["lo"], d["hi"])
        d["cell"] = [f(v) if f(lo) == f(hi) else f"{f(v)} [{f(lo)}–{f(hi)}]" for v, lo, hi in cells]
    else:
        at = zip(d[[*KEYS, t.across]].itertuples(index=False, name=None), d["value"])
        d["cell"] = [f(v) + (f" ({f(spread[k])})" if k in spread else "") for k, v in at]
    wide = d.pivot_table(index=KEYS, columns=t.across, values="cell", aggfunc="first").fillna("")
    unit = unit_of(df, t.metric)
    unit = "" if unit in ("", "fraction") else f" ({unit})"
    if starts > 1:
        kind = f", median [lowest–highest] of {starts} engine starts (one figure: all the same)"
    elif unit.strip(" ()") in ("ms", "s", "µs"):  # a timing of one start says how little it is
        kind = (", median (IQR) of" if spread else ",") + (" one engine start (the spread "
                                                           "between starts is not measured)")
    else:
        kind = ", median (IQR)" if spread else ""
    wide.columns = pd.Index(list(wide.columns), name=f"{t.metric}{unit}{kind} by {t.across}")
    return wide


def pair_table(df: pd.DataFrame, p: Pair, stat: str = STAT) -> pd.DataFrame:
    """``p.base`` ÷ each case per (model, release): the ratio, the starts' widest, the A/A gap."""
    gap = aa_gap(df, p.metric, p.across, stat)
    rows = [{
        "model": model, "release": rel, "pair": f"{p.base} ÷ {case}",
        f"{p.label} ({STAT_NAMES[stat]})": text.span([x[0] for x in per.values()], unit="×"),
        "widest the starts allow": text.span([y for x in per.values() for y in x[1:]], unit="×"),
        "A/A gap": text.pct(gap[(model, rel)], 1) if (model, rel) in gap else ""
    } for (model, rel, case), per in p.ratios(df, stat).items()]
    return pd.DataFrame(rows).set_index(["model", "release", "pair"]) if rows else pd.DataFrame()


def section(view: EngineView, rs, engine_claims=None) -> None:
    """A fix's real-engine section (see the module docstring)."""
    if not header(rs, view.what):
        return
    df = frame(rs.shown)
    if view.facts:
        show_table(facts(df, list(view.facts)))
    for t in view.tables:
        show_table(table(df, t))
    for p in view.pairs:
        show_table(pair_table(df, p))
    if view.figure is not None:
        show_figure(view.figure(df))
    if view.extra is not None:
        view.extra(rs)
    if engine_claims is not None:  # one line per GPU model, on its runs merged
        lines = []
        for r in per_gpu(rs):
            n = len(r.manifest.merged_from) or 1
            lines.append(
                f"{C.verdict_line(C.evaluated(engine_claims, r), r)} ({n} run{'s' * (n > 1)})")
        display(
            None, "\n".join(lines), "**The engine's claims.** " + "; ".join(lines)
            + f". How each number is made to repeat: [07 · how we measure]({METHODS}).")


def missing_rows(rebuild, engine) -> list[dict]:
    """:func:`beside`'s first rows: the NoRun line of the rebuild's runs or the engine's, if any."""
    return [{"source": s, "measures": r.line, "figure": ""}
            for s, r in (("rebuild", rebuild), ("SGLang engine", engine)) if not r]


def beside(rows: list[dict]) -> None:
    """The rebuild's figure beside the real engine's (and the PR's): one row per source."""
    with pd.option_context("display.max_colwidth", None):
        show_table(pd.DataFrame(rows, columns=["source", "measures", "figure"]).set_index("source"))
