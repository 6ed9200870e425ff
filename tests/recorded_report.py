"""One ``sglab run`` of every notebook in recorded mode per test session, shared by the workers
(a pytest plugin, registered by ``tests/conftest.py``): the first test that asks runs it, under a
lock in the session's shared temporary folder, and every other test reads the executed notebooks,
the pages and ``index.json`` it wrote. The notebooks' own tests and the report's browser test read
the same run instead of executing every notebook twice.

A run where every notebook passed is kept in ``reports/.recorded-cache/<key>``, the key a digest
of everything it read: the package, the notebooks, ``data/`` (``data/runs/`` too), the installed
distributions, the interpreter, the ``SGLAB_*`` variables and whether a GPU is here. The next
session with the same inputs copies it instead of running the notebooks again;
``SGLAB_FRESH_REPORT=1`` runs them anyway.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "reports" / ".recorded-cache"
SAID = "said.txt"  # what the run printed, beside its folder
HERE = "{report}"  # in a kept said.txt, the folder the run wrote


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
            key = inputs_key()
            kept = CACHE / key / "report"
            if os.environ.get("SGLAB_FRESH_REPORT") != "1" and (kept.parent / SAID).exists():
                shutil.copytree(kept, out)
                said.write_text(said_for(kept, out))
            else:
                env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
                env["SGLAB_REAL"] = "auto"
                p = subprocess.run([
                    sys.executable, "-m", "sglab.tools.cli", "run", "--out",
                    str(out), "--param", "MODE='recorded'"
                ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
                said.write_text(p.stdout[-4000:] + p.stderr[-2000:])
                if p.returncode == 0:
                    keep(out, said.read_text(), key)
    return out, said.read_text()


def inputs_key() -> str:
    """A digest of what a recorded run of the notebooks reads (see the module's docstring)."""
    h = hashlib.sha256(f"{sys.version} {sys.executable}".encode() + Path(__file__).read_bytes())
    files = [
        *(ROOT / "lib" / "sglab").rglob("*.py"), *(ROOT / "notebooks").rglob("*"),
        *(ROOT / "data").rglob("*"), ROOT / "pyproject.toml"
    ]
    for f in sorted(f for f in files if f.is_file() and ".ipynb_checkpoints" not in f.parts):
        h.update(f"{f.relative_to(ROOT)}\0".encode() + hashlib.sha256(f.read_bytes()).digest())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    env = sorted(
        f"{k}={v}"
        for k, v in os.environ.items() if k.startswith("SGLAB_") and k != "SGLAB_FRESH_REPORT")
    gpu = [Path("/dev/nvidia0").exists(), shutil.which("nvidia-smi") is not None]
    h.update(json.dumps([dists, env, gpu]).encode())
    return h.hexdigest()[:16]


def keep(out: Path, said: str, key: str) -> None:
    """``out`` as the kept run of ``key``, written whole or not at all; the others go."""
    tmp = CACHE / f".{key}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(out, tmp / "report")
    (tmp / SAID).write_text(said.replace(str(out), HERE))  # a copy names its own folder
    for old in (CACHE.glob("[0-9a-f]*") if CACHE.exists() else []):
        shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.rename(CACHE / key)
    except OSError:  # another session kept the same run meanwhile
        shutil.rmtree(tmp, ignore_errors=True)


def said_for(kept: Path, out: Path) -> str:
    """What the kept run ``kept`` printed, naming ``out``, where it is copied, as its folder."""
    return (kept.parent / SAID).read_text().replace(HERE, str(out))


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
