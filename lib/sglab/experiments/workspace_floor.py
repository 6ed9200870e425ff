"""Allreduce-fusion workspace re-creations along a serving trace, per ``max_token_num`` policy (PR #26382 B).

Three parts:

1. :func:`generate_trace` - a seeded token-count trace: the ``x.shape[0]`` that
   ``_forward_with_allreduce_fusion`` sees per forward step of a small serving simulation (Poisson arrivals
   with bursts, chunked prefill, extend batches padded to piecewise-CUDA-graph buckets up to 4096, decode
   batches). Stored in ``data/traces/`` with its parameters; :func:`load_trace` regenerates and compares.
2. :func:`simulate_rows` - the PR-era manager on a fake creator over the *full* trace, for each policy, cold
   start and with SGLang's pre-initialisation at 2048: exact re-creation counts and workspace bytes (CPU).
3. :func:`run` - the same replay on 2 or 4 GPUs with real creations (CUDA IPC, gloo exchange, Lamport fill,
   barriers): time per creation and in total per rank, peak workspace memory per rank, a creation-cost sweep
   over T, and a leak check (per-rank memory back to its baseline after the last destroy; no rank process
   and no GPU memory of theirs left once the run returns).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Optional

from sglab import runs as _runs
from sglab.fixes import workspace_floor as wf

EXPERIMENT = "workspace_floor"
METHOD_VERSION = 1
GPUS = 2

TRACE_PARAMS = {
    "seed": 0,
    "steps": 3000,  # forward steps recorded (idle steps are not calls and are skipped)
    "max_running": 256,  # max concurrent decode requests
    "chunked_prefill_size": 4096,
    "pcg_max_tokens": 4096,  # extend batches up to this many tokens are padded to a piecewise bucket
    "prompt_median": 1200,
    "prompt_sigma": 1.0,
    "prompt_max": 32768,
    "output_median": 300,
    "output_sigma": 0.8,
    "output_max": 4096,
    "base_rate": 0.15,  # mean arrivals per step outside bursts
    "burst_rate": 2.0,  # mean arrivals per step inside bursts
    "burst_every": 700,
    "burst_len": 60,
    "ramp_steps": 0,  # arrival rate grows linearly from 0 over this many simulated steps (0: no ramp)
}

# Two stored traces: a mixed serving load, and a cold server warming up on short prompts.
TRACES = {
    "mixed": {},
    "short_ramp": {"seed": 1, "prompt_median": 48, "prompt_sigma": 0.6, "output_median": 600,
                   "base_rate": 0.4, "burst_rate": 3.0, "ramp_steps": 1500},
}

DEFAULT_PARAMS = {
    "world_size": 2,
    "hidden_dim": 7168,  # Kimi-K2.5
    "policies": list(wf.POLICIES),
    "pre_initialize": 0,  # the GPU replay: 0 = cold start (the first call creates); 2048 = SGLang's pre-init
    "gpu_trace_steps": 0,  # 0 = replay the whole trace on GPU
    "cost_tokens": [64, 256, 1024, 2048, 4096, 8192, 16384],
    "cost_warmup": 2,
    "cost_repeats": 7,
    "creator": "ipc",  # "ipc" (this replica) or "flashinfer" (FlashInfer's own creation, where installed)
    "traces": list(TRACES),
}

TRACE_DIR = Path(__file__).resolve().parents[3] / "data" / "traces"
TRACE_PREFIX = "workspace_floor_"
MiB = 2**20


# --------------------------------------------------------------------------------------------- trace
def pcg_buckets(max_tokens: int = 4096) -> list[int]:
    """Piecewise-CUDA-graph token buckets, fine at small sizes and coarser up to ``max_tokens``."""
    b = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
         + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, 8193, 512)))
    return [x for x in b if x <= max_tokens]


def generate_trace(**overrides):
    """The trace as a DataFrame: ``step, kind, tokens_raw, tokens, running, waiting`` (``tokens`` = x.shape[0]).

    A step either prefills (chunks of waiting prompts up to ``chunked_prefill_size`` tokens, prefill first as in
    SGLang's default scheduler; padded up to the next piecewise bucket when <= ``pcg_max_tokens``) or decodes
    one token for every running request. Deterministic for a given parameter set.
    """
    import bisect

    import numpy as np
    import pandas as pd

    p = {**TRACE_PARAMS, **overrides}
    rng = np.random.default_rng(p["seed"])
    buckets = pcg_buckets(p["pcg_max_tokens"])
    waiting: list[list[int]] = []  # [remaining prompt tokens, output tokens]
    running: list[int] = []  # remaining output tokens
    rows = []
    t_sim = 0
    while len(rows) < p["steps"]:
        in_burst = (t_sim % p["burst_every"]) < p["burst_len"] and t_sim >= p["burst_every"] // 2
        ramp = min(1.0, (t_sim + 1) / p["ramp_steps"]) if p["ramp_steps"] else 1.0
        n_new = int(rng.poisson(ramp * (p["burst_rate"] if in_burst else p["base_rate"])))
        for _ in range(n_new):
            L = int(np.clip(round(rng.lognormal(np.log(p["prompt_median"]), p["prompt_sigma"])), 16,
                            p["prompt_max"]))
            O = int(np.clip(round(rng.lognormal(np.log(p["output_median"]), p["output_sigma"])), 1,
                            p["output_max"]))
            waiting.append([L, O])
        t_sim += 1
        if waiting and len(running) < p["max_running"]:
            budget, raw, chunked = p["chunked_prefill_size"], 0, False
            while waiting and budget > 0 and len(running) < p["max_running"]:
                req = waiting[0]
                take = min(req[0], budget)
                req[0] -= take
                budget -= take
                raw += take
                if req[0] == 0:
                    running.append(req[1])
                    waiting.pop(0)
                else:
                    chunked = True
                    break
            tokens = raw
            if raw <= p["pcg_max_tokens"]:
                tokens = buckets[bisect.bisect_left(buckets, raw)]
            kind = "chunked_prefill" if chunked else "prefill"
        elif running:
            raw = tokens = len(running)
            running = [r - 1 for r in running if r > 1]
            kind = "decode"
        else:
            continue  # idle: no forward, no call
        rows.append({"step": len(rows), "kind": kind, "tokens_raw": raw, "tokens": tokens,
                     "running": len(running), "waiting": len(waiting)})
    return pd.DataFrame(rows)


def _csv_bytes(df) -> bytes:
    return df.to_csv(index=False, lineterminator="\n").encode()


def trace_params(name: str) -> dict:
    return {**TRACE_PARAMS, **TRACES[name]}


def write_trace(name: str = "mixed", directory: Optional[Path] = None) -> Path:
    """Write ``workspace_floor_<name>.csv`` and ``.json`` (parameters, generator, sha256 of the CSV)."""
    d = Path(directory or TRACE_DIR)
    d.mkdir(parents=True, exist_ok=True)
    TRACE_NAME = TRACE_PREFIX + name
    params = trace_params(name)
    df = generate_trace(**params)
    data = _csv_bytes(df)
    (d / f"{TRACE_NAME}.csv").write_bytes(data)
    meta = {"generator": "sglab.experiments.workspace_floor.generate_trace", "params": params,
            "rows": len(df), "sha256": hashlib.sha256(data).hexdigest(),
            "columns": list(df.columns),
            "meaning": "tokens = x.shape[0] seen by _forward_with_allreduce_fusion per forward step; "
                       "tokens_raw = before piecewise-bucket padding"}
    (d / f"{TRACE_NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return d / f"{TRACE_NAME}.csv"


def load_trace(name: str = "mixed", directory: Optional[Path] = None, *, verify: bool = True):
    """The stored trace; with ``verify`` it is regenerated from its stored parameters and must match byte for byte."""
    import pandas as pd

    d = Path(directory or TRACE_DIR)
    TRACE_NAME = TRACE_PREFIX + name
    meta = json.loads((d / f"{TRACE_NAME}.json").read_text())
    data = (d / f"{TRACE_NAME}.csv").read_bytes()
    if verify:
        regen = _csv_bytes(generate_trace(**meta["params"]))
        if regen != data or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise ValueError(f"{d / TRACE_NAME}.csv does not match generate_trace({meta['params']})")
    import io

    return pd.read_csv(io.BytesIO(data)), meta


def trace_tokens(name: str) -> list[int]:
    return [int(x) for x in generate_trace(**trace_params(name))["tokens"]]


# --------------------------------------------------------------------------------------------- simulation
def simulate_rows(params: Optional[dict] = None, *, world_sizes=None, scenarios=(0, 2048)) -> list[dict]:
    """Exact counts on the fake creator over the full trace (runs anywhere)."""
    p = {**DEFAULT_PARAMS, **(params or {})}
    H = p["hidden_dim"]
    rows = []
    for tname in p["traces"]:
        rows += _simulate_one(p, tname, trace_tokens(tname), H, world_sizes, scenarios)
    return rows


def _simulate_one(p, tname, trace, H, world_sizes, scenarios):
    rows = []
    for W in (world_sizes or [p["world_size"]]):
        for pre in scenarios:
            scen = "cold" if not pre else f"preinit_{pre}"
            for name in p["policies"]:
                pol = wf.POLICIES[name]
                mgr, refused = wf.simulate(pol, trace, world_size=W, hidden_dim=H, pre_initialize=pre or None)
                runtime_events = [e for e in mgr.events if e.step >= 0]
                base = {"variant": name, "trace": tname, "world_size": W, "scenario": scen,
                        "source": "simulated"}
                rows += [
                    {**base, "metric": "recreations", "value": len(runtime_events), "unit": "count"},
                    {**base, "metric": "creations_total", "value": mgr.recreations, "unit": "count"},
                    {**base, "metric": "peak_workspace", "value": mgr.peak_bytes_per_rank / MiB, "unit": "MiB"},
                    {**base, "metric": "final_max_token_num", "value": mgr.max_token_num or 0, "unit": "tokens"},
                    {**base, "metric": "refused_calls", "value": refused, "unit": "count"},
                ]
                for e in mgr.events:
                    rows.append({**base, "step": e.step, "tokens": e.max_token_num,
                                 "metric": "event_workspace", "value": e.bytes_per_rank / MiB, "unit": "MiB"})
    return rows


# --------------------------------------------------------------------------------------------- GPU ranks
class _MeasuredCreator:
    """Wraps a creator; after each creation records how much device memory this rank holds above baseline."""

    def __init__(self, inner, ops, base_free):
        self.inner, self.ops, self.base_free = inner, ops, base_free
        self.peak_measured = 0

    def create(self, **kw):
        ws = self.inner.create(**kw)
        self.peak_measured = max(self.peak_measured, self.base_free - self.ops.free_bytes())
        return ws


def _nvml_rank_mib(pid: int) -> dict:
    from sglab.measure import memory

    df = memory.process_gpu_memory([pid])
    return {int(g): float(v) for g, v in zip(df["gpu"], df["used_mib"])}


def _rank_main(ctx, cfg):
    import torch
    import torch.distributed as tdist

    rank, W, H = ctx.rank, ctx.world_size, cfg["hidden_dim"]
    group = ctx.cpu_group
    pid = os.getpid()
    torch.cuda.init()
    torch.zeros(1, device=ctx.device)  # context + allocator up before the baseline
    ops = wf.CudartOps(ctx.device.index)
    torch.cuda.synchronize()
    ops.synchronize()

    def barrier():
        tdist.barrier(group=group)

    def log(msg):
        if rank == 0 and cfg.get("progress", True):
            print(f"[workspace_floor W={W}] {msg}", flush=True)

    barrier()
    first_free = ops.free_bytes()
    rows: list[dict] = []
    # One creation + destroy before any baseline: the driver sets up peer access and IPC bookkeeping once per
    # process; that one-time cost is reported on its own, and the leak checks compare against the state after.
    warm = (wf.FlashInferCreator() if cfg["creator"] == "flashinfer" else wf.IpcWorkspaceCreator(ops)).create(
        world_size=W, rank=rank, max_token_num=64, hidden_dim=H, group=group)
    warm.destroy()
    del warm
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    barrier()
    base_free = ops.free_bytes()
    base_nvml = _nvml_rank_mib(pid)
    rows.append({"variant": "leak_check", "rank": rank, "world_size": W, "source": "gpu",
                 "metric": "one_time_driver_setup", "value": (first_free - base_free) / MiB, "unit": "MiB"})

    def make_creator():
        if cfg["creator"] == "flashinfer":
            return wf.FlashInferCreator()
        return wf.IpcWorkspaceCreator(ops)

    # 1. each trace, per policy
    for tname, trace, name in [(t, tr, n) for t, tr in cfg["traces"].items() for n in cfg["policies"]]:
        pol = wf.POLICIES[name]
        creator = _MeasuredCreator(make_creator(), ops, base_free)
        mgr = wf.WorkspaceManager(creator, high_water=pol.high_water)
        t0 = time.perf_counter()
        refused = wf.replay(mgr, pol, trace, world_size=W, rank=rank, hidden_dim=H, group=group,
                            pre_initialize=cfg["pre_initialize"] or None, before_create=barrier)
        wall = (time.perf_counter() - t0) * 1e3
        mgr.cleanup()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        leak = base_free - ops.free_bytes()
        ev = [e for e in mgr.events if e.step >= 0]
        base = {"variant": name, "trace": tname, "rank": rank, "world_size": W, "source": "gpu",
                "scenario": "cold" if not cfg["pre_initialize"] else f"preinit_{cfg['pre_initialize']}"}
        create = [e.create_ms for e in ev]
        recreate = [e.create_ms + e.destroy_ms for e in ev]
        rows += [
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
            import statistics

            rows.append({**base, "metric": "create_time_median", "value": statistics.median(create), "unit": "ms"})
        for e in mgr.events:
            ebase = {**base, "step": e.step, "tokens": e.max_token_num}
            rows.append({**ebase, "metric": "event_create", "value": e.create_ms, "unit": "ms"})
            rows.append({**ebase, "metric": "event_destroy", "value": e.destroy_ms, "unit": "ms"})
        log(f"{tname:>10} {name:>13}: {len(ev):4d} re-creations, {sum(recreate):9.1f} ms on rank 0, "
            f"peak {mgr.peak_bytes_per_rank / MiB:7.0f} MiB/rank")

    # 2. creation cost vs T
    from sglab.measure.timing import Timing

    for T in cfg["cost_tokens"]:
        creator = make_creator()
        c_ms, d_ms, phases = [], [], {}
        for i in range(cfg["cost_warmup"] + cfg["cost_repeats"]):
            barrier()
            t0 = time.perf_counter()
            ws = creator.create(world_size=W, rank=rank, max_token_num=T, hidden_dim=H, group=group)
            t1 = time.perf_counter()
            barrier()
            t2 = time.perf_counter()
            ws.destroy()
            t3 = time.perf_counter()
            if i >= cfg["cost_warmup"]:
                c_ms.append((t1 - t0) * 1e3)
                d_ms.append((t3 - t2) * 1e3)
                for k, v in (getattr(ws, "phases_ms", None) or {}).items():
                    phases.setdefault(k, []).append(v)
            del ws
        base = {"variant": "cost_sweep", "rank": rank, "world_size": W, "source": "gpu", "tokens": T}
        rows += Timing(c_ms, clock="perf_counter").rows(**base, phase="create")
        rows += Timing(d_ms, clock="perf_counter").rows(**base, phase="destroy")
        for k, v in phases.items():
            rows += Timing(v, clock="perf_counter").rows(**base, phase=k)
        rows.append({**base, "phase": "create", "metric": "workspace", "unit": "MiB",
                     "value": wf.workspace_bytes_per_rank(W, T, H) / MiB})
        log(f"cost T={T:6d}: create {Timing(c_ms).median_ms:8.2f} ms, destroy {Timing(d_ms).median_ms:7.2f} ms")

    # 3. leak check inside the rank
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    barrier()
    end_free = ops.free_bytes()
    end_nvml = _nvml_rank_mib(pid)
    base = {"variant": "leak_check", "rank": rank, "world_size": W, "source": "gpu"}
    rows.append({**base, "metric": "rank_mem_delta_cudart", "value": (base_free - end_free) / MiB, "unit": "MiB"})
    own = ctx.device.index
    rows.append({**base, "metric": "rank_mem_delta_nvml", "unit": "MiB",
                 "value": end_nvml.get(own, 0.0) - base_nvml.get(own, 0.0)})
    rows.append({**base, "metric": "rank_nvml_other_gpus_end", "unit": "MiB",
                 "value": sum(v for g, v in end_nvml.items() if g != own)})
    barrier()
    return {"rank": rank, "pid": pid, "rows": rows}


def _parent_leak_rows(pids: list[int], world_size: int) -> list[dict]:
    import psutil

    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    try:
        from sglab.measure import memory

        left_mib = float(memory.process_gpu_memory(pids)["used_mib"].sum())
    except Exception:  # no NVML: cannot say
        left_mib = float("nan")
    base = {"variant": "leak_check", "world_size": world_size, "source": "gpu"}
    return [{**base, "metric": "rank_processes_left", "value": len(alive), "unit": "count"},
            {**base, "metric": "gpu_mem_of_rank_pids_after", "value": left_mib, "unit": "MiB"}]


def run(params: Optional[dict] = None, *, progress: bool = True):
    """Simulation on the full trace plus the live replay on ``world_size`` GPUs; tidy rows."""
    from sglab import dist, runs

    p = {**DEFAULT_PARAMS, **(params or {})}
    W = int(p["world_size"])
    traces = {}
    for tname in p["traces"]:
        tr = trace_tokens(tname)
        traces[tname] = tr[: int(p["gpu_trace_steps"])] if p["gpu_trace_steps"] else tr
    rows = simulate_rows(p, world_sizes=[W])
    cfg = {"hidden_dim": p["hidden_dim"], "policies": p["policies"], "pre_initialize": p["pre_initialize"],
           "cost_tokens": p["cost_tokens"], "cost_warmup": p["cost_warmup"], "cost_repeats": p["cost_repeats"],
           "creator": p["creator"], "traces": traces, "progress": progress}
    if progress:
        print(f"[workspace_floor] {W} ranks, traces {[(k, len(v)) for k, v in traces.items()]}, {len(p['policies'])} policies, "
              f"cost sweep T={p['cost_tokens']}", flush=True)
    t0 = time.perf_counter()
    out = dist.launch(_rank_main, W, args=(cfg,), backend="nccl", timeout_s=400, collective_timeout_s=120)
    for r in out:
        rows += r["rows"]
    rows += _parent_leak_rows([r["pid"] for r in out], W)
    if progress:
        print(f"[workspace_floor] done in {time.perf_counter() - t0:.1f} s", flush=True)
    return runs.tidy(EXPERIMENT, rows)


# --------------------------------------------------------------------------------------------- CPU self-test
def gloo_rank_selftest(ctx, policy_name: str, trace: list[int], hidden_dim: int = 7168):
    """The IPC creator's rank logic (handle all-gather, opens, barriers, destroy order) with host stand-ins.

    Run with ``dist.launch(..., backend="gloo")``; returns this rank's counts and what is left allocated.
    """
    ops = wf.HostOps()
    pol = wf.POLICIES[policy_name]
    mgr = wf.WorkspaceManager(wf.IpcWorkspaceCreator(ops), high_water=pol.high_water)
    import torch.distributed as tdist

    wf.replay(mgr, pol, trace, world_size=ctx.world_size, rank=ctx.rank, hidden_dim=hidden_dim,
              group=ctx.cpu_group, before_create=lambda: tdist.barrier(group=ctx.cpu_group))
    sizes = [e.max_token_num for e in mgr.events]
    live_before = len(ops.live)
    opened_before = len(ops.opened)
    mgr.cleanup()
    return {"rank": ctx.rank, "sizes": sizes, "live_before_cleanup": live_before,
            "opened_before_cleanup": opened_before, "live_after": len(ops.live), "opened_after": len(ops.opened),
            "fills": len(ops.filled)}


# --------------------------------------------------------------------------------------------- analysis
POLICY_ORDER = list(wf.POLICIES)


def simulated_frame(world_sizes=(2, 4)):
    """Tidy frame of :func:`simulate_rows` for both stored traces and the given world sizes."""
    from sglab import runs

    return runs.tidy(EXPERIMENT, simulate_rows(world_sizes=list(world_sizes)))


def counts_table(df, *, source: str = "simulated", world_size: int = 4):
    """Re-creations (runtime) and peak workspace MiB/rank per trace x scenario x policy."""
    d = df[(df.source == source) & (df.world_size == world_size)
           & df.metric.isin(["recreations", "peak_workspace", "refused_calls"])]
    keys = [k for k in ("trace", "scenario", "variant") if k in d.columns]
    t = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="max")
    return t


def gpu_policy_table(df):
    """Per policy (GPU replay): re-creations, creation ms (median per creation, total) - worst rank - and peak MiB."""
    d = df[(df.source == "gpu") & df.variant.isin(POLICY_ORDER)]
    if d.empty:
        return d
    t = d.pivot_table(index=["world_size", "trace", "variant"], columns="metric", values="value", aggfunc="max")
    cols = [c for c in ("recreations", "create_time_median", "create_time_total", "recreate_time_total",
                        "peak_workspace", "peak_workspace_measured", "refused_calls") if c in t.columns]
    return t[cols]


def plot_events(ax_trace, ax_events, sim_df, trace_name: str, world_size: int = 4, scenario: str = "cold"):
    """Top: the trace's token counts; bottom: one row per policy, a dot at each (re-)creation sized by T."""
    tokens = trace_tokens(trace_name)
    ax_trace.plot(range(len(tokens)), tokens, lw=0.6, color="0.4")
    ax_trace.set_ylabel("x.shape[0]")
    ax_trace.set_title(f"trace '{trace_name}' - (re-)creations per policy, {scenario} (same steps at every W)")
    ev = sim_df[(sim_df.metric == "event_workspace") & (sim_df.trace == trace_name)
                & (sim_df.world_size == world_size) & (sim_df.scenario == scenario)]
    for i, name in enumerate(POLICY_ORDER):
        e = ev[ev.variant == name]
        if e.empty:
            continue
        steps = e.step.clip(lower=0)
        ax_events.scatter(steps, [i] * len(e), s=12 + 60 * e.tokens / 4096, alpha=0.7)
        ax_events.annotate(f"{len(e)}×", (1.005, i), xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax_events.set_yticks(range(len(POLICY_ORDER)), POLICY_ORDER)
    ax_events.set_xlabel("forward step (symlog: linear below 10)")
    for ax in (ax_trace, ax_events):
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(-0.5, len(tokens) * 1.3)


def _tradeoff_panel(ax, t, title: str, *, x: str, ms: Optional[str] = None, color: str = "C0"):
    """Re-creations against peak MiB per rank; one label per point listing its policies (and their ms)."""
    ax.scatter(t[x], t.recreations, s=40, color=color)
    for (xv, yv), g in t.groupby([x, "recreations"]):
        text = "\n".join(short_name(n) + (f": {g.loc[n, ms]:.0f} ms" if ms else "")
                          for n in POLICY_ORDER if n in g.index)
        ax.annotate(text, (xv, yv), fontsize=7, xytext=(4, 3), textcoords="offset points", va="bottom",
                    rotation=20)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_plain_ticks())
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.margins(x=0.35, y=0.35)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_ylabel("re-creations")


def plot_tradeoff(axes, df, *, world_sizes=(2, 4), source: str = "simulated", scenario: str = "cold"):
    """Rows: traces; columns: world sizes. Re-creations against peak workspace per rank (simulated)."""
    for col, W in enumerate(world_sizes):
        for row, tname in enumerate(TRACES):
            d = df[(df.source == source) & (df.world_size == W) & (df.trace == tname) & (df.scenario == scenario)]
            t = d.pivot_table(index="variant", columns="metric", values="value", aggfunc="max")
            _tradeoff_panel(axes[row][col], t, f"'{tname}', W={W} ({source})", x="peak_workspace",
                            color=f"C{col}")
            axes[row][col].set_xlabel("peak workspace per rank (MiB, log2)")


def cost_frame(df):
    """Median creation / destruction time per T and rank (GPU cost sweep)."""
    d = df[(df.variant == "cost_sweep") & (df.metric.isin(["time_median", "time_p10", "time_p90"]))]
    return d.pivot_table(index=["world_size", "tokens", "phase"], columns=["metric"], values="value",
                         aggfunc="max")


# --------------------------------------------------------------------------------------------- recorded runs
def run_world_size(run) -> int:
    return int(run.manifest.get("params", {}).get("world_size", run.manifest.get("gpu_count", 0)))


def newest_per_world(runs_) -> dict:
    """``{world_size: Run}``, the newest run (by ``created_utc``) for each world size."""
    return _runs.newest_by(runs_, run_world_size)


def policy_stats(run):
    """One run's GPU replay per (trace, policy): re-creations, slowest-rank ms, peak MiB/rank."""
    t = gpu_policy_table(run.df)
    return t.reset_index(level="world_size", drop=True) if not t.empty else t


def headline(runs_) -> str:
    """README line: re-creations and host-blocking ms per policy, newest run per world size."""
    shown = newest_per_world(runs_)
    Ws = list(shown)
    st = {W: policy_stats(r) for W, r in shown.items()}
    gpu = sorted({r.manifest.get("gpu_name", "?").replace("NVIDIA ", "") for r in shown.values()})

    def v(trace, pol, col, fmt="{:.0f}"):
        return "/".join(fmt.format(st[W].loc[(trace, pol), col]) for W in Ws)

    def n(trace, pol, col="recreations"):
        vals = {int(st[W].loc[(trace, pol), col]) for W in Ws}
        return "/".join(str(x) for x in sorted(vals))

    ws = "/".join(str(W) for W in Ws)
    return (f"Cold start on short prompts ({', '.join(gpu)}, TP {ws}, ms on the slowest rank): `x.shape[0]` "
            f"re-creates the workspace {n('short_ramp', 'floor_0')}× ({v('short_ramp', 'floor_0', 'recreate_time_total')} ms), "
            f"`max(x.shape[0], 2048)` {n('short_ramp', 'floor_2048')}× "
            f"({v('short_ramp', 'floor_2048', 'recreate_time_total')} ms) at "
            f"{v('short_ramp', 'floor_2048', 'peak_workspace')} MiB/rank "
            f"(floor 512: {n('short_ramp', 'floor_512')}×, {v('short_ramp', 'floor_512', 'peak_workspace')} MiB). "
            f"With 4096-token chunks both re-create {n('mixed', 'floor_2048')}× "
            f"({v('mixed', 'floor_2048', 'recreate_time_total')} ms); before the PR, the "
            f"{n('mixed', 'before_pr', 'refused_calls')} calls over 2048 tokens trip the callee's assert.")


def consistency_table(run):
    """GPU replay against the CPU simulation of the same run: counts must match, memory measured vs computed."""
    d = run.df
    sim = d[(d.source == "simulated") & (d.scenario == "cold")
            & d.metric.isin(["recreations", "peak_workspace"])].pivot_table(
        index=["trace", "variant"], columns="metric", values="value", aggfunc="max")
    g = policy_stats(run)
    t = (g[["recreations", "peak_workspace", "peak_workspace_measured"]]
         .join(sim.add_suffix("_simulated")))
    t["measured - computed MiB"] = t.peak_workspace_measured - t.peak_workspace
    return t


def leak_table(runs_):
    """Per run and rank: device memory left above the baseline (MiB), rank processes and their memory left."""
    import pandas as pd

    rows = []
    for r in runs_:
        d = r.df[r.df.source == "gpu"]
        lk = d[d.variant == "leak_check"]
        run_level = lk[lk["rank"].isna()].set_index("metric")["value"]
        for rank, g in d[d["rank"].notna()].groupby("rank"):
            m = g[g.variant == "leak_check"].set_index("metric")["value"]
            after = g[g.metric == "mem_after_cleanup"]["value"]
            rows.append({"run": r.path.stem, "W": run_world_size(r), "rank": int(rank),
                         "one-time driver setup": m.get("one_time_driver_setup"),
                         "after each policy (max)": after.abs().max(),
                         "end, cudaMemGetInfo": m.get("rank_mem_delta_cudart"),
                         "end, NVML own GPU": m.get("rank_mem_delta_nvml"),
                         "end, NVML other GPUs": m.get("rank_nvml_other_gpus_end"),
                         "rank processes left": run_level.get("rank_processes_left"),
                         "their GPU MiB left": run_level.get("gpu_mem_of_rank_pids_after")})
    return pd.DataFrame(rows).set_index(["run", "W", "rank"])


def repeatability_table(runs_, world_size: int):
    """The same world size recorded more than once: creation cost per T and per-policy totals side by side."""
    import pandas as pd

    same = [r for r in runs_ if run_world_size(r) == world_size]
    cols = {}
    for r in same:
        c = cost_frame(r.df).xs("create", level="phase")["time_median"].droplevel("world_size")
        cols[r.path.stem] = c
    cost = pd.DataFrame(cols)
    cost.index = [f"create T={int(t)}" for t in cost.index]
    tot = pd.DataFrame({r.path.stem: policy_stats(r)["recreate_time_total"] for r in same})
    tot.index = [f"{a} {b} total" for a, b in tot.index]
    t = pd.concat([cost, tot])
    if len(same) >= 2:
        t["ratio newest/oldest"] = t.iloc[:, -1] / t.iloc[:, 0]
    return t


def _event_frame(df, trace_name):
    ev = df[df.metric.isin(["event_create", "event_destroy"]) & (df.trace == trace_name)]
    ev = ev.groupby(["variant", "step", "tokens", "rank"], as_index=False)["value"].sum()  # destroy old + create
    return ev.groupby(["variant", "step", "tokens"], as_index=False)["value"].max()  # slowest rank


def plot_gpu_events(axes, shown: dict, trace_name: str):
    """``axes[0]``: the trace; ``axes[1:]``: one panel per world size, a dot per (re-)creation on the GPU,
    area ~ its ms (destroying the old workspace + creating the new one, slowest rank), with count and total per
    policy at the right."""
    tokens = trace_tokens(trace_name)
    axes[0].plot(range(len(tokens)), tokens, lw=0.6, color="0.4")
    axes[0].set_ylabel("x.shape[0] (tokens)")
    axes[0].set_title(f"trace '{trace_name}': (re-)creations per policy on the GPUs, cold start")
    for ax, (W, run) in zip(axes[1:], shown.items()):
        ev = _event_frame(run.df, trace_name)
        for i, name in enumerate(POLICY_ORDER):
            e = ev[ev.variant == name]
            if e.empty:
                continue
            ax.scatter(e.step, [i] * len(e), s=4 * e.value, alpha=0.7)
            ax.annotate(f"{len(e)}× {e.value.sum():.0f} ms", (1.005, i), xycoords=("axes fraction", "data"),
                        va="center", fontsize=8)
        ax.set_yticks(range(len(POLICY_ORDER)), POLICY_ORDER)
        ax.set_ylabel(f"W={W}")
    for ax in axes:
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(-0.5, len(tokens))
    axes[-1].set_xlabel("forward step (symlog)")


def _plain_ticks():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}")


