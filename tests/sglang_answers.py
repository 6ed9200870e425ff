"""Real releases in tests, as a pytest plugin (registered by ``tests/conftest.py``).

A test module that asks the installed releases live names its calls in ``REAL_CALLS`` (a fix's name
stands for its notebook's call). The session answers all of them once, one worker per release, in a
folder its processes share (``.sglang/answers/<key>``, kept while the code they ran is unchanged;
``SGLAB_FRESH_ANSWERS=1`` runs them again). In CI a release that did not run fails its test;
elsewhere it skips. ``python -m tests.sglang_answers`` caches the wheels of the committed hunks.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Iterable, Optional

import pytest

from sglab.sglang import runner, store
from sglab.sglang.releases import STAMP, dep_set, deps_dir, home, package_dir, release_dir
from sglab.sglang.releases import release_installed
from sglab.sglang.runner import DEFAULT_TIMEOUT_S, PACKAGE, ProbeResult, run_probes


# -- what a test asks of the releases
# --------------------------------------------------------------------------------------------------
def function_source(source: str, qualname: str) -> str:
    """The dedented source of ``qualname`` in a module's text, decorators included."""
    tree = ast.parse(source)
    nodes, found = tree.body, None
    for part in qualname.split("."):
        found = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef)) and n.name == part), None)
        if found is None:
            raise ValueError(f"{qualname}: {part} not found")
        nodes = found.body
    lines = source.splitlines(keepends=True)
    start = min([found.lineno] + [d.lineno for d in found.decorator_list]) - 1
    return textwrap.dedent("".join(lines[start:found.end_lineno]))


def require(result: ProbeResult) -> ProbeResult:
    """``result`` when it ran; otherwise fail (CI) or skip (elsewhere) with its reason."""
    if result.ok:
        return result
    reason = result.reason if result.status == "not-run" else f"{result.reason}\n{result.traceback}"
    if os.environ.get("CI"):
        pytest.fail(f"real SGLang did not run: {reason}", pytrace=False)
    pytest.skip(f"real SGLang did not run: {reason}")


def package(release: str) -> Path:
    """The installed release's ``sglang`` folder (its source, read as text); fail (CI) or skip
    (elsewhere) when it is not installed."""
    if release_installed(release):
        return package_dir(release)
    reason = f"sglang {release} is not installed (sglab real install --releases {release})"
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def probe_all(releases, probe: str, params=None) -> dict[str, ProbeResult]:
    """Each release's live answer: this session's, else run now (never a recording)."""
    return run_probes(releases, probe, params, jobs=2, source="live")


