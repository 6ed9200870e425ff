"""No engine outlives its harness, whichever way the harness ends: SIGTERM (an outer `timeout`),
SIGINT (Ctrl-C, a notebook kernel interrupt), an exception, or the harness killed outright. CPU
only: a stand-in engine whose processes ignore their parent's death (as SGLang's schedulers do)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sglab.core import procs


LIB = Path(__file__).resolve().parents[2] / "lib"

# the stand-in engine: a leader, two children and a grandchild that left the group (found by the
# run's marker); all ignore SIGHUP and keep running when their parent dies
STAND_IN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stubborn = sys.argv[1] == "stubborn"
    body = "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    if stubborn:
        body += "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    sleep = [sys.executable, "-c", body + "time.sleep(600)"]
    kids = [subprocess.Popen(sleep) for _ in range(2)]
    away = subprocess.Popen([sys.executable, "-c", "import os; os.setsid(); " + body
                             + "time.sleep(600)"])
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(0.5)
    print("pids", os.getpid(), *[k.pid for k in kids], away.pid, flush=True)
    time.sleep(600)
""")

# the harness: sglab's own launch() of the stand-in, as `sglab engine` runs a real one
HARNESS = textwrap.dedent("""
    import sys, uuid
    from pathlib import Path
    sys.path.insert(0, {lib!r})
    from sglab.sglang import engine as eng
    from sglab.sglang.engine import launching
    how, tmp = sys.argv[1], Path(sys.argv[2])
    launching.KILL_GRACE_S = 60.0 if how == "slow" else 1.0
    marker = uuid.uuid4().hex

    def on_line(line):
        if line.startswith("pids"):
            print("ready", flush=True)
            if how == "raise":  # once the test has seen the engine's processes alive
                sys.stdin.readline()
                raise RuntimeError("a harness bug while the engine runs")

    import os
    env = dict(os.environ, SGLAB_ENGINE_RUN=marker)
    eng.launch([sys.executable, str(tmp / "stand_in.py"),
                "stubborn" if how in ("stubborn", "slow") else "plain"],
               log=tmp / "engine.log", timeout=600, env=env, marker=marker, on_line=on_line)
""")


