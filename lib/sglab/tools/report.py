"""The published report: ``sglab run`` executes notebooks headless and writes a self-contained
``reports/`` folder (executed ``.ipynb``, one offline HTML page per notebook, ``index.html`` and
``index.json``).

- :mod:`.pages`: an executed notebook → its HTML page (what each worker runs);
- here: the index, one card per notebook (claim, headline, verdict, live time, status, first
  figure), and the environment;
- :mod:`.timings`: per-cell wall times grouped into phases, saved as a ``workbook`` run (``sglab run
  --timings``).
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
from importlib import metadata
import json
import os
import signal
from datetime import datetime, timezone
from pathlib import Path

from sglab.core import bytecode, claims, hardware, kernels, procs, runs
from sglab.sglang import upstream
from sglab.sglang.bootstrap import real_release_rows
from sglab.tools import nbtools, pages, timings
from sglab.tools.pages import notebook_title, run_one, status_line

# nbformat, pandas, multiprocessing, the fixes and their claims (torch) are imported where used:
# `sglab run` starts its notebooks without them


def default_jobs() -> int:
    """Notebooks run at a time: one where a GPU is visible (live timings must not share the
    machine), else up to two (recorded mode only reads files and draws; the CPU box has two
    cores)."""

    return 1 if hardware.has_cuda() else max(1, min(2, os.cpu_count() or 1))


def _report(r, progress) -> None:
    err = r.error if len(r.error) < 700 else f"{r.error[:400]} … {r.error[-250:]}"
    progress(f"      {r.path.name}: {status_line(r)}" + (f"\n      {err}" if err else ""))


def _result_of(future, path: Path):
    """The worker's result; a worker that died (killed, out of memory) becomes a failed notebook,
    not a lost run; ``None`` for one a stopped run cancelled before it started."""
    from concurrent.futures import CancelledError
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except CancelledError:
        return None
    except BrokenProcessPool as e:
        import nbformat

        return nbtools.Result(path, "failed", "?", 0.0, f"the worker process running it died: {e}",
                              nb=nbformat.v4.new_notebook())


def _in_parallel(paths, out, params, cell_timeout, html_pages, jobs, progress) -> list:
    """``jobs`` worker processes, each notebook in one; results in the order of ``paths``.

    Ctrl-C or SIGTERM (to the process group, or to this process alone) stops the run: no further
    notebook starts, the running ones are told to stop (each then reports as interrupted and stops
    its kernel), and this process waits for their reports and writes the index. A worker whose
    parent is gone (killed outright) stops its notebook and exits rather than wait forever to send
    a result that no one will read."""
    import multiprocessing as mp
    import tempfile
    from concurrent.futures import ProcessPoolExecutor, wait

    done: dict = {}
    flags = tempfile.TemporaryDirectory(prefix="sglab-run-")
    stopped = Path(flags.name) / pages.STOPPED  # there: a notebook not yet started does not start
    with flags, procs.Guard(watchdog=False), ProcessPoolExecutor(
            max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=pages.worker_init,
            initargs=(os.getpid(), flags.name)) as pool:
        futures = {pool.submit(run_one, p, out, params, cell_timeout, html_pages): p for p in paths}
        try:
            for f, p in futures.items():
                done[p] = _result_of(f, p)
                _report(done[p], progress)
                if done[p].stopped_by_signal:
                    break
        except (KeyboardInterrupt, procs.Terminated):
            progress("stopped: waiting for the running notebooks to report")
        finally:
            stopped.touch()
            workers = [w.pid for w in (getattr(pool, "_processes", None) or {}).values()]
            for f in futures:
                f.cancel()  # those not queued to a worker yet
        left = {f: p for f, p in futures.items() if p not in done and not f.cancelled()}
        if wait(left, timeout=pages.STOP_GRACE_S).not_done:  # the signal reached only us
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for f, p in left.items():
            r = _result_of(f, p)
            if r is not None:  # None: it had not started
                done[p] = r
                _report(r, progress)
    # the spawn context's resource tracker: stopped and waited for here, so no process of ours
    # outlives the command (left to exit at interpreter shutdown, it ends as an orphan)
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._stop()
    if len(done) < len(paths):
        progress(f"stopped: {len(paths) - len(done)} notebook(s) not run")
    return [done[p] for p in paths if p in done]


def run_notebooks(paths: list[Path], out: Path, *, params: dict | None = None,
                  cell_timeout: int = 900, html_pages: bool = True, env_rows=None, progress=print,
                  jobs: int | None = None) -> list:
    """Execute ``paths`` into ``out``; return the :class:`sglab.tools.nbtools.Result` list, in the
    order of ``paths``.

    ``jobs`` notebooks at a time (default :func:`default_jobs`: one on a GPU machine). A failed or
    interrupted notebook still gets its partial executed notebook and page; the index says what
    happened to each. A run stopped by Ctrl-C or SIGTERM stops here (with the report of what
    ran)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = default_jobs() if jobs is None else max(1, int(jobs))
    if jobs > 1 and len(paths) > 1:
        from concurrent.futures import ThreadPoolExecutor

        progress(f"{len(paths)} notebooks, {jobs} at a time …")
        # while the workers run the notebooks, this process (idle otherwise) reads the machine
        # and the recorded runs' claims for the index
        with ThreadPoolExecutor(1) as meanwhile:
            env_soon = meanwhile.submit(env_report) if env_rows is None else None
            soon = meanwhile.submit(lambda: {p.stem: recorded_facts(p.stem) for p in paths})
            results = _in_parallel(paths, out, params, cell_timeout, html_pages, jobs, progress)
            env_rows = env_soon.result() if env_soon else env_rows
            known = soon.result()
    else:
        known, results = {}, []
        for i, p in enumerate(paths, 1):
            progress(f"[{i}/{len(paths)}] {p.name} …")
            results.append(run_one(p, out, params, cell_timeout, html_pages))
            _report(results[-1], progress)
            # Ctrl-C or SIGTERM: the report of what ran, then stop
            if results[-1].stopped_by_signal:
                progress(f"stopped: {len(paths) - i} notebook(s) not run")
                break
    if env_rows is None:
        env_rows = env_report()
    write_index(results, out, env_rows, recorded=known)
    return results