def probe_one(release: str, probe: str, params=None, *,
              timeout: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    """One release's live answer, as :func:`probe_all` gives it."""
    return run_probes([release], probe, params, jobs=1, timeout=timeout, source="live")[release]


def value(result: ProbeResult, **where):
    """The ``value`` of the single row matching ``where`` (column=value pairs)."""
    df = result.rows
    for col, want in where.items():
        df = df[df[col] == want]
    if len(df) != 1:
        raise AssertionError(f"{result.release}: {len(df)} rows match {where}")
    return df["value"].iloc[0]


def _records(df):
    """Rows as they come back from JSON, for comparing; the times and memory figures inside captured
    SGLang log lines are masked (they vary from run to run)."""
    import pandas as pd

    records = df.drop(columns=["release", "probe"], errors="ignore").to_dict("records")
    text = json.dumps(records, default=str)
    text = re.sub(r"(elapsed|mem usage|avail mem)(=|: )[0-9.]+", r"\1\2<t>", text)
    return pd.DataFrame(json.loads(text)).reset_index(drop=True)


def assert_recording_matches(live: dict[str, ProbeResult], probe: str, params=None, *,
                             keep=None) -> int:
    """The recording (:mod:`sglab.sglang.store`) answers ``probe`` with ``params`` exactly as the
    releases just did in ``live``, release by release (``keep(rows) -> rows`` narrows the live rows
    first). Returns how many releases were compared; a recording that holds none of them fails."""
    import pandas as pd

    rec = store.newest()
    assert rec is not None, "no recording under data/recorded/real_cpu/ (run `sglab real record`)"
    compared = 0
    for release, result in live.items():
        hit = rec.lookup(release, probe, params)
        if hit is None:
            continue
        require(result)
        rows = keep(result.rows) if keep else result.rows
        assert hit.status == result.status, (f"{release}: recorded {hit.status}, live "
                                             f"{result.status}")
        pd.testing.assert_frame_equal(_records(hit.rows), _records(rows), check_dtype=False,
                                      obj=f"{probe} on sglang {release}: recorded vs live rows")
        compared += 1
    assert compared, (f"the recording ({rec.path.name}) holds {probe} for none of "
                      f"{sorted(live)}: re-record it")
    return compared


# -- a session's answers: one run of each release for every call its test modules name
# --------------------------------------------------------------------------------------------------
CALLS = "calls.json"  # {"sglang_home", "calls": [{"probe", "params", "releases"}]}
DONE = "answered"  # written once the session's calls were run (even if none could be)
CODE = "code.json"  # {file of the package that the answers ran: its sha256}
KEPT = 4  # answer folders kept under .sglang/answers (the newest)
# what the answers always pass through in the test process: reading and storing them
PARENT_CODE = ("sglang/runner.py", "sglang/store.py", "core/runs.py")
_folder: Optional[Path] = None  # this process's session folder


def _locked(folder: Path):
    lock = open(folder / "lock", "a+")
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file is closed
    return lock


def _digests(names: Iterable[str]) -> dict:
    return {
        n: hashlib.sha256((PACKAGE / n).read_bytes()).hexdigest() if (PACKAGE / n).is_file() else ""
        for n in sorted(names)
    }


def _code_unchanged(folder: Path) -> bool:
    """Whether every package file that the answers ran is as it was then."""
    try:
        ran = json.loads((folder / CODE).read_text())
    except (OSError, ValueError):
        return False
    return bool(ran) and _digests(ran) == ran


def answers_folder(calls) -> Path:
    """``.sglang/answers/<key>``: the key a digest of the calls, the interpreter and the install
    stamps of each release and its dependency set (the oldest folders beyond :data:`KEPT` go)."""
    calls = [(p, prm, list(vs)) for p, prm, vs in calls]
    h = hashlib.sha256(
        json.dumps([[p, store.params_key(p, prm), vs] for p, prm, vs in calls],
                   sort_keys=True).encode())
    h.update(sys.version.encode() + str(home().resolve()).encode())
    for v in sorted({v for _, _, vs in calls for v in vs}):
        for stamp in (release_dir(v) / STAMP, deps_dir(dep_set(v)) / STAMP):
            h.update(stamp.read_bytes() if stamp.exists() else b"-")
    root = home() / "answers"
    folder = root / h.hexdigest()[:16]
    old = sorted((d for d in root.glob("*") if d.is_dir() and d != folder),
                 key=lambda d: d.stat().st_mtime)
    for d in old[:max(0, len(old) - (KEPT - 1))]:
        shutil.rmtree(d, ignore_errors=True)
    return folder


def start(folder: Path, calls) -> Path:
    """Make ``folder`` (shared by every process of one session) the place of the answers to
    ``calls`` (``(probe, params, releases)``) and hand them to the runner; nothing runs here.
    Answers of code that changed since are dropped."""
    global _folder
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        if (folder / DONE).exists() and not _code_unchanged(folder):
            for name in (DONE, CODE):
                (folder / name).unlink(missing_ok=True)
            shutil.rmtree(folder / store.EXPERIMENT, ignore_errors=True)
        if not (folder / CALLS).exists():
            asked = [{"probe": p, "params": prm, "releases": list(vs)} for p, prm, vs in calls]
            tmp = folder / f".{CALLS}.tmp"
            tmp.write_text(
                json.dumps({"sglang_home": str(home().resolve()), "calls": asked}, default=str))
            tmp.replace(folder / CALLS)
    _folder, runner.shared_answers = folder, answers
    return folder


def stop() -> None:
    global _folder
    _folder, runner.shared_answers = None, None


def _answer(folder: Path, asked: list[dict]) -> None:
    """Run every call, one worker per release, two at a time; keep what the workers answered
    themselves (never a call a kill or a crash cut short) as a recording in ``folder``."""
    calls = [
        (c["probe"], c["params"], [v for v in c["releases"] if release_installed(v)]) for c in asked
    ]
    runner.code_loaded.clear()
    done = runner.run_batch(calls, jobs=2, answered_only=True)
    answers: dict = {}
    for probe, params, releases in calls:
        key = runner.call_key(probe, params)
        per_release = answers.setdefault(key, (probe, params, {}))[2]
        for v in releases:
            if key in done.get(v, {}):
                per_release[v] = done[v][key]
    kept = [a for a in answers.values() if a[2]]
    if kept:
        store.write(kept, root=folder, extra={"sglang_home": str(home().resolve())})
    ran = _digests(runner.code_loaded | set(PARENT_CODE))
    (folder / CODE).write_text(json.dumps(ran, indent=0) + "\n")
    (folder / DONE).write_text(f"{len(kept)} calls answered\n")


def answers() -> Optional[store.Recording]:
    """This session's answers, run first where no process of the session has run them yet (the
    others wait on the lock meanwhile). None outside a session, or where this process uses other
    releases (``$SGLAB_SGLANG_HOME``)."""
    if _folder is None or not (_folder / CALLS).exists():
        return None
    session = json.loads((_folder / CALLS).read_text())
    if session["sglang_home"] != str(home().resolve()):
        return None
    with _locked(_folder):
        if not (_folder / DONE).exists():
            _answer(_folder, session["calls"])
    return store.newest(root=_folder)


def _real_calls(items) -> list:
    """The ``REAL_CALLS`` of the modules of ``items``, each call once, in collection order."""
    from sglab.tools import fixes

    calls, seen = [], set()
    for module in dict.fromkeys(item.module for item in items if getattr(item, "module", None)):
        for entry in getattr(module, "REAL_CALLS", ()):
            if isinstance(entry, str):
                p = fixes.get(entry).probe
                entry = (p.fn, p.resolved_params(), p.releases)
            probe, params, releases = entry
            for v in releases:
                if (v, runner.call_key(probe, params)) not in seen:
                    seen.add((v, runner.call_key(probe, params)))
                    calls.append((probe, params, (v,)))
    return calls


@pytest.fixture(scope="session", autouse=True)
def real_session(request, tmp_path_factory):
    """Name this session's real-release calls in a folder all its processes share (the xdist
    workers' common base folder under ``SGLAB_FRESH_ANSWERS=1``); nothing runs until a test needs
    an answer."""
    calls = _real_calls(request.session.items)
    if not calls:
        yield None
        return
    if os.environ.get("SGLAB_FRESH_ANSWERS") == "1":
        base = tmp_path_factory.getbasetemp()
        shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "real-answers"
    else:
        shared = answers_folder(calls)
    yield start(shared, calls)
    stop()


# -- the wheels the hunk test rebuilds every committed hunk from
# --------------------------------------------------------------------------------------------------
def hunk_versions() -> list[str]:
    """Both releases of every committed PR hunk's window (``data/upstream/<fix>/pr<N>.json``)."""
    from sglab.core import runs

    got = set()
    for meta in sorted((runs.repo_root() / "data" / "upstream").glob("*/pr*.json")):
        d = json.loads(meta.read_text())
        got |= {d["before_version"], d["after_version"]}
    return sorted(got)


def fetch_hunk_wheels(dest=None) -> int:
    """Download the wheel of every release a committed hunk's window names into the wheel cache
    (``.sglang/wheels/``; those there are kept). 0, or 1 with one line on stderr where one could
    not be had."""
    from sglab.sglang import wheels

    dest = Path(dest or wheels.cache_dir())
    for v in hunk_versions():
        if wheels.cached(v, dest) is None:
            try:
                wheels.download(v, dest)
            except wheels.NoNetwork as e:
                print(f"hunk wheels: sglang {v}: {e}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(fetch_hunk_wheels())
