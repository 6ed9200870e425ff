"""A module imported where it is first used: ``torch = lazy.Module("torch")`` in a fix's record
spares what reads only the record torch's import (about 1.2 s of CPU)."""

from __future__ import annotations

import importlib


class Module:
    """A stand-in for the module ``name``: the first attribute read imports it."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __setattr__(self, attr: str, value) -> None:
        raise AttributeError(f"set {attr} on the module {self._name} itself, not on its stand-in")

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at first use>"
