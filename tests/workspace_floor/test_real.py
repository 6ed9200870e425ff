"""The real workspace decisions of 0.5.12.post1 (no floor) and 0.5.13 (the floor), against
``sglab.fixes.workspace_floor``'s simulation along the workbook's traces; and the shared real-section pieces."""

import json

import pandas as pd
import pytest

from sglab.experiments.workspace_floor import real, trace_tokens
from sglab.sglang import compare_old as report
from sglab.sglang.runner import ProbeResult
from sglab.sglang.testing import require

REAL_CALLS = ["workspace_floor"]  # the notebook's call (conftest)


@pytest.fixture(scope="module")
def results():
    return real.probe()


def _value(result, **where):
    df = result.rows
    for k, v in where.items():
        df = df[df[k] == v]
    assert len(df) == 1, where
    return df["value"].iloc[0]


def test_each_release_has_its_own_call_site(results):
    assert _value(require(results["0.5.12.post1"]), metric="call_site") == "(none)"
    assert _value(require(results["0.5.13"]), metric="call_site") == "max_token_num=max(x.shape[0], 2048)"


def test_real_recreations_equal_the_rebuild_in_every_cell(results):
    for v in real.RELEASES:
        require(results[v])
    table = real.comparison(results)
    n_cells = len(real.RELEASES) * (1 + len(real.ALT_SITES)) * len(real.params()["traces"]) * len(real.SCENARIOS)
    assert len(table) == n_cells
    assert report.check_table(table), table[~table.agrees].to_string()


def test_before_the_floor_the_callee_refuses_every_batch_over_2048(results):
    r = require(results["0.5.12.post1"])
    over = sum(int(t) > 2048 for t in trace_tokens("mixed"))
    assert over > 0
    assert _value(r, trace="mixed", site="release", scenario="cold", metric="refused_calls") == over
    assert _value(require(results["0.5.13"]), trace="mixed", site="release", scenario="cold",
                  metric="refused_calls") == 0


def test_the_floor_removes_the_short_prompt_churn(results):
    r = require(results["0.5.13"])
    churn = _value(r, trace="short_ramp", site="floor_0", scenario="cold", metric="recreations")
    assert churn > 1
    assert _value(r, trace="short_ramp", site="release", scenario="cold", metric="sizes") == [2048]


def test_neither_release_keeps_a_high_water_mark(results):
    for v in real.RELEASES:
        r = require(results[v])
        assert set(r.rows.loc[r.rows.metric == "manager_high_water_mark", "value"]) == {False}
    note = real.high_water_note(results)
    assert "counts the same" in note and "(the manager of 0.5.14 on)" in note


# -- the shared pieces -----------------------------------------------------------------------------------------
def test_check_is_loud_on_a_mismatch(capsys):
    table = pd.DataFrame([{"release": "x", "agrees": True}, {"release": "y", "agrees": False}])
    assert report.check_table(table) is False
    assert report.MISMATCH in capsys.readouterr().out
    assert report.check_table(table.iloc[:1]) is True
    assert report.check_table(table.iloc[:0]) is False


def test_a_missing_release_is_one_not_run_line():
    missing = ProbeResult("0.5.9", "workspace_floor:run", "not-run", None,
                          reason="sglang 0.5.9: not installed (run `sglab real install --releases 0.5.9`)")
    assert report.not_run_lines({"0.5.9": missing}) == [
        "sglang 0.5.9: not run: not installed (run `sglab real install --releases 0.5.9`)"]
    assert real.comparison({"0.5.9": missing}).empty


def test_recorded_hook_says_not_recorded_then_shows_the_newest(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLAB_DATA", str(tmp_path))
    line, df = report.recorded_summary("workspace_floor")
    assert df is None and "not recorded yet" in line
    folder = tmp_path / "recorded" / "real_workspace_floor"
    folder.mkdir(parents=True)
    for stamp, value in (("20260101T000000Z", 1), ("20260102T000000Z", 2)):
        pd.DataFrame([{"experiment": "real_workspace_floor", "variant": "floor", "release": "0.5.23",
                       "metric": "recreations", "value": value, "unit": "count"}]).to_csv(folder / f"{stamp}.csv",
                                                                                           index=False)
        (folder / f"{stamp}.json").write_text(json.dumps({
            "experiment": "real_workspace_floor", "created_utc": stamp, "gpu_name": "NVIDIA H200", "gpu_count": 2,
            "params": {"releases": ["0.5.23"], "shims": {"0.5.23": ["sgl_kernel"]}}}))
    line, tables = report.recorded_summary("workspace_floor")
    assert "20260102T000000Z" in line and "0.5.23" in line and "sgl_kernel" in line
    assert list(tables["rows"]["value"]) == [2]


def test_every_section_says_not_run_when_no_release_is_installed(tmp_path, monkeypatch, capsys):
    """With no release installed, the section's cells print "not run" lines and raise nothing."""
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path))
    for section in (real,):
        results = section.probe()
        source, *lines = report.status_lines(results).splitlines()
        assert source.startswith("real SGLang: run here now:")
        assert lines and all(line.split(": ", 1)[1].startswith("not run: not installed") for line in lines)
        assert report.check_table(section.comparison(results)) is False
    assert "no release ran" in real.high_water_note(real.probe())
    assert "nothing was compared" in capsys.readouterr().out


def test_recorded_answers_equal_the_live_ones(results):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases say now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(results, "workspace_floor:run", real.params()) == len(real.RELEASES)
