"""Stopping what the workbook starts: :func:`stop` ends a process group and every escapee carrying
its marker variable (SIGTERM, a grace period, SIGKILL); :class:`Guard` keeps that promise however
the harness ends (an exception, SIGTERM/SIGHUP, or killed outright: a watchdog)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import psutil


MARKER_VAR = "SGLAB_ENGINE_RUN"
GRACE_S = 10.0
KILL_WAIT_S = 5.0
# the same signal again this soon is the same stop (an outer `timeout` signals the whole group)
DUPLICATE_S = 0.5

# set the affinity, then replace this process with the command (same pid and group)
_PIN = ("import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
        "os.execvp(sys.argv[2], sys.argv[2:])")


def pinned(argv: list[str], cpus, python: str = sys.executable) -> list[str]:
    """``argv`` run on ``cpus`` only (and every process it starts); as it is without ``cpus``."""
    return [python, "-c", _PIN, ",".join(map(str, cpus)), *argv] if cpus else list(argv)


def in_own_process(code: str, timeout: float = 120.0, cpus=()) -> dict:
    """The JSON object ``python -c code`` prints last in a fresh process (or an error)."""
    try:
        p = subprocess.run(pinned([sys.executable, "-c", code], cpus), capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode == 0:
            return json.loads(p.stdout.strip().splitlines()[-1])
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}


@dataclass
class Stopped:
    """What :func:`stop` found alive (``"pid name"``) and what outlived SIGKILL."""

    found: list = field(default_factory=list)
    survivors: list = field(default_factory=list)

    def line(self, what: str = "process group") -> str:
        """One line for the reader; empty when nothing was left."""
        if not self.found:
            return ""
        out = f"{what}: stopped {len(self.found)} process(es) left running: {', '.join(self.found)}"
        if self.survivors:
            out += f"; STILL ALIVE after SIGKILL: {', '.join(self.survivors)}"
        return out


def _describe(p: psutil.Process) -> str:
    with suppress(psutil.Error):
        return f"{p.pid} {p.name()}"
    return str(p.pid)


def members(pgid: Optional[int] = None, marker: str = "") -> list[psutil.Process]:
    """Live processes of group ``pgid`` or carrying ``MARKER_VAR=marker``, never this one."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with suppress(psutil.Error, OSError):
            if (pgid is not None and os.getpgid(p.pid)
                    == pgid) or (marker and p.environ().get(MARKER_VAR) == marker):
                out.append(p)
    return out


def stop(pgid: Optional[int] = None, *, marker: str = "", grace: float = GRACE_S) -> Stopped:
    """Stop group ``pgid`` and ``marker``'s processes: SIGTERM, ``grace`` seconds, SIGKILL."""
    return _stop(lambda: members(pgid, marker), pgid, grace)


def stop_tree(pid: int, *, grace: float = GRACE_S) -> Stopped:
    """Stop process ``pid`` and its descendants (one that leads no group)."""
    with suppress(psutil.Error):
        return stop_seen([psutil.Process(pid)], grace=grace)
    return Stopped()


def descendants(pid: int) -> list[psutil.Process]:
    """The processes ``pid`` started, and those they started, running now (:func:`stop_seen`)."""
    with suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def stop_seen(seen: list, *, grace: float = GRACE_S) -> Stopped:
    """Stop those of ``seen`` (psutil processes) still running and what they started meanwhile."""
    seen = list({p.pid: p for p in seen}.values())

    def live() -> list[psutil.Process]:
        found = [p for p in seen if _alive(p)]
        for p in list(found):
            found += [c for c in descendants(p.pid) if c not in found and _alive(c)]
        return found

    return _stop(live, None, grace)


