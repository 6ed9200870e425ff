"""Op ranges (sglab.core.kernel_table) and the per-op kernel table's reductions
(sglab.core.kernel_table), on the CPU."""

from __future__ import annotations

from contextlib import contextmanager

import pandas as pd
import pytest
import torch

from sglab.core import kernel_table as op_kernels, kernel_table as ops
from sglab.core import kernels


def test_op_ranges_label_ops_with_scope_and_step():
    entered = []

    @contextmanager
    def enter(label):
        entered.append(label)
        yield

    m, loc, k, kc = torch.arange(10), torch.tensor([1, 2]), torch.ones(2, 3), torch.zeros(10, 3)
    with ops.OpRanges(enter) as mode:
        h = k * 2.0
        with mode.scope("write"):
            x = m[loc].to(torch.int32)
            kc[x.to(torch.int64)] = h
        h.unsqueeze(0)  # a view: not wrapped
    assert [c.label for c in mode.calls] == [
        "||mul", "write|0|index", "write|1|_to_copy->int32", "write|2|_to_copy->int64",
        "write|3|index_put_"
    ]
    assert entered == [c.label for c in mode.calls]
    assert torch.equal(kc[1:3], torch.full((2, 3), 2.0))  # the ops still ran


def test_counting_ops_does_not_import_torch_dynamo():
    """torch would wrap the mode's handler in ``torch._disable_dynamo``, which imports
    ``torch._dynamo`` (2.5-3 s on a 2-CPU box) at the first op; DispatchMode opts out."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from sglab.core.kernel_table import OpRanges\n"
            "with OpRanges() as mode:\n"
            "    torch.ones(2) + 1\n"
            "print(len(mode.calls), 'torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    assert out == ["2", "False"]


def test_unique_labels_and_parse():
    with ops.OpRanges(None, unique=True) as mode:
        torch.ones(2) + 1
        torch.ones(2) + 1
    assert [c.op for c in mode.calls] == ["ones", "add", "ones", "add"]
    assert ops.parse_label("0003|write|2|index_put_") == ops.OpCall("write", 2, "index_put_")
    assert ops.parse_label("||mul") == ops.OpCall("", None, "mul")
    with pytest.raises(ValueError):
        ops.parse_label("mul")
    with pytest.raises(ValueError):
        with ops.OpRanges() as mode, mode.scope("a|b"):
            pass


def test_demangle():
    assert ops.demangle("_ZN2at6native24vectorized_gather_kernelILi16ElEEvPcS2_PT0_illllb") \
        .startswith("void at::native::vectorized_gather_kernel<16, long>(")
    assert ops.demangle("not mangled") == "not mangled"
    assert ops.demangle("_Znot_valid_at_all") == "_Znot_valid_at_all"


def _samples(variant, rows, runs=2):
    out = []
    for _ in range(runs):
        for label, kernel, dur in rows:
            out.append({"variant": variant, "label": label, "kernel": kernel, "dur_us": dur})
    return pd.DataFrame(out)


def test_aggregate_counts_calls_per_step_and_median():
    rows = [("||mul", "mulk", 1.0), ("||mul", "mulk", 3.0), ("w|0|index", "gather", 2.0)]
    s = pd.concat([_samples("before", rows), _samples("after", rows[:2])])
    t = op_kernels.aggregate(s, runs=2, backend="x")
    assert list(t.columns) == op_kernels.OP_COLUMNS
    mul = t[(t.variant == "before") & (t.op == "mul")].iloc[0]
    assert (mul.calls, mul.median_us, mul.step, mul.scope) == (2.0, 2.0, -1, "")
    g = t[t.op == "index"].iloc[0]
    assert (g.calls, g.step, g.scope) == (1.0, 0, "w")
    assert op_kernels.aggregate(s.iloc[0:0], runs=2, backend="x").empty


def test_cross_check_names_the_differences():
    rows = [("||mul", "mulk", 1.0), ("w|0|index", "gather", 2.0)]
    a = op_kernels.aggregate(_samples("v", rows), runs=2, backend="a")
    b = op_kernels.aggregate(_samples("v", rows), runs=2, backend="b")
    assert op_kernels.cross_check(a, b) == {
        "rows": 2, "equal": 2, "only_in_a": [], "only_in_b": [], "differ": []
    }
    c = op_kernels.aggregate(_samples("v", rows + [("w|0|index", "gather", 2.0)]), runs=2,
                             backend="c")
    res = op_kernels.cross_check(a, c)
    assert res["equal"] == 1 and res["differ"] == [("v", "w", 0, "index", "gather")]


def test_nsight_says_why_not(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_nsight(name, *a, **kw):
        if name == "nsight" or name.startswith("nsight."):
            raise ImportError("No module named 'nsight'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_nsight)
    tool, why = kernels.nsight_backend()
    assert tool != "cupti" and "not installed" in why
    table, reason = op_kernels.nsight_table({"v": lambda mode: None})
    assert table is None and "not installed" in reason
