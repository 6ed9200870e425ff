"""Run probes against real SGLang releases, one worker subprocess per release (two cannot share a
process, and the caller must never import one) answering every call in turn; a call past its
timeout kills the worker's process group, as does an exception or a signal in the caller (with
the temporary folder the worker wrote in). Where answers come from: :mod:`sglab.sglang.store`."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Optional

from sglab.core import procs
from sglab.sglang import store
from sglab.sglang.store import ProbeResult, frame
from sglab.sglang.releases import parse_version, release_installed, worker_env


DEFAULT_TIMEOUT_S = 300.0
POLL_S = 0.2  # how often a waiting parent looks at its worker's answers
# answers a test session has run already, where one keeps them (tests/sglang_answers.py sets it)
shared_answers: Optional[Callable[[], Optional[store.Recording]]] = None


def call_key(probe: str, params: Optional[dict]) -> tuple[str, str]:
    """``(probe, params key)``: one call, the same for its parameters in any key order."""
    return probe, store.params_key(probe, params)


def _spawn(cmd: list[str], timeout: float, progress: Optional[Callable[[], int]] = None,
           stop: Optional[threading.Event] = None, tmp: str = "") -> tuple[Optional[int], str]:
    """(exit code, None when killed; stderr tail); killed ``timeout`` s without ``progress()``."""
    if stop is not None and stop.is_set():
        return None, ""
    env = {**worker_env(), **({"TMPDIR": tmp} if tmp else {})}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, text=True, env=env, start_new_session=True)
        procs.track(proc.pid)
        deadline, seen = time.monotonic() + timeout, 0
        code: Optional[int] = None
        try:
            while True:
                try:
                    code = proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    pass
                grown = progress() if progress is not None else seen
                if grown > seen:
                    seen, deadline = grown, time.monotonic() + timeout
                elif time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                    break
        finally:  # timed out, interrupted, or done: nothing of the worker's group stays
            procs.stop(proc.pid, grace=0.0)
            proc.wait()
            procs.untrack(proc.pid)
        err.seek(0)
        return code, err.read()[-4000:]


Results = dict[tuple[str, str], ProbeResult]  # {(probe, params key): result}


def run_release(release: str, calls: Iterable[tuple[str, Optional[dict]]], *,
                timeout: float = DEFAULT_TIMEOUT_S,
                stop: Optional[threading.Event] = None) -> tuple[Results, set]:
    """``{(probe, params key): result}`` of ``calls`` on ``release`` in one worker, and the keys
    the worker itself answered (never raises)."""
    parse_version(release)
    todo: dict[tuple[str, str], tuple[str, dict]] = {}
    for probe, params in calls:
        todo.setdefault(call_key(probe, params), (probe, params or {}))
    if not release_installed(release):
        reason = f"sglang {release}: not installed (run `sglab real install --releases {release}`)"
        return {
            k: ProbeResult(release, k[0], "not-run", frame(release, k[0], []), reason=reason)
            for k in todo
        }, set()
    if not todo:
        return {}, set()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sglab-probe-") as tmp:
        asked, out = Path(tmp) / "calls.json", Path(tmp) / "answers.jsonl"
        asked.write_text(json.dumps([{"probe": p, "params": prm} for p, prm in todo.values()]))
        # -W: runpy's warning that the package imported the runner before ``-m`` ran it is noise
        cmd = [
            sys.executable, "-W", "ignore::RuntimeWarning:runpy", "-m", "sglab.sglang.runner",
            "--release", release, "--calls", f"@{asked}", "--out", f"{out}"
        ]
        written = lambda: out.stat().st_size if out.exists() else 0  # noqa: E731
        code, err = _spawn(cmd, timeout, progress=written, stop=stop, tmp=tmp)
        ended, answers = time.time(), {}
        for line in out.read_text().splitlines(keepends=True) if out.exists() else ():
            try:  # every complete line the worker wrote
                data = json.loads(line) if line.endswith("\n") else None
            except ValueError:
                data = None
            if data is None:
                break
            answers[data["index"]] = data
    for data in answers.values():
        code_loaded.update(data.get("code", ()))
    results: dict[tuple[str, str], ProbeResult] = {}
    last, running = started, None
    for i, (key, (probe, _)) in enumerate(todo.items()):
        data = answers.get(i)
        rows = frame(release, probe, data["rows"] if data is not None else [])
        if data is not None:
            status = "not-run" if data["not_run"] else ("error" if data["error"] else "ok")
            reason = data["not_run"] or data["error"] or ""
            results[key] = ProbeResult(release, probe, status, rows, data["shims"],
                                       max(0.0, data["finished"] - last),
                                       data["seconds"].get("prepare", 0.0), reason,
                                       data.get("traceback", ""))
            last = data["finished"]
        elif running is None:  # the call the worker was on when it was killed or died
            running = probe
            tail = [ln for ln in err.strip().splitlines() if ln.strip()] or ["no output"]
            reason = (f"sglang {release}: {probe} did not finish in {timeout:.0f} s (killed)"
                      if code is None else f"sglang {release}: worker exited {code}: {tail[-1]}")
            results[key] = ProbeResult(release, probe, "error", rows, seconds=max(
                0.0, ended - last), reason=reason, traceback="" if code is None else err)
        else:
            how = f"was killed after {timeout:.0f} s" if code is None else f"exited {code}"
            reason = f"sglang {release}: {probe} not answered: the worker {how} while {running} ran"
            results[key] = ProbeResult(release, probe, "error", rows, reason=reason)
    answered = {k for i, k in enumerate(todo) if i in answers}
    return results, answered


def run_batch(calls: Iterable[tuple[str, Optional[dict], Iterable[str]]], *, jobs: int = 2,
              timeout: float = DEFAULT_TIMEOUT_S, progress: Optional[Callable[[str, dict],
                                                                              None]] = None,
              answered_only: bool = False) -> dict[str, dict]:
    """``{release: {(probe, params key): result}}``, one worker per release, ``jobs`` at a time."""
    per_release: dict[str, list[tuple[str, Optional[dict]]]] = {}
    for probe, params, releases in calls:
        for v in releases:
            per_release.setdefault(v, []).append((probe, params))
    done: dict[str, dict] = {}
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            # the busiest releases first, so that the last worker to start is a short one
            futures = {
                pool.submit(run_release, v, per_release[v], timeout=timeout, stop=stop): v
                for v in sorted(per_release, key=lambda v: -len(per_release[v]))
            }
            for f in as_completed(futures):
                v, (results, answered) = futures[f], f.result()
                done[v] = {k: r for k, r in results.items() if not answered_only or k in answered}
                if progress is not None:
                    progress(v, results)
        except BaseException:  # a signal or Ctrl-C here: no worker starts, the running ones stop
            stop.set()
            pool.shutdown(cancel_futures=True)
            raise
    return {v: done[v] for v in per_release}


def run_probe(release: str, probe: str, params: Optional[dict] = None, *,
              timeout: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    """``probe`` on ``release`` in a fresh worker, now (the result says why it could not run)."""
    return run_release(release, [(probe, params)], timeout=timeout)[0][call_key(probe, params)]


def run_probes(
        releases: Iterable[str], probe: str, params: Optional[dict] = None, *, jobs: int = 2,
        timeout: float = DEFAULT_TIMEOUT_S, source: Optional[str] = None,
        progress: Optional[Callable[[str, ProbeResult], None]] = None) -> dict[str, ProbeResult]:
    """``{release: result}`` of ``probe``: recorded where ``source`` allows, else run now."""
    releases, src = list(releases), store.source(source)
    found: dict[str, ProbeResult] = {}
    if src != "live":
        rec = store.newest()
        for v in releases:
            hit = rec.lookup(v, probe, params) if rec is not None else None
            if hit is not None:
                found[v] = hit
            elif src == "recorded":
                found[v] = ProbeResult(
                    v, probe, "not-run", frame(v, probe, []),
                    reason=f"sglang {v}: {probe} with these parameters is not in the recording")
    todo = [v for v in releases if v not in found]
    if todo and shared_answers is not None and any(release_installed(v) for v in todo):
        session = shared_answers()
        for v in todo:
            hit = session.lookup(v, probe, params) if session is not None else None
            if hit is not None and release_installed(v):
                hit.recorded = ""  # answered in this test session: live
                found[v] = hit
    if progress is not None:
        for v in (v for v in releases if v in found):
            progress(v, found[v])
    key = call_key(probe, params)
    ran = run_batch([(probe, params, [v for v in releases if v not in found])], jobs=jobs,
                    timeout=timeout, progress=progress
                    and (lambda v, results: progress(v, results[key])))
    found.update((v, results[key]) for v, results in ran.items())
    return {v: found[v] for v in releases}


PACKAGE = Path(__file__).resolve().parents[1]
code_loaded: set = set()  # the package files the workers of this process reported (loaded_code)


def loaded_code() -> list[str]:
    """The files of this package this process has imported (what its answers depend on)."""
    out = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and Path(f).resolve().is_relative_to(PACKAGE):
            out.add(Path(f).resolve().relative_to(PACKAGE).as_posix())
    return sorted(out)


def _resolve(probe: str):
    module, _, func = probe.partition(":")
    if not func:
        raise ValueError(f"probe must be MODULE:FUNCTION, got {probe!r}")
    if "." not in module:
        raise ValueError(f"probe module must be dotted (sglab.<fix>.sglang), got {module!r}")
    return getattr(importlib.import_module(module), func)


def _jsonable(value):
    """Probe values are plain Python; tensors' dtypes and the like are written as their text."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _blank(release: str, probe: str, shims=(), not_run=None) -> dict:
    return dict(release=release, probe=probe, rows=[], shims=[asdict(s) for s in shims], seconds={},
                error=None, not_run=not_run)