def _stop(again, pgid: Optional[int], grace: float) -> Stopped:
    live = again()
    done = Stopped(found=[_describe(p) for p in live])
    if not live:
        return done
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        if pgid is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for p in live:
            with suppress(psutil.Error):
                p.send_signal(sig)
        deadline = time.monotonic() + wait  # until all are gone (a zombie counts) or time is up
        while (live := [p for p in live if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        live += [p for p in again() if p not in live]  # forked meanwhile
        if not live:
            return done
    done.survivors = [_describe(p) for p in live]
    return done


def _alive(p: psutil.Process) -> bool:
    with suppress(psutil.Error):
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    return False


# -- groups this process started, stopped at its exit ----------------------------------------------
_TRACKED: dict[int, str] = {}  # pgid -> marker, while the group may be running


def track(pgid: int, marker: str = "") -> None:
    """Stop group ``pgid`` at this interpreter's exit unless :func:`untrack` came first."""
    _TRACKED[pgid] = marker


def untrack(pgid: int) -> None:
    _TRACKED.pop(pgid, None)


@atexit.register
def _stop_tracked() -> None:
    for pgid, marker in list(_TRACKED.items()):
        done = stop(pgid, marker=marker, grace=2.0)
        if done.found:
            print("[sglab] at exit: " + done.line(f"group {pgid}"), file=sys.stderr, flush=True)
    _TRACKED.clear()


# -- the harness's end, whichever way it comes -----------------------------------------------------
class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived while a :class:`Guard` was held (exit status 128 + signal)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


_DOGS: list = []  # the watchdogs of the guards held now


def _raise_terminated(signum, _frame):
    """Raise :class:`Terminated` once; a second signal exits at once where a watchdog is held."""
    at = time.monotonic()

    def again(sig, _f):
        if sig == signum and time.monotonic() - at < DUPLICATE_S:
            return
        if any(dog.poll() is None for dog in _DOGS):
            print(f"[sglab] signal {sig} again: exiting now; the watchdog stops what is left",
                  file=sys.stderr, flush=True)
            os._exit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, again)
    raise Terminated(signum)


class Guard:
    """While held, SIGTERM/SIGHUP raise :class:`Terminated`; a watchdog stops groups if we die."""

    def __init__(self, watchdog: bool = True):
        self.watchdog = watchdog
        self._dog: Optional[subprocess.Popen] = None
        self._saved: dict = {}

    def __enter__(self) -> "Guard":
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(s) in (signal.SIG_DFL, None):
                    self._saved[s] = signal.signal(s, _raise_terminated)
        if self.watchdog:
            lib = str(Path(__file__).resolve().parents[2])
            env = {k: v for k, v in os.environ.items() if k != MARKER_VAR}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [lib, env.get("PYTHONPATH")]))
            argv = [sys.executable, "-m", "sglab.core.procs", "watch", str(os.getpid())]
            self._dog = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         env=env, start_new_session=True, text=True)
            _DOGS.append(self._dog)
        return self

    def watch(self, pgid: int, marker: str = "") -> None:
        """Have the watchdog stop group ``pgid`` (and ``marker``'s) if this process dies first."""
        if self._dog is not None and self._dog.stdin is not None:
            self._dog.stdin.write(f"{pgid} {marker or '-'}\n")
            self._dog.stdin.flush()

    def __exit__(self, *exc) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        self._saved = {}
        if self._dog is not None:
            _DOGS.remove(self._dog)
            try:
                self._dog.stdin.close()  # the watchdog sweeps (nothing, by now) and exits
                self._dog.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._dog.kill()
            self._dog = None


def watch(parent: int) -> int:
    """The watchdog: stop every group (``pgid marker`` lines) read from stdin once it closes."""
    groups = [line.split() for line in sys.stdin]
    for pgid, marker in groups:
        done = stop(int(pgid), marker="" if marker == "-" else marker)
        if done.found:
            print(
                f"[sglab] harness {parent} ended without stopping its engine: "
                + done.line(f"group {pgid}"), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "watch":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.exit(watch(int(sys.argv[2])))
    print("usage: python -m sglab.core.procs watch PARENT_PID", file=sys.stderr)
    sys.exit(2)
