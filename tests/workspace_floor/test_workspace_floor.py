"""CPU tests: the PR-era re-create rules on a fake creator, FlashInfer's sizes, the stored traces, and the
IPC creator's rank logic over gloo."""

import pandas as pd
import pytest

from sglab.experiments import workspace_floor as exp
from sglab.fixes import workspace_floor as wf

H = 7168
MiB = 2**20
FIXED = [1, 2, 1, 4, 3, 300, 2048, 2049, 100, 4096, 5000]


def test_flashinfer_sizes():
    s = wf.workspace_sizes(4, 2048, H)
    assert s["buffer_size"] == 4 * 2048 * H * 2 == 117_440_512
    assert s["flag_size"] == 4 * 256 * 4
    assert s["lamport_buffer_size"] == 3 * 4 * 2048 * H * 2
    assert s["aligned"] == [112 * MiB, 2 * MiB, 336 * MiB]
    assert wf.workspace_bytes_per_rank(4, 2048, H) == 450 * MiB
    assert wf.workspace_bytes_per_rank(2, 2048, H) == 226 * MiB
    assert wf.workspace_bytes_per_rank(2, 1, H) == 3 * 2 * MiB  # every buffer rounds up to 2 MiB
    big = wf.workspace_sizes(8, 65536, H)
    assert big["lamport_comm_size"] == wf.MAX_COMM_SIZE  # capped as upstream


@pytest.mark.parametrize("name,sizes,refused", [
    ("floor_0", [1, 2, 4, 300, 2048, 2049, 4096, 5000], 0),
    ("shape_no_hwm", [1, 2, 4, 300, 2048, 2049, 4096, 5000], 0),
    ("floor_512", [512, 2048, 2049, 4096, 5000], 0),
    ("floor_1024", [1024, 2048, 2049, 4096, 5000], 0),
    ("floor_2048", [2048, 2049, 4096, 5000], 0),
    ("floor_4096", [4096, 5000], 0),
    ("before_pr", [2048], 3),  # 2049, 4096, 5000 trip the callee's assert
])
def test_recreations_per_policy_on_fixed_trace(name, sizes, refused):
    mgr, n_refused = wf.simulate(wf.POLICIES[name], FIXED, world_size=2, hidden_dim=H)
    assert [e.max_token_num for e in mgr.events] == sizes
    assert mgr.recreations == len(sizes) == mgr.creator.created
    assert n_refused == refused
    # the previous workspace is destroyed before the next is created: one alive at a time
    assert mgr.creator.destroyed == len(sizes) - 1
    assert mgr.creator.peak_live_bytes == wf.workspace_bytes_per_rank(2, sizes[-1], H)
    assert mgr.peak_bytes_per_rank == wf.workspace_bytes_per_rank(2, max(sizes), H)


def test_pre_initialize_absorbs_small_records():
    mgr, _ = wf.simulate(wf.POLICIES["floor_0"], FIXED, world_size=2, hidden_dim=H, pre_initialize=2048)
    assert [(e.step, e.max_token_num) for e in mgr.events] == [(-1, 2048), (7, 2049), (9, 4096), (10, 5000)]


def test_reasons_and_will_recreate_agree():
    pol = wf.POLICIES["floor_0"]
    mgr = wf.WorkspaceManager(wf.FakeCreator(), clock=lambda: 0.0)
    for i, t in enumerate(FIXED):
        mgr.step = i
        before = mgr.recreations
        predicted = wf.will_recreate(mgr, pol, t, 2, 0, H)
        wf.fused_norm_call(mgr, pol, t, world_size=2, rank=0, hidden_dim=H)
        assert predicted == (mgr.recreations > before)
    assert [e.reason for e in mgr.events] == ["uninitialised"] + ["too small"] * 7


