"""JupyterLab in a real browser: every notebook opens from the file browser's listing (each notebook
once), runs every cell with no error or stderr output, draws its plots, keeps wide outputs
scrollable, and a save after the session leaves both files of each pair exactly as committed.
Screenshots go to reports/screenshots/.

Drives Debian's Chromium (``apt-get install chromium``) through Playwright (``pip install -e
.[browser]``). Without them the test skips, saying what is missing; in CI (``CI=true``) a missing
browser is a failure.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


pytestmark = pytest.mark.long(90)

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "reports" / "screenshots"
NOTEBOOKS = tuple(sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
SHOT_SECTION = "Real SGLang"  # a screenshot of each notebook there (00: "The notebooks")
CHROMIUM = next(
    (p for p in (os.environ.get("SGLAB_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")) if p and Path(p).exists()), None)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LAB_SETTINGS = {  # every cell rendered (no virtual scrolling), no news pop-up over the screenshots
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": '{"fetchNews": "false"}',
}


def _missing() -> str | None:
    if CHROMIUM is None:
        return "no Chromium found (apt-get install chromium, or set SGLAB_CHROMIUM)"
    for mod, extra in (("playwright", "browser"), ("jupyterlab", "lab")):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed (pip install -e '.[{extra}]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server with the workbook's settings on a copy of the notebooks (a failing test
    must not leave the checkout's notebooks changed); yields (url, token, folder)."""
    why = _missing()
    if why:
        if IN_CI:
            pytest.fail(f"browser test cannot run in CI: {why}")
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("lab")
    folder = tmp / "notebooks"
    folder.mkdir()
    for stem in NOTEBOOKS:
        for ext in (".py", ".ipynb"):
            shutil.copy(ROOT / "notebooks" / f"{stem}{ext}", folder)
    shutil.copy(ROOT / "jupytext.toml", folder)
    for rel, text in LAB_SETTINGS.items():
        (tmp / "settings" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "settings" / rel).write_text(text)
    token, port = secrets.token_hex(16), _free_port()
    # the kernel's own inline backend, as a user
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["SGLAB_REAL"] = "auto"  # the real sections as a reader sees them: the recording
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "lib"), env.get("PYTHONPATH",
                                                               "")]).rstrip(os.pathsep),
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    cmd = [
        sys.executable, "-m", "jupyterlab", f"--config={ROOT / 'jupyter_server_config.py'}",
        "--ip=127.0.0.1", f"--port={port}", "--no-browser", f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        str(folder)
    ] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = open(tmp / "lab.log", "w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, token, server, tmp / "lab.log")
        yield url, token, folder, tmp / "lab.log"
    finally:
        # SIGTERM: jupyter_server stops at once and shuts its kernels down (a SIGINT asks for a
        # confirmation first where its stdin is a terminal)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def _wait_until_up(url, token, server, log: Path) -> None:
    deadline = time.time() + 90
    while time.time() < deadline:
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within 90 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def app(lab):
    """One JupyterLab page, as a reader keeps one open: each notebook is opened from its listing,
    run, saved and closed in turn (booting the app once, not once per notebook, saves about 4 s of
    browser CPU per notebook). Yields (page, console errors so far)."""
    from playwright.sync_api import sync_playwright

    url, token, _, _ = lab
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = b.new_page(viewport={"width": 1440, "height": 900})
        console = []
        page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
        page.goto(f"{url}/lab/workspaces/sglab-browser-test?reset&token={token}")
        page.wait_for_function("() => window.jupyterapp !== undefined", timeout=120_000)
        # the app as restored, its launcher closed
        page.evaluate("async () => { await window.jupyterapp.restored; "
                      "await window.jupyterapp.commands.execute('application:close-all'); }")
        yield page, console
        b.close()


KERNEL_IDLE = ("() => window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel"
               "?.status === 'idle'")
ALL_RAN = """() => { const nb = window.jupyterapp.shell.currentWidget;
  const code = nb.content.widgets.filter(c => c.model.type === 'code');
  return code.every(c => c.model.executionCount !== null)
    && nb.sessionContext.session.kernel.status === 'idle'; }"""
IMAGES = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output img')).map(i => {
  const r = i.getBoundingClientRect();
  return [i.naturalWidth, i.naturalHeight, r.width, r.height]; })"""
CUT_OFF = """() => { const cut = [];
  // outputs wider than their area with nothing that scrolls them
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    const right = area.getBoundingClientRect().right;
    for (const el of area.querySelectorAll('table, pre, img')) {
      if (el.getBoundingClientRect().right <= right + 1) continue;
      let a = el.parentElement, scrolls = false;
      while (a && !scrolls && a !== area.parentElement) {
        scrolls = ['auto', 'scroll'].includes(getComputedStyle(a).overflowX); a = a.parentElement; }
      if (!scrolls) cut.push(el.tagName + ': ' + el.textContent.slice(0, 80));
    } }
  return cut; }"""
ERRORS = """() => Array.from(document.querySelectorAll(
  '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], '
  + '.jp-OutputArea-output.jp-mod-error'
)).map(e => e.textContent.slice(0, 1500))"""

SHOWN = "name => window.jupyterapp.shell.currentWidget?.context?.path === name"
# a notebook left open by a failed test is closed unsaved, so that the next one starts clean
CLOSE = """name => { const w = window.jupyterapp.shell.currentWidget;
  if (!w || w.context?.path !== name) return;
  w.context.model.dirty = false;
  return window.jupyterapp.commands.execute('application:close'); }"""
# the notebook's kernel is shut down, then its tab closed
SHUT = """async () => { const w = window.jupyterapp.shell.currentWidget;
  await w.sessionContext.shutdown();
  await window.jupyterapp.commands.execute('application:close'); }"""


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_notebook_runs_in_jupyterlab(lab, app, stem):
    url, token, folder, log = lab
    page, console = app
    console.clear()
    committed = {ext: (folder / f"{stem}{ext}").read_bytes() for ext in (".py", ".ipynb")}
    name = f"{stem}.ipynb"
    try:
        page.wait_for_function(
            "name => Array.from(document.querySelectorAll('.jp-DirListing-itemText')).some(e => "
            "e.textContent.trim() === name)", arg=name, timeout=30_000)
        listed = page.locator(".jp-DirListing-itemText").all_inner_texts()
        assert sorted(n for n in listed if n[:2].isdigit()) == [f"{s}.ipynb" for s in NOTEBOOKS]
        # opened as a reader opens it: a double click on its name in the file browser
        page.locator(".jp-DirListing-itemText", has_text=name).dblclick()
        page.wait_for_function(SHOWN, arg=name, timeout=60_000)
        page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(ALL_RAN, timeout=300_000, polling=500)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate(
            "name => Array.from(document.querySelectorAll('.jp-MarkdownOutput h2'))"
            ".find(h => h.textContent.startsWith(name)).scrollIntoView()",
            "The notebooks" if stem == "00_start_here" else SHOT_SECTION)
        page.screenshot(path=str(SHOTS / f"{stem}-section.png"))
        errors = page.evaluate(ERRORS)
        assert not errors, (
            f"{stem}: a cell shows an error or stderr output:\n" + "\n---\n".join(errors))
        images = page.evaluate(IMAGES)
        if stem != "00_start_here":  # 00 is tables only
            assert images, f"{stem}: no plot rendered"
        assert all(w > 0 and h > 0 and rw > 0 and rh > 0 for w, h, rw, rh in images), images
        if images:
            page.locator(".jp-OutputArea-output img").first.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / f"{stem}-figure.png"))
        assert page.evaluate(CUT_OFF) == [], f"{stem}: outputs cut off on the right"
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty",
                               timeout=30_000)
        page.evaluate(SHUT)
        page.wait_for_function(f"() => !({SHOWN})({name!r})", timeout=30_000)
    finally:
        page.evaluate(CLOSE, name)
    for ext, data in committed.items():
        assert (folder / f"{stem}{ext}").read_bytes() == data, f"the session changed {stem}{ext}"
    assert not [c for c in console if "Failed to load resource" not in c], console
    assert "without encryption" not in log.read_text(), "a lab kernel runs over TCP"
