"""Tables from a run (recorded or live): the simulation's counts, the GPU replay per policy, its consistency with
the simulation, the creation cost per size and phase, the leak check, and what the profiler trace says.

Times are host wall-clock ms per rank; tables take the slowest rank (``max`` over ranks), since a re-creation
blocks every rank until the last one is done.
"""

from __future__ import annotations

import re

from sglab.core import runs as _runs
from sglab.fixes import workspace_floor as wf

from sglab.experiments.workspace_floor.simulation import MiB

POLICY_ORDER = list(wf.POLICIES)


# --------------------------------------------------------------------------------------------- runs
def run_world_size(run) -> int:
    return int(run.manifest.get("params", {}).get("world_size", run.manifest.get("gpu_count", 0)))


def run_hidden(run) -> int:
    return int(run.manifest.get("params", {}).get("hidden_dim", 7168))


def newest_per_world(runs_) -> dict:
    """``{world_size: Run}``, the newest run (by ``created_utc``) for each world size."""
    return _runs.newest_by(runs_, run_world_size)


# --------------------------------------------------------------------------------------------- simulation
def counts_table(df, *, source: str = "simulated", world_size: int = 4):
    """Re-creations (runtime) and peak workspace MiB/rank per trace x scenario x policy."""
    d = df[(df.source == source) & (df.world_size == world_size)
           & df.metric.isin(["recreations", "peak_workspace", "refused_calls"])]
    keys = [k for k in ("trace", "scenario", "variant") if k in d.columns]
    return d.pivot_table(index=keys, columns="metric", values="value", aggfunc="max")


def sizes_table(world_sizes=(2, 4), tokens=(1, 512, 2048, 4096), hidden_dim: int = 7168):
    """FlashInfer's three aligned buffers and their sum per rank (MiB), per world size and T."""
    import pandas as pd

    rows = []
    for W in world_sizes:
        for T in tokens:
            a = wf.workspace_sizes(W, T, hidden_dim)["aligned"]
            rows.append({"W": W, "T": T, **{f"{n} MiB": b / MiB for n, b in zip(wf.BUFFER_NAMES, a)},
                         "per rank MiB": sum(a) / MiB})
    return pd.DataFrame(rows)


def demo_table(seq, *, world_size: int = 4, hidden_dim: int = 7168):
    """A hand-made batch-size sequence through every policy on the fake creator."""
    import pandas as pd

    rows = []
    for pol in wf.POLICIES.values():
        mgr, refused = wf.simulate(pol, seq, world_size=world_size, hidden_dim=hidden_dim)
        rows.append({"policy": pol.label, "created at T": [e.max_token_num for e in mgr.events],
                     "creations": mgr.recreations, "refused (assert)": refused,
                     "peak MiB/rank": mgr.peak_bytes_per_rank / MiB})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------- GPU replay
def gpu_policy_table(df):
    """Per policy (GPU replay): re-creations, creation ms (median per creation, total) - worst rank - and peak MiB."""
    d = df[(df.source == "gpu") & df.variant.isin(POLICY_ORDER)]
    if d.empty:
        return d
    t = d.pivot_table(index=["world_size", "trace", "variant"], columns="metric", values="value", aggfunc="max")
    cols = [c for c in ("recreations", "create_time_median", "create_time_total", "recreate_time_total",
                        "peak_workspace", "peak_workspace_measured", "refused_calls") if c in t.columns]
    return t[cols]


def policy_stats(run):
    """One run's GPU replay per (trace, policy): re-creations, slowest-rank ms, peak MiB/rank."""
    t = gpu_policy_table(run.df)
    return t.reset_index(level="world_size", drop=True) if not t.empty else t


def consistency_table(run):
    """GPU replay against the CPU simulation of the same run: counts must match, memory measured vs computed."""
    d = run.df
    sim = d[(d.source == "simulated") & (d.scenario == "cold")
            & d.metric.isin(["recreations", "peak_workspace"])].pivot_table(
        index=["trace", "variant"], columns="metric", values="value", aggfunc="max")
    g = policy_stats(run)
    t = g[["recreations", "peak_workspace", "peak_workspace_measured"]].join(sim.add_suffix("_simulated"))
    t["measured - computed MiB"] = t.peak_workspace_measured - t.peak_workspace
    return t


def gpu_event_frame(df, trace_name: str):
    """Per policy and re-creation along a trace: step, size and ms to destroy the old + create the new
    workspace, slowest rank."""
    ev = df[df.metric.isin(["event_create", "event_destroy"]) & (df.trace == trace_name)]
    ev = ev.groupby(["variant", "step", "tokens", "rank"], as_index=False)["value"].sum()
    return ev.groupby(["variant", "step", "tokens"], as_index=False)["value"].max()


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


# --------------------------------------------------------------------------------------------- cost sweep
def cost_frame(df):
    """Median creation / destruction time per T and rank (GPU cost sweep)."""
    d = df[(df.variant == "cost_sweep") & (df.metric.isin(["time_median", "time_p10", "time_p90"]))]
    return d.pivot_table(index=["world_size", "tokens", "phase"], columns=["metric"], values="value",
                         aggfunc="max")


def phase_table(run):
    """Median ms per creation phase and T (slowest rank), with the per-rank buffer sizes that drive them."""
    W, H = run_world_size(run), run_hidden(run)
    t = cost_frame(run.df).xs(W, level="world_size")["time_median"].unstack("phase")
    t.insert(0, "Lamport MiB", [wf.workspace_sizes(W, int(T), H)["aligned"][2] / MiB for T in t.index])
    t.insert(1, "workspace MiB", [wf.workspace_bytes_per_rank(W, int(T), H) / MiB for T in t.index])
    t.index = t.index.astype(int)
    return t


