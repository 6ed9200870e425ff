"""05's real-engine claim, on engine runs made by the harness's own reader and recorder from
stand-in logs (the TP-2 engine has not been recorded yet): it holds when every rank >= 1 holds GPU 0
memory only with #22858 reverted, and fails by name otherwise."""

from __future__ import annotations

import pytest

from sglab.core import claims as core
from sglab.core import runs
from sglab.grid_thw import claims as C
from sglab.grid_thw import show
from sglab.grid_thw.sglang import ENGINE
from sglab.sglang import engine as eng

CLAIM = "engine_grid_thw.rank_contexts_on_gpu0"


def _log(lines: list[tuple]) -> str:
    """A log with one gpu-memory line per (pid, gpu, MiB, process)."""
    return "\n".join(f"[sglab-engine] gpu-memory pid={p} gpu={g} mib={m} name={n}"
                     for p, g, m, n in lines)


def _run(tmp_path, before_gpu0: list[float], released_gpu0: list[float]):
    results = []
    for spec in ENGINE[0].specs():
        on0 = before_gpu0 if spec.case == "before" else released_gpu0
        lines = [(10, 0, 900, "python3"), (11, 0, 20000, "sglang::scheduler_TP0"),
                 (12, 1, 20000, "sglang::scheduler_TP1")]
        lines += [(12, 0, m, "sglang::scheduler_TP1") for m in on0]
        results.append(eng.EngineResult(spec, "ok", decisions=eng.read_log(_log(lines))))
    return runs.read_run(eng.record(results, "grid_thw", root=tmp_path))


def test_each_process_memory_per_gpu_is_read_back_from_the_run(tmp_path):
    run = _run(tmp_path, [612.0], [])
    assert show.engine_gpu0(run) == {"before": {1: 612.0}, "released": {1: 0.0}}
    mem = show.engine_memory(run)
    assert set(mem["process"]) == {"python3", "sglang::scheduler_TP0", "sglang::scheduler_TP1"}
    assert {r.claim.id: r.status for r in core.evaluate(C.ENGINE, run)} == {CLAIM: core.PASS}


@pytest.mark.parametrize("before, released", [([], []), ([612.0], [612.0])])
def test_no_context_before_or_one_after_fails_by_name(tmp_path, before, released):
    run = _run(tmp_path, before, released)
    assert {r.claim.id: r.status for r in core.evaluate(C.ENGINE, run)} == {CLAIM: core.FAIL}
