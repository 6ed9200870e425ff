"""Which aten ops a piece of torch code runs, each inside a named range a profiler can attribute kernels to.

    with OpRanges(trace.phase) as ops:              # or nsight.annotate, or nothing (just record)
        with ops.scope("SWA layer KV write"):
            pool.set_kv_buffer(...)
    ops.calls                                        # [OpCall(scope, step, op), ...] in call order

Why: a kernel name alone does not say which line of the rebuild launched it (the KV write's index gather and the
embedding lookup are both ``aten::index``). Wrapping every aten op in a range labelled with the caller's scope and
the op's position in that scope lets torch.profiler (device-side copies of ``record_function`` ranges) and
nsight-python (NVTX ranges, attributed at launch) both say "this kernel came from step 0 of an SWA layer's KV
write", and the same labels recorded on the CPU, without a GPU, give the rebuild's own op sequence.

A label is ``"<scope>|<step>|<op>"``; ``step`` counts the ops of one scope instance from 0 and is empty outside any
scope. View ops (no kernel) are not wrapped. With ``unique=True`` each label gets a running ``"NNNN|"`` prefix
(nsight-python wants every annotation of a run unique); :func:`parse_label` reads either form.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Optional

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
    """The :class:`OpCall` of a range label (with or without the ``NNNN|`` prefix of ``unique=True``)."""
    parts = str(label).split(SEP)
    if len(parts) == 4:
        parts = parts[1:]
    if len(parts) != 3:
        raise ValueError(f"not an op label: {label!r}")
    scope, step, op = parts
    return OpCall(scope, int(step) if step else None, op)


def _mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class OpRanges(_mode_base()):  # type: ignore[misc]
    """A dispatch mode that runs every non-view aten op inside ``enter(label)`` and records it in :attr:`calls`.

    ``enter``: a context-manager factory taking the label (``sglab.core.trace.phase``, ``nsight.annotate``);
    None only records. Ranges never nest: each wraps one op, and the ops an op runs internally are not seen again
    (the mode is off while its handler runs).
    """

    def __init__(self, enter: Optional[Callable[[str], object]] = None, *, unique: bool = False):
        super().__init__()
        self.enter = enter
        self.unique = unique
        self.calls: list[OpCall] = []
        self._scope = ""
        self._step: Optional[int] = None

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
        call = OpCall(self._scope, self._step, op_name(func, kwargs))
        if self._step is not None:
            self._step += 1
        label = call.label if not self.unique else f"{len(self.calls):04d}{SEP}{call.label}"
        self.calls.append(call)
        with (self.enter(label) if self.enter is not None else nullcontext()):
            return func(*args, **kwargs)


def op_name(func, kwargs: dict) -> str:
    """``index``, ``mul``, ... and, for a conversion, its target dtype (``_to_copy->int32``): the two casts of the
    SWA KV write are one op with different outputs."""
    name = func.overloadpacket.__name__
    dtype = kwargs.get("dtype")
    if dtype is not None and name in ("_to_copy", "to", "copy"):
        name += "->" + str(dtype).replace("torch.", "")
    return name


def record(fn: Callable[[], object], *, setup: Optional[Callable[[OpRanges], object]] = None) -> list[OpCall]:
    """The ops ``fn()`` runs (CPU or GPU), with scopes set by ``setup(mode)`` if given (e.g. wrapping a method in
    ``mode.scope``); ``setup`` may return a callable that undoes it."""
    mode = OpRanges()
    undo = setup(mode) if setup is not None else None
    try:
        with mode:
            fn()
    finally:
        if callable(undo):
            undo()
    return mode.calls


def demangle(name: str) -> str:
    """A C++ symbol as a profiler shows it (``_ZN2at6native...`` -> ``void at::native::...``), through the C++
    runtime's ``__cxa_demangle``; the name unchanged when it is not mangled or no C++ runtime is found.

    CUPTI's activity records (nsight-python) and ``cuFuncGetName`` (graph kernel nodes) give mangled names, Kineto
    (torch.profiler) demangles: this puts them on one footing."""
    if not name.startswith("_Z"):
        return name
    fn = _cxa_demangle()
    if fn is None:
        return name
    import ctypes

    status = ctypes.c_int()
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))


_DEMANGLER: list = []


def _cxa_demangle():
    if not _DEMANGLER:
        import ctypes
        import ctypes.util

        fn = None
        for lib in ("libstdc++.so.6", ctypes.util.find_library("stdc++"), "libc++.so.1"):
            if not lib:
                continue
            try:
                fn = ctypes.CDLL(lib).__cxa_demangle
                break
            except (OSError, AttributeError):
                continue
        if fn is not None:
            fn.restype = ctypes.c_void_p
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        _DEMANGLER.append(fn)
    return _DEMANGLER[0]
