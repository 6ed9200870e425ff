"""What runs inside the engine's own processes: the run's ``sitecustomize`` installs hooks in
each of them that print the resolved server arguments and apply each adjustment's patch once its
module is imported: :func:`revert_hunk` (a function redefined without a PR's hunk) or
:func:`trace_calls` (a line per call), each saying ``applied``: a run proves what it changed."""

from __future__ import annotations

import __future__
import functools
import importlib
import inspect
import json
import os
import re
import sys
import textwrap
import time
from itertools import groupby
from pathlib import Path
from typing import Callable

from sglab.sglang.engine.spec import Adjustment, repo


MARK = "[sglab-engine]"


def say(text: str) -> None:
    """One line of ours in the engine's log, in one write (the ranks of a TP engine share it)."""
    line = f"{MARK} {text}\n"
    try:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line.encode())
    except (AttributeError, OSError, ValueError):  # a stdout without a file (captured, closed)
        print(line, end="", flush=True)


SITECUSTOMIZE = """\
# sglab.sglang.engine's hooks in every Python process of one engine run, after the next
# sitecustomize on the path, if any.
import os, sys
def _next_sitecustomize():
    import importlib.machinery, importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
try:
    _next_sitecustomize()
except Exception:
    pass
if os.environ.get("SGLAB_ENGINE_HOOKS"):
    try:
        from sglab.sglang.engine.hooks import install_hooks
        install_hooks(os.environ["SGLAB_ENGINE_HOOKS"])
    except Exception as exc:
        msg = "[sglab-engine] hooks failed: %s: %s" % (type(exc).__name__, exc)
        print(msg, file=sys.stderr, flush=True)
"""


def hunk_added_lines(diff: Path, contains: str, symbol: str = "") -> str:
    """The ``+`` lines around the one line of ``diff`` that adds ``contains``, without the ``+``."""
    hunks, section = [], ""  # [(section, lines)]
    for line in diff.read_text().splitlines():
        if line.startswith(("# ──", "--- ", "+++ ")):
            section = line
        elif line.startswith("@@"):
            hunks.append((section, []))
        elif hunks:
            hunks[-1][1].append(line)
    added = lambda ln: ln.startswith("+") and contains in ln  # noqa: E731
    picked = [lines for sec, lines in hunks if symbol in sec and any(map(added, lines))]
    if len(picked) != 1:
        raise ValueError(
            f"{diff.name}: {len(picked)} hunks add a line with {contains!r} (expected one)")
    runs = [list(g) for plus, g in groupby(picked[0], lambda ln: ln.startswith("+")) if plus]
    block = [ln[1:] for ln in next(r for r in runs if any(map(added, r)))]
    kept = [i for i, ln in enumerate(block) if ln.strip()]  # blank lines at either end go
    return "\n".join(block[kept[0]:kept[-1] + 1] if kept else []) + "\n"


def patch_params(a: Adjustment) -> dict:
    """An adjustment's patch parameters, a hunk named by its diff file resolved to its text."""
    params = a.param_dict()
    if params.get("diff") and not params.get("text"):
        params["text"] = hunk_added_lines(repo() / params["diff"], params["contains"])
    return params


class _AfterImport:
    """A meta-path finder that runs callbacks right after the named modules finish executing."""

    def __init__(self):
        self.callbacks: dict[str, list[Callable]] = {}

    def add(self, module: str, fn: Callable) -> None:
        if module in sys.modules:
            fn(sys.modules[module])
        else:
            self.callbacks.setdefault(module, []).append(fn)

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks:
            return None
        others = (f for f in sys.meta_path if f is not self and hasattr(f, "find_spec"))
        spec = next(filter(None, (f.find_spec(name, path, target) for f in others)), None)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, callbacks = spec.loader, self.callbacks.pop(name)
        original = loader.exec_module

        def exec_module(module):
            original(module)
            for fn in callbacks:
                fn(module)

        loader.exec_module = exec_module
        return spec


RESOLVED_KEYS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                 "sampling_backend", "disable_piecewise_cuda_graph", "enforce_piecewise_cuda_graph",
                 "piecewise_cuda_graph_tokens", "piecewise_cuda_graph_max_tokens",
                 "enable_breakable_cuda_graph", "disable_cuda_graph", "cuda_graph_bs",
                 "cuda_graph_max_bs", "tp_size", "moe_dense_tp_size",
                 "enable_flashinfer_allreduce_fusion", "mem_fraction_static",
                 "chunked_prefill_size", "max_total_tokens", "load_format", "dtype",
                 "kv_cache_dtype", "enable_multimodal", "skip_tokenizer_init",
                 "disable_radix_cache", "moe_runner_backend")


