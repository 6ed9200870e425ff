"""The stored traces, the simulation over them, and the traced pass over gloo (CPU)."""

import pandas as pd
import pytest

from sglab.core import dist, runs
from sglab.sglang.server_args import piecewise_cuda_graph_tokens
from sglab.workspace_floor import measure, show, traces
from sglab.workspace_floor import rebuild as wf

from tests.workspace_floor.test_rebuild import FIXED, H, HostOps


def test_simulated_counts_on_stored_traces():
    rows = pd.DataFrame(measure.simulate_rows(world_sizes=[2, 4]))
    idx = ["trace", "world_size", "scenario", "variant"]
    rec = rows[rows.metric == "recreations"].set_index(idx)["value"]
    for W in (2, 4):
        assert rec["mixed", W, "cold", "floor_0"] == 2
        assert rec["mixed", W, "cold", "floor_2048"] == 2
        assert rec["mixed", W, "cold", "floor_4096"] == 1
        assert rec["short_ramp", W, "cold", "floor_0"] == 9
        assert rec["short_ramp", W, "cold", "shape_no_hwm"] == 9
        assert rec["short_ramp", W, "cold", "floor_512"] == 1
        assert rec["short_ramp", W, "cold", "floor_2048"] == 1
        assert rec["short_ramp", W, "preinit_2048", "floor_0"] == 0
    peak = rows[rows.metric == "peak_workspace"].set_index(idx)["value"]
    assert peak["short_ramp", 4, "cold", "floor_2048"] == 450
    assert peak["short_ramp", 2, "cold", "floor_2048"] == 226
    ref = rows[rows.metric == "refused_calls"].set_index(idx)["value"]
    assert ref["mixed", 2, "cold", "before_pr"] == 385


@pytest.mark.parametrize("name", list(traces.TRACES))
def test_trace_is_stored_and_regenerates_identically(name):
    df, meta = traces.load_trace(name)  # raises if the stored CSV differs from a fresh generation
    assert len(df) == meta["rows"] == traces.TRACE_PARAMS["steps"]
    assert meta["params"] == traces.trace_params(name)
    assert df.tokens.max() <= traces.TRACE_PARAMS["chunked_prefill_size"]
    assert set(df[df.kind != "decode"].tokens) <= set(piecewise_cuda_graph_tokens(4096))
    assert (df.tokens >= df.tokens_raw).all()


def test_trace_seed_changes_trace():
    a = traces.generate_trace(**{**traces.trace_params("mixed"), "steps": 300})
    b = traces.generate_trace(**{**traces.trace_params("mixed"), "steps": 300, "seed": 7})
    assert not a.tokens.equals(b.tokens)


def test_bad_parameters_fail_in_one_line_before_any_process():
    for bad, words in (({"policies": ["floor_3"]}, "unknown policies"),
                       ({"traces": ["nope"]}, "unknown traces"), ({"world_size": 1}, ">= 2")):
        with pytest.raises(ValueError, match=words):
            measure.run(bad, progress=False)


def _rank_phases(ctx, cfg):
    """The GPU rank's replay and cost sweep with host stand-ins for the device calls."""
    st = measure.RankState(ctx, cfg, HostOps(), ctx.barrier)
    st.base_free = st.ops.free_bytes()
    for tname, trace in cfg["traces"].items():
        for name in cfg["policies"]:
            measure._replay_one(st, tname, trace, name)
    measure._cost_sweep(st)
    return st.rows