# --------------------------------------------------------------------------------------------------
# report_index: ``reports/index.html``: one card per notebook, then the environment (collapsed).
# --------------------------------------------------------------------------------------------------

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


def claim_facts(entry, result=None, recorded: dict | None = None) -> dict:
    """Claim, headline and verdict lines of a catalog entry: over this report's live runs when the
    notebook ran live (runs written since it started), else over the recorded runs a reader is
    shown (``recorded``: those facts, read already)."""
    live = _live_runs(entry.experiment, result) if entry and entry.experiment else []
    if live or entry is None:
        return _facts(entry, live)
    return recorded if recorded is not None else recorded_facts(entry.stem)


def recorded_facts(stem: str) -> dict:
    """:func:`claim_facts` of notebook ``stem`` over the recorded runs (:func:`run_notebooks` reads
    them while the notebooks run)."""
    from sglab.tools.fixes import by_stem

    return _facts(by_stem(stem), [])


def _facts(entry, live: list) -> dict:
    facts = {"claim": entry.claim if entry else "", "headline": "", "verdicts": [], "source": ""}
    if entry is None or not entry.experiment:
        return facts
    exp = entry.experiment
    try:
        from sglab.tools import fixes

        mod = fixes.claims(exp)
        shown = live or claims.shown(mod, runs.load_all_recorded(exp))
        facts["source"] = "measured live in this run" if live else "recorded runs"
        facts["headline"] = claims.headline(mod, shown) if shown else "no recorded run yet"
        facts["verdicts"] = [claims.verdict_line(claims.evaluate(mod, r), r) for r in shown]
    # noqa: BLE001 - a claims module that cannot read a run must not lose the report
    except Exception as e:
        facts["headline"] = f"headline unavailable: {type(e).__name__}: {e}"
    return facts


def _live_runs(experiment: str, result) -> list:

    started = getattr(result, "started", None)
    if result is None or result.mode != "live" or started is None:
        return []
    paths = runs.list_runs(experiment, kind="runs")
    return [runs.read_run(p, live=True) for p in paths if p.stat().st_mtime >= started]


