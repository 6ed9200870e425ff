"""The traced pass: the cold-start short-prompt trace under torch.profiler, with and without the floor, per rank.

Runs after every timed pass (profiling changes no reported time). Inside one :class:`sglab.core.trace.Recorder`
session per rank:

- for each profiled policy (``x.shape[0]`` and ``max(x.shape[0], 2048)`` by default), a fresh manager replays the
  profiled trace with the IPC creator; the manager opens a ``recreate workspace`` range around every creation and
  the creator a sub-range around each of its phases (``alloc lamport``, ``ipc get handle lamport``,
  ``exchange handles lamport``, ``ipc open lamport``, ``lamport fill``, ``barrier``, ...), so each re-creation
  is one visible range holding its CUDA runtime / driver calls;
- then one ``create workspace`` range per size of the cost sweep, where the creation cost steps up.

:func:`reduce_events` keeps only what happens inside those creation ranges and labels every event with its
``variant``, ``rank``, ``creation`` (0, 1, ... within the variant), trace ``step`` and workspace ``tokens``:
a few hundred rows per rank, stored as the run's ``events`` sidecar beside one Perfetto file per rank.
"""

from __future__ import annotations

from pathlib import Path

from sglab.fixes import workspace_floor as wf
from sglab.core.trace import COLUMNS

RECREATE_RANGE = wf.RECREATE_RANGE  # "recreate workspace": one per creation along the trace
COST_RANGE = "create workspace"  # one per size of the traced cost sweep
VARIANT_PREFIX = "variant "  # outer range per variant: "variant floor_0", "variant cost_sweep"
COST_VARIANT = "cost_sweep"
EXTRA_COLUMNS = ["variant", "rank", "creation", "step", "tokens"]
COLUMNS_OUT = COLUMNS + EXTRA_COLUMNS  # the reduced table: sglab.core.trace's columns, then the labels
# host queries torch makes around every op: sub-microsecond, numerous, and no part of the mechanism
TRIVIAL_CALLS = r"^(cudaGetDevice|cudaGetLastError|cudaPeekAtLastError|cudaStreamIsCapturing|cudaGetDeviceCount|" \
                r"cuCtxGetCurrent|cudaDeviceGetAttribute)(_v\d+)?$"


def traced_pass(st) -> dict:
    """Profile the re-creations of each profiled policy and the cost sizes on this rank:
    ``{"table": reduced event table, "perfetto": path}``; adds this pass's leak rows to ``st.rows``."""
    from sglab.core import timing as phases, trace
    from sglab.core.kernels import _warm_profiler

    from sglab.experiments.workspace_floor.simulation import MiB

    cfg = st.cfg
    path = Path(cfg["trace_dir"]) / f"rank{st.ctx.rank}.trace.json.gz"
    schedule: dict[str, list[tuple[int, int]]] = {}
    import torch

    if torch.cuda.is_available():
        with phases.phase("profile: profiler start-up"):
            _warm_profiler()
    with phases.phase("profile: session + export"):
        with trace.Recorder(perfetto=path) as rec:
            st.empty_cache()
            st.barrier()
            base = st.ops.free_bytes()  # the profiler's own device memory is in use from here on
            for name in cfg["profile_policies"]:
                with trace.phase(VARIANT_PREFIX + name):
                    schedule[name] = _traced_replay(st, name, trace.phase)
            with trace.phase(VARIANT_PREFIX + COST_VARIANT):
                schedule[COST_VARIANT] = _traced_costs(st, trace.phase)
            st.empty_cache()
            left = base - st.ops.free_bytes()
    st.empty_cache()
    rows = {"mem_after_cleanup": left / MiB, "profiler_device_mib": (st.base_free - st.ops.free_bytes()) / MiB}
    st.rows += [{"variant": "traced_pass", **st.base, "metric": k, "value": v, "unit": "MiB"} for k, v in rows.items()]
    with phases.phase("profile: reduce"):
        table = reduce_events(rec.events, schedule, rank=st.ctx.rank)
    return {"table": table, "perfetto": str(path)}