def test_world_rank_group_rules():
    pol = wf.POLICIES["floor_2048"]
    mgr = wf.WorkspaceManager(wf.FakeCreator(), clock=lambda: 0.0)
    g1, g2 = object(), object()
    wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H, group=g1)
    assert mgr.recreations == 1
    wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H, group=g1)
    assert mgr.recreations == 1
    # a new group with a big enough buffer: initialize() reuses it (upstream early return)
    wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H, group=g2)
    assert mgr.recreations == 1
    # a different world size always re-creates
    wf.fused_norm_call(mgr, pol, 10, world_size=4, rank=0, hidden_dim=H, group=g2)
    assert mgr.recreations == 2 and mgr.events[-1].reason == "world/rank changed"
    assert mgr.world_size == 4 and mgr.max_token_num == 2048
    # world size 1: no fusion, no workspace
    assert wf.fused_norm_call(mgr, pol, 10, world_size=1, rank=0, hidden_dim=H) is False


def test_high_water_mark_only_matters_after_a_cleanup():
    for hwm, expected in ((True, 4096), (False, 10)):
        mgr = wf.WorkspaceManager(wf.FakeCreator(), high_water=hwm, clock=lambda: 0.0)
        pol = wf.Policy("p", 0, high_water=hwm)
        wf.fused_norm_call(mgr, pol, 4096, world_size=2, rank=0, hidden_dim=H)
        mgr.cleanup()
        wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H)
        assert mgr.max_token_num == expected


def test_simulated_counts_on_stored_traces():
    rows = pd.DataFrame(exp.simulate_rows(world_sizes=[2, 4]))
    rec = rows[rows.metric == "recreations"].set_index(["trace", "world_size", "scenario", "variant"])["value"]
    for W in (2, 4):
        assert rec["mixed", W, "cold", "floor_0"] == 2
        assert rec["mixed", W, "cold", "floor_2048"] == 2
        assert rec["mixed", W, "cold", "floor_4096"] == 1
        assert rec["short_ramp", W, "cold", "floor_0"] == 9
        assert rec["short_ramp", W, "cold", "shape_no_hwm"] == 9
        assert rec["short_ramp", W, "cold", "floor_512"] == 1
        assert rec["short_ramp", W, "cold", "floor_2048"] == 1
        assert rec["short_ramp", W, "preinit_2048", "floor_0"] == 0
    peak = rows[rows.metric == "peak_workspace"].set_index(["trace", "world_size", "scenario", "variant"])["value"]
    assert peak["short_ramp", 4, "cold", "floor_2048"] == 450
    assert peak["short_ramp", 2, "cold", "floor_2048"] == 226
    ref = rows[rows.metric == "refused_calls"].set_index(["trace", "world_size", "scenario", "variant"])["value"]
    assert ref["mixed", 2, "cold", "before_pr"] == 385


@pytest.mark.parametrize("name", list(exp.TRACES))
def test_trace_is_stored_and_regenerates_identically(name, tmp_path):
    df, meta = exp.load_trace(name)  # raises if the stored CSV differs from a fresh generation
    assert len(df) == meta["rows"] == exp.TRACE_PARAMS["steps"]
    assert meta["params"] == exp.trace_params(name)
    assert exp.generate_trace(**meta["params"]).equals(exp.generate_trace(**meta["params"]))
    exp.write_trace(name, tmp_path)
    assert (tmp_path / f"workspace_floor_{name}.csv").read_bytes() == \
        (exp.TRACE_DIR / f"workspace_floor_{name}.csv").read_bytes()
    assert df.tokens.max() <= exp.TRACE_PARAMS["chunked_prefill_size"]
    padded = df[df.kind != "decode"]
    assert set(padded.tokens) <= set(exp.pcg_buckets(4096))
    assert (df.tokens >= df.tokens_raw).all()


def test_trace_seed_changes_trace():
    a = exp.generate_trace(**{**exp.trace_params("mixed"), "steps": 300})
    b = exp.generate_trace(**{**exp.trace_params("mixed"), "steps": 300, "seed": 7})
    assert not a.tokens.equals(b.tokens)


def test_ipc_creator_rank_logic_over_gloo():
    from sglab.core import dist

    out = dist.launch(exp.gloo_rank_selftest, 2, args=("floor_0", FIXED, H), backend="gloo", timeout_s=120,
                      collective_timeout_s=30)
    for r in out:
        assert r["sizes"] == [1, 2, 4, 300, 2048, 2049, 4096, 5000]
        assert r["live_before_cleanup"] == 4  # three buffers + the flag word of the current workspace
        assert r["opened_before_cleanup"] == 3  # the peer's three buffers
        assert r["live_after"] == 0 and r["opened_after"] == 0
        assert r["fills"] == 8  # one Lamport fill per creation