def _cardstatus_line(r) -> str:
    skipped = f" · {r.skipped_gpu_cells} GPU cell(s) skipped" if r.skipped_gpu_cells else ""
    return (f"<span class='{r.status}'>{r.status}</span> · <span class='{r.mode}'>{r.mode}</span> "
            f"· {r.seconds:.1f} s{skipped}")


def inline_markdown(text: str) -> str:
    """Escaped text with its `code` spans as <code> (claims are written in markdown)."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def card(r, live_time: str, recorded: dict | None = None, earlier: str = "") -> str:
    """The HTML of one notebook's card (``recorded``: its claim facts over the recorded runs, where
    read already; ``earlier``: when the run that left it in the index ran, for a notebook not run
    this time)."""
    from sglab.tools.fixes import by_stem

    entry = by_stem(r.path.stem)
    facts = claim_facts(entry, r, recorded)
    title = notebook_title(r.nb, r.path.stem) if r.nb is not None else r.path.stem
    png = first_figure(r.nb) if r.nb is not None else None
    fig = (f"<a href='{html.escape(r.path.stem)}.html'><img alt='first figure of "
           f"{html.escape(r.path.stem)}' src='{data_uri(thumbnail(png))}'></a>"
           if png else "<div class='nofig'>no figure</div>")
    verdicts = "".join(
        f"<div class='meta'>verdict: {html.escape(v)}</div>" for v in facts["verdicts"])
    headline = (f"<p class='headline'><b>{inline_markdown(facts['headline'])}</b> "
                f"<small>({facts['source']})</small></p>" if facts["headline"] else "")
    err = f"<pre>{html.escape(r.error[-3000:])}</pre>" if r.error else ""
    link = f"<h2><a href='{html.escape(r.path.stem)}.html'>{html.escape(title)}</a></h2>"
    return (
        f"<div class='card'>{fig}<div class='text'>{link}"
        f"<p>{inline_markdown(facts['claim'])}</p>{headline}{verdicts}"
        f"<div class='meta'>live time: {html.escape(live_time)}</div>"
        f"<div class='meta'>{_when_line(earlier)}: {_cardstatus_line(r)}</div>{err}</div></div>")


def _when_line(earlier: str) -> str:
    return f"from an earlier run at {html.escape(earlier)}" if earlier else "this run"


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def earlier_entries(out: Path, ran: set) -> list:
    """The entries of ``out/index.json`` (an earlier run into the same folder) for notebooks not in
    ``ran`` whose page is still there, each with ``ran_utc`` (the page's time where an older index
    lacks it): running some notebooks again keeps the others in the index."""
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


def _earlier_result(out: Path, entry: dict):
    """The :class:`~sglab.tools.nbtools.Result` an earlier run left (its executed notebook where it
    is still there)."""
    nb = None
    with contextlib.suppress(Exception):  # a damaged copy: the card goes without its figure
        import nbformat

        nb = nbformat.read(out / entry["notebook"], as_version=4)
    try:
        seconds = float(entry.get("seconds", 0.0))
    except (TypeError, ValueError):
        seconds = 0.0
    return nbtools.Result(out / entry["notebook"], str(entry.get("status", "?")),
                          str(entry.get("mode", "?")), seconds, str(entry.get("error", "")), nb=nb)


def write_index(results, out: Path, env_rows: list[tuple[str, str]], live_times: dict | None = None,
                recorded: dict | None = None) -> Path:
    """Write ``index.html`` and ``index.json`` for ``results`` (nbtools.Result, executed notebooks
    inside); ``recorded``: {stem: :func:`recorded_facts`} read already. The notebooks of an earlier
    run into ``out`` that did not run now keep their cards (:func:`earlier_entries`), marked with
    the time they ran."""
    live_times = timings.live_times() if live_times is None else live_times
    ran_at = datetime.now(timezone.utc)
    now = ran_at.strftime("%Y-%m-%d %H:%M UTC")
    n_ok = sum(r.status == "ok" for r in results)
    entries = [(r, {
        "notebook": r.path.name, "status": r.status, "mode": r.mode, "seconds": round(r.seconds, 1),
        "live_time": live_times.get(r.path.stem, timings.NOT_RECORDED), "error": r.error[-2000:],
        "ran_utc": _stamp(r.started) if r.started else now
    }, "") for r in results]
    earlier = earlier_entries(out, {r.path.name for r in results})
    if earlier:
        entries += [(_earlier_result(out, e), e, e["ran_utc"]) for e in earlier]
        entries.sort(key=lambda x: x[1]["notebook"])
    cards = "".join(
        card(r, live_times.get(r.path.stem, timings.NOT_RECORDED), (
            recorded or {}).get(r.path.stem), when) for r, _, when in entries)
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


# --------------------------------------------------------------------------------------------------
# report_pages: One executed notebook → one HTML page of the report.
# --------------------------------------------------------------------------------------------------


def first_figure(nb) -> bytes | None:
    """The PNG bytes of the notebook's first figure (first ``image/png`` output), or None."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                png = data["image/png"]
                return base64.b64decode("".join(png) if isinstance(png, list) else png)
    return None


