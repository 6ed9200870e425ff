"""One reader of a Hugging Face ``config.json`` (a file, or a model folder's): read once per file
and version of it, checked, with its bytes (copied into an engine's model folder), its digest and
its language model's part. Errors are one line (:class:`ConfigError`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


class ConfigError(ValueError):
    """A model config that cannot be read, in one line naming the file."""


@dataclass(frozen=True)
class HFConfig:
    path: Path  # the config.json
    raw: bytes
    data: dict  # shared by every reader of this file: read it, never change it

    @property
    def digest(self) -> str:
        """The first 16 hex digits of the file's sha256."""
        return hashlib.sha256(self.raw).hexdigest()[:16]

    @property
    def text(self) -> dict:
        """The language model's part (:func:`text_config`)."""
        return text_config(self.data)

    @property
    def architecture(self) -> str:
        return (self.data.get("architectures") or [""])[0]


def path_of(model) -> Path:
    """``model`` itself, or ``model/config.json`` where it is a folder."""
    path = Path(model)
    return path / "config.json" if path.is_dir() else path


def text_config(cfg: dict) -> dict:
    """The language model's part of a config (a multimodal one's ``text_config``, else itself)."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def read(model, *, architectures: bool = False) -> HFConfig:
    """The config of ``model`` (a file or a folder); with ``architectures`` it must name them."""
    path = path_of(model)
    try:
        st = path.stat()
    except OSError:
        raise ConfigError(f"{path}: no such model config") from None
    try:
        cfg = _read(str(path.resolve()), st.st_mtime_ns, st.st_size)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if architectures and not cfg.data.get("architectures"):
        raise ConfigError(f"{path}: a model config needs an 'architectures' list")
    return cfg


@lru_cache(maxsize=32)
def _read(path: str, mtime_ns: int, size: int) -> HFConfig:
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"a model config is a JSON object, not a {type(data).__name__}")
    return HFConfig(Path(path), raw, data)
