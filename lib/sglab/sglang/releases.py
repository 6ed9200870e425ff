"""Where the pinned SGLang releases live (``.sglang/``, git-ignored; ``$SGLAB_SGLANG_HOME`` moves
it): ``releases/<V>/`` a release, ``deps/<set>/`` the light dependencies of the releases that agree
on them. Also the one parser of release numbers and the one reader of a wheel's pins."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# Releases that straddle each fix: 0.5.10.post1 -> 0.5.11 (#22858, #23552, #23972), 0.5.11 -> 0.5.12
# (#24662, #24743; 0.5.12.post1 stands for 0.5.12), 0.5.12.post1 -> 0.5.13 (#26382); 0.5.14 lost
# the #23972 filter in a refactor; 0.5.23 is the newest (capture sizes rounded up since 0.5.22).
PINNED = ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.14", "0.5.23")

STAMP = ".sglab-installed"

# What every release imports at module level on the probes' paths (found on a CPU box, torch 2.13).
_COMMON = ("numpy", "orjson", "psutil", "pybase64", "requests", "packaging", "pillow", "starlette",
           "msgspec", "pydantic", "pyzmq", "tqdm", "IPython", "aiohttp", "dill", "gguf", "einops",
           "partial_json_parser", "loguru")

# name -> (releases, requirements, requirements installed --no-deps: compressed-tensors declares
# torch, which pip --target, blind to the interpreter's, would fetch a second time)
DEP_SETS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "0.5.1x": (("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.14"), _COMMON
               + ("transformers==5.6.0", "apache-tvm-ffi==0.1.9", "openai==2.6.1", "sentencepiece"),
               ("compressed-tensors==0.18.0",)),
    "0.5.2x": (("0.5.23",),
               _COMMON + ("transformers==5.19.0", "apache-tvm-ffi==0.1.11", "openai==2.8.0",
                          "sentencepiece==0.2.1", "uvicorn", "fastapi"),
               ("compressed-tensors==0.18.0",))
}


def home() -> Path:
    """The ``.sglang`` folder: ``$SGLAB_SGLANG_HOME`` or ``<checkout>/.sglang``."""
    env = os.environ.get("SGLAB_SGLANG_HOME")
    if env:
        return Path(env)
    from sglab.core.runs import repo_root

    return repo_root() / ".sglang"


def release_dir(version: str) -> Path:
    """``.sglang/releases/<V>``: put it on ``sys.path`` and ``import sglang`` is that release."""
    return home() / "releases" / version


def package_dir(version: str) -> Path:
    """``.sglang/releases/<V>/sglang``: the release's package folder."""
    return release_dir(version) / "sglang"


def dep_set(version: str) -> str:
    """Name of the dependency set a release runs with."""
    found = next((name for name, (releases, _, _) in DEP_SETS.items() if version in releases), "")
    return found or ("0.5.2x" if parse_version(version) >= Version("0.5.20") else "0.5.1x")


def deps_dir(name: str) -> Path:
    return home() / "deps" / name


def parse_version(version: str) -> Version:
    """``"0.5.12.post1"`` as a :class:`Version`; forms other than ``X.Y.Z[.postN]`` raise."""
    try:
        parsed = Version(str(version))
    except InvalidVersion:
        parsed = None
    if parsed is None or str(parsed) != str(version) or len(parsed.release) != 3 \
            or parsed.is_prerelease or parsed.local or parsed.epoch:
        raise ValueError(f"not a release version: {version!r} (expected e.g. 0.5.12 or "
                         "0.5.12.post1)")
    return parsed


# where the releases run: the GPU image's platform (Python 3.12, Linux, x86_64)
LINUX_X86_64 = dict(sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
                    os_name="posix", python_version="3.12", python_full_version="3.12.0",
                    implementation_name="cpython", platform_python_implementation="CPython",
                    extra="")


def pins(metadata: str, environment: Optional[dict] = None) -> dict[str, str]:
    """``{normalized name: version}`` of METADATA's ``==`` pins whose markers hold."""
    env = environment or LINUX_X86_64
    out = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        exact = [s.version for s in req.specifier if s.operator == "==" and "*" not in s.version]
        if exact:
            out[canonicalize_name(req.name)] = exact[0]
    return out


def read_stamp(folder: Path) -> Optional[dict]:
    """The JSON stamp of an install folder, or None when it is missing or unreadable."""
    try:
        return json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None


def release_installed(version: str) -> bool:
    """The release and its dependency set are both stamped."""
    return (read_stamp(release_dir(version)) is not None
            and (package_dir(version) / "__init__.py").exists()
            and read_stamp(deps_dir(dep_set(version))) is not None)


def installed_releases() -> list[str]:
    """Installed releases (pinned or not), oldest first."""
    root = home() / "releases"
    found = []
    for p in root.iterdir() if root.is_dir() else ():
        with contextlib.suppress(ValueError):
            found.append((parse_version(p.name), p.name))
    return [v for _, v in sorted(found) if release_installed(v)]


def worker_env() -> dict:
    """The caller's environment, with this package importable in the child."""
    env = dict(os.environ)
    lib = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = lib + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
