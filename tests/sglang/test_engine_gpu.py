"""A real release's whole engine on this GPU (skipped without CUDA or without the release installed
from the engine bundles: scripts/engine_gpu.sh lays them out in SGLAB_ENGINE_HOME)."""

from __future__ import annotations

import pytest

from sglab.sglang import engine as eng
from sglab.tools import fixes


def _runnable(release: str) -> None:
    try:
        eng.check_pins(eng.locate(release))
    except eng.EngineError as e:
        pytest.skip(str(e))


@pytest.mark.gpu
def test_llama_piecewise_graph_on_and_off(tmp_path):
    _runnable("0.5.13")
    specs = {s.case: s for s in fixes.scenario("01-llama-pcg").specs(["0.5.13"])}
    on = eng.run(specs["pcg"], work=tmp_path / "on")
    assert on.ok, on.error
    assert on.decisions["pcg"] == "captured"
    assert on.decisions["pcg_tokens"] == [128, 256, 512, 1024]
    assert on.decisions["attention_backend"] == "triton" and not on.leftovers
    off = eng.run(specs["pcg-off"], work=tmp_path / "off")
    assert off.ok and off.decisions["pcg"] == "disabled"
    got = {(r["metric"], r.get("input_len")) for r in eng.rows(on)}
    assert {("prefill", n) for n in (128, 256, 512, 1024)} <= got


@pytest.mark.gpu
def test_timeout_leaves_no_scheduler_behind(tmp_path):
    _runnable("0.5.13")
    cfg = fixes.scenario("01-llama-pcg").model_config()
    spec = eng.EngineSpec("0.5.13", cfg, "engine", requests=(1,), input_lens=(16,), timeout=10)
    res = eng.run(spec, work=tmp_path)
    assert res.status == "timeout" and "stopped with its whole process group" in res.error
    psutil = pytest.importorskip("psutil")
    left = [p for p in psutil.process_iter() if _marker(p) == res.marker]
    assert res.marker and not left


def _marker(p):
    try:
        if p.status() == psutil_zombie():
            return None
        return p.environ().get("SGLAB_ENGINE_RUN")
    except Exception:  # noqa: BLE001 - gone meanwhile
        return None


def psutil_zombie():
    import psutil

    return psutil.STATUS_ZOMBIE