def test_rank_replay_and_cost_sweep_over_gloo(forked):
    cfg = {
        **measure.rank_config(
            {
                **measure.DEFAULT_PARAMS, "traces": ["short_ramp"], "gpu_trace_steps": 200,
                "cost_tokens": [64, 4096], "cost_repeats": 3
            }, progress=False, trace_dir=""), "traces": {"fixed": FIXED},
        "policies": ["floor_0", "floor_2048", "before_pr"]
    }
    out = dist.launch(_rank_phases, 2, args=(cfg,), backend="gloo", timeout_s=120,
                      collective_timeout_s=30, start_method=forked)
    df = runs.tidy(measure.EXPERIMENT, [row for rows in out for row in rows])
    for name in cfg["policies"]:
        mgr, refused = wf.simulate(wf.POLICIES[name], FIXED, world_size=2, hidden_dim=H)
        # the per-policy metrics only: a unique (rank, metric) index gives one number per key
        # (pandas 2 gives a Series for a key of a non-unique, unsorted index)
        cell = df[(df.variant == name) & (df.trace == "fixed")
                  & ~df.metric.str.startswith("event_")].set_index(["rank", "metric"])
        assert cell.index.is_unique
        for rank in (0, 1):
            assert cell.value[rank, "recreations"] == mgr.recreations
            assert cell.value[rank, "refused_calls"] == refused
            assert cell.value[rank, "peak_workspace"] == mgr.peak_bytes_per_rank / 2**20
            # the host stand-in's "memory": the three buffers and the 20-byte flag word
            assert 0 < cell.value[rank, "peak_workspace_measured"] - cell.value[
                rank, "peak_workspace"] < 0.001
            assert cell.value[rank, "mem_after_cleanup"] == 0
    events = df[df.metric == "event_create"]
    assert len(events) == 2 * (8 + 4 + 1)  # per rank: one row per creation of each policy
    cost = df[(df.variant == "cost_sweep") & (df.metric == "time_median")]
    assert set(cost.tokens) == {64, 4096}
    assert {"create", "destroy", "alloc", "export", "exchange", "open", "fill"} <= set(cost.phase)
    assert len(cost[cost.phase == "create"]) == 2 * 2  # sizes x ranks


def _traced_rank(ctx, trace: list[int], policies: list[str], cost_tokens: list[int],
                 trace_dir: str) -> dict:
    cfg = {
        "hidden_dim": H, "profile_trace": list(trace), "profile_policies": list(policies),
        "cost_tokens": list(cost_tokens), "trace_dir": trace_dir, "progress": False
    }
    return measure.traced_pass(measure.RankState(ctx, cfg, HostOps(), ctx.barrier))


def test_traced_pass_over_gloo_has_one_range_per_creation(tmp_path, forked):
    """The real profiler on the CPU: the IPC creator's rank logic with host stand-ins, reduced as on
    the GPU."""
    out = dist.launch(_traced_rank, 2, args=(FIXED, ["floor_0", "floor_2048"], [64, 4096],
                                             str(tmp_path)), backend="gloo", timeout_s=120,
                      collective_timeout_s=30, start_method=forked)
    ev = pd.concat([o["table"] for o in out], ignore_index=True)
    from sglab.core.trace import COLUMNS

    assert list(ev.columns) == COLUMNS + measure.EXTRA_COLUMNS
    r = show.creation_ranges(ev)
    for rank in (0, 1):
        mine = r[r["rank"] == rank]
        for name in ("floor_0", "floor_2048"):
            mgr, _ = wf.simulate(wf.POLICIES[name], FIXED, world_size=2, hidden_dim=H)
            got = mine[mine.variant == name]
            assert list(got.creation) == list(range(mgr.recreations))
            assert list(got.tokens) == [e.max_token_num for e in mgr.events]
            assert list(got.step) == [e.step for e in mgr.events]
        assert list(mine[mine.variant == "cost_sweep"].tokens) == [64, 4096]
    ranges = ev[ev.category == "range"].name.str.replace("phase::", "")
    for sub in ("ipc open lamport", "exchange handles data", "lamport fill", "barrier",
                "destroy old workspace"):
        assert (ranges == sub).any(), sub
    assert (tmp_path / "rank1.trace.json.gz").stat().st_size > 100


