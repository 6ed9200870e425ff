"""Make one installed SGLang release importable in this process: :func:`prepare`, first thing in a
fresh worker, puts the release and its dependency set on ``sys.path`` and applies each shim this
machine needs (each says why)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import site
import subprocess
import sys
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from sglab.core import hardware
from sglab.sglang.releases import (PINNED, dep_set, deps_dir, home, installed_releases, package_dir,
                                   parse_version, release_dir, release_installed, worker_env)


class NotRunnable(RuntimeError):
    """The release cannot be imported here (one line naming the release and the cause)."""


@dataclass
class Prepared:
    release: str
    root: Path
    shims: list  # [Shim]


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:240]


def _forget(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


def _try_import(name: str) -> str | None:
    """None when ``name`` imports; else the cause in one line (nothing of it left imported)."""
    try:
        importlib.import_module(name)
        return None
    except Exception as exc:  # noqa: BLE001 - any failure to load counts
        _forget(name)
        return _cause(exc)


def machine_facts() -> dict:
    """Per stand-in, None where the real thing loads here, else the cause."""
    triton = None if importlib.util.find_spec("triton") is not None else "not installed"
    return dict(triton=triton, torchvision=_try_import("torchvision"),
                sgl_kernel=_try_import("sgl_kernel"), cuda=hardware.has_cuda())


def plan(release: str, facts: dict) -> list[str]:
    """Names of the shims ``release`` needs on a machine with ``facts``."""
    names = [n for n in ("triton", "torchvision") if facts[n] is not None]
    if facts["sgl_kernel"] is not None:
        if facts["cuda"]:
            names.append("sgl_kernel")
        elif parse_version(release) < parse_version("0.5.11"):
            names.append("sgl_kernel.kvcacheio")
    return names


def facts_in_subprocess(timeout: float = 120.0) -> dict:
    """:func:`machine_facts` of a fresh interpreter (what a worker will see)."""
    code = ("import json; from sglab.sglang.bootstrap import machine_facts; "
            "print(json.dumps(machine_facts()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout, env=worker_env(), stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError("could not inspect this machine: "
                           f"{out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare(release: str) -> Prepared:
    """Put ``release`` on ``sys.path`` and apply its shims; :class:`NotRunnable` if it cannot."""
    if "sglang" in sys.modules:
        raise NotRunnable(f"sglang {release}: another sglang is already imported in this process")
    if not release_installed(release):
        raise NotRunnable(f"sglang {release}: not installed (run `sglab real install --releases "
                          f"{release}`)")
    root = release_dir(release)
    sys.path[:0] = [str(root), str(deps_dir(dep_set(release)))]
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("sglang")
    found = Path(spec.origin).parent if spec and spec.origin else None
    if found is None or found.resolve() != package_dir(release).resolve():
        raise NotRunnable(f"sglang {release}: `import sglang` resolves to {found}, not "
                          f"{package_dir(release)}")
    facts = machine_facts()
    installers = {
        "triton": lambda: install_triton_stub(root),
        "torchvision": lambda: install_torchvision_absent(facts["torchvision"]),
        "sgl_kernel": lambda: install_sgl_kernel_stub(facts["sgl_kernel"]),
        "sgl_kernel.kvcacheio": lambda: install_kvcacheio_stub(facts["sgl_kernel"])
    }
    try:
        applied = [installers[name]() for name in plan(release, facts)]
    except Exception as exc:  # noqa: BLE001
        raise NotRunnable(f"sglang {release}: a shim failed: {_cause(exc)}") from exc
    return Prepared(release, root, applied)


def import_release_module(prepared: Prepared, module: str):
    """Import ``module`` of the prepared release; a one-line :class:`NotRunnable` on failure."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001
        missing = getattr(exc, "name", None)
        extra = f" (missing module {missing})" if isinstance(exc, ImportError) and missing else ""
        raise NotRunnable(f"sglang {prepared.release}: import {module} failed: "
                          f"{_cause(exc)}{extra}") from exc


@dataclass(frozen=True)
class Shim:
    name: str
    reason: str


class StubCalled(NotImplementedError):
    """A function of a stand-in module was called."""


class _Placeholder:
    """A named constant of a stand-in class (e.g. ``InterpolationMode.BILINEAR``)."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __repr__(self) -> str:
        return f"<stub {self._qualname}>"


class _StubMeta(type):
    """Stand-in classes: subclassable, attributes are placeholders, an instance raises."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{cls.__module__}.{cls.__qualname__}.{attr}")

    def __call__(cls, *_args, **_kwargs):
        raise StubCalled(
            f"{cls.__module__}.{cls.__qualname__} is a stub class installed by "
            f"sglab.sglang.bootstrap ({cls.__sglab_stub__}); it cannot be instantiated")


