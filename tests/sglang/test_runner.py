"""One worker per release answers many calls (:mod:`sglab.sglang.runner`).

The release here is a stand-in (``9.9.9``: an empty ``sglang`` package with a few probes beside it,
in a temporary ``$SGLAB_SGLANG_HOME``), so a worker costs a Python start-up and shims, not SGLang.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sglab.sglang import releases, runner, store
from tests import as_a_terminal_starts_it
from tests.sglang import TRITON_STUB


pytestmark = pytest.mark.long(55)

RELEASE = "9.9.9"
# importable in the worker: the release's folder is on its path
PID, BOOM, SLEEP, CHILD, LEAVE = (
    f"sglab_fake_probes.calls:{name}" for name in ("pid", "boom", "sleep", "child", "leave"))

CALLS = '''
import os, time

def pid(prepared, params):
    return [{"metric": "pid", "value": os.getpid(), "tag": params.get("tag")}]

def boom(prepared, params):
    raise ValueError("the probe failed on purpose")

def sleep(prepared, params):
    time.sleep(params["seconds"])
    return [{"metric": "slept", "value": params["seconds"]}]

def child(prepared, params):
    """Starts a grandchild that outlives the probe unless its group is killed."""
    import subprocess, sys
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(params["pid_file"], "w") as f:
        f.write(str(proc.pid))
    time.sleep(120)

def leave(prepared, params):
    os._exit(3)
'''


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    """A ``$SGLAB_SGLANG_HOME`` with the stand-in release installed (stamped) and its probes."""
    home = tmp_path / "home"
    root = home / "releases" / RELEASE
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "_triton_stub.py").write_text(TRITON_STUB)
    (root / releases.STAMP).write_text("{}")
    (root / "sglab_fake_probes").mkdir()
    (root / "sglab_fake_probes" / "__init__.py").write_text("")
    (root / "sglab_fake_probes" / "calls.py").write_text(CALLS)
    deps = home / "deps" / releases.dep_set(RELEASE)
    deps.mkdir(parents=True)
    (deps / releases.STAMP).write_text("{}")
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(home))
    monkeypatch.setattr(runner, "shared_answers", None)  # this session's answers are not these
    return home


@pytest.fixture
def spawned(monkeypatch):
    """The command line of every worker started (each still runs)."""
    seen = []
    real = runner._spawn

    def counting(cmd, timeout, progress=None, **kw):
        seen.append(cmd)
        return real(cmd, timeout, progress, **kw)

    monkeypatch.setattr(runner, "_spawn", counting)
    return seen


def _pid(result) -> int:
    return int(result.rows.loc[result.rows.metric == "pid", "value"].iloc[0])


def _live(params, probe=PID):
    return runner.run_probes([RELEASE], probe, params, source="live")[RELEASE]


# -- one worker, many calls ------------------------------------------------------------------------
def test_a_release_answers_all_its_calls_in_one_worker(fake_home, spawned):
    got = runner.run_release(RELEASE, [(PID, {"tag": 1}), (PID, {"tag": 2}), (PID, {"tag": 1})],
                             timeout=120)[0]
    assert len(spawned) == 1
    assert list(got) == [runner.call_key(PID, {"tag": 1}), runner.call_key(PID, {"tag": 2})]
    first, second = got.values()
    assert first.ok and second.ok, (first.reason, second.reason)
    assert _pid(first) == _pid(second) != os.getpid()  # one process answered both
    assert list(second.rows.tag) == [2] and list(second.rows.release) == [RELEASE]
    assert first.shim_names() == second.shim_names() and "triton" in first.shim_names()
    # the release is prepared once, inside the first answer's time (the second's is its call alone:
    # which of the two took longer is the host's, so it is not asserted)
    assert first.seconds >= first.prepare_seconds >= 0.0 == second.prepare_seconds
    assert second.seconds >= 0.0


def test_a_raising_probe_spoils_only_its_own_answer(fake_home, spawned):
    got = runner.run_release(RELEASE, [(PID, {"tag": 1}), (BOOM, None), (PID, {"tag": 2})],
                             timeout=120)[0]
    before, boom, after = got.values()
    assert len(spawned) == 1
    assert boom.status == "error" and boom.reason == "ValueError: the probe failed on purpose"
    assert "raise ValueError" in boom.traceback and boom.rows.empty
    assert before.ok and after.ok and _pid(before) == _pid(after)


def test_a_timeout_kills_the_group_and_reports_every_unanswered_call(fake_home, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    t0 = time.perf_counter()
    got = runner.run_release(RELEASE, [(PID, {"tag": 1}), (CHILD, {"pid_file": str(pid_file)}),
                                       (PID, {"tag": 2}), (BOOM, None)], timeout=8)[0]
    assert time.perf_counter() - t0 < 60
    done, hung, *never = got.values()
    assert done.ok
    assert hung.status == "error"
    assert hung.reason == f"sglang {RELEASE}: {CHILD} did not finish in 8 s (killed)"
    assert [r.reason for r in never] == [
        f"sglang {RELEASE}: {p} not answered: the worker was killed after 8 s while {CHILD} ran"
        for p in (PID, BOOM)
    ]
    assert all(r.status == "error" for r in never)
    grandchild = int(pid_file.read_text())
    time.sleep(0.5)
    left = subprocess.run(["ps", "-o", "stat=", "-p", str(grandchild)], capture_output=True,
                          text=True).stdout.strip()
    assert left in ("", "Z"), f"the probe's child {grandchild} is still running ({left})"


def test_the_clock_restarts_with_each_answer(fake_home):
    """``timeout`` bounds one call, not the worker: three calls of 3 s pass under a 7 s timeout.

    A quick first call takes the worker's start-up (slow on a busy 2-core host) off the clock."""
    calls = [(PID, {"tag": 0})] + [(SLEEP, {"seconds": 3, "n": i}) for i in range(3)]
    got = runner.run_release(RELEASE, calls, timeout=7)[0]
    assert [r.status for r in got.values()] == ["ok"] * 4, [r.reason for r in got.values()]


