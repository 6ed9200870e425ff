"""The claim engine and `sglab verify` on a small made-up experiment: statuses, n/a reasons, method
versions, checks that crash, bad run files, --against and JUnit."""

import json
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglab.core import claims, runs
from sglab.core.claims import Claim, Headline, holds, not_applicable
from sglab.tools import cli, fixes, verify


def _kernels(run):
    n = run.df[run.df.metric == "kernels"].set_index("variant").value
    extra = int(n["before"] - n["after"])
    return holds(extra == 2, f"{extra} more kernels", {"extra": extra, "before": int(n["before"])})


def _ratio(run):
    t = run.df[run.df.metric == "time"].set_index("variant").value
    r = float(t["before"] / t["after"])
    return holds(r >= 1.10, f"{r:.2f}×", {"ratio": r})


def _two_gpus(run):
    return None if run.manifest.gpu_count >= 2 else "needs a run on 2 GPUs"


CLAIMS = [
    Claim("demo.extra_kernels", "without the fix, exactly 2 more kernels", "== 2", _kernels),
    Claim("demo.ratio", "before/after time ratio", ">= 1.10", _ratio, drift=0.25),
    Claim("demo.ranks", "both ranks report", "2 ranks", lambda r: holds(True, "2"),
          applies=_two_gpus),
    Claim("demo.new_metric", "a metric only method 2 records", "present",
          lambda r: holds(True, "yes"), methods=(2, None)),
]

DEMO = types.ModuleType("sglab.demo.claims")
DEMO.EXPERIMENT, DEMO.GPUS, DEMO.CLAIM = "demo", 1, "without the fix, two more kernels"
DEMO.CLAIMS = CLAIMS
DEMO.shown = lambda rs: rs[-1:]
DEMO.HEADLINE = Headline(("{runs}",), per_run="{v[demo.ratio][ratio]:.2f}× on {gpu}")


@pytest.fixture
def demo(monkeypatch, data_root):
    monkeypatch.setitem(sys.modules, "sglab.demo.claims", DEMO)
    monkeypatch.setattr(fixes, "NAMES", ("demo",))
    monkeypatch.setattr(fixes, "claims", lambda name: DEMO)
    return data_root


def _write(kernels=(10, 8), times=(2.0, 1.0), gpu_count=1, folder="recorded", method=1):
    df = runs.tidy("demo", [
        {"variant": "before", "metric": "kernels", "value": kernels[0], "unit": "count"},
        {"variant": "after", "metric": "kernels", "value": kernels[1], "unit": "count"},
        {"variant": "before", "metric": "time", "value": times[0], "unit": "ms"},
        {"variant": "after", "metric": "time", "value": times[1], "unit": "ms"},
    ])
    root = runs.data_dir(folder)
    return runs.write_run(df, experiment="demo", method_version=method, params={}, root=root,
                          gpu_count=gpu_count)


def test_statuses_na_reasons_and_method_versions(demo):
    run = verify.load_run(_write())
    res = {r.claim.id: r.outcome for r in claims.evaluate(DEMO, run)}
    assert (res["demo.extra_kernels"].status == "pass"
            and res["demo.extra_kernels"].value == {"extra": 2, "before": 10})
    assert res["demo.ratio"].status == "pass"
    assert res["demo.ranks"].status == "n/a" and "2 GPUs" in res["demo.ranks"].reason
    assert (res["demo.new_metric"].status == "n/a"
            and "method version 1" in res["demo.new_metric"].reason)
    line = claims.verdict_line(claims.evaluate(DEMO, run), run)
    assert line.startswith("2/2 claims hold, 2 n/a on ")
    none = [r for r in claims.evaluate(DEMO, run) if r.status == "n/a"]
    assert claims.verdict_line(none, run).startswith("no claim applies (2 n/a) on ")


def test_a_failing_claim_is_named_with_its_reason(demo, capsys):
    path = _write(kernels=(11, 8))
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL demo.extra_kernels" in out and "3 more kernels" in out