class RaisingModule(types.ModuleType):
    """A stand-in module: CamelCase attributes are stub classes, others child stand-ins."""

    def __init__(self, name: str, why: str, overrides: Optional[dict] = None):
        super().__init__(name)
        self.__sglab_stub__ = why
        self.__path__ = []  # a package: its children import
        self.__dict__.update(overrides or {})

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = f"{self.__name__}.{attr}"
        if attr[:1].isupper():
            value = _StubMeta(attr, (),
                              {"__module__": self.__name__, "__sglab_stub__": self.__sglab_stub__})
        else:
            value = sys.modules.get(full) or RaisingModule(full, self.__sglab_stub__)
            sys.modules.setdefault(full, value)
        setattr(self, attr, value)
        return value

    def __call__(self, *_args, **_kwargs):
        raise StubCalled(f"{self.__name__} is a stub installed by sglab.sglang.bootstrap "
                         f"({self.__sglab_stub__}); it has no implementation")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``root`` and ``root.*`` (minus ``exclude``) as :class:`RaisingModule` packages."""

    def __init__(self, root: str, why: str, *, exclude: tuple[str, ...] = (),
                 overrides: Optional[dict] = None):
        self.root, self.why, self.exclude, self.overrides = root, why, exclude, overrides or {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.exclude or not (fullname + ".").startswith(self.root + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return RaisingModule(spec.name, self.why, self.overrides.get(spec.name))

    def exec_module(self, module):
        pass


def _load_file(path: Path, name: str) -> types.ModuleType:
    """One file of a release run as a private module (the ``sglang`` package not imported)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses in the file look their module up there
    spec.loader.exec_module(mod)
    return mod


def _mock(stub: types.ModuleType, name: str) -> types.ModuleType:
    """``sys.modules[name]``, else a new one of the stub's mock type linked to its parent."""
    mod = sys.modules.get(name)
    if mod is None:
        mod = stub._make_mock(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_mock(stub, parent), child, mod)
    return mod


# module -> {attribute: base} of what 0.5.2x's stub puts there: a class ``_<attribute>`` of that
# base (None: none, "stub": the stub's own), in a mock module
_TRITON_TREE = {
    "triton.language.extra.libdevice": {}, "triton.runtime.jit": {
        "JITFunction": None, "KernelInterface": "stub"
    }, "triton.runtime.autotuner": {"OutOfResources": Exception, "PTXASError": Exception},
    "triton.compiler": {"CompiledKernel": "stub"}, "triton.compiler.compiler": {
        "ASTSource": "stub"
    }, "triton.runtime.driver": {}, "triton.testing": {}, "triton.tools.tensor_descriptor": {},
    "triton.backends.compiler": {"GPUTarget": "stub"}
}


class _constexpr:

    def __init__(self, value=None):
        self.value = value


def install_triton_stub(release_root: Path) -> Shim:
    """The release's own triton stub, completed for torch 2.13."""
    old, new = (release_root / "sglang" / "_triton_stub.py",
                release_root / "sglang" / "_platform_stubs.py")
    if old.exists():
        stub = _load_file(old, "_sglab_sglang_triton_stub")
        stub.install()
        source = "sglang/_triton_stub.py"
    elif new.exists():  # 0.5.2x's stub (in ``install_platform_stubs``, gated to macOS): its pieces
        stub = _load_file(new, "_sglab_sglang_platform_stubs")
        sys.meta_path.insert(0, stub._TritonFinder())
        triton = stub._make_mock("triton")
        triton.__version__ = "3.0.0"
        triton.cdiv, triton.next_power_of_2 = stub._cdiv, stub._next_power_of_2
        triton.Config = stub._Config
        _mock(stub, "triton.language").constexpr = _constexpr
        source = "triton part of sglang/_platform_stubs.py"
    else:
        raise ImportError("no triton here and the release ships no triton stub")
    # real classes where torch 2.13's inductor needs them in the stub (those 0.5.2x's defines)
    for modname, classes in _TRITON_TREE.items():
        mod = _mock(stub, modname)
        for attr, base in classes.items():
            if not isinstance(mod.__dict__.get(attr), type):
                bases = () if base is None else (stub._StubBase if base == "stub" else base,)
                setattr(mod, attr, type(f"_{attr}", bases, {}))
    for modname in ("triton.compiler.compiler", "triton.runtime.cache"):
        mod = _mock(stub, modname)
        if "triton_key" not in mod.__dict__:
            mod.triton_key = getattr(stub, "_triton_key", lambda: "sglang-triton-stub")
    return Shim(
        "triton", f"no triton on this machine: the release's own stub ({source}), with the classes "
        "torch 2.13's inductor imports")


