"""The capture sizes real SGLang releases use: the fix's record, its source check, and its probe.

- ``FIX``: #23972, the symbol it touched and the probe the notebook shows;
- :func:`check`: which state a given SGLang is in, read as source (``sglab upstream``, the release
  timeline);
- :func:`probe` (one release per worker process): the release's own runner code decides what is
  captured, for two kinds of input. ``settings`` (``ServerArgs`` fields with configured lists: the
  notebook's comparison) run the runners on a stand-in ``ServerArgs``. ``cases`` (SGLang server
  arguments: ``sglab capture-sizes``) are parsed by the release's own parser and configured by its
  own start-up code first (:func:`configure`). Both end in the same runner calls
  (:func:`runner_sizes`);
- :func:`comparison` / :func:`compare`: the real lists beside the rebuild's rule for each release;
  :func:`ask`: the server-argument cases on several releases, for the command.

Runner code per release: 0.5.10.post1 to 0.5.13 run ``PiecewiseCudaGraphRunner.__init__`` (the
filter is inline there from 0.5.11) on a stand-in runner up to its log line after the filter, and
``get_batch_sizes_to_capture`` of the decode runner. 0.5.14 and 0.5.15 run the unified runners with
the parallel widths set through ``get_parallel().override``; from 0.5.16 the configuration is
published in the runtime context and ``get_prefill_num_tokens_to_capture`` /
``get_batch_sizes_to_capture`` are plain calls. Nothing here imports SGLang at module level: the
probe runs inside a release's worker process.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import json
import linecache
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pandas as pd

from sglab.core import lazy
from sglab.core.runs import repo_root
from sglab.sglang.engine import Case, Scenario
from sglab.sglang import bootstrap
from sglab.sglang import compare as real
from sglab.sglang import source as S
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import Stop, has_file, patched
from sglab.sglang.runner import run_probes
from sglab.sglang.upstream import Verdict

# the rebuild (torch) is imported by the functions that use it: reading FIX needs none of it
fx = lazy.Module("sglab.capture_sizes.rebuild")

PIECEWISE_RUNNER = "srt/model_executor/piecewise_cuda_graph_runner.py"
PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
ROUND_UP_HOMES = ("srt/utils/common.py", "srt/model_executor/runner/base_cuda_graph_runner.py")
PUBLISHED = "srt/model_executor/model_runner_components/cuda_graph_setup.py"  # 0.5.16 on
PROBE_RELEASES = ("0.5.10.post1", "0.5.11", "0.5.14", "0.5.23")
# the rebuilt rule each release must match
VARIANT = {"0.5.10.post1": "before", "0.5.11": "pr_filter", "0.5.14": "before", "0.5.23": "today"}
DECODE = [1, 2, 4, 8, 12] + list(range(16, 257, 8))  # ServerArgs' list for --cuda-graph-max-bs 256
MAX_RUNNING_REQUESTS = 256
# name -> ServerArgs fields; a setting's ``piecewise`` replaces the configured list for it
SETTINGS = {
    "tp8": dict(tp_size=8),
    "tp8_dense_tp1": dict(tp_size=8, moe_dense_tp_size=1),
    "tp8_dp2_dpattn_dense_tp1": dict(tp_size=8, dp_size=2, enable_dp_attention=True,
                                     moe_dense_tp_size=1),
    "tp8_cp2_dense_tp1": dict(tp_size=8, attn_cp_size=2, moe_dense_tp_size=1),
    "tp12_cp3_dense_tp1": dict(tp_size=12, attn_cp_size=3, moe_dense_tp_size=1),
    "tp8_tbo_dense_tp1": dict(tp_size=8, moe_dense_tp_size=1, enable_two_batch_overlap=True),
    "tp8_dense_tp1_unaligned": dict(tp_size=8, moe_dense_tp_size=1, piecewise=[4, 12, 20]),
}
# the model config a release resolves its configuration with (0.5.14 on), relative to the checkout
MODEL = "data/models/deepseek_v3_tiny/config.json"
ASSUMED = {"mla": True, "gpu_mem_gb": 141.0, "max_running_requests": 4096, "model": MODEL}


# --------------------------------------------------------------------------------------------------
# the source check (the release timeline, `sglab upstream`)
# --------------------------------------------------------------------------------------------------
def _mod_filter(node) -> bool:
    """A ``% mul_base == 0`` / ``% attn_tp_size == 0`` comprehension filter under ``node``."""
    for comp in (n for n in ast.walk(node) if isinstance(n, ast.comprehension)):
        for cond in comp.ifs:
            for b in ast.walk(cond):
                if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mod) and \
                        any(k in ast.unparse(b.right) for k in ("mul_base", "attn_tp_size")):
                    return True
    return False


def _rounds_up(read, tree, values) -> str | None:
    """The call chain by which the prefill runner's sizes are rounded up to the alignment, or
    None."""
    names = {S.callee_name(c) for v in values for c in ast.walk(v) if isinstance(c, ast.Call)}
    chain = []
    for name in sorted(names):  # one level into this module's own helpers
        helper = S.find(tree, name)
        inner = ({S.callee_name(c)
                  for c in ast.walk(helper) if isinstance(c, ast.Call)} if helper else set())
        if "get_cuda_graph_max_batch_size" in inner or "ceil_align" in inner:
            chain.append(name)
    if not chain:
        return None
    for rel in ROUND_UP_HOMES:
        _, home = S.parsed(read, rel)
        fn = S.find(home, "get_cuda_graph_max_batch_size")
        if fn is not None and S.calls(fn, "ceil_align"):
            return (f"{chain[0]} → get_cuda_graph_max_batch_size → ceil_align "
                    f"({rel.split('/', 1)[1]})")
    if any(S.calls(S.find(tree, n), "ceil_align") for n in chain):
        return f"{chain[0]} → ceil_align"
    return None


def check(read) -> Verdict:
    """The state of #23972 in one SGLang: the PR-era piecewise runner, or the unified prefill
    runner that replaced it (filtering, rounding up, or neither)."""
    src, tree = S.parsed(read, PIECEWISE_RUNNER)
    if src is not None:
        init = S.find(tree, "PiecewiseCudaGraphRunner.__init__")
        if init is None:
            return Verdict(
                "unknown", "piecewise_cuda_graph_runner.py has no "
                "PiecewiseCudaGraphRunner.__init__")
        if _mod_filter(init):
            return Verdict(
                "pr-era", "PiecewiseCudaGraphRunner.__init__ keeps only capture sizes divisible by "
                "mul_base (attention TP, x CP) when the gathered buffer is required")
        return Verdict(
            "before", "PiecewiseCudaGraphRunner.__init__ captures every configured size: sizes not "
            "divisible by attention TP reach the dense-TP1 reduce-scatter")
    src, tree = S.parsed(read, PREFILL_RUNNER)
    if src is None:
        return Verdict("absent", "no piecewise or prefill CUDA-graph runner in this SGLang")
    values = S.assignments(S.find(tree, "PrefillCudaGraphRunner.__init__"),
                           "self.capture_num_tokens")
    if not values:
        return Verdict("unknown",
                       "PrefillCudaGraphRunner.__init__ does not set self.capture_num_tokens")
    chain = _rounds_up(read, tree, values)
    if chain:
        return Verdict(
            "changed", f"PrefillCudaGraphRunner rounds each capture size up to the "
            f"TP/CP alignment ({chain}) instead of dropping it")
    if any(_mod_filter(v) for v in values):
        return Verdict(
            "changed", "PrefillCudaGraphRunner filters capture sizes by the attention-TP alignment")
    return Verdict(
        "regressed", f"piecewise_cuda_graph_runner.py is gone; PrefillCudaGraphRunner captures "
        f"{ast.unparse(values[0])} with no TP/CP alignment (the PR's filter was lost)")


# --------------------------------------------------------------------------------------------------
# the probe, part 1: the runners' code on a ServerArgs (inside one release's worker process)
# --------------------------------------------------------------------------------------------------
def _module(prepared, name: str):
    return bootstrap.import_release_module(prepared, f"sglang.srt.{name}")


class _PoolStandIn:
    """A stand-in runner whose ``req_to_token_pool`` either answers a size or ends the real
    function."""

    def __init__(self, server_args, *, stop_at_pool: bool, pool_size: int = MAX_RUNNING_REQUESTS):
        self.server_args, self.device, self.model = server_args, "cpu", None
        self.pool_size = pool_size
        self.is_multimodal, self.is_generation, self._stop = False, True, stop_at_pool

    @property
    def req_to_token_pool(self):
        if self._stop:
            raise Stop()
        return types.SimpleNamespace(size=self.pool_size)


def _run_until_stop(cls, runner):
    obj = cls.__new__(cls)
    try:
        cls.__init__(obj, runner)
    except Stop:
        pass
    return obj


def _attn_widths(prepared, sa) -> tuple[int, int]:
    """(attention TP size, attention CP size) by the release's
    ``compute_dp_attention_world_info``."""
    info = _module(prepared, "layers.dp_attention").compute_dp_attention_world_info(
        sa.enable_dp_attention, 0, sa.tp_size, sa.dp_size, sa.attn_cp_size)
    return info[1], sa.attn_cp_size  # (attn_tp_rank, attn_tp_size, attn_dp_rank[, ...])


def _sizes_pr_era(prepared, sa, pool_size: int) -> tuple[list, list]:
    """0.5.10.post1-0.5.13: the piecewise runner's ``__init__`` up to its log line, and the decode
    list."""
    pw = _module(prepared, "model_executor.piecewise_cuda_graph_runner")
    cg = _module(prepared, "model_executor.cuda_graph_runner")
    tp, cp = _attn_widths(prepared, sa)
    names = {
        "get_attention_tp_size": lambda: tp, "get_attention_tp_rank": lambda: 0,
        "log_info_on_rank0": lambda *a, **k: (_ for _ in ()).throw(Stop())
    }
    if hasattr(pw, "get_attention_cp_size"):
        names["get_attention_cp_size"] = lambda: cp
    with patched(pw, **names):
        piecewise = _run_until_stop(pw.PiecewiseCudaGraphRunner,
                                    _PoolStandIn(sa, stop_at_pool=True))
    with patched(cg, get_attention_tp_size=lambda: tp, get_attention_cp_size=lambda: cp):
        decode, _ = cg.get_batch_sizes_to_capture(
            _PoolStandIn(sa, stop_at_pool=False, pool_size=pool_size))
    return list(piecewise.capture_num_tokens), list(decode)


def _sizes_unified(prepared, sa, pool_size: int) -> tuple[list, list]:
    """0.5.14-0.5.15: the unified runners; the parallel widths set with
    ``get_parallel().override``."""
    base = _module(prepared, "model_executor.runner.base_cuda_graph_runner")
    pre = _module(prepared, "model_executor.runner.prefill_cuda_graph_runner")
    base_runner = _module(prepared, "model_executor.runner.base_runner")
    parallel = _module(prepared, "runtime_context").get_parallel()
    tp, cp = _attn_widths(prepared, sa)
    # the two-batch-overlap plugin allocates a device tensor; sizes never read it
    with parallel.override(attn_tp_size=tp, attn_tp_rank=0, attn_cp_size=cp), \
            patched(base_runner, TboCudaGraphRunnerPlugin=lambda: None):
        prefill = _run_until_stop(pre.PrefillCudaGraphRunner, _PoolStandIn(sa, stop_at_pool=True))
        decode, _ = base.get_batch_sizes_to_capture(
            _PoolStandIn(sa, stop_at_pool=False, pool_size=pool_size))
    return list(prefill.capture_num_tokens), list(decode)


def _sizes_published(prepared, prefill_bs: list, pool_size: int) -> tuple[list, list]:
    """0.5.16+, with a configuration published: the functions the runners call, as they are."""
    base = _module(prepared, "model_executor.runner.base_cuda_graph_runner")
    pre = _module(prepared, "model_executor.runner.prefill_cuda_graph_runner")
    ctx = _module(prepared, "runtime_context").get_context()
    prefill = pre.get_prefill_num_tokens_to_capture(list(prefill_bs))
    runner = types.SimpleNamespace(server_args=ctx.server_args,
                                   req_to_token_pool=types.SimpleNamespace(size=pool_size))
    decode, _ = base.get_batch_sizes_to_capture(runner)
    return list(prefill), list(decode)


def _publish_fields(prepared, sa):
    """0.5.16+: publish the stand-in's fields as a dummy ``ServerArgs`` (a context manager)."""
    cfgmod = _module(prepared, "model_executor.cuda_graph_config")
    cfg = cfgmod.CudaGraphConfig(
        decode=cfgmod.PhaseConfig(backend=cfgmod.Backend.FULL, bs=list(sa.cuda_graph_bs)),
        prefill=cfgmod.PhaseConfig(backend=cfgmod.Backend.BREAKABLE,
                                   bs=list(sa.piecewise_cuda_graph_tokens)))
    fields = {
        k: getattr(sa, k)
        for k in ("tp_size", "dp_size", "enable_dp_attention", "moe_dense_tp_size", "attn_cp_size",
                  "enable_two_batch_overlap", "enable_dp_lm_head")
    }
    # 0.5.2x resolves the deprecated `--dp-size N --enable-dp-attention` into attn_dp_size = N;
    # publishing skips resolution, so the resolved field is set here the same way
    fields["attn_dp_size"] = sa.dp_size if sa.enable_dp_attention else 1
    return _module(prepared, "runtime_context").get_context().override_server_args(
        cuda_graph_config=cfg, **fields)