def test_a_check_that_cannot_read_the_run_fails(demo):
    path = _write()
    df = runs.read_run(path).df
    df = df[df.metric != "time"]
    df.to_csv(path, index=False)
    m = json.loads(path.with_suffix(".json").read_text())
    m["rows"] = len(df)
    path.with_suffix(".json").write_text(json.dumps(m))
    res = {r.claim.id: r.outcome for r in claims.evaluate(DEMO, verify.load_run(path))}
    assert res["demo.ratio"].status == "fail" and "could not evaluate" in res["demo.ratio"].reason


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.unlink(), "no such run file"),
    (lambda p: p.with_suffix(".json").unlink(), "has no manifest"),
    (lambda p: p.with_suffix(".json").write_text("{not json"), "not a valid JSON manifest"),
    (lambda p: p.write_text(p.read_text()[:-40]), "manifest recorded"),
    (lambda p: p.write_text(p.read_text().replace(",unit", ",units")), "lacks the column"),
])
def test_bad_run_files_get_one_clear_line(demo, capsys, damage, message):
    path = _write()
    damage(path)
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_unknown_experiment(demo, capsys):
    assert cli.main(["verify", "nope"]) == 2
    assert "unknown experiment or run file 'nope'" in capsys.readouterr().err


def test_against_reports_drift_and_environment(demo, capsys):
    _write(times=(2.0, 1.0))
    live = _write(times=(3.0, 1.0), folder="runs")
    m = json.loads(live.with_suffix(".json").read_text())
    m["driver"] = "999.1"
    live.with_suffix(".json").write_text(json.dumps(m))
    # the ratio holds (> 1) but moved +50% from a reference of the same GPU model: not a rerun
    assert cli.main(["verify", str(live), "--against"]) == 1
    out = capsys.readouterr().out
    assert "demo.ratio.ratio: 3 vs 2 (drift +50.0%" in out and "BEYOND" in out
    assert "demo.ratio.ratio is 3 against 2 in a reference of the same GPU model" in out
    assert "env  driver: 999.1 here" in out
    within = _write(times=(2.2, 1.0), folder="runs")  # +10%, inside the claim's drift
    assert cli.main(["verify", str(within), "--against"]) == 0
    slower = _write(times=(1.2, 1.0), folder="runs")  # a fall is signed as one
    assert cli.main(["verify", str(slower), "--against"]) == 1
    assert "(drift -40.0%" in capsys.readouterr().out


def test_a_drift_the_record_lists_as_not_repeated_is_shown_and_does_not_fail(demo, capsys):
    """A figure named in ``data/recorded/not_repeated.json`` (07 shows why) is printed and leaves
    the exit status alone, so that ``make verify`` can pass on a GPU box; the same drift of a run
    the list does not name fails, and so does another figure of the listed run."""
    _write(times=(2.0, 1.0))
    odd = _write(times=(3.0, 1.0))  # +50% against the first run, beyond the claim's ±25%
    listed = runs.data_dir("recorded") / "not_repeated.json"
    entry = {"run": odd.name, "claim": "demo.ratio", "value": "ratio", "why": "a test's run"}
    listed.write_text(json.dumps([entry]))
    assert cli.main(["verify", str(odd), "--against"]) == 0
    out = capsys.readouterr().out
    assert f"not repeated, as data/recorded/not_repeated.json says (07 shows why): {odd.name}: " \
        "demo.ratio.ratio is 3 against 2" in out and "FAIL" not in out
    assert "1 run(s): 1 hold, 0 fail" in out
    listed.write_text(json.dumps([{**entry, "value": "other"}]))
    assert cli.main(["verify", str(odd), "--against"]) == 1
    assert f"FAIL {odd.name}: demo.ratio.ratio is 3 against 2" in capsys.readouterr().out


def test_against_prefers_a_reference_of_the_runs_method(demo, capsys):
    """A method-1 rerun is held to the newest method-1 run, not to a newer run of method 2 (whose
    ratio here is 3, where method 1 measures 2); with no method-1 run it says which it took."""
    _write(times=(2.0, 1.0), method=1)
    newer = _write(times=(3.0, 1.0), method=2)
    rerun = _write(times=(2.1, 1.0), folder="runs", method=1)
    assert cli.main(["verify", str(rerun), "--against"]) == 0
    out = capsys.readouterr().out
    assert "size and method (1)" in out and "demo.ratio.ratio: 2.1 vs 2 (drift +5.0%" in out
    third = _write(times=(2.9, 1.0), folder="runs", method=3)
    assert cli.main(["verify", str(third), "--against"]) == 0
    out = capsys.readouterr().out
    assert f"against {newer.name} " in out and "none of this run's method (3): method 2" in out


@pytest.mark.parametrize("time, status", [(1.55, 1), (1.65, 0)])
def test_a_drift_is_judged_alike_whichever_run_is_the_reference(demo, capsys, time, status):
    """Against a reference ratio of 2, a rerun's 1.55 is -22.5% signed, within ±25% read that way,
    yet 2 is +29% on 1.55: the two are 29% apart either way round, and the rerun fails. 1.65 is
    21% apart and holds."""
    _write(times=(2.0, 1.0))
    rerun = _write(times=(time, 1.0), folder="runs")
    assert cli.main(["verify", str(rerun), "--against"]) == status
    out = capsys.readouterr().out
    assert f"demo.ratio.ratio: {time:g} vs 2 (drift {time / 2 - 1:+.1%}" in out
    assert ("BEYOND" in out) is bool(status)


