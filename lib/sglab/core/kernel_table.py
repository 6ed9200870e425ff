"""Per-kernel tables of eager GPU work (calls per run, time per call) by nsight-python where it can
run, else torch.profiler (``table.attrs`` says why); per op through :class:`OpRanges`."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglab.core import kernels, trace


COLUMNS = "label kernel short calls median_us p10_us p90_us total_us share backend".split()
# words that say what an (otherwise templated, unreadable) kernel name does, first match wins
_HINTS = ("direct_copy", "CatArrayBatchedCopy", "index_select", "indexSelect", "embedding",
          "rms_norm", "RowwiseMoments", "silu", "MulFunctor", "AddFunctor", "cos_kernel",
          "sin_kernel", "neg", "cumsum", "flash", "fmha", "attention", "gemm", "gemv", "nvjet",
          "cutlass", "sm90", "reduce", "fill", "copy")


def short_name(kernel: str, width: int = 48) -> str:
    """A templated kernel's (demangled or mangled) function name plus a hint of what it does."""
    # a mangled nested name (``_ZN2at6native18elementwise_kernelIL...``): its innermost name
    mangled = re.match(r"_ZN?(.*)", kernel)
    rest, head = mangled.group(1) if mangled else "", ""
    while n := re.match(r"\d+", rest):
        size, rest = int(n.group()), rest[n.end():]
        head, rest = rest[:size], rest[size:]
    base = re.sub(r"^void\s+", "", kernel)
    head = head or re.split(r"[<(]", base, maxsplit=1)[0].split("::")[-1] or base[:width]
    hint = next(
        (h for h in _HINTS if h.lower() in kernel.lower() and h.lower() not in head.lower()), "")
    text = f"{head} [{hint}]" if hint else head
    return text if len(text) <= width else text[:width - 1] + "…"