def thumbnail(png: bytes, width: int = 360) -> bytes:
    """``png`` scaled down to ``width`` pixels (the index embeds it; full figures would make it
    megabytes). Pillow comes with matplotlib; without it the figure is embedded as it is."""
    try:

        from PIL import Image
    except ImportError:
        return png
    img = Image.open(io.BytesIO(png))
    if img.width > width:
        img = img.resize((width, max(1, round(img.height * width / img.width))), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


# --------------------------------------------------------------------------------------------------
# the environment of a run (`sglab env`, the report's last section)
# --------------------------------------------------------------------------------------------------
def env_report() -> list[tuple[str, str]]:
    """(item, value) pairs describing this machine for the workbook."""

    rows = []
    sw = hardware.software()
    gpus = hardware.gpus() if hardware.has_cuda() else ()
    rows.append(("GPUs", f"{len(gpus)}" + "".join(
        f"\n  {g.index}: {g.name} {g.memory_mib} MiB {g.uuid}" for g in gpus)))
    rows.append(("driver", sw["driver"] or "not found (no NVML)"))
    rows.append(("torch / CUDA", f"{sw['torch']} / {sw['cuda'] or 'CPU build'}"))
    rows.append(("python", sw["python"]))
    rows.append(("bytecode", bytecode.describe()))
    try:
        import pynvml  # noqa: F401  (is it importable?)

        nvml = "nvidia-ml-py importable" + (", NVML initialised"
                                            if hardware._nvml() else ", NVML not usable here")
    except ImportError:
        nvml = "nvidia-ml-py not installed"
    rows.append(("NVML", nvml))
    try:
        from cuda.bindings import driver  # noqa: F401
        import cuda.bindings

        cb = f"cuda-bindings {getattr(cuda.bindings, '__version__', '?')}"
    except ImportError:
        cb = "not installed (static kernel counting unavailable)"
    rows.append(("cuda-bindings", cb))
    backend, why = kernels.nsight_backend()
    rows.append(("nsight timing", f"{backend} — {why}"))
    inst = upstream.installed()
    rows.append(("sglang", f"{inst.version} at {inst.root}" if inst else
                 "none in this environment: the notebooks read the releases below instead"))
    rows += real_release_rows()
    for dist in ("nbclient", "jupytext", "ipykernel", "nbconvert"):  # read, not imported
        try:
            rows.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            rows.append((dist, "not installed"))
    return rows


def overview():
    """00's reading-order table: per notebook its claim, the GPUs it needs, whether this machine
    runs it live, its live time (newest committed ``sglab run --timings`` record per GPU model) and
    the recorded runs it can show. One source with the README index and the report."""
    import pandas as pd

    from sglab.tools import fixes

    live_times = timings.live_times()
    rows = []
    for e in fixes.NOTEBOOKS:
        ok, _ = hardware.meets(e.gpus)
        recorded = runs.load_all_recorded(e.experiment) if e.experiment else []
        rows.append({
            "notebook": e.stem, "upstream": e.upstream, "claim": e.claim, "GPUs": e.gpus,
            "live here": "yes" if ok else "no", "live time": live_times.get(
                e.stem, timings.NOT_RECORDED), "recorded runs": "; ".join(r.label for r in recorded)
            or ("—" if e.experiment is None else "none yet")
        })
    return pd.DataFrame(rows)
