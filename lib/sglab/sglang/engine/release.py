"""Where a release is importable from (``$SGLAB_ENGINE_HOME/<V>/site`` on a GPU box, unpacked by
``scripts/engine_gpu.sh``, else :mod:`sglab.sglang.releases`), what it pins, and which flags its
parsers accept: each checked before anything starts, each error one line."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

from packaging.utils import canonicalize_name

from sglab.sglang.releases import dep_set, deps_dir, pins as read_pins, release_dir
from sglab.sglang.engine.spec import EngineError, ReleaseError, flag_names


@dataclass(frozen=True)
class ReleaseEnv:
    """Where one release is importable from: ``paths`` go first on ``PYTHONPATH``."""

    release: str
    paths: tuple[Path, ...]

    @property
    def package(self) -> Path:
        return self.paths[0] / "sglang"


def locate(release: str) -> ReleaseEnv:
    """The release's environment (see the module docstring)."""
    home = Path(os.environ["SGLAB_ENGINE_HOME"]) if os.environ.get("SGLAB_ENGINE_HOME") else None
    if home is not None and (home / release / "site" / "sglang" / "__init__.py").is_file():
        return ReleaseEnv(release, (home / release / "site",))
    rdir = release_dir(release)
    if (rdir / "sglang" / "__init__.py").is_file():
        return ReleaseEnv(release, (rdir, deps_dir(dep_set(release))))
    where = f"{home}/{release}/site or {rdir}" if home else str(rdir)
    raise ReleaseError(
        f"sglang {release} is not installed ({where}; on a GPU box: scripts/engine_gpu.sh, here: "
        f"sglab real install --releases {release})")


def release_pins(env: ReleaseEnv) -> dict[str, str]:
    """``{normalized name: version}`` of the ``==`` pins in the release's own dist-info."""
    metas = sorted(env.paths[0].glob("sglang-*.dist-info/METADATA"))
    return read_pins(metas[0].read_text()) if metas else {}


VERSIONS = ("torch", "sglang-kernel", "flashinfer-python", "transformers", "triton",
            "apache-tvm-ffi", "tokenizers")


@lru_cache(maxsize=None)  # a scenario prepares each release's engines many times
def found_versions(env: ReleaseEnv) -> dict[str, Optional[str]]:
    """Versions the engine's processes will import (the release's folders first)."""
    import importlib.metadata as md

    out: dict[str, Optional[str]] = {}
    want = {canonicalize_name(n): n for n in VERSIONS}
    for dist in md.distributions(path=[str(p) for p in env.paths]):
        n = canonicalize_name(dist.metadata.get("Name") or "")
        if n in want and n not in out:
            out[n] = dist.version
    for n in want:
        if n not in out:
            try:
                out[n] = md.version(want[n])
            except md.PackageNotFoundError:
                out[n] = None
    return out


def check_pins(env: ReleaseEnv, found: Optional[dict] = None) -> dict[str, str]:
    """The release's pins; :class:`ReleaseError` where it pins another torch than this one."""
    pins = release_pins(env)
    found = found if found is not None else found_versions(env)
    want, have = pins.get("torch"), found.get("torch")
    if want and (have or "").split("+", 1)[0] != want:
        kernel = pins.get("sglang-kernel")
        raise ReleaseError(f"sglang {env.release} pins torch=={want}" +
                           (f" (sglang-kernel {kernel} is built for it)" if kernel else "") +
                           f"; this machine has torch {have or 'none'}: nothing started")
    return pins


def release_flags(package: Path, tool: str) -> set[str]:
    """Every ``--flag`` the release's parsers accept for ``tool``."""
    name = package.parent.name
    files = [package / "srt" / "server_args.py"]
    if tool == "bench":
        files.append(package / "bench_one_batch.py")
    for f in files:
        if not f.is_file():
            raise EngineError(f"sglang {name}: {f.relative_to(package.parent)} not found" + (
                " (this release has no bench_one_batch: use --tool engine)" if f.name ==
                "bench_one_batch.py" else ""))
    files += sorted((package / "srt" / "arg_groups").rglob("*.py"))
    flags: set[str] = set()
    for f in files:
        st = f.stat()
        flags |= _file_flags(str(f), st.st_mtime_ns, st.st_size)
    return flags


@lru_cache(maxsize=64)
def _file_flags(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The ``--flags`` one source file declares, parsed once per file version."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            flags.update(
                _with_negations([n for n in names if str(n).startswith("--")], node.keywords))
        if isinstance(node, ast.ClassDef):
            flags.update(_annotated_flags(node))
    return frozenset(flags)


def _with_negations(names: list[str], keywords) -> list[str]:
    """``names``, plus argparse's ``--no-X`` forms for a ``BooleanOptionalAction``."""
    action = next((k.value for k in keywords if k.arg == "action"), None)
    if (getattr(action, "attr", None) or getattr(action, "id", None)) != "BooleanOptionalAction":
        return names
    return names + ["--no-" + n[2:] for n in names if n.startswith("--")]


def _annotated_flags(cls) -> set[str]:
    out = set()
    for stmt in cls.body:
        ann = stmt.annotation if isinstance(stmt, ast.AnnAssign) else None
        if not (isinstance(ann, ast.Subscript) and isinstance(stmt.target, ast.Name)
                and getattr(ann.value, "id", "") in ("A", "Annotated")
                and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) > 1):
            continue
        meta = ann.slice.elts[1]
        name = "--" + stmt.target.id.replace("_", "-")
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            out.add(name)
        elif isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
            kw = {k.arg: k.value for k in meta.keywords}
            if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value:
                continue
            cli = kw.get("cli_name")
            names = [cli.value if isinstance(cli, ast.Constant) else name]
            if isinstance(kw.get("aliases"), (ast.List, ast.Tuple)):
                names += [e.value for e in kw["aliases"].elts if isinstance(e, ast.Constant)]
            out.update(_with_negations(names, meta.keywords))
    return out


def check_flags(argv: Iterable[str], flags: set[str], release: str, tool: str) -> None:
    """:class:`EngineError` naming the flags this release's parsers do not define."""
    unknown = [f for f in flag_names(argv) if f not in flags]
    if unknown:
        where = "srt/server_args.py" + (" and bench_one_batch.py" if tool == "bench" else "")
        raise EngineError(
            f"sglang {release} does not accept {' '.join(unknown)} (not defined in its {where})")
