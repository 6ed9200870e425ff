"""What the probes share: reaching a step inside a real SGLang function without running what comes
after it. The function runs on a small stand-in carrying only what it reads; names it looks up in
its module are replaced by recorders for the call, and :class:`Stop` ends it at the step wanted."""

from __future__ import annotations

import contextlib
import logging
import types
from typing import Any, Iterator


class Stop(Exception):
    """Raised by a recorder to end the real function right where the probe has what it wants."""

    def __init__(self, payload: Any = None):
        super().__init__("stopped by the probe")
        self.payload = payload


@contextlib.contextmanager
def patched(module: types.ModuleType, **names: Any) -> Iterator[None]:
    """Replace module-level names for the duration of the block (each must exist in the release)."""
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise AttributeError(f"{module.__name__} has no {', '.join(missing)} in this release")
    saved = {n: getattr(module, n) for n in names}
    for n, v in names.items():
        setattr(module, n, v)
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(module, n, v)


class _ListHandler(logging.Handler):

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[str, str]] = []

    def emit(self, record):
        self.messages.append((record.levelname, record.getMessage()))


@contextlib.contextmanager
def captured_logs(logger_name: str) -> Iterator[list]:
    """The (level, message) pairs a module's logger emits inside the block."""
    logger = logging.getLogger(logger_name)
    handler, level = _ListHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class Recorder:
    """Stands in for a class the real code would construct: records the call instead."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self


def module_path(root, target) -> str | None:
    """First registered dotted path of ``target`` under ``root`` ("" for root itself)."""
    return next((name for name, mod in root.named_modules() if mod is target), None)


def has_file(prepared, relpath: str) -> bool:
    """Does the release ship ``sglang/<relpath>``? (Asked of the files, not by importing.)"""
    return (prepared.root / "sglang" / relpath).is_file()
