"""The capture sizes a release really uses under attention TP / CP / dense TP 1 / two-batch overlap (#23972).

Given the configured lists (piecewise token counts and decode batch sizes), each release's own runner code
decides what is captured:

- 0.5.10.post1 to 0.5.13: piecewise in ``PiecewiseCudaGraphRunner.__init__``
  (``model_executor/piecewise_cuda_graph_runner.py``; #23972's filter is inline there from 0.5.11). The real
  ``__init__`` runs on a stand-in runner with the module's attention TP/CP getters answering for the setting,
  and ends at its log line right after the filter (:class:`~._support.Stop`). Decode:
  ``get_batch_sizes_to_capture`` of ``model_executor/cuda_graph_runner.py``, same getters.
- 0.5.14 to 0.5.2x: ``PrefillCudaGraphRunner.__init__`` / ``get_batch_sizes_to_capture`` of the unified
  ``model_executor/runner/``; 0.5.14 reads the parallel widths from ``get_parallel()``, set for the setting with
  its own ``override``. From 0.5.16 the configuration is published with ``get_context().override_server_args`` and
  ``get_prefill_num_tokens_to_capture`` (what the prefill runner calls) is called as it is.

Attention TP size comes from the release's own ``compute_dp_attention_world_info`` (0.5.1x) or from the
published parallel context (0.5.2x). Whether the layer communicator gathers is the release's own
``require_gathered_buffer``.
"""

from __future__ import annotations

import types

from sglab.sglang.probing import Stop, has_file, patched

# name -> ServerArgs fields; anything not named keeps the default in _server_args()
SETTINGS = {
    "tp8": dict(tp_size=8),
    "tp8_dense_tp1": dict(tp_size=8, moe_dense_tp_size=1),
    "tp8_dp2_dpattn_dense_tp1": dict(tp_size=8, dp_size=2, enable_dp_attention=True, moe_dense_tp_size=1),
    "tp8_cp2_dense_tp1": dict(tp_size=8, attn_cp_size=2, moe_dense_tp_size=1),
    "tp12_cp3_dense_tp1": dict(tp_size=12, attn_cp_size=3, moe_dense_tp_size=1),
    "tp8_tbo_dense_tp1": dict(tp_size=8, moe_dense_tp_size=1, enable_two_batch_overlap=True),
}
MAX_RUNNING_REQUESTS = 256


def _release_defaults(prepared) -> dict:
    """Every ``ServerArgs`` field of the release at its default (0.5.1x: a dataclass; {} otherwise)."""
    import dataclasses

    from sglab.sglang import bootstrap

    sa_mod = bootstrap.import_release_module(prepared, "sglang.srt.server_args")
    if not dataclasses.is_dataclass(sa_mod.ServerArgs):
        return {}
    out = {}
    for f in dataclasses.fields(sa_mod.ServerArgs):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _server_args(defaults: dict, setting: dict, piecewise: list, decode: list):
    """A stand-in ``ServerArgs``: the release's defaults, the setting, the configured lists (as
    ``piecewise_cuda_graph_tokens`` / ``cuda_graph_bs`` and as ``cuda_graph_config`` for the unified runners)."""
    fields = dict(defaults)
    fields.update(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False, moe_dense_tp_size=None,
                  enable_dp_lm_head=False, moe_a2a_backend="none", attn_cp_size=1, enable_two_batch_overlap=False,
                  enable_torch_compile=False, piecewise_cuda_graph_compiler="eager")
    fields.update(setting)
    fields.update(piecewise_cuda_graph_tokens=list(piecewise), cuda_graph_bs=list(decode),
                  cuda_graph_config=types.SimpleNamespace(prefill=types.SimpleNamespace(bs=list(piecewise)),
                                                          decode=types.SimpleNamespace(bs=list(decode))))
    return types.SimpleNamespace(**fields)


def _attn_widths(prepared, sa) -> tuple[int, int]:
    """(attention TP size, attention CP size) by the release's ``compute_dp_attention_world_info``."""
    from sglab.sglang import bootstrap

    dpa = bootstrap.import_release_module(prepared, "sglang.srt.layers.dp_attention")
    info = dpa.compute_dp_attention_world_info(sa.enable_dp_attention, 0, sa.tp_size, sa.dp_size, sa.attn_cp_size)
    return info[1], sa.attn_cp_size   # (attn_tp_rank, attn_tp_size, attn_dp_rank[, attn_dp_size])


