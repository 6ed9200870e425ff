"""The source check on synthetic trees; the real workspace decisions of 0.5.12.post1 (no floor) and
0.5.13 (the floor) against ``sglab.workspace_floor.rebuild``'s simulation along the workbook's
traces."""

import pytest

from sglab.sglang import compare
from sglab.sglang.runner import ProbeResult
from sglab.sglang.testing import require
from sglab.sglang.upstream import RELEASE_STATES, Verdict
from sglab.workspace_floor import sglang, traces


REAL_CALLS = ["workspace_floor"]  # the notebook's call (conftest)


def state(files: dict) -> Verdict:
    v = sglang.check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


# -- the source check
# -----------------------------------------------------------------------------------------
def _layernorm(kwarg: str) -> dict:
    return {
        sglang.LAYERNORM: f"""
def _forward_with_allreduce_fusion(norm_module, x, residual, weight):
    fused_result = flashinfer_allreduce_residual_rmsnorm(
        input_tensor=x, residual=residual, weight=weight, {kwarg}use_attn_tp_group=True)
    return fused_result
""", sglang.FUSION: """
def flashinfer_allreduce_residual_rmsnorm(input_tensor, residual, weight, eps=1e-6,
                                          max_token_num: int = 2048):
    assert input_tensor.shape[0] <= max_token_num
"""
    }


@pytest.mark.parametrize("kwarg,status,words", [
    ("", "before", "default max_token_num=2048 applies and it asserts"),
    ("max_token_num=max(x.shape[0], 2048), ", "pr-era", "max(x.shape[0], 2048)"),
    ("max_token_num=max(x.shape[0], 4096), ", "changed", "other than the PR's 2048"),
    ("max_token_num=x.shape[0], ", "unknown", "x.shape[0]")
])
def test_check_states(kwarg, status, words):
    v = state(_layernorm(kwarg))
    assert v.status == status and words in v.detail


def test_check_absent_and_unknown():
    assert state({}).status == "absent"
    v = state({sglang.LAYERNORM: "def rms_norm(x):\n    return x\n"})
    assert v.status == "absent" and "does not call" in v.detail
    assert state({sglang.LAYERNORM: "def broken(:\n"}).status == "unknown"


# -- the real releases on the CPU
# -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def results():
    return compare.answers(sglang.FIX)


def _value(result, **where):
    df = result.rows
    for k, v in where.items():
        df = df[df[k] == v]
    assert len(df) == 1, where
    return df["value"].iloc[0]


def test_each_release_has_its_own_call_site(results):
    assert _value(require(results["0.5.12.post1"]), metric="call_site") == "(none)"
    assert _value(require(results["0.5.13"]),
                  metric="call_site") == "max_token_num=max(x.shape[0], 2048)"


def test_real_recreations_equal_the_rebuild_in_every_cell(results):
    for v in sglang.RELEASES:
        require(results[v])
    table = sglang.comparison(results)
    n_cells = (len(sglang.RELEASES) * (1 + len(sglang.ALT_SITES)) * len(traces.TRACES) * len(
        sglang.SCENARIOS))
    assert len(table) == n_cells
    assert compare.check_table(table), table[~table.agrees].to_string()


def test_before_the_floor_the_callee_refuses_every_batch_over_2048(results):
    r = require(results["0.5.12.post1"])
    over = traces.calls_over("mixed", 2048)
    assert over > 0
    assert _value(r, trace="mixed", site="release", scenario="cold", metric="refused_calls") == over
    assert _value(require(results["0.5.13"]), trace="mixed", site="release", scenario="cold",
                  metric="refused_calls") == 0


def test_the_floor_removes_the_short_prompt_churn(results):
    r = require(results["0.5.13"])
    assert _value(r, trace="short_ramp", site="floor_0", scenario="cold", metric="recreations") > 1
    assert _value(r, trace="short_ramp", site="release", scenario="cold", metric="sizes") == [2048]


def test_neither_release_keeps_a_high_water_mark(results):
    for v in sglang.RELEASES:
        r = require(results[v])
        assert set(r.rows.loc[r.rows.metric == "manager_high_water_mark", "value"]) == {False}
    note = sglang.high_water_note(results)
    assert "counts the same" in note and "(the manager of 0.5.14 on)" in note


def test_a_disagreement_is_loud(results, capsys):
    table = sglang.comparison(results)
    bad = table.copy()
    bad.loc[0, "agrees"] = False
    assert compare.check_table(bad) is False
    assert compare.MISMATCH in capsys.readouterr().out


