"""The ledger of recorded engine runs (docs/operating.md): each run named by its scenario, its
verdict its own, and the releases no run has started listed."""

from __future__ import annotations

import copy

from sglab.core import runs
from sglab.tools import fixes, ledger
from tests.edits import copy_run, set_value


def _runs(experiment: str) -> list:
    return runs.load_all_recorded(experiment)


def test_every_recorded_run_is_named_by_a_scenario_of_its_fix():
    names = {s.name: s for s in fixes.scenarios()}
    for r in ledger.every_run():
        name = ledger.scenario_of(r)
        assert name in names, (r.path.name, name)
        assert names[name].experiment == r.manifest.experiment, r.path.name


def test_the_width_sweep_and_the_pcg_pair_share_a_model_but_not_a_scenario():
    """01-llama-pcg and 01-llama-width both start llama_32x512 at TP 1: the cases decide."""
    seen = {ledger.scenario_of(r) for r in _runs("engine_pcg_gate")}
    assert {"01-kimi-pcg", "01-llama-pcg", "01-llama-width"} <= seen


def test_a_server_run_and_a_bench_run_of_one_model_are_named_by_their_tool():
    """01-kimi-full-serve and 01-kimi-full-bench start kimi_k25_full with the same cases: the tool
    decides."""
    named = {}
    for r in _runs("engine_pcg_gate"):
        tools = {s.get("tool") for s in r.manifest.params.get("specs", [])}
        if {s.get("model") for s in r.manifest.params.get("specs", [])} == {"kimi_k25_full"}:
            named.setdefault(ledger.scenario_of(r), set()).update(tools)
    assert named == {"01-kimi-full-serve": {"serve"}, "01-kimi-full-bench": {"bench"}}


def test_a_run_of_no_scenario_says_its_model_and_tp_size():
    run = copy.copy(_runs("engine_grid_thw")[0])
    run.manifest = copy.deepcopy(run.manifest)
    for s in run.manifest.params["specs"]:
        s["server_args"], s["tp"] = ["--tp-size", "3"], 3
    assert ledger.scenario_of(run) == "kimi_k25_tiny at TP 3"


def test_a_row_says_how_its_engines_ended_and_a_part_machine():
    by = {ledger.scenario_of(r): r for r in ledger.every_run()}
    row = ledger.row(by["06-dense-tp1"])
    assert "error" in row.split("|")[5]  # 0.5.14's start-up error is what the claim expects
    tp2_on_4 = [
        r for r in _runs("engine_grid_thw") if r.manifest.gpu_count_machine > r.manifest.gpu_count
    ]
    assert tp2_on_4, "the committed TP-2 run on a 4-GPU machine"
    assert " ×2 of 4" in ledger.row(tp2_on_4[0])


def test_a_row_counts_the_starts_a_profiled_decode_was_timed_in():
    """04 profiles its decode in each of its interleaved starts, 01 counts launches in a profiled
    prefill after them: both rows give the starts, 01's with its launch pass."""
    by = {ledger.scenario_of(r): r for r in ledger.every_run()}
    for name, said in (("04-swa-kernels", "3"), ("01-kimi-pcg", "3 + launch pass")):
        specs = by[name].manifest.params["specs"]
        assert 1 + max(s["start"] for s in specs if s.get("profile_stage") == "decode") == 3
        assert ledger.row(by[name]).split("|")[4].strip() == said, name


def test_a_damaged_copy_shows_its_failing_claim(tmp_path):
    both = [
        r for r in _runs("engine_capture_sizes") if ledger.row(r).endswith("| 2/2 claims hold |")
    ]
    assert both, "a committed run where 0.5.14 failed at start-up and 0.5.11 captured"
    both = both[0]
    dst = copy_run(both.path, tmp_path,
                   lambda df: set_value(df, "ok", variant="0.5.14+odd-sizes", metric="status"))
    row = ledger.row(runs.read_run(dst))
    assert "1/2 claims hold, 1 fails (engine_capture_sizes." in row  # 07's words, the claim named


def test_releases_no_run_started_are_listed_by_scenario():
    found = ledger.every_run()
    missing = "\n".join(ledger.not_recorded(found))
    assert "`06-dense-tp1` (2 GPUs): 0.5.23" in missing  # needs torch 2.14: never started
    assert "`01-kimi-pcg`" not in missing
    without_05 = [r for r in found if r.manifest.experiment != "engine_grid_thw"]
    assert "- `05-grid-thw` (2 GPUs): 0.5.11" in ledger.not_recorded(without_05)


def test_the_block_counts_its_rows():
    text = ledger.block()
    rows = [ln for ln in text.splitlines() if ln.startswith("| 20")]
    assert len(rows) == len(ledger.every_run())
    assert text.startswith(ledger.START) and text.endswith(ledger.END)
    assert f"{len(rows)} recorded runs on " in text
