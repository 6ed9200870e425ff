"""The GPU run: the trace replay with real workspaces on every rank, the creation-cost sweep, the leak check.

Each rank (``dist.launch``, one GPU each) goes through named phases:

1. :func:`_setup` - CUDA up, one warm-up creation (the driver's one-time peer-access / IPC set-up is reported
   on its own), then the memory baseline every leak check compares against;
2. :func:`_replay_policies` - each stored trace through each policy's call site, ``IpcWorkspaceCreator``
   creating for real: re-creations, ms per creation and in total, peak workspace (computed and measured with
   ``cudaMemGetInfo``), refused calls, memory after the final destroy;
3. :func:`_cost_sweep` - creation and destruction ms against the workspace size T, per creation phase, timed
   with :func:`sglab.core.timing.interleaved` (the sizes alternate in rounds);
4. :func:`_leak_rows` - every rank's memory back to its baseline (cudaMemGetInfo and NVML, own GPU and others);
5. the traced pass (:mod:`.profile`), after every timed pass so that profiling changes no reported time, with a
   leak check of its own against a baseline taken once the profiler is running (the profiler holds device
   memory of its own, reported as ``profiler_device_mib``).

The parent simulates the same traces on the CPU first (rows ``source=simulated``), and after the ranks have
returned checks that no rank process and none of their GPU memory is left.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from sglab.fixes import workspace_floor as wf
from sglab.core import timing as phases

from sglab.experiments.workspace_floor.simulation import MiB, simulate_rows
from sglab.experiments.workspace_floor.traces import TRACES, trace_tokens

CREATORS = ("ipc", "flashinfer")


def make_creator(kind: str, ops, mark=None):
    """``ipc``: the rebuild of FlashInfer's creation; ``flashinfer``: FlashInfer's own (where installed)."""
    if kind == "flashinfer":
        return wf.FlashInferCreator(mark=mark)
    return wf.IpcWorkspaceCreator(ops, mark=mark)


class _MeasuredCreator:
    """Wraps a creator; after each creation records how much device memory this rank holds above baseline."""

    def __init__(self, inner, ops, base_free):
        self.inner, self.ops, self.base_free = inner, ops, base_free
        self.mark = getattr(inner, "mark", None)
        self.peak_measured = 0

    def create(self, **kw):
        ws = self.inner.create(**kw)
        self.peak_measured = max(self.peak_measured, self.base_free - self.ops.free_bytes())
        return ws


@dataclass
class RankState:
    """What the phases of one rank share."""

    ctx: object
    cfg: dict
    ops: object
    barrier: Callable[[], None]
    base_free: int = 0
    base_nvml: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)

    @property
    def base(self) -> dict:
        return {"rank": self.ctx.rank, "world_size": self.ctx.world_size, "source": "gpu"}

    def log(self, msg: str) -> None:
        if self.ctx.rank == 0 and self.cfg.get("progress", True):
            print(f"[workspace_floor W={self.ctx.world_size}] {msg}", flush=True)

    def empty_cache(self) -> None:
        import torch

        if not torch.cuda.is_available():  # the CPU self-tests run the same phases over gloo
            return
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _nvml_rank_mib(pid: int) -> dict:
    from sglab.core import memory

    df = memory.process_gpu_memory([pid])
    return {int(g): float(v) for g, v in zip(df["gpu"], df["used_mib"])}


def _rank_main(ctx, cfg):
    """One rank: the phases of the module docstring, in order; returns rows, phase times, events."""
    from sglab.experiments.workspace_floor import profile

    t_enter = time.time()
    st = _setup(ctx, cfg)
    with phases.phase("trace replay"):
        _replay_policies(st)
    with phases.phase("cost sweep"):
        _cost_sweep(st)
    with phases.phase("leak check"):
        _leak_rows(st)  # before the traced pass: the profiler keeps device memory of its own (CUPTI buffers)
    events = None
    if cfg["profile"]:
        with phases.phase("profile"):
            events = profile.traced_pass(st)
    st.barrier()
    return {"rank": ctx.rank, "pid": os.getpid(), "rows": st.rows, "phases": phases.take(), "t_enter": t_enter,
            "events": events}


def _setup(ctx, cfg) -> RankState:
    import torch
    import torch.distributed as tdist

    with phases.phase("cuda init"):
        torch.cuda.init()
        torch.zeros(1, device=ctx.device)  # context + allocator up before the baseline
        ops = wf.CudartOps(ctx.device.index)
        torch.cuda.synchronize()
        ops.synchronize()
    st = RankState(ctx, cfg, ops, lambda: tdist.barrier(group=ctx.cpu_group))
    with phases.phase("warm-up creation"):
        st.barrier()
        first_free = ops.free_bytes()
        # One creation + destroy before any baseline: the driver sets up peer access and IPC bookkeeping once per
        # process; that one-time cost is reported on its own, and the leak checks compare against the state after.
        make_creator(cfg["creator"], ops).create(world_size=ctx.world_size, rank=ctx.rank, max_token_num=64,
                                                 hidden_dim=cfg["hidden_dim"], group=ctx.cpu_group).destroy()
        st.empty_cache()
        st.barrier()
        st.base_free = ops.free_bytes()
        st.base_nvml = _nvml_rank_mib(os.getpid())
    st.rows.append({"variant": "leak_check", **st.base, "metric": "one_time_driver_setup",
                    "value": (first_free - st.base_free) / MiB, "unit": "MiB"})
    return st


def _replay_policies(st: RankState) -> None:
    for tname, trace in st.cfg["traces"].items():
        for name in st.cfg["policies"]:
            _replay_one(st, tname, trace, name)


def _replay_one(st: RankState, tname: str, trace: list, name: str) -> None:
    """One trace through one policy with real creations; the rows of that (trace, policy) cell on this rank."""
    cfg, ctx, pol = st.cfg, st.ctx, wf.POLICIES[name]
    creator = _MeasuredCreator(make_creator(cfg["creator"], st.ops), st.ops, st.base_free)
    mgr = wf.WorkspaceManager(creator, high_water=pol.high_water)
    t0 = time.perf_counter()
    refused = wf.replay(mgr, pol, trace, world_size=ctx.world_size, rank=ctx.rank, hidden_dim=cfg["hidden_dim"],
                        group=ctx.cpu_group, pre_initialize=cfg["pre_initialize"] or None, before_create=st.barrier)
    wall = (time.perf_counter() - t0) * 1e3
    mgr.cleanup()
    st.empty_cache()
    leak = st.base_free - st.ops.free_bytes()
    ev = [e for e in mgr.events if e.step >= 0]
    base = {"variant": name, "trace": tname, **st.base,
            "scenario": "cold" if not cfg["pre_initialize"] else f"preinit_{cfg['pre_initialize']}"}
    create = [e.create_ms for e in ev]
    recreate = [e.create_ms + e.destroy_ms for e in ev]
    st.rows += [
        {**base, "metric": "recreations", "value": len(ev), "unit": "count"},
        {**base, "metric": "create_time_total", "value": sum(create), "unit": "ms"},
        {**base, "metric": "recreate_time_total", "value": sum(recreate), "unit": "ms"},
        {**base, "metric": "replay_wall", "value": wall, "unit": "ms"},
        {**base, "metric": "peak_workspace", "value": mgr.peak_bytes_per_rank / MiB, "unit": "MiB"},
        {**base, "metric": "peak_workspace_measured", "value": creator.peak_measured / MiB, "unit": "MiB"},
        {**base, "metric": "refused_calls", "value": refused, "unit": "count"},
        {**base, "metric": "mem_after_cleanup", "value": leak / MiB, "unit": "MiB"},
    ]
    if create:
        st.rows.append({**base, "metric": "create_time_median", "value": statistics.median(create), "unit": "ms"})
    for e in mgr.events:
        ebase = {**base, "step": e.step, "tokens": e.max_token_num}
        st.rows.append({**ebase, "metric": "event_create", "value": e.create_ms, "unit": "ms"})
        st.rows.append({**ebase, "metric": "event_destroy", "value": e.destroy_ms, "unit": "ms"})
    st.log(f"{tname:>10} {name:>13}: {len(ev):4d} re-creations, {sum(recreate):9.1f} ms on rank 0, "
           f"peak {mgr.peak_bytes_per_rank / MiB:7.0f} MiB/rank")


def _cost_sweep(st: RankState) -> None:
    """Creation and destruction ms per workspace size T, and per creation phase; the sizes alternate in rounds
    (:func:`sglab.core.timing.interleaved`) so that drift lands on all of them alike. Every sample starts
    after a barrier, on every rank at once."""
    from sglab.core.timing import Timing, interleaved

    cfg, ctx, H = st.cfg, st.ctx, st.cfg["hidden_dim"]
    creator = make_creator(cfg["creator"], st.ops)
    kept: dict[int, dict] = {T: {"destroy": [], "phases": {}} for T in cfg["cost_tokens"]}

    def cycle(T):
        st.barrier()
        t0 = time.perf_counter()
        ws = creator.create(world_size=ctx.world_size, rank=ctx.rank, max_token_num=T, hidden_dim=H,
                            group=ctx.cpu_group)
        t1 = time.perf_counter()
        st.barrier()
        t2 = time.perf_counter()
        ws.destroy()
        return T, (t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3, dict(getattr(ws, "phases_ms", {}) or {})

    def timer(fn, *, warmup, repeat):
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeat):
            T, c_ms, d_ms, ph = fn()
            samples.append(c_ms)
            kept[T]["destroy"].append(d_ms)
            for k, v in ph.items():
                kept[T]["phases"].setdefault(k, []).append(v)
        return Timing(samples, clock="host-perf-counter")

    fns = {T: (lambda T=T: cycle(T)) for T in cfg["cost_tokens"]}
    timings = interleaved(fns, rounds=cfg["cost_rounds"], warmup=cfg["cost_warmup"], repeat=cfg["cost_repeats"],
                          timer=timer)
    for T, t in timings.items():
        base = {"variant": "cost_sweep", **st.base, "tokens": T}
        st.rows += t.rows(**base, phase="create")
        st.rows += Timing(kept[T]["destroy"]).rows(**base, phase="destroy")
        for k, v in kept[T]["phases"].items():
            st.rows += Timing(v).rows(**base, phase=k)
        st.rows.append({**base, "phase": "create", "metric": "workspace", "unit": "MiB",
                        "value": wf.workspace_bytes_per_rank(ctx.world_size, T, H) / MiB})
        st.log(f"cost T={T:6d}: create {t.median_ms:8.2f} ms, destroy {Timing(kept[T]['destroy']).median_ms:7.2f} ms")


def _leak_rows(st: RankState) -> None:
    st.empty_cache()
    st.barrier()
    end_free = st.ops.free_bytes()
    end_nvml = _nvml_rank_mib(os.getpid())
    own = st.ctx.device.index
    base = {"variant": "leak_check", **st.base}
    st.rows += [
        {**base, "metric": "rank_mem_delta_cudart", "value": (st.base_free - end_free) / MiB, "unit": "MiB"},
        {**base, "metric": "rank_mem_delta_nvml", "unit": "MiB",
         "value": end_nvml.get(own, 0.0) - st.base_nvml.get(own, 0.0)},
        {**base, "metric": "rank_nvml_other_gpus_end", "unit": "MiB",
         "value": sum(v for g, v in end_nvml.items() if g != own)},
    ]


def _parent_leak_rows(pids: list[int], world_size: int) -> list[dict]:
    import psutil

    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    try:
        from sglab.core import memory

        left_mib = float(memory.process_gpu_memory(pids)["used_mib"].sum())
    except Exception:  # no NVML: cannot say
        left_mib = float("nan")
    base = {"variant": "leak_check", "world_size": world_size, "source": "gpu"}
    return [{**base, "metric": "rank_processes_left", "value": len(alive), "unit": "count"},
            {**base, "metric": "gpu_mem_of_rank_pids_after", "value": left_mib, "unit": "MiB"}]


# --------------------------------------------------------------------------------------------------------------
# the parent
# --------------------------------------------------------------------------------------------------------------
def check_params(p: dict) -> None:
    """Bad parameters fail here, in one line, before any process starts."""
    bad = [n for n in p["policies"] if n not in wf.POLICIES]
    if bad:
        raise ValueError(f"unknown policies {bad}; known: {list(wf.POLICIES)}")
    bad = [t for t in p["traces"] if t not in TRACES]
    if bad:
        raise ValueError(f"unknown traces {bad}; known: {list(TRACES)}")
    if p["creator"] not in CREATORS:
        raise ValueError(f"creator must be one of {CREATORS}, got {p['creator']!r}")
    if int(p["world_size"]) < 2:
        raise ValueError(f"world_size must be >= 2 (the fused allreduce needs peers), got {p['world_size']}")
    if p.get("profile") and p["profile_trace"] not in TRACES:
        raise ValueError(f"profile_trace must be one of {list(TRACES)}, got {p['profile_trace']!r}")


def rank_config(p: dict, *, progress: bool, trace_dir: str) -> dict:
    """What every rank gets: the traces' token lists (cut to ``gpu_trace_steps`` when set) and the settings."""
    steps = int(p["gpu_trace_steps"])
    traces = {t: (trace_tokens(t)[:steps] if steps else trace_tokens(t)) for t in p["traces"]}
    return {"hidden_dim": p["hidden_dim"], "policies": p["policies"], "pre_initialize": p["pre_initialize"],
            "cost_tokens": p["cost_tokens"], "cost_warmup": p["cost_warmup"], "cost_repeats": p["cost_repeats"],
            "cost_rounds": p["cost_rounds"], "creator": p["creator"], "traces": traces, "progress": progress,
            "profile": bool(p["profile"]), "profile_trace": trace_tokens(p["profile_trace"]),
            "profile_trace_name": p["profile_trace"], "profile_policies": p["profile_policies"],
            "trace_dir": trace_dir}