@contextlib.contextmanager
def _publish_resolved(prepared, sa):
    """0.5.16+: publish a resolved ``ServerArgs`` as the launcher does, restoring the context
    after."""
    ctx = _module(prepared, "runtime_context").get_context()
    with ctx.override_server_args():  # saves the context; restores it on the way out
        ctx.set_server_args(sa)
        yield ctx


def runner_sizes(prepared, sa, pool_size: int = MAX_RUNNING_REQUESTS, *,
                 resolved: bool = False) -> tuple[list, list]:
    """(piecewise or prefill sizes, decode batch sizes) the release's runners capture for ``sa``:
    a stand-in with the configured lists, or (``resolved``) the release's own resolved
    ``ServerArgs`` (published first from 0.5.16)."""
    if has_file(prepared, PIECEWISE_RUNNER):
        return _sizes_pr_era(prepared, sa, pool_size)
    if not has_file(prepared, PUBLISHED):
        return _sizes_unified(prepared, sa, pool_size)
    if resolved:  # already published by configure()
        return _sizes_published(prepared,
                                _view(prepared, sa).cuda_graph_config.prefill.bs or [], pool_size)
    with _publish_fields(prepared, sa):
        return _sizes_published(prepared, sa.piecewise_cuda_graph_tokens, pool_size)


