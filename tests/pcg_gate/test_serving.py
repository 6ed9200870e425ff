"""01's serving section on a made-up full-width run: the PR's metrics beside enforced ÷ off, the
table per prompt length and concurrency, the A/A gap, and what it says without a run; the 61-layer
estimate on the recorded runs."""

import re

import pandas as pd
import pytest

from sglab.core import runs
from sglab.pcg_gate import serving

# ms per (release, case, start) at (prompt tokens, in flight): TTFT, TPOT, E2E
TIMES = {
    ("0.5.13", "enforce"): (10.0, 2.0),
    ("0.5.13", "pcg-off"): (20.0, 2.0),
    ("0.5.13", "pcg-off-again"): (21.0, 2.0),
    ("0.5.12.post1", "enforce"): (19.0, 2.1),
}


def _run(gpu: str = "NVIDIA H200", created: str = "2026-12-05T12:00:00Z", model=serving.MODEL):
    rows, entries = [], []
    for (rel, case), (ttft, tpot) in TIMES.items():
        variant = f"{rel}+{case}"
        for start in range(3):
            base = {
                "experiment": "engine_pcg_gate", "variant": variant, "release": rel, "case": case,
                "tool": "serve", "start": start
            }
            rows.append({**base, "metric": "status", "value": "ok", "unit": ""})
            for il, c in ((128, 1), (2048, 1), (128, 4)):
                scale = 1 + start / 10 + (il > 128)
                for metric, v in (("ttft", ttft * scale), ("tpot", tpot * c),
                                  ("e2e", ttft * scale + 63 * tpot * c)):
                    rows.append({
                        **base, "requests": c, "input_len": il, "output_len": 64, "metric": metric,
                        "value": v, "unit": "ms"
                    })
        entries.append({"variant": variant, "release": rel, "case": case, "model": {"name": model}})
    manifest = {
        "experiment": "engine_pcg_gate", "created_utc": created, "gpu_name": gpu, "gpu_count": 1,
        "engine_runs": entries, "method_version": 1
    }
    return runs.Run(runs.tidy("engine_pcg_gate", rows), manifest,
                    runs.repo_root() / f"serve-{created[:10]}.csv")


def test_the_prs_metrics_sit_beside_enforced_over_off_per_concurrency():
    df = serving.frame(runs.RunSet([_run()]))
    t = serving.pr_beside(df)
    assert list(t.index) == ["TTFT (s)", "TPOT (ms)", "E2E (s)"]
    assert t.loc["TTFT (s)", "#26382 after ÷ before"] == "0.31×"
    # per prompt length, so a reversal between short and long prompts stays visible
    assert t.loc["TTFT (s)", "here: enforced ÷ off, 1 in flight"].startswith("128: 0.50×, ")
    assert set(t.loc["TPOT (ms)",
                     "here: enforced ÷ off, 4 in flight"].split(", ")) == {"128: 1.00×"}


def test_the_table_gives_each_length_and_concurrency_with_starts_and_the_aa_gap():
    t = serving.table(serving.frame(runs.RunSet([_run()])))
    assert t.index.names == ["prompt tokens", "in flight"] and len(t) == 3
    row = t.loc[(128, 1)]
    assert row["TTFT enforced (ms)"] == "11.0 [10.0–12.0]"
    assert row["TTFT off (ms)"] == "22.0 [20.0–24.0]"
    assert row["TTFT enforced ÷ off"] == "0.50×" and row["TTFT A/A gap"] == "4.8%"
    assert row["TTFT 0.5.12.post1 refused (ms)"].startswith("20.9")
    # every timed column names its unit, as recorded; ratios and gaps need none
    timed = [c for c in t.columns if "÷" not in c and "A/A" not in c]
    assert len(timed) == 9 and all(c.endswith(" (ms)") for c in timed)
    assert t.columns.name == "median of the engine starts [lowest–highest start]"


def test_only_the_full_width_model_and_the_newest_gpu_model_are_read():
    tiny = _run(model="kimi_k25_tiny", created="2026-12-06T00:00:00Z")
    old = _run(gpu="NVIDIA H100 80GB HBM3", created="2026-11-01T00:00:00Z")
    df = serving.frame(runs.RunSet([old, _run(), tiny]))
    assert set(df.model) == {serving.MODEL} and set(df.gpu) == {"H200"}


