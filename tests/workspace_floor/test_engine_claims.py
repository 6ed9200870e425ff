"""02's real-engine claims on the committed TP-2 engine runs
(data/recorded/engine_workspace_floor/): they hold, the engine's creations equal the rebuild's
simulation with SGLang's pre-initialisation, and a log with one creation more fails by name."""

from __future__ import annotations

import gzip
import json

from sglab.core import claims as core
from sglab.core import runs
from sglab.workspace_floor import claims as C
from sglab.workspace_floor import rebuild
from sglab.workspace_floor import sglang as S
from sglab.workspace_floor import show
from tests.edits import copy_run


EQUAL, NONE = ("engine_workspace_floor.creations_equal_simulation",
               "engine_workspace_floor.no_creation_per_forward_step")


def _status(run) -> dict:
    return {r.claim.id: r.status for r in core.evaluate(C.ENGINE, run)}


def test_every_variant_creates_two_workspaces_per_rank_at_2048_as_simulated():
    recorded = runs.load_all_recorded("engine_workspace_floor")
    facts = [f for r in recorded for f in S.engine_facts(r)]
    assert {f["variant"]
            for f in facts} == {"0.5.12.post1+fusion", "0.5.13+fusion", "0.5.13+x-shape"}
    assert sorted({f["world"] for f in facts}) == [2, 4]
    for f in facts:
        assert f["per_rank"] == {r: 2 for r in range(f["world"])}, (f["variant"], f["world"])
        assert f["sizes"] == [2048] and f["in_calls"] == 0
        assert f["sim"] == 1 and f["sim_sizes"] == [2048]
    for r in recorded:
        assert _status(r) == {EQUAL: core.PASS, NONE: core.PASS}


def test_the_fusion_gate_keeps_larger_steps_off_the_call_site():
    assert [t for t in [4, 2048, 2049, 3000, 0] if rebuild.fusion_applies(t)] == [4, 2048]
    # without SGLang's pre-initialisation, x.shape[0] would re-create on the same trace
    trace = [1, 4, 64, 700, 1500]
    cold, _ = rebuild.simulate(rebuild.POLICIES["floor_0"], trace, world_size=2, hidden_dim=1024)
    warm, _ = rebuild.simulate(rebuild.POLICIES["floor_0"], trace, world_size=2, hidden_dim=1024,
                               pre_initialize=rebuild.FUSE_ALLREDUCE_MAX_BATCH_SIZE)
    assert len(cold.events) == len(trace) and len(warm.events) == 1


def test_a_creation_during_a_forward_step_fails_both_claims(tmp_path):
    src = next(r for r in runs.load_all_recorded("engine_workspace_floor")
               if r.manifest.releases == ["0.5.12.post1"])
    dst = copy_run(src.path, tmp_path, lambda df: df)
    log = dst.with_name(json.loads(dst.with_suffix(".json").read_text())["sidecars"]["log_0"])
    lines = gzip.decompress(log.read_bytes()).decode().splitlines()
    at = next(i for i, ln in enumerate(lines) if "call-begin" in ln and "input_len=200" in ln)
    lines.insert(
        at + 1, "[sglab-engine] event workspace pid=1 max_token_num=4096 world_size=2 "
        "rank=0 obj=abc seconds=0.02")
    log.write_bytes(gzip.compress("\n".join(lines).encode()))
    assert _status(runs.read_run(dst)) == {EQUAL: core.FAIL, NONE: core.FAIL}


def test_a_rerun_with_other_variants_is_not_compared_on_its_call_count():
    """0.5.13's run times two variants (32 calls), 0.5.12.post1's one (16): the count of calls is
    shown beside the claim, not compared; the creations inside them (0) are, exactly."""
    recorded = runs.load_all_recorded("engine_workspace_floor")
    two = next(r for r in recorded if r.manifest.releases == ["0.5.13"])
    one = next(r for r in recorded if r.manifest.releases == ["0.5.12.post1"])
    rows = {d["value"]: d for d in core.compare(C.ENGINE, two, one).drift if d["claim"] == NONE}
    assert set(rows) == {"in_calls"} and rows["in_calls"]["tolerance"] == "exact"
    values = {r.claim.id: r.outcome.value for r in core.evaluate(C.ENGINE, two)}
    assert values[NONE]["calls"] == 32