def test_a_worker_that_dies_reports_the_rest(fake_home):
    got = runner.run_release(RELEASE, [(PID, {"tag": 1}), (LEAVE, None), (PID, {"tag": 2})],
                             timeout=120)[0]
    done, left, never = got.values()
    assert done.ok
    assert left.status == "error" and left.reason == f"sglang {RELEASE}: worker exited 3: no output"
    assert never.reason == (f"sglang {RELEASE}: {PID} not answered: the worker exited 3 "
                            f"while {LEAVE} ran")


def test_run_probe_is_one_call_of_the_same_worker(fake_home, spawned):
    r = runner.run_probe(RELEASE, PID, {"tag": 5}, timeout=120)
    assert r.ok and list(r.rows.tag) == [5] and r.probe == PID
    assert len(spawned) == 1 and "--calls" in spawned[0]
    missing = runner.run_probe("0.5.9", PID)
    assert missing.status == "not-run" and len(spawned) == 1  # nothing to start


def test_the_worker_command_writes_one_line_per_call(fake_home, tmp_path):
    out = tmp_path / "answers.jsonl"
    calls = tmp_path / "calls.json"
    calls.write_text(json.dumps([{"probe": PID, "params": {"tag": 1}}, {"probe": BOOM}]))
    proc = subprocess.run([
        sys.executable, "-m", "sglab.sglang.runner", "--release", RELEASE, "--calls", f"@{calls}",
        "--out",
        str(out)
    ], capture_output=True, text=True, timeout=120, env=releases.worker_env())
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(d["index"], d["probe"], d["error"]) for d in lines
            ] == [(0, PID, None), (1, BOOM, "ValueError: the probe failed on purpose")]
    assert lines[0]["rows"][0]["tag"] == 1 and "prepare" in lines[0]["seconds"]


def test_run_batch_asks_each_release_once(fake_home, spawned):
    got = runner.run_batch([(PID, {"tag": 1}, [RELEASE, "0.5.9"]), (PID, {"tag": 2}, [RELEASE])])
    assert list(got) == [RELEASE, "0.5.9"] and len(spawned) == 1
    assert [r.status for r in got[RELEASE].values()] == ["ok", "ok"]
    assert [r.status for r in got["0.5.9"].values()] == ["not-run"]


