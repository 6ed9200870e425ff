"""sglab.sglang.store: a recording of probe answers is written as a run, read back exactly, and used
by run_probes where it holds the probe, parameters and release (``auto``), never (``live``) or only
(``recorded``)."""

import pytest

from sglab.sglang import runner, store
from sglab.sglang.store import ProbeResult, frame as _frame


def _answer(release, probe="swa_loc:run"):
    rows = [{"variant": "per_layer", "metric": "translate_calls", "value": 2, "unit": "calls"},
            {"variant": "setup", "metric": "sizes", "value": [1, 2, 4], "unit": ""}]
    return ProbeResult(release, probe, "ok", _frame(release, probe, rows),
                       [{"name": "triton", "reason": "r"}], 7.5)


@pytest.fixture
def recording(data_root, monkeypatch):
    # nothing installed: live = not run
    monkeypatch.setenv("SGLAB_SGLANG_HOME", str(data_root / "no-releases"))
    # the default (the test session itself asks for live)
    monkeypatch.delenv("SGLAB_REAL", raising=False)
    path = store.write([("swa_loc:run", {"b": 1, "a": [1, 2]}, {"0.5.11": _answer("0.5.11")})])
    return path


def test_written_as_a_run_and_read_back(recording):
    assert recording.parent.name == "real_cpu" and recording.with_suffix(".json").exists()
    rec = store.newest()
    hit = rec.lookup("0.5.11", "swa_loc:run", {"a": [1, 2], "b": 1})  # key order does not matter
    assert hit.ok and hit.recorded.startswith("recorded ") and "on cpu" in hit.recorded
    assert (hit.rows.value.tolist() == [2, [1, 2, 4]] and hit.shim_names() == ["triton"]
            and hit.seconds == 7.5)
    assert rec.lookup("0.5.11", "swa_loc:run", {"a": [1, 2], "b": 2}) is None
    assert rec.lookup("0.5.23", "swa_loc:run", {"a": [1, 2], "b": 1}) is None


def test_run_probes_sources(recording, monkeypatch):
    params = {"a": [1, 2], "b": 1}
    auto = runner.run_probes(["0.5.11", "0.5.23"], "swa_loc:run", params)
    assert list(auto) == ["0.5.11", "0.5.23"]
    assert auto["0.5.11"].recorded and auto["0.5.11"].ok
    # asked live: not installed here
    assert auto["0.5.23"].status == "not-run" and not auto["0.5.23"].recorded
    live = runner.run_probes(["0.5.11"], "swa_loc:run", params, source="live")
    assert live["0.5.11"].status == "not-run" and "not installed" in live["0.5.11"].reason
    monkeypatch.setenv("SGLAB_REAL", "recorded")
    only = runner.run_probes(["0.5.11", "0.5.23"], "swa_loc:run", params)
    assert only["0.5.11"].ok and "not in the recording" in only["0.5.23"].reason
    monkeypatch.setenv("SGLAB_REAL", "sometimes")
    with pytest.raises(ValueError, match="SGLAB_REAL must be one of auto, live, recorded"):
        runner.run_probes(["0.5.11"], "swa_loc:run", params)


def test_status_lines_name_the_recording(recording):
    from sglab.sglang import compare as report

    results = runner.run_probes(["0.5.11", "0.5.23"], "swa_loc:run", {"a": [1, 2], "b": 1},
                                source="auto")
    first, *rest = report.status_lines(results).splitlines()
    assert first.startswith("real SGLang: answers recorded ") and "run here now: 0.5.23" in first
    assert rest[0].startswith("sglang 0.5.11: 2 rows") and "[recorded" not in rest[0]


def test_a_summary_counts_one_row_as_one_row():
    import pandas as pd

    one = ProbeResult("0.5.11", "p", "ok", rows=pd.DataFrame({"a": [1]}), seconds=0.04)
    two = ProbeResult("0.5.11", "p", "ok", rows=pd.DataFrame({"a": [1, 2]}), shims=[{"name": "x"}])
    assert one.summary() == "sglang 0.5.11: 1 row in 0.0 s (shims: none)"
    assert two.summary().startswith("sglang 0.5.11: 2 rows in 0.0 s (shims: x)")