def run(params: Optional[dict] = None, *, progress: bool = True):
    """Simulation on the full traces plus the live replay on ``world_size`` GPUs: a :class:`sglab.core.runs.Measured`
    with the tidy rows, the profiler's event table (sidecar ``events``) and one Perfetto file per rank."""
    import pandas as pd

    from sglab.core import dist, runs

    from sglab.experiments.workspace_floor import DEFAULT_PARAMS, EXPERIMENT

    p = {**DEFAULT_PARAMS, **(params or {})}
    check_params(p)
    W = int(p["world_size"])
    with phases.phase("simulation"):
        rows = simulate_rows(p, world_sizes=[W])
    cfg = rank_config(p, progress=progress, trace_dir=tempfile.mkdtemp(prefix="sglab-workspace-floor-"))
    if progress:
        print(f"[workspace_floor] {W} ranks, traces {[(k, len(v)) for k, v in cfg['traces'].items()]}, "
              f"{len(p['policies'])} policies, cost sweep T={p['cost_tokens']}", flush=True)
    t0, t_launch = time.perf_counter(), time.time()
    with phases.phase("ranks (spawn to return)"):
        out = dist.launch(_rank_main, W, args=(cfg,), backend="nccl", timeout_s=300, collective_timeout_s=120)
    phases.add("spawn + nccl init", max(0.0, min(o["t_enter"] for o in out) - t_launch))
    for o in out:
        rows += o["rows"]
        phases.merge(o["phases"], prefix=f"rank{o['rank']}/")
    with phases.phase("parent leak check"):
        rows += _parent_leak_rows([o["pid"] for o in out], W)
    if progress:
        print(f"[workspace_floor] done in {time.perf_counter() - t0:.1f} s", flush=True)
    sidecars = {}
    if p["profile"]:
        sidecars["events"] = pd.concat([o["events"]["table"] for o in out], ignore_index=True)
        sidecars.update({f"trace_rank{o['rank']}": o["events"]["perfetto"] for o in out})
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=sidecars)


