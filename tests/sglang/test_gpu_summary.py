"""The recorded real-SGLang GPU runs, read through the notebooks' summary tables."""

import pytest

from sglab.sglang import compare_old as compare
from sglab.sglang.compare_old import tables


def _run(fix):
    run = compare.recorded(fix)
    if run is None:
        pytest.fail(f"no recorded real_{fix} run under data/recorded/")
    return run


def test_breakable_graph_summary_shows_replay_equal_to_eager():
    t = tables("breakable_graph", _run("breakable_graph").df)
    diffs = t["replay vs eager"]["max_abs_diff_vs_eager_live"].astype(float)
    assert len(diffs) >= 6 and (diffs == 0).all()
    shape = t["graph shape"]
    assert set(shape["segments"].astype(int)) == {5} and set(shape["breaks"].astype(int)) == {4}


def test_without_tables_the_recorded_run_shows_its_tidy_rows(capsys):
    from sglab.sglang import compare as new

    run = new.show_recorded("swa_loc")
    out = capsys.readouterr().out
    assert run is not None and "Real SGLang on a GPU, recorded:" in out and "rows" in out
    assert new.show_recorded("no_such_fix") is None
    assert "not recorded yet" in capsys.readouterr().out
