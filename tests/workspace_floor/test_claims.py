"""workspace_floor claims: every committed run verifies; damaged copies fail, naming the right
claim; the trace checks on a method-2 run with a (made-up) events sidecar hold and fail as they
should; the headline is read off the committed CSVs."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sglab.tools import cli
from sglab.core import runs
from sglab.core import claims as engine
from sglab.workspace_floor import claims, measure

from tests.edits import all_claims
from tests.workspace_floor import wsfloor_events


RECORDED = runs.repo_root() / "data" / "recorded" / "workspace_floor"
W2 = "20261121T222715Z_nvidia-h200-x2"
W4 = "20261127T162853Z_nvidia-h200-x4"


def _copy(tmp_path, stem=W2) -> Path:
    for f in RECORDED.glob(f"{stem}.*"):  # the run with its sidecars
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / f"{stem}.csv"


def _rewrite(path: Path, df: pd.DataFrame, **manifest):
    df.to_csv(path, index=False)
    m = json.loads(path.with_suffix(".json").read_text())
    m.update(rows=len(df), **manifest)
    path.with_suffix(".json").write_text(json.dumps(m))


def _verify(capsys, path) -> tuple[int, str]:
    code = cli.main(["verify", str(path)])
    return code, capsys.readouterr().out


def test_every_recorded_run_verifies(capsys):
    assert cli.main(["verify", "workspace_floor"]) == 0
    out = capsys.readouterr().out
    assert "4 run(s): 4 hold, 0 fail" in out
    assert "needs a 4-rank run (this run has 2)" in out  # the TP-4 claim says why it is n/a


def _gpu(df, trace, variant, metric, rank=None):
    sel = ((df.source == "gpu") & (df.trace == trace) & (df.variant == variant)
           & (df.metric == metric))
    return sel & (df["rank"] == rank) if rank is not None else sel


@pytest.mark.parametrize("where, delta, claim", [
    (lambda d: _gpu(d, "short_ramp", "floor_0", "recreations", 1), -1,
     "gpu_counts_equal_simulation"),
    (lambda d: _gpu(d, "short_ramp", "floor_2048", "peak_workspace_measured", 0), 4,
     "peak_memory_as_computed"),
    (lambda d: _gpu(d, "mixed", "floor_512", "mem_after_cleanup", 1), 2, "memory_back_to_baseline"),
    (lambda d: _gpu(d, "mixed", "before_pr", "refused_calls", 0), -1,
     "before_pr_refuses_over_2048"),
    (lambda d: d.metric == "rank_processes_left", 1, "no_rank_left"),
    (lambda d: _gpu(d, "short_ramp", "floor_2048", "recreate_time_total"), 500,
     "floor_saves_recreation_time"),
])
def test_damaged_copy_fails_naming_the_claim(tmp_path, capsys, where, delta, claim):
    path = _copy(tmp_path)
    df = pd.read_csv(path)
    assert where(df).sum() >= 1
    df.loc[where(df), "value"] += delta
    _rewrite(path, df)
    code, out = _verify(capsys, path)
    assert code == 1 and f"FAIL workspace_floor.{claim}" in out


def test_dropped_rank_and_dropped_variant_fail(tmp_path, capsys):
    path = _copy(tmp_path)
    df = pd.read_csv(path)
    _rewrite(path, df[df["rank"] != 1])
    code, out = _verify(capsys, path)
    assert code == 1 and "FAIL workspace_floor.gpu_counts_equal_simulation" in out
    assert "rank(s) [1]" in out
    path = _copy(tmp_path)
    _rewrite(path, df[~((df.source == "gpu") & (df.variant == "floor_2048"))])
    code, out = _verify(capsys, path)
    assert code == 1 and "FAIL workspace_floor.gpu_counts_equal_simulation" in out


def test_stored_simulation_must_reproduce(tmp_path, capsys):
    path = _copy(tmp_path)
    df = pd.read_csv(path)
    sel = (df.source == "simulated") & (df.metric == "recreations") & (df.variant == "floor_512")
    df.loc[sel & (df.trace == "short_ramp") & (df.scenario == "cold"), "value"] = 2
    _rewrite(path, df)
    code, out = _verify(capsys, path)
    assert code == 1 and "FAIL workspace_floor.simulation_reproduced" in out


def test_tp4_claim_holds_on_the_4_rank_run_and_fails_when_memory_differs(tmp_path, capsys):
    path = _copy(tmp_path, W4)
    code, out = _verify(capsys, path)
    assert code == 0 and "pass  workspace_floor.tp4_pr_workspace_450mib" in out
    df = pd.read_csv(path)
    df.loc[_gpu(df, "short_ramp", "floor_2048", "peak_workspace_measured", 3), "value"] = 460
    _rewrite(path, df)
    code, out = _verify(capsys, path)
    assert code == 1 and "FAIL workspace_floor.tp4_pr_workspace_450mib" in out


# -- trace checks
# -------------------------------------------------------------------------------------------
def _method2(tmp_path, events) -> Path:
    """The 2-rank recorded run as a method-2 run with an events sidecar."""
    path = _copy(tmp_path)
    m = json.loads(path.with_suffix(".json").read_text())
    m["method_version"] = 2
    m["params"] = {**measure.DEFAULT_PARAMS, **m["params"], "profile": True}
    side = path.with_name(f"{path.stem}.events.csv.gz")
    events.to_csv(side, index=False)
    m["sidecars"] = {"events": side.name}
    path.with_suffix(".json").write_text(json.dumps(m))
    return path


def test_trace_claims_hold_on_a_matching_trace(tmp_path, capsys):
    code, out = _verify(capsys, _method2(tmp_path, wsfloor_events.events()))
    assert code == 0, out
    for cid in ("trace_ranges_equal_simulation", "trace_ipc_calls_per_creation",
                "trace_time_in_recreation"):
        assert f"pass  └ workspace_floor.{cid}" in out


@pytest.mark.parametrize(
    "events, claim",
    [
        (wsfloor_events.events(counts={"floor_0": 8, "floor_2048": 1}),
         "trace_ranges_equal_simulation"),
        (wsfloor_events.events(ranks=[0]), "trace_ranges_equal_simulation"),
        # 2 opens per buffer: not W=2's one
        (wsfloor_events.events(world_size=3), "trace_ipc_calls_per_creation"),
        (wsfloor_events.events(counts={"floor_0": 9, "floor_2048": 1}).pipe(
            lambda e: e.assign(dur_us=e.dur_us.where(e.variant != "floor_2048", e.dur_us * 100))),
         "trace_time_in_recreation"),
    ])
def test_damaged_trace_fails_naming_the_claim(tmp_path, capsys, events, claim):
    code, out = _verify(capsys, _method2(tmp_path, events))
    assert code == 1 and f"FAIL workspace_floor.{claim}" in out


def test_method_2_run_without_events_says_why(tmp_path, capsys):
    path = _method2(tmp_path, wsfloor_events.events())
    m = json.loads(path.with_suffix(".json").read_text())
    del m["sidecars"]
    path.with_suffix(".json").write_text(json.dumps(m))
    code, out = _verify(capsys, path)
    assert code == 0 and "the run has no profiler events" in out


TRACED = "20261123T110646Z_nvidia-h200-x2"


def test_recorded_trace_loses_a_range(tmp_path, capsys):
    """The committed traced run with one 'recreate workspace' range of rank 1 removed from its
    events."""
    for f in RECORDED.glob(f"{TRACED}*"):
        shutil.copy(f, tmp_path / f.name)
    path = tmp_path / f"{TRACED}.csv"
    code, out = _verify(capsys, path)
    assert code == 0 and "pass  └ workspace_floor.trace_ranges_equal_simulation" in out
    side = tmp_path / f"{TRACED}.events.csv.gz"
    ev = pd.read_csv(side)
    gone = ev[(ev.name == "phase::recreate workspace") & (ev.variant == "floor_0")
              & (ev["rank"] == 1)].index[-1]
    ev.drop(index=gone).to_csv(side, index=False)
    code, out = _verify(capsys, path)
    assert code == 1 and "FAIL workspace_floor.trace_ranges_equal_simulation" in out
    assert "draft x.shape[0] rank 1: 8" in out


# -- the claims and the headline
# ----------------------------------------------------------------------------
def test_claim_structure():
    assert len(claims.CLAIMS) <= 5
    ids = [c.id for c in all_claims(claims)]
    assert len(ids) == len(set(ids)) == 12


def test_headline_from_recorded_runs():
    """The README line, checked against numbers read straight from the committed CSVs."""
    newest = {}
    for csv in sorted(RECORDED.glob("*.csv")):
        m = json.loads(csv.with_suffix(".json").read_text())
        W = m["params"]["world_size"]
        if W not in newest or m["created_utc"] > newest[W][0]:
            newest[W] = (m["created_utc"], csv)
    assert sorted(newest) == [2, 4]
    assert newest[2][1].name.startswith(TRACED)  # method 2 (traced), the newest world-2 run

    def gpu(W, trace, variant, metric):
        d = pd.read_csv(newest[W][1])
        d = d[(d.source == "gpu") & (d.trace == trace) & (d.variant == variant)
              & (d.metric == metric)]
        assert len(d) == W  # one row per rank
        return d.value.max()  # slowest rank

    def span(t, p, metric="recreate_time_total"):
        return "–".join(f"{gpu(W, t, p, metric):.0f}" for W in (2, 4))

    shown = claims.shown(runs.load_all_recorded("workspace_floor"))
    h = engine.headline(claims, shown)
    assert "(H200 TP 2, H200 TP 4; slowest rank)" in h
    assert gpu(2, "short_ramp", "floor_0", "recreations") == 9
    assert gpu(4, "short_ramp", "floor_0", "recreations") == 9
    assert (f"the draft x.shape[0] re-creates the workspace 9× "
            f"({span('short_ramp', 'floor_0')} ms)") in h
    assert span("short_ramp", "floor_0") == "74–224"
    assert gpu(4, "short_ramp", "floor_2048", "recreations") == 1
    assert (f"the merged floor 2048 1× ({span('short_ramp', 'floor_2048')} ms) at "
            f"{span('short_ramp', 'floor_2048', 'peak_workspace')} MiB/rank") in h
    assert span("short_ramp", "floor_2048") == "7–23" and "226–450 MiB/rank" in h
    assert "(floor 512: 1×, 58–114 MiB)" in h
    assert gpu(2, "mixed", "floor_2048", "recreations") == 2
    # each call site's own range of times, named
    assert (f"both re-create 2× (draft {span('mixed', 'floor_0')} ms, floor "
            f"{span('mixed', 'floor_2048')} ms)") in h
    assert span("mixed", "floor_0") == "13–131" and span("mixed", "floor_2048") == "16–134"
    assert gpu(4, "mixed", "before_pr", "refused_calls") == 385
    assert "with the released before, the assert refuses the 385 calls over 2048 tokens" in h
    assert "|" not in h and len(h) < 380


def test_the_card_gives_the_engines_answer_first_and_says_which_before_is_which():
    """The card leads with the engine (the pre-initialisation leaves the floor nothing to do), then
    the rebuild's cold start; the PR's side names the merged line, the first draft and the released
    call, each beside numbers filled from the claims' values."""
    from sglab.core import card, notebook
    from sglab.workspace_floor import sglang

    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    engine_runs = sglang.FIX.recorded_engine()
    p = card.parts(claims.CARD, sglang.FIX, claims, run, engine_runs)
    md = card.markdown(p)
    assert md.index("Real SGLang engine") < md.index("The rebuild")
    calls = sum(f["calls"] for f in sglang.engine_facts_of(engine_runs.shown))
    assert "the floor changes nothing" in p["engine"] and f"0 in {calls} generate calls" in p[
        "engine"]
    assert "released before, merged floor 2048 and draft x.shape[0] (no hwm) alike" in p["engine"]
    said = [pr.split("`")[1] for pr, _ in p["found"]]
    assert said == [
        "max_token_num=max(x.shape[0], 2048)", "max_token_num=x.shape[0]", "max_token_num"
    ]
    assert "never released" in p["found"][1][0] and "9× on the short-prompt cold start" in p[
        "found"][1][1]
    assert "refuse 385 calls of the mixed trace" in p["found"][2][1]


def test_each_policy_has_one_name_in_the_claims_and_the_headline():
    from sglab.workspace_floor import rebuild

    shown = claims.shown(runs.load_all_recorded("workspace_floor"))
    said = " ".join([claims.CLAIM, engine.headline(claims, shown)] +
                    [c.statement + " " + c.expected
                     for c in all_claims(claims)] + [c.statement for c in claims.ENGINE.CLAIMS])
    # the old names: ids, the bare `x.shape[0]` for the draft, "(the PR)" for the merged line
    assert "floor_0" not in said and "`x.shape[0]` re-creates the" not in said
    assert "(the PR)" not in said and "before the PR" not in said
    for name in ("floor_0", "floor_2048", "before_pr", "shape_no_hwm"):
        assert rebuild.POLICIES[name].label in said, name