def test_headline_from_recorded_runs():
    """The README line, checked against numbers read straight from the committed CSVs."""
    import json

    from sglab.core import runs

    folder = exp.TRACE_DIR.parent / "recorded" / "workspace_floor"
    newest = {}
    for csv in sorted(folder.glob("*.csv")):
        m = json.loads(csv.with_suffix(".json").read_text())
        W = m["params"]["world_size"]
        if W not in newest or m["created_utc"] > newest[W][0]:
            newest[W] = (m["created_utc"], csv)
    assert sorted(newest) == [2, 4]
    assert newest[2][1].name.startswith("20261123T110646Z")  # method 2 (traced), the newest world-2 run

    def gpu_value(W, trace, variant, metric):
        d = pd.read_csv(newest[W][1])
        d = d[(d.source == "gpu") & (d.trace == trace) & (d.variant == variant) & (d.metric == metric)]
        assert len(d) == W  # one row per rank
        return d.value.max()  # slowest rank

    from sglab.core import claims

    h = claims.headline("workspace_floor", claims.shown("workspace_floor", runs.load_all_recorded("workspace_floor")))
    ms = lambda t, p: "/".join(f"{gpu_value(W, t, p, 'recreate_time_total'):.0f}" for W in (2, 4))
    assert "H200, TP 2/4" in h
    assert gpu_value(2, "short_ramp", "floor_0", "recreations") == gpu_value(4, "short_ramp", "floor_0", "recreations") == 9
    assert f"`x.shape[0]` re-creates the workspace 9× ({ms('short_ramp', 'floor_0')} ms)" in h
    assert ms("short_ramp", "floor_0") == "74/238"
    assert gpu_value(4, "short_ramp", "floor_2048", "recreations") == 1
    assert f"`max(x.shape[0], 2048)` 1× ({ms('short_ramp', 'floor_2048')} ms) at 226/450 MiB/rank" in h
    assert ms("short_ramp", "floor_2048") == "7/23"
    assert "(floor 512: 1×, 58/114 MiB)" in h
    assert gpu_value(2, "mixed", "floor_2048", "recreations") == 2
    assert f"both re-create 2× ({ms('mixed', 'floor_2048')} ms)" in h and ms("mixed", "floor_2048") == "16/132"
    assert gpu_value(4, "mixed", "before_pr", "refused_calls") == 385 and "the 385 calls over 2048" in h
    assert "|" not in h and len(h) < 360


# --------------------------------------------------------------------------------------------- the traced pass
def test_traced_pass_over_gloo_has_one_range_per_creation(tmp_path):
    """The real profiler on the CPU: the IPC creator's rank logic with host stand-ins, reduced as on the GPU."""
    from sglab.core import dist

    out = dist.launch(exp.profile.gloo_profile_selftest, 2, args=(FIXED, ["floor_0", "floor_2048"], [64, 4096],
                                                                 str(tmp_path)),
                      backend="gloo", timeout_s=120, collective_timeout_s=30)
    ev = pd.concat([o["table"] for o in out], ignore_index=True)
    assert list(ev.columns) == exp.profile.COLUMNS_OUT
    r = exp.analysis.creation_ranges(ev)
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
    for sub in ("ipc open lamport", "exchange handles data", "lamport fill", "barrier", "destroy old workspace"):
        assert (ranges == sub).any(), sub
    assert (tmp_path / "rank1.trace.json.gz").stat().st_size > 100


