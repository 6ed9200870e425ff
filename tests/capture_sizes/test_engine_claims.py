"""06's real-engine claims on the committed TP-2 engine runs (data/recorded/engine_capture_sizes/):
they hold, and each fails by name when a damaged copy says otherwise."""

from __future__ import annotations

import pytest

from sglab.capture_sizes import claims as C
from sglab.capture_sizes import show as S
from sglab.core import claims as core
from sglab.core import runs
from tests.edits import copy_run, set_value


FAILS, FILTER = ("engine_capture_sizes.unfiltered_release_fails",
                 "engine_capture_sizes.filtered_release_captures_pr_filter")


def _both():
    """The committed run in which both 0.5.14 and 0.5.11 answered."""
    for r in runs.load_all_recorded("engine_capture_sizes"):
        if {f["release"] for f in S.engine_facts(r)} == {"0.5.14", "0.5.11"}:
            return r
    pytest.skip("no committed engine_capture_sizes run with both releases")


def _status(run) -> dict:
    return {r.claim.id: r.status for r in core.evaluate(C.ENGINE, run)}


def test_the_committed_engine_runs_hold():
    for r in runs.load_all_recorded("engine_capture_sizes"):
        assert core.FAIL not in _status(r).values(), r.path.name
    run = _both()
    assert _status(run) == {FAILS: core.PASS, FILTER: core.PASS}
    facts = {f["release"]: f for f in S.engine_facts(run)}
    assert facts["0.5.11"]["asked"] == [3, 4, 5, 8] and facts["0.5.11"]["captured"] == [4, 8]
    assert "same size as output size times world size" in facts["0.5.14"]["status"]


@pytest.mark.parametrize("edit, claim", [
    (dict(value="3 4 5 8", variant="0.5.11+odd-sizes", metric="pcg_tokens"), FILTER),
    (dict(value="error: RuntimeError: CUDA out of memory", variant="0.5.11+odd-sizes",
          metric="status"), FILTER),
    (dict(value="ok", variant="0.5.14+odd-sizes", metric="status"), FAILS),
    (dict(value="error: RuntimeError: CUDA out of memory", variant="0.5.14+odd-sizes",
          metric="status"), FAILS),
])
def test_a_damaged_copy_fails_naming_the_claim(tmp_path, edit, claim):
    value = edit.pop("value")
    dst = copy_run(_both().path, tmp_path, lambda df: set_value(df, value, **edit))
    assert _status(runs.read_run(dst))[claim] == core.FAIL


def test_a_variant_the_harness_cut_off_is_no_answer(tmp_path):
    dst = copy_run(
        _both().path, tmp_path, lambda df: set_value(df, "timeout: no exit in 300 s", variant=
                                                     "0.5.14+odd-sizes", metric="status"))
    assert _status(runs.read_run(dst))[FAILS] == core.NA


def test_flag_lists_read_up_to_the_next_flag():
    argv = ["--tp-size", "2", "--piecewise-cuda-graph-tokens", "3", "4", "--cuda-graph-max-bs", "8"]
    assert S.flag_list(argv, ("--piecewise-cuda-graph-tokens",)) == [3, 4]
    assert S.flag_list(argv, ("--tp-size",)) == [2] and S.flag_list(argv, ("--nope",)) == []


@pytest.mark.parametrize("captured, status", [("kept", core.PASS), ("default", core.FAIL)])
def test_without_a_size_flag_the_release_default_list_is_what_was_asked(captured, status):
    """#23972's own start-up (TP 8, no size flag): the sizes asked are the release's default list,
    so 0.5.14's failure is on it and 0.5.11 must capture what the PR's filter keeps of it, not the
    whole list."""
    import copy

    from sglab.capture_sizes import rebuild as fx

    run = _both()
    manifest = copy.deepcopy(run.manifest)
    for e in manifest.engine_runs:
        e["server_args"], e["tp"] = ["--tp-size", "8", "--moe-dense-tp-size", "1"], 8
        e["resolved"] = {"piecewise_cuda_graph_tokens": None}
    default = fx.default_piecewise_capture_sizes(fx.MLA_MAX_TOKENS)
    kept = fx.filter_piecewise_capture_sizes(default, 8)
    assert {4, 12, 20, 28}.isdisjoint(kept) and set(default) - set(kept) == {4, 12, 20, 28}
    df = set_value(run.df.copy(), " ".join(map(str, kept if captured == "kept" else default)),
                   variant="0.5.11+odd-sizes", metric="pcg_tokens")
    damaged = runs.Run(df, manifest, run.path)
    facts = {f["release"]: f for f in S.engine_facts(damaged)}
    assert facts["0.5.14"]["asked"] == default and facts["0.5.11"]["attn_tp"] == 8
    assert _status(damaged) == {FAILS: core.PASS, FILTER: status}


