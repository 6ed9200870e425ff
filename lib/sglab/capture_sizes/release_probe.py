"""Inside one SGLang release's worker: its own runners decide the capture sizes for configured lists
(:func:`setting_rows`) or server arguments (:func:`case_rows`): up to 0.5.13 on a stand-in runner,
0.5.14-0.5.15 the unified runners, from 0.5.16 plain calls on a published configuration."""

from __future__ import annotations

import argparse
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

from sglab.core.runs import repo_root
from sglab.sglang import bootstrap
from sglab.sglang.probing import Stop, has_file, patched

# -- what the probe reads (sglang.py's record names these too)
PIECEWISE_RUNNER = "srt/model_executor/piecewise_cuda_graph_runner.py"
PUBLISHED = "srt/model_executor/model_runner_components/cuda_graph_setup.py"  # 0.5.16 on
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


def model_config(model: str) -> Path:
    """The config file ``model`` names (a JSON file, a folder's ``config.json``), or ValueError."""
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


# -- the runners' code on a ServerArgs -------------------------------------------------------------
def _module(prepared, name: str):
    return bootstrap.import_release_module(prepared, f"sglang.srt.{name}")


class _PoolStandIn:
    """A runner whose ``req_to_token_pool`` answers ``pool_size``, or (None) ends the function."""

    def __init__(self, server_args, pool_size: int | None = None):
        self.server_args, self.device, self.model = server_args, "cpu", None
        self.pool_size, self.is_multimodal, self.is_generation = pool_size, False, True

    @property
    def req_to_token_pool(self):
        if self.pool_size is None:
            raise Stop()
        return types.SimpleNamespace(size=self.pool_size)


def _captured(prefill_cls, decode_sizes, sa, pool_size: int) -> tuple[list, list]:
    """The prefill runner's ``__init__`` up to its pool, and the decode sizes, on stand-ins."""
    prefill = prefill_cls.__new__(prefill_cls)
    with contextlib.suppress(Stop):
        prefill_cls.__init__(prefill, _PoolStandIn(sa))
    decode, _ = decode_sizes(_PoolStandIn(sa, pool_size))
    return list(prefill.capture_num_tokens), list(decode)


def _attn_widths(prepared, sa) -> tuple[int, int]:
    """(attention TP, attention CP) by the release's ``compute_dp_attention_world_info``."""
    info = _module(prepared, "layers.dp_attention").compute_dp_attention_world_info(
        sa.enable_dp_attention, 0, sa.tp_size, sa.dp_size, sa.attn_cp_size)
    return info[1], sa.attn_cp_size  # (attn_tp_rank, attn_tp_size, attn_dp_rank[, ...])


def _publish_fields(prepared, sa):
    """0.5.16+: publish the stand-in's fields as a dummy ``ServerArgs`` (a context manager)."""
    cfgmod = _module(prepared, "model_executor.cuda_graph_config")
    cfg = cfgmod.CudaGraphConfig(
        decode=cfgmod.PhaseConfig(backend=cfgmod.Backend.FULL, bs=list(sa.cuda_graph_bs)),
        prefill=cfgmod.PhaseConfig(backend=cfgmod.Backend.BREAKABLE,
                                   bs=list(sa.piecewise_cuda_graph_tokens)))
    names = ("tp_size", "dp_size", "enable_dp_attention", "moe_dense_tp_size", "attn_cp_size",
             "enable_two_batch_overlap", "enable_dp_lm_head")
    fields = {k: getattr(sa, k) for k in names}
    # 0.5.2x resolves the deprecated `--dp-size N --enable-dp-attention` into attn_dp_size = N;
    # publishing skips resolution, so the resolved field is set here the same way
    fields["attn_dp_size"] = sa.dp_size if sa.enable_dp_attention else 1
    return _module(prepared, "runtime_context").get_context().override_server_args(
        cuda_graph_config=cfg, **fields)