def test_reduce_keeps_only_what_is_inside_creations():
    raw = pd.DataFrame(
        [
            ("host", "phase::variant floor_0", "range", 0.0, 100.0),
            ("host", "phase::recreate workspace", "range", 10.0, 20.0),
            ("runtime", "cudaIpcOpenMemHandle", "runtime", 12.0, 5.0),
            ("runtime", "cudaGetDevice", "runtime", 13.0, 0.1),  # trivial query: dropped
            ("stream 7", "phase::recreate workspace", "range", 11.0, 3.0),  # device copy: dropped
            ("runtime", "cudaMalloc", "runtime", 40.0, 5.0),  # between creations: dropped
            ("host", "phase::recreate workspace", "range", 50.0, 20.0),
            ("stream 7", "Memset (Device)", "memset", 55.0, 1.0),
            ("host", "phase::variant cost_sweep", "range", 200.0, 50.0),
            ("host", "phase::create workspace", "range", 210.0, 10.0),
            ("runtime", "cudaMalloc", "runtime", 211.0, 1.0),
        ],
        columns=["lane", "name", "category", "start_us", "dur_us"]).assign(phase="")
    out = measure.reduce_events(raw, {"floor_0": [(0, 48), (21, 64)], "cost_sweep": [(-1, 4096)]},
                                rank=1)
    assert list(out.name) == [
        "phase::recreate workspace", "cudaIpcOpenMemHandle", "phase::recreate workspace",
        "Memset (Device)", "phase::create workspace", "cudaMalloc"
    ]
    assert list(out.creation) == [0, 0, 1, 1, 0, 0]
    assert list(out.step) == [0, 0, 21, 21, -1, -1]
    assert list(out.tokens) == [48, 48, 64, 64, 4096, 4096]
    assert set(out["rank"]) == {1} and list(out.variant[:4]) == ["floor_0"] * 4


def test_the_trace_summary_counts_steps_as_whole_numbers():
    """A kind a trace lacks (short_ramp has no chunked prefill) reads 0 steps, and every step
    count is an integer column (it printed 261.0 and 0.0)."""
    s = traces.summary()
    steps = [c for c in s.columns if c.endswith("steps")]
    assert all(str(s[c].dtype) == "int64" for c in steps), s.dtypes
    assert s.loc["short_ramp", "chunked_prefill steps"] == 0
    assert (s[[c for c in steps if c != "steps"]].sum(axis=1) == s["steps"]).all()


def test_the_leak_rows_of_a_rank_and_of_the_parent(monkeypatch):
    """The GPU path's leak rows, with host stand-ins: what the rank holds above its baseline (device
    memory and NVML, own GPU and others), then the rank processes left and their memory."""
    from types import SimpleNamespace

    ctx = SimpleNamespace(rank=1, world_size=2, device=SimpleNamespace(index=1))
    st = measure.RankState(ctx, {"progress": False}, HostOps(), lambda: None)
    st.base_free, st.base_nvml = st.ops.free_bytes(), {1: 500.0}
    monkeypatch.setattr(measure, "_nvml_rank_mib", lambda pid: {1: 502.0, 0: 3.0})
    measure._leak_rows(st)
    got = {r["metric"]: r["value"] for r in st.rows}
    assert got == {
        "rank_mem_delta_cudart": 0.0, "rank_mem_delta_nvml": 2.0, "rank_nvml_other_gpus_end": 3.0
    }
    assert {(r["variant"], r["rank"], r["source"], r["unit"])
            for r in st.rows} == {("leak_check", 1, "gpu", "MiB")}
    monkeypatch.setattr(measure.memory, "process_gpu_memory",
                        lambda pids: pd.DataFrame({"used_mib": [0.0]}))
    rows = measure._parent_leak_rows([2**22 + 7], 2)  # no such process
    assert [(r["metric"], r["value"], r["unit"]) for r in rows
            ] == [("rank_processes_left", 0, "count"), ("gpu_mem_of_rank_pids_after", 0.0, "MiB")]