def _release_defaults(prepared) -> dict:
    """Every ``ServerArgs`` field of the release at its default (a dataclass; {} otherwise)."""
    cls = _module(prepared, "server_args").ServerArgs
    if not dataclasses.is_dataclass(cls):
        return {}
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def stand_in(defaults: dict, setting: dict, piecewise: list, decode: list):
    """A stand-in ``ServerArgs``: the release's defaults, the setting, the configured lists (as
    ``piecewise_cuda_graph_tokens`` / ``cuda_graph_bs`` and as ``cuda_graph_config`` for the
    unified runners)."""
    fields = dict(defaults)
    fields.update(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False,
                  moe_dense_tp_size=None, enable_dp_lm_head=False, moe_a2a_backend="none",
                  attn_cp_size=1, enable_two_batch_overlap=False, enable_torch_compile=False,
                  piecewise_cuda_graph_compiler="eager")
    fields.update(setting)
    ns = types.SimpleNamespace
    fields.update(piecewise_cuda_graph_tokens=list(piecewise), cuda_graph_bs=list(decode),
                  cuda_graph_config=ns(prefill=ns(bs=list(piecewise)), decode=ns(bs=list(decode))))
    return ns(**fields)


def generated_defaults(prepared, max_tokens: int) -> list | None:
    """The release's own default piecewise list for ``max_tokens`` (None when not reachable)."""
    sa_cls = _module(prepared, "server_args").ServerArgs
    gen = getattr(sa_cls, "_generate_piecewise_cuda_graph_tokens", None)
    if gen is not None:
        return list(gen(types.SimpleNamespace(piecewise_cuda_graph_max_tokens=max_tokens)))
    gen = getattr(sa_cls, "_generate_prefill_cuda_graph_batch_sizes", None)  # 0.5.14-0.5.1x
    if gen is not None:
        return list(gen(types.SimpleNamespace(), max_tokens))
    if has_file(prepared, "srt/arg_groups/cuda_graph_hook.py"):
        hook = _module(prepared, "arg_groups.cuda_graph_hook")
        if hasattr(hook, "generate_prefill_cuda_graph_batch_sizes"):
            return list(hook.generate_prefill_cuda_graph_batch_sizes(max_tokens))
    return None


