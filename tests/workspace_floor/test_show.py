"""The tables, sentences and figures of notebook 02 on recorded and made-up data, and its GPU
sections on recorded runs and on a NoRun (CPU). Your own traffic: ``test_traffic.py``."""

import warnings

import matplotlib
import matplotlib.pyplot as plt
import pytest

from sglab.core import runs
from sglab.workspace_floor import claims, show

from tests.workspace_floor import wsfloor_events


matplotlib.use("Agg")
H = 7168


def _recorded() -> runs.RunSet:
    """The runs as the notebook has them: the newest of each world size."""
    return runs.RunSet(claims.shown(runs.load_all_recorded("workspace_floor")),
                       experiment="workspace_floor")


# -- the profiler trace
# ---------------------------------------------------------------------------------------
def test_trace_tables_and_sentences_on_a_made_up_trace():
    ev = wsfloor_events.events()
    t = show.trace_recreation_table(ev)
    assert list(t.index) == ["floor_0", "floor_2048"]
    assert (t.ranges_min == t.ranges_max).all() and list(t.ranges_max) == [9, 1]
    calls = show.ipc_calls_per_creation(ev)
    assert (calls["ipc get handle"] == 3).all() and (calls["ipc open"] == 3).all()
    assert len(calls) == 2 * 12
    ob = show.open_by_buffer(ev)
    assert ob.loc[8192, "lamport"] == pytest.approx(17.0)
    assert ob.loc[4096, "lamport"] == pytest.approx(0.12)
    ct = show.call_table(ev, rank=0)
    assert ct.loc[("floor_0", "ipc open", "cudaIpcOpenMemHandle"), "per creation"] == 3
    lines = show.trace_step(ev, world_size=2, hidden_dim=H)
    assert "T=4096 (Lamport 336 MiB)" in lines[0] and "T=8192 (672 MiB)" in lines[0]
    assert "largest growth: 'ipc open lamport'" in lines[1]
    assert "data buffer" in show.first_open(ev) and "2.00 ms" in show.first_open(ev)


def test_profile_figures_on_a_made_up_trace():
    ev = wsfloor_events.events()
    fig = show.profile_overview(ev)
    notes = [t.get_text() for t in fig.axes[0].texts if "IPC handle open" in t.get_text()]
    assert any("IPC handle open: 27" in n for n in notes)
    assert any("IPC handle open: 3" in n for n in notes)
    plt.close(fig)
    plt.close(show.profile_step(ev, world_size=2, hidden_dim=H))


# -- figures and sections of the recorded runs
# ------------------------------------------------------------------------
def test_mechanism_names_the_draft_the_released_call_and_the_merged_floor():
    """The picture sets the merged floor against the draft and the released call, each under its
    one name, with its creations cold and after SGLang's pre-initialisation; the GPU run adds ms."""
    fig = show.mechanism(_recorded().first)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(
        lab.startswith("draft x.shape[0]: 9 creations cold, 0 pre-initialised") and "ms" in lab
        for lab in labels)
    assert any(
        lab.startswith("merged floor 2048: 1 creation cold, 0 pre-initialised") for lab in labels)
    assert any(lab.startswith("released before: 1 creation cold") for lab in labels)
    plt.close(fig)
    fig = show.mechanism(runs.NoRun("workspace_floor", "none"))  # counts from the simulation
    assert not any("ms" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    plt.close(fig)


def test_cost_figure_draws_each_shown_run(capsys):
    run = _recorded()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = show.cost_figure(run.shown)
    ax_create, ax_open = fig.axes[:2]
    assert len(ax_open.get_lines()) == len(ax_create.containers) == len(run.shown) == 2
    assert [t.get_text() for t in ax_open.get_legend().get_texts()] == ["W=2", "W=4"]
    plt.close(fig)
    assert not [str(w.message) for w in caught]
    assert capsys.readouterr().err == ""


def test_gpu_sections_on_the_recorded_runs(capsys):
    run = _recorded()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for section in (show.replay, show.cost, show.profiler):
            section(run)
    out = capsys.readouterr()
    assert "GPU re-creations and sizes == simulation in 14 (trace, policy) cells: yes" in out.out
    assert "measured − computed peak per rank: 2 MiB" in out.out and "[2.0]" not in out.out
    assert "largest growth: 'ipc open lamport'" in out.out
    assert "W=2, rank 0: Perfetto trace: data/recorded/workspace_floor/" in out.out  # relative
    # re-creations and refused calls are counts: `1`, `385`, never `1.0`; policies by their names
    mixed = next(
        ln for ln in out.out.splitlines() if ln.split()[:3] == ["mixed", "released", "before"])
    assert mixed.split()[3] == "1" and mixed.split()[-1] == "385"
    assert out.err == "" and not [str(w.message) for w in caught]
    assert not plt.get_fignums()  # every figure shown once and closed


def test_the_replay_table_names_each_columns_unit_and_says_what_recreate_time_is(capsys):
    """Its times in ms and sizes in MiB, as the run recorded them, in the shown column names (the
    recorded metric names stay); the line under it says what recreate_time_total adds."""
    for r in _recorded().shown:
        t = show.replay_table(r)
        assert list(t.columns) == [
            "recreations", "create_time_median (ms)", "create_time_total (ms)",
            "recreate_time_total (ms)", "peak_workspace (MiB)", "peak_workspace_measured (MiB)",
            "refused_calls"
        ]
        d = r.df[r.df.metric.isin(["recreate_time_total", "peak_workspace"])]
        assert set(d.unit) == {"ms", "MiB"}
        raw = show.policy_stats(r)
        assert (t["recreate_time_total (ms)"].to_numpy() == raw.recreate_time_total.round(
            1).to_numpy()).all()
    show.replay(_recorded())
    assert "recreate_time_total: every creation plus destroying" in capsys.readouterr().out


def test_gpu_sections_print_the_no_run_line(capsys):
    no = runs.NoRun("workspace_floor", "no recorded run here")
    for section in (show.replay, show.cost, show.profiler):
        assert section(no) is None
    assert capsys.readouterr().out.count("no GPU run to show (no recorded run here)") == 3


def test_simulation_section_draws_and_closes():
    show.simulation()
    assert not plt.get_fignums()
