"""SGLang server arguments -> the capture sizes a release would use (``sglab capture-sizes -- <args>``).

The arguments are parsed by the release's own parser (``ServerArgs.add_cli_args``), so a misspelt, ambiguous
or ill-typed flag gets SGLang's own message. ``ServerArgs.__post_init__`` cannot run here as a whole: it loads
the model's config and asks the GPU for its memory. Instead the release's own ``from_cli_args`` builds the
object on a subclass whose ``__post_init__`` does nothing, and the release's handlers that decide the capture
lists run on it:

- ``_handle_gpu_memory_settings(gpu_mem)``: ``cuda_graph_max_bs``, ``chunked_prefill_size``, the decode list
  (``cuda_graph_bs``), ``piecewise_cuda_graph_max_tokens`` and the piecewise list;
- ``_handle_context_parallelism`` and ``_handle_data_parallelism``: the parallel checks (their assertions are
  SGLang's messages for contradictory arguments);

then the runner code of :mod:`.capture_sizes` keeps what the runners would capture. Two facts about the
model and two about the deployment are assumptions, returned with the rows: whether the model uses an MLA
attention backend (``mla``; it sets the default piecewise maximum to 2048), that it is a text model, the GPU
memory (``gpu_mem_gb``, default an H200's 141 GB) and, unless ``--max-running-requests`` is given, the request
pool size that caps the decode list (``max_running_requests``, default 4096; SGLang sizes it from KV memory).

Reached for the releases with the PR-era runner files (0.5.10.post1 to 0.5.13). From 0.5.14 capture lists are
decided during configuration resolution (``arg_groups/cuda_graph_hook.py``), which needs the model's config;
those releases answer with an ``unsupported`` row saying so.
"""

from __future__ import annotations

import argparse
import types

from sglab.sglang.probing import has_file


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
    return f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (SGLang's check gives no message)"


def _server_args(sa_mod, argv: list[str], mla: bool):
    """A ``ServerArgs`` built by the release's ``from_cli_args`` from the parsed arguments, without
    ``__post_init__``."""
    parser = _Parser(prog="sglang.launch_server", allow_abbrev=True)
    sa_mod.ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    # the release's own from_cli_args (it renames e.g. tensor_parallel_size -> tp_size), on a subclass whose
    # __post_init__ does nothing
    without_post_init = type("ServerArgsWithoutPostInit", (sa_mod.ServerArgs,), {"__post_init__": lambda self: None})
    obj = without_post_init.from_cli_args(ns)
    # the model facts the handlers ask for (assumptions, reported with the rows)
    obj.use_mla_backend = lambda: mla
    obj.get_model_config = lambda: types.SimpleNamespace(is_multimodal=False,
                                                         is_piecewise_cuda_graph_disabled_model=False)
    return obj


def run(prepared, params: dict) -> list[dict]:
    """Rows ``case, metric, value`` for each argument list: ``params["cases"]`` ({name: argv}) or
    ``params["argv"]`` (case ``args``); ``mla`` and ``gpu_mem_gb`` are the assumptions (see the module doc)."""
    cases = params.get("cases") or {"args": list(params.get("argv", []))}
    mla, gpu_mem_gb = bool(params.get("mla", True)), float(params.get("gpu_mem_gb", 141.0))
    max_running = int(params.get("max_running_requests", 4096))
    rows = []
    for name, argv in cases.items():
        rows += [{"case": name, **r} for r in _one_case(prepared, list(argv), mla, gpu_mem_gb, max_running)]
    return rows


def _one_case(prepared, argv: list[str], mla: bool, gpu_mem_gb: float, max_running: int) -> list[dict]:
    """``metric, value`` rows: ``piecewise`` and ``decode`` (what the runners keep), the intermediate settings,
    the assumptions; or one ``error`` / ``unsupported`` row (plus the assumptions)."""
    from sglab.sglang import bootstrap
    from sglab.sglang.probes.capture_sizes import _sizes_pr_era

    assumptions = [{"metric": "assumed_mla_backend", "value": mla},
                   {"metric": "assumed_gpu_mem_gb", "value": gpu_mem_gb},
                   {"metric": "assumed_max_running_requests", "value": max_running}]
    if not has_file(prepared, "srt/model_executor/piecewise_cuda_graph_runner.py"):
        return [{"metric": "unsupported", "value": f"sglang {prepared.release} decides capture sizes while resolving "
                 "its configuration (arg_groups/cuda_graph_hook.py), which needs the model's config; not reached"}]
    sa_mod = bootstrap.import_release_module(prepared, "sglang.srt.server_args")
    try:
        sa = _server_args(sa_mod, argv, mla)
        sa._handle_gpu_memory_settings(gpu_mem_gb * 1024)
        for handler in ("_handle_context_parallelism", "_handle_data_parallelism"):
            if hasattr(sa, handler):
                getattr(sa, handler)()
        pool_size = sa.max_running_requests or max_running
        piecewise, decode = _sizes_pr_era(prepared, sa, pool_size)
    except (_ArgError, AssertionError, ValueError, TypeError) as exc:
        return [{"metric": "error", "value": _one_line(exc)}] + assumptions
    settings = {k: getattr(sa, k) for k in ("tp_size", "dp_size", "enable_dp_attention", "attn_cp_size",
                                            "moe_dense_tp_size", "enable_two_batch_overlap", "cuda_graph_max_bs",
                                            "chunked_prefill_size", "piecewise_cuda_graph_max_tokens",
                                            "disable_piecewise_cuda_graph")}
    return ([{"metric": "piecewise", "value": piecewise}, {"metric": "decode", "value": decode},
             {"metric": "configured_piecewise", "value": list(sa.piecewise_cuda_graph_tokens)},
             {"metric": "configured_decode", "value": list(sa.cuda_graph_bs)}]
            + [{"metric": k, "value": v} for k, v in settings.items()] + assumptions)
