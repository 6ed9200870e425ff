"""The report's index page, ``reports/index.html`` (and ``index.json``): one card per notebook,
its review card (:mod:`sglab.core.card`) or claim, verdict lines, live time, how this run went and
its first figure, then the run's environment. Notebooks an earlier run left keep their cards."""

from __future__ import annotations

import base64
import html
import io
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from sglab.core import runs
from sglab.tools import timings
from sglab.tools.pages import notebook_title


STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
.card{display:flex;gap:1.2em;border-bottom:1px solid #ddd;padding:1em 0}
.card .text{flex:1;min-width:0}
.card h2{font-size:1.15em;margin:0 0 .3em}
.card img{width:360px;max-width:40vw;height:auto;border:1px solid #eee}
.headline{margin:.3em 0}.meta{color:#555;font-size:13px}.ok{color:#1e8449;font-weight:600}
.failed,.interrupted{color:#c0392b;font-weight:600}.live{color:#1f618d;font-weight:600}
.recorded{color:#7d6608;font-weight:600}pre{white-space:pre-wrap;font-size:12px;background:#fbfcfc;
border:1px solid #eee;padding:.5em;max-height:12em;overflow:auto}table{border-collapse:collapse}
td,th{border-bottom:1px solid #eee;padding:.3em .6em;text-align:left;vertical-align:top}
details{margin-top:2em}summary{cursor:pointer;font-weight:600}
.nofig{width:360px;color:#999;font-size:12px}"""


def recorded_facts(stem: str) -> dict:
    """:func:`_facts` of notebook ``stem`` over the recorded runs (read while the notebooks run)."""
    from sglab.tools.fixes import by_stem

    return _facts(by_stem(stem), [])


NO_FACTS = {"card": "", "claim": "", "headline": "", "verdicts": [], "source": ""}


def _facts(entry, live: list) -> dict:
    """A notebook's claim facts over ``live`` runs, else over the recorded ones."""
    source = "measured live in this run" if live else "recorded runs"
    facts = {**NO_FACTS, "claim": entry.claim if entry else "", "source": source}
    if entry is None or not entry.experiment:
        return {**facts, "source": ""}
    try:
        from sglab.core import card as K
        from sglab.tools import fixes

        p = fixes.card(entry.experiment, live)
        facts["card"] = code_spans(K.html_card(p))
        facts["verdicts"] = ([f"real engine: {v}" for v in p["engine_verdicts"]]
                             + [f"rebuild: {v}" for v in p["rebuild_verdicts"]])
    except Exception as e:  # noqa: BLE001 - a claims module must not lose the report
        facts["headline"] = f"headline unavailable: {type(e).__name__}: {e}"
    return facts


def code_spans(page: str) -> str:
    """HTML whose text holds markdown `code` spans (a card's sentences), with them as <code>."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", page)


def inline_markdown(text: str) -> str:
    """Escaped text with its `code` spans as <code> (claims are written in markdown)."""
    return code_spans(html.escape(text))


def card(r, live_time: str, recorded: dict | None = None, earlier: str = "") -> str:
    """The HTML of one notebook's card."""
    from sglab.tools.fixes import by_stem

    entry = by_stem(r.path.stem)
    live = [runs.read_run(p, live=True) for p in timings.live_runs(r)]
    facts = recorded if recorded is not None and not live and entry else _facts(entry, live)
    title = notebook_title(r.nb, r.path.stem) if r.nb is not None else r.path.stem
    png = first_figure(r.nb) if r.nb is not None else None
    fig = (f"<a href='{html.escape(r.path.stem)}.html'><img alt='first figure of "
           f"{html.escape(r.path.stem)}' src='data:image/png;base64,"
           f"{base64.b64encode(thumbnail(png)).decode()}'></a>"
           if png else "<div class='nofig'>no figure</div>")
    verdicts = "".join(
        f"<div class='meta'>verdict: {html.escape(v)}</div>" for v in facts["verdicts"])
    headline = (f"<p class='headline'><b>{inline_markdown(facts['headline'])}</b> "
                f"<small>({facts['source']})</small></p>" if facts["headline"] else "")
    err = f"<pre>{html.escape(r.error[-3000:])}</pre>" if r.error else ""
    link = f"<h2><a href='{html.escape(r.path.stem)}.html'>{html.escape(title)}</a></h2>"
    said = facts["card"] or f"<p>{inline_markdown(facts['claim'])}</p>{headline}"
    when = f"from an earlier run at {html.escape(earlier)}" if earlier else "this run"
    skipped = f" · {r.skipped_gpu_cells} GPU cell(s) skipped" if r.skipped_gpu_cells else ""
    return (f"<div class='card'>{fig}<div class='text'>{link}{said}{verdicts}"
            f"<div class='meta'>live time: {html.escape(live_time)}</div>"
            f"<div class='meta'>{when}: <span class='{r.status}'>{r.status}</span> · <span "
            f"class='{r.mode}'>{r.mode}</span> · {r.seconds:.1f} s{skipped}</div>{err}</div></div>")


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def earlier_entries(out: Path, ran: set) -> list:
    """The entries of an earlier ``out/index.json`` for notebooks not in ``ran``, pages kept."""
    try:
        entries = json.loads((out / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    kept = []
    for e in entries if isinstance(entries, list) else []:
        name = e.get("notebook") if isinstance(e, dict) else None
        if not isinstance(name, str) or name in ran or Path(name).name != name:
            continue
        page = out / f"{Path(name).stem}.html"
        if page.exists():
            kept.append({**e, "ran_utc": e.get("ran_utc") or _stamp(page.stat().st_mtime)})
    return kept


def write_index(results, out: Path, env_rows: list[tuple[str, str]], live_times: dict | None = None,
                recorded: dict | None = None, quick: bool = False) -> Path:
    """Write ``index.html`` and ``index.json`` for ``results`` (and earlier runs' notebooks)."""
    live_times = timings.live_times() if live_times is None else live_times
    ran_at = datetime.now(timezone.utc)
    now = ran_at.strftime("%Y-%m-%d %H:%M UTC")
    run = ran_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # the same for every notebook this run ran
    n_ok = sum(r.status == "ok" for r in results)
    entries = [(r, {
        "notebook": r.path.name, "status": r.status, "mode": r.mode, "seconds": round(r.seconds, 1),
        "live_time": live_times.get(r.path.stem, timings.NOT_RECORDED), "error": r.error[-2000:],
        "ran_utc": _stamp(r.started) if r.started else now, "run_utc": run
    }, "") for r in results]
    earlier = earlier_entries(out, {r.path.name for r in results})
    if earlier:
        entries += [(timings.entry_result(out, e), e, e["ran_utc"]) for e in earlier]
        entries.sort(key=lambda x: x[1]["notebook"])
    recorded = recorded or {}
    cards = "".join(
        card(r, live_times.get(r.path.stem, timings.NOT_RECORDED),
             recorded.get(r.path.stem, NO_FACTS if quick else None), when)
        for r, _, when in entries)
    env = "".join(f"<tr><th>{html.escape(k)}</th><td><pre>{html.escape(v)}</pre></td></tr>"
                  for k, v in env_rows)
    more = f" {len(earlier)} more from earlier runs into this folder." if earlier else ""
    page = (
        f"<!doctype html><html lang='en'><meta charset='utf-8'><title>sglab "
        f"report</title><style>{STYLE}</style><h1>sglab workbook report</h1><p>{now} · "
        f"{n_ok}/{len(results)} notebooks ran cleanly.{more} Mode <b>live</b>: measured on "
        f"this machine; <b>recorded</b>: GPU results shown from committed runs in "
        f"data/recorded/. <i>Live time</i> is each notebook's wall time when run live, from the "
        f"committed workbook timing records (newest per GPU model).</p>" + cards
        + f"<details><summary>Environment of this "
        f"run</summary><table>{env}</table></details></html>")
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    (out / "index.json").write_text(json.dumps([e for _, e, _ in entries], indent=2))
    return path


def first_figure(nb) -> bytes | None:
    """The PNG bytes of the notebook's first figure (first ``image/png`` output), or None."""
    png = next((o["data"]["image/png"] for c in nb.cells
                for o in c.get("outputs", []) if "image/png" in o.get("data", {})), None)
    return None if png is None else base64.b64decode("".join(png) if isinstance(png, list) else png)


def thumbnail(png: bytes, width: int = 360) -> bytes:
    """``png`` scaled down to ``width`` pixels (Pillow comes with matplotlib)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png))
    if img.width > width:
        img = img.resize((width, max(1, round(img.height * width / img.width))), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()