class _PoolStandIn:
    """A stand-in runner whose ``req_to_token_pool`` either answers a size or ends the real function."""

    def __init__(self, server_args, *, stop_at_pool: bool, pool_size: int = MAX_RUNNING_REQUESTS):
        self.server_args, self.device, self.model, self.pool_size = server_args, "cpu", None, pool_size
        self.is_multimodal, self.is_generation, self._stop = False, True, stop_at_pool

    @property
    def req_to_token_pool(self):
        if self._stop:
            raise Stop()
        return types.SimpleNamespace(size=self.pool_size)


def _run_until_stop(cls, runner) -> object:
    obj = cls.__new__(cls)
    try:
        cls.__init__(obj, runner)
    except Stop:
        pass
    return obj


def _sizes_pr_era(prepared, sa, pool_size: int = MAX_RUNNING_REQUESTS) -> tuple[list, list]:
    """0.5.10.post1-0.5.13: the piecewise runner's ``__init__`` up to its log line, and the decode list."""
    from sglab.sglang import bootstrap

    pw = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.piecewise_cuda_graph_runner")
    cg = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.cuda_graph_runner")
    tp, cp = _attn_widths(prepared, sa)
    getters = {"get_attention_tp_size": lambda: tp, "get_attention_tp_rank": lambda: 0}
    pw_names = {**getters, "log_info_on_rank0": lambda *a, **k: (_ for _ in ()).throw(Stop())}
    if hasattr(pw, "get_attention_cp_size"):
        pw_names["get_attention_cp_size"] = lambda: cp
    with patched(pw, **pw_names):
        piecewise = _run_until_stop(pw.PiecewiseCudaGraphRunner, _PoolStandIn(sa, stop_at_pool=True))
    with patched(cg, get_attention_tp_size=lambda: tp, get_attention_cp_size=lambda: cp):
        decode, _ = cg.get_batch_sizes_to_capture(_PoolStandIn(sa, stop_at_pool=False, pool_size=pool_size))
    return list(piecewise.capture_num_tokens), list(decode)


def _sizes_unified_context_free(prepared, sa) -> tuple[list, list]:
    """0.5.14-0.5.15: the unified runners; the parallel widths set with ``get_parallel().override``."""
    from sglab.sglang import bootstrap

    base = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.runner.base_cuda_graph_runner")
    pre = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.runner.prefill_cuda_graph_runner")
    base_runner = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.runner.base_runner")
    from sglang.srt.runtime_context import get_parallel

    tp, cp = _attn_widths(prepared, sa)
    # the two-batch-overlap plugin allocates a device tensor from the global server args; sizes never read it
    with get_parallel().override(attn_tp_size=tp, attn_tp_rank=0, attn_cp_size=cp), \
            patched(base_runner, TboCudaGraphRunnerPlugin=lambda: None):
        prefill = _run_until_stop(pre.PrefillCudaGraphRunner, _PoolStandIn(sa, stop_at_pool=True))
        decode, _ = base.get_batch_sizes_to_capture(_PoolStandIn(sa, stop_at_pool=False))
    return list(prefill.capture_num_tokens), list(decode)


def _sizes_published(prepared, sa) -> tuple[list, list]:
    """0.5.16+: the configuration published through the runtime context, the runner functions as they are."""
    from sglab.sglang import bootstrap

    base = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.runner.base_cuda_graph_runner")
    pre = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.runner.prefill_cuda_graph_runner")
    cfgmod = bootstrap.import_release_module(prepared, "sglang.srt.model_executor.cuda_graph_config")
    from sglang.srt.runtime_context import get_context

    cfg = cfgmod.CudaGraphConfig(decode=cfgmod.PhaseConfig(backend=cfgmod.Backend.FULL, bs=list(sa.cuda_graph_bs)),
                                 prefill=cfgmod.PhaseConfig(backend=cfgmod.Backend.BREAKABLE,
                                                            bs=list(sa.piecewise_cuda_graph_tokens)))
    fields = {k: getattr(sa, k) for k in ("tp_size", "dp_size", "enable_dp_attention", "moe_dense_tp_size",
                                          "attn_cp_size", "enable_two_batch_overlap", "enable_dp_lm_head")}
    # 0.5.2x resolves the deprecated `--dp-size N --enable-dp-attention` into `attn_dp_size = N`; publishing
    # skips resolution, so the resolved field is set here the same way
    fields["attn_dp_size"] = sa.dp_size if sa.enable_dp_attention else 1
    with get_context().override_server_args(cuda_graph_config=cfg, **fields) as published:
        prefill = pre.get_prefill_num_tokens_to_capture(list(sa.piecewise_cuda_graph_tokens))
        runner = types.SimpleNamespace(server_args=published,
                                       req_to_token_pool=types.SimpleNamespace(size=MAX_RUNNING_REQUESTS))
        decode, _ = base.get_batch_sizes_to_capture(runner)
    return list(prefill), list(decode)


