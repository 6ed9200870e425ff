"""The real allreduce-fusion workspace decisions (#26382 B) along the workbook's traces, with no FlashInfer.

Real code, as released (0.5.10.post1 to 0.5.13; 0.5.14 moved the world sizes to ``get_parallel()``):

- the call site ``layers/layernorm.py::_forward_with_allreduce_fusion`` (0.5.12.post1: no ``max_token_num``, so
  the callee's default 2048; 0.5.13: ``max_token_num=max(x.shape[0], 2048)``);
- ``layers/flashinfer_comm_fusion.py``: ``flashinfer_allreduce_residual_rmsnorm`` (its ``assert
  input_tensor.shape[0] <= max_token_num``), ``ensure_workspace_initialized``, ``FlashInferWorkspaceManager``
  (``initialize``, ``is_buffer_size_sufficient``, ``cleanup``) and ``pre_initialize_workspaces``.

Replaced for the call, by module name: FlashInfer's comm module (``_flashinfer_comm``) by a recorder whose
``create_allreduce_fusion_workspace`` records the request and returns a workspace object, the GPU preflight
(``_preflight_check_workspace_memory``, a ``cuMemCreate`` probe and a gloo vote) by "proceed", and the parallel
getters by the trace's world size (rank 0). The callee is registered as a torch custom op for the CUDA dispatch
key only (``@register_custom_op``), so on the CPU the probe calls the same function compiled from the release's
own file without that decorator (:func:`undecorated`), in the module's namespace. The recorded workspace answers ``is_buffer_size_sufficient`` with
FlashInfer's own rule (``check_trtllm_allreduce_fusion_workspace_metadata``, as mirrored in
:mod:`sglab.fixes.workspace_floor.sizes`): that rule is FlashInfer's, not SGLang's, and the only rebuilt piece
on the real side.

Besides each release's own call site (``site=release``), the real callee can be driven with a ``max_token_num``
the probe chooses (``site=floor_<F>``: ``max(x.shape[0], F)``), so the real manager also runs the policies the
notebook weighs.
"""

from __future__ import annotations

import contextlib
import types

from sglab.sglang.probing import patched

HIDDEN = 7168
WORLD_SIZE = 2


class RecordedWorkspace:
    """What ``create_allreduce_fusion_workspace`` would have returned: its metadata, FlashInfer's size rule."""

    def __init__(self, comm, kwargs: dict):
        self.comm, self.kwargs, self.backend = comm, kwargs, kwargs.get("backend", "trtllm")
        self.metadata = {"tp_size": kwargs["world_size"], "max_token_num": kwargs["max_token_num"],
                         "hidden_dim": kwargs["hidden_dim"], "use_fp32_lamport": False}

    def is_buffer_size_sufficient(self, tp_size, num_tokens, hidden_dim, dtype=None, use_oneshot=None):
        from sglab.fixes.workspace_floor.sizes import size_sufficient

        return size_sufficient(self.metadata, num_tokens, hidden_dim, tp_size)

    def destroy(self):
        self.comm.destroyed += 1


class RecordingComm:
    """Stands in for ``flashinfer.comm``: records every workspace creation (with the trace step it fell on)."""

    def __init__(self):
        self.step, self.created, self.destroyed, self.fused_calls = -1, [], 0, 0
        self.AllReduceFusionPattern = types.SimpleNamespace(kARResidualRMSNorm="kARResidualRMSNorm")

    def create_allreduce_fusion_workspace(self, **kwargs):
        self.created.append({"step": self.step, "max_token_num": int(kwargs["max_token_num"])})
        return RecordedWorkspace(self, kwargs)

    def allreduce_fusion(self, **kwargs):
        self.fused_calls += 1