def test_a_release_that_failed_in_two_variants_is_named_once(tmp_path):
    """The TP-2 and TP-4 record merged holds 0.5.14's failure twice (odd sizes, TP-4 sizes): the
    claim's value names the release once, so a rerun of one of them reads alike."""
    from sglab.core import engine_records as E

    found = runs.load_all_recorded("engine_capture_sizes")
    merged = E.merged(found)
    fails = [f for f in C._unfiltered(merged) if f["release"] == "0.5.14"]
    if len(fails) < 2:
        pytest.skip("no committed 0.5.14 failure in two variants")
    out = {r.claim.id: r.outcome for r in core.evaluate(C.ENGINE, merged)}[FAILS]
    assert out.value["releases"] == "0.5.14"
    assert out.measured.startswith("0.5.14 at attention TP")


def test_the_engine_table_reads_by_attention_tp_then_release():
    """Each TP size's rows together, the older release first (the table of every recorded TP
    size read 0.5.14, 0.5.11 at TP 2 and 0.5.11, 0.5.14 at TP 4)."""
    from sglab.core import engine_records
    from sglab.sglang.releases import parse_version

    merged = engine_records.merged(runs.load_all_recorded("engine_capture_sizes"))
    table = S.engine_table(merged)
    assert table.loc["0.5.11", "rebuild keeps"].tolist() == ["4 8", "4 8"]
    order = list(zip(table["attention TP"], table.index))
    assert order == sorted(order, key=lambda k: (k[0], parse_version(k[1])))
    assert {tp for tp, _ in order} >= {2, 4} and len(order) == len(set(order))


def _engine_facts_line(merged) -> tuple[str, str, str]:
    """What the engine runs say, read from them here: the release without the filter, its TP
    sizes and SGLang's first error line."""
    fails = [f for f in S.engine_facts(merged) if f["status"] != "ok"]
    tps = " and ".join(dict.fromkeys(str(f["attn_tp"]) for f in fails))
    return fails[0]["release"], tps, S.first_line(fails[0])


def test_the_card_leads_with_the_engines_start_up_failure_at_each_tp_size():
    """The card's engine answer names the release that fails at start-up, at every recorded TP
    size, in SGLang's own words, before the rebuild's answer; its box fills the PR's comment beside
    the computed cost of the filter and the releases that lost it."""
    from sglab.capture_sizes import sglang
    from sglab.core import card as K
    from sglab.core import engine_records, notebook

    engine = sglang.FIX.recorded_engine()
    if not engine:
        pytest.skip("no committed engine_capture_sizes run")
    release, tps, message = _engine_facts_line(engine_records.per_gpu(engine)[0])
    assert (release, tps) == ("0.5.14", "2 and 4")
    run = notebook.Workbook(C, mode="recorded", show=False).run()
    p = K.parts(C.CARD, sglang.FIX, C, run, engine)
    assert f"{release} fails at start-up at attention TP {tps}: `{message}`" in p["engine"]
    assert "0.5.11 starts at TP 2 and 4" in p["engine"] and "→ 4, 8 at TP 4" in p["engine"]
    assert "affected again (the fix was lost) 0.5.14" in p["releases"]
    md = K.markdown(p)
    assert md.index("Real SGLang engine") < md.index("The rebuild")
    found = dict(p["found"])
    assert len(found) == 3
    said = next(v for k, v in found.items() if "Drop captures" in k)
    assert "4, 12, 20, 28 of the 42 default sizes" in said and f"{release} fails" in said
    lcm = next(v for k, v in found.items() if "attn_tp_size * attn_cp_size" in k)
    assert "multiples of 24 where 12 would do (13 sizes kept, not 14)" in lcm


def test_the_engine_section_is_the_declared_view_with_one_verdict_line_per_gpu(capsys):
    from sglab.capture_sizes import sglang
    from sglab.core import engine_view

    engine = sglang.FIX.recorded_engine()
    if not engine:
        pytest.skip("no committed engine_capture_sizes run")
    engine_view.section(S.VIEW, engine, C.ENGINE)
    out = capsys.readouterr().out
    assert out.startswith("real SGLang engines, dummy weights, DeepSeek-V3-style 2 layers")
    assert "stopped at start-up: ValueError: input tensor must be the same size" in out
    gpus = {r.manifest.gpu for r in [*engine.shown, *engine.elsewhere]}
    assert out.count("claims hold on") == len(gpus)