def sizes_function(prepared):
    """The strategy that reaches this release's capture-size code."""
    if has_file(prepared, "srt/model_executor/piecewise_cuda_graph_runner.py"):
        return _sizes_pr_era
    if has_file(prepared, "srt/model_executor/model_runner_components/cuda_graph_setup.py"):
        return _sizes_published
    return _sizes_unified_context_free


def generated_defaults(prepared, max_tokens: int) -> list | None:
    """The release's own default piecewise list for ``max_tokens`` (None when this probe cannot reach it)."""
    from sglab.sglang import bootstrap

    sa_mod = bootstrap.import_release_module(prepared, "sglang.srt.server_args")
    gen = getattr(sa_mod.ServerArgs, "_generate_piecewise_cuda_graph_tokens", None)
    if gen is not None:
        return list(gen(types.SimpleNamespace(piecewise_cuda_graph_max_tokens=max_tokens)))
    gen = getattr(sa_mod.ServerArgs, "_generate_prefill_cuda_graph_batch_sizes", None)   # 0.5.14-0.5.1x
    if gen is not None:
        return list(gen(types.SimpleNamespace(), max_tokens))
    if has_file(prepared, "srt/arg_groups/cuda_graph_hook.py"):
        hook = bootstrap.import_release_module(prepared, "sglang.srt.arg_groups.cuda_graph_hook")
        if hasattr(hook, "generate_prefill_cuda_graph_batch_sizes"):
            return list(hook.generate_prefill_cuda_graph_batch_sizes(max_tokens))
    return None


def run(prepared, params: dict) -> list[dict]:
    """Rows ``setting, metric, value`` (metric: ``piecewise``, ``decode``, ``error``; plus the release's own
    default piecewise list as setting ``defaults``). ``params``: ``piecewise`` and ``decode`` (the configured
    lists), optional ``settings`` ({name: fields}, default :data:`SETTINGS`; a setting's ``piecewise`` replaces
    the list for it), ``max_tokens`` for the defaults."""
    fn = sizes_function(prepared)
    rows = [{"setting": "defaults", "metric": "generated_piecewise",
             "value": generated_defaults(prepared, int(params.get("max_tokens", 2048)))},
            {"setting": "defaults", "metric": "code_path", "value": fn.__name__.lstrip("_")}]
    defaults = _release_defaults(prepared)
    for name, setting in (params.get("settings") or SETTINGS).items():
        setting = dict(setting)
        piecewise = setting.pop("piecewise", params["piecewise"])   # a setting may bring its own list
        sa = _server_args(defaults, setting, piecewise, params["decode"])
        try:
            piecewise, decode = fn(prepared, sa)
            rows += [{"setting": name, "metric": "piecewise", "value": piecewise},
                     {"setting": name, "metric": "decode", "value": decode}]
        except AssertionError as exc:
            rows.append({"setting": name, "metric": "error", "value": f"AssertionError: {exc}"})
    return rows


def run_with_args(prepared, params: dict) -> list[dict]:
    """:func:`run` plus the server-argument cases ``params["server_args"]`` ({name: argv}) of
    :mod:`.server_args` as settings ``args:<name>``: one process for both (the tests' budget)."""
    from sglab.sglang.probes import server_args

    extra = server_args.run(prepared, {"cases": params.get("server_args", {})}) if params.get("server_args") else []
    return run(prepared, params) + [{"setting": f"args:{r.pop('case')}", **r} for r in extra]
