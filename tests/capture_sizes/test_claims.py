"""capture_sizes claims: every committed recorded run verifies; damaged copies fail naming the
claim; a gloo run on the CPU (method 2, with the traced pass) exercises the run and trace claims;
the headline comes from the claims."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sglab.capture_sizes import claims as cc
from sglab.capture_sizes import measure as ex
from sglab.capture_sizes import show
from sglab.core import claims, runs
from sglab.tools import cli, verify


EXP = "capture_sizes"


def _copy(csv: Path, dest: Path) -> Path:
    """A run's CSV, manifest and sidecars copied into ``dest``; returns the copied CSV."""
    for f in csv.parent.glob(csv.stem + "*"):
        shutil.copy(f, dest / f.name)
        (dest / f.name).chmod(0o644)
    return dest / csv.name


def _rewrite(path: Path, df) -> None:
    df.to_csv(path, index=False)
    m = json.loads(path.with_suffix(".json").read_text())
    m["rows"] = len(df)
    path.with_suffix(".json").write_text(json.dumps(m))


def _w2_recorded() -> Path:
    paths = [p for p in runs.list_runs(EXP) if runs.read_run(p).manifest.params["world_size"] == 2]
    assert paths, "a recorded world-size-2 run is committed"
    return paths[-1]


def _verify_fails(path: Path, claim_id: str, capsys) -> None:
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {claim_id} in {path.name}" in out, out


# --------------------------------------------------------------------------------------------------
# committed recorded runs (method 1)
# --------------------------------------------------------------------------------------------------
def test_every_recorded_run_verifies(capsys):
    assert cli.main(["verify", EXP]) == 0
    out = capsys.readouterr().out
    recorded = runs.load_all_recorded(EXP)
    assert f"{len(recorded)} run(s): {len(recorded)} hold, 0 fail" in out
    # the trace claims are n/a on method-1 runs, with why; method 2 runs have every claim
    for run in recorded:
        if run.manifest.method_version >= 2:
            assert all(r.status == "pass" for r in claims.evaluate(cc, run))
            continue
        na = [r for r in claims.evaluate(cc, run) if r.status == "n/a"]
        assert {r.claim.id.split(".")[1]
                for r in na} == {
                    "trace_refused_marked", "trace_refused_no_collective",
                    "trace_capture_launches_nothing"
                }
        assert all("covers method version 2+" in r.outcome.reason for r in na)


def _probe_accepts_3(df):
    i = df.index[(df.variant == "before_probe") & (df["size"] == 3)]
    df.loc[i, ["metric", "error", "stage"]] = ["ok", "", ""]
    return df


def _replay_error(df):
    df.loc[(df.variant == "pr_filter") & (df["size"] == 8) & (df.metric == "replay_max_abs_err"),
           "value"] = 0.5
    return df


def _drop_bucket(df):
    return df[~((df.variant == "round_up") & (df["size"] == 16))]


def _stops_later(df):
    first = (df.variant == "before") & (df.metric == "failed")
    later = (df.variant == "before") & (df["size"] == 3)
    df.loc[first, "size"], df.loc[later, "size"] = 3, 1
    return df


@pytest.mark.parametrize("damage, claim_id", [
    (_probe_accepts_3, "capture_sizes.refused_iff_indivisible"),
    (_probe_accepts_3, "capture_sizes.pr_filter_keeps_accepted"),
    (_replay_error, "capture_sizes.pr_filter_replays_exactly"),
    (_drop_bucket, "capture_sizes.round_up_replays_exactly"),
    (_stops_later, "capture_sizes.before_stops_at_first_bad"),
])
def test_a_damaged_recorded_copy_fails_naming_the_claim(tmp_path, capsys, damage, claim_id):
    path = _copy(_w2_recorded(), tmp_path)
    _rewrite(path, damage(pd.read_csv(path)))
    _verify_fails(path, claim_id, capsys)


def test_a_run_labelled_with_another_world_size_fails(tmp_path, capsys):
    path = _copy(_w2_recorded(), tmp_path)
    m = json.loads(path.with_suffix(".json").read_text())
    m["params"]["world_size"] = 4
    path.with_suffix(".json").write_text(json.dumps(m))
    _verify_fails(path, "capture_sizes.refused_iff_indivisible", capsys)


def test_a_truncated_copy_is_bad_input(tmp_path, capsys):
    path = _copy(_w2_recorded(), tmp_path)
    pd.read_csv(path).iloc[:-5].to_csv(path, index=False)
    assert cli.main(["verify", str(path)]) == 2
    assert "manifest recorded" in capsys.readouterr().err


