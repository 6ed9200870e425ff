"""An executed notebook and its offline page: what each worker of ``sglab run`` does with one
notebook (execute it, save the executed copy, render its HTML page), and how it stops when its
parent is gone. Kept apart from the report's index so that a worker process starts without the
fixes, their claims and their imports (pandas, torch)."""

from __future__ import annotations

import html
import os
import re
import signal
from functools import lru_cache
from pathlib import Path

from sglab.tools import nbtools


TEMPLATES = Path(__file__).with_name("templates")
_H1 = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.M)


def status_line(r) -> str:
    """What happened to one notebook, e.g. "ok · recorded · 7.8 s"."""
    return f"{r.status} · {r.mode} · {r.seconds:.1f} s"


@lru_cache(maxsize=1)
def _exporter():
    return exporter()  # reading the templates once per process


def run_one(p: Path, out: Path, params: dict | None, cell_timeout: int, html_pages: bool):
    """Execute one notebook and write its executed copy and page (in a worker process when
    several run at a time); ``None`` in a worker whose run was stopped before this one started."""
    import nbformat

    if _FLAGS is not None and (_FLAGS / STOPPED).exists():
        return None
    r = nbtools.execute(p, cell_timeout=cell_timeout, params=params, partial_dir=out)
    nbformat.write(r.nb, out / p.name)
    if html_pages:
        write_page(r.nb, out / f"{p.stem}.html", title=notebook_title(r.nb, p.stem),
                   status=status_line(r), html_exporter=_exporter())
    return r


# a signal that reached the whole group has each worker's notebook stopping at once; this long
# without a report, the parent tells the workers itself
STOP_GRACE_S = 5.0
STOPPED = "stopped"  # a file of this name in the run's flag folder: the run was stopped
_FLAGS: Path | None = None  # in a worker: the run's flag folder (:func:`worker_init`)


def worker_init(parent: int, flags: str) -> None:
    """A worker's initializer: keep the run's flag folder (a file :data:`STOPPED` there: no further
    notebook starts here), and watch the parent from a thread: once it is gone, stop this worker's
    notebook as SIGTERM does (its kernel shut down) and exit, since its result could only block on
    a pipe that no one reads."""
    import shutil
    import threading
    import time

    global _FLAGS
    _FLAGS = Path(flags)

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        shutil.rmtree(flags, ignore_errors=True)  # the parent can no longer remove it
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="sglab-exit-with-parent", daemon=True).start()


def notebook_title(nb, fallback: str) -> str:
    """The first ``# heading`` of the first markdown cell that has one (markdown markup stripped),
    else ``fallback`` (the file stem)."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        m = _H1.search(cell.source)
        if m:
            return re.sub(r"[`*]", "", m.group(1)).strip()
    return fallback


def exporter():
    """An HTMLExporter on the ``sglab`` template (built once per report: building it reads the
    templates)."""
    from nbconvert import HTMLExporter

    return HTMLExporter(extra_template_basedirs=[str(TEMPLATES)], template_name="sglab")


def render(nb, *, title: str, status: str = "", html_exporter=None) -> str:
    """The page of an executed notebook; ``status`` (e.g. "ok · recorded · 7.8 s") goes into the top
    bar."""
    exp = html_exporter or exporter()
    body, _ = exp.from_notebook_node(
        nb, resources={"metadata": {"name": title}, "sglab_title": title, "sglab_status": status})
    return body


def write_page(nb, path: Path, *, title: str, status: str = "", html_exporter=None) -> Path:
    """Write the page; a notebook nbconvert cannot render still gets a page that says why (and links
    back)."""
    try:
        body = render(nb, title=title, status=status, html_exporter=html_exporter)
    except Exception as e:  # noqa: BLE001 - one broken page must not lose the rest of the report
        body = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<p><a href='index.html'>← sglab report index</a></p><h1>{html.escape(title)}</h1>"
                f"<p>HTML export failed: {html.escape(f'{type(e).__name__}: {e}')}</p>")
    path.write_text(body, encoding="utf-8")
    return path