def answer(prepared, probe: str, params: dict) -> dict:
    """One call in a prepared worker: the probe's rows, or the error or not-run reason it raised."""
    from sglab.sglang import bootstrap  # here: the worker is the only one that needs it

    out = _blank(prepared.release, probe, prepared.shims)
    try:
        rows = _resolve(probe)(prepared, params)
        out["rows"] = [{k: _jsonable(v) for k, v in row.items()} for row in rows]
    except bootstrap.NotRunnable as exc:
        out["not_run"] = str(exc)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the caller, which decides
        tb = traceback.format_exc().strip().splitlines()
        text = str(exc).strip()
        out["error"] = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        out["traceback"] = "\n".join(tb[-25:])
    return out


def run(release: str, calls: list[dict], emit: Callable[[dict], None]) -> None:
    """Prepare ``release`` once, then ``emit`` the answer to each call."""
    from sglab.sglang import bootstrap  # late: see answer()

    t0 = time.perf_counter()
    try:
        prepared, cause = bootstrap.prepare(release), None
    except bootstrap.NotRunnable as exc:
        prepared, cause = None, str(exc)
    prepare_s = round(time.perf_counter() - t0, 3)
    for i, call in enumerate(calls):
        out = (answer(prepared, call["probe"],
                      call.get("params") or {}) if prepared is not None else _blank(
                          release, call["probe"], not_run=cause))
        if i == 0:
            out["seconds"]["prepare"] = prepare_s
        emit({**out, "index": i, "finished": time.time(), "code": loaded_code()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglab.sglang.runner")
    ap.add_argument("--release", required=True)
    ap.add_argument("--calls", required=True,
                    help='@FILE of [{"probe": MODULE:FUNCTION, "params"}]')
    ap.add_argument("--out", required=True, type=Path, help="one JSON line per answer")
    args = ap.parse_args(argv)
    calls = json.loads(Path(args.calls.removeprefix("@")).read_text())
    # SGLang and transformers warn loudly about the GPU-less machine; the caller only sees our JSON
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    with open(args.out, "a") as f:

        def emit(data: dict) -> None:
            f.write(json.dumps(data) + "\n")  # a line per answer, flushed: the parent's progress
            f.flush()

        run(args.release, calls, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