def test_exact_value_differing_from_same_gpu_reference_fails(demo, capsys):
    _write(kernels=(10, 8))
    # the claim holds (+2), but a count differs from the reference
    live = _write(kernels=(12, 10), folder="runs")
    assert cli.main(["verify", str(live), "--against"]) == 1
    out = capsys.readouterr().out
    assert "demo.extra_kernels.before: 12 vs 10" in out
    assert "demo.extra_kernels.before is 12 against 10 in a reference of the same GPU" in out
    other_gpu = _write(kernels=(12, 10), folder="runs")
    m = json.loads(other_gpu.with_suffix(".json").read_text())
    m["gpu_name"] = "NVIDIA H200"
    other_gpu.with_suffix(".json").write_text(json.dumps(m))
    # reported, not fatal, across GPU models
    assert cli.main(["verify", str(other_gpu), "--against"]) == 0
    assert "runs of this size on other GPU models (1)" in capsys.readouterr().out


def test_junit(demo, tmp_path):
    path = _write(kernels=(11, 8))
    out = tmp_path / "v.xml"
    assert cli.main(["verify", str(path), "--junit", str(out)]) == 1
    suite = ET.parse(out).getroot().find("testsuite")
    assert (suite.get("failures") == "1" and suite.get("skipped") == "2"
            and suite.get("tests") == "4")
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["demo.extra_kernels"]


def test_junit_into_a_missing_folder_is_refused_before_any_check(demo, tmp_path, capsys,
                                                                 monkeypatch):
    from sglab.tools import verify

    checked = []
    monkeypatch.setattr(verify, "verify_run", lambda *a, **k: checked.append(a))
    path = _write()
    assert cli.main(["verify", str(path), "--junit", str(tmp_path / "nope" / "v.xml")]) == 2
    err = capsys.readouterr().err
    assert checked == [] and err.startswith("sglab verify: --junit ") and "no such folder" in err
    assert len(err.splitlines()) == 1


def test_all_uses_every_recorded_run(demo, capsys):
    _write()
    _write()
    assert cli.main(["verify", "--all"]) == 0
    assert "2 run(s): 2 hold, 0 fail" in capsys.readouterr().out


def test_headline_says_one_value_where_a_range_collapses():
    from types import SimpleNamespace

    from sglab.core.claims import Headline

    h = Headline(parts=("{lo[c]:.1f}–{hi[c]:.1f} µs", "{lo[d]}–{hi[d]} runs"))
    run = SimpleNamespace(manifest=runs.Manifest())
    one = h.render([(run, {"c": 11.5, "d": 3})])
    assert one == "11.5 µs; 3 runs"
    two = h.render([(run, {"c": 11.5, "d": 13}), (run, {"c": 11.52, "d": 3})])
    assert two == "11.5 µs; 3–13 runs"  # 11.50 and 11.52 print alike at one decimal


def test_a_headline_of_several_per_run_templates_gives_each_its_own_list_of_the_runs():
    """``per_run`` as a dict: each name lists its template's text of every shown run; a part
    naming a list is dropped where no run gave it a value."""
    from types import SimpleNamespace

    from sglab.core.claims import Headline

    h = Headline(("a {runs}", "b {step}", "c {v[c]}"), per_run=dict(runs="{v[c]} on {gpu}",
                                                                    step="{v[d]:.1f} on {gpu}"),
                 run_sep=", ", sep=" | ")
    h100, h200 = (
        SimpleNamespace(manifest=runs.Manifest(gpu_name=f"NVIDIA {g}")) for g in ("H100", "H200"))
    both = h.render([(h100, {"c": 1, "d": 2.0}), (h200, {"c": 3, "d": 4.0})])
    assert both == "a 1 on H100, 3 on H200 | b 2.0 on H100, 4.0 on H200 | c 1"
    assert h.render([]) == ""  # no run: no list, no first run's value


def test_a_time_ratio_reads_as_a_change_in_words_and_a_speedup_through_its_inverse():
    from sglab.core.claims import _format

    said = "TTFT {t:%lower|higher}, step {s:/%shorter|longer} ({s:/%|}), gain {s:.2f}×"
    faster, slower = dict(t=0.89, s=1.23), dict(t=1.25, s=0.75)
    assert _format(said, faster) == "TTFT 11% lower, step 19% shorter (19%), gain 1.23×"
    assert _format(said, slower) == "TTFT 25% higher, step 33% longer (33%), gain 0.75×"
    assert _format(said, dict(t=None, s=1.23)) is None  # a missing value still drops the part
    assert _format(said, dict(t=0.89, s=0.0)) is None  # so does a zero ratio (no time to invert)