def test_reduce_keeps_only_what_is_inside_creations():
    raw = pd.DataFrame([
        ("host", "phase::variant floor_0", "range", 0.0, 100.0),
        ("host", "phase::recreate workspace", "range", 10.0, 20.0),
        ("runtime", "cudaIpcOpenMemHandle", "runtime", 12.0, 5.0),
        ("runtime", "cudaGetDevice", "runtime", 13.0, 0.1),  # trivial query: dropped
        ("stream 7", "phase::recreate workspace", "range", 11.0, 3.0),  # device copy of a range: dropped
        ("runtime", "cudaMalloc", "runtime", 40.0, 5.0),  # between creations: dropped
        ("host", "phase::recreate workspace", "range", 50.0, 20.0),
        ("stream 7", "Memset (Device)", "memset", 55.0, 1.0),
        ("host", "phase::variant cost_sweep", "range", 200.0, 50.0),
        ("host", "phase::create workspace", "range", 210.0, 10.0),
        ("runtime", "cudaMalloc", "runtime", 211.0, 1.0),
    ], columns=["lane", "name", "category", "start_us", "dur_us"]).assign(phase="")
    out = exp.profile.reduce_events(raw, {"floor_0": [(0, 48), (21, 64)], "cost_sweep": [(-1, 4096)]}, rank=1)
    assert list(out.name) == ["phase::recreate workspace", "cudaIpcOpenMemHandle", "phase::recreate workspace",
                              "Memset (Device)", "phase::create workspace", "cudaMalloc"]
    assert list(out.creation) == [0, 0, 1, 1, 0, 0]
    assert list(out.step) == [0, 0, 21, 21, -1, -1] and list(out.tokens) == [48, 48, 64, 64, 4096, 4096]
    assert set(out["rank"]) == {1} and list(out.variant[:4]) == ["floor_0"] * 4


def test_trace_tables_and_sentences_on_a_made_up_trace():
    from tests.workspace_floor import wsfloor_events

    from sglab.experiments.workspace_floor import text

    ev = wsfloor_events.events()
    t = exp.analysis.trace_recreation_table(ev)
    assert list(t.index) == ["floor_0", "floor_2048"]
    assert (t.ranges_min == t.ranges_max).all() and list(t.ranges_max) == [9, 1]
    calls = exp.analysis.ipc_calls_per_creation(ev)
    assert (calls["ipc get handle"] == 3).all() and (calls["ipc open"] == 3).all() and len(calls) == 2 * 12
    ob = exp.analysis.open_by_buffer(ev)
    assert ob.loc[8192, "lamport"] == pytest.approx(17.0) and ob.loc[4096, "lamport"] == pytest.approx(0.12)
    ct = exp.analysis.call_table(ev, rank=0)
    assert ct.loc[("floor_0", "ipc open", "cudaIpcOpenMemHandle"), "per creation"] == 3
    lines = text.trace_step(ev, world_size=2, hidden_dim=H)
    assert "T=4096 (Lamport 336 MiB)" in lines[0] and "T=8192 (672 MiB)" in lines[0]
    assert "largest growth: 'ipc open lamport'" in lines[1]
    assert "data buffer" in text.first_open(ev) and "2.00 ms" in text.first_open(ev)


def test_figures_draw_from_tables_and_recorded_runs():
    import matplotlib.pyplot as plt
    from tests.workspace_floor import wsfloor_events

    from sglab.core import runs

    recorded = runs.load_all_recorded("workspace_floor")
    shown = exp.claims.shown(recorded)
    fig = exp.figures.mechanism(shown)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(lab.startswith("x.shape[0]: 9 re-creations") and "ms" in lab for lab in labels)
    assert any(lab.startswith("max(x.shape[0], 2048) — the PR: 1 re-creation,") for lab in labels)
    plt.close(fig)
    fig = exp.figures.mechanism([])  # no GPU run: counts and sizes from the simulation alone
    assert not any("ms" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    plt.close(fig)
    ev = wsfloor_events.events()
    fig = exp.figures.profile_overview(ev)
    notes = [t.get_text() for t in fig.axes[0].texts if "IPC handle open" in t.get_text()]
    assert any("IPC handle open: 27" in n for n in notes) and any("IPC handle open: 3" in n for n in notes)
    plt.close(fig)
    plt.close(exp.figures.profile_step(ev, world_size=2, hidden_dim=H))
    by_w = exp.analysis.newest_per_world(shown)
    for f in (exp.figures.cost(recorded, by_w), exp.figures.gpu_tradeoff(by_w),
              exp.figures.gpu_events(by_w, "short_ramp")):
        plt.close(f)