def cost_step(run, below_mib: float = 336, above_mib: float = 672) -> dict:
    """Median creation and IPC-open ms with Lamport buffers <= ``below_mib`` against >= ``above_mib``."""
    p = phase_table(run)
    lo, hi = p[p["Lamport MiB"] <= below_mib], p[p["Lamport MiB"] >= above_mib]
    return {"create_below": lo.create.median(), "create_above": hi.create.median(),
            "open_below": lo.open.median(), "open_above": hi.open.median()}


def repeatability_table(runs_, world_size: int):
    """The same world size recorded more than once: creation cost per T and per-policy totals side by side."""
    import pandas as pd

    same = [r for r in runs_ if run_world_size(r) == world_size]
    cost = pd.DataFrame({r.path.stem: cost_frame(r.df).xs("create", level="phase")["time_median"]
                        .droplevel("world_size") for r in same})
    cost.index = [f"create T={int(t)}" for t in cost.index]
    tot = pd.DataFrame({r.path.stem: policy_stats(r)["recreate_time_total"] for r in same})
    tot.index = [f"{a} {b} total" for a, b in tot.index]
    t = pd.concat([cost, tot])
    if len(same) >= 2:
        t["ratio newest/oldest"] = t.iloc[:, -1] / t.iloc[:, 0]
    return t


# --------------------------------------------------------------------------------------------- profiler trace
CALLS = {  # what each creation does, as CUDA runtime or driver calls (cuda.bindings may reach either name)
    "alloc": r"^(cudaMalloc|cuMemAlloc)",
    "free": r"^(cudaFree|cuMemFree)",
    "ipc get handle": r"^cu(da)?IpcGetMemHandle",
    "ipc open": r"^cu(da)?IpcOpenMemHandle",
    "ipc close": r"^cu(da)?IpcCloseMemHandle",
    "lamport fill": r"^cuMemsetD16",
    "synchronize": r"Synchronize",
}


def creation_ranges(events):
    """One row per traced creation: variant, rank, creation, step, tokens and its ms (the range's length)."""
    from sglab.experiments.workspace_floor.profile import COST_RANGE, RECREATE_RANGE

    r = events[(events.category == "range") & events.name.str.endswith((RECREATE_RANGE, COST_RANGE))
               & ~events.lane.str.startswith(("stream", "device"))]
    out = r[["variant", "rank", "creation", "step", "tokens"]].copy()
    out["ms"] = r.dur_us / 1e3
    return out.sort_values(["variant", "rank", "creation"]).reset_index(drop=True)


def trace_recreation_table(events, variants=None):
    """Per profiled policy: re-creation ranges per rank (they must agree) and the time in them, slowest rank."""
    from sglab.experiments.workspace_floor.profile import COST_VARIANT

    r = creation_ranges(events)
    r = r[r.variant != COST_VARIANT]
    if variants is not None:
        r = r[r.variant.isin(variants)]
    per_rank = r.groupby(["variant", "rank"]).agg(ranges=("ms", "size"), total_ms=("ms", "sum"))
    t = per_rank.groupby("variant").agg(ranges_min=("ranges", "min"), ranges_max=("ranges", "max"),
                                        total_ms=("total_ms", "max"))
    return t.reindex([v for v in POLICY_ORDER if v in t.index])


def call_group(name: str) -> str:
    for group, rx in CALLS.items():
        if re.search(rx, name):
            return group
    return ""


def call_table(events, rank: int = 0):
    """The CUDA calls inside the creations of one rank: per variant and call, calls per creation and median ms
    per call (the small per-rank event table of the notebook)."""
    d = events[(events["rank"] == rank) & (events.category == "runtime")].copy()
    d["call"] = d.name.map(call_group)
    d = d[d.call != ""]
    n = events[events["rank"] == rank].groupby("variant").creation.nunique()
    t = d.groupby(["variant", "call", "name"]).agg(calls=("dur_us", "size"), median_us=("dur_us", "median"),
                                                   total_ms=("dur_us", lambda s: s.sum() / 1e3))
    t["per creation"] = t.calls / n.reindex(t.index.get_level_values("variant")).to_numpy()
    return t[["per creation", "median_us", "total_ms"]]


def open_by_buffer(events):
    """Cost sweep: median ms of one IPC open per buffer and workspace T (slowest rank), with the buffer's MiB."""
    from sglab.experiments.workspace_floor.profile import COST_VARIANT

    d = events[(events.variant == COST_VARIANT) & (events.category == "runtime")
               & events.name.map(lambda n: call_group(n) == "ipc open")].copy()
    d["buffer"] = d.phase.str.replace("ipc open ", "", regex=False)
    t = d.groupby(["tokens", "buffer", "rank"]).dur_us.median().groupby(["tokens", "buffer"]).max() / 1e3
    return t.unstack("buffer")


def ipc_calls_per_creation(events):
    """Per (variant, rank, creation): the number of IPC handle gets and opens, to compare with 3 and 3(W-1)."""
    d = events[events.category == "runtime"].copy()
    d["call"] = d.name.map(call_group)
    d = d[d.call.isin(["ipc get handle", "ipc open"])]
    keys = creation_ranges(events)[["variant", "rank", "creation"]]
    c = d.groupby(["variant", "rank", "creation", "call"]).size().unstack("call", fill_value=0)
    return keys.set_index(["variant", "rank", "creation"]).join(c).fillna(0).astype(int)
