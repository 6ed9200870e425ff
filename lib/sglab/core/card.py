"""A notebook's review card, its first screen, from the recorded runs: each fix declares its
``CARD`` in ``claims.py``; :func:`parts` adds the releases, the engine's answer, the rebuild's."""

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
    ns = dict(
        e=C.claim_values(engine, merged[0]) if merged else {},
        r=C.claim_values(claims, shown[0]) if shown else {},
        gpu=merged[0].manifest.gpu if merged else None,  # the GPU models e and r were read on
        rgpu=shown[0].manifest.gpu if shown else None)
    found = [(C._format(pr, ns), C._format(we, ns)) for pr, we in card.found]
    found = [(pr, we) for pr, we in found if pr is not None and we is not None]
    said = C.headline(engine, merged, merged) if merged else engine_rs.line
    joint = "\n" if "\n" in said else " "  # a headline of several lines: a list under the claim
    engine_said = f"{engine.CLAIM}{joint}{said}".strip() if merged else said
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
        first, *items = p[key].split("\n")  # its other lines: a list, blank lines around it
        gap = [">"] if items else []
        lines += [">", f"> **{name}.** {first}", *gap, *(f"> - {t}" for t in items)]
        if p[key + "_verdicts"]:
            lines += [*gap, f"> *{'; '.join(p[key + '_verdicts'])}.*"]
    if p["found"]:  # after the quote: a table inside one shows as raw pipes in nbconvert's HTML
        lines += ["", table(["the PR says", "we found"], p["found"])]
    return "\n".join(lines)


def table(header: list[str], rows) -> str:
    """A markdown table, each cell on one line and its pipes escaped."""
    cells = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in [header, *rows]]
    lines = ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])


def html_card(p: dict) -> str:
    """The same card as HTML, for the report's index."""
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td></tr>" for a, b in p["found"])
    first, *items = p["engine"].split("\n")
    listed = "".join(f"<li>{esc(t)}</li>" for t in items)
    return (
        f"<p><b>The bug.</b> {esc(p['bug'])}</p><p><b>Who is affected.</b> "
        f"{esc(p['affects'])}</p><p><b>Releases:</b> {esc(p['releases'])}</p><p><b>Real SGLang "
        f"engine.</b> {esc(first)}</p>{f'<ul>{listed}</ul>' if listed else ''}<p><b>The "
        f"rebuild.</b> {esc(p['rebuild'])}</p>"
        + (f"<table><tr><th>the PR says</th><th>we found</th></tr>{rows}</table>" if rows else ""))


def summary(p: dict) -> str:
    """The card as one table cell, for the README index: a listed engine answer one item a line."""
    first, *items = p["engine"].split("\n")
    engine = "".join([first, *(f"<br>• {t}" for t in items), "<br>" if items else ""])
    return f"{p['bug']} Releases: {p['releases']}. Real engine: {engine} Rebuild: {p['rebuild']}"
