"""Notebook 03's traced pass: one prefill per runner and request count under torch.profiler.

Runs after the timed passes and never feeds them. Phase ranges ``"<variant> <requests>"`` (variant ``eager``,
``before``, ``after``) at ``launch_token_count`` tokens, the device synchronised between phases. From the events:
host kernel launches, host graph launches and device kernels per prefill (the ``launches`` rows), and, kept as the
run's ``events`` sidecar, the 3-request prefill of the "before" runner (rejected by ``can_run``: every kernel
launched eagerly) and of the "after" runner (graph segments with eager attention breaks, the logits tail eager).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from sglab.fixes import breakable_graph as bg
from sglab.core import trace
from sglab.experiments.breakable_graph.routing import _row

PHASE = re.compile(r"^(eager|before|after) (\d+)$")
SHOWN_REQUESTS = 3          # the prefill kept as the events sidecar
SHOWN_VARIANTS = ("before", "after")
DEVICE_CATEGORIES = ("kernel", "memcpy", "memset")


@dataclass
class Profiled:
    rows: list = field(default_factory=list)
    sidecars: dict = field(default_factory=dict)


def reduce_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events of the prefill phases only, with ``variant`` and ``batch_size`` columns."""
    return trace.phase_columns(events, PHASE.pattern, ("variant", "batch_size"), {"batch_size": int})


def launch_numbers(ev: pd.DataFrame) -> dict:
    """Host launches and device kernels of one prefill (``ev``: one phase of :func:`reduce_events`)."""
    device = ev.lane.str.startswith("stream") | (ev.lane == "device")
    rt = ev[ev.category == "runtime"]
    return {"host_kernel_launches": int(rt.name.str.contains("LaunchKernel").sum()),
            "host_graph_launches": int(rt.name.str.contains("GraphLaunch").sum()),
            "device_kernels": int((device & (ev.category == "kernel")).sum())}


def launch_rows(events: pd.DataFrame, num_tokens: int) -> list:
    rows = []
    for (variant, bs), ev in events.groupby(["variant", "batch_size"], sort=False):
        for metric, value in launch_numbers(ev).items():
            rows.append(_row("launches", variant, metric, value, "count", num_tokens=num_tokens, batch_size=int(bs)))
    return rows


def shown_events(events: pd.DataFrame) -> pd.DataFrame:
    """What the run keeps as its ``events`` sidecar: the 3-request prefill of the before and after runners."""
    keep = (events.batch_size == SHOWN_REQUESTS) & events.variant.isin(SHOWN_VARIANTS)
    return events[keep].reset_index(drop=True)


def profile_pass(p: dict, model, before, after, batch_for, on_gpu: bool) -> Profiled:
    """The traced pass (launch rows, events sidecar, Perfetto file)."""
    n = int(p["launch_token_count"])
    fns = {}
    for bs in (int(b) for b in p["launch_batch_sizes"]):
        batch = batch_for(n, bs)
        fns[bs] = {"eager": partial(bg.run_eager, model, batch), "before": partial(before.forward, batch),
                   "after": partial(after.forward, batch)}
    for by_variant in fns.values():  # every path warm before the profiler starts
        for fn in by_variant.values():
            fn()
    perfetto = Path(tempfile.mkdtemp(prefix="sglab-bcg-")) / "trace.json.gz" if on_gpu else None
    phases = {f"{variant} {bs}": fn for bs, by_variant in fns.items() for variant, fn in by_variant.items()}
    events = reduce_events(trace.trace_phases(phases, perfetto=perfetto, cuda=on_gpu))
    out = Profiled(launch_rows(events, n), {"events": shown_events(events)})
    if perfetto is not None and perfetto.exists():
        out.sidecars["trace"] = perfetto
    return out
