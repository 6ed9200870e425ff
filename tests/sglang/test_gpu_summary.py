"""The recorded real-SGLang GPU runs, read through the notebooks' summary tables."""

import pytest

from sglab.sglang import compare_old as compare
from sglab.sglang.compare_old import tables


def _run(fix):
    run = compare.recorded(fix)
    if run is None:
        pytest.fail(f"no recorded real_{fix} run under data/recorded/")
    return run


def test_swa_pool_summary_shows_the_kernels_each_translation_costs():
    t = tables("swa_loc", _run("swa_loc").df)
    per = t["per SWA layer"]
    assert float(per.loc["0.5.12.post1", "nodes_per_swa_layer"]) == 2.0   # gather + .to(torch.int32)
    assert float(per.loc["0.5.23", "nodes_per_swa_layer"]) == 1.0         # gather only
    g = t["graphs"]
    for release in ("0.5.12.post1", "0.5.23"):
        assert float(g.loc[(release, "preset"), "kernel_nodes"]) < float(g.loc[(release, "per_layer"), "kernel_nodes"])
        assert g.loc[(release, "preset"), "kernel_nodes"] == g.loc[(release, "preset"), "replay_kernels"]
    buffers = t["decode buffers (#24743)"]
    assert buffers.loc["0.5.11", "dtype"] == "int64" and buffers.loc["0.5.12.post1", "dtype"] == "int32"
    assert buffers.loc["0.5.12.post1", "padded_tail_after_padded_populate"] == "[0, 0]"


def test_breakable_graph_summary_shows_replay_equal_to_eager():
    t = tables("breakable_graph", _run("breakable_graph").df)
    diffs = t["replay vs eager"]["max_abs_diff_vs_eager_live"].astype(float)
    assert len(diffs) >= 6 and (diffs == 0).all()
    shape = t["graph shape"]
    assert set(shape["segments"].astype(int)) == {5} and set(shape["breaks"].astype(int)) == {4}


def test_unknown_fix_falls_back_to_the_tidy_rows():
    df = _run("swa_loc").df
    assert list(tables("grid_thw", df)) == ["rows"]
