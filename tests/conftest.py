"""Markers: ``gpu`` tests skip without CUDA; ``gpus(n)`` tests skip with fewer than n GPUs.

Real releases: a test module that asks the installed releases live names its calls in ``REAL_CALLS``
(a fix's name stands for its notebook's call, the fix record's probe; else ``(probe, params,
releases)``). The session answers all the calls of the collected modules with one worker per
release, run by the first process that needs an answer and read by the others (xdist workers) from a
folder they share (:mod:`sglab.sglang.runner`). That folder is kept under ``.sglang/answers``, keyed
by the releases and the calls (:func:`~sglab.sglang.runner.answers_folder`), and its answers are
kept while the package files they ran are unchanged, so a second ``make test`` after an edit
elsewhere reads them; ``SGLAB_FRESH_ANSWERS=1`` runs them again.
"""

import os

import pytest

from sglab.core import bytecode
from sglab.sglang import runner
from sglab.tools import fixes


bytecode.enable()  # every worker and subprocess below keeps its bytecode (see sglab.core.bytecode)
os.environ.setdefault("MPLBACKEND", "Agg")
# tests of real releases run them (never the recording); the notebook tests ask for the recording
# themselves
os.environ.setdefault("SGLAB_REAL", "live")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _seconds(item) -> float:
    m = item.get_closest_marker("long")
    return float(m.args[0]) if m else 0.0


def pytest_collection_modifyitems(config, items):
    # the files marked `long` first, longest first (the order is kept within a file and among the
    # rest): xdist hands whole files to its workers in this order (--no-loadscope-reorder), so a
    # minutes-long file does not start last and leave the other workers idle
    items.sort(key=lambda item: -_seconds(item))
    n = _cuda_count()
    for item in items:
        need = 0
        if item.get_closest_marker("gpu"):
            need = 1
        m = item.get_closest_marker("gpus")
        if m:
            need = max(need, int(m.args[0]))
        if need and n < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPU(s), found {n}"))


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """An empty data/ tree (runs, recorded, traces) used instead of the checkout's."""
    for k in ("runs", "recorded", "traces"):
        (tmp_path / k).mkdir()
    monkeypatch.setenv("SGLAB_DATA", str(tmp_path))
    return tmp_path


def _real_calls(items) -> list:
    """The ``REAL_CALLS`` of the modules of ``items``, each call once, in collection order."""
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
    workers' common base folder), so that each release runs once for all of them; nothing runs until
    a test needs an answer."""
    calls = _real_calls(request.session.items)
    if not calls:
        yield None
        return
    if os.environ.get("SGLAB_FRESH_ANSWERS") == "1":  # run the releases again, whatever is kept
        base = tmp_path_factory.getbasetemp()
        shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "real-answers"
    else:  # the answers of an earlier session with the same code, releases and calls
        shared = runner.answers_folder(calls)
    folder = runner.start_session(shared, calls)
    yield folder
    os.environ.pop(runner.SESSION_ENV, None)


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test builds to inspect are closed after it, so the next test on this worker starts
    with none open (tests of the notebook sections check that those close their own)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
