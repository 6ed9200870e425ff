"""The stand-ins a real SGLang release needs before its first import on a machine it was not built for.

Each shim is applied only when the machine lacks what it stands in for, and says why in one line
(:class:`Shim`). None of them returns a made-up value from a kernel: what stands in for a kernel raises
``NotImplementedError`` naming the stub when it is called, except ``weak_ref_tensor`` (see below).

- ``triton``: ``sglang.srt.utils.common`` imports triton at module level; this box has none (the wheel is
  286 MB and useless without a GPU). SGLang ships a stub: ``sglang/_triton_stub.py`` (0.5.1x) or the triton part
  of ``sglang/_platform_stubs.py`` (0.5.2x), both only installed by SGLang on Apple silicon. The 0.5.1x stub
  predates torch 2.13, whose inductor imports ``triton.compiler.CompiledKernel`` and friends as classes; its
  catch-all finder turns them into modules and the first module-level ``torch.compile`` dies with
  ``unsupported operand type(s) for |: 'module' and 'type'``. The classes 0.5.2x's stub defines are added.
- ``torchvision``: SGLang imports it at module level (``utils/common.py`` in 0.5.10.x, ``configs`` later). Where
  it is missing or its wheel cannot load (PyPI's wheel is a CUDA build that fails against CPU torch), a module
  that raises on any use stands in, and transformers is told it is unavailable so it never uses it.
- ``sgl_kernel.kvcacheio`` (0.5.10.x, no sgl_kernel here): ``mem_cache/memory_pool_host.py`` imports it on any
  non-NPU platform. An empty ``sgl_kernel`` package with an inert ``kvcacheio`` lets that import pass; every
  other ``sgl_kernel.*`` import still raises ImportError (a catch-all would break ``quantization/utils.py``,
  which reads ``scalar_types.uint4b8`` from it).
- ``sgl_kernel`` (CUDA box whose sgl_kernel does not load, e.g. a wheel built for another torch): once torch
  sees CUDA, SGLang imports ``sgl_kernel`` without a fallback. A finder serves ``sgl_kernel.*`` with functions
  that raise when called. ``sgl_kernel.scalar_type`` stays unserved (SGLang has a pure-Python fallback).
  ``weak_ref_tensor`` returns its argument: breakable CUDA graphs take weak references of the tensors passed
  across a break; the tensor itself keeps it alive longer (memory), never gives a different value.
  0.5.1x also registers torch.compile fake implementations for ``sgl_kernel::*`` ops at import on CUDA
  (``layers/moe/topk.py``: ``register_fake("sgl_kernel::moe_fused_gate")``), which fails when the op library
  did not load; those registrations are skipped (the op still does not exist, so calling it still fails).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional


@dataclass(frozen=True)
class Shim:
    name: str
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


class StubCalled(NotImplementedError):
    """A function of a stand-in module was called."""


class _Placeholder:
    """A named constant of a stand-in class (e.g. ``InterpolationMode.BILINEAR`` in a module-level table)."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __repr__(self) -> str:
        return f"<stub {self._qualname}>"