def reduce_records(records: Iterable[tuple], runs: int, backend: str):
    """``(label, kernel, duration_ns)`` of ``runs`` repeats -> the per-kernel table."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    d = pd.DataFrame(list(records), columns=["label", "kernel", "us"])
    if d.empty:
        return pd.DataFrame(columns=COLUMNS)
    d["us"] = pd.to_numeric(d.us, errors="coerce") / 1e3  # a duration None: NaN, counted as a call
    g = d.groupby(["label", "kernel"], sort=False).us
    df = pd.DataFrame({
        "calls": g.size() / runs, "median_us": g.median(), "p10_us": g.quantile(0.1),
        "p90_us": g.quantile(0.9), "total_us": g.sum() / runs
    }).reset_index().assign(short=lambda t: t.kernel.map(short_name), backend=backend)
    df["share"] = df.total_us / df.groupby("label").total_us.transform("sum")
    df["order"] = df.label.map(list(d.label.unique()).index)
    df = df.sort_values(["order", "total_us"], ascending=[True, False]).drop(columns="order")
    return df[COLUMNS].reset_index(drop=True)


def profiler_records(fns: Mapping[str, Callable[[], object]], *, runs: int,
                     warmup: int) -> list[tuple]:
    """``(label, kernel, duration_ns)`` of every kernel torch.profiler sees in ``runs`` calls."""
    out = []
    for label, fn in fns.items():
        for _ in range(warmup):
            fn()
        with trace.Recorder(cuda=True) as rec:
            for _ in range(runs):
                fn()
        k = rec.events[rec.events.category == "kernel"]
        out += [(label, name, us * 1e3) for name, us in zip(k.name, k.dur_us)]
    return out


def kernel_table(fns: Mapping[str, Callable[[], object]], *, runs: int = 5, warmup: int = 2):
    """Per-kernel table of each labelled eager function (``attrs``: the backend and why)."""
    if not fns:
        raise ValueError("kernel_table needs at least one labelled function")
    chosen, reason = kernels.nsight_backend()
    records = None
    if chosen != "torch-profiler":
        try:
            for fn in fns.values():  # warm-up outside the profiler (module load, autotune)
                for _ in range(warmup):
                    fn()
            import nsight

            def annotated():
                for label, fn in fns.items():
                    with nsight.annotate(label):
                        fn()

            with kernels.nsight_session(chosen) as profile:
                records = profile(annotated, runs)
        except Exception as e:  # noqa: BLE001 - any nsight failure: say it, use the profiler
            reason = (f"nsight-python ({chosen}) failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}")
            chosen = "torch-profiler"
    else:
        reason = f"nsight-python cannot run here: {reason}"
    if records is None:
        records = profiler_records(fns, runs=runs, warmup=warmup)
    df = reduce_records(records, runs, chosen)
    df.attrs.update(backend=chosen, reason=reason)
    return df


def calls_per_run(table) -> dict:
    """Kernel launches per run of each label (the number to cross-check against another tool)."""
    return {label: float(g.calls.sum()) for label, g in table.groupby("label", sort=False)}


# -- op ranges: which aten ops torch code runs, each inside a range a profiler attributes ----------
SEP = "|"


@dataclass(frozen=True)
class OpCall:
    scope: str
    step: Optional[int]  # position inside its scope instance; None outside any scope
    op: str

    @property
    def label(self) -> str:
        return SEP.join([self.scope, "" if self.step is None else str(self.step), self.op])


def parse_label(label: str) -> OpCall:
    """The :class:`OpCall` of a range label (with or without ``unique``'s ``NNNN|`` prefix)."""
    parts = str(label).split(SEP)
    if len(parts) not in (3, 4):
        raise ValueError(f"not an op label: {label!r}")
    scope, step, op = parts[-3:]
    return OpCall(scope, int(step) if step else None, op)


class DispatchMode(TorchDispatchMode):
    """``TorchDispatchMode`` without its ``torch._disable_dynamo`` wrapper (2.5-3 s of import)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class OpRanges(DispatchMode):
    """Runs every non-view aten op inside ``enter(label)`` and records it in :attr:`calls`."""

    def __init__(self, enter: Optional[Callable[[str], object]] = None, *, unique: bool = False):
        super().__init__()
        self.enter, self.unique = enter, unique
        self.calls: list[OpCall] = []
        self._scope, self._step = "", None  # the step: None outside any scope

    @contextmanager
    def scope(self, name: str):
        """Label the ops inside with ``name`` and their position within this block."""
        if SEP in name:
            raise ValueError(f"scope names cannot contain {SEP!r}: {name!r}")
        saved = (self._scope, self._step)
        self._scope, self._step = name, 0
        try:
            yield self
        finally:
            self._scope, self._step = saved

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "is_view", False):
            return func(*args, **kwargs)
        op = func.overloadpacket.__name__
        if kwargs.get("dtype") is not None and op in ("_to_copy", "to", "copy"):
            op += "->" + str(kwargs["dtype"]).replace("torch.", "")  # a cast: _to_copy->int32
        call = OpCall(self._scope, self._step, op)
        if self._step is not None:
            self._step += 1
        label = call.label if not self.unique else f"{len(self.calls):04d}{SEP}{call.label}"
        self.calls.append(call)
        with (self.enter(label) if self.enter is not None else nullcontext()):
            return func(*args, **kwargs)


def demangle(name: str) -> str:
    """A C++ symbol as a profiler shows it (``_ZN2at6native...`` -> ``void at::native::...``)."""
    fn = _cxa_demangle() if name.startswith("_Z") else None
    if fn is None:
        return name
    status = ctypes.c_int()
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


@functools.cache
def _cxa_demangle():
    for lib in ("libstdc++.so.6", ctypes.util.find_library("stdc++"), "libc++.so.1"):
        try:
            fn = ctypes.CDLL(lib).__cxa_demangle if lib else None
        except (OSError, AttributeError):
            continue
        if fn is not None:
            fn.restype = ctypes.c_void_p
            fn.argtypes = [
                ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_int)
            ]
            return fn
    return None


# -- per-op kernel tables of one eager step: which op launched which kernel, how often, how long ---
OP_COLUMNS = ["variant", "scope", "step", "op", "kernel", "calls", "median_us", "backend"]
TORCH, NSIGHT = "torch.profiler", "nsight-python (CUPTI)"
KEY = ["variant", "scope", "step", "op", "kernel"]

Step = Callable[[OpRanges], object]


def aggregate(samples, *, runs: int, backend: str):
    """Per :data:`KEY` of ``samples``: calls per step and the median µs per call (no scope: -1)."""
    if not len(samples):
        return pd.DataFrame(columns=OP_COLUMNS)
    parsed = [parse_label(lbl) for lbl in samples["label"]]
    df = samples.assign(scope=[c.scope for c in parsed],
                        step=[-1 if c.step is None else c.step for c in parsed],
                        op=[c.op for c in parsed])
    out = df.groupby(KEY, sort=False).dur_us.agg(n="size", median_us="median").reset_index()
    return out.assign(calls=out.n / runs, backend=backend)[OP_COLUMNS]


def _run_steps(step: Step, enter, runs: int, *, unique: bool = False) -> None:
    for _ in range(runs):
        with OpRanges(enter, unique=unique) as mode:
            step(mode)


def _warm(steps: Mapping[str, Step], warmup: int) -> None:
    for step in steps.values():
        _run_steps(step, None, warmup)
    torch.cuda.synchronize()


def torch_table(steps: Mapping[str, Step], *, runs: int = 5, warmup: int = 1):
    """torch.profiler over ``runs`` steps, one session per variant, every op in a range."""
    _warm(steps, warmup)
    parts = []
    for variant, step in steps.items():
        with trace.Recorder() as rec:
            _run_steps(step, trace.phase, runs)
        k = rec.events[(rec.events.category == "kernel") & (rec.events.phase != "")]
        parts.append(k.rename(columns={"phase": "label", "name": "kernel"}).assign(variant=variant))
    return aggregate(pd.concat(parts, ignore_index=True), runs=runs, backend=TORCH)


def nsight_table(steps: Mapping[str, Step], *, runs: int = 5, warmup: int = 1):
    """nsight-python's CUPTI backend over ``runs`` steps of each variant: ``(table, why)``."""
    tool, reason = kernels.nsight_backend()
    if tool != "cupti":
        return None, reason
    import nsight
    _warm(steps, warmup)
    rows = []
    try:
        with kernels.nsight_session("cupti") as profile:
            for variant, step in steps.items():  # one profile each: their annotations differ
                recs = profile(lambda step=step: _run_steps(step, nsight.annotate, 1, unique=True),
                               runs)
                rows += [(variant, label, demangle(k), float("nan") if ns is None else ns / 1e3)
                         for label, k, ns in recs]
    except Exception as e:  # noqa: BLE001 - e.g. CUPTI already subscribed by torch.profiler
        return None, f"nsight-python failed: {type(e).__name__}: {e}"
    samples = pd.DataFrame(rows, columns=["variant", "label", "kernel", "dur_us"])
    return aggregate(samples, runs=runs, backend=NSIGHT), reason


def cross_check(a, b) -> dict:
    """The kernel calls per :data:`KEY` of two tables compared (equal, only in one, differ)."""
    ca, cb = (t.set_index(KEY)["calls"].astype(float).to_dict() for t in (a, b))
    both = set(ca) & set(cb)
    return dict(rows=len(set(ca) | set(cb)), equal=sum(ca[k] == cb[k] for k in both),
                only_in_a=sorted(set(ca) - set(cb)), only_in_b=sorted(set(cb) - set(ca)),
                differ=sorted(k for k in both if ca[k] != cb[k]))
