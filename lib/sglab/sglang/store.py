"""Recorded probe answers: what the real releases said on the CPU box (a ``real_cpu`` run, ``sglab
real record`` writes one). ``source`` or ``$SGLAB_REAL``: ``auto`` (default) the newest recording
where it holds the call, else live; ``live`` the installed releases; ``recorded`` never runs them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

from sglab.sglang.releases import parse_version


EXPERIMENT = "real_cpu"
METHOD_VERSION = 1
SOURCES = ("auto", "live", "recorded")


def source(requested: Optional[str] = None) -> str:
    """The source for this call: ``requested``, else ``$SGLAB_REAL``, else ``auto``."""
    value = (requested or os.environ.get("SGLAB_REAL") or "auto").strip().lower()
    if value not in SOURCES:
        raise ValueError(f"SGLAB_REAL must be one of {', '.join(SOURCES)}; got {value!r}")
    return value


def params_key(probe: str, params: Optional[dict]) -> str:
    """A stable name for one probe call's parameters (in any key order)."""
    text = json.dumps(params or {}, sort_keys=True, separators=(",", ":"), default=str)
    return f"{probe}#{hashlib.sha256(text.encode()).hexdigest()[:16]}"


@dataclass
class ProbeResult:
    """What one release answered to one call: ``ok``, ``error`` or ``not-run``."""

    release: str
    probe: str
    status: str
    rows: "object" = None  # pandas.DataFrame: release, probe, then the probe's columns
    shims: list = field(default_factory=list)  # [{"name", "reason"}]
    seconds: float = 0.0  # wall time this call added to its worker (the first: start-up)
    prepare_seconds: float = 0.0  # path set-up + shims (no sglang import); the first call only
    reason: str = ""  # error or not-run reason, one line
    traceback: str = ""
    recorded: str = ""  # where the answer came from when not run now (store)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def shim_names(self) -> list[str]:
        return [s["name"] for s in self.shims]

    def summary(self, with_source: bool = True) -> str:
        when = f" [{self.recorded}]" if self.recorded and with_source else ""
        if self.ok:
            n = len(self.rows)
            return (f"sglang {self.release}: {n} row{'' if n == 1 else 's'} in {self.seconds:.1f} s"
                    f" (shims: {', '.join(self.shim_names()) or 'none'}){when}")
        return f"sglang {self.release}: {self.status}: {self.reason}{when}"


def frame(release: str, probe: str, rows: list[dict]):
    import pandas as pd  # here: the worker's start-up imports this module

    df = pd.DataFrame(rows)
    df.insert(0, "probe", probe)
    df.insert(0, "release", release)
    return df


@dataclass
class Recording:
    results: dict  # {(params_key, release): result dict}
    label: str  # "recorded 2026-11-24 on cpu, git 1a2b3c4"
    path: Path
    sglang_home: str = ""  # the releases' folder where the manifest names it (a session's answers)

    def lookup(self, release: str, probe: str, params: Optional[dict]):
        d = self.results.get((params_key(probe, params), release))
        return None if d is None else ProbeResult(
            release, probe, d["status"], frame(release, probe, d["rows"]), d["shims"], d["seconds"],
            d["prepare_seconds"], d["reason"], d["traceback"], recorded=self.label)


def write(calls: Iterable[tuple[str, Optional[dict], dict]], *, root: Optional[Path] = None,
          extra: Optional[dict] = None) -> Path:
    """Write ``calls`` (``(probe, params, {release: result})``) as a ``real_cpu`` run."""
    from sglab.core import runs

    rows, stored = [], []
    for probe, params, results in calls:
        key = params_key(probe, params)
        for release, r in results.items():
            found = [] if r.rows is None else r.rows.drop(columns=["release", "probe"],
                                                          errors="ignore").to_dict("records")
            seconds = dict(seconds=round(r.seconds, 3), prepare_seconds=round(r.prepare_seconds, 3))
            stored.append(
                dict(key=key, release=r.release, probe=r.probe, status=r.status, rows=found,
                     shims=r.shims, **seconds, reason=r.reason, traceback=r.traceback))
            rows.append(
                dict(variant=release, probe=probe, params_key=key, status=r.status, metric="rows",
                     value=len(found), unit="count"))
    with tempfile.TemporaryDirectory() as tmp:
        sidecar = Path(tmp) / "results.json.gz"
        with gzip.open(sidecar, "wt") as f:
            json.dump(stored, f, default=str)
        probes, releases = {r["probe"] for r in rows}, {r["variant"] for r in rows}
        extra = {"releases": sorted(releases, key=parse_version), **(extra or {})}
        return runs.write_run(runs.tidy(EXPERIMENT, rows), experiment=EXPERIMENT,
                              method_version=METHOD_VERSION, params={"probes": sorted(probes)},
                              root=root or runs.data_dir("recorded"), gpu_count=0, extra=extra,
                              sidecars={"results": sidecar})


@lru_cache(maxsize=4)
def _read(path: str, mtime: float) -> Recording:
    from sglab.core import runs

    run = runs.read_run(path)
    with gzip.open(run.sidecar("results"), "rt") as f:
        stored = json.load(f)
    m = run.manifest
    label = f"recorded {m.date} on {m.gpu_name}, git {str(m.git_sha)[:7]}"
    results = {(d["key"], d["release"]): d for d in stored}
    return Recording(results, label, Path(path), m.sglang_home)


def newest(root: Optional[Path] = None) -> Optional[Recording]:
    """The newest recording under ``data/recorded/real_cpu/`` (``root/real_cpu/``), or None."""
    from sglab.core import runs

    paths = runs.list_runs(EXPERIMENT, root=root)
    return _read(str(paths[-1]), paths[-1].stat().st_mtime) if paths else None