class _StubMeta(type):
    """Stand-in classes: subclassable, their attributes are placeholders, creating an instance raises."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{cls.__module__}.{cls.__qualname__}.{attr}")

    def __call__(cls, *_args, **_kwargs):
        raise StubCalled(f"{cls.__module__}.{cls.__qualname__} is a stub class installed by sglab.sglang.shims "
                         f"({cls.__sglab_stub__}); it cannot be instantiated")


class RaisingModule(types.ModuleType):
    """A stand-in module. A CamelCase attribute is a stub class (:class:`_StubMeta`); any other attribute is a
    child stand-in module (a submodule or a function: both work), which raises :class:`StubCalled` when called."""

    def __init__(self, name: str, why: str, *, package: bool = False, overrides: Optional[dict] = None):
        super().__init__(name)
        self.__sglab_stub__ = why
        if package:
            self.__path__ = []
        self.__dict__.update(overrides or {})

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = f"{self.__name__}.{attr}"
        if attr[:1].isupper():
            value = _StubMeta(attr, (), {"__module__": self.__name__, "__sglab_stub__": self.__sglab_stub__})
        else:
            value = sys.modules.get(full) or RaisingModule(full, self.__sglab_stub__, package=True)
            sys.modules.setdefault(full, value)
        setattr(self, attr, value)
        return value

    def __call__(self, *_args, **_kwargs):
        raise StubCalled(f"{self.__name__} is a stub installed by sglab.sglang.shims ({self.__sglab_stub__}); "
                         "it has no implementation")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``root`` and ``root.*`` (minus ``exclude``) as :class:`RaisingModule` packages."""

    def __init__(self, root: str, why: str, *, exclude: tuple[str, ...] = (), overrides: Optional[dict] = None,
                 only: Optional[tuple[str, ...]] = None, raising_root: bool = True):
        self.root, self.why, self.exclude, self.overrides = root, why, exclude, overrides or {}
        self.only, self.raising_root = only, raising_root

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.root and not fullname.startswith(self.root + "."):
            return None
        if fullname in self.exclude or (self.only is not None and fullname not in self.only):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        if spec.name == self.root and not self.raising_root:
            mod = types.ModuleType(spec.name)
            mod.__path__ = []
            mod.__sglab_stub__ = self.why
            return mod
        return RaisingModule(spec.name, self.why, package=True, overrides=self.overrides.get(spec.name))

    def exec_module(self, module):
        pass