def runner_sizes(prepared, sa, pool_size: int = MAX_RUNNING_REQUESTS, *,
                 resolved: bool = False) -> tuple[list, list]:
    """(piecewise, decode) sizes the release's runners capture for ``sa``."""
    if has_file(prepared, PIECEWISE_RUNNER):  # 0.5.10.post1-0.5.13: __init__ to its log line
        pw = _module(prepared, "model_executor.piecewise_cuda_graph_runner")
        cg = _module(prepared, "model_executor.cuda_graph_runner")
        tp, cp = _attn_widths(prepared, sa)
        names = dict(get_attention_tp_size=lambda: tp, get_attention_tp_rank=lambda: 0,
                     log_info_on_rank0=lambda *a, **k: (_ for _ in ()).throw(Stop()))
        if hasattr(pw, "get_attention_cp_size"):
            names["get_attention_cp_size"] = lambda: cp
        with patched(pw, **names), patched(cg, get_attention_tp_size=lambda: tp,
                                           get_attention_cp_size=lambda: cp):
            return _captured(pw.PiecewiseCudaGraphRunner, cg.get_batch_sizes_to_capture, sa,
                             pool_size)
    if not has_file(prepared, PUBLISHED):  # 0.5.14-0.5.15: widths by get_parallel().override
        base = _module(prepared, "model_executor.runner.base_cuda_graph_runner")
        pre = _module(prepared, "model_executor.runner.prefill_cuda_graph_runner")
        parallel = _module(prepared, "runtime_context").get_parallel()
        tp, cp = _attn_widths(prepared, sa)
        # the two-batch-overlap plugin allocates a device tensor; sizes never read it
        with parallel.override(attn_tp_size=tp, attn_tp_rank=0, attn_cp_size=cp), \
                patched(_module(prepared, "model_executor.runner.base_runner"),
                        TboCudaGraphRunnerPlugin=lambda: None):
            return _captured(pre.PrefillCudaGraphRunner, base.get_batch_sizes_to_capture, sa,
                             pool_size)
    # 0.5.16+, with a configuration published: the functions the runners call, as they are
    with contextlib.ExitStack() as stack:
        if resolved:  # already published by configure()
            prefill_bs = _view(prepared, sa).cuda_graph_config.prefill.bs or []
        else:
            stack.enter_context(_publish_fields(prepared, sa))
            prefill_bs = sa.piecewise_cuda_graph_tokens
        base = _module(prepared, "model_executor.runner.base_cuda_graph_runner")
        pre = _module(prepared, "model_executor.runner.prefill_cuda_graph_runner")
        ctx = _module(prepared, "runtime_context").get_context()
        prefill = pre.get_prefill_num_tokens_to_capture(list(prefill_bs))
        decode, _ = base.get_batch_sizes_to_capture(
            types.SimpleNamespace(server_args=ctx.server_args,
                                  req_to_token_pool=types.SimpleNamespace(size=pool_size)))
    return list(prefill), list(decode)


def stand_in(defaults: dict, setting: dict, piecewise: list, decode: list):
    """A stand-in ``ServerArgs``: the release's defaults, the setting and the configured lists."""
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


def setting_rows(prepared, params: dict) -> list[dict]:
    """Rows ``setting, metric, value`` per setting; the release's default list as ``defaults``."""
    cls = _module(prepared, "server_args").ServerArgs  # its fields' defaults (a dataclass)
    max_tokens, gen = int(params.get("max_tokens", 2048)), None  # the release's own default list
    if hasattr(cls, "_generate_piecewise_cuda_graph_tokens"):
        ns = types.SimpleNamespace(piecewise_cuda_graph_max_tokens=max_tokens)
        gen = list(cls._generate_piecewise_cuda_graph_tokens(ns))
    elif hasattr(cls, "_generate_prefill_cuda_graph_batch_sizes"):  # 0.5.14-0.5.1x
        gen = list(cls._generate_prefill_cuda_graph_batch_sizes(types.SimpleNamespace(),
                                                                max_tokens))
    elif has_file(prepared, "srt/arg_groups/cuda_graph_hook.py"):
        hook = _module(prepared, "arg_groups.cuda_graph_hook")
        if hasattr(hook, "generate_prefill_cuda_graph_batch_sizes"):
            gen = list(hook.generate_prefill_cuda_graph_batch_sizes(max_tokens))
    rows = [dict(setting="defaults", metric="generated_piecewise", value=gen)]
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in (dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ())
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
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


