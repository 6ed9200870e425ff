"""Markers: ``gpu`` tests skip without CUDA; ``gpus(n)`` tests skip with fewer than n GPUs. Real
releases in tests (``REAL_CALLS``, ``require``, the session's answers): :mod:`tests.sglang_answers`.
"""

import os
import sys

import pytest

from sglab.core import bytecode
from tests import scratch_for


pytest_plugins = ["tests.sglang_answers", "tests.recorded_report"]

bytecode.enable()  # every worker and subprocess below keeps its bytecode (see sglab.core.bytecode)
os.environ.setdefault("MPLBACKEND", "Agg")
# tests of real releases run them (never the recording); the notebook tests ask for the recording
# themselves
os.environ.setdefault("SGLAB_REAL", "live")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def pytest_configure(config):
    # the old name of the real-release helpers, for test modules that still import them by it
    sys.modules.setdefault("sglab.sglang.testing", sys.modules["tests.sglang_answers"])


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


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test builds to inspect are closed after it, so the next test on this worker starts
    with none open (tests of the notebook sections check that those close their own)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.fixture(autouse=True, scope="module")
def _gpu_module_scratch(request):
    """A GPU test module's trace folders and ranks' logs go with it (:func:`tests.scratch_for`; the
    module's fixtures hand traces between its tests)."""
    with scratch_for(request.module.__name__):
        yield


@pytest.fixture(scope="module")
def forked():
    """The start method for a module's gloo launches: ranks fork from a server that imported torch
    once (a spawned rank imports it itself, about a second of CPU each); spawn, the default, is
    tested in tests/core/test_dist.py."""
    from sglab.core import dist

    dist.forkserver(["torch", "sglab.core.dist"])
    yield "forkserver"
    dist.stop_forkserver()