def _traced_replay(st, name: str, mark) -> list[tuple[int, int]]:
    cfg, ctx, pol = st.cfg, st.ctx, wf.POLICIES[name]
    from sglab.experiments.workspace_floor.run import make_creator

    mgr = wf.WorkspaceManager(make_creator(cfg["creator"], st.ops, mark), high_water=pol.high_water, mark=mark)
    wf.replay(mgr, pol, cfg["profile_trace"], world_size=ctx.world_size, rank=ctx.rank,
              hidden_dim=cfg["hidden_dim"], group=ctx.cpu_group, before_create=st.barrier)
    mgr.cleanup()
    return [(e.step, e.max_token_num) for e in mgr.events]


def _traced_costs(st, mark) -> list[tuple[int, int]]:
    from sglab.experiments.workspace_floor.run import make_creator

    cfg, ctx = st.cfg, st.ctx
    creator = make_creator(cfg["creator"], st.ops, mark)
    for T in cfg["cost_tokens"]:
        st.barrier()
        with mark(COST_RANGE):
            ws = creator.create(world_size=ctx.world_size, rank=ctx.rank, max_token_num=T,
                                hidden_dim=cfg["hidden_dim"], group=ctx.cpu_group)
        st.barrier()
        ws.destroy()
    return [(-1, T) for T in cfg["cost_tokens"]]


def _host_ranges(events, names):
    from sglab.core.trace import PHASE_PREFIX

    r = events[(events.category == "range") & ~events.lane.str.startswith(("stream", "device"))]
    r = r.assign(bare=r.name.str.replace(PHASE_PREFIX, "", regex=False))
    return r[r.bare.isin(names)].sort_values("start_us", kind="stable")


def reduce_events(events, schedule: dict, *, rank: int):
    """The events inside creation ranges, labelled (see the module docstring); device-side copies of ranges and
    trivial host queries dropped. ``schedule``: per variant, the ``(step, tokens)`` of its creations in order."""
    import numpy as np
    import pandas as pd

    cols = COLUMNS_OUT
    variants = _host_ranges(events, [VARIANT_PREFIX + v for v in schedule])
    creations = _host_ranges(events, [RECREATE_RANGE, COST_RANGE])
    if creations.empty:
        return pd.DataFrame(columns=cols)
    labels = []
    seen: dict[str, int] = {}
    for c in creations.itertuples():
        inside = variants[(variants.start_us <= c.start_us) & (c.start_us <= variants.start_us + variants.dur_us)]
        variant = inside.bare.iloc[-1][len(VARIANT_PREFIX):] if len(inside) else ""
        k = seen.get(variant, 0)
        seen[variant] = k + 1
        step, tokens = schedule.get(variant, [])[k] if k < len(schedule.get(variant, [])) else (-1, -1)
        labels.append((variant, k, step, tokens))
    starts = creations.start_us.to_numpy()
    ends = starts + creations.dur_us.to_numpy()
    t = events.start_us.to_numpy()
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = (idx >= 0) & (t <= ends[np.clip(idx, 0, None)])
    keep = ok & ~(events.category.eq("range") & events.lane.str.startswith(("stream", "device"))).to_numpy()
    keep &= ~events.name.str.match(TRIVIAL_CALLS).to_numpy()
    out = events[keep].copy()
    lab = [labels[i] for i in idx[keep]]
    out["variant"] = [x[0] for x in lab]
    out["rank"] = rank
    out["creation"] = [x[1] for x in lab]
    out["step"] = [x[2] for x in lab]
    out["tokens"] = [x[3] for x in lab]
    return out[cols].reset_index(drop=True)


def gloo_profile_selftest(ctx, trace: list[int], policies: list[str], cost_tokens: list[int], trace_dir: str,
                          hidden_dim: int = 7168):
    """The traced pass on the CPU: the IPC creator's rank logic over gloo with host stand-ins for the device
    calls, under the same Recorder; returns this rank's reduced event table. Run with
    ``dist.launch(..., backend="gloo")``."""
    from sglab.experiments.workspace_floor.run import RankState

    cfg = {"creator": "ipc", "hidden_dim": hidden_dim, "profile_trace": list(trace),
           "profile_policies": list(policies), "cost_tokens": list(cost_tokens), "trace_dir": trace_dir,
           "progress": False}
    st = RankState(ctx, cfg, wf.HostOps(), ctx.barrier)
    return traced_pass(st)
