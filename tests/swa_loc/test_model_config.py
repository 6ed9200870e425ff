"""Your own model for 04 (:mod:`sglab.swa_loc.model_config`): `sglab swa-cost` on shipped and bad
configs, the prediction from the recorded runs, and the notebook control's static table."""

from pathlib import Path

import pytest

from sglab.swa_loc import model_config as sc
from sglab.swa_loc import show
from sglab.tools import cli


CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.mark.parametrize(
    "name, n_layers, n_swa",
    [
        ("gemma3_text.json", 26, 22),  # 5 sliding : 1 full; 26 layers -> 4 full (5, 11, 17, 23)
        ("gemma3_multimodal.json", 26, 22),  # the same layout under text_config
        ("gpt_oss.json", 36, 18),  # alternating
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
    assert ("layer_types, sliding_window_pattern, use_sliding_window + max_window_layers"
            in capsys.readouterr().err)


@pytest.mark.parametrize("text, says", [
    (None, "no such model config"),
    ("{not json", "not JSON"),
    ("[1, 2]", "a model config is a JSON object, not a list"),
])
def test_an_unreadable_config_is_refused_in_one_line_by_the_shared_reader(
        tmp_path, capsys, text, says):
    f = tmp_path / "config.json"
    if text is not None:
        f.write_text(text)
    assert cli.main(["swa-cost", str(tmp_path)]) == 2  # a folder: its config.json
    err = capsys.readouterr().err
    assert err.startswith(f"sglab swa-cost: {f}: {says}") and len(err.strip().splitlines()) == 1


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


def test_a_run_prices_a_layout_as_the_command_does():
    """The card's per-step cost of a run is the command's row for that run's GPU model."""
    from sglab.core import runs

    newest = runs.newest_by(runs.load_all_recorded("swa_loc"), runs.gpu_short)
    table = sc.pattern_table(62, 5, 32)
    for gpu, run in newest.items():
        got = sc.step_cost(run, 62, 5, 32)
        row = table[table.GPU == gpu].iloc[0]
        assert got == {
            "swa_layers": 52, "kernels": row["extra kernels per decode step"],
            "us": row["extra µs per decode step"]
        }


def test_the_notebook_control_is_a_static_table_headless(monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    assert show.your_setup is sc.your_setup  # notebook 04 calls it as show.your_setup()
    table = sc.your_setup()
    assert "static table" in capsys.readouterr().out
    gpus = len(sc.measured_costs())  # one row per GPU model with a recorded run, per layout
    assert len(table) == 3 * gpus
    # 62 layers at 5 sliding per full: every 6th layer full -> 52 SWA layers, 2 kernels each
    first = table[table.layers == 62]
    assert set(first["SWA layers"]) == {52} and set(first["full layers"]) == {10}
    assert set(first["extra kernels per decode step"]) == {104.0}


def test_a_model_folder_reads_its_config_json(tmp_path, capsys):
    (tmp_path / "config.json").write_text((CONFIGS / "gpt_oss.json").read_text())
    assert cli.main(["swa-cost", str(tmp_path)]) == 0
    assert "sliding-window" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--batch-size", "--max-bs"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_batch_size_below_one_is_refused_in_one_line(flag, value, capsys):
    assert cli.main(["swa-cost", str(CONFIGS / "gpt_oss.json"), flag, value]) == 2
    out = capsys.readouterr()
    assert out.err.strip() == f"sglab swa-cost: {flag} {value}: must be at least 1" and not out.out


def test_kernel_counts_read_as_whole_numbers_and_a_between_median_keeps_its_tenth():
    lay = sc.read_config(CONFIGS / "gpt_oss.json")
    whole = sc.predict(lay, costs=[sc.LayerCost("H100", "run.csv", 2.0, {32: 3.0})])
    half = sc.predict(lay, costs=[sc.LayerCost("H100", "run.csv", 2.25, {32: 3.0})])
    count = whole.iloc[0]["extra kernels per decode step"]
    assert count == 36 and float(count).is_integer() and "36.0" not in whole.to_string()
    assert half.iloc[0]["extra kernels per decode step"] == 40.5


@pytest.mark.parametrize("change, says", [
    ({"sliding_window": -1}, "sliding_window -1: must be a positive integer"),
    ({"sliding_window": "128"}, 'sliding_window "128": must be a positive integer'),
    ({"hidden_size": -5}, "hidden_size -5: must be a positive integer"),
    ({"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "bogus"]
      }, 'layer_types[3] is "bogus", not a layer type transformers knows'),
    ({"layer_types": None, "use_sliding_window": True, "max_window_layers": -2
      }, "max_window_layers -2: must be between 0 and num_hidden_layers (4)"),
])
def test_a_config_with_an_impossible_value_is_refused_in_one_line(tmp_path, capsys, change, says):
    import json

    cfg = {
        "num_hidden_layers": 4, "hidden_size": 64, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 2
    }
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, **change}))
    assert cli.main(["swa-cost", str(f)]) == 2
    out = capsys.readouterr()
    assert out.err.startswith(f"sglab swa-cost: {f}: {says}") and not out.out
    assert len(out.err.splitlines()) == 1
    f.write_text(json.dumps(cfg))  # the same config without the change reads
    assert cli.main(["swa-cost", str(f)]) == 0
