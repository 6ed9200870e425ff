"""The per-kernel table: reduction of kernel records, readable names, and the hand-over of
nsight-python's per-kernel records (through a stand-in for nsight-python on this CPU machine)."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import pytest

from sglab.core import kernel_table as kt
from sglab.core import kernels


GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
COPY = ("void at::native::elementwise_kernel<128, 4, "
        "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_"
        "kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
        "const>(at::TensorIteratorBase&)")


def test_reduce_records_counts_calls_per_run_and_shares():
    records = []
    for run in range(2):  # two runs of: gemm, copy, gemm
        records += [("eager", GEMM, 100_000 + run * 10_000), ("eager", COPY, 20_000),
                    ("eager", GEMM, 100_000)]
    t = kt.reduce_records(records, runs=2, backend="test")
    assert list(t.columns) == kt.COLUMNS
    gemm, copy = t.set_index("kernel").loc[GEMM], t.set_index("kernel").loc[COPY]
    assert gemm.calls == 2 and copy.calls == 1
    assert gemm.median_us == 100.0 and gemm.total_us == pytest.approx((210 + 200) / 2)
    assert copy.total_us == 20.0
    assert t.share.sum() == pytest.approx(1.0) and t.kernel.iloc[0] == GEMM  # ordered by time
    assert kt.calls_per_run(t) == {"eager": 3.0}
    with pytest.raises(ValueError):
        kt.reduce_records(records, runs=0, backend="test")


def test_short_names():
    assert kt.short_name(COPY) == "elementwise_kernel [direct_copy]"
    mangled = ("_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_22gpu_kernel_impl_nocastIZZZNS0_"
               "23direct_copy_kernel")
    assert kt.short_name(mangled) == "elementwise_kernel [direct_copy]"
    assert (kt.short_name("_ZN13pytorch_flash16flash_fwd_kernelI23Flash_fwd_kernel_traits") ==
            "flash_fwd_kernel")
    assert kt.short_name(GEMM) == GEMM
    assert len(kt.short_name("x" * 100)) == 48


class _ActionData:

    def __init__(self, name, ns):
        import numpy as np

        self.name, self.values = name, np.array([ns])


@contextmanager
def fake_nsight(kernels_per_call):
    """A stand-in for nsight-python: runs the annotated regions and hands per-kernel records to its
    ``extraction.extract_df_from_data`` as the real CUPTI collector does."""
    import pandas as pd

    ns = types.ModuleType("nsight")
    extraction = types.ModuleType("nsight.extraction")
    extraction.extract_df_from_data = lambda data, *a, **k: pd.DataFrame(
        [{"Annotation": label, "AvgValue": 1.0, "MinValue": 1.0, "MaxValue": 1.0, "NumRuns": 2}
         for label in data])
    ns.extraction = extraction
    ns.Tool = types.SimpleNamespace(CUPTI="cupti", NCU="ncu")
    ns.VerbosityLevel = types.SimpleNamespace(SILENT=0)
    ns.activate = ns.deactivate = lambda *a: None
    current = []

    @contextmanager
    def annotate(label):
        current.append(label)
        yield

    def kernel(configs, runs, **kw):

        def deco(fn):

            def bench():
                for _ in range(runs):
                    fn(0)
                data = {}
                for label in current:
                    data.setdefault(label, []).extend(
                        _ActionData(n, d) for n, d in kernels_per_call[label])
                df = ns.extraction.extract_df_from_data(data)
                return types.SimpleNamespace(to_dataframe=lambda: df)

            return bench

        return deco

    ns.annotate = annotate
    ns.analyze = types.SimpleNamespace(kernel=kernel)
    saved = {k: sys.modules.get(k) for k in ("nsight", "nsight.extraction")}
    sys.modules.update({"nsight": ns, "nsight.extraction": extraction})
    try:
        yield ns
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_nsight_session_hands_over_every_kernel_and_restores_nsight():
    calls = {"a": [(GEMM, 5000.0), (COPY, 1000.0)]}
    with fake_nsight(calls) as ns:
        original = ns.extraction.extract_df_from_data

        def body():
            with ns.annotate("a"):
                pass

        with kernels.nsight_session("cupti") as profile:
            per_kernel = profile(body, 2)
        assert ns.extraction.extract_df_from_data is original  # nsight-python is left as it was
    assert per_kernel == [("a", GEMM, 5000.0), ("a", COPY, 1000.0)] * 2


def test_kernel_table_from_nsight_records(monkeypatch):
    calls = {"eager": [(GEMM, 5000.0), (COPY, 1000.0)]}
    monkeypatch.setattr(kernels, "nsight_backend", lambda: ("cupti", "stand-in"))
    with fake_nsight(calls):
        t = kt.kernel_table({"eager": lambda: None}, runs=2, warmup=0)
    assert t.attrs["backend"] == "cupti" and set(t.backend) == {"cupti"}
    assert kt.calls_per_run(t) == {"eager": 2.0}


def test_kernel_table_says_why_nsight_did_not_run(monkeypatch):
    monkeypatch.setattr(kernels, "nsight_backend", lambda:
                        ("torch-profiler", "nsight-python is not installed"))
    monkeypatch.setattr(kt, "profiler_records",
                        lambda fns, runs, warmup: [("x", GEMM, 1000.0)] * runs)
    t = kt.kernel_table({"x": lambda: None}, runs=3, warmup=0)
    assert t.attrs["backend"] == "torch-profiler" and "not installed" in t.attrs["reason"]
    assert kt.calls_per_run(t) == {"x": 1.0}
    with pytest.raises(ValueError):
        kt.kernel_table({})
