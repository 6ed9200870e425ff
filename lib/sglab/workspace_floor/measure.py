"""Workspace re-creations along a serving trace per ``max_token_num`` policy: simulated (exact) and
on 2 or 4 GPUs (a cost sweep, the leak check, a traced pass); times are host ms per rank."""

from __future__ import annotations

import itertools
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import numpy as np
import pandas as pd
import torch
import torch.distributed as tdist

from sglab.core import dist, memory, runs, timing as phases, trace as prof
from sglab.core.kernels import _warm_profiler
from sglab.workspace_floor import rebuild
from sglab.workspace_floor.rebuild import MiB
from sglab.workspace_floor.traces import TRACES, in_trace, simulated, trace_tokens


EXPERIMENT = "workspace_floor"
METHOD_VERSION = 2
GPUS = 2

# cost_tokens: both sides of the creation cost's step (Lamport 336 -> 672 MiB); pre_initialize 0:
# a cold start (2048: SGLang's pre-initialisation)
DEFAULT_PARAMS = {
    "world_size": 2, "hidden_dim": 7168, "policies": list(rebuild.POLICIES), "pre_initialize": 0,
    "gpu_trace_steps": 0, "cost_tokens": [64, 1024, 2048, 4096, 8192, 16384], "cost_warmup": 1,
    "cost_repeats": 6, "cost_rounds": 3, "traces": list(TRACES), "profile": True,
    "profile_trace": "short_ramp", "profile_policies": ["floor_0", "floor_2048"]
}


def gpus(params: dict) -> int:
    return int(params.get("world_size", GPUS))


def run_hidden(run) -> int:
    """A run's model hidden size (7168, DeepSeek-V3's, where the run does not say)."""
    return int(run.manifest.params.get("hidden_dim", 7168))


def metric_rows(base: dict, **metrics) -> list[dict]:
    """One tidy row per ``metric=(value, unit)``."""
    return [{**base, "metric": k, "value": v, "unit": u} for k, (v, u) in metrics.items()]


def _scenario(pre: int) -> str:
    return f"preinit_{pre}" if pre else "cold"


