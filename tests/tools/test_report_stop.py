"""`sglab run` stopped by a signal to its own pid alone (a service manager, `kill PID`), whenever it
comes: the workers, their kernels and what the kernels started all stop, the index of what ran is
written, and the command exits 128 + the signal within seconds (it used to hang on a worker that
could neither stop nor hand back its result). A second signal ends the workers at once."""

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from sglab.core import procs
from sglab.tools import report


pytestmark = pytest.mark.long(35)

# seconds after the run said it started: its workers starting, their kernels starting, the quick
# notebook finishing (its page written, the third notebook starting), cells running
MOMENTS = (0.0, 0.2, 0.5, 0.9, 1.3, 1.8, 2.4, 3.0, 3.8, 4.6)


def _books(folder: Path) -> list[Path]:
    """A quick notebook and two that start a child process and sleep (each writes its kernel's pid
    and its child's beside it): with two at a time, the third starts when the quick one ends."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    paths = []
    for name, cells in (("a_quick", [code("x = 1"),
                                     code("print(x)")]), ("b_slow", None), ("c_slow", None)):
        nb = nbformat.v4.new_notebook()
        nb.cells = [md(f"# {name}")] + (cells or [
            code("import os, subprocess, time\n"
                 "child = subprocess.Popen(['sleep', '300'])\n"
                 f"open({str(folder / (name + '.pids'))!r}, 'w').write(f'{{os.getpid()}} "
                 "{child.pid}')\ntime.sleep(120)")
        ])
        paths.append(folder / f"{name}.ipynb")
        nbformat.write(nb, paths[-1])
    return paths


def _everything(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _in_sessions(sessions: set) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(p.pid) in sessions and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except OSError:
            continue
    return found


def _stop_once(books: list[Path], out: Path, tmp: Path, after: float, signum: int) -> dict:
    """`sglab run` on ``books``, ``signum`` to its pid alone ``after`` seconds past its first line;
    what happened. Whatever is left is ended here, after it is counted."""
    proc = subprocess.Popen([
        sys.executable, "-m", "sglab.tools.cli", "run", *map(str, books), "--out",
        str(out), "--jobs", "2"
    ], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    seen: list = []
    try:
        deadline = time.monotonic() + 60
        while not lines:
            assert proc.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.02)
        time.sleep(after)
        seen = _everything(proc.pid)  # the workers, their kernels, what those started
        sessions = {proc.pid} | {os.getsid(p.pid) for p in seen if _alive(p)}
        t0 = time.monotonic()
        proc.send_signal(signum)
        try:
            status = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - t0
        reader.join(5)
        for _ in range(20):  # the last of them being reaped
            left = [p.pid for p in seen if _alive(p)] + _in_sessions(sessions)
            if not left:
                break
            time.sleep(0.1)
        return {
            "status": status, "took": took, "left": sorted(set(left)), "output": "".join(lines),
            "index": (out / "index.html").exists(), "tmp": sorted(p.name for p in tmp.iterdir())
        }
    finally:
        for p in [*seen, *_everything(proc.pid)]:
            if _alive(p):
                p.kill()
        proc.wait()


def test_a_signal_to_the_run_alone_stops_everything_whenever_it_comes(tmp_path):
    books = _books(tmp_path)
    rng = random.Random(os.getpid())
    trials = [(m + rng.uniform(0, 0.2), signal.SIGTERM) for m in MOMENTS]
    trials.insert(6, (1.6 + rng.uniform(0, 0.4), signal.SIGINT))
    failures = []
    for i, (after, signum) in enumerate(trials):
        # the run's temporary folder, where nothing may be left (short: kernels' IPC sockets)
        tmp = Path(tempfile.mkdtemp(prefix="st-"))
        try:
            got = _stop_once(books, tmp_path / f"out{i}", tmp, after, signum)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        ok = (got["status"] == 128 + signum and got["took"] < 10 and not got["left"]
              and got["index"] and not got["tmp"] and "Traceback" not in got["output"])
        if not ok:
            failures.append((round(after, 2), signal.Signals(signum).name, got["status"],
                             round(got["took"],
                                   1), got["left"], got["index"], got["tmp"], got["output"][-300:]))
    assert not failures, "\n".join(map(str, failures))


def test_a_second_signal_ends_the_workers_at_once(monkeypatch):
    """A worker that does not stop when told (here it ignores SIGTERM) is ended after the grace, or
    at once when a second signal comes; what it started goes with it."""
    code = ("import signal, subprocess, sys, time\nsubprocess.Popen(['sleep', '300'])\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(300)")
    monkeypatch.setattr(report.pages, "STOP_GRACE_S", 30.0)
    for signals in ([signal.SIGTERM, signal.SIGTERM], [signal.SIGTERM]):
        if len(signals) == 1:
            monkeypatch.setattr(report.pages, "STOP_GRACE_S", 1.0)
        w = report._Worker.__new__(report._Worker)
        w.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert w.proc.stdout.readline() == "ready\n"
        w.seen, w.path = [], Path("x.ipynb")
        child = psutil.Process(w.proc.pid).children()
        assert len(child) == 1
        stopping = report._Signals()
        stopping.received = list(signals)
        said = []
        t0 = time.monotonic()
        report._stop_workers([w], stopping, signals[0], said.append)
        took = time.monotonic() - t0
        assert w.proc.returncode == -signal.SIGKILL
        assert took < (1.0 if len(signals) == 2 else 3.0), took
        assert not _alive(child[0])
        assert said[0] == "stopped: the running notebooks are told to stop"
        assert "its kernel: stopped 1 process(es) left running" in said[1]