def test_headline_from_the_runs_shown():
    """Per run shown (newest per GPU model and world size), the numbers recomputed from its CSV."""
    shown = cc.shown(runs.load_all_recorded(EXP))
    assert [(runs.gpu_short(r), r.manifest.params["world_size"]) for r in shown] == [("H200", 2),
                                                                                     ("H200", 4)]
    line = claims.headline(cc, shown)
    assert "|" not in line and len(line) < 400
    for r in shown:
        df, w = r.df, r.manifest.params["world_size"]
        probe = df[(df.variant == "before_probe") & (df.metric == "failed")]
        refused = sorted(probe["size"].astype(int))
        raw = df[df.variant == "before"]["size"].nunique()
        stop = int(df[(df.variant == "before") & (df.metric == "failed")]["size"].iloc[0])
        good = {
            v: int(df[(df.variant == v) & (df.metric == "replay_ok")].value.sum())
            for v in ("pr_filter", "round_up")
        }
        n = {v: df[df.variant == v]["size"].nunique() for v in ("pr_filter", "round_up")}
        assert good == n
        assert (f"H200 TP {w}: refused {', '.join(map(str, refused))} of {raw} sizes, the "
                "unfiltered loop stopped at "
                f"{stop}; PR filter {good['pr_filter']}/{n['pr_filter']} and round-up "
                f"{good['round_up']}/"
                f"{n['round_up']} buckets captured + replayed, max abs err 0") in line
    assert "1, 3, 5, 7 of 42" in line and "2, 6, 10, 14 of 42" in line
    assert line.startswith("On the default list scaled by W/8 (so TP 8's bad sizes recur): H200 TP "
                           "2")


# --------------------------------------------------------------------------------------------------
# a method-2 run on the CPU: two gloo ranks, with the traced pass
# --------------------------------------------------------------------------------------------------
GLOO = {**ex.DEFAULT_PARAMS, "world_size": 2, "backend": "gloo", "hidden": 16, "max_tokens": 128}


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory) -> Path:
    path, _ = runs.measure(lambda: ex.run(GLOO, progress=False), experiment=EXP,
                           method_version=ex.METHOD_VERSION, params=GLOO,
                           root=tmp_path_factory.mktemp("gloo"), gpu_count=2)
    assert set(runs.read_run(path).manifest.sidecars) == {"events", "trace"}
    return path


def test_boundary_on_two_gloo_ranks(gloo_run):
    df = runs.read_run(gloo_run).df
    s = show.summary(df).set_index("variant")
    # before: the runner's warm-up at the smallest size (1 token on 2 ranks) fails, nothing is
    # captured
    assert s.loc["before", "failed"] == 1 and s.loc["before", "first_failure"] == 1
    assert s.loc["before", "captured_or_ok"] == 0
    assert s.loc["before", "not_reached"] == s.loc["before", "sizes"] - 1
    assert "UnequalShards" in s.loc["before", "error"] and "[1, 0]" in s.loc["before", "error"]
    # the probe without the shard check: the collective itself refuses exactly the odd sizes
    probe = df[df.variant == "before_probe"]
    assert sorted(probe.loc[probe.metric == "failed", "size"]) == [1, 3, 5, 7]
    # after: every bucket captured and replayed exactly, including unaligned real token counts
    for v in ("pr_filter", "round_up"):
        assert s.loc[v, "failed"] == 0
        assert s.loc[v, "captured_or_ok"] == s.loc[v, "sizes"] == s.loc[v, "replayed_ok"]
        assert s.loc[v, "worst_replay_err"] <= ex.TOL
    assert set(df.columns) >= {
        "experiment", "variant", "world_size", "size", "metric", "value", "unit"
    }


def test_gloo_trace_marks_every_refused_size_on_every_rank(gloo_run):
    cr = show.capture_ranges(runs.read_run(gloo_run).sidecar("events"))
    for rank in (0, 1):
        before = cr[(cr["rank"] == rank) & (cr.variant == "before")]
        assert sorted(set(before.loc[before.refused, "size"])) == [1, 3, 5, 7]
        # the warm-up at 1 is refused too
        assert before.stage.iloc[0] == "warmup" and bool(before.refused.iloc[0])
        assert not cr[(cr["rank"] == rank) & (cr.variant == "after")].refused.any()
    acc = cr[~cr.refused & (cr.stage == "capture")]
    # two eager runs, no graph on gloo
    assert (acc.reduce_scatters == 2).all() and (acc.all_gathers == 2).all()
    assert (cr[cr.refused][["reduce_scatters", "all_gathers"]] == 0).all().all()


def test_gloo_run_claims(gloo_run):
    res = {r.claim.id: r.outcome for r in claims.evaluate(cc, verify.load_run(gloo_run))}
    na = {k for k, o in res.items() if o.status == "n/a"}
    assert na == {"capture_sizes.trace_capture_launches_nothing"}
    assert "gloo" in res["capture_sizes.trace_capture_launches_nothing"].reason
    assert all(o.status == "pass" for k, o in res.items() if k not in na), {
        k: o.reason
        for k, o in res.items()
    }


