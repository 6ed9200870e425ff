"""Engine runs read like every other run (data/recorded/engine_<fix>/): the newest answer per
variant wins, the statistics fold the engine starts, the tables hold what SGLang's tools printed,
each engine claim fails when the run says otherwise, and a rerun is held to its record."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from sglab.core import claims as C
from sglab.core import runs, text
from sglab.pcg_gate import claims as pg
from sglab.core import engine_records as R
from sglab.core import engine_stats as S
from sglab.core import engine_view as V
from sglab.tools import cli
from tests.edits import ratio_run, starts_run


pytestmark = pytest.mark.long(50)

# Figures the record does not yet repeat (data/recorded/not_repeated.json, which 07 shows with
# their numbers and why): two machines of one GPU model and count that lie further apart than the
# claim's tolerance, each failing against the rest of its record. (run, claim, value)
NOT_REPEATED = {(e["run"], e["claim"], e["value"])
                for e in json.loads((runs.data_dir("recorded") / "not_repeated.json").read_text())}


def test_every_engine_run_holds_against_the_rest_of_its_record():
    """Every claim holds on every committed engine run, and each run, verified against the other
    runs of its GPU model and GPU count, stays within every tolerance, bar the figures named in
    NOT_REPEATED (which must still be beyond it: a new run that brings them within its range
    must take them off the list); 07's table of them shows each one's numbers."""
    from sglab.tools import fixes, verify

    recorded: dict = {}
    beyond = set()
    for exp in (e for e in fixes.experiments() if e.startswith("engine_")):
        for run in runs.load_all_recorded(exp):
            v = verify.verify_run(run, against=True, recorded=recorded)
            assert not v.failed, (run.path.name, [r.claim.id for r in v.failed])
            beyond |= {(run.path.name, d["claim"], d["value"]) for d in v.drifted}
    assert beyond == NOT_REPEATED
    shown = verify.not_repeated(recorded)
    assert len(shown) == len(NOT_REPEATED) and "within tolerance now" not in set(shown["this run"])


def test_a_rerun_is_held_to_the_runs_of_its_gpu_model_on_as_many_gpus():
    """A TP-2 rerun on H200 is held to the H200 ×2 runs only (not ×4, not H100 ×2); a TP-4 rerun
    with no ×4 run recorded has no record to be held to, and a ×4 reference is not held to."""

    def run(name, gpu, count):
        m = {"gpu_name": f"NVIDIA {gpu}", "gpu_count": count, "created_utc": f"2026-11-2{name}"}
        return runs.Run(pd.DataFrame(), m, Path(f"/record/{name}.csv"))

    x2, x2b, x4, h100 = run("1", "H200", 2), run("2", "H200",
                                                 2), run("3", "H200",
                                                         4), run("4", "H100 80GB HBM3", 2)
    rerun2, rerun4 = run("5", "H200", 2), run("6", "H200", 4)
    _, how, record, held = C.reference(rerun2, [x2, x2b, x4, h100, rerun2])
    assert record == [x2, x2b] and held and "each number against the range they span" in how
    _, how, record, held = C.reference(rerun4, [x2, x2b, h100])
    assert record == [] and not held and "shown, not held to" in how
    assert C.held_to(rerun2, x2b) and C.held_to(rerun4, x4)
    assert not C.held_to(rerun4, x2) and not C.held_to(rerun2, h100)


def test_numbers_fold_each_shapes_starts_as_a_plain_groupby_does():
    """Every committed run's frame, every metric: the starts of each group (rows that differ in
    start and value alone) fold into their median, lowest, highest and count, in the order the
    groups first appear; with only_started, the variants that did not start are left out."""
    checked = 0
    for exp in ("engine_pcg_gate", "engine_breakable_graph", "engine_swa_loc"):
        df = R.frame(runs.load_all_recorded(exp))
        ok = S.started(df)
        for metric in df.metric.unique():
            d = df[df.metric == metric].assign(
                value=lambda d: pd.to_numeric(d["value"], errors="coerce"))
            if d["start"].nunique() < 2:
                continue
            keys = [c for c in d.columns if c not in ("start", "value")]
            started = [ok.get(tuple(k), False) for k in d[R.KEYS].itertuples(index=False)]
            for only, rows in ((False, d), (True, d[started])):
                g = rows.groupby(keys, dropna=False, sort=False)["value"]
                want = g.agg(value="median", lo="min", hi="max", starts="count").reset_index()
                got = S.numbers(df, metric, only_started=only)
                # a key that is NaN throughout (a unitless metric) keeps its column's dtype in
                # the fold; pandas 2's groupby turns that key into float64
                want = want.astype({k: got[k].dtype for k in keys})
                pd.testing.assert_frame_equal(got, want)
                checked += 1
    assert checked > 50


@pytest.mark.parametrize("values", [["1.5", "4", "2", "3", "x", "nan", "3", "1", "nan"],
                                    ["4", "1", "3", "2", "7", "7", "3", "1", "2"]])
def test_numbers_fold_an_even_count_nan_and_whole_numbers_as_a_plain_groupby_does(values):
    """An even count's median is the mean of its middle two, NaN is left out of a group and a group
    of NaN alone folds to NaN from 0 starts; whole numbers keep their dtype in lo and hi."""
    df = pd.DataFrame(
        dict(model="m", release="r", case=list("aaaabbccc"), metric="t",
             start=[0, 1, 2, 3, 0, 1, 0, 1, 2], input_len=1, value=values))
    d = df.assign(value=pd.to_numeric(df["value"], errors="coerce"))
    keys = [c for c in d.columns if c not in ("start", "value")]
    want = d.groupby(keys, sort=False)["value"].agg(value="median", lo="min", hi="max",
                                                    starts="count").reset_index()
    pd.testing.assert_frame_equal(S.numbers(df, "t"), want, check_exact=True)


def test_a_runs_rows_are_read_once_and_left_as_they_were():
    """A run's rows are prepared once and shared by every frame it joins: no frame changes them,
    and a frame is the same whichever frames were built before it."""
    found = runs.load_all_recorded("engine_pcg_gate")
    a, b = found[-2:]
    before = a.df.copy()
    fresh = R._frame([runs.Run(a.df.copy(), a.manifest, a.path)])
    both = R.frame([a, b])
    pd.testing.assert_frame_equal(R.frame([a]), fresh)
    pd.testing.assert_frame_equal(a.df, before)
    assert set(both["run"]) <= {R.run_label(a), R.run_label(b)} and len(both) >= len(fresh)


def test_latest_keeps_the_newest_run_in_which_a_variant_started():
    found = runs.load_all_recorded("engine_swa_loc")
    failed = [
        r for r in found if (r.df[(r.df.metric == "status")
                                  & (r.df.variant == "0.5.11+before")].value != "ok").any()
    ]
    if not failed:
        pytest.skip("no committed run in which 0.5.11 failed to start")
    df = R.frame(found)
    status = S.texts(df, "status")
    assert status[("gpt_oss_swa", "0.5.11", "before")] == "ok"
    assert set(df.groupby(R.KEYS)["run"].nunique()) == {1}  # one run per variant
    assert {k[1] for k in status} >= {"0.5.11", "0.5.12.post1", "0.5.13"}


def test_a_variant_started_at_two_tp_sizes_keeps_both_when_runs_merge():
    """05's 0.5.11 variants ran at TP 2 and again at TP 4 on the H200: merged, each TP size keeps
    its rows (before, the newer run's TP 4 rows replaced the TP 2 ones)."""
    rs = R.load("grid_thw")
    h200 = [r for r in [*rs.shown, *rs.elsewhere] if r.manifest.gpu == "H200"]
    tps = {e["tp"] for r in h200 for e in r.manifest.engine_runs if e["variant"] == "0.5.11+before"}
    if len(tps) < 2:
        pytest.skip("no committed 05 runs of one variant at two TP sizes")
    df = R.merged(h200).df
    got = df[(df.variant == "0.5.11+before") & (df.metric == "status")]
    assert sorted(got.tp.unique()) == sorted(tps) and R.frame(h200).tp.dtype.kind == "i"
    # 05's engine memory reads the widest TP size, as its headline says, not the two added up
    from sglab.grid_thw import show as grid_show

    mem = grid_show.engine_memory(R.merged(h200))
    assert mem["rank"].max() == max(tps) - 1 and grid_show.engine_stray(R.merged(h200),
                                                                        "before")[0] == 9


def test_a_run_without_the_a_a_control_never_replaces_what_a_controlled_run_paired():
    """A later run of part of a scenario (0.5.12.post1 and 0.5.13 enforced, no control) adds its
    0.5.12.post1 variant; the 0.5.13 variants stay those of the run that started them with the
    control in the same rounds, so enforced ÷ off never pairs two runs' starts."""

    def run(when, ttft):
        rows = [{
            "experiment": "engine_pcg_gate", "variant": f"{rel}+{case}", "release": rel,
            "case": case, "tool": "serve", "start": 0, "metric": metric, "value": value
        } for (rel, case), v in ttft.items() for metric, value in (("status", "ok"), ("ttft", v))]
        m = {
            "gpu_name": "NVIDIA H100 80GB HBM3", "created_utc": f"2026-12-06T0{when}:00:00Z",
            "engine_runs": [{"variant": f"{rel}+{case}", "model": {"name": "kimi_k25_full"}}
                            for rel, case in ttft]
        }
        return runs.Run(pd.DataFrame(rows), m, Path(f"/record/{when}.csv"))

    paired = run(1, {("0.5.13", "enforce"): 10.0, ("0.5.13", "pcg-off"): 9.0,
                     ("0.5.13", "pcg-off-again"): 9.1})
    later = run(2, {("0.5.12.post1", "enforce"): 25.0, ("0.5.13", "enforce"): 30.0})
    df = R.frame([paired, later])
    ttft = df[df.metric == "ttft"].set_index("variant")["value"].astype(float)
    assert ttft.to_dict() == {
        "0.5.13+enforce": 10.0, "0.5.13+pcg-off": 9.0, "0.5.13+pcg-off-again": 9.1,
        "0.5.12.post1+enforce": 25.0
    }
    # two runs of one day: each row names the call it came from by its time, not the day alone
    run_of = df.drop_duplicates("variant").set_index("variant")["run"]
    assert run_of["0.5.13+enforce"].endswith("0100Z")
    assert run_of["0.5.12.post1+enforce"].endswith("0200Z")
    alone = R.frame([later])  # read alone, the later run keeps its own pair
    assert set(alone[alone.metric == "ttft"].variant) == {"0.5.12.post1+enforce", "0.5.13+enforce"}


def test_a_variant_that_did_not_start_again_keeps_the_answer_of_the_run_where_it_did():
    """The newest answer per variant, but one that started beats a newer one that did not; a
    variant that never started anywhere keeps its newest (failed) answer."""

    def run(when, status):
        rows = [{
            "experiment": "engine_pcg_gate", "variant": v, "release": "0.5.13", "case": v,
            "tool": "bench", "start": 0, "metric": metric, "value": value
        } for v, st in status.items() for metric, value in (("status", st), ("prefill", when))]
        m = {
            "gpu_name": "NVIDIA H200", "created_utc": f"2026-12-06T0{when}:00:00Z",
            "engine_runs": [{"variant": v, "model": {"name": "m"}} for v in status]
        }
        return runs.Run(pd.DataFrame(rows), m, Path(f"/record/{when}.csv"))

    old = run(1, {"enforce": "ok", "off": "ok", "never": "oom"})
    new = run(2, {"enforce": "oom", "off": "ok", "never": "timeout"})
    df = R.frame([new, old])
    got = df[df.metric == "status"].set_index("variant")["value"].to_dict()
    assert got == {"enforce": "ok", "off": "ok", "never": "timeout"}
    assert df[df.metric == "prefill"].set_index("variant")["value"].to_dict() == {
        "enforce": 1, "off": 2, "never": 2
    }


def test_tables_show_the_spread_between_engine_starts():
    from sglab.pcg_gate import sglang as pg_sglang

    run = pg_sglang.FIX.recorded_engine()
    t = V.table(R.frame(run.shown), V.Table("prefill", "input_len"))
    assert t.columns.name.startswith("prefill (ms), median [lowest–highest] of 3 engine starts")
    cell = t.loc[("llama_32x512", "0.5.13", "pcg"), 128]
    assert " [" in cell and cell.endswith("]")  # the starts differ: their range is shown


def test_the_rebuild_sits_beside_the_engine_and_says_what_each_measures():
    from sglab.swa_loc import show as swa_show
    from sglab.swa_loc import sglang as swa_sglang

    def rebuild(exp):
        return runs.RunSet([max(runs.load_all_recorded(exp), key=lambda r: r.manifest.created_utc)])

    rows = swa_show.beside_rows(rebuild("swa_loc"), swa_sglang.FIX.recorded_engine())
    assert [
        r["figure"] for r in rows if "per SWA layer" in r["measures"] and "kernel" in r["measures"]
    ] == ["2", "2"]


def test_a_live_engine_run_is_compared_with_the_recorded_runs_merged(capsys):
    from sglab.tools import verify

    recorded = runs.load_all_recorded("engine_pcg_gate")
    ref, how, _, _ = C.reference(recorded[0], recorded)
    assert ref is not None and "newest answer per variant" in how
    h100 = [r for r in recorded if runs.gpu_short(r.manifest) == "H100"]
    assert len(ref.manifest.merged_from) == len(h100) - 1  # its own GPU model's, less itself
    # one engine run, as `sglab verify --live` would record it, against the others merged
    newest = max(recorded, key=lambda r: r.manifest.created_utc)
    v = verify.verify_run(recorded[0], against=True)
    assert v.comparison is not None and not v.drifted
    assert v.comparison.how.startswith("the recorded H100 ×1 runs of this size and method")
    merged = R.merged(recorded)
    assert merged.path == newest.path and len(merged.df) == merged.manifest.rows
    assert {r.status for r in C.evaluate(pg.ENGINE, merged)} == {C.PASS}  # every claim applies
    # two runs name a variant alike (0.5.13+pcg-off: Kimi-K2.5 and Llama): each row keeps its model
    prefill = S.numbers(R.frame([merged]), "prefill").set_index(["model", "case"])
    assert prefill.loc[("llama_32x512", "pcg-off"), "starts"].max() == 3
    assert prefill.loc[("kimi_k25_tiny", "pcg-off"), "starts"].max() == 3


def test_verify_live_runs_the_engine_scenarios_this_machine_can(monkeypatch):
    from sglab.core import hardware
    from sglab.tools import verify

    done, skipped = verify.live_engines(progress=False)  # this box: no GPU
    names = {s.split(":")[0] for s in skipped}
    assert done == [] and names == {
        "01-kimi-pcg", "01-llama-pcg", "01-llama-width", "01-kimi-full-serve", "01-kimi-full-bench",
        "01-kimi-rank-bench", "03-bcg-requests", "04-swa-kernels", "02-ar-fusion",
        "02-ar-fusion-tp4", "02-ar-fusion-tp8", "06-dense-tp1", "06-dense-tp4", "06-dense-tp8",
        "05-grid-thw", "05-grid-thw-tp4", "05-grid-thw-tp8"
    }

    monkeypatch.setattr(hardware, "meets", lambda n: (True, "stand-in"))

    def not_here(spec, echo):
        raise verify.eng.EngineError(f"sglang {spec.release} is not unpacked for engines here")

    monkeypatch.setattr(verify.eng, "run", not_here)
    done, skipped = verify.live_engines(progress=False)
    assert done == [] and "04-swa-kernels 0.5.11+before: sglang 0.5.11 is not unpacked" in " ".join(
        skipped)


def test_verify_live_runs_only_the_named_experiments(monkeypatch, capsys):
    from sglab.tools import verify

    asked = {}

    def live(progress, only):
        asked["rebuilds"] = only
        return [], ["stand-in"]

    def live_engines(progress, only):
        asked["engines"] = only
        return [], []

    monkeypatch.setattr(verify, "live", live)
    monkeypatch.setattr(verify, "live_engines", live_engines)
    # a verify that verified nothing is not a pass
    assert cli.main(["verify", "--live", "engine_swa_loc"]) == 1
    assert asked == {"rebuilds": {"engine_swa_loc"}, "engines": {"engine_swa_loc"}}
    err = capsys.readouterr().err
    assert "can run none of engine_swa_loc" in err and "nothing verified" in err
    assert cli.main(["verify", "--live"]) == 1 and asked["engines"] is None


def test_verify_live_against_an_experiment_runs_it_and_compares_with_the_record(
        monkeypatch, capsys):
    """`--against EXP` names what to run here, not a reference file (argparse hands the name to
    the option's optional value): EXP runs live and is compared with its recorded reference."""
    from sglab.tools import verify

    recorded = runs.load_all_recorded("engine_swa_loc")
    asked = {}

    def live(progress, only):
        asked["rebuilds"] = only
        return [], []

    def live_engines(progress, only):
        asked["engines"] = only
        return [runs.Run(recorded[0].df, recorded[0].manifest, recorded[0].path, live=True)], []

    monkeypatch.setattr(verify, "live", live)
    monkeypatch.setattr(verify, "live_engines", live_engines)
    assert cli.main(["verify", "--live", "--against", "engine_swa_loc"]) == 0
    out = capsys.readouterr()
    assert asked == {"rebuilds": {"engine_swa_loc"}, "engines": {"engine_swa_loc"}}
    assert "no such run file" not in out.err and "== engine_swa_loc" in out.out
    assert "against " in out.out and "1 run(s): 1 hold, 0 fail" in out.out
    # several experiments after --against: the first is the option's value, the rest targets
    assert cli.main(["verify", "--live", "--against", "engine_swa_loc", "engine_pcg_gate"]) == 0
    assert asked["engines"] == {"engine_swa_loc", "engine_pcg_gate"}


def test_kernel_counts_read_as_whole_numbers():
    from sglab.swa_loc import sglang as swa_sglang

    df = R.frame(swa_sglang.FIX.recorded_engine().shown)
    got = V.facts(df, ["decode_kernels_per_replay", "decode_kernels_per_layer"])
    assert set(got["decode_kernels_per_replay"]) == {"140", "148", "196"}
    assert "18.5" in set(got["decode_kernels_per_layer"]) and "ok" in set(got["status"])
    assert text.whole("36.0") == "36" and text.whole("1e3") == "1e3" and text.whole("") == ""


# -- several engine starts per variant, the A/A control ---------------------------------------
def test_a_scenarios_starts_interleave_and_its_control_repeats_a_case():
    from sglab.sglang.engine import spec as S
    from sglab.tools import fixes

    sc = fixes.scenario("01-llama-pcg")
    assert (sc.starts, sc.control) == (3, "pcg-off")
    order = [(sp.start, sp.case) for sp in sc.specs() if not sp.profile]  # the timed starts
    cases = ["pcg", "pcg-off", "pcg-off-again"]  # each round rotated: none always opens it
    assert order == [(i, c) for i in range(3) for c in cases[i:] + cases[:i]]
    kimi = [(sp.release, sp.start, sp.case)
            for sp in fixes.scenario("01-kimi-pcg").specs() if not sp.profile]
    assert kimi[:5] == [("0.5.12.post1", 0, "default"), ("0.5.12.post1", 0, "enforce"),
                        ("0.5.12.post1", 0, "pcg-off"), ("0.5.12.post1", 0, "pcg-off-again"),
                        ("0.5.13", 0, "default")]
    assert [c for v, i, c in kimi if (v, i) == ("0.5.13", 2)
            ] == ["pcg-off", "pcg-off-again", "default", "enforce"]
    again = [sp for sp in sc.specs() if sp.case == "pcg-off-again"][0]
    off = [sp for sp in sc.specs() if sp.case == "pcg-off"][0]
    assert again.server_args == off.server_args  # A/A: the same flags under a second label
    from dataclasses import replace

    with pytest.raises(S.EngineError, match="control 'nope' is not a case"):
        replace(sc, control="nope").specs()


def test_a_timing_of_one_engine_start_says_so():
    one = V.table(R.frame([starts_run({("pcg", 0): {128: 10.0}})]), V.Table("prefill", "input_len"))
    assert one.columns.name == ("prefill (ms), one engine start (the spread between starts is "
                                "not measured) by input_len")


def test_starts_fold_into_their_median_with_the_spread_between_them():
    t = {("pcg", 0): {128: 10.0}, ("pcg", 1): {128: 12.0}, ("pcg", 2): {128: 11.0},
         ("pcg-off", 0): {128: 20.0}, ("pcg-off", 1): {128: 30.0}, ("pcg-off", 2): {128: 22.0}}
    df = R.frame([starts_run(t)])
    d = S.numbers(df, "prefill").set_index("case")
    assert (d.loc["pcg", "value"], d.loc["pcg", "lo"], d.loc["pcg", "hi"]) == (11.0, 10.0, 12.0)
    assert d.loc["pcg-off", "starts"] == 3 and d.loc["pcg-off", "value"] == 22.0
    cells = V.table(df, V.Table("prefill", "input_len"))
    assert cells.loc[("llama_32x512", "0.5.13", "pcg"), 128] == "11.00 [10.00–12.00]"
    assert "median [lowest–highest] of 3 engine starts" in cells.columns.name
    # one start that did not answer: the variant did not
    bad = R.frame([starts_run(t, {("pcg", 1): "timeout: no exit"})])
    assert S.started(bad)[("llama_32x512", "0.5.13", "pcg")] is False


def test_each_start_is_set_beside_what_the_host_did_meanwhile():
    """pcg-off's second start is slow as a whole (40 ms at both lengths) and had 20% of its CPU
    time stolen: its row says so; the launch pass (host figures, no timing) has no row."""
    t = {("pcg-off", s): {128: ms, 256: ms} for s, ms in enumerate((20.0, 40.0))}
    run = starts_run(t)
    extra = []
    for start, steal in ((0, 0.5), (1, 20.0), (2, 1.0)):
        base = {
            "experiment": "engine_pcg_gate", "variant": "0.5.13+pcg-off", "release": "0.5.13",
            "case": "pcg-off", "tool": "bench", "start": start
        }
        extra += [{**base, "metric": "host_steal", "value": steal, "unit": "%"},
                  {**base, "metric": "engine_preempted", "value": 10 * start, "unit": "switches"}]
    run.df = pd.concat([run.df, runs.tidy("engine_pcg_gate", extra)], ignore_index=True)
    got = S.starts_and_host(R.frame([run]), "prefill")
    assert list(got.index) == [("llama_32x512", "0.5.13", "pcg-off", 0),
                               ("llama_32x512", "0.5.13", "pcg-off", 1)]
    assert got.loc[("llama_32x512", "0.5.13", "pcg-off", 1)].to_dict() == {
        "prefill (ms), median over shapes": 40.0, "engine preempted (switches)": 10.0,
        "CPU stolen (%)": 20.0
    }
    assert str(got["engine preempted (switches)"].dtype) == "Int64"  # a count: 10, not 10.0
    assert S.starts_and_host(R.frame([starts_run(t)]), "prefill").empty  # recorded before


def _both(df, stat):
    """01's ratios by one statistic, as the rerun table sets them beside each other."""
    return {" ".join(k): v for k, v in pg.tables.engine_ratios(df, stat).items()}


BOTH = ("fastest", "median")


def test_a_pair_recorded_on_two_days_is_set_side_by_side_with_its_drift():
    """Llama 2.0× on one day and 1.5× on the next, each at its host's per-launch cost: a row per
    run, a column per statistic and the drift of the first; Kimi, recorded once, has no rerun."""
    day1 = ratio_run("llama_32x512", 20.0, 21.0, "2026-11-27T10:00:00Z")
    day2 = ratio_run("llama_32x512", 15.0, 15.3, "2026-11-28T10:00:00Z")
    kimi = ratio_run("kimi_k25_tiny", 15.0, 15.5, "2026-11-27T11:00:00Z")
    for r, us in ((day1, 10.0), (day2, 7.0)):
        r.manifest.host_launch_us = {"before": {"median": us}, "after": {"median": us}}
    got = S.reruns(runs.RunSet([day2, kimi, day1]), _both, BOTH)
    assert list(got.index) == [("llama_32x512 0.5.13 pcg", "H100, 2026-11-27 1000Z"),
                               ("llama_32x512 0.5.13 pcg", "H100, 2026-11-28 1000Z")]
    assert got.iloc[1].to_dict() == {
        "fastest start": "1.50×", "median of starts": "1.50×", "host µs per launch": "7.0",
        "drift": "-25%"
    }
    assert got.iloc[0]["drift"] == "0%"
    assert S.reruns(runs.RunSet([day1, kimi]), _both, BOTH).empty
    # the same day again with its engines pinned (--cpus): a row of its own that says so
    pinned = ratio_run("llama_32x512", 18.0, 18.5, "2026-11-28T11:00:00Z")
    for e in pinned.manifest.engine_runs:
        e["cpus"] = [0, 1, 2, 3]
    got = S.reruns(runs.RunSet([day1, day2, pinned]), _both, BOTH)
    assert [r for _, r in got.index] == [
        "H100, 2026-11-27 1000Z", "H100, 2026-11-28 1000Z", "H100, 2026-11-28 1100Z, CPUs 0-3"
    ]


def test_a_tie_between_gpu_models_shows_the_model_that_recorded_first(monkeypatch):
    """Two H200 runs answering what two H100 runs answer: the H100 (recorded first) keeps the
    tables, in whatever order the runs are found; one H200 run more and the H200 takes them."""

    def make(gpu, *when):
        made = [ratio_run("llama_32x512", 20.0, 21.0, t) for t in when]
        for r in made:
            r.manifest.gpu_name = gpu
        return made

    h100 = make("NVIDIA H100 80GB HBM3", "2026-11-27T10:00:00Z", "2026-11-29T10:00:00Z")
    h200 = make("NVIDIA H200", "2026-11-28T10:00:00Z", "2026-11-28T11:00:00Z")
    monkeypatch.setattr(R.runs, "load_all_recorded", lambda exp: [*h200, *h100])
    assert R.load("pcg_gate", "01").shown == h100
    h200 += make("NVIDIA H200", "2026-11-28T12:00:00Z")
    assert R.load("pcg_gate", "01").shown == h200


def test_runs_of_another_gpu_model_get_rows_and_a_drift_of_their_own(monkeypatch):
    """An H200 run beside two H100 runs: the tables show the model whose runs answer the most
    variants (H100), the H200 run waits in ``elsewhere``; in the rerun table it has its own row,
    and its drift is against the first H200 run, never against an H100 run."""
    h100 = [
        ratio_run("llama_32x512", 20.0, 21.0, "2026-11-27T10:00:00Z"),
        ratio_run("kimi_k25_tiny", 15.0, 15.5, "2026-11-27T11:00:00Z")
    ]
    h200 = [
        ratio_run("llama_32x512", 30.0, 30.5, t)
        for t in ("2026-11-28T10:00:00Z", "2026-11-28T12:00:00Z")
    ]
    h200[1] = ratio_run("llama_32x512", 24.0, 24.5, "2026-11-28T12:00:00Z")
    for r in h200:
        r.manifest.gpu_name = "NVIDIA H200"
    monkeypatch.setattr(R.runs, "load_all_recorded", lambda exp: [h200[1], *h100, h200[0]])
    run = R.load("pcg_gate", "01")
    assert run.shown == h100 and run.elsewhere == h200
    got = S.reruns(run, _both, BOTH)
    assert list(got.index) == [("llama_32x512 0.5.13 pcg", "H100, 2026-11-27 1000Z"),
                               ("llama_32x512 0.5.13 pcg", "H200, 2026-11-28 1000Z"),
                               ("llama_32x512 0.5.13 pcg", "H200, 2026-11-28 1200Z")]
    assert list(got["drift"]) == ["0%", "0%", "-20%"]  # 2.4× against H200's 3.0×
    assert list(S.aa_table(run, "prefill", "input_len").index.get_level_values("run")) == [
        "H100, 2026-11-27 1000Z", "H100, 2026-11-27 1100Z", "H200, 2026-11-28 1000Z",
        "H200, 2026-11-28 1200Z"
    ]


def test_the_host_launch_cost_is_measured_in_its_own_process(monkeypatch):
    from sglab.tools import engine_cmd

    monkeypatch.setattr(
        engine_cmd, "HOST_COST",
        engine_cmd.HOST_COST.replace("launch_cost_us()", "launch_cost_us('cpu', n=50, repeat=3)"))
    got = engine_cmd.host_launch_cost()
    assert got["median"] > 0 and got["launches_per_burst"] == 50 and got["device"] == "cpu"
    monkeypatch.setattr(engine_cmd, "HOST_COST", "raise SystemExit('no CUDA here')")
    assert engine_cmd.host_launch_cost() == {"error": "no CUDA here"}


def test_the_header_names_the_hosts_per_launch_cost_once_per_gpu_model(capsys):
    """One line per GPU model, the span of its runs' costs (each run's own is in 07); a failed
    measurement is not a number, and a run without one prints nothing."""
    run = starts_run({("pcg", 0): {128: 10.0}})
    run.manifest.host_launch_us = {"before": {"median": 2.41}, "after": {"error": "x"}}
    other = copy.deepcopy(run)
    other.manifest.host_launch_us = {"before": {"median": 3.02}, "after": {"median": 2.60}}
    assert V.header(runs.RunSet([run, other]), "Llama")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "per-launch" in ln]
    assert lines == [
        "host per-launch cost beside the H100 runs: 2.41–3.02 µs (before and after "
        "each run; per run in the methods notebook, 07)"
    ]
    run.manifest.host_launch_us = {}
    V.header(runs.RunSet([run]), "Llama")
    assert "per-launch" not in capsys.readouterr().out


