"""`sglab workspace` and `sglab swa-cost` on shipped inputs, bad inputs, and the notebook widgets'
static path."""

from pathlib import Path

import pytest

from sglab.tools import cli
from sglab.fixes import workspace_floor as wf
from sglab.investigate import widgets
from sglab.investigate import workspace as ws

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


# --------------------------------------------------------------------------------------------------------- traffic
def test_example_log_is_the_stored_trace_written_as_a_server_log():
    assert ws.EXAMPLE_LOG.read_text() == "\n".join(ws.example_log_lines()) + "\n"


def test_log_lines_become_forward_steps():
    trace = ws.read_trace(ws.EXAMPLE_LOG, pcg_max_tokens=0)
    lines = ws.EXAMPLE_LOG.read_text().splitlines()
    assert trace.prefill_lines == sum("Prefill batch" in ln for ln in lines) > 0
    assert trace.decode_lines == sum("Decode batch" in ln for ln in lines) > 0
    assert len(trace.tokens) == trace.prefill_lines + trace.decode_lines
    first = next(ln for ln in lines if "Prefill batch" in ln)
    assert trace.tokens[0] == int(first.split("#new-token: ")[1].split(",")[0])
    padded = ws.read_trace(ws.EXAMPLE_LOG, pcg_max_tokens=4096)
    assert padded.tokens[0] in ws.pcg_buckets(4096) and padded.tokens[0] >= trace.tokens[0]
    assert padded.tokens[0] == min(b for b in ws.pcg_buckets(4096) if b >= trace.tokens[0])


def test_simulation_counts_are_the_managers(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("tokens\n64\n128\n100\n3000\n16\n")
    df = ws.simulate(ws.read_trace(csv).tokens, world_size=2, hidden_dim=7168)
    # x.shape[0]: grows at 64, 128 and 3000; the 2048 floor creates once and then grows once for
    # 3000
    assert df.loc["floor_0", "re-creations"] == 3
    assert df.loc["floor_2048", "re-creations"] == 2
    # 3000 > 2048 trips the callee's assert before the PR
    assert df.loc["before_pr", "refused calls"] == 1
    mgr, _ = wf.simulate(wf.POLICIES["floor_512"], [64, 128, 100, 3000, 16], world_size=2,
                         hidden_dim=7168)
    assert df.loc["floor_512", "peak MiB/rank"] == mgr.peak_bytes_per_rank / 2**20


def test_plain_number_per_line_csv(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("48\n1\n1\n96\n")
    assert ws.read_trace(f).tokens == [48, 1, 1, 96]


@pytest.mark.parametrize("text, where, what", [
    ("tokens\n64\nabc\n", ":3:", "positive integer"),
    ("tokens\n64\n-5\n", ":3:", "positive integer"),
    ("count\n64\n", ":1:", "named 'tokens'"),
    ("", "", "empty file"),
])
def test_bad_csv_names_file_and_line(tmp_path, capsys, text, where, what):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    assert cli.main(["workspace", "--trace", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(f) + where in err and what in err and len(err.splitlines()) == 1


def test_log_without_batch_lines(tmp_path, capsys):
    f = tmp_path / "server.log"
    f.write_text("[2026-11-20 10:00:00] INFO server started\n[2026-11-20 10:00:01] INFO ready\n")
    assert cli.main(["workspace", "--trace", str(f)]) == 2
    assert "no 'Prefill batch' or 'Decode batch' line" in capsys.readouterr().err


def test_malformed_batch_line(tmp_path, capsys):
    f = tmp_path / "server.log"
    f.write_text("Prefill batch, #new-seq: 1, #cached-token: 0\n")
    assert cli.main(["workspace", "--trace", str(f)]) == 2
    assert f"{f}:1:" in capsys.readouterr().err


def test_workspace_command_prints_every_policy(capsys):
    assert cli.main(["workspace", "--trace", str(ws.EXAMPLE_LOG), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    for name in wf.POLICIES:
        assert name in out
    assert "lower bound" in out and "times: " in out


# ------------------------------------------------------------------------------------------------------- your model
# ------------------------------------------------------------------------------------------------------- widgets
def test_widgets_fall_back_to_a_static_table(monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    import pandas as pd

    def fn(a, b):
        return pd.DataFrame({"sum": [a + b]})

    table = widgets.explore(fn, {"a": [1, 2], "b": [10, 20]},
                            static=[{"a": 1, "b": 10}, {"a": 2, "b": 20}], title="demo")
    assert list(table.columns) == ["a", "b", "sum"] and list(table["sum"]) == [11, 22]
    assert "static table" in capsys.readouterr().out


def test_floor_table_runs_the_simulator_on_the_stored_cold_start():
    from sglab.experiments.workspace_floor import traces

    # prompt length 48 is the stored short_ramp scenario: the generated trace is its first 1500
    # steps
    stored = [int(t) for t in traces.load_trace("short_ramp")[0].tokens]
    assert ws.generated_trace(48) == stored[:1500]
    df = ws.floor_table(512, 8, 48)
    assert list(df.index) == ["before_pr", "floor_0", "floor_512", "floor_2048"]
    mgr, refused = wf.simulate(wf.Policy("floor_512", 512), stored[:1500], world_size=8,
                               hidden_dim=7168)
    assert df.loc["floor_512", "re-creations"] == len([e for e in mgr.events if e.step >= 0])
    assert df.loc["floor_512", "refused calls"] == refused == 0
    assert df.loc["floor_512", "peak MiB/rank"] == round(mgr.peak_bytes_per_rank / 2**20, 1)
    # a floor of no policy's name gets its own row, labelled with the floor
    assert ws.floor_table(300, 2, 48).loc["floor_300", "what"] == "max(x.shape[0], 300)"


@pytest.mark.parametrize("name", ["workspace_floor"])
def test_notebook_widgets_are_static_tables_headless(monkeypatch, capsys, name):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    table = getattr(widgets, name)()
    assert len(table) > 0 and "index" not in table.columns
    assert "static table" in capsys.readouterr().out
