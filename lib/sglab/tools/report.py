"""The published report: ``sglab run`` executes notebooks headless and writes a self-contained
``reports/`` folder (executed ``.ipynb``, an HTML page each, ``index.html``, ``index.json``, and
under ``files/`` the data files the pages link).
Here: the run (a worker process per notebook, stop signals), the environment and 00's overview."""

from __future__ import annotations

import contextlib
import html
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

from sglab.core import bytecode, hardware, kernels, procs, runs
from sglab.sglang import upstream
from sglab.sglang.bootstrap import real_release_rows
from sglab.tools import nbtools, pages, timings
from sglab.tools.index_page import inline_markdown, recorded_facts, write_index
from sglab.tools.pages import status_line


def default_jobs() -> int:
    """Notebooks at a time: 1 where a GPU is visible (live timings must not share it), else 2."""
    return 1 if hardware.has_cuda() else max(1, min(2, os.cpu_count() or 1))


def _keep(done: dict, r, progress) -> None:
    """Keep a worker's result (None: it has none) and say how its notebook went."""
    if r is None:
        return
    done[r.path] = r
    err = r.error if len(r.error) < 700 else f"{r.error[:400]} … {r.error[-250:]}"
    progress(f"      {r.path.name}: {status_line(r)}" + (f"\n      {err}" if err else ""))


class Ran(list):
    """:func:`run_notebooks`' results in the order asked; ``signal``: what stopped the run, or 0."""

    signal: int = 0


class _Signals:
    """The stop signals' handler while a run holds it (a second one, once ``final``, exits)."""

    def __init__(self):
        self.received, self.final, self._saved, self._depth = [], False, {}, 0

    def __call__(self, signum, _frame) -> None:
        self.received.append(int(signum))
        if self.final and len(self.received) > 1:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(128 + self.received[0])

    def __enter__(self) -> "_Signals":
        global _HOLDER
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.signal(s, self) for s in nbtools.STOP_SIGNALS}
            _HOLDER = self
        return self

    def __exit__(self, *exc) -> None:
        global _HOLDER
        self._depth -= 1
        if self._depth == 0:
            for s, handler in self._saved.items():
                signal.signal(s, handler)
            self._saved = {}
            _HOLDER = None if _HOLDER is self else _HOLDER


_HOLDER: _Signals | None = None


def stopping() -> _Signals:
    """The stop signals' handler of the run in progress (a new one where none is)."""
    return _HOLDER or _Signals()


class _Worker:
    """One notebook in a worker process (:func:`sglab.tools.pages.worker`) of this process group."""

    def __init__(self, path: Path, folder: Path, n: int, job: dict):
        self.path, self.out, self.result = path, Path(job["out"]), folder / f"{n}.result"
        spec = folder / f"{n}.job"
        spec.write_bytes(pickle.dumps({**job, "notebook": path, "result": str(self.result)}))
        lib = str(Path(pages.__file__).resolve().parents[2])  # this sglab, not another installed
        self.proc = subprocess.Popen(
            [sys.executable, "-c", pages.WORKER, str(spec), lib], stdin=subprocess.DEVNULL)
        self.seen: list = []  # its kernel and what that started, as last looked at
        self.t0 = time.perf_counter()

    def look(self) -> None:
        """Keep what the worker runs now, so that it can be stopped once the worker is gone."""
        self.seen += [p for p in procs.descendants(self.proc.pid) if p not in self.seen]

    def running(self) -> bool:
        return self.proc.poll() is None

    def report(self, stopped: int):
        """The worker's result (None: stopped before its notebook started), or one made here."""
        import nbformat

        with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
            return pickle.loads(self.result.read_bytes())
        if not self.result.with_suffix(".started").exists():
            return None  # ended before its notebook started
        code = self.proc.returncode
        how = f"killed by signal {-code}" if code and code < 0 else f"exit {code}"
        nb = nbformat.v4.new_notebook()
        with contextlib.suppress(Exception):  # the partial notebook, where it got that far
            nb = nbformat.read(self.out / self.path.name, as_version=4)
        status, why = (("interrupted",
                        f"interrupted: stopped by a signal; its worker ended ({how}) "
                        "before it reported") if stopped else
                       ("failed", f"the worker process running it died ({how})"))
        return nbtools.Result(self.path, status, "?",
                              time.perf_counter() - self.t0, why, nb=nb, stopped_by_signal=stopped)