def test_each_run_of_the_shown_gpu_model_is_given_alone_at_the_short_and_the_capped_length():
    """Two serving runs of one GPU model, each read alone (a ratio never pairs two runs' starts);
    an older GPU model's run is left out."""
    slower = _run(created="2026-12-06T09:00:00Z")
    sel = (slower.df.case == "enforce") & (slower.df.metric == "ttft")
    slower.df.loc[sel, "value"] = slower.df.loc[sel, "value"].astype(float) * 2.5
    old = _run(gpu="NVIDIA H100 80GB HBM3", created="2026-11-01T00:00:00Z")
    said = serving.each_run(runs.RunSet([slower, old, _run()]))
    assert [s.split(":", 1)[0] for s in said
            ] == ["H200, 2026-12-05 1200Z", "H200, 2026-12-06 0900Z"]
    assert said[0].split(": ", 1)[1].startswith("128×1 0.50× (4.8%), ")
    assert "128×1 1.25×" in said[1] and "2048×1" in said[1]


def test_without_a_run_it_says_how_to_record_one(capsys):
    serving.show(runs.NoRun("engine_pcg_gate", "none"))
    out = capsys.readouterr().out
    assert "bash scripts/engine_gpu.sh --scenario 01-kimi-full-serve" in out
    assert serving.table(pd.DataFrame()).empty


def test_the_61_layer_estimate_scales_each_measured_step_by_61_over_its_layers(capsys):
    """Each full-width model's step and its saving times 61 ÷ 2 (its 2 layers); a loss stays a
    loss (negative saved) and the PR's figures stand beside it."""
    from sglab.core import engine_records
    from sglab.pcg_gate import sglang, tables

    rs = sglang.FIX.recorded_engine()
    t = tables.whole_model(engine_records.frame([*rs.shown, *rs.elsewhere]))
    if t.empty:
        pytest.skip("no full-width bench_one_batch run recorded")
    row = t.loc[("kimi_k25_full", 2048)]
    assert row["layers run"] == 2
    saved = (row["off (ms)"] - row["enforced (ms)"]) * 61 / 2
    assert row["61 layers, saved (ms, est.)"] == pytest.approx(saved, abs=1.0) and saved < 0
    serving.estimate(rs)
    assert "0.479 → 0.147 s" in capsys.readouterr().out
    serving.estimate(runs.NoRun("engine_pcg_gate", "none"))
    assert "01-kimi-full-bench" in capsys.readouterr().out


def test_the_scheduler_line_counts_each_cases_prefill_batches():
    """The serving table's scheduler line: per case, the prefill batches of one engine start, those
    of several requests and the share on a piecewise graph (none with the graphs off)."""
    from sglab.pcg_gate import sglang as pg_sglang

    df = serving.frame(pg_sglang.FIX.recorded_engine())
    if df.empty:
        pytest.skip("no committed full-width serving run")
    said = serving.scheduler(df)
    off, on = said.split("; ")
    assert off.startswith("off: ") and off.endswith(", 0% on a piecewise graph")
    assert on.startswith("enforced: ") and "of several requests" in on
    assert serving.scheduler(df[~df.metric.str.startswith("serve_prefill")]) == ""


def test_the_prs_before_and_after_reads_the_run_that_started_both(capsys, monkeypatch):
    """0.5.12.post1 enforced (refused) beside 0.5.13 enforced from the one run that started both,
    with how many starts of each answered; no such run, and it says what records one."""
    from sglab.core import notebook
    from sglab.pcg_gate import sglang as pg_sglang

    shown = []
    monkeypatch.setattr(notebook, "show_table", shown.append)
    rs = pg_sglang.FIX.recorded_engine()
    serving.before_after(rs)
    if not shown:
        pytest.skip("no committed full-width serving run of 0.5.12.post1")
    said = capsys.readouterr().out
    assert re.search(r"0\.5\.12\.post1: \d of \d starts answered.*; 0\.5\.13: \d of \d", said)
    t = shown[0]
    assert list(t.columns.get_level_values(0).unique()) == ["TTFT", "TPOT", "E2E"]
    ratio = t[("TTFT", "after ÷ before")]
    assert float(ratio[(2048, 1)].rstrip("×")) > 1 > float(ratio[(128, 1)].rstrip("×"))
    serving.before_after(runs.RunSet([], []))
    assert "no full-width serving run of 0.5.12.post1" in capsys.readouterr().out
