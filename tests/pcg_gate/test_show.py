"""The tables and figures of notebook 01: from the CPU rebuild, from the committed runs, from a
synthetic method-3 run, and the one line a NoRun prints."""

from __future__ import annotations

import pandas as pd
import pytest

from sglab.core import engine_records, runs
from sglab.pcg_gate import claims, rebuild, show, tables
from tests.pcg_gate.test_claims import LE, LP, method3_run


RECORDED = runs.load_all_recorded("pcg_gate")


def test_mechanism_facts_from_the_rebuild_and_from_a_run():
    cpu = show.mechanism_facts(runs.NoRun("pcg_gate", "none"))
    assert list(cpu.index) == list(rebuild.VARIANTS)
    assert list(cpu["model_keys_after_gate"]) == [0, 14, 15, 0]  # plain alias: the text model
    assert cpu["source"].iloc[0].startswith("the CPU rebuild")
    m2 = [r for r in RECORDED if r.manifest.method_version >= 2]
    if m2:
        facts = show.mechanism_facts(runs.RunSet([m2[-1]]))
        assert facts.loc["property_only", "model_keys_after_gate"] == facts.loc["no_alias",
                                                                                "lm_keys"]
    show.mechanism(None).clf()


def test_slowdown_start_and_copy_bytes():
    assert tables.slowdown_start(pd.Series({16: 3.0, 2048: 0.9, 4096: 0.95})) == 2048
    assert tables.slowdown_start(pd.Series({16: 3.0, 2048: 0.9, 4096: 1.1})) is None
    assert tables.slowdown_start(pd.Series({16: 0.9, 2048: 1.2, 4096: 0.95})) == 4096
    # 16 layers x 5 tensors + the output, 4096 x 2048 bf16, written and read
    assert tables.buffer_copy_bytes({}, 4096) == 2 * 4096 * 2048 * 2 * 81


def test_launch_table_of_a_method3_run(tmp_path):
    lt = tables.launch_table(method3_run(tmp_path, 12.0).df)
    assert list(lt.index) == [16, 64, 100, 256, 1024, 2048, 4096]
    small = lt.loc[[16, 64, 100]]
    assert (small["eager launches"] == LE).all() and (small["piecewise launches"] == LP).all()
    assert small["eager ÷ host cost"].tolist() == pytest.approx([3.5] * 3)
    assert small["eager µs/launch"].tolist() == pytest.approx([42.0] * 3)
    assert small["gain explained"].between(0.9, 1.1).all()


def test_old_runs_say_the_host_cost_was_not_measured(capsys):
    old = [r for r in RECORDED if r.manifest.method_version < 3]
    if not old:
        pytest.skip("no recorded pcg_gate run before method 3")
    assert tables.launch_table(old[-1].df).empty
    assert "not measured (method" in tables.host_line(old[-1])
    show.launches(runs.RunSet([old[-1]]))
    assert "not measured" in capsys.readouterr().out


def test_sections_print_the_norun_line(capsys):
    no = runs.NoRun("pcg_gate", "no recorded pcg_gate run yet")
    for section in (show.latency, show.launches, show.correctness, show.profiler):
        assert section(no) is None
    assert capsys.readouterr().out.count("no GPU run to show (no recorded pcg_gate run yet)") == 4


def test_sections_of_the_recorded_runs(capsys):
    shown = claims.shown(RECORDED)
    if not shown:
        pytest.skip("no recorded pcg_gate run")
    show.latency(runs.RunSet(shown))
    show.correctness(runs.RunSet(shown))
    out = capsys.readouterr().out
    assert "bf16 tolerance at all" in out
    for r in shown:  # each run's host cost where its method measured it, else why not
        said = f"{r.label}: host per-launch cost " + ("not measured"
                                                      if r.manifest.method_version < 3 else "")
        assert said in out
    older = [r for r in RECORDED if r.manifest.method_version < 3]
    if older:
        show.latency(runs.RunSet([older[-1]]))
        assert "host per-launch cost not measured (method" in capsys.readouterr().out


