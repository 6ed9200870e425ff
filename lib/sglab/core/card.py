"""A notebook's review card: the answer on its first screen, made from the recorded runs. Each fix
declares its ``CARD`` in ``claims.py``; :func:`parts` adds the releases, the real engine's answer,
then the rebuild's."""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass

from sglab.core import claims as C
from sglab.core.engine_records import per_gpu

# how a reader names a fix's state in a release (sglab.sglang.upstream.STATES)
STATE_WORDS = {
    "absent": "no such code", "before": "affected", "pr-era": "fixed (the PR's code)",
    "changed": "fixed (code since rewritten)", "regressed": "affected again (the fix was lost)",
    "unknown": "undecided"
}


@dataclass(frozen=True)
class Card:
    """What a fix states on its card; ``found``: templates over ``e[...]`` (engine), ``r[...]``."""

    bug: str
    affects: str
    found: tuple = ()


def releases_line(timeline: list[tuple[str, str]]) -> str:
    """Consecutive releases of one state as one range: ``affected 0.5.10–0.5.12.post1 · ...``."""
    runs_ = [(s, [v for v, _ in g]) for s, g in itertools.groupby(timeline, key=lambda t: t[1])]
    return " · ".join(f"{STATE_WORDS.get(s, s)} {vs[0]}" + (f"–{vs[-1]}" if vs[-1] != vs[0] else "")
                      for s, vs in runs_)


def parts(card: Card, fix, claims, rs, engine_rs) -> dict:
    """The card's sentences, each computed, by name (``found``: [(pr, we)])."""
    engine, merged, shown = claims.ENGINE, per_gpu(engine_rs) if engine_rs else [], list(rs)
    ns = dict(e=C.claim_values(engine, merged[0]) if merged else {},
              r=C.claim_values(claims, shown[0]) if shown else {})
    found = [(C._format(pr, ns), C._format(we, ns)) for pr, we in card.found]
    found = [(pr, we) for pr, we in found if pr is not None and we is not None]
    engine_said = (f"{engine.CLAIM} {C.headline(engine, merged, merged)}".strip()
                   if merged else engine_rs.line)
    rebuild_said = f"{claims.CLAIM} " + (C.headline(claims, shown) if shown else f"({rs.line})")
    verdicts = [[C.verdict_line(C.evaluated(m, r), r) for r in got]
                for m, got in ((engine, merged), (claims, shown))]
    return dict(bug=card.bug, affects=card.affects, releases=releases_line(fix.releases(told=True)),
                engine=engine_said, engine_verdicts=verdicts[0], rebuild=rebuild_said,
                rebuild_verdicts=verdicts[1], found=found)


def markdown(p: dict) -> str:
    """The card as markdown, the engine's answer before the rebuild's."""
    lines = [
        f"> **The bug.** {p['bug']}", ">", f"> **Who is affected.** {p['affects']}", ">",
        f"> **Releases** (read from the wheels): {p['releases']}"
    ]
    for key, name in (("engine", "Real SGLang engine"), ("rebuild", "The rebuild")):
        lines += [">", f"> **{name}.** {p[key]}"]
        if p[key + "_verdicts"]:
            lines.append(f"> *{'; '.join(p[key + '_verdicts'])}.*")
    if p["found"]:  # after the quote: a table inside one shows as raw pipes in nbconvert's HTML
        lines += ["", "| the PR says | we found |", "|---|---|"]
        lines += [f"| {cell(pr)} | {cell(we)} |" for pr, we in p["found"]]
    return "\n".join(lines)


def cell(text: str) -> str:
    """``text`` as one cell of a markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def html_card(p: dict) -> str:
    """The same card as HTML, for the report's index."""
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td></tr>" for a, b in p["found"])
    return (
        f"<p><b>The bug.</b> {esc(p['bug'])}</p><p><b>Who is affected.</b> "
        f"{esc(p['affects'])}</p><p><b>Releases:</b> {esc(p['releases'])}</p><p><b>Real SGLang "
        f"engine.</b> {esc(p['engine'])}</p><p><b>The rebuild.</b> {esc(p['rebuild'])}</p>"
        + (f"<table><tr><th>the PR says</th><th>we found</th></tr>{rows}</table>" if rows else ""))


def summary(p: dict) -> str:
    """The card as one paragraph, for the README index."""
    return (f"{p['bug']} Releases: {p['releases']}. Real engine: {p['engine']} "
            f"Rebuild: {p['rebuild']}")
