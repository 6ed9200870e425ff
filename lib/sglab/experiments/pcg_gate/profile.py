"""Notebook 01's profiler pass: eager and piecewise prefill under torch.profiler, and a per-kernel table.

Runs after the timed passes and never feeds them. One phase range per prefill (``"<variant> <tokens>"``, e.g.
``"piecewise 4096"``) at a launch-bound and a GEMM-bound token count; the device is synchronised between phases so
their kernels do not overlap. From the trace, per phase: kernels, device time, the device-side span of the forward
and how much of it the GPU was busy (launch gaps show as idle time), the time of the copy kernels and memcpys that
hand activations between pieces, graph and kernel launches on the host.

The per-kernel table (measured first: nsight-python's CUPTI collector cannot subscribe once torch.profiler has in
the same process; nsight-python where it runs, else torch.profiler: :mod:`sglab.core.kernel_table`) covers
eager work only — the eager prefill, and the same pieces run eagerly with their copies — because nsight-python's
CUPTI collector does not attribute the kernels of a graph replay.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from sglab.core import trace

# the copies that hand activations between pieces: copy_ into a fixed buffer is a copy kernel for a strided source
# (q and k from the rotary output, v from qkv), a device-to-device memcpy for a contiguous one launched eagerly (the
# attention output), and a graph memcpy node, which the profiler shows as a "memcpy<bits>" kernel (the residual)
COPY = r"direct_copy_kernel|Memcpy DtoD|^memcpy\d+$"
PHASE = re.compile(r"^(eager|piecewise|piecewise_direct|pieces_eager) (\d+)$")
DEVICE_CATEGORIES = ("kernel", "memcpy", "memset")
TRACE_METRICS = (("trace_kernels", "count"), ("trace_device_us", "us"), ("trace_span_us", "us"),
                 ("trace_busy", "fraction"), ("trace_copy_us", "us"), ("trace_copy_ops", "count"),
                 ("trace_graph_launches", "count"), ("trace_kernel_launches", "count"), ("trace_host_us", "us"))


@dataclass
class Profiled:
    rows: list = field(default_factory=list)
    sidecars: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def perfetto_path() -> Path:
    """Where a live run's Perfetto trace is written before :func:`sglab.core.runs.write_run` copies it next to the run."""
    return Path(tempfile.mkdtemp(prefix="sglab-pcg-")) / "trace.json.gz"


def _is_device(lanes: pd.Series) -> pd.Series:
    return lanes.str.startswith("stream") | (lanes == "device")


def reduce_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events of the prefill phases only, with ``variant`` and ``num_tokens`` columns."""
    return trace.phase_columns(events, PHASE.pattern, ("variant", "num_tokens"), {"num_tokens": int})


def phase_numbers(ev: pd.DataFrame) -> dict:
    """What one prefill's events say (``ev``: one phase of :func:`reduce_events`)."""
    dev = ev[_is_device(ev.lane) & ev.category.isin(DEVICE_CATEGORIES)]
    span = float((dev.start_us + dev.dur_us).max() - dev.start_us.min()) if len(dev) else 0.0
    device_us = float(dev.dur_us.sum())
    copies = dev[dev.name.str.contains(COPY, regex=True)]
    rt = ev[ev.category == "runtime"]
    host = ev[(ev.category == "range") & ~_is_device(ev.lane)]
    return {"trace_kernels": int((dev.category == "kernel").sum()), "trace_device_us": device_us,
            "trace_span_us": span, "trace_busy": device_us / span if span else 0.0,
            "trace_copy_us": float(copies.dur_us.sum()), "trace_copy_ops": int(len(copies)),
            "trace_graph_launches": int(rt.name.str.contains("GraphLaunch").sum()),
            "trace_kernel_launches": int(rt.name.str.contains("LaunchKernel").sum()),
            "trace_host_us": float(host.dur_us.max()) if len(host) else 0.0}


def trace_rows(events: pd.DataFrame) -> list:
    """One row per prefill phase and metric of :func:`phase_numbers` (``events`` from :func:`reduce_events`)."""
    rows = []
    for (variant, n), ev in events.groupby(["variant", "num_tokens"], sort=False):
        nums = phase_numbers(ev)
        rows += [{"variant": variant, "num_tokens": int(n), "bucket": None, "metric": m, "value": float(nums[m]),
                  "unit": u} for m, u in TRACE_METRICS]
    return rows


def _inputs(n: int, inputs: dict, vocab: int, dev, seed: int):
    if n in inputs:
        return inputs[n]
    gen = torch.Generator().manual_seed(seed + n)
    return torch.randint(0, vocab, (n,), generator=gen).to(dev), torch.arange(n, device=dev)


def profile_pass(p: dict, dev, eager_fwd, runner, ref_runner, direct, inputs: dict, *, vocab: int) -> Profiled:
    """The traced pass (events sidecar, Perfetto file, trace rows) and, on a GPU, the per-kernel table."""
    cuda = dev.type == "cuda"
    out = Profiled()
    fns_by_n = {}
    for n in (int(x) for x in p["trace_token_counts"]):
        ids, pos = _inputs(n, inputs, vocab, dev, int(p["seed"]))
        fns_by_n[n] = {"eager": partial(eager_fwd, ids, pos), "piecewise": partial(runner.forward, ids)}
        if direct is not None and n in {int(x) for x in p["direct_token_counts"]}:
            fns_by_n[n]["piecewise_direct"] = partial(direct.forward, ids)
    if cuda and p.get("kernel_table_tokens"):  # first: nsight's CUPTI cannot subscribe once torch.profiler has
        out.rows += _kernel_table(p, eager_fwd, ref_runner, inputs, vocab, dev, out)
    for fns in fns_by_n.values():  # every path warm before the profiler starts
        for fn in fns.values():
            fn()
    perfetto = perfetto_path() if cuda else None
    phases = {f"{variant} {n}": fn for n, fns in fns_by_n.items() for variant, fn in fns.items()}
    events = reduce_events(trace.trace_phases(phases, perfetto=perfetto, cuda=cuda))
    out.rows += trace_rows(events)
    out.sidecars["events"] = events
    if perfetto is not None and perfetto.exists():
        out.sidecars["trace"] = perfetto
    return out


def _kernel_table(p, eager_fwd, ref_runner, inputs, vocab, dev, out: Profiled) -> list:
    """Per-kernel table of the eager prefill and of the same pieces run eagerly (with their copies)."""
    from sglab.core.kernel_table import calls_per_run, kernel_table

    n = int(p["kernel_table_tokens"])
    ids, pos = _inputs(n, inputs, vocab, dev, int(p["seed"]))
    fns = {f"eager {n}": partial(eager_fwd, ids, pos), f"pieces_eager {n}": partial(ref_runner.forward, ids)}
    table = kernel_table(fns, runs=int(p["kernel_table_runs"]), warmup=2)
    out.sidecars["kernels"] = table
    out.extra["kernel_table"] = {"backend": table.attrs["backend"], "reason": table.attrs["reason"]}
    calls = calls_per_run(table)
    return [{"variant": label.split(" ")[0], "num_tokens": n, "bucket": None, "metric": "kernel_table_calls",
             "value": float(c), "unit": "count"} for label, c in calls.items()]