def setting_rows(prepared, params: dict) -> list[dict]:
    """Rows ``setting, metric, value`` (``piecewise``, ``decode`` or ``error``) per setting, and the
    release's own default piecewise list as setting ``defaults``."""
    rows = [{
        "setting": "defaults", "metric": "generated_piecewise",
        "value": generated_defaults(prepared, int(params.get("max_tokens", 2048)))
    }]
    defaults = _release_defaults(prepared)
    for name, setting in (params.get("settings") or SETTINGS).items():
        setting = dict(setting)
        piecewise = setting.pop("piecewise", params["piecewise"])
        try:
            pw, dec = runner_sizes(prepared, stand_in(defaults, setting, piecewise,
                                                      params["decode"]))
            rows += [{"setting": name, "metric": "piecewise", "value": pw},
                     {"setting": name, "metric": "decode", "value": dec}]
        except AssertionError as exc:
            rows.append({"setting": name, "metric": "error", "value": f"AssertionError: {exc}"})
    return rows


# --------------------------------------------------------------------------------------------------
# the probe, part 2: server arguments -> the release's own configuration
# --------------------------------------------------------------------------------------------------
class _ArgError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises with its message instead of printing usage and exiting."""

    def error(self, message):
        raise _ArgError(f"{self.prog}: error: {message}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, _ArgError):
        return text
    return (f"{type(exc).__name__}: {text}"
            if text else f"{type(exc).__name__} (SGLang's check gives no message)")


PLATFORM_CHECKS = ("is_hip", "is_npu", "is_cpu", "is_mps", "is_xpu")  # False: a CUDA host
RULE_COMMENT = re.compile(r"^\s*#\s*\d+[a-z]?\.\s*(.+?)\s*$")
# a line of the release's configuration code that turns one phase's CUDA graph off
_OFF = {
    "prefill": re.compile(r"disable_piecewise_cuda_graph = True|(?i:prefill)[^=!\n]*?"
                          r"(?:backend\s*=|['\"]backend['\"]\s*,)\s*Backend\.DISABLED"),
    "decode": re.compile(r"(?i)decode[^=!\n]*?(?:backend\s*=|['\"]backend['\"]\s*,)\s*"
                         r"Backend\.DISABLED")
}


def _rule(frame) -> str | None:
    """The release's own name of the rule at ``frame``'s line: a local ``name`` / ``_name`` of its
    rule loop, or the ``# N. reason`` comment above it (PR-era ``_handle_piecewise_cuda_graph``)."""
    rule = frame.f_locals.get("name", frame.f_locals.get("_name"))
    if isinstance(rule, str):
        return rule
    said = _comment_above(frame.f_locals.get("predicate"))
    if said:
        return said
    code = frame.f_code
    for n in range(frame.f_lineno, code.co_firstlineno - 1, -1):
        m = RULE_COMMENT.match(linecache.getline(code.co_filename, n))
        if m:
            return m.group(1)
    return None


def _comment_above(predicate) -> str | None:
    """A rule without a name in the release's rule list (0.5.2x's ``(None, lambda: ...)``, whose
    warning comes later): the first sentence of the comment above its entry."""
    code = getattr(predicate, "__code__", None)
    if code is None:
        return None
    said: list[str] = []
    for n in range(code.co_firstlineno - 1, max(0, code.co_firstlineno - 12), -1):
        text = linecache.getline(code.co_filename, n).strip()
        if text.startswith("#"):
            said.insert(0, text.lstrip("#").strip())
        elif said or text not in ("(", "None,"):
            break
    return " ".join(said).split(". ")[0].rstrip(".") or None


@contextlib.contextmanager
def _switched_off():
    """Every line of ``server_args.py`` and ``arg_groups/`` run in the block that turns a phase's
    CUDA graph off: ``(phase, function, rule)`` (:func:`_rule`)."""
    hits: list = []

    def lines(frame, event, arg):
        if event == "line":
            text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            hits.extend((ph, frame.f_code.co_qualname, _rule(frame))
                        for ph, rx in _OFF.items() if rx.search(text))
        return lines

    def calls(frame, event, arg):
        f = frame.f_code.co_filename
        return lines if "/srt/arg_groups/" in f or f.endswith("/srt/server_args.py") else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield hits
    finally:
        sys.settrace(previous)