def test_your_setup_buckets_and_recorded_times(tmp_path):
    fake = [method3_run(tmp_path, 12.0)]
    t = show.setup_table(100, 4096, shown=fake)
    assert t.loc[0, "bucket"] == 112 and t.loc[0, "measured at"] == 100
    assert t.loc[0, "padded share"] == pytest.approx(1 - 100 / 112, abs=1e-3)
    assert t.loc[0, "host µs/launch"] == 12.0
    above = show.setup_table(5000, 4096, shown=fake)
    assert above.loc[0, "runs as"].startswith("eager") and above.loc[0, "bucket"] == "-"
    table = show.your_setup()  # headless: the static table over the recorded runs
    assert table is None or {"tokens", "max_tokens", "bucket"} <= set(table.columns)


def test_the_profiler_section_prints_counts_as_whole_numbers_and_no_nan(capsys):
    """Kernel, launch and copy counts print as ``306``, not ``306.0``; the direct hand-off's cells
    below the capture sizes, and the "(N more)" row's median, are blank, not NaN."""
    shown = claims.shown(RECORDED)
    traced = [r for r in shown if r.sidecar("events") is not None]
    if not traced:
        pytest.skip("no recorded pcg_gate run with profiler traces")
    show.profiler(runs.RunSet([traced[-1]]))
    show.latency(runs.RunSet([traced[-1]]))
    out = capsys.readouterr().out
    assert "NaN" not in out
    eager = next(ln for ln in out.splitlines() if ln.split()[:2] == ["64", "eager"])
    assert eager.split()[2:5] == [str(int(float(v))) for v in eager.split()[2:5]]
    more = next(ln for ln in out.splitlines() if "more)" in ln)
    assert more.split("more)")[1].split()[0].isdigit()  # the calls of the rest, a whole number


def test_the_launch_table_reads_its_launch_counts_as_whole_numbers(tmp_path, capsys):
    show.launches(runs.RunSet([method3_run(tmp_path, 12.0)]))
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.split()[:1] == ["64"])
    assert row.split()[1:3] == [str(LE), str(LP)]


def test_the_profiler_links_each_runs_perfetto_trace_from_the_checkout(capsys):
    traced = [r for r in claims.shown(RECORDED) if r.sidecar("trace") is not None]
    if not traced:
        pytest.skip("no recorded pcg_gate run with a Perfetto trace")
    show.profiler(runs.RunSet([traced[-1]]))
    out = capsys.readouterr().out
    link = next(ln for ln in out.splitlines() if "the Perfetto trace" in ln)
    assert link.endswith(f": data/recorded/pcg_gate/{traced[-1].manifest.sidecars['trace']}")
    assert str(runs.repo_root()) not in out


def test_the_buckets_read_as_a_sentence():
    """The capture buckets as a count, their ends and the step up to each boundary, not a list."""
    b = rebuild.piecewise_cuda_graph_tokens(4096)
    said = show.buckets_line(b)
    assert said.startswith(f"{len(b)} buckets from {b[0]} to {b[-1]} tokens, in steps of ")
    assert "[" not in said and said.endswith(f"up to {b[-1]}")
    assert show.buckets_line([4, 8, 12, 16]) == "4 buckets from 4 to 16 tokens, in steps of 4"
    assert show.buckets_line([4, 8, 24, 40]) == ("4 buckets from 4 to 40 tokens, in steps of 4 up "
                                                 "to 8 and 16 up to 40")


def test_the_engine_scope_is_read_from_the_recorded_runs():
    """Per model and tool: the releases with their cases and the prompt lengths the runs hold, so
    the section's scope follows what was recorded (the full widths reach 4096 tokens)."""
    from sglab.core import engine_records
    from sglab.pcg_gate import sglang

    rs = sglang.FIX.recorded_engine()
    t = show.engine_scope(rs)
    df = engine_records.frame(rs.shown)
    df = df[df.input_len.notna()]
    assert set(t.index) == set(zip(df.model, df.tool.map(engine_records.TOOL_NAMES)))
    for (model, tool), g in df.groupby(["model", "tool"]):
        row = t.loc[(model, engine_records.TOOL_NAMES[tool])]
        lo, hi = int(g.input_len.min()), int(g.input_len.max())
        assert row["prompt tokens"] == f"{lo}–{hi}"
        for rel in set(g.release):
            assert f"{rel}: " in row["releases: cases"]
    assert t.loc[("kimi_k25_full", "bench_one_batch"), "prompt tokens"].endswith("–4096")
    assert show.engine_scope(runs.NoRun("engine_pcg_gate", "none")).empty
