"""One ``sglab run`` of every notebook in recorded mode per test session, shared by the workers
(a pytest plugin, registered by ``tests/conftest.py``): the first test that asks runs it, under a
lock in the session's shared temporary folder, and every other test reads the executed notebooks,
the pages and ``index.json`` it wrote. The notebooks' own tests and the report's browser test read
the same run instead of executing every notebook twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def recorded_report(tmp_path_factory) -> tuple[Path, str]:
    """``(folder, what the run printed)``: the report of every notebook, ``MODE='recorded'``, the
    real sections from the recording, figures through the kernel's own inline backend (as a reader
    runs it)."""
    shared = session_folder(tmp_path_factory)
    out, said = shared / "recorded-report", shared / "recorded-report.said"
    with open(shared / "recorded-report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not said.exists():
            env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
            env["SGLAB_REAL"] = "auto"
            p = subprocess.run([
                sys.executable, "-m", "sglab.tools.cli", "run", "--out",
                str(out), "--param", "MODE='recorded'"
            ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
            said.write_text(p.stdout[-4000:] + p.stderr[-2000:])
    return out, said.read_text()


def session_folder(tmp_path_factory) -> Path:
    """The folder of this test session that every xdist worker shares: the workers' parent, or,
    run without workers, the session's own (its parent holds every session's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def report_entry(folder: Path, stem: str) -> dict:
    """The run's ``index.json`` entry of notebook ``stem`` (``{}`` where it has none)."""
    path = folder / "index.json"
    entries = json.loads(path.read_text()) if path.exists() else []
    return next((e for e in entries if e.get("notebook") == f"{stem}.ipynb"), {})