def _pids(log: Path) -> list[int]:
    for line in log.read_text().splitlines():
        if line.startswith("pids "):
            return [int(x) for x in line.split()[1:]]
    return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _as_from_a_terminal():
    """The harness starts with default signal dispositions, as from a terminal: under `nohup` (or
    `cmd &` in a script) the test run inherits SIGHUP (or SIGINT) ignored, and an ignored signal is
    the caller's choice, which the harness keeps."""
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def _start_harness(tmp_path, how: str):
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    (tmp_path / "harness.py").write_text(HARNESS.format(lib=str(LIB)))
    # its own session, as under `timeout` or a shell script: a group signal reaches the harness
    # (and what it started in that group), not the engine's own group
    h = subprocess.Popen(
        [sys.executable, str(tmp_path / "harness.py"), how,
         str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=_as_from_a_terminal)
    assert h.stdout.readline().strip() == "ready", h.stderr.read()
    pids = _pids(tmp_path / "engine.log")
    if not (len(pids) == 4 and all(_alive(p) for p in pids)):
        _kill_all(pids)  # a failed start leaves nothing behind either
        h.kill()
        pytest.fail(f"the stand-in engine did not start whole: {pids}")
    return h, pids


def _kill_all(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("how, send, status", [
    ("plain", "SIGTERM to the harness's group (an outer timeout)", 128 + signal.SIGTERM),
    ("plain", "SIGINT (Ctrl-C, a kernel interrupt)", -signal.SIGINT),
    ("plain", "SIGHUP (the terminal closed)", 128 + signal.SIGHUP),
    ("raise", "an exception inside the harness", 1),
])
def test_the_harness_stops_its_engine_however_it_ends(tmp_path, how, send, status):
    h, pids = _start_harness(tmp_path, how)
    try:
        if send.startswith("SIGTERM"):
            os.killpg(h.pid, signal.SIGTERM)
        elif send.startswith("SIGINT"):
            h.send_signal(signal.SIGINT)
        elif send.startswith("SIGHUP"):
            h.send_signal(signal.SIGHUP)
        out, err = h.communicate("raise now\n" if how == "raise" else None, timeout=30)
        assert h.returncode == status, err
        assert _wait_gone(pids, 5) == [], f"{send}: the engine outlived its harness"
        # it says what it had to stop, in one line
        said = [ln for ln in err.splitlines() if "[sglab]" in ln]
        assert len(said) == 1 and "stopped 4 process(es)" in said[0], err
    finally:
        _kill_all(pids)


def test_a_killed_harness_leaves_nothing_the_watchdog_stops_it(tmp_path):
    h, pids = _start_harness(tmp_path, "plain")
    try:
        h.kill()  # SIGKILL: no handler, no finally
        h.wait(timeout=10)
        assert _wait_gone(pids, 20) == [], "the engine outlived a killed harness"
        assert "ended without stopping its engine" in h.stderr.read()
    finally:
        _kill_all(pids)


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    h, pids = _start_harness(tmp_path, "stubborn")
    try:
        os.killpg(h.pid, signal.SIGTERM)
        h.communicate(timeout=30)
        assert _wait_gone(pids, 5) == []
    finally:
        _kill_all(pids)


def test_a_second_sigterm_during_the_clean_up_exits_and_the_watchdog_finishes(tmp_path):
    """The engine ignores SIGTERM and its harness would wait a minute before SIGKILL: a second
    SIGTERM is not ignored, the harness exits at once (143) and its watchdog stops the engine."""
    h, pids = _start_harness(tmp_path, "slow")
    try:
        os.killpg(h.pid, signal.SIGTERM)
        time.sleep(1.0)  # the clean-up waits on the stubborn engine
        assert h.poll() is None
        t0 = time.monotonic()
        h.send_signal(signal.SIGTERM)
        assert h.wait(timeout=10) == 128 + signal.SIGTERM
        assert time.monotonic() - t0 < 3
        assert _wait_gone(pids, procs.GRACE_S + procs.KILL_WAIT_S + 5) == []
    finally:
        _kill_all(pids)


def test_stop_reports_what_it_found_and_nothing_for_an_empty_group():
    p = subprocess.Popen([
        sys.executable, "-c", "import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    ], start_new_session=True)
    try:
        time.sleep(0.3)
        done = procs.stop(p.pid, grace=0.5)
        assert len(done.found) == 1 and done.found[0].startswith(f"{p.pid} ")
        assert done.survivors == [] and not _alive(p.pid)  # it ignored SIGTERM: SIGKILL took it
        assert "stopped 1 process(es) left running" in done.line("group")
        again = procs.stop(p.pid, grace=0.5)
        assert again.found == [] and again.line() == ""
    finally:
        p.kill()


def test_the_guard_restores_the_handlers_and_ends_its_watchdog():
    before = signal.getsignal(signal.SIGTERM)
    with procs.Guard() as g:
        dog = g._dog.pid
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    assert not _alive(dog)


def test_a_tracked_group_is_stopped_when_the_interpreter_exits(tmp_path):
    """What the release runner and the rank launcher start is tracked: an interpreter that exits
    (here sys.exit inside the wait) stops it and says so in one line."""
    script = tmp_path / "exits.py"
    script.write_text(
        textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {str(LIB)!r})
        from sglab.core import procs
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
        procs.track(p.pid)
        print(p.pid, flush=True)
        sys.exit(3)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    try:
        assert out.returncode == 3 and _wait_gone([pid], 5) == []
        said = [ln for ln in out.stderr.splitlines() if ln.startswith("[sglab] at exit:")]
        assert len(said) == 1 and f"group {pid}: stopped 1 process(es)" in said[0]
    finally:
        _kill_all([pid])


def test_stop_tree_ends_a_process_and_its_descendants_outside_any_group_of_theirs():
    """A Jupyter kernel is not a group leader: its tree is stopped by parentage."""
    p = subprocess.Popen([
        sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
        "'-c', 'import time; time.sleep(60)']); time.sleep(60)"
    ])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(p.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        done = procs.stop_tree(p.pid, grace=1.0)
        assert len(done.found) == 2 and _wait_gone([p.pid, *kids], 5) == []
        assert os.getpgid(os.getpid()) == os.getpgrp()  # this test's own group untouched
    finally:
        p.kill()


def test_code_in_its_own_process_gives_its_last_json_line_or_one_error():
    from sglab.core import procs

    got = procs.in_own_process("import os, json; print('noise'); print(json.dumps({'pid': "
                               "os.getpid()}))")
    assert got["pid"] != os.getpid()
    assert procs.in_own_process("raise SystemExit('no device here')") == {"error": "no device here"}
    late = procs.in_own_process("import time; time.sleep(5)", timeout=0.5)
    assert late["error"].startswith("TimeoutExpired")