def simulate_rows(params: Optional[dict] = None, *, world_sizes=None,
                  scenarios=(0, 2048)) -> list[dict]:
    """Simulated rows per trace, world size, scenario and policy; an ``event_workspace`` each."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    rows = []
    for tname, W, pre, name in itertools.product(p["traces"], world_sizes or [p["world_size"]],
                                                 scenarios, p["policies"]):
        mgr, refused = simulated(tname, name, W, p["hidden_dim"], pre)
        base = dict(variant=name, trace=tname, world_size=W, scenario=_scenario(pre),
                    source="simulated")
        rows += metric_rows(base, recreations=(in_trace(mgr),
                                               "count"), creations_total=(mgr.recreations, "count"),
                            peak_workspace=(mgr.peak_bytes_per_rank / MiB, "MiB"),
                            final_max_token_num=(mgr.max_token_num
                                                 or 0, "tokens"), refused_calls=(refused, "count"))
        for e in mgr.events:
            rows += metric_rows({**base, "step": e.step, "tokens": e.max_token_num},
                                event_workspace=(e.bytes_per_rank / MiB, "MiB"))
    return rows


# -- one rank on the GPUs --------------------------------------------------------------------------
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
        if torch.cuda.is_available():  # the CPU tests run the same phases over gloo
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def create(self, creator, T: int):
        return creator.create(world_size=self.ctx.world_size, rank=self.ctx.rank, max_token_num=T,
                              hidden_dim=self.cfg["hidden_dim"], group=self.ctx.cpu_group)


def _nvml_rank_mib(pid: int) -> dict:
    df = memory.process_gpu_memory([pid])
    return {int(g): float(v) for g, v in zip(df["gpu"], df["used_mib"])}


def _rank_main(ctx, cfg):
    """One rank: set-up, trace replay, cost sweep, leak check, traced pass."""
    t_enter = time.time()
    with phases.phase("cuda init"):
        torch.cuda.init()
        torch.zeros(1, device=ctx.device)  # context + allocator up before the baseline
        ops = rebuild.CudartOps(ctx.device.index)
        torch.cuda.synchronize()
        ops.synchronize()
    st = RankState(ctx, cfg, ops, lambda: tdist.barrier(group=ctx.cpu_group))
    with phases.phase("warm-up creation"):
        st.barrier()
        first_free = ops.free_bytes()
        # the driver sets up peer access and IPC bookkeeping once per process: reported on its
        # own, and the leak checks compare against the state after it
        st.create(rebuild.IpcWorkspaceCreator(ops), 64).destroy()
        st.empty_cache()
        st.barrier()
        st.base_free, st.base_nvml = ops.free_bytes(), _nvml_rank_mib(os.getpid())
    st.rows += metric_rows({"variant": "leak_check", **st.base},
                           one_time_driver_setup=((first_free - st.base_free) / MiB, "MiB"))
    with phases.phase("trace replay"):
        for tname, trace in cfg["traces"].items():
            for name in cfg["policies"]:
                _replay_one(st, tname, trace, name)
    with phases.phase("cost sweep"):
        _cost_sweep(st)
    with phases.phase("leak check"):  # before the traced pass: the profiler keeps device memory
        _leak_rows(st)
    events = None
    if cfg["profile"]:
        with phases.phase("profile"):
            events = traced_pass(st)
    st.barrier()
    return dict(rank=ctx.rank, pid=os.getpid(), rows=st.rows, phases=phases.take(), t_enter=t_enter,
                events=events)


def _replay_one(st: RankState, tname: str, trace: list, name: str) -> None:
    """One trace through one policy with real creations: that cell's rows on this rank."""
    cfg, ctx, pol = st.cfg, st.ctx, rebuild.POLICIES[name]
    peak_measured = 0  # the device memory this rank holds above its baseline after a creation

    def measured_create(**kw):
        nonlocal peak_measured
        ws = rebuild.IpcWorkspaceCreator(st.ops).create(**kw)
        peak_measured = max(peak_measured, st.base_free - st.ops.free_bytes())
        return ws

    mgr = rebuild.WorkspaceManager(SimpleNamespace(create=measured_create),
                                   high_water=pol.high_water, before_create=st.barrier)
    t0 = time.perf_counter()
    refused = rebuild.replay(mgr, pol, trace, world_size=ctx.world_size, rank=ctx.rank,
                             hidden_dim=cfg["hidden_dim"], group=ctx.cpu_group,
                             pre_initialize=cfg["pre_initialize"] or None)
    wall = (time.perf_counter() - t0) * 1e3
    mgr.cleanup()
    st.empty_cache()
    ev = [e for e in mgr.events if e.step >= 0]
    base = dict(variant=name, trace=tname, **st.base, scenario=_scenario(cfg["pre_initialize"]))
    create, recreate = [e.create_ms for e in ev], [e.create_ms + e.destroy_ms for e in ev]
    st.rows += metric_rows(base, recreations=(len(ev), "count"), create_time_total=(sum(create),
                                                                                    "ms"),
                           recreate_time_total=(sum(recreate), "ms"), replay_wall=(wall, "ms"),
                           peak_workspace=(mgr.peak_bytes_per_rank / MiB, "MiB"),
                           peak_workspace_measured=(peak_measured / MiB,
                                                    "MiB"), refused_calls=(refused, "count"),
                           mem_after_cleanup=((st.base_free - st.ops.free_bytes()) / MiB, "MiB"))
    if create:
        st.rows += metric_rows(base, create_time_median=(statistics.median(create), "ms"))
    for e in mgr.events:
        st.rows += metric_rows({**base, "step": e.step, "tokens": e.max_token_num},
                               event_create=(e.create_ms, "ms"), event_destroy=(e.destroy_ms, "ms"))
    st.log(f"{tname:>10} {name:>13}: {len(ev):4d} re-creations, {sum(recreate):9.1f} ms on rank "
           f"0, peak {mgr.peak_bytes_per_rank / MiB:7.0f} MiB/rank")