def undecorated(module, name: str):
    """``module.name`` compiled from the module's own source without its decorators, with the module's globals
    (what the decorator registers as a CUDA-only torch op is this very function)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise AttributeError(f"{module.__name__} defines no function {name} in this release")
    node.decorator_list = []
    code = compile(ast.Module([node], type_ignores=[]), inspect.getsourcefile(module), "exec")
    namespace = module.__dict__                     # the function reads (patched) module globals at call time
    saved = namespace.get(name)
    exec(code, namespace)
    fn, namespace[name] = namespace[name], saved
    return fn


@contextlib.contextmanager
def _wired(prepared, comm: RecordingComm, world_size: int):
    """The release's modules with FlashInfer, the preflight and the parallel state replaced (see the module
    docstring); fresh managers, so every (trace, site, scenario) starts from a cold server."""
    from sglab.sglang import bootstrap

    fc = bootstrap.import_release_module(prepared, "sglang.srt.layers.flashinfer_comm_fusion")
    dist = bootstrap.import_release_module(prepared, "sglang.srt.distributed")
    group = types.SimpleNamespace(device_group="device_group", cpu_group="cpu_group", world_size=world_size)
    sizes = {"get_attn_tensor_model_parallel_world_size": lambda: world_size,
             "get_moe_tensor_parallel_world_size": lambda: world_size,
             "get_moe_expert_parallel_world_size": lambda: 1}
    ranks = {"get_attn_tensor_model_parallel_rank": lambda: 0, "get_moe_tensor_parallel_rank": lambda: 0,
             "get_moe_expert_parallel_rank": lambda: 0}
    groups = {"get_attn_tp_group": lambda: group, "get_moe_tp_group": lambda: group,
              "get_moe_ep_group": lambda: group,
              "get_tp_group": lambda: types.SimpleNamespace(world_size=1)}   # no cross-rank vote to sync
    fc_names = {**sizes, **ranks, **groups, "is_flashinfer_available": lambda: True, "_flashinfer_comm": comm,
                "_flashinfer_allreduce_unavailable": False, "_preflight_check_workspace_memory": lambda **k: True,
                "flashinfer_allreduce_residual_rmsnorm": undecorated(fc, "flashinfer_allreduce_residual_rmsnorm"),
                "_attn_tp_workspace_manager": fc.FlashInferWorkspaceManager(),
                "_moe_tp_workspace_manager": fc.FlashInferWorkspaceManager()}
    with patched(fc, **fc_names), patched(dist, **sizes):    # the call site imports its getters per call
        yield fc


class _Norm:
    """The norm module the call site reads (``variance_epsilon``); its unfused ``forward`` must not run."""

    variance_epsilon = 1e-6

    def forward(self, x, residual, post_residual_addition=None):
        raise AssertionError("the call site fell back to the unfused norm: the fused path was not taken")


def _call(prepared, fc, site: str, tokens: int, hidden: int):
    """One forward step's workspace decision: the release's call site, or the real callee at a chosen floor."""
    import torch

    x = torch.empty((tokens, hidden), dtype=torch.bfloat16)
    residual, weight = torch.empty_like(x), torch.empty(hidden, dtype=torch.bfloat16)
    if site == "release":
        from sglab.sglang import bootstrap

        ln = bootstrap.import_release_module(prepared, "sglang.srt.layers.layernorm")
        return ln._forward_with_allreduce_fusion(_Norm(), x, residual, None, weight)
    floor = int(site.removeprefix("floor_"))
    return fc.flashinfer_allreduce_residual_rmsnorm(input_tensor=x, residual=residual, weight=weight,
                                                    max_token_num=max(tokens, floor))


def replay(prepared, trace: list, site: str, *, pre_initialize: int = 0, world_size: int = WORLD_SIZE,
           hidden: int = HIDDEN) -> dict:
    """Feed the trace through the real code; the creations it asked for and the calls the callee refused."""
    import torch

    comm, refused = RecordingComm(), 0
    with _wired(prepared, comm, world_size) as fc:
        if pre_initialize:
            fc.pre_initialize_workspaces(max_token_num=pre_initialize, hidden_dim=hidden, dtype=torch.bfloat16)
        for step, tokens in enumerate(trace):
            comm.step = step
            try:
                _call(prepared, fc, site, int(tokens), hidden)
            except AssertionError as exc:
                if "unfused" in str(exc):
                    raise
                refused += 1                 # the callee's `assert input_tensor.shape[0] <= max_token_num`
        high_water = hasattr(fc._attn_tp_workspace_manager, "_max_token_num_seen")
    at_steps = [c for c in comm.created if c["step"] >= 0]
    return {"recreations": len(at_steps), "sizes": [c["max_token_num"] for c in at_steps],
            "steps": [c["step"] for c in at_steps], "preinit_creations": len(comm.created) - len(at_steps),
            "refused_calls": refused, "fused_calls": comm.fused_calls, "manager_high_water_mark": high_water}


def call_site_text(prepared) -> str:
    """The ``max_token_num=`` argument the release's call site passes (its own source line), or ``(none)``."""
    import inspect

    from sglab.sglang import bootstrap

    layernorm = bootstrap.import_release_module(prepared, "sglang.srt.layers.layernorm")
    source = inspect.getsource(layernorm._forward_with_allreduce_fusion)
    lines = [line.strip().rstrip(",") for line in source.splitlines() if "max_token_num=" in line]
    return lines[0] if lines else "(none)"


def run(prepared, params: dict) -> list[dict]:
    """Rows ``trace, site, scenario, metric, value``. ``params``: ``traces`` ({name: token counts}), ``sites``
    (default ``["release"]``), ``pre_initialize`` (default ``[0, 2048]``), ``world_size``, ``hidden``."""
    rows = [{"trace": "", "site": "release", "scenario": "", "metric": "call_site",
             "value": call_site_text(prepared)}]
    for name, trace in params["traces"].items():
        for site in params.get("sites", ["release"]):
            for pre in params.get("pre_initialize", [0, 2048]):
                got = replay(prepared, trace, site, pre_initialize=int(pre),
                             world_size=int(params.get("world_size", WORLD_SIZE)),
                             hidden=int(params.get("hidden", HIDDEN)))
                scenario = "cold" if not pre else f"preinit_{pre}"
                rows += [{"trace": name, "site": site, "scenario": scenario, "metric": k, "value": v}
                         for k, v in got.items()]
    return rows
