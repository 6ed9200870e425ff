"""An executed notebook and its offline page: what each worker of ``sglab run`` does with one
notebook, and how it stops; apart from the report's index, so that a worker starts without the
fixes' imports."""

from __future__ import annotations

import contextlib
import html
import os
import pickle
import re
import shutil
import signal
import threading
import time
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from sglab.core import procs
from sglab.tools import nbtools


TEMPLATES = Path(__file__).with_name("templates")
_H1 = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.M)
_H2 = re.compile(r"^ {0,3}##[ \t]+\S")
APPENDIX = "Appendix"  # the heading the main story ends at; what follows is the appendix
FILES = "files"  # the report's copies of the data/ files its pages link (a Perfetto trace, say)
_HREF = re.compile(r"""\bhref=(["'])([^"']*)\1""")
_MD_LINK = re.compile(r"\]\(()([^)\s]+)\)")  # a markdown link's target (the executed .ipynb's)


def status_line(r) -> str:
    """What happened to one notebook, e.g. "ok · recorded · 7.8 s"."""
    return f"{r.status} · {r.mode} · {r.seconds:.1f} s"


def run_one(p: Path, out: Path, params: dict | None, cell_timeout: int, html_pages: bool,
            kernel_dir: str | None = None):
    """Execute one notebook and write its executed copy and page (in a worker of `sglab run`)."""
    import nbformat

    r = nbtools.execute(p, cell_timeout=cell_timeout, params=params, partial_dir=out,
                        kernel_dir=kernel_dir)
    relink_notebook(r.nb, out, p.parent)
    nbformat.write(r.nb, out / p.name)
    page, title, name = out / f"{p.stem}.html", notebook_title(r.nb, p.stem), html.escape(p.name)
    if html_pages and nbtools.stop_requested():  # a stopped run: what happened, and the notebook
        body = (f"<p>{html.escape(status_line(r))}</p><pre>{html.escape(r.error)}</pre>"
                f"<p>The executed part: <a href='{name}'>{name}</a></p>")
        page.write_text(_plain_page(title, body), encoding="utf-8")
    elif html_pages:
        write_page(r.nb, page, title=title, status=status_line(r), linked_from=p.parent)
    return r