def _stop_workers(running: list, signals: _Signals, stopped: int, progress) -> None:
    """Tell the running workers to stop; kill those still running after the grace time."""
    progress("stopped: the running notebooks are told to stop")
    tell = signal.SIGINT if stopped == signal.SIGINT else signal.SIGTERM
    for w in running:
        w.look()
        w.proc.send_signal(tell)  # a worker the group signal reached already takes it once
    deadline, looked = time.monotonic() + pages.STOP_GRACE_S, time.monotonic()
    while (any(w.running() for w in running) and time.monotonic() < deadline
           and len(signals.received) < 2):
        if time.monotonic() - looked >= 0.5:
            for w in running:
                w.look()
            looked = time.monotonic()
        time.sleep(0.05)
    hurry = len(signals.received) >= 2
    for w in running:
        if w.running():
            w.look()
            w.proc.kill()
    for w in running:
        with contextlib.suppress(Exception):
            w.proc.wait(timeout=5)
    for w in running:
        left = procs.stop_seen(w.seen, grace=0.0 if hurry else 1.0)
        if left.found:
            progress(f"      {w.path.name}: " + left.line("its kernel"))


def _run_workers(paths, out, params, cell_timeout, html_pages, jobs, signals: _Signals,
                 progress) -> tuple[dict, int]:
    """Each notebook in a worker process, ``jobs`` at a time: ``({path: Result}, stop signal)``."""
    folder = Path(tempfile.mkdtemp(prefix="sglab-run-"))
    job = dict(out=out, params=params, cell_timeout=cell_timeout, html_pages=html_pages,
               parent=os.getpid(), folder=str(folder))
    done: dict = {}
    pending, running = list(paths), []
    stopped, looked = 0, 0.0
    try:
        while pending or running:
            stopped = stopped or (signals.received[0] if signals.received else 0)
            if stopped:
                break
            while pending and len(running) < jobs:
                p = pending.pop(0)
                n = len(paths) - len(pending)
                if jobs == 1:
                    progress(f"[{n}/{len(paths)}] {p.name} …")
                running.append(_Worker(p, folder, n, job))
            for w in [w for w in running if not w.running()]:
                running.remove(w)
                if w.proc.returncode:  # it died: what it ran (its kernel) is nobody's now
                    procs.stop_seen(w.seen, grace=1.0)
                r = w.report(0)
                _keep(done, r, progress)
                stopped = stopped or (r.stopped_by_signal if r else 0)  # a signal to it alone
            if time.monotonic() - looked >= 1.0:
                for w in running:
                    w.look()
                looked = time.monotonic()
            time.sleep(0.05)
        stopped = stopped or (signals.received[0] if signals.received else 0)
        if running:
            _stop_workers(running, signals, stopped, progress)
            for w in running:
                _keep(done, w.report(stopped), progress)
    finally:
        for w in running:  # an error here: no worker (or kernel) outlives the run
            if w.running():
                w.look()
                w.proc.kill()
                w.proc.wait()
            procs.stop_seen(w.seen, grace=0.0)
        shutil.rmtree(folder, ignore_errors=True)
    if len(done) < len(paths):
        progress(f"stopped: {len(paths) - len(done)} notebook(s) not run")
    return done, stopped


class _Facts:
    """The index's reading (the machine, recorded claim facts) in a thread while notebooks run."""

    def __init__(self, paths, env_rows):
        self.env, self.known = env_rows, None
        self.thread = threading.Thread(target=self._read, args=(paths,), daemon=True,
                                       name="sglab-index-facts")
        self.thread.start()

    def _read(self, paths) -> None:
        if self.env is None:
            self.env = env_report()
        self.known = {p.stem: recorded_facts(p.stem) for p in paths}

    def wait(self, timeout: float | None) -> tuple:
        self.thread.join(timeout)
        return self.env, self.known


