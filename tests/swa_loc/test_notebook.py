"""Notebook 04's order: the review card first, the engine section declared in the main story, the
GPU tables, profiler and claims after the Appendix heading; the profiler links its trace relative
to the checkout."""

from __future__ import annotations

from sglab.core import notebook, runs
from sglab.swa_loc import claims, show
from tests import card_story_appendix


def test_the_card_comes_first_and_the_gpu_tables_after_the_appendix():
    story, after = card_story_appendix("04_swa_loc")
    assert "engine_view.section(show.VIEW, engine, claims.ENGINE)" in story
    assert story.count("reveal(") == 2 and "codepath.show(" in story
    for call in ("show.kernels(run)", "show.times(run)", "show.padding(run)", "show.profiler(run)",
                 "verdict(claims, run)"):
        assert call in after and call not in story, call
    assert not hasattr(show, "engine")


def test_the_profiler_links_its_trace_relative_to_the_checkout(capsys):
    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    show.profiler(runs.RunSet([run.first]))
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Perfetto"))
    assert line.startswith("Perfetto file: data/recorded/swa_loc/") and line.endswith(".json.gz")
