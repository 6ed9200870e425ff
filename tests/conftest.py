"""Markers: ``gpu`` tests skip without CUDA; ``gpus(n)`` tests skip with fewer than n GPUs."""

import os

import pytest

from sglab.core import bytecode

bytecode.enable()  # every worker and subprocess below keeps its bytecode (see sglab.core.bytecode)
os.environ.setdefault("MPLBACKEND", "Agg")
# tests of real releases run them (never the recording); the notebook tests ask for the recording themselves
os.environ.setdefault("SGLAB_REAL", "live")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
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