def _off_reason(hits: list, phase: str, default: str) -> str:
    mine = [(f, r) for p, f, r in hits if p == phase]
    if not mine:
        return default
    f, r = mine[-1]
    return f"{f}: {r}" if r else f"{f} (the arguments given)"


@contextlib.contextmanager
def _cuda_host(prepared, gpu_mem_gb: float):
    """As on a CUDA host with ``gpu_mem_gb`` per GPU: SGLang's GPU-memory query answers that, and
    the prefill graph's default backend is the one it picks on CUDA (0.5.2x asks ``is_cuda()``)."""
    common = _module(prepared, "utils.common")
    real_query = common.get_device_memory_capacity

    def query(*args, **kwargs):
        return gpu_mem_gb * 1024

    def bound(value):
        return [
            m
            for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("sglang.")
            and getattr(m, "get_device_memory_capacity", None) is value
        ]

    for m in bound(real_query):
        m.get_device_memory_capacity = query
    cgc = (_module(prepared, "model_executor.cuda_graph_config") if has_file(
        prepared, "srt/model_executor/cuda_graph_config.py") else None)
    default = getattr(cgc, "default_prefill_backend", None)
    if default is not None:
        cgc.default_prefill_backend = lambda: cgc.Backend.BREAKABLE
    try:
        yield
    finally:
        for m in bound(query):  # modules imported inside the block bound the stand-in too
            m.get_device_memory_capacity = real_query
        if default is not None:
            cgc.default_prefill_backend = default


def model_config(model: str) -> Path:
    """The config file ``model`` names: a JSON file, or a folder's ``config.json``; a relative
    path is the working folder's where it is there, else the checkout's. ValueError when there is
    none, or when it is not a JSON object."""
    path = Path(model)
    if not path.is_absolute():
        path = path.resolve() if path.exists() else repo_root() / path
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"no model config at {path}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is not a JSON model config ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON model config (a JSON {type(config).__name__}, not "
                         "an object)")
    return path


@contextlib.contextmanager
def model_dir(model: str):
    """A folder holding the model's config as ``config.json``, what SGLang loads a model config
    from: the file's own folder, or a temporary one with a copy (:func:`model_config`), removed on
    leaving; an error raised inside names the user's file, not the copy."""
    path = model_config(model)
    if path.name == "config.json":
        yield str(path.parent)
        return
    with tempfile.TemporaryDirectory(prefix="sglab-model-") as folder:
        shutil.copy(path, Path(folder) / "config.json")
        try:
            yield folder
        except Exception as exc:
            copy = str(Path(folder) / "config.json")
            exc.args = tuple(
                a.replace(copy, str(path)).replace(folder, str(path)) if isinstance(a, str) else a
                for a in exc.args)
            raise


def _view(prepared, sa):
    """The resolved values of ``sa``: 0.5.2x keeps them beside the record, earlier releases on
    it."""
    if not has_file(prepared, "srt/arg_groups/model_override_base.py"):
        return sa
    return _module(prepared, "arg_groups.model_override_base").resolved_view(sa)


def _call(fn, sa):
    """``fn(sa)``, or ``fn()`` where the release reads the published configuration instead."""
    return fn(sa) if inspect.signature(fn).parameters else fn()


def configure(prepared, argv: list[str], p: dict) -> dict:
    """:func:`configured`, with the model's temporary folder (:func:`model_dir`) removed when it
    returns or raises."""
    with contextlib.ExitStack() as stack:
        return configured(prepared, argv, p, stack.enter_context)


