"""04's real-engine runs (data/recorded/engine_swa_loc/): the engine claims fail when a run says
otherwise, each replay count is one number over its engine starts and the same on H100 and H200,
and every recorded run's counts read as one count per release and case."""

from __future__ import annotations

import copy

import pytest

from sglab.core import claims as C
from sglab.core import engine_records as R
from sglab.core import engine_stats as S
from sglab.core import runs
from sglab.swa_loc import claims
from tests.edits import edited, engine_run, statuses


pytestmark = pytest.mark.long(20)
ENGINE = "engine_swa_loc"


def _several_starts(variant: str) -> list:
    """The committed runs in which ``variant`` ran as several engine starts."""
    out = []
    for r in runs.load_all_recorded(ENGINE):
        d = S.numbers(R.frame([r]), "decode_kernels_per_replay", only_started=True)
        if ((d.variant == variant) & (d.starts > 1)).any():
            out.append(r)
    return out


def _one_start_counts_one_more(run):
    df = run.df.copy()
    sel = (df.variant == "0.5.11+before") & (df.metric == "decode_kernels_per_replay")
    df.loc[df[sel].index[0], "value"] = "149"
    return runs.Run(df, copy.deepcopy(run.manifest), run.path)


def test_swa_engine_claim_is_the_rebuilds_two_kernels_per_swa_layer():
    run = engine_run(ENGINE, "0.5.11+before")
    out = C.evaluate(claims.ENGINE, run)[0].outcome
    assert out.status == "pass" and out.value["per_swa_layer"] == claims.EXTRA_PER_SWA_LAYER
    assert out.value["before"] - out.value["released"] == 2 * out.value["swa_layers"]
    one_more = out.value["before"] + 1
    bad = edited(run, "0.5.11+before", "decode_kernels_per_replay", str(float(one_more)))
    assert statuses(claims.ENGINE, bad)["engine_swa_loc.reverted_preset_extra_kernels"] == "fail"
    gone = edited(run, "0.5.11+before", "status", "error")
    assert statuses(claims.ENGINE, gone)["engine_swa_loc.reverted_preset_extra_kernels"] == "n/a"


def test_swa_replay_counts_are_one_number_per_variant_over_its_starts():
    found = _several_starts("0.5.11+before")
    if not found:
        pytest.skip(f"no committed {ENGINE} run with several starts of 0.5.11+before")
    run = found[0]
    out = {r.claim.id: r.outcome for r in C.evaluate(claims.ENGINE, run)}
    counts = out["engine_swa_loc.replay_kernels_exact"]
    assert counts.status == "pass"
    assert counts.value == {"0.5.11+released": 140, "0.5.11+before": 148}
    # one start that replayed one kernel more: the starts disagree, and the claim says where
    bad = {
        r.claim.id: r.outcome
        for r in C.evaluate(claims.ENGINE, _one_start_counts_one_more(run))
    }
    assert bad["engine_swa_loc.replay_kernels_exact"].status == "fail"
    assert "0.5.11+before 148–149" in bad["engine_swa_loc.replay_kernels_exact"].measured


def test_swa_replay_counts_are_the_same_on_h100_and_h200():
    """Each H200 run's counts against the H100 run of the same releases: equal, compared exactly
    (a count that differed would be shown as beyond an exact tolerance)."""
    from sglab.tools import verify

    found = runs.load_all_recorded(ENGINE)
    claim = "engine_swa_loc.replay_kernels_exact"

    def counts(r):
        out = {x.claim.id: x.outcome for x in C.evaluate(claims.ENGINE, r)}[claim]
        return out.value if out.status == "pass" else None

    by_gpu = {
        g: [(r, counts(r)) for r in found if runs.gpu_short(r.manifest) == g and counts(r)]
        for g in ("H100", "H200")
    }
    pairs = [(r, h) for r, c in by_gpu["H200"] for h, hc in by_gpu["H100"] if set(c) == set(hc)]
    if not pairs:
        pytest.skip(f"no H200 and H100 {ENGINE} runs of the same releases")
    for r, h in pairs:
        rows = [
            d for d in verify.verify_run(r, against=True, reference=h).comparison.drift
            if d["claim"] == claim
        ]
        assert rows and all(d["tolerance"] == "exact" and not d["beyond"] for d in rows), rows
    first = pairs[0][0]
    variant = first.df[first.df.metric == "decode_kernels_per_replay"].variant.iloc[0]
    bumped = edited(first, variant, "decode_kernels_per_replay", "1")
    rows = [
        d for d in verify.verify_run(bumped, against=True, reference=pairs[0][1]).comparison.drift
        if d["claim"] == claim
    ]
    assert any(d["beyond"] for d in rows)
