"""Notebook 01's order: the review card first, the lesson and the real engine in the main story
(the PR's serving figures before the engine's own section), the GPU tables, profiler and claims
after the Appendix heading; the method tables (host probe, every run's verdicts) are 07's."""

from __future__ import annotations

from tests import card_story_appendix


def test_the_card_comes_first_and_the_gpu_tables_after_the_appendix():
    story, after = card_story_appendix("01_pcg_gate")
    assert story.count("reveal(") == 2 and "codepath.show(" in story
    assert story.index("serving.show(engine)") < story.index(
        "engine_view.section(show.VIEW, engine, claims.ENGINE)") < story.index(
            "show.width_sweep(engine)") < story.index("show.your_setup(")
    for call in ("show.latency(run)", "show.launches(run)", "show.correctness(run)",
                 "show.profiler(run)", "show.engine_times(engine)", "verdict(claims, run)"):
        assert call in after and call not in story, call
    assert "hostprobe" not in story + after and "verdict(claims.ENGINE" not in story + after
