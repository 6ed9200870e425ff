"""The published report: ``sglab run`` executes notebooks headless and writes a self-contained ``reports/``
folder (executed ``.ipynb``, one offline HTML page per notebook, ``index.html`` and ``index.json``).

- :mod:`.pages`: an executed notebook → its HTML page;
- :mod:`.index`: the index, one card per notebook (claim, headline, verdict, live time, status, first figure);
- :mod:`.timings`: per-cell wall times grouped into phases, saved as a ``workbook`` run (``sglab run --timings``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sglab.tools import report_index as index, report_pages as pages, timings
from sglab.tools.report_index import write_index


def default_jobs() -> int:
    """Notebooks run at a time: one where a GPU is visible (live timings must not share the machine), else up to
    two (recorded mode only reads files and draws; the CPU box has two cores)."""
    import os

    from sglab.core import hardware

    return 1 if hardware.has_cuda() else max(1, min(2, os.cpu_count() or 1))


@lru_cache(maxsize=1)
def _exporter():
    return pages.exporter()  # reading the templates once per process


def _one(p: Path, out: Path, params: dict | None, cell_timeout: int, html_pages: bool):
    """Execute one notebook and write its executed copy and page (in a worker process when jobs > 1)."""
    import nbformat

    from sglab.tools import nbtools

    r = nbtools.execute(p, cell_timeout=cell_timeout, params=params, partial_dir=out)
    nbformat.write(r.nb, out / p.name)
    if html_pages:
        pages.write_page(r.nb, out / f"{p.stem}.html", title=pages.notebook_title(r.nb, p.stem), status=_status(r),
                         html_exporter=_exporter())
    return r


def _status(r) -> str:
    return f"{r.status} · {r.mode} · {r.seconds:.1f} s"


def _report(r, progress) -> None:
    err = r.error if len(r.error) < 700 else f"{r.error[:400]} … {r.error[-250:]}"
    progress(f"      {r.path.name}: {_status(r)}" + (f"\n      {err}" if err else ""))


def _result_of(future, path: Path):
    """The worker's result; a worker that died (killed, out of memory) becomes a failed notebook, not a lost run."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool as e:
        import nbformat

        from sglab.tools.nbtools import Result

        return Result(path, "failed", "?", 0.0, f"the worker process running it died: {e}", nb=nbformat.v4.new_notebook())


def _in_parallel(paths, out, params, cell_timeout, html_pages, jobs, progress) -> list:
    """``jobs`` worker processes, each notebook in one; results in the order of ``paths``. Ctrl-C reaches the
    workers too (same process group): each reports its notebook as interrupted, and no further one starts."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    done: dict = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_one, p, out, params, cell_timeout, html_pages): p for p in paths}
        try:
            for f, p in futures.items():
                done[p] = _result_of(f, p)
                _report(done[p], progress)
                if done[p].stopped_by_signal:
                    break
        except KeyboardInterrupt:
            progress("stopped: waiting for the running notebooks to report")
        finally:
            for f in futures:
                f.cancel()
    return [done[p] for p in paths if p in done]


def run_notebooks(paths: list[Path], out: Path, *, params: dict | None = None, cell_timeout: int = 900,
                  html_pages: bool = True, env_rows=None, progress=print, jobs: int | None = None) -> list:
    """Execute ``paths`` into ``out``; return the :class:`sglab.tools.nbtools.Result` list, in the order of ``paths``.

    ``jobs`` notebooks at a time (default :func:`default_jobs`: one on a GPU machine). A failed or interrupted
    notebook still gets its partial executed notebook and page; the index says what happened to each. A run
    stopped by Ctrl-C or SIGTERM stops here (with the report of what ran)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = default_jobs() if jobs is None else max(1, int(jobs))
    if jobs > 1 and len(paths) > 1:
        progress(f"{len(paths)} notebooks, {jobs} at a time …")
        results = _in_parallel(paths, out, params, cell_timeout, html_pages, jobs, progress)
    else:
        results = []
        for i, p in enumerate(paths, 1):
            progress(f"[{i}/{len(paths)}] {p.name} …")
            results.append(_one(p, out, params, cell_timeout, html_pages))
            _report(results[-1], progress)
            if results[-1].stopped_by_signal:  # Ctrl-C or SIGTERM: the report of what ran, then stop
                progress(f"stopped: {len(paths) - i} notebook(s) not run")
                break
    if env_rows is None:
        from sglab.tools.cli import env_report

        env_rows = env_report()
    write_index(results, out, env_rows)
    return results


__all__ = ["default_jobs", "index", "pages", "timings", "run_notebooks", "write_index"]
