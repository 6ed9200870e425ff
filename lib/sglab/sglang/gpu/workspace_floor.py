"""The real ``FlashInferWorkspaceManager`` (#26382's call site) creating FlashInfer's all-reduce
workspace on 2 GPUs.

Runs only where FlashInfer is importable: the GPU carry does not hold it (59 MiB of Python and CUDA
sources does not fit beside SGLang in one 64 MiB call), so on the usual GPU call this gives one row
per case saying "not run: flashinfer not installed", and nothing else.

Where FlashInfer is present: two rank workers of the release (``rank``), each on its own GPU, joined
by ``torch.distributed`` (NCCL for the device group, gloo for the CPU group, a file store), drive
``layers/flashinfer_comm_fusion.py`` ``FlashInferWorkspaceManager.initialize`` along a trace of
``max_token_num`` values, before the floor (the trace as is) and after it (each value raised to
2048, the ``max(x.shape[0], 2048)`` of #26382): per call, milliseconds, whether a workspace was
(re)created, and each rank's NVML memory. The first creation JIT-builds FlashInfer's ``trtllm_comm``
module (about 4 minutes once).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

TRACE = (512, 1024, 4096, 256, 2048)
FLOOR = 2048
HIDDEN = 7168


def traces() -> dict[str, list[int]]:
    return {"before_floor": list(TRACE), "after_floor": [max(t, FLOOR) for t in TRACE]}


def rank(prepared, params: dict) -> list[dict]:
    """One rank: join the group, walk the trace with the real manager, report per call and its
    memory."""
    import torch
    import torch.distributed as dist

    from sglab.core.memory import process_gpu_memory

    from sglab.sglang import bootstrap

    r, world = int(params["rank"]), int(params["world_size"])
    torch.cuda.set_device(r)
    dist.init_process_group("nccl", init_method=f"file://{params['store']}", rank=r,
                            world_size=world, device_id=torch.device("cuda", r))
    cpu_group = dist.new_group(backend="gloo")
    mod = bootstrap.import_release_module(prepared, "sglang.srt.layers.flashinfer_comm_fusion")
    rows = []
    try:
        for case, trace in traces().items():
            mgr = mod.FlashInferWorkspaceManager()
            for i, tokens in enumerate(trace):
                before = id(mgr.workspace) if mgr.workspace is not None else None
                dist.barrier(group=cpu_group)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                mgr.initialize(world_size=world, rank=r, max_token_num=tokens, hidden_dim=HIDDEN,
                               group=dist.group.WORLD, dtype=torch.bfloat16,
                               device_group=dist.group.WORLD, cpu_group=cpu_group)
                torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                created = mgr.workspace is not None and id(mgr.workspace) != before
                base = {"variant": case, "rank": r, "step": i, "tokens": tokens}
                rows += [{**base, "metric": "initialize_ms", "value": round(ms, 3), "unit": "ms"},
                         {**base, "metric": "created", "value": bool(created), "unit": ""}]
            mem = process_gpu_memory([os.getpid()])
            rows.append({"variant": case, "rank": r, "metric": "gpu_memory_own_gpu",
                         "value": float(mem[mem["gpu"] == r]["used_mib"].sum()), "unit": "MiB"})
            mgr.cleanup()
    finally:
        dist.destroy_process_group()
    return rows


def _ranks(prepared, world: int, timeout: float) -> list[dict]:
    from sglab.sglang.runner import run_probe
    from sglab.sglang.gpu.record import records

    with tempfile.TemporaryDirectory(prefix="sglab-wsfloor-") as tmp:
        store = os.path.join(tmp, "store")
        with ThreadPoolExecutor(max_workers=world) as pool:
            futures = [pool.submit(run_probe, prepared.release,
                                   "sglab.sglang.gpu.workspace_floor:rank",
                                   {"rank": r, "world_size": world, "store": store},
                                   timeout=timeout) for r in range(world)]
            results = [f.result() for f in futures]
    rows = []
    for r, res in enumerate(results):
        if not res.ok:
            rows.append({"variant": "rank", "rank": r, "metric": "status", "value": res.reason,
                         "unit": ""})
            continue
        rows += records(res.rows, drop=("release", "probe"))
    return rows


def run(prepared, params: dict) -> list[dict]:
    """Not-run rows without FlashInfer; otherwise the two ranks' rows."""
    import torch

    from sglab.sglang.gpu import graphs

    if importlib.util.find_spec("flashinfer") is None:
        return [{"variant": case, "metric": "status", "value": "not run: flashinfer not installed",
                 "unit": ""} for case in traces()]
    graphs.require_cuda(prepared)
    world = int(params.get("world_size", 2))
    if torch.cuda.device_count() < world:
        return [{"variant": case, "metric": "status", "unit": "",
                 "value": f"not run: needs {world} GPUs, have {torch.cuda.device_count()}"}
                for case in traces()]
    return graphs.device_rows() + _ranks(prepared, world, float(params.get("rank_timeout", 480.0)))
