"""The published report: ``sglab run`` executes notebooks headless and writes a self-contained ``reports/``
folder (executed ``.ipynb``, one offline HTML page per notebook, ``index.html`` and ``index.json``).

- :mod:`.pages`: an executed notebook → its HTML page;
- :mod:`.index`: the index, one card per notebook (claim, headline, verdict, live time, status, first figure);
- :mod:`.timings`: per-cell wall times grouped into phases, saved as a ``workbook`` run (``sglab run --timings``).
"""

from __future__ import annotations

from pathlib import Path

from . import index, pages, timings
from .index import write_index


def run_notebooks(paths: list[Path], out: Path, *, params: dict | None = None, cell_timeout: int = 900,
                  html_pages: bool = True, env_rows=None, progress=print) -> list:
    """Execute ``paths`` one after another into ``out``; return the :class:`sglab.nbtools.Result` list.

    A failed or interrupted notebook still gets its partial executed notebook and page; the index says what
    happened to each. A run stopped by Ctrl-C or SIGTERM stops here (with the report of what ran)."""
    import nbformat

    from .. import nbtools

    out.mkdir(parents=True, exist_ok=True)
    html_exporter = pages.exporter() if html_pages else None
    results = []
    for i, p in enumerate(paths, 1):
        progress(f"[{i}/{len(paths)}] {p.name} …")
        r = nbtools.execute(p, cell_timeout=cell_timeout, params=params, partial_dir=out)
        nbformat.write(r.nb, out / p.name)
        status = f"{r.status} · {r.mode} · {r.seconds:.1f} s"
        if html_pages:
            pages.write_page(r.nb, out / f"{p.stem}.html", title=pages.notebook_title(r.nb, p.stem), status=status,
                             html_exporter=html_exporter)
        err = r.error if len(r.error) < 700 else f"{r.error[:400]} … {r.error[-250:]}"
        progress(f"      {status}" + (f"\n      {err}" if err else ""))
        results.append(r)
        if r.stopped_by_signal:  # Ctrl-C or SIGTERM: the report of what ran, then stop
            progress(f"stopped: {len(paths) - i} notebook(s) not run")
            break
    if env_rows is None:
        from ..cli import env_report

        env_rows = env_report()
    write_index(results, out, env_rows)
    return results


__all__ = ["index", "pages", "timings", "run_notebooks", "write_index"]
