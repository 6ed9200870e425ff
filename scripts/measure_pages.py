"""How a report's pages read in a reader's browser (Chromium through Playwright, a 1400 x 1000
window): per page its height in screens, its main story's (to the ``## Appendix`` heading) and where
its review card ends. ``python scripts/measure_pages.py REPORTS`` (a layout check for the
workbook's authors; tests/tools/test_report_browser.py holds the pages to it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


SCREEN = (1400, 1000)  # a reader's window: a page is read in screens of this height
CARD = {"title": "", "bug": "The bug.", "releases": "Releases", "engine": "Real SGLang engine."}
# in a page at the top: where the story ends (the top of the Appendix heading; null without one),
# the page's height, its figures, and where each piece of the review card ends (null: not there)
MEASURE_JS = """labels => {
  const main = document.querySelector('main') || document.body;
  const y = e => e ? e.getBoundingClientRect() : null;
  const app = [...main.querySelectorAll('h2')].find(
    h => h.textContent.trim().startsWith('Appendix'));
  const card = {};
  for (const [k, label] of Object.entries(labels)) {
    const e = label ? [...main.querySelectorAll('strong, b')].find(
      s => s.textContent.trim().startsWith(label))?.closest('p, li, td, div')
      : main.querySelector('h1');
    card[k] = e ? Math.round(y(e).bottom + window.scrollY) : null;
  }
  return {total: document.documentElement.scrollHeight, card,
          figures: main.querySelectorAll('img').length,
          story: app ? Math.round(y(app).top + window.scrollY) : null}; }"""


def chromium() -> str | None:
    """The Chromium to drive: ``$SGLAB_CHROMIUM``, else Debian's, else one on ``PATH``."""
    import shutil

    found = (os.environ.get("SGLAB_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
             shutil.which("chromium-browser"))
    return next((p for p in found if p and Path(p).exists()), None)


def browser(p):
    """Chromium launched through Playwright's ``p`` (``sync_playwright()``), headless."""
    args = ["--disable-gpu", "--disable-background-networking", "--disable-component-update"]
    return p.chromium.launch(executable_path=chromium(),
                             args=args + (["--no-sandbox"] if os.geteuid() == 0 else []))


def measure_page(page, path: Path) -> dict:
    """One report page opened in ``page`` (a Playwright page of :data:`SCREEN`) and measured in
    pixels: ``total``, ``story`` (to the Appendix heading) and ``card`` (each piece's bottom), and
    its ``figures`` (images)."""
    page.goto(path.resolve().as_uri())
    return {"page": path.stem, **page.evaluate(MEASURE_JS, CARD)}


def measure(folder: Path) -> list[dict]:
    """Every notebook page of a report folder, measured (:func:`measure_page`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = browser(p)
        page = b.new_page(viewport=dict(zip(("width", "height"), SCREEN)))
        out = [measure_page(page, f) for f in sorted(folder.glob("[0-9][0-9]_*.html"))]
        b.close()
    return out


def measured_line(m: dict) -> str:
    """``03_breakable_graph  14.2 screens, story 7.3 · card ends at 612 px``."""
    screen = SCREEN[1]
    story = f"story {m['story'] / screen:.1f}" if m["story"] is not None else "no Appendix"
    ends = [v for v in m["card"].values() if v is not None]
    card = (f"card ends at {max(ends)} px" if len(ends) == len(CARD) else
            "card: " + ", ".join(k for k, v in m["card"].items() if v is None) + " not found")
    return f"{m['page']:<22} {m['total'] / screen:5.1f} screens, {story} · {card}"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python scripts/measure_pages.py REPORTS_FOLDER", file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("playwright is not installed (pip install -e '.[browser]')", file=sys.stderr)
        return 2
    if chromium() is None:
        print("no Chromium found (apt-get install chromium, or set SGLAB_CHROMIUM)",
              file=sys.stderr)
        return 2
    for m in measure(Path(argv[0])):
        print(measured_line(m))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