def configured(prepared, argv: list[str], p: dict, model_folder) -> dict:
    """SGLang server arguments -> the capture lists the release's runners keep, after its own
    start-up code, and the facts that decided them.

    The release's own parser (``ServerArgs.add_cli_args``) reads ``argv``. 0.5.10.post1 to 0.5.13:
    ``from_cli_args`` builds the object on a subclass without ``__post_init__`` (which loads the
    model and asks the GPU); the start-up steps that decide the lists run on it in
    ``__post_init__`` order (``_handle_piecewise_cuda_graph`` as on a CUDA host,
    ``_handle_gpu_memory_settings``, ``_handle_data_parallelism``, ``_handle_context_parallelism``),
    then ``initialize_moe_config`` as the scheduler calls it; the model is assumed (``p["mla"]``, a
    text model). 0.5.14 on: the whole configuration resolution runs (``__post_init__``, or
    ``resolve_once`` in 0.5.2x) on the model config ``p["model"]`` (``--model-path`` is set to its
    folder, ``--device cuda`` unless given; ``model_folder`` enters :func:`model_dir` until the
    caller is done), as on a CUDA host (:func:`_cuda_host`)."""
    sa_mod, moe = _module(prepared, "server_args"), _module(prepared, "layers.moe.utils")
    parser = _Parser(prog="sglang.launch_server", allow_abbrev=True)
    sa_mod.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    pr_era, published = has_file(prepared, PIECEWISE_RUNNER), has_file(prepared, PUBLISHED)
    if pr_era:
        sa = type("ServerArgsWithoutPostInit", (sa_mod.ServerArgs,),
                  {"__post_init__": lambda self: None}).from_cli_args(ns)
        sa.use_mla_backend = lambda: p["mla"]
        sa.get_model_config = lambda: types.SimpleNamespace(
            is_multimodal=False, is_piecewise_cuda_graph_disabled_model=False)
        platform = {n: (lambda: False) for n in PLATFORM_CHECKS if hasattr(sa_mod, n)}
        with patched(sa_mod, **platform), _switched_off() as hits:
            if hasattr(sa, "_handle_piecewise_cuda_graph"):
                sa._handle_piecewise_cuda_graph()
        sa._handle_gpu_memory_settings(p["gpu_mem_gb"] * 1024)
        for handler in ("_handle_data_parallelism", "_handle_context_parallelism"):
            if hasattr(sa, handler):
                getattr(sa, handler)()
        view = sa
        off = {"prefill": sa.disable_piecewise_cuda_graph, "decode": sa.disable_cuda_graph}
        facts = {
            "configured_piecewise": list(sa.piecewise_cuda_graph_tokens), "configured_decode": list(
                sa.cuda_graph_bs), "piecewise_max_tokens": sa.piecewise_cuda_graph_max_tokens,
            "decode_max_bs": sa.cuda_graph_max_bs,
            "model": f"assumed: {'an MLA' if p['mla'] else 'a non-MLA'} text model"
        }
    else:
        ns.model_path, ns.device = model_folder(model_dir(p["model"])), ns.device or "cuda"
        with _cuda_host(prepared, p["gpu_mem_gb"]), _switched_off() as hits:
            sa = sa_mod.ServerArgs.from_cli_args(ns)  # 0.5.14: __post_init__ resolves here
            if hasattr(sa, "resolve_once"):
                sa.resolve_once()
        view = _view(prepared, sa)
        cfg = view.cuda_graph_config
        off = {
            "prefill": cfg.prefill.backend == "disabled", "decode": cfg.decode.backend == "disabled"
        }
        facts = {
            "configured_piecewise": list(cfg.prefill.bs
                                         or []), "configured_decode": list(cfg.decode.bs or []),
            "piecewise_max_tokens": cfg.prefill.max_bs, "decode_max_bs": cfg.decode.max_bs,
            "model": p["model"], "attention_backend": view.attention_backend
        }
    flag = {
        "prefill": "--disable-piecewise-cuda-graph" if pr_era else "off by default here",
        "decode": "--disable-cuda-graph"
    }
    facts.update({
        f"{'piecewise' if ph == 'prefill' else ph}_off": _off_reason(hits, ph, flag[ph])
        if off[ph] else None
        for ph in off
    })
    pool = view.max_running_requests or p["max_running_requests"]
    common = _module(prepared, "utils.common")
    with _publish_resolved(prepared, sa) if published else contextlib.nullcontext():
        _call(moe.initialize_moe_config, sa)
        facts["piecewise"], facts["decode"] = runner_sizes(prepared, sa, pool, resolved=True)
        if published:
            parallel = _module(prepared, "runtime_context").get_parallel()
            widths_ = parallel.attn_tp_size, parallel.attn_cp_size
        else:
            widths_ = _attn_widths(prepared, sa)
        facts["gathered_buffer"] = bool(_call(common.require_gathered_buffer, sa))
    facts["attn_tp_size"], facts["attn_cp_size"] = widths_
    facts["pool_size"] = pool
    for k in ("tp_size", "moe_dense_tp_size", "moe_a2a_backend", "enable_two_batch_overlap",
              "chunked_prefill_size"):
        facts[k] = getattr(view, k)
    facts["dp_attention"] = widths_[0] * widths_[1] < facts["tp_size"]
    return facts


def case_rows(prepared, params: dict) -> list[dict]:
    """Rows ``case, metric, value`` per server-argument case: the facts of :func:`configure`, or
    one ``error`` row with SGLang's own one-line message."""
    p = {**ASSUMED, **{k: params[k] for k in ASSUMED if k in params}}
    rows = []
    for name, argv in params["cases"].items():
        try:
            facts = configure(prepared, list(argv), p)
        except (_ArgError, AssertionError, ValueError, TypeError, RuntimeError) as exc:
            facts = {"error": _one_line(exc)}
        rows += [{"case": name, "metric": k, "value": v} for k, v in facts.items()]
    return rows


def probe(prepared, params: dict) -> list[dict]:
    """The release's answers: :func:`setting_rows` when ``params`` has the configured lists
    (``piecewise``, ``decode``; ``settings``, default :data:`SETTINGS`; ``max_tokens``), and
    :func:`case_rows` for ``params["cases"]`` ({name: argv}; the assumptions of :data:`ASSUMED`
    may be given too)."""
    if not (has_file(prepared, PIECEWISE_RUNNER) or has_file(prepared, PREFILL_RUNNER)):
        return [{
            "case": c, "metric": "unsupported", "value": f"sglang {prepared.release} has no "
            "piecewise or prefill CUDA-graph runner"
        } for c in params.get("cases", {})]
    rows = setting_rows(prepared, params) if "piecewise" in params else []
    return rows + (case_rows(prepared, params) if params.get("cases") else [])


# --------------------------------------------------------------------------------------------------
# the record
# --------------------------------------------------------------------------------------------------
def params(max_tokens: int | None = None) -> dict:
    """The notebook's probe call: the default piecewise list, the decode list, every setting."""
    max_tokens = fx.MLA_MAX_TOKENS if max_tokens is None else max_tokens
    return {
        "piecewise": fx.default_piecewise_capture_sizes(max_tokens), "decode": DECODE,
        "max_tokens": max_tokens, "settings": SETTINGS
    }


