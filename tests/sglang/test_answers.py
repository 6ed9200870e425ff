"""A test session runs its real-release calls once for all of its processes
(:mod:`tests.sglang_answers`), on the stand-in release of the runner's tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglab.sglang import releases, runner, store
from tests import sglang_answers as A
from tests.sglang.test_runner import LEAVE, PID, RELEASE, _live, _pid
from tests.sglang.test_runner import fake_home, spawned  # noqa: F401 (fixtures)


pytestmark = pytest.mark.long(30)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_session(monkeypatch):
    """These tests start sessions of their own; this session's is put back after each."""
    monkeypatch.setattr(A, "_folder", None)
    monkeypatch.setattr(runner, "shared_answers", None)


def test_the_session_runs_its_calls_once_and_then_answers_from_them(fake_home, tmp_path, spawned):
    folder = A.start(tmp_path / "session", [(PID, {"tag": 1}, [RELEASE]),
                                            (PID, {"tag": 2}, [RELEASE])])
    assert runner.shared_answers is A.answers
    assert spawned == []  # nothing runs until it is needed
    first = _live({"tag": 2})
    assert len(spawned) == 1 and first.ok and not first.recorded  # both calls, one worker: live
    again = _live({"tag": 1})
    assert len(spawned) == 1 and again.ok and _pid(again) == _pid(first)  # no worker started
    rec = store.newest(root=folder)  # a recording, as store reads one
    assert rec.lookup(RELEASE, PID, {"tag": 1}).ok and rec.sglang_home == str(fake_home.resolve())
    other = _live({"tag": 3})
    assert len(spawned) == 2 and other.ok  # not named: run when asked


def test_the_session_keeps_no_answer_that_a_crash_cut_short(fake_home, tmp_path, spawned):
    """A call left unanswered by another call's crash is run again when asked, not served as an
    error."""
    folder = A.start(tmp_path / "session", [(LEAVE, None, [RELEASE]), (PID, {"tag": 1}, [RELEASE])])
    assert _live({"tag": 1}).ok and len(spawned) == 2  # the session's worker died, then this call
    assert store.newest(root=folder) is None  # nothing the worker answered itself to keep
    assert _live({"tag": 1}).ok and len(spawned) == 3  # the session's calls are not run again


def test_a_session_of_other_releases_is_not_used(fake_home, tmp_path, spawned, monkeypatch):
    A.start(tmp_path / "session", [(PID, {"tag": 1}, [RELEASE])])
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path / "elsewhere"))
    r = _live({"tag": 1})
    assert r.status == "not-run" and "not installed" in r.reason and spawned == []
    assert A.answers() is None


def test_the_session_is_one_run_for_every_process(fake_home, tmp_path):
    """Two processes of one session ask at once: one runs the worker, the other waits on the lock,
    then reads the same answer."""
    calls = [(PID, {"tag": 1}, [RELEASE])]
    folder = A.start(tmp_path / "session", calls)
    code = ("import json; from sglab.sglang import runner; from tests import sglang_answers as A; "
            f"A.start({str(folder)!r}, {calls!r}); "
            f"(r,) = runner.run_probes([{RELEASE!r}], {PID!r}, {{'tag': 1}}).values(); "
            "print(json.dumps([r.status, int(r.rows.value.iloc[0])]))")
    env = {**releases.worker_env(), "SGLAB_REAL": "live"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) for _ in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    answers = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert answers[0] == answers[1] and answers[0][0] == "ok", outs
    assert len(list((Path(folder) / store.EXPERIMENT).glob("*.csv"))) == 1


def test_a_later_session_reads_the_answers_of_the_same_releases_and_calls(fake_home):
    """The answers folder is the same for the same calls and install stamps, another for other
    calls or a re-installed release, and only the newest few folders are kept."""
    calls = [(PID, {"tag": 1}, [RELEASE])]
    first = A.answers_folder(calls)
    assert A.answers_folder(calls) == first
    assert A.answers_folder([(PID, {"tag": 2}, [RELEASE])]) != first
    stamp = Path(os.environ["SGLAB_SGLANG_HOME"]) / "releases" / RELEASE / releases.STAMP
    stamp.write_text('{"again": 1}')
    assert A.answers_folder(calls) != first
    for i in range(A.KEPT + 3):
        A.answers_folder([(PID, {"tag": i}, [RELEASE])]).mkdir(parents=True)
    A.answers_folder(calls)
    kept = list((Path(os.environ["SGLAB_SGLANG_HOME"]) / "answers").iterdir())
    assert len(kept) == A.KEPT - 1


def test_a_later_session_runs_the_answers_again_once_code_they_ran_changed(
        fake_home, tmp_path, spawned):
    """The session's answers keep the digest of every package file their worker had imported: a
    later session reads them while those files are unchanged (a file they never ran, such as a
    notebook's tables, does not count) and asks the release again once one of them changed."""
    calls = [(PID, {"tag": 1}, [RELEASE])]
    folder = A.start(tmp_path / "session", calls)
    first = _live({"tag": 1})
    assert len(spawned) == 1
    ran = json.loads((folder / A.CODE).read_text())
    assert {"sglang/runner.py", "sglang/bootstrap.py"} <= set(ran)
    assert "pcg_gate/show.py" not in ran and all(len(d) == 64 for d in ran.values())

    A.start(folder, calls)  # a later session, nothing changed
    assert _pid(_live({"tag": 1})) == _pid(first) and len(spawned) == 1

    ran["sglang/bootstrap.py"] = "0" * 64  # as if bootstrap.py had been edited since
    (folder / A.CODE).write_text(json.dumps(ran))
    A.start(folder, calls)
    again = _live({"tag": 1})
    assert len(spawned) == 2 and _pid(again) != _pid(first)
    assert json.loads((folder / A.CODE).read_text())["sglang/bootstrap.py"] != "0" * 64


def test_the_test_and_build_helpers_live_outside_the_package():
    """The package holds no test plugin nor bundle builder; `make test`'s hunk-wheel rule runs the
    plugin's module, which finds every window's wheel in the cache."""
    from sglab.sglang import wheels

    package = REPO / "lib" / "sglab" / "sglang"
    assert not (package / "testing.py").exists() and not (package / "wheelhouse.py").exists()
    assert "$(BIN)/python -m tests.sglang_answers" in (REPO / "Makefile").read_text()
    if any(wheels.cached(v, wheels.cache_dir()) is None for v in A.hunk_versions()):
        pytest.skip("not every hunk window's wheel is cached here (make test fetches them)")
    p = subprocess.run([sys.executable, "-m", "tests.sglang_answers"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
