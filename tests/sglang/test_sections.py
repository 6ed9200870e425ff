"""Every notebook's real-SGLang section where no release is installed: one "not run" line per
release, nothing compared (and it says so), nothing raised."""

from __future__ import annotations

import importlib

import pytest

from sglab.sglang import compare as real

# what the last line adds, where a fix's section says more than "nothing was compared"
LAST_LINE = {
    "capture_sizes": "vs the rebuilt one: no release ran",
    "swa_loc": "no release ran: the kernels per translation of the real code are not known here",
}


@pytest.mark.parametrize(
    "name",
    ["breakable_graph", "capture_sizes", "grid_thw", "pcg_gate", "swa_loc", "workspace_floor"])
def test_the_section_says_not_run_when_no_release_is_installed(name, tmp_path, monkeypatch, capsys):
    sglang = importlib.import_module(f"sglab.{name}.sglang")
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(tmp_path))
    monkeypatch.setenv("SGLAB_REAL", "live")
    assert sglang.compare() is None  # a cell ending in it shows its table once, not again
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("real SGLang: run here now:")
    assert len(sglang.comparison(real.answers(sglang.FIX))) == 0
    lines = [ln for ln in out if ln.startswith("sglang ")]
    assert len(lines) == len(sglang.FIX.probe.releases)
    assert all(ln.split(": ", 1)[1].startswith("not run: not installed") for ln in lines)
    assert any("nothing was compared" in ln for ln in out)
    if name in LAST_LINE:
        assert out[-1].endswith(LAST_LINE[name])


def test_a_comparison_reads_by_release_with_yes_or_no_and_a_dash_for_no_answer():
    """No bare row numbers, no ``None``, no ``True``: a missing answer is "—", agreement yes/NO."""
    import pandas as pd

    from sglab.sglang import compare

    df = pd.DataFrame({
        "release": ["0.5.10.post1", "0.5.11"], "behaviour": ["buffer", "buffer"],
        "real": [None, ("int64", [13, 14])], "must match": ["rebuild: before", "rebuild: pr"],
        "expected": [None, ("int64", [13, 14])], "agrees": [True, False], "extra": [1, 2]
    })
    got = compare.shown(df)
    assert got.index.name == "release" and list(got.columns) == compare.COLUMNS[1:]
    assert list(got["real"]) == ["—", ("int64", [13, 14])] and list(got["agrees"]) == ["yes", "NO"]