# -- the real engine: `sglab engine --scenario NAME`, recorded under
# data/recorded/engine_capture_sizes/
def _dense_args(tp: int, sizes: tuple, *, renamed: bool = False) -> tuple:
    """`--moe-dense-tp-size 1` at attention TP ``tp`` with piecewise capture ``sizes`` and decode
    graphs up to batch 8 (0.5.2x: the renamed capture-size flags)."""
    sizes_flag, max_bs = (("--cuda-graph-bs-prefill", "--cuda-graph-max-bs-decode") if renamed else
                          ("--piecewise-cuda-graph-tokens", "--cuda-graph-max-bs"))
    return ("--tp-size", str(tp), "--moe-dense-tp-size", "1", sizes_flag, *map(str, sizes), max_bs,
            "8", "--disable-radix-cache")


_TP2 = Scenario(
    fix="capture_sizes",
    name="06-dense-tp1",
    gpus=2,
    what="--moe-dense-tp-size 1 with attention TP 2 on piecewise capture sizes that TP 2 does "
    "not divide: 0.5.14 (filter lost) fails at start-up as in the PR, 0.5.11's filter "
    "starts, 0.5.23's round-up starts (needs an image with its torch)",
    model="deepseek_v3_tiny",
    tool="engine",
    releases=("0.5.14", "0.5.11", "0.5.23"),
    cases=(
        Case("odd-sizes", _dense_args(2, (3, 4, 5, 8)), releases=("0.5.14", "0.5.11")),
        # 0.5.2x renamed the capture-size flags (read from its srt/arg_groups/fields/)
        Case("odd-sizes", _dense_args(2, (3, 4, 5, 8), renamed=True), releases=("0.5.23",)),
    ),
    requests=(1,),
    input_lens=(64,),
    output_len=4,
    repeats=1,
    timeout=900.0,
    expect="0.5.14: start-up fails in the reduce-scatter of an odd size; 0.5.11: captures the "
    "even sizes [4, 8]; 0.5.23: captures every size rounded up to a multiple of 2 "
    "(Engine tool: 0.5.23 has no bench_one_batch)",
)
# the same at TP 4, on sizes TP 2 divides and TP 4 does not (2 and 6): a filter that kept multiples
# of 2 would pass at TP 2 and fail here. No FlashInfer all-reduce fusion (ServerArgs turns it on at
# TP > 1 on Hopper): its kernels take minutes to build on a fresh machine, and the failure is in the
# reduce-scatter, which the fusion does not replace
_TP4_ARGS = (*_dense_args(4, (2, 4, 6, 8)), "--enforce-disable-flashinfer-allreduce-fusion")
ENGINE = (
    _TP2,
    dataclasses.replace(
        _TP2, name="06-dense-tp4", gpus=4, releases=("0.5.14", "0.5.11"), cases=(Case(
            "tp4-sizes", _TP4_ARGS),),
        what="--moe-dense-tp-size 1 with attention TP 4 on sizes 2 4 6 8: 0.5.14 fails at "
        "start-up, 0.5.11's filter keeps the multiples of 4",
        expect="0.5.14: start-up fails in the reduce-scatter of size 2 or 6; 0.5.11: captures "
        "[4, 8]"),
    # the PR's own scale: TP 8 with the release's default piecewise sizes (no size flag), whose
    # 4, 12, 20 and 28 TP 8 does not divide
    dataclasses.replace(
        _TP2, name="06-dense-tp8", gpus=8, releases=("0.5.14", "0.5.11"),
        cases=(Case("tp8-default",
                    ("--tp-size", "8", "--moe-dense-tp-size", "1", "--cuda-graph-max-bs", "8",
                     "--disable-radix-cache", "--enforce-disable-flashinfer-allreduce-fusion")),),
        what="--tp-size 8 --moe-dense-tp-size 1 with the release's default piecewise capture "
        "sizes, as in #23972: 0.5.14 fails at start-up, 0.5.11's filter keeps the multiples of 8",
        expect="0.5.14: start-up fails in the reduce-scatter of size 4; 0.5.11: captures the "
        "default list less 4, 12, 20 and 28"),
)

FIX = Fix(name="capture_sizes", number="06", prs=(23972,), gpus=2,
          title="Piecewise capture sizes aligned to the attention-TP group (#23972)", check=check,
          hunks=(Spec(23972, symbols_in(PIECEWISE_RUNNER, "PiecewiseCudaGraphRunner.__init__")),),
          probe=Probe("sglab.capture_sizes.sglang:probe", PROBE_RELEASES, params), engine=ENGINE)


# --------------------------------------------------------------------------------------------------
# the real lists beside the rebuild's (the notebook's real-SGLang section)
# --------------------------------------------------------------------------------------------------
def widths(setting: dict) -> tuple[int, int, bool, bool]:
    """(attention TP, attention CP, gathered, two-batch overlap) of a setting, by the rebuild."""
    a = fx.ParallelArgs(**{k: v for k, v in setting.items() if k != "piecewise"})
    return (fx.attention_tp_size(a), a.attn_cp_size, fx.require_gathered_buffer(a),
            a.enable_two_batch_overlap)


