"""05's review card on the committed runs: the engine's answer before the rebuild's, the PR's words
beside what was found with every field filled from the claims' values, and the request's code path
linked to lines of the release that has the fix."""

import re

import pytest

from sglab.core import card as K
from sglab.core import notebook, runs
from sglab.grid_thw import claims, sglang, show
from sglab.sglang import codepath


def _parts(engine=None):
    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    engine = sglang.FIX.recorded_engine() if engine is None else engine
    return K.parts(claims.CARD, sglang.FIX, claims, run, engine)


def test_the_card_leads_with_the_engine_and_fills_every_pair_from_the_runs():
    engine = sglang.FIX.recorded_engine()
    if not any(show.engine_gpus(r) == 4 for r in engine.shown):
        pytest.skip("no committed four-GPU engine run")
    p = _parts(engine)
    md = K.markdown(p)
    assert md.index("Real SGLang engine") < md.index("The rebuild")
    assert len(p["found"]) == len(claims.CARD.found) == 4  # every value is in the record
    text = " ".join(we for _, we in p["found"])
    assert "{" not in text and "}" not in text
    # the stray contexts of the engine run that saw four GPUs, computed, not typed
    four = max((r for r in engine.shown if show.engine_gpus(r) == 4),
               key=lambda r: r.manifest.created_utc)
    contexts, mib = show.engine_stray(four, "before")
    assert f"{contexts} stray contexts, {mib:,.0f} MiB" in p["found"][0][1]
    assert f"{contexts} stray contexts hold {mib:,.0f} MiB" in p["engine"]
    # the per-image rate on both sides, over the same denominator (images)
    rebuild_run = claims.shown(runs.load_all_recorded("grid_thw"))[0]
    c = show.cache_table(rebuild_run.df)
    rates = [f"{r:.1%}" for r in c.cache_image_hit_rate]
    assert re.search(
        f"{re.escape(rates[0])} of images come from the cache before, "
        f"{re.escape(rates[1])} after", p["found"][3][1])
    # pixel_values reached every rank on the CPU in every variant
    pixels = rebuild_run.df[rebuild_run.df.metric == "pixel_values_device"].value
    assert f"on the CPU in {len(pixels)} of the rebuild's {len(pixels)} landings" in \
        p["found"][2][1]


def test_without_engine_runs_the_card_keeps_the_rebuilds_pairs_only():
    p = _parts(runs.NoRun("engine_grid_thw", "none recorded"))
    assert "none recorded" in p["engine"] and p["engine_verdicts"] == []
    assert [pr for pr, _ in p["found"]
            ] == [pr for pr, _ in claims.CARD.found[1:2]
                  ] + [claims.CARD.found[3][0]]  # the pairs that name an engine value are left out


def test_the_code_path_names_symbols_of_the_release_with_the_fix():
    assert sglang.FIX.releases()[[v for v, _ in sglang.FIX.releases()
                                  ].index(sglang.CODE_PATH_RELEASE)][1] == "pr-era"
    if codepath.read(sglang.CODE_PATH_RELEASE, sglang.CODE_PATH[0].path) is None:
        pytest.skip(f"sglang {sglang.CODE_PATH_RELEASE} is neither installed nor cached here")
    lines = [codepath.line_of(sglang.CODE_PATH_RELEASE, n) for n in sglang.CODE_PATH]
    assert all(isinstance(n, int) and n > 0 for n in lines), dict(zip(sglang.CODE_PATH, lines))