def test_a_headline_gives_the_range_of_a_shown_runs_other_machines(demo):
    """A number that moves with the host reads as the range over the runs of one GPU model, GPU
    count and method version; a run of another method or GPU count is not its peer."""
    h = Headline(("{runs}",), per_run="{v[demo.ratio][ratio]:.2f}× on {gpu}{across}",
                 across=" ({lo[demo.ratio][ratio]:.2f}–{hi[demo.ratio][ratio]:.2f}× over {n} runs)")
    mod = types.SimpleNamespace(**{**vars(DEMO), "HEADLINE": h})
    made = [(2.0, 1, 1), (3.0, 1, 1), (9.0, 1, 2), (9.0, 2, 1), (2.5, 1, 1)]  # ratio, GPUs, method
    every = [verify.load_run(_write(times=(t, 1.0), gpu_count=g, method=m)) for t, g, m in made]
    newest = every[-1]
    assert claims.headline(mod, [newest], []) == "2.50× on cpu"  # no other run: no range
    assert claims.headline(mod, [newest], every) == "2.50× on cpu (2.00–3.00× over 3 runs)"
    assert claims.headline(mod, [newest]) == claims.headline(mod, [newest], every)  # the record's
    assert claims.headline(mod, [every[2]], every) == "9.00× on cpu"  # alone in its method


@pytest.mark.parametrize("rerun_min, gap, beyond", [(1.40, 0.30, False), (1.40, 0.05, True),
                                                    (1.30, 0.05, False)])
def test_a_timing_tolerates_the_aa_gap_and_its_context_is_not_compared(rerun_min, gap, beyond):
    """A rerun's ratio may move as far as two identical variants lay apart in either run (else
    the claim's own drift, 25%); the gap itself, the margin and the start count are shown, not
    compared."""
    claim = Claim("x.speedup", "s", "e", lambda r: None, drift=0.25,
                  context=("aa_noise", "margin", "starts"), noise="aa_noise")

    def result(value):
        return claims.Result(claim, claims.Outcome(claims.PASS, "", value))

    ref = {"min": 1.10, "aa_noise": 0.02, "margin": 0.08, "starts": 1}
    run = {"min": rerun_min, "aa_noise": gap, "margin": 0.5, "starts": 3}
    rows = claims.drift_rows([result(run)], [result(ref)])
    assert [r["value"] for r in rows] == ["min"]
    assert rows[0]["beyond"] is beyond
    assert rows[0]["tolerance"] == ("±30% (the A/A gap)" if gap > 0.25 else "±25%") + (
        "; starts differ: 3 here, 1 in the reference")  # the fastest of 3 is faster than of 1
    again = claims.drift_rows([result(run)], [result({**ref, "starts": 3})])
    assert "starts differ" not in again[0]["tolerance"]


