"""Your own traffic (``sglab workspace``, :mod:`sglab.workspace_floor.traffic`): the shipped
example log, CSV and log traces, one-line errors for bad input, and the tables on a generated cold
start (CPU)."""

import pytest

from sglab.core import runs
from sglab.sglang.server_args import piecewise_cuda_graph_tokens
from sglab.tools import cli
from sglab.workspace_floor import measure, show, traces, traffic
from sglab.workspace_floor import rebuild as wf


H = 7168
EXAMPLE_LOG = runs.repo_root() / "data" / "examples" / "sglang_server_short_prompts.log"


def example_log_lines(steps: int = 1500, decode_log_interval: int = 40) -> list[str]:
    """The shipped example: scheduler lines in SGLang's format for the first ``steps`` forward steps
    of the stored ``short_ramp`` trace, every prefill batch and every ``decode_log_interval``-th
    decode step, as a server logs them."""
    lines, decodes = [], 0
    for r in traces.load_trace("short_ramp", verify=False)[0].head(steps).itertuples():
        ts = f"[2026-11-20 10:{r.step // 60:02d}:{r.step % 60:02d}]"
        if r.kind != "decode":
            lines.append(f"{ts} Prefill batch, #new-seq: 1, #new-token: {r.tokens_raw}, "
                         f"#cached-token: 0, token usage: 0.01, #running-req: {r.running}, "
                         f"#queue-req: {r.waiting}, ")
        else:
            decodes += 1
            if decodes % decode_log_interval == 0:
                lines.append(f"{ts} Decode batch, #running-req: {r.tokens_raw}, #token: "
                             f"{r.tokens_raw * 64}, token usage: 0.01, cuda graph: True, gen "
                             f"throughput (token/s): 0.00, #queue-req: {r.waiting}, ")
    return lines


def test_example_log_is_the_stored_trace_written_as_a_server_log():
    assert EXAMPLE_LOG.read_text() == "\n".join(example_log_lines()) + "\n"


def test_log_lines_become_forward_steps():
    trace = traffic.read_trace(EXAMPLE_LOG, pcg_max_tokens=0)
    lines = EXAMPLE_LOG.read_text().splitlines()
    assert trace.prefill_lines == sum("Prefill batch" in ln for ln in lines) > 0
    assert trace.decode_lines == sum("Decode batch" in ln for ln in lines) > 0
    assert len(trace.tokens) == trace.prefill_lines + trace.decode_lines
    first = next(ln for ln in lines if "Prefill batch" in ln)
    assert trace.tokens[0] == int(first.split("#new-token: ")[1].split(",")[0])
    padded = traffic.read_trace(EXAMPLE_LOG, pcg_max_tokens=4096)
    assert padded.tokens[0] == min(
        b for b in piecewise_cuda_graph_tokens(4096) if b >= trace.tokens[0])


def test_traffic_counts_are_the_managers(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("tokens\n64\n128\n100\n3000\n16\n")
    df = traffic.traffic_table(traffic.read_trace(csv).tokens, world_size=2, hidden_dim=H)
    # x.shape[0]: grows at 64, 128 and 3000; the 2048 floor creates once, then grows for 3000
    assert df.loc["draft x.shape[0]", "re-creations"] == 3
    assert df.loc["merged floor 2048", "re-creations"] == 2
    assert df.loc["released before", "refused calls"] == 1  # 3000 > 2048 trips the callee's assert
    mgr, _ = wf.simulate(wf.POLICIES["floor_512"], [64, 128, 100, 3000, 16], world_size=2,
                         hidden_dim=H)
    assert df.loc["floor 512", "peak MiB/rank"] == mgr.peak_bytes_per_rank / 2**20
    assert "interpolated by workspace bytes" in df.attrs["cost_model"]


def test_plain_number_per_line_csv(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("48\n1\n1\n96\n")
    assert traffic.read_trace(f).tokens == [48, 1, 1, 96]


@pytest.mark.parametrize("text, where, what", [
    ("tokens\n64\nabc\n", ":3:", "positive integer"),
    ("tokens\n64\n-5\n", ":3:", "positive integer"),
    ("count\n64\n", ":1:", "named 'tokens'"),
    ("", "", "empty file"),
    ("[2026-11-20 10:00:00] INFO server started\n", "", "no 'Prefill batch' or 'Decode batch'"),
    ("Prefill batch, #new-seq: 1, #cached-token: 0\n", ":1:", "without '#new-token"),
])
def test_bad_trace_names_file_and_line(tmp_path, capsys, text, where, what):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    assert cli.main(["workspace", "--trace", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(f) + where in err and what in err and len(err.splitlines()) == 1


def test_workspace_command_prints_every_policy(capsys):
    assert cli.main(["workspace", "--trace", str(EXAMPLE_LOG), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    for policy in wf.POLICIES.values():  # each by its one name, beside what its call site passes
        assert policy.label in out and policy.call in out
    assert "lower bound" in out and "times: " in out


def test_floor_table_runs_the_simulator_on_the_stored_cold_start():
    # prompt length 48 is the stored short_ramp scenario: the generated trace is its first 1500
    # steps
    stored = [int(t) for t in traces.load_trace("short_ramp")[0].tokens]
    assert traffic.generated_trace(48) == stored[:1500]
    df = traffic.floor_table(512, 8, 48)
    assert list(df.index) == [
        "released before", "draft x.shape[0]", "floor 512", "merged floor 2048"
    ]
    mgr, refused = wf.simulate(wf.Policy("floor_512", 512), stored[:1500], world_size=8,
                               hidden_dim=H)
    assert df.loc["floor 512", "re-creations"] == len([e for e in mgr.events if e.step >= 0])
    assert df.loc["floor 512", "refused calls"] == refused == 0
    assert df.loc["floor 512", "peak MiB/rank"] == round(mgr.peak_bytes_per_rank / 2**20, 1)
    # a floor of no policy's name gets its own row, labelled with the floor
    assert traffic.floor_table(300, 2, 48).loc["floor 300",
                                               "max_token_num"] == "max(x.shape[0], 300)"


def test_your_setup_is_a_static_table_headless(monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    assert show.your_setup is traffic.your_setup  # notebook 02 calls it as show.your_setup()
    table = traffic.your_setup()
    assert len(table) == 4 + 3 + 3 and "index" not in table.columns  # 2048 is the PR's row
    assert list(table.columns[:4]) == ["floor", "world_size", "prompt_length", "policy"]
    assert "static table" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--hidden", "-5"], "--hidden -5: must be at least 1"),
    (["--hidden", "0"], "--hidden 0: must be at least 1"),
    (["--pre-initialize", "-1"], "--pre-initialize -1: must be at least 0"),
    (["--pcg-max-tokens", "-4"], "--pcg-max-tokens -4: must be at least 0"),
])
def test_workspace_refuses_sizes_below_their_minimum(capsys, args, says):
    assert cli.main(["workspace", "--trace", str(EXAMPLE_LOG), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == f"sglab workspace: {says}"


@pytest.mark.parametrize("world", [3, 8])
def test_workspace_at_a_world_size_without_a_run_says_whose_times_it_uses(capsys, world):
    recorded = sorted({r.manifest.tp for r in runs.load_all_recorded("workspace_floor")})
    assert world not in recorded
    assert cli.main(["workspace", "--trace", str(EXAMPLE_LOG), "--world-size", str(world)]) == 0
    out = capsys.readouterr().out
    assert f"NO recorded run at world size {world}" in out and f"run (none at ×{world})" in out
    assert cli.main(["workspace", "--trace", str(EXAMPLE_LOG), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "NO recorded run" not in out and "est. ms" in out