def test_a_release_that_did_not_run_is_one_line_and_no_row():
    missing = ProbeResult(
        "0.5.9", sglang.FIX.probe.fn, "not-run", None,
        reason="sglang 0.5.9: not installed (run `sglab real install --releases 0.5.9`)")
    assert compare.status_lines({"0.5.9": missing}).splitlines()[1] == (
        "sglang 0.5.9: not run: not installed (run `sglab real install --releases 0.5.9`)")
    assert sglang.comparison({"0.5.9": missing}).empty
    assert "no release ran" in sglang.high_water_note({"0.5.9": missing})


def test_without_installed_releases_the_section_says_not_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path))
    monkeypatch.setenv("SGLAB_REAL", "live")
    assert sglang.compare() is None
    out = capsys.readouterr().out
    assert "real SGLang: run here now:" in out and "not run: not installed" in out
    assert "nothing was compared" in out and "no release ran" in out


def test_the_engine_records_the_creations_per_rank():
    """The workspace creations per rank are the real engine's record
    (``engine_workspace_floor``)."""
    assert [s.name for s in sglang.FIX.engine
            ] == ["02-ar-fusion", "02-ar-fusion-tp4", "02-ar-fusion-tp8"]


def test_recorded_answers_equal_the_live_ones(results):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases
    say now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(results, sglang.FIX.probe.fn,
                                    sglang.FIX.probe.resolved_params()) == len(sglang.RELEASES)


def test_the_section_shows_the_real_decisions_in_one_small_table(results, capsys):
    """Each release's own call site first, then the draft and a lower floor, by their one names;
    the full comparison (every cell beside the rebuild's) only with ``full``."""
    for v in sglang.RELEASES:
        require(results[v])
    t = sglang.decisions(results)
    assert list(t.index) == [(v, name) for v, own in (("0.5.12.post1", "released before"),
                                                      ("0.5.13", "merged floor 2048"))
                             for name in (own, "draft x.shape[0]", "floor 1024")]
    over = traces.calls_over("mixed", 2048)
    assert t.loc[("0.5.12.post1", "released before"), ("mixed", "cold")] == f"1 ({over} refused)"
    assert t.loc[("0.5.13", "draft x.shape[0]"), ("short_ramp", "cold")] == str(
        traces.recreations("short_ramp", "shape_no_hwm", sglang.WORLD_SIZE, sglang.HIDDEN))
    assert t.loc[("0.5.13", "draft x.shape[0]"), ("short_ramp", "preinit_2048")] == "0"
    sglang.compare()
    out = capsys.readouterr().out
    assert "agree on all 24" in out and "behaviour" not in out
    sglang.compare(full=True)
    assert "behaviour" in capsys.readouterr().out


def test_the_code_path_names_lines_of_the_release_with_the_floor():
    from sglab.sglang import codepath, releases

    if not (releases.package_dir(sglang.RELEASE) / sglang.LAYERNORM).is_file():
        pytest.skip(f"sglang {sglang.RELEASE} is not installed")
    assert all(codepath.line_of(sglang.RELEASE, n) for n in sglang.CODE_PATH)
    assert sglang.CODE_PATH[0].symbol.endswith("_pre_initialize_flashinfer_allreduce_workspace")


def test_the_full_comparison_shows_every_cell_whole(monkeypatch):
    """Rows that differ only late in a cell (the scenario after the trace) must not read alike:
    in a notebook the comparison table shows each cell whole, whatever the display's column
    width (pandas cuts a cell of its HTML at 50 characters by default)."""
    import pandas as pd

    from sglab.core import notebook

    monkeypatch.setenv("SGLAB_REAL", "recorded")
    results = compare.answers(sglang.FIX)
    if not compare.ran(results):
        pytest.skip("no recorded answers of the releases")
    shown = []  # each table as the notebook renders it, when it is displayed
    monkeypatch.setattr(notebook, "in_notebook", lambda: True)
    monkeypatch.setattr(
        notebook, "_ipy",
        lambda *objs, **_: shown.extend(o._repr_html_() for o in objs if hasattr(o, "_repr_html_")))
    table = sglang.comparison(results)
    with pd.option_context("display.max_colwidth", 50):
        sglang.compare(full=True)
    html = "".join(shown)
    assert [c for c in table["behaviour"] if len(c) > 50]
    for column in ("behaviour", "real", "expected"):
        assert all(f">{c}<" in html for c in table[column].map(str)), column
    assert "...<" not in html


def test_a_cell_says_its_re_creations_in_words():
    """``1× at T=2048``, not a list's repr; no re-creation reads as such, not ``0× at T=[]``."""
    assert sglang._describe({"recreations": 1, "sizes": [2048],
                             "refused_calls": 385}) == ("1× at T=2048, 385 refused")
    assert sglang._describe({"recreations": 2, "sizes": [2048, 4096],
                             "refused_calls": 0}) == ("2× at T=2048, 4096, 0 refused")
    assert sglang._describe({"recreations": 0, "sizes": [],
                             "refused_calls": 385}) == ("never re-created, 385 refused")