def _print_resolved(module) -> None:
    cls = getattr(module, "ServerArgs", None)
    if cls is None or getattr(cls.__post_init__, "_sglab", False):
        return
    original = cls.__post_init__

    def __post_init__(self, *a, **kw):
        original(self, *a, **kw)
        plain = (str, int, float, bool, list, type(None))
        out = {k: getattr(self, k) for k in RESOLVED_KEYS if hasattr(self, k)}
        out = {k: v if isinstance(v, plain) else str(v) for k, v in out.items()}
        say("resolved " + json.dumps(out, default=str))

    __post_init__._sglab = True
    cls.__post_init__ = __post_init__


def install_hooks(path: str) -> None:
    """In an engine process: print the resolved server arguments, apply each patch on import."""
    spec = json.loads(Path(path).read_text())
    finder = _AfterImport()
    sys.meta_path.insert(0, finder)
    finder.add("sglang.srt.server_args", _print_resolved)
    for p in spec["patches"]:
        mod, _, fn = p["patch"].partition(":")
        target = getattr(importlib.import_module(mod), fn)
        params = dict(p["params"], name=p["name"])
        finder.add(params["module"],
                   lambda module, target=target, params=params: target(params, module))


def _resolve(module, qualname: str):
    owner, obj = None, module
    for part in qualname.split("."):
        owner, obj = obj, getattr(obj, part)
    return owner, qualname.split(".")[-1], obj


def remove_text(source: str, text: str, what: str, replacement: str = "") -> str:
    """``source`` with the one occurrence of ``text`` replaced (ValueError if not exactly one)."""
    n = source.count(text)
    if n != 1:
        raise ValueError(f"{what}: the hunk occurs {n} times (expected exactly once)")
    return source.replace(text, replacement, 1)


def reverted_source(params: dict, source: str) -> str:
    """The function's source without the hunk of ``params``."""
    text = params.get("text") or hunk_added_lines(repo() / params["diff"], params["contains"])
    if "super()" in source or re.search(r"\bself\.__[a-z]\w*", source):
        raise ValueError(f"{params['qualname']}: cannot be redefined outside its class")
    return remove_text(source, text, params["qualname"], params.get("replacement", ""))


def revert_hunk(params: dict, module) -> None:
    """Patch: redefine ``params["qualname"]`` of ``module`` from its source minus the PR's hunk."""
    owner, attr, fn = _resolve(module, params["qualname"])
    source = textwrap.dedent(inspect.getsource(fn))
    new = reverted_source(params, source)
    flags = (__future__.annotations.compiler_flag
             if getattr(module, "annotations", None) is __future__.annotations else 0)
    code = compile(new, f"<{params['name']}: {module.__name__}.{params['qualname']}>", "exec",
                   flags=flags, dont_inherit=True)
    namespace: dict = {}
    exec(code, module.__dict__, namespace)
    setattr(owner, attr, namespace[attr])
    removed = len(source.splitlines()) - len(new.splitlines())
    how = (f"{params['text'].strip()!r} -> {params['replacement'].strip()!r}"
           if params.get("replacement") else f"{removed} lines removed")
    say(f"applied {params['name']} pid={os.getpid()} ({module.__name__}.{params['qualname']}: "
        f"{how})")


def trace_calls(params: dict, module) -> None:
    """Patch: one ``event`` line per call of ``params["qualname"]``, with the named arguments."""
    owner, attr, fn = _resolve(module, params["qualname"])
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        bound = sig.bind_partial(*a, **kw)
        shown = " ".join(f"{k}={bound.arguments.get(k)}" for k in params.get("args", ()))
        if "self" in bound.arguments:  # which object (two managers per rank, say)
            shown += f" obj={id(bound.arguments['self']):x}"
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            say(f"event {params['event']} pid={os.getpid()} {shown} "
                f"seconds={time.perf_counter() - t0:.6f}")

    setattr(owner, attr, wrapper)
    say(f"applied {params['name']} pid={os.getpid()} ({module.__name__}.{params['qualname']}: "
        f"traced)")