# `sglab capture-sizes` whose release worker hangs in a probe that started a child of its own
STOPPED_COMMAND = """
import sys
sys.path.insert(0, {lib!r})
from sglab.capture_sizes import sglang as cs
from sglab.tools import cli
cs.probe_call = lambda cases, releases, **a: ({probe!r}, {{"pid_file": sys.argv[1]}}, releases)
sys.exit(cli.main(["capture-sizes", "--release", {release!r}, "--", "--tp", "8"]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_command_stopped_by_a_signal_stops_its_workers_and_leaves_no_temporary_folder(
        fake_home, tmp_path, sig):
    """A signal to the command alone (as `timeout` or a closed terminal sends it): the release
    workers' process groups stop, their temporary folders go, and one line says why (128 + it)."""
    script, pid_file, temp = tmp_path / "command.py", tmp_path / "grandchild.pid", tmp_path / "tmp"
    temp.mkdir()
    lib = str(Path(runner.__file__).resolve().parents[2])
    script.write_text(STOPPED_COMMAND.format(lib=lib, probe=CHILD, release=RELEASE))
    p = subprocess.Popen([sys.executable, str(script), str(pid_file)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "TMPDIR": str(temp)
                              }, preexec_fn=as_a_terminal_starts_it)
    mine = []
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), p.stderr.read() if p.poll() is not None else "no probe ran"
        mine = psutil.Process(p.pid).children(recursive=True)
        assert len(mine) == 2 and list(temp.glob("sglab-probe-*/calls.json"))
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 128 + sig
        assert err == f"sglab capture-sizes: stopped by {signal.Signals(sig).name}\n"
        gone, left = psutil.wait_procs(mine, timeout=5)
        assert left == [], f"still running after the command: {left}"
        assert list(temp.iterdir()) == []
    finally:
        p.kill()
        for c in mine:
            with contextlib.suppress(psutil.Error):
                c.kill()


def test_the_committed_recording_still_answers_every_notebook_call():
    """The notebooks' recorded mode reads data/recorded/real_cpu/ through the same store."""
    from sglab.tools.real_record import calls

    rec = store.newest()
    assert rec is not None
    for probe, params, names in calls():
        for v in names:
            hit = rec.lookup(v, probe, params)
            assert hit is not None and hit.ok, (probe, v)


def test_record_asks_each_release_once_for_all_its_calls(data_root, monkeypatch):
    """``sglab real record``: one batch of every notebook call, written as a recording that answers
    each of them (the committed one is never touched: ``$SGLAB_DATA`` is a temporary folder)."""
    from sglab.sglang.store import ProbeResult, frame as _frame
    from sglab.tools import real_record

    batches = []

    def batch(calls, *, jobs, progress):
        batches.append(list(calls))
        out = {}
        for probe, params, names in calls:
            for v in names:
                out.setdefault(v, {})[runner.call_key(probe, params)] = ProbeResult(
                    v, probe, "ok", _frame(v, probe, [{"metric": "m", "value": 1}]))
        for v, results in out.items():
            progress(v, results)
        return out

    monkeypatch.setattr(runner, "run_batch", batch)
    lines = []
    path = real_record.record(progress=lines.append)
    assert len(batches) == 1 and batches[0] == real_record.calls()
    assert len(lines) == 6 and all(line.startswith("sglang ") for line in lines)  # one per release
    rec = store.newest()
    assert rec.path == path
    for probe, params, names in real_record.calls():
        assert all(rec.lookup(v, probe, params).ok for v in names), probe


def test_progress_names_answers_found_in_a_recording(monkeypatch):
    """``progress`` hears of every release, an answer read from a recording as well as one a
    worker gives: a command on a terminal then says each release, whatever answered it."""

    class Recording:

        def lookup(self, v, probe, params):
            if v == "0.5.11":
                return store.ProbeResult(v, probe, "ok", store.frame(v, probe, []),
                                         recorded="20261125T000000Z")
            return None

    monkeypatch.setattr(store, "newest", lambda **k: Recording())
    heard = []
    got = runner.run_probes(["0.5.11", "0.5.99"], "sglab.capture_sizes.sglang:probe", {"x": 1},
                            source="recorded", progress=lambda v, r: heard.append(
                                (v, r.status, r.recorded)))
    assert [r.status for r in got.values()] == ["ok", "not-run"]
    assert heard == [("0.5.11", "ok", "20261125T000000Z"), ("0.5.99", "not-run", "")]