def test_the_record_merged_reads_each_engine_with_its_own_log():
    """A rerun's reference is the record merged into one run: each engine entry there must read
    the log of the run it came from (the merged manifest's ``log_<i>`` follows the entries), so
    its facts are those of the runs read one by one."""
    from sglab.core import engine_records as E

    def facts(run):
        return sorted((f["variant"], f["world"], tuple(sorted(f["per_rank"].items())),
                       tuple(f["sizes"]), f["calls"]) for f in S.engine_facts(run))

    recorded = runs.load_all_recorded("engine_workspace_floor")
    assert len(recorded) > 1
    newest = {}  # a variant started again in a later run: that run's answer
    for r in sorted(recorded, key=lambda r: r.manifest.created_utc):
        newest.update({(x[1], x[0]): x for x in facts(r)})
    assert facts(E.merged(recorded)) == sorted(newest.values())


def test_a_variant_started_again_counts_once_in_the_merged_record():
    """The committed record starts some variants again in later runs: merged, each (TP, variant)
    is one answer, its newest, so the card's count of generate calls is the section's."""
    from sglab.core import engine_records as E

    recorded = runs.load_all_recorded("engine_workspace_floor")
    every = [(f["world"], f["variant"]) for r in recorded for f in S.engine_facts(r)]
    assert len(every) > len(set(every))  # the record does hold reruns
    merged = E.merged(recorded)
    facts = S.engine_facts(merged)
    assert sorted((f["world"], f["variant"]) for f in facts) == sorted(set(every))
    section = S.engine_facts_of(recorded)
    assert sum(f["calls"] for f in facts) == sum(f["calls"] for f in section)
    values = {r.claim.id: r.outcome.value for r in core.evaluate(C.ENGINE, merged)}
    assert values[NONE]["calls"] == sum(f["calls"] for f in section)


def test_the_engine_table_shows_flashinfers_first_build_apart_from_a_creation(capsys):
    """A rank's first creation also builds or loads FlashInfer's kernels (minutes on a cold cache):
    the table times a creation from the later ones and the first one's extra apart, counts read as
    whole numbers, each call site under its one name."""
    rs = S.FIX.recorded_engine()
    facts = S.engine_facts_of(rs.shown)
    t = show.engine_table(facts)
    assert list(t.index.names) == ["TP", "release", "call site"]
    assert set(t.index.get_level_values("call site")) == {
        rebuild.POLICIES[n].label
        for n in ("before_pr", "floor_2048", "shape_no_hwm")
    }
    assert set(t["creations per rank"]) == {"2"} and set(t["max_token_num"]) == {"2048"}
    later = [m for f in facts for v in f["ms_by_rank"].values() for m in v[1:]]
    assert max(later) < 100 and all(c.endswith(" ms") for c in t["a creation"])
    first = [v[0] - v[1] for f in facts for v in f["ms_by_rank"].values()]
    assert max(first) > 60_000  # a cold FlashInfer cache: the build, not a workspace creation
    assert any(c.endswith(" s") for c in t["first one, JIT build or load"])
    lines = show.engine_lines(facts)
    assert lines[0].startswith("every variant: 2 creations per rank") and "0 of them" in lines[0]
    assert "FlashInfer builds (JIT) or loads its kernels then" in lines[1]
    assert any(ln.startswith("2100 tokens (above the fusion gate") for ln in lines)


def test_the_plan_runs_each_release_and_the_draft_at_tp_2_4_and_8():
    plan = [(sc.name, v, c.label, sc.gpus) for sc in S.ENGINE for v in sc.releases
            for c in sc.cases if not c.releases or v in c.releases]
    assert [p[:3] for p in plan] == [(f"02-ar-fusion{sc}", v, c) for sc in ("", "-tp4", "-tp8")
                                     for v, c in (("0.5.12.post1", "fusion"), ("0.5.13", "fusion"),
                                                  ("0.5.13", "x-shape"))]
    assert [p[3] for p in plan] == [2, 2, 2, 4, 4, 4, 8, 8, 8]
