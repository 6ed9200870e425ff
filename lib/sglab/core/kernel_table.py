"""Per-kernel tables of eager GPU work: which kernels run, how many calls per run, how long each takes.

    table = kernel_table({"eager 4096 tok": lambda: model(ids)}, runs=5)
    table.attrs["backend"], table.attrs["reason"]      # which tool measured, and why that one

nsight-python (CUPTI, else Nsight Compute) measures where it can run (:func:`sglab.core.kernels.nsight_session`
hands over every kernel it attributed); otherwise torch.profiler measures, and the reason nsight did not is kept.
Either way the columns are :data:`COLUMNS`: ``label, kernel, short, calls, median_us, p10_us, p90_us, total_us,
share, backend`` — ``calls`` per run, the time statistics over every call of that kernel, ``total_us`` per run,
``share`` of the label's device time. nsight-python's CUPTI collector does not attribute kernels launched by a
graph replay: give this eager work only.
"""

from __future__ import annotations

import re
import statistics
from typing import Callable, Iterable, Mapping

COLUMNS = ["label", "kernel", "short", "calls", "median_us", "p10_us", "p90_us", "total_us", "share", "backend"]
_NON_KERNEL = ("Memcpy", "Memset")
# words that say what an (otherwise templated, unreadable) kernel name does, first match wins
_HINTS = ("direct_copy", "CatArrayBatchedCopy", "index_select", "indexSelect", "embedding", "rms_norm", "RowwiseMoments",
          "silu", "MulFunctor", "AddFunctor", "cos_kernel", "sin_kernel", "neg", "cumsum", "flash", "fmha", "attention",
          "gemm", "gemv", "nvjet", "cutlass", "sm90", "reduce", "fill", "copy")


def _mangled_head(kernel: str) -> str:
    """The innermost name of an Itanium-mangled nested name (``_ZN2at6native18elementwise_kernelIL...`` ->
    ``elementwise_kernel``), as CUPTI reports kernels; "" when ``kernel`` is not one."""
    m = re.match(r"_ZN?(.*)", kernel)
    if not m:
        return ""
    rest, head = m.group(1), ""
    while True:
        n = re.match(r"(\d+)", rest)
        if not n:
            return head
        size = int(n.group(1))
        head, rest = rest[len(n.group(1)):len(n.group(1)) + size], rest[len(n.group(1)) + size:]


def short_name(kernel: str, width: int = 48) -> str:
    """A readable name for a templated kernel (demangled as torch.profiler shows it, or mangled as CUPTI reports
    it): its function name plus the first hint word of what it does."""
    base = re.sub(r"^void\s+", "", kernel)
    head = _mangled_head(kernel) or re.split(r"[<(]", base, maxsplit=1)[0].split("::")[-1] or base[:width]
    hint = next((h for h in _HINTS if h.lower() in kernel.lower() and h.lower() not in head.lower()), "")
    text = f"{head} [{hint}]" if hint else head
    return text if len(text) <= width else text[: width - 1] + "…"


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def reduce_records(records: Iterable[tuple], runs: int, backend: str):
    """``(label, kernel, duration_ns)`` records of ``runs`` repetitions -> the per-kernel table (one row per label
    and kernel, ordered by the label's first appearance and then by total time)."""
    import pandas as pd

    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    groups: dict[tuple, list] = {}
    labels: list = []
    for label, kernel, dur_ns in records:
        if label not in labels:
            labels.append(label)
        groups.setdefault((label, kernel), []).append(float(dur_ns) / 1e3 if dur_ns is not None else float("nan"))
    rows = []
    for (label, kernel), us in groups.items():
        ok = [u for u in us if u == u]
        med = statistics.median(ok) if ok else float("nan")
        rows.append({"label": label, "kernel": kernel, "short": short_name(kernel), "calls": len(us) / runs,
                     "median_us": med, "p10_us": _quantile(ok, 0.1) if ok else med,
                     "p90_us": _quantile(ok, 0.9) if ok else med, "total_us": sum(ok) / runs, "backend": backend})
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "share"])
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    df["share"] = df.total_us / df.groupby("label").total_us.transform("sum")
    df["order"] = df.label.map(labels.index)
    df = df.sort_values(["order", "total_us"], ascending=[True, False]).drop(columns="order")
    return df[COLUMNS].reset_index(drop=True)


def profiler_records(fns: Mapping[str, Callable[[], object]], *, runs: int, warmup: int) -> list[tuple]:
    """``(label, kernel, duration_ns)`` of every device kernel torch.profiler sees in ``runs`` calls per label."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sglab.core.kernels import _warm_profiler

    _warm_profiler()
    out = []
    for label, fn in fns.items():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
            for _ in range(runs):
                fn()
            torch.cuda.synchronize()
        evs = sorted(prof.events(), key=lambda e: e.time_range.start)
        out += [(label, e.name, (e.time_range.end - e.time_range.start) * 1e3) for e in evs
                if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(_NON_KERNEL)]
    return out


def kernel_table(fns: Mapping[str, Callable[[], object]], *, runs: int = 5, warmup: int = 2, backend: str = "auto"):
    """The per-kernel table of each labelled eager function: nsight-python where it runs (``backend`` "auto",
    "cupti" or "ncu"), else torch.profiler ("torch-profiler"). ``attrs``: backend and the reason for it."""
    from sglab.core import kernels

    if not fns:
        raise ValueError("kernel_table needs at least one labelled function")
    if backend not in {"auto", "cupti", "ncu", "torch-profiler"}:
        raise ValueError(f"unknown backend {backend!r}")
    chosen, reason = kernels.nsight_backend() if backend == "auto" else (backend, "requested")
    records: list = []
    if chosen in ("cupti", "ncu"):
        try:
            kernels.nsight_session(fns, runs=runs, warmup=warmup, tool=chosen, per_kernel=records)
        except Exception as e:  # noqa: BLE001 - any nsight failure: say it, measure with the profiler
            if backend != "auto":
                raise
            reason = f"nsight-python ({chosen}) failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            chosen, records = "torch-profiler", []
    else:
        reason = f"nsight-python cannot run here: {reason}"
        chosen = "torch-profiler"
    if chosen == "torch-profiler":
        records = profiler_records(fns, runs=runs, warmup=warmup)
    df = reduce_records(records, runs, chosen)
    df.attrs.update(backend=chosen, reason=reason)
    return df


def calls_per_run(table) -> dict:
    """Kernel launches per run of each label (the number to cross-check against another tool)."""
    return {label: float(g.calls.sum()) for label, g in table.groupby("label", sort=False)}
