"""`sglab workspace` and `sglab swa-cost` on shipped inputs, bad inputs, and the notebook widgets' static path."""

from pathlib import Path

import pytest

from sglab.tools import cli
from sglab.fixes import workspace_floor as wf
from sglab.investigate import swa_cost as sc
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
    # x.shape[0]: grows at 64, 128 and 3000; the 2048 floor creates once and then grows once for 3000
    assert df.loc["floor_0", "re-creations"] == 3
    assert df.loc["floor_2048", "re-creations"] == 2
    assert df.loc["before_pr", "refused calls"] == 1  # 3000 > 2048 trips the callee's assert before the PR
    mgr, _ = wf.simulate(wf.POLICIES["floor_512"], [64, 128, 100, 3000, 16], world_size=2, hidden_dim=7168)
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
@pytest.mark.parametrize("name, n_layers, n_swa", [
    ("gemma3_text.json", 26, 22),        # 5 sliding : 1 full; 26 layers -> 4 full (5, 11, 17, 23)
    ("gemma3_multimodal.json", 26, 22),  # the same layout under text_config
    ("gpt_oss.json", 36, 18),            # alternating
])
def test_layouts_of_real_configs(name, n_layers, n_swa):
    lay = sc.read_config(CONFIGS / name)
    assert (lay.num_layers, lay.n_swa) == (n_layers, n_swa)
    assert lay.found_by == "layer_types"


def test_gemma3_full_layers_are_every_sixth():
    lay = sc.read_config(CONFIGS / "gemma3_text.json")
    assert [i for i in range(26) if i not in lay.swa_layers] == [5, 11, 17, 23]


def test_pattern_and_qwen_style_layouts():
    assert sc.layout({"num_hidden_layers": 12, "sliding_window_pattern": 6}).swa_layers == \
        [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    lay = sc.layout({"num_hidden_layers": 8, "use_sliding_window": True, "max_window_layers": 6})
    assert lay.swa_layers == [6, 7]


@pytest.mark.parametrize("name, what", [
    ("mistral.json", "not a hybrid layout"),
    ("qwen2.json", "no sliding-window layer"),
])
def test_configs_without_a_hybrid_layout(name, what, capsys):
    assert cli.main(["swa-cost", str(CONFIGS / name)]) == 2
    err = capsys.readouterr().err
    assert what in err and len(err.strip().splitlines()) == 1


def test_no_layout_keys_lists_what_was_looked_for(tmp_path, capsys):
    f = tmp_path / "config.json"
    f.write_text('{"num_hidden_layers": 4}')
    assert cli.main(["swa-cost", str(f)]) == 2
    assert "layer_types, sliding_window_pattern, use_sliding_window + max_window_layers" in capsys.readouterr().err


def test_prediction_scales_the_measured_per_layer_cost():
    lay = sc.read_config(CONFIGS / "gpt_oss.json")
    cost = sc.LayerCost("H100", "run.csv", 2.0, {8: 1.5, 32: 3.0})
    df = sc.predict(lay, batch_size=30, max_bs=160, costs=[cost])
    row = df.iloc[0]
    assert row["extra kernels per decode step"] == 36.0
    assert row["extra µs per decode step (bs 32)"] == 54.0
    assert row["int64 buffer bytes wasted"] == 640


def test_measured_costs_come_from_the_recorded_runs():
    costs = sc.measured_costs()
    assert costs, "no recorded swa_loc run"
    for c in costs:
        assert c.extra_kernels_per_swa_layer > 0 and c.us_per_swa_layer


# ------------------------------------------------------------------------------------------------------- widgets
def test_widgets_fall_back_to_a_static_table(monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    import pandas as pd

    def fn(a, b):
        return pd.DataFrame({"sum": [a + b]})

    table = widgets.explore(fn, {"a": [1, 2], "b": [10, 20]}, static=[{"a": 1, "b": 10}, {"a": 2, "b": 20}],
                            title="demo")
    assert list(table.columns) == ["a", "b", "sum"] and list(table["sum"]) == [11, 22]
    assert "static table" in capsys.readouterr().out


def test_floor_table_runs_the_simulator_on_the_stored_cold_start():
    from sglab.experiments.workspace_floor import traces

    # prompt length 48 is the stored short_ramp scenario: the generated trace is its first 1500 steps
    stored = [int(t) for t in traces.load_trace("short_ramp")[0].tokens]
    assert ws.generated_trace(48) == stored[:1500]
    df = ws.floor_table(512, 8, 48)
    assert list(df.index) == ["before_pr", "floor_0", "floor_512", "floor_2048"]
    mgr, refused = wf.simulate(wf.Policy("floor_512", 512), stored[:1500], world_size=8, hidden_dim=7168)
    assert df.loc["floor_512", "re-creations"] == len([e for e in mgr.events if e.step >= 0])
    assert df.loc["floor_512", "refused calls"] == refused == 0
    assert df.loc["floor_512", "peak MiB/rank"] == round(mgr.peak_bytes_per_rank / 2**20, 1)
    # a floor of no policy's name gets its own row, labelled with the floor
    assert ws.floor_table(300, 2, 48).loc["floor_300", "what"] == "max(x.shape[0], 300)"


def test_pattern_table_builds_the_layout_a_config_would():
    df = sc.pattern_table(62, 5, 32)
    # every 6th layer full: 62 // 6 = 10 full, 52 sliding-window
    assert set(df["SWA layers"]) == {52} and set(df["full layers"]) == {10}
    assert set(df["int64 buffer bytes wasted"]) == {4 * 256}
    for c in sc.measured_costs():
        row = df[df.GPU == c.gpu].iloc[0]
        assert row["extra kernels per decode step"] == round(c.extra_kernels_per_swa_layer * 52, 1)
        assert row["µs measured at bs"] == 32
        assert row["extra µs per decode step"] == round(c.us_per_swa_layer[32] * 52, 1)
    # 4 layers with 5 SWA per full layer has no full layer: the config's own message
    assert "only sliding-window layers" in sc.pattern_table(4, 5, 8).note.iloc[0]


@pytest.mark.parametrize("name", ["workspace_floor", "swa_layout", "capture_rules"])
def test_notebook_widgets_are_static_tables_headless(monkeypatch, capsys, name):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    table = getattr(widgets, name)()
    assert len(table) > 0 and "index" not in table.columns
    assert "static table" in capsys.readouterr().out
