"""The torch.profiler layer: a piece of work's events reduced to a small event table (``lane,
name, category, start_us, dur_us, phase``) stored beside the run, so that a notebook without a GPU
draws the same timeline from a recorded run; the Perfetto file is torch's own export, gzipped."""

from __future__ import annotations

import functools
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

# Kineto (torch 2.13) prints "USDT: profiler_start/stop" lines on stderr, into notebook cells, at
# every session; level 6 hides errors too, so it is only set where unset
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

COLUMNS = ["lane", "name", "category", "start_us", "dur_us", "phase"]
PHASE_PREFIX = "phase::"

# FunctionEvent.activity_type (torch >= 2.12) -> category; older torch: by name (_category)
_ACTIVITY = dict(kernel="kernel", gpu_memcpy="memcpy", gpu_memset="memset", cuda_runtime="runtime",
                 cuda_driver="runtime", user_annotation="range", gpu_user_annotation="range",
                 cpu_op="op", python_function="op")


@functools.cache
def _warm_profiler() -> None:
    """Spend a process's first profiling session (which can miss kernels) on a throwaway kernel."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(16, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True):
        (x + 1).sum()
        torch.cuda.synchronize()


@contextmanager
def phase(name: str):
    """Mark a phase of the work (a ``record_function`` range named ``phase::<name>``)."""
    from torch.profiler import record_function

    with record_function(PHASE_PREFIX + name):
        yield


def _is_device(ev) -> bool:
    return str(getattr(ev, "device_type", "")).endswith("CUDA")


def _category(ev) -> str:
    act = getattr(ev, "activity_type", None)
    if act in _ACTIVITY:
        return _ACTIVITY[act]
    name = ev.name
    if getattr(ev, "is_user_annotation", False) or name.startswith(PHASE_PREFIX):
        return "range"
    if _is_device(ev):
        return {"Memcpy": "memcpy", "Memset": "memset"}.get(name[:6], "kernel")
    return "runtime" if name.startswith(("cuda", "cu")) and not name.startswith("cudnn") else "op"


def on_device(lanes):
    """Which events of a table's ``lane`` column ran on the device."""
    return lanes.str.startswith("stream") | (lanes == "device")


def event_table(events, *, keep_ops: bool = False):
    """torch.profiler events as :data:`COLUMNS`, each in its innermost phase range."""
    import numpy as np
    import pandas as pd

    events = list(events)
    if not events:
        return pd.DataFrame(columns=COLUMNS)
    host = [e for e in events if not _is_device(e)]
    main_thread = min((e.thread for e in host), default=None, key=lambda t: (t is None, t))
    rows = []
    for ev in events:
        cat, stream = _category(ev), getattr(ev, "device_resource_id", None)
        if _is_device(ev):
            lane = f"stream {stream}" if stream is not None else "device"
        else:
            lane = "runtime" if cat == "runtime" else (
                "host" if ev.thread == main_thread else f"host {ev.thread}")
        start, end = float(ev.time_range.start), float(ev.time_range.end)
        rows.append(dict(lane=lane, name=ev.name, category=cat, start_us=start, dur_us=end - start))
    df = pd.DataFrame(rows)
    df["start_us"] -= df.start_us.min()
    df = df.sort_values("start_us", kind="stable").reset_index(drop=True)
    is_dev, start = on_device(df.lane).to_numpy(), df.start_us.to_numpy()
    phases = np.full(len(df), "", dtype=object)
    ranges = df[(df.category == "range") & df.name.str.startswith(PHASE_PREFIX)]
    # longest first, so that a shorter (inner) range containing the same event overwrites it
    for i in ranges.sort_values("dur_us", ascending=False, kind="stable").index:
        r = df.loc[i]
        inside = (start >= r.start_us) & (start <= r.start_us + r.dur_us) & (is_dev == is_dev[i])
        phases[inside] = r["name"][len(PHASE_PREFIX):]
    df["phase"] = phases
    if not keep_ops:
        df = df[df.category != "op"]
    return df[COLUMNS].reset_index(drop=True)


class Recorder:
    """Profile the ``with`` block (CPU, plus CUDA when usable) into :attr:`events`."""

    def __init__(self, *, perfetto: str | Path | None = None, keep_ops: bool = False,
                 cuda: bool | None = None):
        import torch

        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.perfetto = Path(perfetto) if perfetto else None
        self.keep_ops = keep_ops
        self.events = self._prof = None

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        if self.cuda:
            _warm_profiler()
        self.sync()
        # torch 2.11 warns on events() otherwise
        self._prof = profile(activities=activities, acc_events=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.sync()
        self._prof.__exit__(*exc)
        if exc[0] is None:
            self.events = event_table(self._prof.events(), keep_ops=self.keep_ops)
            if self.perfetto is not None:  # torch's Chrome trace, gzipped by torch for a .gz name
                self.perfetto.parent.mkdir(parents=True, exist_ok=True)
                self._prof.export_chrome_trace(str(self.perfetto))
        return False


def trace_variants(fns, column: str, *, cuda: bool, warm: bool = True,
                   perfetto_prefix: str | None = None) -> tuple:
    """Each of ``fns`` (``{"<variant> <n>": callable}``) in its own phase: events, Perfetto file."""
    import torch

    if warm:
        for fn in fns.values():  # every path warm before the profiler starts
            fn()
    perfetto = (Path(tempfile.mkdtemp(prefix=perfetto_prefix)) / "trace.json.gz"
                if cuda and perfetto_prefix else None)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with Recorder(perfetto=perfetto, cuda=cuda) as rec:
        for name, fn in fns.items():
            sync()
            with phase(name):
                fn()
            sync()
    m = rec.events.phase.str.extract(r"^(\S+) (\d+)$")
    keep = m[0].notna()
    events = rec.events[keep].assign(variant=m[0][keep], **{column: m[1][keep].astype(int)})
    return events.reset_index(drop=True), (perfetto if perfetto and perfetto.exists() else None)