def _damage_events(gloo_run: Path, tmp_path: Path, damage) -> Path:
    path = _copy(gloo_run, tmp_path)
    events = runs.read_run(path).sidecar("events")
    target = path.parent / runs.read_run(path).manifest.sidecars["events"]
    with gzip.open(target, "wt") as f:
        damage(events).to_csv(f, index=False)
    return path


def _inject_collective(ev):
    r = ev[(ev["rank"] == 0) & (ev.name == "phase::refused 5")].iloc[0]
    extra = r.copy()
    extra["name"], extra["category"], extra["dur_us"] = "c10d::_reduce_scatter_base_", "op", 0.1
    return pd.concat([ev, extra.to_frame().T], ignore_index=True)


@pytest.mark.parametrize("damage, claim_id", [
    (lambda ev: ev[ev["rank"] != 1], "capture_sizes.trace_refused_marked"),
    (lambda ev: ev[ev.name != "phase::refused 3"], "capture_sizes.trace_refused_marked"),
    (_inject_collective, "capture_sizes.trace_refused_no_collective"),
])
def test_damaged_events_fail_naming_the_claim(gloo_run, tmp_path, capsys, damage, claim_id):
    _verify_fails(_damage_events(gloo_run, tmp_path, damage), claim_id, capsys)


def test_capture_timeline_marks_the_refused_sizes(gloo_run):
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    run = runs.read_run(gloo_run)
    events = run.sidecar("events")
    windows = show.tail_window(events, rank=0)
    assert set(windows) == {"before · rank 0", "after · rank 0"}
    before, marks = windows["before · rank 0"]
    assert sorted(marks.name) == [
        "phase::refused 1", "phase::refused 3", "phase::refused 5", "phase::refused 7"
    ]
    assert set(before.lane) <= {"host", "runtime", "device"}
    fig = show.capture_timeline(events, rank=0, run=run)
    crosses = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in crosses) == 4
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "before · rank 0 · host" in labels and "after · rank 0 · host" in labels
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# a real run with its trace: H200 x2, NCCL, the default parameters (tests/data, a copy without the
# Perfetto file)
# --------------------------------------------------------------------------------------------------
H200_RUN = (
    Path(__file__).resolve().parents[1] / "data" / EXP / "20261123T110758Z_nvidia-h200-x2.csv")


def test_a_real_h200_run_with_its_trace_verifies(capsys):
    assert cli.main(["verify", str(H200_RUN)]) == 0
    assert "4/4 claims hold on H200 ×2, 2026-11-23" in capsys.readouterr().out


def test_the_real_trace_in_numbers():
    t = show.trace_summary(runs.read_run(H200_RUN).sidecar("events")).set_index([
        "rank", "variant", "kind"
    ])
    for rank in (0, 1):
        # 38 accepted sizes: 3 reduce-scatters and 3 all-gathers issued (2 eager runs + the captured
        # call), 4 NCCL kernels run (the eager runs'); the 4 refused sizes and the refused warm-up:
        # nothing at all
        assert t.loc[(rank, "before", "capture")].tolist() == [38, "3", "3", "4", "20"]
        assert t.loc[(rank, "after", "capture")].tolist() == [38, "3", "3", "4", "20"]
        assert t.loc[(rank, "before", "capture (refused)")].tolist() == [4, "0", "0", "0", "0"]
        assert t.loc[(rank, "before", "warmup (refused)")].tolist() == [1, "0", "0", "0", "0"]
        assert t.loc[(rank, "after", "warmup")].tolist() == [1, "1", "1", "2", "9"]


def test_an_nccl_kernel_run_under_capture_fails_the_claim(tmp_path, capsys):

    def extra_kernel(ev):
        at = (ev["rank"] == 1) & (ev.name == "phase::capture 64") & (ev.variant == "after")
        r = ev[at].iloc[0]
        k = r.copy()
        k["lane"], k["name"], k["category"] = "device", "ncclDevKernel_AllGather_RING_LL", "kernel"
        k["start_us"], k["dur_us"] = r.start_us + r.dur_us / 2, 1.0
        return pd.concat([ev, k.to_frame().T], ignore_index=True)

    _verify_fails(_damage_events(H200_RUN, tmp_path, extra_kernel),
                  "capture_sizes.trace_capture_launches_nothing", capsys)


def test_capture_timeline_on_the_real_trace():
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    run = runs.read_run(H200_RUN)
    windows = show.tail_window(run.sidecar("events"), rank=1)
    after, _ = windows["after · rank 1"]
    assert sorted(after.loc[after.category == "range",
                            "name"]) == ["phase::2", "phase::4", "phase::6", "phase::8"]
    assert (after.name.str.contains("nccl") & (after.lane == "device")).sum() == 4 * 4
    fig = show.capture_timeline(run.sidecar("events"), rank=1, run=run)
    crosses = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in crosses) == 4
    plt.close(fig)