# --------------------------------------------------------------------------------------------------------------
# CPU self-test of the rank logic
# --------------------------------------------------------------------------------------------------------------
def gloo_rank_selftest(ctx, policy_name: str, trace: list[int], hidden_dim: int = 7168):
    """The IPC creator's rank logic (handle all-gather, opens, barriers, destroy order) with host stand-ins.

    Run with ``dist.launch(..., backend="gloo")``; returns this rank's counts and what is left allocated.
    """
    import torch.distributed as tdist

    ops = wf.HostOps()
    pol = wf.POLICIES[policy_name]
    mgr = wf.WorkspaceManager(wf.IpcWorkspaceCreator(ops), high_water=pol.high_water)
    wf.replay(mgr, pol, trace, world_size=ctx.world_size, rank=ctx.rank, hidden_dim=hidden_dim,
              group=ctx.cpu_group, before_create=lambda: tdist.barrier(group=ctx.cpu_group))
    sizes = [e.max_token_num for e in mgr.events]
    live_before = len(ops.live)
    opened_before = len(ops.opened)
    mgr.cleanup()
    return {"rank": ctx.rank, "sizes": sizes, "live_before_cleanup": live_before,
            "opened_before_cleanup": opened_before, "live_after": len(ops.live), "opened_after": len(ops.opened),
            "fills": len(ops.filled)}