def _plain_page(title: str, body: str) -> str:
    """A page without nbconvert: the title, a link back to the index, then ``body``."""
    return (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<p><a href='index.html'>← sglab report index</a></p><h1>{html.escape(title)}</h1>" + body)


# what a worker process runs (``python -c`` JOB SGLAB_FOLDER): a stop signal that comes while it
# imports is noted from its first line on
WORKER = (
    "import signal, sys\nnoted = []\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(s, lambda n, _f: noted.append(n))\nsys.path.insert(0, sys.argv[2])\n"
    "from sglab.tools.pages import worker\nsys.exit(worker(sys.argv[1], noted))")
STOP_GRACE_S = 5.0  # a worker asked to stop has this long to report; then its parent kills it


def worker(job: str, noted: tuple = ()) -> int:
    """A worker process of `sglab run`: one notebook (:func:`run_one`), its Result pickled."""
    spec = pickle.loads(Path(job).read_bytes())
    nbtools.stop_on_signals(noted)

    def watch():  # its parent gone: its kernel stopped, the partial run still reported
        while os.getppid() == spec["parent"]:
            time.sleep(0.5)
        shutil.rmtree(spec["folder"], ignore_errors=True)  # the parent can no longer remove it
        seen = procs.descendants(os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        procs.stop_seen(seen + procs.descendants(os.getpid()), grace=1.0)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="sglab-exit-with-parent", daemon=True).start()
    result = Path(spec["result"])
    r = None
    if not nbtools.stop_requested():
        result.with_suffix(".started").touch()
        r = run_one(spec["notebook"], spec["out"], spec["params"], spec["cell_timeout"],
                    spec["html_pages"], spec["folder"])
    tmp = result.with_name(f".{result.name}")
    try:
        tmp.write_bytes(pickle.dumps(r))
        os.replace(tmp, result)
    except OSError:  # the parent is gone, and its folder with it
        return 1
    return 0


def notebook_title(nb, fallback: str) -> str:
    """The first markdown cell's first ``# heading`` (its markup stripped), else ``fallback``."""
    heads = (_H1.search(c.source) for c in nb.cells if c.cell_type == "markdown")
    m = next(filter(None, heads), None)
    return re.sub(r"[`*]", "", m.group(1)).strip() if m else fallback


def contents(nb) -> dict:
    """The ``##`` headings as ``(anchor, text)``: ``main``, ``appendix`` (or None), ``more``."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    toc: dict = {"main": [], "appendix": None, "more": []}
    for cell in nb.cells:
        fence = False
        for line in cell.source.splitlines() if cell.cell_type == "markdown" else ():
            fence ^= line.lstrip().startswith(("```", "~~~"))
            if fence or not _H2.match(line):
                continue
            h = markdown2html_mistune(line.strip())
            anchor = re.search(r'id="([^"]*)"', h)
            text = html.unescape(re.sub(r"<[^>]+>", "", h.split("<a class=", 1)[0])).strip()
            entry = (html.unescape(anchor.group(1)) if anchor else "", text)
            if toc["appendix"] is None and text.startswith(APPENDIX):
                toc["appendix"] = entry
            else:
                toc["more" if toc["appendix"] else "main"].append(entry)
    return toc


@lru_cache(maxsize=1)
def exporter():
    """The HTMLExporter on the ``sglab`` template, built once per process."""
    from nbconvert import HTMLExporter

    return HTMLExporter(extra_template_basedirs=[str(TEMPLATES)], template_name="sglab")


def write_page(nb, path: Path, *, title: str, status: str = "",
               linked_from: Path | None = None) -> Path:
    """Write the page of an executed notebook, ``status`` and :func:`contents` in its top bar."""
    try:
        body, _ = exporter().from_notebook_node(
            nb, resources=dict(metadata={"name": title}, sglab_title=title, sglab_status=status,
                               sglab_toc=contents(nb)))
    except Exception as e:  # noqa: BLE001 - one broken page must not lose the rest of the report
        body = _plain_page(title,
                           f"<p>HTML export failed: {html.escape(f'{type(e).__name__}: {e}')}</p>")
    if linked_from is not None:
        body = copy_linked_files(body, path.parent, Path(linked_from))
    path.write_text(body, encoding="utf-8")
    return path


def _relink(text: str, target, links: re.Pattern = _HREF) -> str:
    """``text``, each link relative to its page pointed at ``target(path)`` (None: as it was)."""

    def sub(m: re.Match) -> str:
        q, parts = m.group(1), urlsplit(html.unescape(m.group(2)))
        relative = parts.path and not (parts.scheme or parts.netloc or parts.path.startswith("/"))
        new = target(unquote(parts.path)) if relative else None
        if new is None:
            return m.group(0)
        new = f"{quote(new)}{f'#{parts.fragment}' if parts.fragment else ''}"
        return f"href={q}{html.escape(new)}{q}" if links is _HREF else f"]({new})"

    return links.sub(sub, text)


def copy_linked_files(text: str, folder: Path, linked_from: Path, links: re.Pattern = _HREF) -> str:
    """``text``, its links to files of ``data/`` pointed at copies in ``folder``/:data:`FILES`."""
    from sglab.core.runs import repo_root

    data = repo_root().resolve() / "data"

    def local(path: str) -> str | None:
        source = Path(os.path.normpath(linked_from.resolve() / path))
        if not source.is_relative_to(data) or not source.is_file():
            return None
        rel = source.relative_to(data).as_posix()
        try:
            _copy(source, folder / FILES / rel)
        except OSError:  # the link as it was, rather than no page
            return None
        return f"{FILES}/{rel}"

    return _relink(text, local, links)


def relink_notebook(nb, folder: Path, linked_from: Path) -> None:
    """The executed copy's links (markdown and HTML, cells and outputs) as its page's."""
    for cell in nb.cells:
        texts = [(cell, "source")] if cell.cell_type == "markdown" else []
        texts += [(o.data, m) for o in cell.get("outputs", [])
                  for m in ("text/markdown", "text/html") if m in o.get("data", {})]
        for holder, key in texts:
            for links in (_MD_LINK, _HREF):
                holder[key] = copy_linked_files(holder[key], folder, linked_from, links)


def _copy(source: Path, target: Path) -> None:
    """``source`` copied whole to ``target``, unless that is its copy already (size and time)."""
    with contextlib.suppress(OSError):
        have, want = target.stat(), source.stat()
        if (have.st_size, have.st_mtime_ns) == (want.st_size, want.st_mtime_ns):
            return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copy2(source, tmp)
    os.replace(tmp, target)


def link_pages(folder: Path, written: list[Path]) -> None:
    """The ``written`` pages' links to other notebooks of ``folder`` pointed at their pages."""

    def to_page(name: str, page: Path) -> str | None:
        stem = name.removesuffix(".ipynb")
        if "/" in name or not name.endswith(".ipynb") or stem == page.stem:
            return None
        on = (folder / name).is_file() and (folder / f"{stem}.html").is_file()
        return f"{stem}.html" if on else None

    for page in written:
        try:
            text = page.read_text(encoding="utf-8")
        except OSError:
            continue
        linked = _relink(text, lambda name: to_page(name, page))
        if linked != text:  # whole or not at all: a page stopped mid-write is its old self
            tmp = page.with_name(f".{page.name}.{os.getpid()}")
            try:
                tmp.write_text(linked, encoding="utf-8")
                os.replace(tmp, page)
            finally:
                tmp.unlink(missing_ok=True)
