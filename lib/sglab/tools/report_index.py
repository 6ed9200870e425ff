"""``reports/index.html``: one card per notebook, then the environment (collapsed).

A card says what a reader opening the report wants first: the claim and its headline number (from
:mod:`sglab.core.claims`, the same source as the README index and the notebooks' first screens), the verdict line of
each run shown, how long the notebook takes live (from the committed workbook timing records), how this run of it
went, and a thumbnail of its first figure. ``index.json`` carries the same facts for scripts.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

from sglab.tools import report_pages as pages, timings

STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
.card{display:flex;gap:1.2em;border-bottom:1px solid #ddd;padding:1em 0}.card .text{flex:1;min-width:0}
.card h2{font-size:1.15em;margin:0 0 .3em}.card img{width:360px;max-width:40vw;height:auto;border:1px solid #eee}
.headline{margin:.3em 0}.meta{color:#555;font-size:13px}.ok{color:#1e8449;font-weight:600}
.failed,.interrupted{color:#c0392b;font-weight:600}.live{color:#1f618d;font-weight:600}
.recorded{color:#7d6608;font-weight:600}pre{white-space:pre-wrap;font-size:12px;background:#fbfcfc;
border:1px solid #eee;padding:.5em;max-height:12em;overflow:auto}table{border-collapse:collapse}
td,th{border-bottom:1px solid #eee;padding:.3em .6em;text-align:left;vertical-align:top}
details{margin-top:2em}summary{cursor:pointer;font-weight:600}.nofig{width:360px;color:#999;font-size:12px}"""


def claim_facts(entry, result=None) -> dict:
    """Claim, headline and verdict lines of a catalog entry: over this report's live runs when the notebook ran
    live (runs written since it started), else over the recorded runs a reader is shown."""
    from sglab.core import claims, runs

    facts = {"claim": entry.claim if entry else "", "headline": "", "verdicts": [], "source": ""}
    if entry is None or not entry.experiment:
        return facts
    exp = entry.experiment
    try:
        live = _live_runs(exp, result)
        shown = live or claims.shown(exp, runs.load_all_recorded(exp))
        facts["source"] = "measured live in this run" if live else "recorded runs"
        facts["headline"] = claims.headline(exp, shown) if shown else "no recorded run yet"
        facts["verdicts"] = [claims.verdict_line(claims.evaluate(exp, r), r) for r in shown]
    except Exception as e:  # noqa: BLE001 - a claims module that cannot read a run must not lose the report
        facts["headline"] = f"headline unavailable: {type(e).__name__}: {e}"
    return facts


def _live_runs(experiment: str, result) -> list:
    from sglab.core import runs

    started = getattr(result, "started", None)
    if result is None or result.mode != "live" or started is None:
        return []
    paths = runs.list_runs(experiment, kind="runs")
    return [runs.read_run(p, live=True) for p in paths if p.stat().st_mtime >= started]


def _card_status(r) -> str:
    skipped = f" · {r.skipped_gpu_cells} GPU cell(s) skipped" if r.skipped_gpu_cells else ""
    return (f"<span class='{r.status}'>{r.status}</span> · <span class='{r.mode}'>{r.mode}</span> · "
            f"{r.seconds:.1f} s{skipped}")


def card(r, live_time: str) -> str:
    """The HTML of one notebook's card."""
    from sglab.tools.catalog import by_stem

    entry = by_stem(r.path.stem)
    facts = claim_facts(entry, r)
    title = pages.notebook_title(r.nb, r.path.stem) if r.nb is not None else r.path.stem
    png = pages.first_figure(r.nb) if r.nb is not None else None
    fig = (f"<a href='{html.escape(r.path.stem)}.html'><img alt='first figure of {html.escape(r.path.stem)}' "
           f"src='{pages.data_uri(pages.thumbnail(png))}'></a>" if png else "<div class='nofig'>no figure</div>")
    verdicts = "".join(f"<div class='meta'>verdict: {html.escape(v)}</div>" for v in facts["verdicts"])
    headline = (f"<p class='headline'><b>{html.escape(facts['headline'])}</b> <small>({facts['source']})</small></p>"
                if facts["headline"] else "")
    err = f"<pre>{html.escape(r.error[-3000:])}</pre>" if r.error else ""
    return (f"<div class='card'>{fig}<div class='text'><h2><a href='{html.escape(r.path.stem)}.html'>"
            f"{html.escape(title)}</a></h2><p>{html.escape(facts['claim'])}</p>{headline}{verdicts}"
            f"<div class='meta'>live time: {html.escape(live_time)}</div>"
            f"<div class='meta'>this run: {_card_status(r)}</div>{err}</div></div>")


def write_index(results, out: Path, env_rows: list[tuple[str, str]], live_times: dict | None = None) -> Path:
    """Write ``index.html`` and ``index.json`` for ``results`` (nbtools.Result, executed notebooks inside)."""
    live_times = timings.live_times() if live_times is None else live_times
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    n_ok = sum(r.status == "ok" for r in results)
    cards = "".join(card(r, live_times.get(r.path.stem, timings.NOT_RECORDED)) for r in results)
    env = "".join(f"<tr><th>{html.escape(k)}</th><td><pre>{html.escape(v)}</pre></td></tr>" for k, v in env_rows)
    page = (f"<!doctype html><html lang='en'><meta charset='utf-8'><title>sglab report</title>"
            f"<style>{STYLE}</style><h1>sglab workbook report</h1><p>{now} · {n_ok}/{len(results)} notebooks ran "
            "cleanly. Mode <b>live</b>: measured on this machine; <b>recorded</b>: GPU results shown from committed "
            "runs in data/recorded/. <i>Live time</i> is each notebook's wall time when run live, from the "
            "committed workbook timing records (newest per GPU model).</p>"
            + cards + f"<details><summary>Environment of this run</summary><table>{env}</table></details></html>")
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    (out / "index.json").write_text(json.dumps(
        [{"notebook": r.path.name, "status": r.status, "mode": r.mode, "seconds": round(r.seconds, 1),
          "live_time": live_times.get(r.path.stem, timings.NOT_RECORDED), "error": r.error[-2000:]}
         for r in results], indent=2))
    return path
