"""The report as a reader's browser shows it (Chromium, 1400 x 1000): one ``sglab run`` of every
notebook in recorded mode, then each fix notebook's page opened and measured. Its first screen holds
the review card (title, the bug, the releases, the real engine's answer), and its main story, from
the top to the Appendix heading, is at most 12 screens; the code switch shows the inputs and the
"Out[n]:" prompts. Skips without Chromium or Playwright, as tests/tools/test_browser.py does (fails
in CI)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglab.tools import fixes


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import measure_pages as pages  # noqa: E402


pytestmark = pytest.mark.long(120)

ROOT = Path(__file__).resolve().parents[2]
FIX_PAGES = tuple(f.stem for f in fixes.FIXES)
STORY_SCREENS = 12
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing() -> str | None:
    if pages.chromium() is None:
        return "no Chromium found (apt-get install chromium, or set SGLAB_CHROMIUM)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[browser]')"
    return None


@pytest.fixture(scope="module")
def report(recorded_report):
    """The session's one `sglab run` of every notebook, recorded mode
    (:mod:`tests.recorded_report`): (folder, the run's output)."""
    why = _missing()
    if why:
        if IN_CI:
            pytest.fail(f"browser test cannot run in CI: {why}")
        pytest.skip(why)
    return recorded_report


@pytest.fixture(scope="module")
def browser_page(report):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = pages.browser(p)
        yield b.new_page(viewport=dict(zip(("width", "height"), pages.SCREEN)))
        b.close()


@pytest.fixture(scope="module")
def measured(report, browser_page) -> dict:
    folder, _ = report
    return {
        stem: pages.measure_page(browser_page, folder / f"{stem}.html")
        for stem in FIX_PAGES if (folder / f"{stem}.html").exists()
    }


def _numbers(m: dict) -> str:
    card = ", ".join(f"{k} {v if v is not None else 'not found'}" for k, v in m["card"].items())
    story = f"{m['story']} px" if m["story"] is not None else "no Appendix heading"
    return (f"story {story} (limit {STORY_SCREENS * pages.SCREEN[1]}), page {m['total']} px; "
            f"first screen, bottoms: {card} (limit {pages.SCREEN[1]})")


@pytest.mark.parametrize("stem", FIX_PAGES)
def test_the_first_screen_holds_the_card_and_the_story_fits_12_screens(report, measured, stem):
    folder, said = report
    assert stem in measured, f"{stem}: no page in the report\n{said}"
    m = measured[stem]
    ran = next((ln.strip() for ln in said.splitlines() if f"{stem}.ipynb:" in ln), "")
    line = f"{stem}: {_numbers(m)} [{ran}]"
    below = [k for k, v in m["card"].items() if v is None or v > pages.SCREEN[1]]
    assert not below, f"{line}: not on the first screen: {', '.join(below)}"
    assert m["story"] is not None and m["story"] <= STORY_SCREENS * pages.SCREEN[1], line
    assert m["figures"], f"{line}: no figure drawn (a figure printed as text?)"


def test_the_switch_shows_the_code_and_never_the_parameters(report, browser_page):
    folder, _ = report
    page = browser_page
    page.goto((folder / f"{FIX_PAGES[0]}.html").resolve().as_uri())
    shown = ("() => [...document.querySelectorAll('.jp-CodeCell .jp-Cell-inputWrapper')]"
             ".filter(e => e.offsetParent !== null).length")
    params = ("() => [...document.querySelectorAll('.celltag_parameters')]"
              ".filter(e => e.offsetParent !== null).length")
    prompts = ("() => [...document.querySelectorAll('.jp-OutputPrompt')].filter(e => "
               "/^Out\\[/.test(e.textContent.trim()) && e.offsetParent !== null && "
               "getComputedStyle(e).visibility !== 'hidden').length")
    assert page.evaluate(shown) == 0 and page.evaluate(prompts) == 0
    page.get_by_role("button", name="show code").click()
    assert page.evaluate(shown) > 0 and page.evaluate(params) == 0 and page.evaluate(prompts) > 0
    page.get_by_role("button", name="hide code").click()
    assert page.evaluate(shown) == 0 and page.evaluate(prompts) == 0


def test_the_measuring_command_prints_each_page(report):
    folder, _ = report
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "measure_pages.py"),
         str(folder)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split()[0] for ln in lines
            ] == sorted(x.stem for x in folder.glob("[0-9][0-9]_*.html"))
    assert all(" screens, " in ln for ln in lines)
    bad = subprocess.run([sys.executable,
                          str(ROOT / "scripts" / "measure_pages.py"), "/no/such"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage:")