def test_verifying_an_experiment_with_no_recorded_run_is_not_a_pass(monkeypatch, capsys):
    monkeypatch.setattr(runs, "list_runs", lambda *a, **k: [])
    assert cli.main(["verify", "engine_pcg_gate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("engine_pcg_gate: no recorded run to verify (record one, or sglab verify "
                        "--live engine_pcg_gate on a machine that can run it)")
    assert len(err.splitlines()) == 1


def test_values_the_reference_lacks_are_said_to_be_held_to_nothing():
    """A rerun with a release the reference never ran: its values are listed as held to nothing
    (before, verify printed only the values both had, and a first run looked verified); the
    context values (the A/A gap) are not claimed, so not listed."""

    claim = Claim("x.count", "a count", "= the record", lambda run: holds(True, "", 0), drift=None,
                  context=("aa_noise",))
    other = Claim("x.gate", "a gate", "disabled", lambda run: holds(True, "", 0), drift=None)

    def result(c, v):
        return claims.Result(c, claims.Outcome(claims.PASS, "", v))

    run = [result(claim, {"0.5.11": 1, "0.5.12": 4, "aa_noise": 0.1}), result(other, "off")]
    ref = [result(claim, {"0.5.12": 4, "aa_noise": 0.2})]
    assert claims.unmatched(run, ref) == ["x.count.0.5.11", "x.gate.value"]
    assert claims.unmatched(ref, run) == []
    c = claims.Comparison(SimpleNamespace(path=Path("ref.csv")), "given",
                          claims.drift_rows(run, ref), [], claims.unmatched(run, ref))
    assert verify.format_comparison(c).splitlines()[-1] == (
        "    not in the reference, so held to nothing: x.count.0.5.11, x.gate.value")


def test_an_exact_value_must_equal_one_the_record_holds():
    claim = Claim("x.count", "a count", "= the record", lambda run: holds(True, "", 0), drift=None)

    def result(v):
        return claims.Result(claim, claims.Outcome(claims.PASS, "", v))

    span = {("x.count", ""): [3.0, 4.0]}
    rows = [claims.drift_rows([result(v)], [result(4)], span)[0] for v in (3, 4, 5)]
    assert [r["beyond"] for r in rows] == [False, False, True]
    assert rows[2]["drift"] == pytest.approx(0.25) and rows[2]["reference"] == "3–4 over 2 runs"


def test_a_claim_whose_applies_cannot_read_the_run_fails_naming_why():
    """A run too thin for a claim's own applicability test (a partial engine run) fails that
    claim with the reason, as a check that cannot read it does, and never raises."""

    def unreadable(run):
        raise KeyError("value")

    c = Claim("x.thin", "t", "e", check=lambda run: holds(True, "m"), applies=unreadable)
    out = claims.evaluate_claim(c, types.SimpleNamespace(manifest=runs.Manifest()))
    assert out.status == claims.FAIL and out.reason == "could not evaluate: KeyError: 'value'"


def test_a_record_verified_run_by_run_evaluates_each_run_once(demo, monkeypatch, capsys):
    """`verify --all --against` holds each recorded run to the others: each run's claims are
    evaluated once, for its own verdict and as the reference of the next, not once per use."""
    paths = [_write(times=(2.0 + i / 10, 1.0)) for i in range(3)]
    seen = []
    real = claims.evaluate
    monkeypatch.setattr(claims, "evaluate",
                        lambda mod, run: seen.append(run.path.name) or real(mod, run))
    assert cli.main(["verify", "--all", "--against"]) == 0
    assert "3 run(s): 3 hold, 0 fail" in capsys.readouterr().out
    assert sorted(seen) == sorted(p.name for p in paths)


def test_a_changed_copy_of_a_recorded_run_is_judged_on_its_own_numbers(demo):
    """A run read from the record and changed in memory is not the record's copy: its claims are
    evaluated on what it now holds."""
    _write(times=(2.0, 1.0))
    path = _write(times=(2.0, 1.0))
    run = verify.load_run(path)
    run.df.loc[(run.df.metric == "time") & (run.df.variant == "before"), "value"] = 1.0
    v = verify.verify_run(run, against=True)
    assert {r.claim.id: r.status for r in v.failed} == {"demo.ratio": claims.FAIL}
    assert verify.verify_run(verify.load_run(path), against=True).failed == []


def test_the_claims_table_reads_from_the_left_with_each_status_coloured(demo):
    """JupyterLab and the report right-align table cells; the claims table is sentences, so every
    cell of it is set left and to the top, and the status keeps its colour."""
    from html.parser import HTMLParser

    from sglab.core import notebook

    class Cells(HTMLParser):

        def __init__(self):
            super().__init__()
            self.cells = []

        def handle_starttag(self, tag, attrs):
            if tag in ("td", "th"):
                self.cells.append(dict(attrs).get("style") or "")

    page = notebook.verdict_html(DEMO, verify.load_run(_write(kernels=(11, 8))))
    parser = Cells()
    parser.feed(page)
    filled = [s for s in parser.cells if s]
    assert len(filled) == 6 * 5 and all("text-align:left;vertical-align:top" in s for s in filled)
    assert sum("color:#c0392b" in s for s in filled) == 1  # demo.extra_kernels fails
    assert len(parser.cells) - len(filled) == 0


def test_a_folded_check_that_does_not_apply_is_not_counted_as_failing(demo):
    """A claim's checks summary counts only the checks that apply: one that is n/a on this run
    (a one-GPU run's two-rank check) is named n/a, not read as one that does not hold."""
    import dataclasses

    from sglab.core import notebook

    ranks, kernels = CLAIMS[2], CLAIMS[0]
    module = types.ModuleType("sglab.demo_folded.claims")
    module.EXPERIMENT, module.GPUS, module.CLAIM = "demo", 1, DEMO.CLAIM
    module.CLAIMS = [dataclasses.replace(kernels, folded=(ranks,))]
    page = notebook.verdict_html(module, verify.load_run(_write(kernels=(10, 8))))
    assert "checks under it: 0/0 hold, 1 n/a</summary>" in page