# -- server arguments -> the release's own configuration -------------------------------------------
class _ArgError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises with its message instead of printing usage and exiting."""

    def error(self, message):
        raise _ArgError(f"{self.prog}: error: {message}")


PLATFORM_CHECKS = ("is_hip", "is_npu", "is_cpu", "is_mps", "is_xpu")  # False: a CUDA host
RULE_COMMENT = re.compile(r"^\s*#\s*\d+[a-z]?\.\s*(.+?)\s*$")
# a line of the release's configuration code that turns one phase's CUDA graph off
_OFF = dict(
    prefill=re.compile(r"disable_piecewise_cuda_graph = True|(?i:prefill)[^=!\n]*?"
                       r"(?:backend\s*=|['\"]backend['\"]\s*,)\s*Backend\.DISABLED"),
    decode=re.compile(r"(?i)decode[^=!\n]*?(?:backend\s*=|['\"]backend['\"]\s*,)\s*"
                      r"Backend\.DISABLED"))


def _rule(frame) -> str | None:
    """The release's name for the rule at ``frame``'s line (loop ``name``, a ``# N.`` comment)."""
    rule = frame.f_locals.get("name", frame.f_locals.get("_name"))
    if isinstance(rule, str):
        return rule
    # a nameless rule (0.5.2x ``(None, lambda: ...)``): the first sentence of the comment above it
    above, said = getattr(frame.f_locals.get("predicate"), "__code__", None), []
    for n in range(above.co_firstlineno - 1, max(0, above.co_firstlineno - 12),
                   -1) if above else ():
        text = linecache.getline(above.co_filename, n).strip()
        if text.startswith("#"):
            said.insert(0, text.lstrip("#").strip())
        elif said or text not in ("(", "None,"):
            break
    first, code = " ".join(said).split(". ")[0].rstrip("."), frame.f_code
    if first:
        return first
    lines = (linecache.getline(code.co_filename, n)
             for n in range(frame.f_lineno, code.co_firstlineno - 1, -1))
    return next((m.group(1) for m in map(RULE_COMMENT.match, lines) if m), None)


@contextlib.contextmanager
def _switched_off():
    """``(phase, function, rule)`` of each ServerArgs line run that turns a phase's graph off."""
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


@contextlib.contextmanager
def _cuda_host(prepared, gpu_mem_gb: float):
    """As on a CUDA host with ``gpu_mem_gb`` per GPU (the memory query, the prefill backend)."""
    real_query = _module(prepared, "utils.common").get_device_memory_capacity

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


@contextlib.contextmanager
def model_dir(model: str):
    """A folder with the model's config as ``config.json`` (a temporary copy where it is not)."""
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
    """The resolved values of ``sa`` (0.5.2x keeps them beside the record)."""
    if not has_file(prepared, "srt/arg_groups/model_override_base.py"):
        return sa
    return _module(prepared, "arg_groups.model_override_base").resolved_view(sa)


def _call(fn, sa):
    """``fn(sa)``, or ``fn()`` where the release reads the published configuration instead."""
    return fn(sa) if inspect.signature(fn).parameters else fn()


def configure(prepared, argv: list[str], p: dict, model_folder) -> dict:
    """Server arguments, parsed by the release -> the capture lists its runners keep, and why."""
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
        facts = dict(configured_piecewise=list(sa.piecewise_cuda_graph_tokens),
                     configured_decode=list(sa.cuda_graph_bs),
                     piecewise_max_tokens=sa.piecewise_cuda_graph_max_tokens,
                     decode_max_bs=sa.cuda_graph_max_bs,
                     model=f"assumed: {'an MLA' if p['mla'] else 'a non-MLA'} text model")
    else:
        ns.model_path, ns.device = model_folder(model_dir(p["model"])), ns.device or "cuda"
        with _cuda_host(prepared, p["gpu_mem_gb"]), _switched_off() as hits:
            sa = sa_mod.ServerArgs.from_cli_args(ns)  # 0.5.14: __post_init__ resolves here
            if hasattr(sa, "resolve_once"):
                sa.resolve_once()
        view = _view(prepared, sa)
        cfg = view.cuda_graph_config
        off = dict(prefill=cfg.prefill.backend == "disabled",
                   decode=cfg.decode.backend == "disabled")
        facts = dict(configured_piecewise=list(cfg.prefill.bs
                                               or []), configured_decode=list(cfg.decode.bs or []),
                     piecewise_max_tokens=cfg.prefill.max_bs, decode_max_bs=cfg.decode.max_bs,
                     model=p["model"], attention_backend=view.attention_backend)
    flag = dict(prefill="--disable-piecewise-cuda-graph" if pr_era else "off by default here",
                decode="--disable-cuda-graph")
    for ph in off:  # the last line that turned the phase off, else the flag
        said = [f"{f}: {r}" if r else f"{f} (the arguments given)" for q, f, r in hits if q == ph]
        facts[f"{'piecewise' if ph == 'prefill' else ph}_off"] = ((said or [flag[ph]])[-1]
                                                                  if off[ph] else None)
    pool = view.max_running_requests or p["max_running_requests"]
    common = _module(prepared, "utils.common")
    with contextlib.ExitStack() as stack:
        if published:  # the resolved ServerArgs, published as the launcher does (restored after)
            ctx = _module(prepared, "runtime_context").get_context()
            stack.enter_context(ctx.override_server_args())
            ctx.set_server_args(sa)
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
    """Rows ``case, metric, value`` per case: :func:`configure`'s facts, or SGLang's error."""
    p = {**ASSUMED, **{k: params[k] for k in ASSUMED if k in params}}
    rows = []
    for name, argv in params["cases"].items():
        try:
            with contextlib.ExitStack() as stack:
                facts = configure(prepared, list(argv), p, stack.enter_context)
        except (_ArgError, AssertionError, ValueError, TypeError, RuntimeError) as exc:
            text, kind = " ".join(str(exc).split()), type(exc).__name__
            said = f"{kind}: {text}" if text else f"{kind} (SGLang's check gives no message)"
            facts = {"error": text if isinstance(exc, _ArgError) else said}
        rows += [{"case": name, "metric": k, "value": v} for k, v in facts.items()]
    return rows