def install_torchvision_absent(cause: str) -> Shim:
    """``torchvision.*`` served by modules whose functions raise when called."""
    _forget("torchvision")
    why = f"torchvision cannot be imported here ({cause})"
    # version 0.0: transformers keeps its PIL image processors
    version = {"torchvision": {"__version__": "0.0+sglab.stub"}}
    sys.meta_path.insert(0, _StubFinder("torchvision", why, overrides=version))
    return Shim("torchvision",
                f"{why}: modules whose functions raise when called stand in (version 0.0)")


def install_kvcacheio_stub(cause: str) -> Shim:
    """An empty ``sgl_kernel`` with an inert ``kvcacheio`` (0.5.10.x imports it off the GPU)."""
    why = f"sgl_kernel cannot be imported here ({cause})"
    spec = importlib.machinery.ModuleSpec("sgl_kernel", None, is_package=True)
    root = sys.modules["sgl_kernel"] = importlib.util.module_from_spec(spec)
    root.kvcacheio = sys.modules["sgl_kernel.kvcacheio"] = RaisingModule(
        "sgl_kernel.kvcacheio", why)
    return Shim(
        "sgl_kernel.kvcacheio",
        f"{why}; memory_pool_host.py imports sgl_kernel.kvcacheio at module level: an empty "
        f"sgl_kernel with a kvcacheio whose functions raise when called")


def _skip_fakes_of_missing_sgl_kernel_ops() -> None:
    """``torch.library.register_fake("sgl_kernel::X")`` of an op never defined is a no-op."""
    import torch

    real = torch.library.register_fake
    if getattr(real, "_sglab_skips_sgl_kernel", False):
        return

    def register_fake(op, *args, **kwargs):
        if isinstance(op, str) and op.startswith("sgl_kernel::"):
            name = op.split("::", 1)[1].split(".", 1)[0]
            if not hasattr(torch.ops.sgl_kernel, name):
                return (lambda fn: fn) if not args else None
        return real(op, *args, **kwargs)

    register_fake._sglab_skips_sgl_kernel = True
    torch.library.register_fake = register_fake


def install_sgl_kernel_stub(cause: str) -> Shim:
    """Where CUDA is but sgl_kernel does not load: its functions raise when called."""
    _forget("sgl_kernel")
    why = f"the real sgl_kernel does not load here ({cause})"
    weak_ref = {"sgl_kernel": {"weak_ref_tensor": lambda tensor: tensor}}
    sys.meta_path.insert(
        0, _StubFinder("sgl_kernel", why, exclude=("sgl_kernel.scalar_type",), overrides=weak_ref))
    _skip_fakes_of_missing_sgl_kernel_ops()
    return Shim(
        "sgl_kernel", f"{why}: functions raise when called, weak_ref_tensor returns its argument, "
        "fake registrations of its missing torch ops skipped, "
        "sgl_kernel.scalar_type left to SGLang's fallback")


FACTS_FILE = "machine-facts.json"  # under the releases' home: the last answer and what it rests on


@lru_cache(maxsize=1)
def _facts() -> dict:
    """:func:`facts_in_subprocess`, kept in :data:`FACTS_FILE` under what it depends on."""
    env = worker_env()
    folders = [*env["PYTHONPATH"].split(os.pathsep), *site.getsitepackages()]
    paths = {f: os.stat(f).st_mtime_ns for f in dict.fromkeys(folders) if f and os.path.isdir(f)}
    key = dict(python=sys.executable, cuda_visible=env.get("CUDA_VISIBLE_DEVICES"), paths=paths,
               module=os.stat(__file__).st_mtime_ns)
    path = home() / FACTS_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        kept = json.loads(path.read_text())
        if kept["key"] == key:
            return kept["facts"]
    facts = facts_in_subprocess()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.part")
        tmp.write_text(json.dumps({"key": key, "facts": facts}))
        tmp.replace(path)
    return facts


def shims_needed(release: str) -> list[str]:
    """Names of the shims ``release`` needs on this machine (as a fresh worker decides)."""
    return plan(release, _facts())


def real_release_rows() -> list[tuple[str, str]]:
    """``sglab env`` rows: the installed releases and the shims each needs here."""
    have = installed_releases()
    missing = ", ".join(v for v in PINNED if v not in have)
    missing = f"; missing {missing} (`sglab real install`)" if missing else ""
    rows = [(f"  {v}", "shims: " + (", ".join(shims_needed(v)) or "none")) for v in have]
    return [("sglang releases", f"{len(have)} in {home()}{missing}"), *rows]