def test_cases_split_a_scenario_and_a_pattern_that_matches_nothing_is_one_line(capsys):
    argv = ["engine", "--scenario", "01-llama-width", "--dry-run", "--cases", "w512-*", "w1024-*"]
    assert cli.main(argv) == 0
    started = [
        ln.split(" (")[0]
        for ln in capsys.readouterr().out.splitlines() if ln.startswith("# sglang 0.5.13+")
    ]
    assert sorted(set(started)) == [
        f"# sglang 0.5.13+w{h}-{a}" for h in (1024, 512) for a in ("off", "pcg")
    ]
    assert len(started) == 4 * 3  # every start of each case kept
    assert cli.main(["engine", "--scenario", "01-llama-width", "--cases", "w9-*", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sglab engine: --cases w9-*: no case of 01-llama-width matches")
    assert len(err.splitlines()) == 1


def test_a_dry_run_says_each_reason_once_and_which_start_each_command_is(capsys):
    """01-kimi-pcg starts 0.5.12.post1's Kimi variants 16 times, each with the same harness
    adjustment: its reason is printed once, and each command says which start it is."""
    from sglab.sglang import engine as eng
    from sglab.tools import fixes

    assert cli.main(["engine", "--scenario", "01-kimi-pcg", "--dry-run"]) == 0
    out = capsys.readouterr().out
    scenario = fixes.scenario("01-kimi-pcg")
    specs = scenario.specs()
    reason = eng.adjustment("kimi-k25-post-load-weights").reason
    assert out.count(reason) == 1
    assert out.count("kimi-k25-post-load-weights added") == sum(
        sp.release == "0.5.12.post1" for sp in specs)
    labels = [ln.split(": ")[0] for ln in out.splitlines() if "bench_one_batch" in ln]
    assert len(labels) == len(set(labels)) == len(specs)
    assert "# sglang 0.5.13+enforce (start 3)" in labels
    assert "# sglang 0.5.13+enforce (the launch-count pass, profiled)" in labels
    # a release that cannot start here is said in full once, then pointed to
    full = [ln for ln in out.splitlines() if ln.startswith("#   would stop: sglang")]
    assert len(full) <= len(scenario.releases)


def test_each_variants_timing_carries_the_cost_of_the_host_that_ran_it():
    from sglab.pcg_gate import sglang as pg_sglang

    engine = pg_sglang.FIX.recorded_engine()

    def cost_of(r):
        got = [v["median"] for v in r.manifest.host_launch_us.values()]
        return sum(got) / len(got)

    def ran(model, case):
        return max(
            (r for r in engine.shown if any((e["model"] or {}).get("name") == model
                                            and e["case"] == case and e["release"] == "0.5.13"
                                            for e in r.manifest.engine_runs)),
            key=lambda r: r.manifest.created_utc)

    for model, case in (("kimi_k25_tiny", "enforce"), ("llama_32x512", "pcg")):
        assert R.host_us(engine, "0.5.13", model, case) == pytest.approx(cost_of(ran(model, case)))
    assert R.host_us(engine, "0.5.13", "kimi_k25_tiny", "no-such-case") is None
    newest = max(engine.shown, key=lambda r: r.manifest.created_utc)
    assert R.host_us(engine) == pytest.approx(cost_of(newest))


def test_a_frames_statistics_are_worked_out_once_and_each_caller_gets_its_own_copy(monkeypatch):
    """The same frame object asked twice: one computation; a caller that changes its answer does
    not change the next caller's; an equal frame that is another object is worked out again."""
    from sglab.core import engine_stats

    df = pd.DataFrame({
        "model": ["m"] * 4, "release": ["1"] * 4, "case": ["a"] * 4, "start": [0, 1, 0, 1],
        "input_len": [8, 8, 8, 8], "metric": ["prefill", "prefill", "status",
                                              "status"], "value": ["2", "4", "ok", "ok"]
    })
    calls = []
    real = engine_stats._numbers
    monkeypatch.setattr(engine_stats, "_numbers", lambda *a: calls.append(a) or real(*a))
    first = engine_stats.numbers(df, "prefill")
    first["value"] = -1.0
    again = engine_stats.numbers(df, "prefill")
    assert len(calls) == 1 and list(again["value"]) == [3.0] and list(again["lo"]) == [2.0]
    engine_stats.numbers(df.copy(), "prefill")
    assert len(calls) == 2


@pytest.mark.parametrize(
    "name", ["breakable_graph", "capture_sizes", "pcg_gate", "swa_loc", "workspace_floor"])
def test_beside_rows_without_runs_give_each_missing_sides_line_first(name):
    import importlib

    missing = runs.NoRun(name, "test")
    rows = importlib.import_module(f"sglab.{name}.show").beside_rows(missing, missing)
    assert [(r["source"], r["measures"]) for r in rows[:2]
            ] == [("rebuild", "no GPU run to show (test)"),
                  ("SGLang engine", "no GPU run to show (test)")]


def test_a_verdict_on_runs_merged_names_each_gpu_count_and_their_first_and_last_day():
    """02's engine record holds H200 runs on 2 and on 4 GPUs over two days: the verdict on them
    merged names both counts and both days, not the newest run's alone."""
    from sglab.workspace_floor import claims as W

    found = runs.load_all_recorded("engine_workspace_floor")
    (merged,) = [m for m in R.per_gpu(R.load("workspace_floor")) if m.manifest.gpu == "H200"]
    counts = sorted({r.manifest.gpu_count for r in found if r.manifest.gpu == "H200"})
    days = sorted(r.manifest.date for r in found if r.manifest.gpu == "H200")
    assert len(counts) > 1 and days[0] != days[-1]
    line = C.verdict_line(C.evaluate(W.ENGINE, merged), merged)
    assert line.endswith(f"on H200 {' and '.join(f'×{n}' for n in counts)}, {days[0]} to "
                         f"{days[-1]}")