def run_notebooks(paths: list[Path], out: Path, *, params: dict | None = None,
                  cell_timeout: int = 900, html_pages: bool = True, env_rows=None, progress=print,
                  jobs: int | None = None) -> Ran:
    """Execute ``paths`` into ``out``, ``jobs`` at a time; the Results in order (a :class:`Ran`)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = default_jobs() if jobs is None else max(1, int(jobs))
    if jobs > 1 and len(paths) > 1:
        progress(f"{len(paths)} notebooks, {jobs} at a time …")
    with stopping() as signals:
        signals.final = False
        facts = _Facts(paths, env_rows) if jobs > 1 and len(paths) > 1 else None
        done, stopped = _run_workers(paths, out, params, cell_timeout, html_pages, jobs, signals,
                                     progress)
        signals.final = True
        if stopped and facts is None:
            facts = _Facts(paths, env_rows)
        # a stopped run gives the reading a second more, then goes without it
        env, known = facts.wait(1.0 if stopped else None) if facts else (env_rows, {})
        quick = bool(stopped) and known is None
        env = env if env is not None else ([(
            "environment", "not read: the run was stopped first")] if stopped else env_report())
        results = Ran(done[p] for p in paths if p in done)
        if html_pages:
            pages.link_pages(out, [out / f"{r.path.stem}.html" for r in results])
        results.signal = signals.received[0] if signals.received else stopped
        write_index(results, out, env, recorded=known or {}, quick=quick)
    return results


def env_report() -> list[tuple[str, str]]:
    """(item, value) pairs describing this machine for the workbook."""
    sw = hardware.software()
    gpus = hardware.gpus() if hardware.has_cuda() else ()
    nvml = ", NVML initialised" if hardware._nvml() else ", NVML not usable here"
    rows = [
        ("GPUs", f"{len(gpus)}" + "".join(
            f"\n  {g.index}: {g.name} {g.memory_mib} MiB {g.uuid}" for g in gpus)),
        ("driver", sw["driver"] or "not found (no NVML)"),
        ("torch / CUDA", f"{sw['torch']} / {sw['cuda'] or 'CPU build'}"), ("python", sw["python"]),
        ("bytecode", bytecode.describe()),
        ("NVML",
         f"nvidia-ml-py importable{nvml}" if find_spec("pynvml") else "nvidia-ml-py not installed")
    ]
    try:
        from cuda.bindings import driver  # noqa: F401
        import cuda.bindings

        cb = f"cuda-bindings {getattr(cuda.bindings, '__version__', '?')}"
    except ImportError:
        cb = "not installed (static kernel counting unavailable)"
    backend, why = kernels.nsight_backend()
    rows += [("cuda-bindings", cb), ("nsight timing", f"{backend} — {why}")]
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


def recorded_summary(recorded: list) -> str:
    """A notebook's recorded runs: ``H100 ×1: 3 runs; H200 ×1: 6 runs; newest 2026-11-29``."""
    if not recorded:
        return "none yet"
    counts = Counter(f"{runs.gpu_short(r)} ×{r.manifest.gpu_count}" for r in recorded)
    parts = [f"{k}: {n} run{'' if n == 1 else 's'}" for k, n in sorted(counts.items())]
    return "; ".join(parts) + f"; newest {max(r.manifest.date for r in recorded)}"


def overview_frame():
    """00's table of notebooks as data."""
    import pandas as pd

    from sglab.tools import fixes

    def recorded(experiment):
        return recorded_summary(runs.load_all_recorded(experiment)) if experiment else "—"

    live_times = timings.live_times()
    rows = []
    for e in fixes.NOTEBOOKS:
        ok, _ = hardware.meets(e.gpus)
        live, engine = live_times.get(e.stem, timings.NOT_RECORDED), f"engine_{e.experiment}"
        rows.append((e.stem, e.upstream, e.claim, e.gpus, "yes" if ok else "no", live,
                     recorded(e.experiment), recorded(e.experiment and engine)))
    columns = ("notebook", "upstream", "claim", "GPUs", "live here", "live time", "rebuild runs",
               "real-engine runs")
    return pd.DataFrame(rows, columns=columns)


def overview():
    """00's table of notebooks (:func:`overview_frame`) as a reader sees it."""
    from sglab.sglang.fix import REPO

    df = overview_frame()
    df["upstream"] = df["upstream"].str.removeprefix(REPO)
    df = df.rename(columns={"upstream": f"upstream ({REPO})"})
    others = [c for c in df.columns if c != "claim"]
    style = df.style.hide(axis="index").format(inline_markdown, subset=["claim"])
    style = style.format(lambda t: "<br>".join(html.escape(p) for p in str(t).split("; ")),
                         subset=["live time", "rebuild runs", "real-engine runs"])
    style = style.set_properties(**{"text-align": "left", "vertical-align": "top"})
    style = style.set_properties(subset=others, **{"white-space": "nowrap"})
    style = style.set_properties(subset=["claim"], **{"white-space": "normal"})
    th = dict(selector="th", props="text-align: left; vertical-align: bottom")
    return style.set_table_styles([th])
