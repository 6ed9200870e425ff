"""Run a probe against real SGLang releases, one subprocess per release: :func:`run_probe`, :func:`run_probes`.

Why a subprocess: a release is a whole ``sglang`` package plus shims installed into ``sys.modules``; two
releases cannot share a process, and the caller's process (a notebook, pytest) must never import either.
Every subprocess runs in its own session with a timeout; on timeout the whole process group is killed, so
nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional
from sglab.sglang.releases import parse_version, release_installed
import argparse
import importlib
import logging
import traceback
import warnings


DEFAULT_TIMEOUT_S = 300.0


@dataclass
class ProbeResult:
    """What one release did. ``status``: ``ok``, ``error`` (the probe raised) or ``not-run`` (the release is
    not installed or does not import here; ``reason`` says which module and why)."""

    release: str
    probe: str
    status: str
    rows: "object" = None           # pandas.DataFrame: release, probe, then the probe's columns
    shims: list = field(default_factory=list)   # [{"name", "reason"}]
    seconds: float = 0.0            # wall time of the subprocess
    prepare_seconds: float = 0.0    # path set-up + shims (includes no sglang import)
    reason: str = ""                # error or not-run reason, one line
    traceback: str = ""
    recorded: str = ""              # where the answer came from when not run now (sglab.sglang.store)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def shim_names(self) -> list[str]:
        return [s["name"] for s in self.shims]

    def summary(self, with_source: bool = True) -> str:
        when = f" [{self.recorded}]" if self.recorded and with_source else ""
        if self.ok:
            return (f"sglang {self.release}: {len(self.rows)} rows in {self.seconds:.1f} s"
                    f" (shims: {', '.join(self.shim_names()) or 'none'}){when}")
        return f"sglang {self.release}: {self.status}: {self.reason}{when}"


def _frame(release: str, probe: str, rows: list[dict]):
    import pandas as pd

    df = pd.DataFrame(rows)
    df.insert(0, "probe", probe)
    df.insert(0, "release", release)
    return df


def _env() -> dict:
    """The caller's environment, with this package importable in the child whether or not it is installed."""
    env = dict(os.environ)
    lib = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _spawn(cmd: list[str], timeout: float) -> tuple[Optional[int], str]:
    """(exit code or None on timeout, stderr tail). Kills the child's whole process group on timeout."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=_env(), start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err[-4000:]
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return None, ""


def run_probe(release: str, probe: str, params: Optional[dict] = None, *,
              timeout: float = DEFAULT_TIMEOUT_S) -> ProbeResult:
    """Run ``probe`` (``module:function``; a bare module is under ``sglab.sglang.probes``) on ``release`` in a
    fresh subprocess and return its rows. Never raises for a release that cannot run: the result says why."""
    parse_version(release)
    if not release_installed(release):
        return ProbeResult(release, probe, "not-run", _frame(release, probe, []),
                           reason=f"sglang {release}: not installed (run `sglab real install --releases {release}`)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sglab-probe-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "sglab.sglang.runner", "--release", release, "--probe", probe,
               "--params", json.dumps(params or {}), "--out", str(out)]
        code, err = _spawn(cmd, timeout)
        seconds = time.perf_counter() - t0
        if code is None:
            return ProbeResult(release, probe, "error", _frame(release, probe, []), seconds=seconds,
                               reason=f"sglang {release}: {probe} did not finish in {timeout:.0f} s (killed)")
        if not out.exists():
            last = [ln for ln in err.strip().splitlines() if ln.strip()]
            return ProbeResult(release, probe, "error", _frame(release, probe, []), seconds=seconds,
                               reason=f"sglang {release}: worker exited {code}: {last[-1] if last else 'no output'}",
                               traceback=err)
        data = json.loads(out.read_text())
    status = "not-run" if data["not_run"] else ("error" if data["error"] else "ok")
    return ProbeResult(release, probe, status, _frame(release, probe, data["rows"]), data["shims"], seconds,
                       data["seconds"].get("prepare", 0.0), data["not_run"] or data["error"] or "",
                       data.get("traceback", ""))


def run_probes(releases: Iterable[str], probe: str, params: Optional[dict] = None, *, jobs: int = 2,
               timeout: float = DEFAULT_TIMEOUT_S, source: Optional[str] = None) -> dict[str, ProbeResult]:
    """:func:`run_probe` on several releases, ``jobs`` subprocesses at a time; {release: result}, in order.

    ``source`` (default ``$SGLAB_REAL``, else ``auto``): where a recording holds the answer it is taken from there
    unless ``live``; ``recorded`` never runs a release (:mod:`sglab.sglang.store`)."""
    from sglab.sglang import store

    releases, src = list(releases), store.source(source)
    found: dict[str, ProbeResult] = {}
    if src != "live":
        rec = store.newest()
        for v in releases:
            hit = rec.lookup(v, probe, params) if rec is not None else None
            if hit is not None:
                found[v] = hit
            elif src == "recorded":
                found[v] = ProbeResult(v, probe, "not-run", _frame(v, probe, []),
                                       reason=f"sglang {v}: {probe} with these parameters is not in the recording")
    todo = [v for v in releases if v not in found]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {v: pool.submit(run_probe, v, probe, params, timeout=timeout) for v in todo}
        found.update({v: f.result() for v, f in futures.items()})
    return {v: found[v] for v in releases}


# --------------------------------------------------------------------------------------------------
# worker: One real SGLang release in one process: ``python -m sglab.sglang.runner --release V --p
# --------------------------------------------------------------------------------------------------


def _resolve(probe: str):
    module, _, func = probe.partition(":")
    if not func:
        raise ValueError(f"probe must be MODULE:FUNCTION, got {probe!r}")
    if "." not in module:
        module = f"sglab.sglang.probes.{module}"
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


def run(release: str, probe: str, params: dict) -> dict:
    from sglab.sglang import bootstrap

    out = {"release": release, "probe": probe, "rows": [], "shims": [], "seconds": {}, "error": None,
           "not_run": None}
    t0 = time.perf_counter()
    try:
        prepared = bootstrap.prepare(release)
    except bootstrap.NotRunnable as exc:
        out["not_run"] = str(exc)
        return out
    out["shims"] = [s.as_dict() for s in prepared.shims]
    out["seconds"]["prepare"] = round(time.perf_counter() - t0, 3)
    t1 = time.perf_counter()
    try:
        fn = _resolve(probe)
        rows = fn(prepared, params)
        out["rows"] = [{k: _jsonable(v) for k, v in row.items()} for row in rows]
    except bootstrap.NotRunnable as exc:
        out["not_run"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which decides
        tb = traceback.format_exc().strip().splitlines()
        out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        out["traceback"] = "\n".join(tb[-25:])
    out["seconds"]["probe"] = round(time.perf_counter() - t1, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglab.sglang.runner")
    ap.add_argument("--release", required=True)
    ap.add_argument("--probe", required=True, help="MODULE:FUNCTION (bare MODULE: sglab.sglang.probes.MODULE)")
    ap.add_argument("--params", default="{}", help="JSON object passed to the probe")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    # SGLang and transformers warn loudly about the GPU-less machine; the caller only sees our JSON
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    result = run(args.release, args.probe, json.loads(args.params))
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
