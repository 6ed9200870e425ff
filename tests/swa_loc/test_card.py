"""04's review card: the engine's exact count first, then what a real layout pays per decode step
priced with the recorded per-SWA-layer costs, then the rebuild; the PR's own words beside what was
found, each filled from the claims' values."""

from __future__ import annotations

import copy

import pytest

from sglab.core import card as K
from sglab.core import claims as C
from sglab.core import engine_records as R
from sglab.core import notebook, runs
from sglab.swa_loc import claims, model_config, sglang
from sglab.tools import verify


@pytest.fixture(scope="module")
def shown():
    return notebook.Workbook(claims, mode="recorded", show=False).run()


@pytest.fixture(scope="module")
def engine():
    return sglang.FIX.recorded_engine()


def _bumped(run, count: str):
    df = run.df.copy()
    sel = (df.variant == "0.5.11+before") & (df.metric == "decode_kernels_per_replay")
    df.loc[sel, "value"] = count
    return runs.Run(df, copy.deepcopy(run.manifest), run.path)


def test_the_engine_answer_is_the_exact_count_per_gpu_model(engine):
    merged = R.per_gpu(engine)
    text = C.headline(claims.ENGINE, merged, merged)
    for r in merged:
        v = C.values(claims.ENGINE, r)["engine_swa_loc.reverted_preset_extra_kernels"].value
        assert f"{v['released']} → {v['before']} kernels on {r.manifest.gpu}" in text
    assert "SWA layers, 2 per SWA layer." in text
    # one more kernel in the reverted replay: the sentence says so
    other = _bumped(merged[0], "149.0")
    assert "140 → 149 kernels" in C.headline(claims.ENGINE, [other], [other])


def test_the_rebuild_prices_a_real_layout_with_each_runs_costs(shown):
    head = C.headline(claims, shown.shown)
    us = [model_config.step_cost(r, **model_config.LAYOUT)["us"] for r in shown.shown]
    assert (f"so a 62-layer 5:1 model (52 SWA layers) at bs 32 pays +104 kernels and "
            f"{min(us):.0f}–{max(us):.0f} µs per decode step" in head)
    assert head.index("per SWA layer in every cell") < head.index("62-layer") < head.index("toy")


def test_the_layout_cost_is_shown_and_never_held_against_a_rerun(shown):
    run = shown.first
    value = C.values(claims, run)["swa_loc.replay_ratio"].value
    cost = model_config.step_cost(run, **model_config.LAYOUT)
    assert (value["layout_kernels"], value["layout_us"]) == (cost["kernels"], cost["us"])
    drift = verify.verify_run(run, against=True).comparison.drift
    assert not [d for d in drift if d["value"].startswith("layout_")]


def test_the_card_sets_the_prs_words_beside_the_values_found(shown, engine):
    p = K.parts(claims.CARD, sglang.FIX, claims, shown, engine)
    (pr1, we1), (pr2, we2) = p["found"]
    assert "instead of the per-layer translate_loc_from_full_to_swa fallback" in pr1
    assert we1.startswith("The fallback is a gather and an int32 cast: 2 kernels per SWA layer")
    assert "corrupt active requests' KV" in pr2 and "overwrote 20 live (layer, slot) pairs" in we2
    md = K.markdown(p)
    assert md.index("140 → 148 kernels") < md.index("62-layer") < md.index("| the PR says")
    # without the engine's pair of 0.5.11 replays, the engine's half of the box is left out
    none = K.parts(claims.CARD, sglang.FIX, claims, shown, runs.NoRun("engine_swa_loc", "none"))
    assert [pr for pr, _ in none["found"]] == [pr2]