def _cost_sweep(st: RankState) -> None:
    """Creation and destruction ms per workspace size T and phase, sizes alternating in rounds."""
    cfg = st.cfg
    creator = rebuild.IpcWorkspaceCreator(st.ops)
    samples: dict[int, dict] = {T: {} for T in cfg["cost_tokens"]}
    for r in range(cfg["cost_rounds"]):
        for T in cfg["cost_tokens"]:
            warmup = cfg["cost_warmup"] if r == 0 else 0
            for i in range(warmup + max(1, cfg["cost_repeats"] // cfg["cost_rounds"])):
                st.barrier()
                t0 = time.perf_counter()
                ws = st.create(creator, T)
                t1 = time.perf_counter()
                st.barrier()
                t2 = time.perf_counter()
                ws.destroy()
                t3 = time.perf_counter()
                got = {"create": (t1 - t0) * 1e3, "destroy": (t3 - t2) * 1e3, **ws.phases_ms}
                for k, v in got.items() if i >= warmup else ():
                    samples[T].setdefault(k, []).append(v)
    for T, by_phase in samples.items():
        base = {"variant": "cost_sweep", **st.base, "tokens": T}
        for k, v in by_phase.items():
            st.rows += phases.Timing(v).rows(**base, phase=k)
        st.rows += metric_rows({**base, "phase": "create"}, workspace=(
            rebuild.workspace_bytes_per_rank(st.ctx.world_size, T, cfg["hidden_dim"]) / MiB, "MiB"))
        st.log(f"cost T={T:6d}: create {statistics.median(by_phase['create']):8.2f} ms, destroy "
               f"{statistics.median(by_phase['destroy']):7.2f} ms")


def _leak_rows(st: RankState) -> None:
    st.empty_cache()
    st.barrier()
    end_free, end_nvml, own = st.ops.free_bytes(), _nvml_rank_mib(os.getpid()), st.ctx.device.index
    others = sum(v for g, v in end_nvml.items() if g != own)
    st.rows += metric_rows({"variant": "leak_check", **st.base},
                           rank_mem_delta_cudart=((st.base_free - end_free) / MiB, "MiB"),
                           rank_mem_delta_nvml=(end_nvml.get(own, 0.0) - st.base_nvml.get(own, 0.0),
                                                "MiB"), rank_nvml_other_gpus_end=(others, "MiB"))


# -- the traced pass: the profiled trace under torch.profiler, per rank ----------------------------
COST_RANGE = "create workspace"  # one per size of the traced cost sweep
VARIANT_PREFIX = "variant "  # outer range per variant: "variant floor_0", "variant cost_sweep"
COST_VARIANT = "cost_sweep"
EXTRA_COLUMNS = ["variant", "rank", "creation", "step", "tokens"]
# host queries torch makes around every op: sub-microsecond, numerous, no part of the mechanism
TRIVIAL_CALLS = (r"^(cudaGetDevice|cudaGetLastError|cudaPeekAtLastError|cudaStreamIsCapturing|"
                 r"cudaGetDeviceCount|cuCtxGetCurrent|cudaDeviceGetAttribute)(_v\d+)?$")


def traced_pass(st) -> dict:
    """Each profiled policy's replay, then a ``create workspace`` range per cost size, traced."""
    cfg, ctx = st.cfg, st.ctx
    path = Path(cfg["trace_dir"]) / f"rank{ctx.rank}.trace.json.gz"
    schedule: dict[str, list[tuple[int, int]]] = {}
    if torch.cuda.is_available():
        with phases.phase("profile: profiler start-up"):
            _warm_profiler()
    with phases.phase("profile: session + export"):
        with prof.Recorder(perfetto=path) as rec:
            st.empty_cache()
            st.barrier()
            base = st.ops.free_bytes()
            for name in cfg["profile_policies"]:
                with prof.phase(VARIANT_PREFIX + name):
                    pol = rebuild.POLICIES[name]
                    creator = rebuild.IpcWorkspaceCreator(st.ops, mark=prof.phase)
                    mgr = rebuild.WorkspaceManager(creator, high_water=pol.high_water,
                                                   mark=prof.phase, before_create=st.barrier)
                    rebuild.replay(mgr, pol, cfg["profile_trace"], world_size=ctx.world_size,
                                   rank=ctx.rank, hidden_dim=cfg["hidden_dim"], group=ctx.cpu_group)
                    mgr.cleanup()
                    schedule[name] = [(e.step, e.max_token_num) for e in mgr.events]
            with prof.phase(VARIANT_PREFIX + COST_VARIANT):
                creator = rebuild.IpcWorkspaceCreator(st.ops, mark=prof.phase)
                for T in cfg["cost_tokens"]:
                    st.barrier()
                    with prof.phase(COST_RANGE):
                        ws = st.create(creator, T)
                    st.barrier()
                    ws.destroy()
                schedule[COST_VARIANT] = [(-1, T) for T in cfg["cost_tokens"]]
            st.empty_cache()
            left = base - st.ops.free_bytes()
    st.empty_cache()
    st.rows += metric_rows({"variant": "traced_pass", **st.base},
                           mem_after_cleanup=(left / MiB, "MiB"),
                           profiler_device_mib=((st.base_free - st.ops.free_bytes()) / MiB, "MiB"))
    with phases.phase("profile: reduce"):
        table = reduce_events(rec.events, schedule, rank=ctx.rank)
    return {"table": table, "perfetto": str(path)}


def _host_ranges(events, names):
    r = events[(events.category == "range") & ~events.lane.str.startswith(("stream", "device"))]
    r = r.assign(bare=r.name.str.replace(prof.PHASE_PREFIX, "", regex=False))
    return r[r.bare.isin(names)].sort_values("start_us", kind="stable")


def reduce_events(events, schedule: dict, *, rank: int):
    """The events inside creation ranges, labelled with variant, rank, creation, step and tokens."""
    variants = _host_ranges(events, [VARIANT_PREFIX + v for v in schedule])
    creations = _host_ranges(events, [rebuild.RECREATE_RANGE, COST_RANGE])
    if creations.empty:
        return pd.DataFrame(columns=prof.COLUMNS + EXTRA_COLUMNS)
    labels, seen = [], {}
    for c in creations.itertuples():
        inside = variants[(variants.start_us <= c.start_us)
                          & (c.start_us <= variants.start_us + variants.dur_us)]
        variant = inside.bare.iloc[-1][len(VARIANT_PREFIX):] if len(inside) else ""
        k = seen[variant] = seen.get(variant, -1) + 1
        sched = schedule.get(variant, [])
        labels.append((variant, k, *(sched[k] if k < len(sched) else (-1, -1))))
    starts = creations.start_us.to_numpy()
    ends = starts + creations.dur_us.to_numpy()
    t = events.start_us.to_numpy()
    idx = np.searchsorted(starts, t, side="right") - 1
    keep = (idx >= 0) & (t <= ends[np.clip(idx, 0, None)])
    keep &= ~(events.category.eq("range")
              & events.lane.str.startswith(("stream", "device"))).to_numpy()
    keep &= ~events.name.str.match(TRIVIAL_CALLS).to_numpy()
    out = events[keep].copy()
    lab = [labels[i] for i in idx[keep]]
    for j, col in enumerate(("variant", "creation", "step", "tokens")):
        out[col] = [x[j] for x in lab]
    out["rank"] = rank
    return out[prof.COLUMNS + EXTRA_COLUMNS].reset_index(drop=True)


# -- the parent ------------------------------------------------------------------------------------
def check_params(p: dict) -> None:
    """Bad parameters fail here, in one line, before any process starts."""
    for key, known in (("policies", rebuild.POLICIES), ("traces", TRACES)):
        if bad := [n for n in p[key] if n not in known]:
            raise ValueError(f"unknown {key} {bad}; known: {list(known)}")
    if int(p["world_size"]) < 2:
        raise ValueError("world_size must be >= 2 (the fused allreduce needs peers), got "
                         f"{p['world_size']}")
    if p.get("profile") and p["profile_trace"] not in TRACES:
        raise ValueError(f"profile_trace must be one of {list(TRACES)}, got {p['profile_trace']!r}")


def rank_config(p: dict, *, progress: bool, trace_dir: str) -> dict:
    """What every rank gets: the settings and the traces (cut to ``gpu_trace_steps`` when set)."""
    steps = int(p["gpu_trace_steps"]) or None
    keys = ("hidden_dim", "policies", "pre_initialize", "cost_tokens", "cost_warmup",
            "cost_repeats", "cost_rounds", "profile_policies")
    cfg = {k: p[k] for k in keys}
    cfg.update(progress=progress, profile=bool(p["profile"]), trace_dir=trace_dir,
               profile_trace=trace_tokens(p["profile_trace"]))
    cfg["traces"] = {t: trace_tokens(t)[:steps] for t in p["traces"]}
    return cfg


def _parent_leak_rows(pids: list[int], world_size: int) -> list[dict]:
    import psutil  # the parent leak check: only on the GPU path

    time.sleep(0.5)
    zombie = psutil.STATUS_ZOMBIE
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != zombie]
    try:
        left_mib = float(memory.process_gpu_memory(pids)["used_mib"].sum())
    except Exception:  # no NVML: cannot say
        left_mib = float("nan")
    return metric_rows({"variant": "leak_check", "world_size": world_size, "source": "gpu"},
                       rank_processes_left=(len(alive), "count"),
                       gpu_mem_of_rank_pids_after=(left_mib, "MiB"))


def run(params: Optional[dict] = None, *, progress: bool = True) -> runs.Measured:
    """The simulation on the full traces, then the live replay on ``world_size`` GPUs."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    check_params(p)
    W = int(p["world_size"])
    with phases.phase("simulation"):
        rows = simulate_rows(p, world_sizes=[W])
    cfg = rank_config(p, progress=progress,
                      trace_dir=tempfile.mkdtemp(prefix="sglab-workspace-floor-"))
    if progress:
        print(
            f"[workspace_floor] {W} ranks, traces "
            f"{[(k, len(v)) for k, v in cfg['traces'].items()]}, {len(p['policies'])} policies, "
            f"cost sweep T={p['cost_tokens']}", flush=True)
    t0, t_launch = time.perf_counter(), time.time()
    with phases.phase("ranks (spawn to return)"):
        out = dist.launch(_rank_main, W, args=(cfg,), backend="nccl", timeout_s=300,
                          collective_timeout_s=120)
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
