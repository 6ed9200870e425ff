"""The profiler's picture of the re-creations, drawn from the run's ``events`` sidecar (live or recorded).

- :func:`profile_overview`: per profiled policy, every re-creation of one rank as swim-lanes (host ranges, CUDA
  runtime / driver calls, device work), the re-creations placed back to back so the axis is time spent
  re-creating; IPC handle opens highlighted;
- :func:`profile_step`: the traced cost sizes, where the creation cost steps up: ms per creation phase (stacked)
  and the IPC open of each buffer against that buffer's size.
"""

from __future__ import annotations

from sglab.core import plots
from sglab.fixes import workspace_floor as wf
from sglab.core import plots as timeline

from sglab.experiments.workspace_floor import analysis
from sglab.experiments.workspace_floor._closed import closed
from sglab.experiments.workspace_floor.profile import COST_VARIANT, RECREATE_RANGE
from sglab.experiments.workspace_floor.simulation import MiB

OPEN_RX = r"IpcOpenMemHandle"
LABEL = {"floor_0": "x.shape[0]", "floor_2048": "max(x.shape[0], 2048)"}
PHASE_ORDER = ["destroy old workspace", "preflight", "alloc", "ipc get handle", "exchange handles", "ipc open data",
               "ipc open flags", "ipc open lamport", "lamport fill", "metadata", "barrier"]


PHASE_COLORS = {"destroy old workspace": "#bdc3c7", "preflight": "#7f8c8d", "alloc": "#2471a3",
                "ipc get handle": "#76d7c4", "exchange handles": "#a9cce3", "ipc open data": "#f5b041",
                "ipc open flags": "#dc7633", "ipc open lamport": "#a04000", "lamport fill": "#229954",
                "metadata": "#7d3c98", "barrier": "#34495e"}


def compress(events, gap_us: float = 300.0):
    """Each creation shifted to start ``gap_us`` after the previous one ended (the replay between them cut)."""
    out, t = [], 0.0
    for _, g in events.groupby("creation", sort=True):
        g = g.assign(start_us=g.start_us - g.start_us.min() + t)
        out.append(g)
        t = float((g.start_us + g.dur_us).max()) + gap_us
    import pandas as pd

    return pd.concat(out, ignore_index=True) if out else events


@closed
def profile_overview(events, *, rank: int = 0, variants=("floor_0", "floor_2048"), run=None):
    """Swim-lanes of every re-creation of ``rank``, one group per policy, on one axis of time spent re-creating."""
    tables = {}
    for v in variants:
        d = events[(events.variant == v) & (events["rank"] == rank)]
        d = d[(d.category != "range") | d.name.str.endswith(RECREATE_RANGE)]  # the re-creation ranges only
        n = int(d.creation.nunique())
        is_range = d.category == "range"  # each range labelled with the workspace size it creates
        d = d.assign(name=d.name.where(~is_range, d.tokens.astype(int).astype(str) + " tok"))
        tables[f"{LABEL.get(v, v)} ({n}×)"] = compress(d)
    fig = timeline.timeline(tables, highlight=OPEN_RX, highlight_label="IPC handle open",
                            categories=("runtime", "memset", "kernel", "range"),
                            title=f"rank {rank}: every workspace re-creation of the cold start, back to back")
    plots.caption(fig, run, extra="torch.profiler; gaps between re-creations cut; outlines: 'recreate workspace' "
                                  "ranges, labelled with the workspace T they create")
    return fig


def phase_frame(events):
    """Cost sizes: ms per creation phase (sub-range) of the slowest rank's creation, per workspace T (one rank
    per size, so the phases add up to that creation); ``ipc open`` by buffer."""
    from sglab.core.trace import PHASE_PREFIX

    cr = analysis.creation_ranges(events)
    cr = cr[cr.variant == COST_VARIANT]
    slowest = cr.loc[cr.groupby("tokens").ms.idxmax(), ["tokens", "rank"]]
    d = events[(events.variant == COST_VARIANT) & (events.category == "range")
               & ~events.lane.str.startswith(("stream", "device"))].merge(slowest, on=["tokens", "rank"])
    d["sub"] = d.name.str.replace(PHASE_PREFIX, "", regex=False)
    d["sub"] = d["sub"].where(d["sub"].str.startswith("ipc open"),
                              d["sub"].str.replace(r" (data|flags|lamport)$", "", regex=True))
    d = d[d["sub"].isin(PHASE_ORDER)]
    t = d.groupby(["tokens", "sub"]).dur_us.sum().unstack("sub") / 1e3
    return t[[c for c in PHASE_ORDER if c in t.columns]].fillna(0.0)


@closed
def profile_step(events, *, world_size: int, hidden_dim: int, run=None):
    """Left: ms per creation phase for each traced size (stacked, slowest rank), labelled with the Lamport
    buffer's MiB. Right: one IPC open per buffer against the size of that buffer."""
    import numpy as np

    fig, axes = plots.figure(2, 1, width=12, height=4.4)
    ax, ax2 = axes[0]
    t = phase_frame(events)
    x = np.arange(len(t))
    bottom = np.zeros(len(t))
    for col in t.columns:
        ax.bar(x, t[col], bottom=bottom, label=col, color=PHASE_COLORS.get(col, "#999999"))
        bottom += t[col].to_numpy()
    lam = [wf.workspace_sizes(world_size, int(T), hidden_dim)["aligned"][2] / MiB for T in t.index]
    ax.set_xticks(x, [f"T={int(T)}\n{m:.0f} MiB" for T, m in zip(t.index, lam)], fontsize=8)
    ax.set_xlabel("workspace T and its Lamport buffer per rank")
    ax.set_ylabel("ms per creation phase (traced, slowest rank's creation)")
    ax.legend(fontsize=7, ncol=2)
    ob = analysis.open_by_buffer(events)
    for name in ob.columns:
        idx = wf.BUFFER_NAMES.index(name)
        mib = [wf.workspace_sizes(world_size, int(T), hidden_dim)["aligned"][idx] / MiB for T in ob.index]
        ax2.plot(mib, ob[name], marker="o", ls="", label=f"{name} buffer")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("size of the buffer opened (MiB per rank, log2)")
    ax2.set_ylabel("one IPC open (ms, median over peers, slowest rank)")
    ax2.legend(fontsize=8)
    plots.caption(fig, run, extra=f"torch.profiler, one traced creation per size, W={world_size}")
    return fig