def rebuild_piecewise(variant: str, setting: dict, configured: list):
    """The rebuilt rule's piecewise list, or the PR's assertion as SGLang words it."""
    tp, cp, gathered, tbo = widths(setting)
    sizes = setting.get("piecewise", configured)
    if variant == "pr_filter":
        try:
            return fx.filter_piecewise_capture_sizes(sizes, tp, cp, gathered=gathered)
        except fx.NoCaptureSizes as exc:
            return f"AssertionError: {exc}"
    if variant == "today":
        return fx.today_capture_sizes(sizes, tp, cp, gathered=gathered, two_batch_overlap=tbo)
    return list(sizes)


def rebuild_decode(setting: dict) -> list:
    tp, cp, gathered, tbo = widths(setting)
    return fx.filter_decode_batch_sizes(DECODE, tp, cp, gathered=gathered, two_batch_overlap=tbo,
                                        num_max_requests=MAX_RUNNING_REQUESTS)


def describe(sizes, configured: list) -> str:
    """A list as what it changed: ``n sizes`` plus what it dropped and added against
    ``configured``."""
    if isinstance(sizes, str):
        return sizes
    dropped = [n for n in configured if n not in sizes]
    added = [n for n in sizes if n not in configured]
    text = f"{len(sizes)} sizes"
    for word, ns in (("drops", dropped), ("adds", added)):
        if ns:
            text += f", {word} {ns[:6]}{'…' if len(ns) > 6 else ''}"
    return text if dropped or added else text + ", as configured"


def comparison(results: dict, max_tokens: int | None = None):
    """One row per (release, setting): the real piecewise list (or the assertion) and decode list
    beside the rebuilt rule's."""
    max_tokens = fx.MLA_MAX_TOKENS if max_tokens is None else max_tokens
    configured, rows = fx.default_piecewise_capture_sizes(max_tokens), []
    for release, result in real.ran(results).items():
        for name, setting in SETTINGS.items():
            got = real.facts(result, setting=name)
            base = setting.get("piecewise", configured)
            want = {
                "piecewise": rebuild_piecewise(VARIANT[release], setting, configured),
                "decode": rebuild_decode(setting)
            }
            have = {
                "piecewise": got.get("piecewise", got.get("error")),
                "decode": want["decode"] if "error" in got else got.get("decode")
            }
            tp, cp = widths(setting)[:2]
            rows.append(
                real.facts_row(release, f"{name} (attention TP/CP {tp}/{cp})", have,
                               VARIANT[release], want, ("piecewise", "decode"),
                               lambda f, b=base: describe(f["piecewise"], b)))
    return real.table(rows)


def defaults_line(results: dict, max_tokens: int | None = None) -> str:
    """Does each release generate the rebuilt default piecewise list?"""
    max_tokens = fx.MLA_MAX_TOKENS if max_tokens is None else max_tokens
    want = fx.default_piecewise_capture_sizes(max_tokens)
    parts = []
    for v, r in real.ran(results).items():
        got = real.facts(r, setting="defaults").get("generated_piecewise")
        parts.append(f"{v}: " + (
            "same" if got == want else "DIFFERENT" if got is not None else "not reachable"))
    return (f"default piecewise list for max {max_tokens} tokens vs the rebuilt one: "
            + ("; ".join(parts) or "no release ran"))


def compare() -> None:
    """The notebook's real-SGLang section: each release's lists beside the rebuilt rule's, and its
    default list beside the rebuilt one."""
    results = real.answers(FIX)
    real.section(FIX, comparison, what="(release, setting) rows", results=results)
    print(defaults_line(results))


def released(rebuilt=None, *, symbol=None, pr=None) -> None:
    """The fix across the releases, then the released ``symbol`` beside the rebuilt one."""
    real.released(FIX, rebuilt, symbol=symbol, pr=pr)


# --------------------------------------------------------------------------------------------------
# your server arguments on several releases (`sglab capture-sizes`)
# --------------------------------------------------------------------------------------------------
MODEL_PLACEHOLDER = "model-not-loaded"  # --model-path is required by the parser, never loaded


def probe_call(cases: dict[str, list[str]], releases, **assumed) -> tuple[str, dict, list[str]]:
    """``(probe, params, releases)`` of :func:`ask`: ``--model-path`` put first in every argument
    list (a later one given by the user parses, and is replaced by the model config)."""
    p = {
        "cases": {k: ["--model-path", MODEL_PLACEHOLDER, *argv]
                  for k, argv in cases.items()}, **ASSUMED, **assumed
    }
    return FIX.probe.fn, p, list(releases)


def ask(cases: dict[str, list[str]], releases, *, timeout: float = 300.0, progress=None, **assumed):
    """Rows ``release, case, metric, value`` from each release (a ``not-run`` / ``probe-error`` row
    where a release could not answer); ``assumed``: the keys of :data:`ASSUMED`; ``progress``:
    :func:`sglab.sglang.runner.run_probes`'."""
    probe_fn, p, releases = probe_call(cases, releases, **assumed)
    frames = []
    for v, r in run_probes(releases, probe_fn, p, timeout=timeout, progress=progress).items():
        if r.ok:
            frames.append(r.rows.drop(columns=["probe"]))
        else:
            status = "not-run" if r.status == "not-run" else "probe-error"
            frames.append(
                pd.DataFrame([
                    {"release": v, "case": c, "metric": status, "value": r.reason} for c in cases
                ]))
    return pd.concat(frames, ignore_index=True)
