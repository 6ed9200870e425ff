"""Inside one release's worker: SGLang server arguments -> what that release's runners would capture, and why.

Runs as a probe (``sglab.investigate.capture_probe:run``) in :mod:`sglab.sglang.runner`, one process per release.
It builds on :mod:`sglab.sglang.probes.server_args` (the release's own parser and ``from_cli_args``, without the
``__post_init__`` that needs a model and a GPU) and adds the three pieces of the release's start-up that decide
what is captured and whether the reduce-scatter is on the path, in ``ServerArgs.__post_init__`` order:

- ``ServerArgs._handle_piecewise_cuda_graph`` (server_args.py), as on a CUDA host: it turns the piecewise runner
  off for DP attention, context parallelism, an MoE all-to-all backend and more. The rule that fired is named by
  its own comment in the release's source (the handler runs under a line tracer).
- ``_handle_gpu_memory_settings``, ``_handle_data_parallelism``, ``_handle_context_parallelism``: the lists and
  the parallel checks (their assertions are SGLang's messages for contradictory arguments).
- ``initialize_moe_config`` (layers/moe/utils.py), as the scheduler does at start-up: ``require_gathered_buffer``
  reads the MoE all-to-all backend from it, in the runners and here.

Then the release's own ``compute_dp_attention_world_info`` (attention TP size), ``require_gathered_buffer``
(utils/common.py: does the layer communicator scatter tokens over attention TP?) and the runners' code
(:func:`sglab.sglang.probes.capture_sizes._sizes_pr_era`) give the rows. Releases without the PR-era runner files
(0.5.14 on) answer ``unsupported``, as in :mod:`sglab.sglang.probes.server_args`.
"""

from __future__ import annotations

import inspect
import re
import sys

RUNNER_FILE = "srt/model_executor/piecewise_cuda_graph_runner.py"   # the PR-era runners: what this probe reaches
PLATFORM_CHECKS = ("is_hip", "is_npu", "is_cpu", "is_mps", "is_xpu")   # answered False: a CUDA host
RULE_COMMENT = re.compile(r"^\s*#\s*\d+[a-z]?\.\s*(.+?)\s*$")


def _rule_comment(src: dict, lineno: int) -> str:
    """The ``# N. reason`` comment above ``lineno`` in the handler's source (the release's own words)."""
    for n in range(lineno, min(src) - 1, -1):
        m = RULE_COMMENT.match(src[n])
        if m:
            return m.group(1)
    return f"server_args.py line {lineno}"


def piecewise_switch(sa_mod, sa) -> str | None:
    """Run the release's ``_handle_piecewise_cuda_graph`` on ``sa`` as on a CUDA host; None when the piecewise
    runner stays on, else why it is off (the rule's comment, or the user's own flag)."""
    from sglab.sglang.probing import patched

    handler = getattr(type(sa), "_handle_piecewise_cuda_graph", None)
    if handler is None:
        return None
    code, hits = handler.__code__, []

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        if event == "line":
            hits.append(frame.f_lineno)
        return tracer

    platform = {n: (lambda: False) for n in PLATFORM_CHECKS if hasattr(sa_mod, n)}
    with patched(sa_mod, **platform):
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            handler(sa)
        finally:
            sys.settrace(previous)
    if not sa.disable_piecewise_cuda_graph:
        return None
    lines, start = inspect.getsourcelines(handler)
    src = {start + i: line for i, line in enumerate(lines)}
    fired = [n for n in hits if "disable_piecewise_cuda_graph = True" in src.get(n, "")]
    if not fired:
        return "--disable-piecewise-cuda-graph"
    return f"ServerArgs._handle_piecewise_cuda_graph: {_rule_comment(src, fired[0])}"


def _configure(prepared, sa_mod, argv: list[str], mla: bool, gpu_mem_gb: float):
    """The release's ``ServerArgs`` for ``argv`` after the handlers that matter here; (sa, piecewise off reason)."""
    from sglab.sglang import bootstrap
    from sglab.sglang.probes import server_args

    sa = server_args._server_args(sa_mod, argv, mla)
    off = piecewise_switch(sa_mod, sa)
    sa._handle_gpu_memory_settings(gpu_mem_gb * 1024)
    for handler in ("_handle_data_parallelism", "_handle_context_parallelism"):
        if hasattr(sa, handler):
            getattr(sa, handler)()
    bootstrap.import_release_module(prepared, "sglang.srt.layers.moe.utils").initialize_moe_config(sa)
    return sa, off


def unsupported(release: str) -> str:
    return (f"sglang {release} decides capture sizes while resolving its configuration "
            "(arg_groups/cuda_graph_hook.py), which needs the model's config; not reached")


def _one_case(prepared, argv: list[str], mla: bool, gpu_mem_gb: float, max_running: int) -> list[dict]:
    from sglab.sglang import bootstrap
    from sglab.sglang.probes import server_args
    from sglab.sglang.probing import has_file
    from sglab.sglang.probes.capture_sizes import _attn_widths, _sizes_pr_era

    if not has_file(prepared, RUNNER_FILE):
        return [{"metric": "unsupported", "value": unsupported(prepared.release)}]
    sa_mod = bootstrap.import_release_module(prepared, "sglang.srt.server_args")
    common = bootstrap.import_release_module(prepared, "sglang.srt.utils.common")
    try:
        sa, piecewise_off = _configure(prepared, sa_mod, argv, mla, gpu_mem_gb)
        attn_tp, attn_cp = _attn_widths(prepared, sa)
        gathered = bool(common.require_gathered_buffer(sa))
        pool_size = sa.max_running_requests or max_running
        piecewise, decode = _sizes_pr_era(prepared, sa, pool_size)
    except (server_args._ArgError, AssertionError, ValueError, TypeError) as exc:
        return [{"metric": "error", "value": server_args._one_line(exc)}]
    facts = {"piecewise": piecewise, "decode": decode,
             "configured_piecewise": list(sa.piecewise_cuda_graph_tokens), "configured_decode": list(sa.cuda_graph_bs),
             "piecewise_off": piecewise_off, "decode_off": "--disable-cuda-graph" if sa.disable_cuda_graph else None,
             "attn_tp_size": attn_tp, "attn_cp_size": attn_cp, "gathered_buffer": gathered,
             "pool_size": pool_size}
    for k in ("tp_size", "dp_size", "enable_dp_attention", "moe_dense_tp_size", "moe_a2a_backend",
              "enable_two_batch_overlap", "cuda_graph_max_bs", "chunked_prefill_size",
              "piecewise_cuda_graph_max_tokens"):
        facts[k] = getattr(sa, k)
    return [{"metric": k, "value": v} for k, v in facts.items()]


def run(prepared, params: dict) -> list[dict]:
    """Rows ``case, metric, value`` for each ``params["cases"]`` ({name: argv}); ``mla``, ``gpu_mem_gb`` and
    ``max_running_requests`` are the assumptions of :mod:`sglab.sglang.probes.server_args`."""
    mla, gpu_mem_gb = bool(params.get("mla", True)), float(params.get("gpu_mem_gb", 141.0))
    max_running = int(params.get("max_running_requests", 4096))
    rows = []
    for name, argv in params["cases"].items():
        rows += [{"case": name, **r} for r in _one_case(prepared, list(argv), mla, gpu_mem_gb, max_running)]
    return rows
