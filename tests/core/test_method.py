"""The methods notebook's (07) tables: one timing taken apart in the order its starts were launched,
the A/A control read each way, the host beside each run, reruns and exact counts across runs, one
ledger row per recorded engine run, and each claim's tolerance beside the A/A gap it must clear."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from sglab.core import claims as C
from sglab.core import engine_records as R
from sglab.core import method as M
from sglab.core import runs
from sglab.core.engine_view import Pair, Table
from sglab.tools import fixes


pytestmark = pytest.mark.long(30)

ORDER = (("pcg", "pcg-off", "pcg-off-again"), ("pcg-off", "pcg-off-again", "pcg"),
         ("pcg-off-again", "pcg", "pcg-off"))


def _run(times: dict, *, model: str = "llama_32x512", created: str = "2026-11-28T10:00:00Z",
         gpu: str = "NVIDIA H100 80GB HBM3", host=None, counts: dict | None = None,
         extra: list | None = None):
    """An engine run of 01's cases on ``model``: ``times[(case, start)] = {input_len: ms}`` (``ms``
    the start's median repeat, or ``(median, fastest repeat)``), its starts launched in the
    rotating order of :data:`ORDER` with a launch pass after them; ``counts[(case, start)] =
    {input_len: launches}``; ``host``: its per-launch cost before and after (µs)."""
    rows, entries = [], {}
    for (case, start), per in times.items():
        base = {
            "experiment": "engine_pcg_gate", "variant": f"0.5.13+{case}", "release": "0.5.13",
            "case": case, "tool": "bench", "start": start
        }
        rows.append({**base, "metric": "status", "value": "ok", "unit": ""})
        for n, ms in per.items():
            med, low = ms if isinstance(ms, tuple) else (ms, ms)
            rows += [{**base, "input_len": n, "metric": m, "value": v, "unit": "ms"}
                     for m, v in (("prefill", med), ("prefill_min", low))]
            launches = (counts or {}).get((case, start), {}).get(n)
            if launches is not None:
                rows.append({
                    **base, "input_len": n, "metric": "prefill_kernel_launches", "value": launches,
                    "unit": "launches"
                })
        entries[case] = {
            "variant": f"0.5.13+{case}", "release": "0.5.13", "case": case,
            "model": {"name": model}, "tp": 1
        }
    df = runs.tidy("engine_pcg_gate", rows + (extra or []))
    starts = sorted({s for _, s in times})
    specs = [{"release": "0.5.13", "case": c, "start": s, "profile": False, "model": model}
             for s in starts for c in ORDER[s % 3] if (c, s) in times]
    specs += [{
        "release": "0.5.13", "case": "pcg", "start": len(starts), "profile": True, "model": model
    }]
    manifest = {
        "experiment": "engine_pcg_gate", "created_utc": created, "gpu_name": gpu, "gpu_count": 1,
        "engine_runs": list(entries.values()), "method_version": 1, "params": {"specs": specs},
        "host_launch_us": {k: {"median": v}
                           for k, v in zip(("before", "after"), host or ())}
    }
    return runs.Run(df, manifest, runs.repo_root() / f"{model}-{created}.csv")


def _three(off: float, again: float, pcg: float = 10.0, n: int = 128, **kw):
    """Three starts of pcg, pcg-off and its A/A copy, each the same in every start."""
    t = {(c, s): {n: v}
         for s in range(3)
         for c, v in (("pcg", pcg), ("pcg-off", off), ("pcg-off-again", again))}
    return _run(t, **kw)


def test_launch_order_lists_each_round_as_launched_without_the_launch_pass():
    got = M.launch_order(_three(20.0, 21.0))
    assert list(got.index) == [("llama_32x512", "0.5.13", n) for n in (1, 2, 3)]
    assert list(got["cases, in launch order"]) == [" → ".join(o) for o in ORDER]


def test_one_timing_shows_each_start_and_the_statistics_read_of_them():
    """pcg-off's second start is slow (30 ms); its fastest repeat (8 ms) is in the first: the
    median of starts, the fastest start and the fastest repeat of any start differ, and the spread
    between starts says how far apart the starts lie."""
    t = {("pcg-off", 0): {128: (20.0, 8.0), 512: 50.0}, ("pcg-off", 1): {128: 30.0, 512: 50.0},
         ("pcg-off", 2): {128: 22.0, 512: 50.0}}
    t |= {("pcg-off-again", s): {128: 21.0, 512: 50.0} for s in range(3)}
    t |= {("pcg", s): {128: 10.0, 512: 40.0} for s in range(3)}
    got = M.one_timing(_run(t), "prefill", "input_len", "pcg-off", ("pcg",), x=200)
    assert list(got.index) == ["pcg-off", "pcg-off-again", "pcg"]  # the control beside its case
    assert "at input_len 128" in got.columns.name  # the recorded shape nearest 200
    row = got.loc["pcg-off"]
    assert (row["start 1"], row["start 2"], row["start 3"]) == (20.0, 30.0, 22.0)
    assert (row["median of starts"], row["fastest start"],
            row["fastest repeat of any start"]) == (22.0, 20.0, 8.0)
    assert row["spread between starts"] == "50.0%" and got.loc["pcg", "spread between starts"] \
        == "0.0%"
    assert M.example_run(runs.RunSet([_run(t)]), "pcg", "prefill") is None  # no copy of pcg


def test_the_example_run_is_the_newest_that_timed_the_metric_with_its_control():
    """A newer run of the same cases that timed something else (a serving run: TTFT, no prefill
    step) is passed over for the newest run that timed the metric asked for."""
    t = {(c, s): {128: 10.0} for c in ("pcg-off", "pcg-off-again", "pcg") for s in range(3)}
    older, newer = _run(t), _run(t, created="2026-11-29T10:00:00Z")
    newer = runs.Run(newer.df.assign(metric=newer.df.metric.replace("prefill", "ttft")),
                     newer.manifest, newer.path)
    rs = runs.RunSet([older, newer])
    assert M.example_run(rs, "pcg-off", "ttft") is newer
    assert M.example_run(rs, "pcg-off", "prefill") is older
    assert list(M.one_timing(older, "prefill", "input_len",
                             "pcg-off").index)[:2] == ["pcg-off", "pcg-off-again"]


def test_the_aa_control_is_read_each_way_and_the_statistic_with_the_smallest_gap_named():
    """Two H100 runs and one H200 run: pcg-off's copy is 10% slower at the median but equal in its
    fastest repeat, so the fastest repeat has the smallest gap in every control."""

    def run(created, gpu="NVIDIA H100 80GB HBM3"):
        t = {(c, s): {128: (v, 10.0)}
             for s in range(3)
             for c, v in (("pcg", 5.0), ("pcg-off", 20.0), ("pcg-off-again", 22.0))}
        return _run(t, created=created, gpu=gpu)

    rs = runs.RunSet([run("2026-11-27T10:00:00Z"),
                      run("2026-11-28T10:00:00Z")], [run("2026-11-29T10:00:00Z", "NVIDIA H200")])
    controls = M.aa_controls(rs, "prefill", "input_len")
    assert [c["gpu"] for c in controls] == ["H100", "H100", "H200"]
    assert controls[0]["median"] == pytest.approx(2 / 22) and controls[0]["floor"] == 0.0
    table = M.aa_summary(controls)
    assert list(table.index) == ["H100", "H200"] and list(table["controls"]) == [2, 1]
    assert table.loc["H100", "fastest repeat of any start"] == "0.0% (0.0%–0.0%); smallest in 2"
    assert M.best_statistic(controls) == ("floor", 3, 3)
    assert M.aa_controls(runs.RunSet([_run({("pcg", 0): {128: 5.0}})]), "prefill",
                         "input_len") == []


def test_the_hosts_cost_is_set_per_run_and_its_widest_change_per_gpu_model():
    a = _three(20.0, 21.0, host=(6.0, 9.0), created="2026-11-27T10:00:00Z")
    b = _three(20.0, 21.0, host=(10.0, 8.0), created="2026-11-28T10:00:00Z")
    c = _three(20.0, 21.0, created="2026-11-29T10:00:00Z")  # recorded before the host was timed
    per = M.host_costs([a, b, c])
    assert list(per["after ÷ before"]) == ["1.50×", "0.80×", ""]
    got = M.host_by_gpu([a, b, c]).loc["H100"]
    assert (got["runs"], got["measured beside"]) == (3, 2)
    assert got["µs per launch, every run"] == "6.0–10.0"
    assert got["widest change within one run"] == "50%"


def test_the_slowest_start_is_checked_against_the_most_preempted_one():
    """Two variants of three starts: pcg's slowest start is its most preempted, pcg-off's is not."""
    t = {("pcg", s): {128: v} for s, v in enumerate((10.0, 14.0, 11.0))}
    t |= {("pcg-off", s): {128: v} for s, v in enumerate((30.0, 20.0, 21.0))}
    extra = []
    for case, preempted in (("pcg", (5, 50, 6)), ("pcg-off", (5, 60, 6))):
        for s, p in enumerate(preempted):
            base = {
                "experiment": "engine_pcg_gate", "variant": f"0.5.13+{case}", "release": "0.5.13",
                "case": case, "tool": "bench", "start": s
            }
            extra += [{**base, "metric": "engine_preempted", "value": p, "unit": "switches"},
                      {**base, "metric": "host_steal", "value": 0.5 * s, "unit": "%"}]
    k, n, starts, stolen = M.slowest_starts(R.frame([_run(t, extra=extra)]), "prefill")
    assert (k, n, starts, stolen) == (1, 2, 3, 1.0)
    assert M.slowest_starts(R.frame([_run(t)]), "prefill")[:2] == (0, 0)  # no host figures


def test_a_pairs_reruns_leave_out_the_aa_copy_and_drift_from_the_first_run_of_each_gpu_model():
    pair = Pair("prefill", "input_len", "pcg-off", "pcg-off ÷ this case")
    day1 = _three(20.0, 21.0, created="2026-11-27T10:00:00Z")
    day2 = _three(15.0, 15.2, created="2026-11-28T10:00:00Z")
    h200 = _three(30.0, 30.0, created="2026-11-29T10:00:00Z", gpu="NVIDIA H200")
    assert set(M.pair_ratios(pair)(R.frame([day1]),
                                   "median")) == {("llama_32x512", "0.5.13", "pcg")}
    from sglab.core import engine_stats as S

    got = M.drift_summary(S.reruns(runs.RunSet([day1, day2], [h200]), M.pair_ratios(pair)))
    assert list(got.index) == [("llama_32x512 0.5.13 pcg", g) for g in ("H100", "H200")]
    h100, h200 = got.iloc[0], got.iloc[1]
    assert h100["runs"] == 2 and h100["drift from its oldest run"] == "-25%–0%"
    assert h100["ratio (fastest repeat of any start), each run"] == "2.00×; 1.50×"
    assert h200["runs"] == 1 and h200["drift from its oldest run"] == "0%"  # against its own


def test_a_count_must_read_one_value_per_shape_on_every_run_and_start():
    """Launches per step on two runs and two models sharing a release and case: 01's Kimi and
    Llama stay apart (each its own count); a start that counts one launch more is named."""

    def run(model, created, launches, odd=None):
        t = {(c, s): {128: 10.0, 256: 12.0} for s in range(2) for c in ("pcg", "pcg-off")}
        counts = {k: {128: launches, 256: launches + 1} for k in t}
        if odd:
            counts[odd] = {128: launches + 1, 256: launches + 1}
        return _run(t, model=model, created=created, counts=counts)

    rs = runs.RunSet([
        run("llama_32x512", "2026-11-27T10:00:00Z", 406),
        run("kimi_k25_tiny", "2026-11-27T11:00:00Z", 65),
        run("llama_32x512", "2026-11-28T10:00:00Z", 406, odd=("pcg", 1))
    ])
    assert M.counted(R.frame(rs.every())) == ["prefill_kernel_launches"]
    got = M.exact_counts(rs, "prefill_kernel_launches")
    assert got.loc[("kimi_k25_tiny", "0.5.13", "pcg"), "values"] == "65–66"
    assert got.loc[("llama_32x512", "0.5.13", "pcg-off")].to_dict() == {
        "runs": 2, "values": "406–407", "one value per shape": "yes"
    }
    assert got.loc[("llama_32x512", "0.5.13", "pcg"), "one value per shape"] == "NO"


def test_the_ledger_has_one_row_per_recorded_engine_run_and_names_its_tp_size():
    entries = [(f.number, r, fixes.claims(f.name).ENGINE) for f in fixes.FIXES
               for r in R.load(f.name, f.number).every()]
    got = M.ledger(entries)
    assert len(got) == len(entries) == sum(
        len(runs.load_all_recorded(f"engine_{f.name}")) for f in fixes.FIXES)
    assert list(got.columns) == ["GPU", "date", "TP", "verdict"]
    tp = got.loc["02", "TP"]
    assert set(tp) >= {2, 4} and all(t == r.manifest.tp for t, (n, r, _) in zip(got["TP"], entries))
    assert all("claims hold" in v or v.startswith("no claim applies (") for v in got["verdict"])
    assert not any(v.startswith("0/0") for v in got["verdict"])
    summary = M.ledger_summary(got)
    assert summary["runs"].sum() == len(entries) and summary.loc[("02", "H200"), "TP"] == "2, 4"
    assert summary["failing"].sum() == 0


def test_a_failing_claim_is_counted_in_the_ledger():
    fails = SimpleNamespace(
        EXPERIMENT="engine_pcg_gate", CLAIMS=[
            C.Claim("engine_pcg_gate.never", "never holds", "false",
                    lambda run: C.holds(False, "no"))
        ])
    got = M.ledger([("01", _three(20.0, 21.0), fails)])
    assert got.iloc[0]["verdict"] == "0/1 claims hold, 1 fails (engine_pcg_gate.never)"
    assert M.ledger_summary(got).iloc[0]["failing"] == 1


def test_a_timing_claim_names_the_aa_gap_it_must_clear_on_each_gpu_model():
    mod = fixes.claims("pcg_gate").ENGINE
    got = M.tolerances("01", mod, R.load("pcg_gate", "01")).loc["01"]
    assert list(got.index) == [c.id.split(".", 1)[1] for c in mod.CLAIMS]
    timed = got.loc["captured_prefill_faster"]
    assert timed["rerun"] == "±25%" and [
        g.split()[0] for g in timed["A/A gap to clear"].split(", ")
    ] == ["H100", "H200"]
    assert got.loc["kimi_gate", "rerun"] == "exact" and got.loc["kimi_gate",
                                                                "A/A gap to clear"] == ""
    inf = SimpleNamespace(CLAIMS=[C.Claim("x.host", "s", "e", lambda r: None, drift=math.inf)])
    assert M.tolerances("09", inf, runs.NoRun("x", "none")).iloc[0]["rerun"] == "not compared"


def test_a_views_timings_are_its_pairs_and_its_tables_in_a_unit_of_time():
    df = R.frame([_three(20.0, 21.0)])
    df = pd.concat([df, df.assign(metric="prefill_graph", unit="fraction")])
    view = SimpleNamespace(
        pairs=(Pair("prefill", "input_len", "pcg-off", "x"),),
        tables=(Table("prefill", "input_len"), Table("prefill_graph", "input_len")))
    assert M.timed(view, df) == [("prefill", "input_len")]
    assert M.timed(None, df) == []
    for f in fixes.FIXES:  # every fix's declared view reads as one
        view = getattr(importlib.import_module(f"sglab.{f.name}.show"), "VIEW", None)
        rs = R.load(f.name, f.number)
        if rs:
            assert all(u in M.TIME_UNITS for u in (M.unit_of(R.frame(rs.shown), m)
                                                   for m, _ in M.timed(view, R.frame(rs.shown))))


def test_two_gpu_models_readings_are_set_side_by_side_with_their_ratio():
    a = _three(20.0, 21.0, created="2026-11-27T10:00:00Z")
    b = _three(30.0, 30.0, created="2026-11-28T10:00:00Z", gpu="NVIDIA H200")

    def gain(df):
        return pd.DataFrame([{
            "x": 128, "gain": df[df.metric == "prefill"].value.astype(float).max() / 10.0
        }])

    per = M.by_gpu(runs.RunSet([a], [b]), gain)
    assert list(per) == ["H100", "H200"]
    got = M.side_by_side(per, ["x"], "gain")
    assert got.loc[128].to_dict() == {"H100": 2.1, "H200": 3.0, "H200 ÷ H100": 3.0 / 2.1}
    assert M.side_by_side({"H100": pd.DataFrame()}, ["x"], "gain").empty


def test_the_agreement_figure_draws_a_point_per_cell_of_both_models():
    t = pd.DataFrame({
        "hidden": [512, 512], "tokens": [128, 256], "gain": [1.5, 1.2], "lo": [1.4, 1.1],
        "hi": [1.6, 1.3]
    })
    fig = M.agreement({"H100": t, "H200": t.assign(gain=[1.7, 1.1], hi=[1.8, 1.3])},
                      ["hidden", "tokens"], "t")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("H100", "H200")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["hidden 512"]


def test_the_banner_says_nothing_is_measured_and_refuses_a_bad_mode(capsys):
    M.banner("auto", 69, 6, 18)
    said = capsys.readouterr().out
    assert said.startswith("[sglab] how_we_measure: Mode recorded: every number below is read "
                           "from the 69 committed engine runs of 6 fixes and 18 host probes")
    with pytest.raises(ValueError, match="MODE must be one of"):
        M.banner("lve", 1, 1, 1)
    M.conclude("it repeats.")
    assert capsys.readouterr().out == "So: it repeats.\n"


def test_a_folded_table_prints_whole_outside_a_notebook(capsys):
    df = pd.DataFrame({"a": range(12)})
    M.folded(df, "all of it", 3)
    assert capsys.readouterr().out.count("\n") == 13
    M.folded(pd.DataFrame(), "nothing")
    assert capsys.readouterr().out == ""