SHORT = {"before_pr": "before PR", "shape_no_hwm": "shape, no hwm", "floor_0": "shape"}


def short_name(policy: str) -> str:
    return SHORT.get(policy, policy.replace("floor_", "floor "))


def plot_gpu_tradeoff(axes, shown: dict):
    """Rows: traces; columns: world sizes. Re-creations against the peak workspace memory measured per rank,
    each point labelled with its policies and their total host-blocking ms (slowest rank)."""
    for col, (W, run) in enumerate(shown.items()):
        st = policy_stats(run)
        for row, tname in enumerate(TRACES):
            ax = axes[row][col]
            _tradeoff_panel(ax, st.xs(tname, level="trace"), f"'{tname}', W={W}", x="peak_workspace_measured",
                            ms="recreate_time_total", color=f"C{col}")
            ax.set_xlabel("peak workspace per rank, measured (MiB, log2)")


def plot_cost(ax_create, ax_open, runs_, shown: dict):
    """Creation ms vs T for every run (older repeats dashed), and the IPC-open phase against the Lamport buffer
    size (both world sizes jump at the same buffer size)."""
    newest = {id(r) for r in shown.values()}
    for r in sorted(runs_, key=lambda r: (run_world_size(r), str(r.manifest.get("created_utc")))):
        W = run_world_size(r)
        c = cost_frame(r.df).reset_index()
        g = c[c.phase == "create"]
        style = "-" if id(r) in newest else "--"
        mach = r.manifest.get("gpu_count_machine", r.manifest.get("gpu_count"))
        ax_create.errorbar(g.tokens, g.time_median, yerr=[g.time_median - g.time_p10, g.time_p90 - g.time_median],
                           marker="o", capsize=3, ls=style, label=f"W={W} ({mach}-GPU box, {r.path.stem[9:15]}Z)")
        if id(r) in newest:
            o = c[c.phase == "open"]
            lam = [wf.workspace_sizes(W, int(T), int(r.manifest["params"]["hidden_dim"]))["aligned"][2] / MiB
                   for T in o.tokens]
            ax_open.plot(lam, o.time_median, marker="o", label=f"W={W}")
    ax_create.set_xscale("log", base=2)
    ax_create.set_yscale("log")
    ax_create.set_xlabel("workspace T (tokens, log2)")
    ax_create.set_ylabel("creation ms (median, p10-p90, slowest rank)")
    ax_create.legend(fontsize=7)
    ax_open.set_xscale("log", base=2)
    ax_open.set_yscale("log")
    ax_open.set_xlabel("Lamport buffer per rank (MiB, log2)")
    ax_open.set_ylabel("cudaIpcOpenMemHandle phase, ms (median)")
    ax_open.legend(fontsize=8)
    for ax in (ax_create, ax_open):
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(_plain_ticks())
            axis.set_minor_formatter(_plain_ticks())


def phase_table(run):
    """Median ms per creation phase and T (slowest rank), with the per-rank buffer sizes that drive them."""
    W = run_world_size(run)
    H = int(run.manifest["params"]["hidden_dim"])
    t = cost_frame(run.df).xs(W, level="world_size")["time_median"].unstack("phase")
    t.insert(0, "Lamport MiB", [wf.workspace_sizes(W, int(T), H)["aligned"][2] / MiB for T in t.index])
    t.insert(1, "workspace MiB", [wf.workspace_bytes_per_rank(W, int(T), H) / MiB for T in t.index])
    t.index = t.index.astype(int)
    return t