def _forget(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


def _load_file(path: Path, name: str) -> types.ModuleType:
    """Execute one file of a release as a private module, without importing the ``sglang`` package."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses in the file look their module up there
    spec.loader.exec_module(mod)
    return mod


# -- triton ------------------------------------------------------------------------------------------------------
def _mock(stub: types.ModuleType, name: str) -> types.ModuleType:
    """``sys.modules[name]``, made with the stub's own mock module type (and linked to its parent) if missing."""
    mod = sys.modules.get(name)
    if mod is None:
        mod = stub._make_mock(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_mock(stub, parent), child, mod)
    return mod


# (module, attribute) -> what 0.5.2x's stub puts there; ``None``: a mock module only
_TRITON_TREE = {
    ("triton.language.extra.libdevice", None): None,
    ("triton.runtime.jit", "JITFunction"): lambda base: type("_JITFunction", (), {}),
    ("triton.runtime.jit", "KernelInterface"): lambda base: type("_KernelInterface", (base,), {}),
    ("triton.runtime.autotuner", "OutOfResources"): lambda base: type("_OutOfResources", (Exception,), {}),
    ("triton.runtime.autotuner", "PTXASError"): lambda base: type("_PTXASError", (Exception,), {}),
    ("triton.compiler", "CompiledKernel"): lambda base: type("_CompiledKernel", (base,), {}),
    ("triton.compiler.compiler", "ASTSource"): lambda base: type("_ASTSource", (base,), {}),
    ("triton.runtime.driver", None): None,
    ("triton.testing", None): None,
    ("triton.tools.tensor_descriptor", None): None,
    ("triton.backends.compiler", "GPUTarget"): lambda base: type("_GPUTarget", (base,), {}),
}


def _complete_triton_stub(stub: types.ModuleType) -> None:
    """Give the stub real classes where torch 2.13's inductor needs classes (the set 0.5.2x's stub defines).

    A name that is already a class (the stub defined it) is left alone."""
    triton_key = getattr(stub, "_triton_key", lambda: "sglang-triton-stub")
    for (modname, attr), make in _TRITON_TREE.items():
        mod = _mock(stub, modname)
        if attr is not None and not isinstance(mod.__dict__.get(attr), type):
            setattr(mod, attr, make(stub._StubBase))
    for modname in ("triton.compiler.compiler", "triton.runtime.cache"):
        mod = _mock(stub, modname)
        if "triton_key" not in mod.__dict__:
            mod.triton_key = triton_key


def _install_platform_stub_triton(stub: types.ModuleType) -> None:
    """0.5.2x keeps its triton stub inside ``install_platform_stubs``, gated to macOS with MPS: the same module
    tree, built from the stub file's own pieces (finder, mock module type, helpers)."""
    sys.meta_path.insert(0, stub._TritonFinder())
    triton = stub._make_mock("triton")
    triton.__version__ = "3.0.0"
    triton.cdiv, triton.next_power_of_2, triton.Config = stub._cdiv, stub._next_power_of_2, stub._Config

    class _constexpr:
        def __init__(self, value=None):
            self.value = value

    _mock(stub, "triton.language").constexpr = _constexpr


def install_triton_stub(release_root: Path) -> Shim:
    """The release's own triton stub, completed for torch 2.13."""
    old, new = release_root / "sglang" / "_triton_stub.py", release_root / "sglang" / "_platform_stubs.py"
    if old.exists():
        stub = _load_file(old, "_sglab_sglang_triton_stub")
        stub.install()
        source = "sglang/_triton_stub.py"
    elif new.exists():
        stub = _load_file(new, "_sglab_sglang_platform_stubs")
        _install_platform_stub_triton(stub)
        source = "triton part of sglang/_platform_stubs.py"
    else:
        raise ImportError("no triton here and the release ships no triton stub")
    _complete_triton_stub(stub)
    return Shim("triton", f"no triton on this machine: the release's own stub ({source}), with the classes "
                          "torch 2.13's inductor imports")


# -- torchvision -------------------------------------------------------------------------------------------------
def install_torchvision_absent(cause: str) -> Shim:
    """``torchvision.*`` served by modules whose functions raise when called."""
    _forget("torchvision")
    why = f"torchvision cannot be imported here ({cause})"
    # transformers reads the version to choose between torchvision and PIL image processors; 0.0 makes it keep
    # the PIL ones wherever it can, and the local label shows where the number comes from
    sys.meta_path.insert(0, _StubFinder("torchvision", why,
                                        overrides={"torchvision": {"__version__": "0.0+sglab.stub"}}))
    return Shim("torchvision", f"{why}: modules whose functions raise when called stand in (version 0.0)")


# -- sgl_kernel --------------------------------------------------------------------------------------------------
def install_kvcacheio_stub(cause: str) -> Shim:
    """An empty ``sgl_kernel`` package with an inert ``kvcacheio`` (0.5.10.x imports it on every GPU-less path)."""
    why = f"sgl_kernel cannot be imported here ({cause})"
    sys.meta_path.insert(0, _StubFinder("sgl_kernel", why, only=("sgl_kernel", "sgl_kernel.kvcacheio"),
                                        raising_root=False))
    return Shim("sgl_kernel.kvcacheio", f"{why}; memory_pool_host.py imports sgl_kernel.kvcacheio at module level: "
                                        "an empty sgl_kernel with a kvcacheio whose functions raise when called")


def _weak_ref_tensor(tensor):
    """Stands in for sgl_kernel's weak_ref_tensor: the tensor itself (a strong reference; same values)."""
    return tensor


def _skip_fakes_of_missing_sgl_kernel_ops() -> None:
    """``torch.library.register_fake("sgl_kernel::X")`` for an op that was never defined becomes a no-op."""
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
    """On a CUDA machine whose sgl_kernel does not load: every ``sgl_kernel`` function raises when called."""
    _forget("sgl_kernel")
    why = f"the real sgl_kernel does not load here ({cause})"
    sys.meta_path.insert(0, _StubFinder("sgl_kernel", why, exclude=("sgl_kernel.scalar_type",),
                                        overrides={"sgl_kernel": {"weak_ref_tensor": _weak_ref_tensor}}))
    _skip_fakes_of_missing_sgl_kernel_ops()
    return Shim("sgl_kernel", f"{why}: functions raise when called, weak_ref_tensor returns its argument, "
                              "fake registrations of its missing torch ops skipped, "
                              "sgl_kernel.scalar_type left to SGLang's fallback")
