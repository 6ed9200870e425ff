"""``python -m sglab.sglang.gpu record``: the plan, the runs it writes, and the relations real
SGLang must show.

CPU tests: planning and skip lines, ``--dry-run``, row shaping and manifest labels (a fake runner),
the kernels one translation launches as read from each installed release's code, and every GPU
probe's CPU path through real workers (the same pool writes and the release's ``eager_on_graph``,
without a GPU). 02 and 05 have no GPU probe: their real engine records the same numbers
(``engine_workspace_floor``, ``engine_grid_thw``).

GPU tests (``gpu`` / ``gpus(2)``): on the runs under ``$SGLAB_REAL_GPU_RUNS`` (what
``scripts/real_gpu.sh`` just recorded), else on a fresh recording, real SGLang must show: graph
nodes == profiled kernels; nodes per SWA layer == kernels per translation read from the release's
code (2 for the ``.to(torch.int32)`` releases, 1 for 0.5.23). The breakable graph's probe is
tested in tests/breakable_graph.
"""

import ast
import dataclasses
import os
from pathlib import Path

import pandas as pd
import pytest

from sglab.sglang.fix import GpuPlan, Step
from sglab.sglang.releases import GPU_RELEASES
from sglab.tools import cli
from sglab.tools.fixes import FIXES, get
from sglab.sglang.gpu import record
from sglab.swa_loc import sglang as swa_loc
from sglab.sglang.runner import ProbeResult
from sglab.sglang.testing import probe_one
from sglab.core.runs import list_runs, read_run


# -- helpers
# --------------------------------------------------------------------------------------------------
def _parse(v):
    """A value as written to the CSV, back to Python (numbers, booleans, lists); text stays text."""
    if not isinstance(v, str):
        return v
    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return v


def _same(a, b) -> bool:
    """Cell equality across CSV round trips: a column with holes reads ``0`` back as ``0.0``."""
    a, b = _parse(a), _parse(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return str(a) == str(b)


def value(run, **where):
    df = run.df
    for col, want in where.items():
        df = df[df[col].map(lambda cell: _same(cell, want))]
    if len(df) != 1:
        raise AssertionError(f"{len(df)} rows match {where} in {run.path.name}")
    return _parse(df["value"].iloc[0])


def ran(run, release: str) -> None:
    """Fail with the recorded reason when ``release`` did not run in ``run``."""
    df = run.df[(run.df["release"] == release) & (run.df["metric"] == "status")]
    if len(df):
        pytest.fail(f"sglang {release} did not run: {df['value'].iloc[0]}", pytrace=False)


def fake(release, status="ok", rows=None, reason=""):
    frame = pd.DataFrame(rows or [])
    frame.insert(0, "probe", "p:run")
    frame.insert(0, "release", release)
    return ProbeResult(release, "p:run", status, frame, [{"name": "triton", "reason": "no triton"}],
                       1.5, 0.2, reason)


# -- planning and the CLI
# -----------------------------------------------------------------------------------------
def test_plan_skips_what_needs_more_gpus_with_one_line():
    names = [f.name for f in FIXES if f.gpu is not None]
    assert names == ["breakable_graph", "swa_loc"]
    run, skipped = record.plan_for(FIXES, names, 1)
    assert [f.name for f in run] == ["breakable_graph", "swa_loc"] and skipped == []
    run, skipped = record.plan_for(FIXES, names, 0)
    assert run == [] and skipped == [
        "breakable_graph: skipped, needs 1 GPU, have 0", "swa_loc: skipped, needs 1 GPU, have 0"
    ]
    two = GpuPlan(2, 1, (Step("0.5.23", "p:run"),), "demo")
    wide = dataclasses.replace(get("swa_loc"), name="wide", gpu=two)
    assert record.plan_for([*FIXES, wide], ["wide"],
                           1) == ([], ["wide: skipped, needs 2 GPUs, have 1"])
    picked = record.plan_for(FIXES, ["swa_loc", "breakable_graph", "swa_loc"], 2)[0]
    assert [f.name for f in picked] == ["swa_loc", "breakable_graph"]
    with pytest.raises(ValueError, match="unknown fix nope"):
        record.plan_for(FIXES, ["nope"], 8)
    # 02's and 05's probes were retired: their real engine records the same numbers
    with pytest.raises(ValueError, match="unknown fix grid_thw, workspace_floor"):
        record.plan_for(FIXES, ["grid_thw", "workspace_floor"], 8)


def test_every_step_uses_a_release_of_the_gpu_carry_and_names_its_experiment():
    planned = [f for f in FIXES if f.gpu is not None]
    record.check_releases(planned, GPU_RELEASES)
    assert {f.gpu_experiment for f in planned} == {"real_swa_loc", "real_breakable_graph"}
    assert get("swa_loc").gpu.releases == ["0.5.11", "0.5.12.post1", "0.5.23"]


def test_dry_run_lists_steps_and_skips_and_runs_nothing(capsys, monkeypatch):
    monkeypatch.setattr(record, "record_fix", lambda *a, **k: pytest.fail("dry run recorded"))
    assert cli.main(["real", "gpu", "--dry-run", "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert ("swa_loc -> real_swa_loc" in out
            and "sglang 0.5.12.post1: sglab.swa_loc.sglang:gpu_probe" in out)
    assert "breakable_graph -> real_breakable_graph" in out and "would run 2 fix(es)" in out
    assert "grid_thw" not in out and "workspace_floor" not in out and "skipped" not in out
    assert cli.main(["real", "gpu", "--dry-run", "--gpus", "0"]) == 0
    assert "swa_loc: skipped, needs 1 GPU, have 0" in capsys.readouterr().out


def test_a_machine_that_can_run_no_fix_says_so_and_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(record, "record_fix", lambda *a, **k: pytest.fail("recorded"))
    assert cli.main(["real", "gpu", "--gpus", "0"]) == 2
    out = capsys.readouterr()
    assert "swa_loc: skipped, needs 1 GPU, have 0" in out.out
    assert out.err.strip() == "sglab real gpu: nothing this machine can run (0 GPUs)"


def test_unknown_fix_is_one_line_and_exit_2(capsys):
    assert cli.main(["real", "gpu", "--fix", "nope", "--gpus", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sglab real gpu: unknown fix nope (known: breakable_graph, swa_loc)"]


# -- rows and manifest
# --------------------------------------------------------------------------------------------
def test_step_rows_keep_the_probe_rows_and_turn_failures_into_one_status_row():
    ok = fake(
        "0.5.23", rows=[{"variant": "a", "metric": "m", "value": 3, "unit": "n"}, {
            "variant": "a", "metric": "node_kernel", "kernel": "k1", "value": 2, "unit": "nodes"
        }])
    rows = record.step_rows(ok)
    assert rows[0] == {"release": "0.5.23", "variant": "a", "metric": "m", "value": 3, "unit": "n"}
    assert rows[1]["kernel"] == "k1"
    bad = fake("0.5.11", status="not-run", reason="sglang 0.5.11: import x failed: boom")
    assert record.step_rows(bad) == [{
        "release": "0.5.11", "variant": "not-run", "metric": "status",
        "value": "sglang 0.5.11: import x failed: boom", "unit": ""
    }]


def test_record_fix_writes_one_run_with_releases_and_shims(tmp_path):
    plan = GpuPlan(1, 7, (Step("0.5.12.post1", "p:run"), Step("0.5.23", "p:run")), "demo")

    def runner(release, probe, params, timeout):
        if release == "0.5.23":
            return fake(release, status="error", reason="sglang 0.5.23: worker exited 1: boom")
        return fake(release,
                    rows=[{"variant": "v", "metric": "kernel_nodes", "value": 20, "unit": "nodes"}])

    path, complete = record.record_fix("demo", plan, out=tmp_path, echo=lambda *_: None,
                                       runner=runner)
    assert not complete and path.parent == tmp_path / "real_demo"
    run = read_run(path)
    m = run.manifest
    assert m.experiment == "real_demo" and m.method_version == 7 and m.gpu_count == 1
    assert m.params["releases"] == ["0.5.12.post1", "0.5.23"]
    assert m.params["shims"] == {"0.5.12.post1": ["triton"], "0.5.23": ["triton"]}
    assert m.sglang["0.5.23"]["status"] == "error" and "boom" in m.sglang["0.5.23"]["reason"]
    assert list(run.df.columns) == ["experiment", "variant", "release", "metric", "value", "unit"]
    assert value(run, release="0.5.12.post1", metric="kernel_nodes") == 20
    assert "boom" in value(run, release="0.5.23", metric="status")


def test_a_spent_budget_starts_no_worker_and_still_writes_the_run(tmp_path):
    import time

    plan = GpuPlan(1, 1, (Step("0.5.23", "p:run"),), "demo")
    path, complete = record.record_fix("demo", plan, out=tmp_path, echo=lambda *_: None,
                                       deadline=time.monotonic() + 5,
                                       runner=lambda *a, **k: pytest.fail("a worker was started"))
    assert not complete
    assert "record budget was spent" in value(read_run(path), release="0.5.23", metric="status")


def test_timeouts_are_cut_to_the_budget(tmp_path):
    import time

    seen = []
    plan = GpuPlan(1, 1, (Step("0.5.23", "p:run", timeout=400.0),), "demo")
    record.record_fix(
        "demo", plan, out=tmp_path, echo=lambda *_: None, deadline=time.monotonic() + 100,
        runner=lambda v, p, prm, timeout: seen.append(timeout) or fake(
            v, rows=[{"variant": "a", "metric": "m", "value": 1, "unit": ""}]))
    assert 90 < seen[0] <= 100


# -- what the releases' code predicts
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("release,k", [("0.5.11", 2), ("0.5.12.post1", 2), ("0.5.23", 1)])
def test_kernels_per_translation_read_from_the_release(release, k):
    from sglab.sglang.releases import release_installed

    if not release_installed(release):
        pytest.skip(f"sglang {release} is not installed")
    assert swa_loc.kernels_per_translation(swa_loc.release_translation(release)) == k


def test_kernels_per_translation_rules():
    assert swa_loc.kernels_per_translation(
        "return m.full_to_swa_index_mapping[i].to(torch.int32)") == 2
    assert swa_loc.kernels_per_translation("return m.full_to_swa_index_mapping[i].to(torch.int32)",
                                           "int32") == 1
    assert swa_loc.kernels_per_translation("return self.full_to_swa_index_mapping[kv_indices]") == 1
    with pytest.raises(ValueError):
        swa_loc.kernels_per_translation("return loc")


# -- the GPU probes' CPU path, through real workers and record_fix
# ------------------------------------------------
CPU_FIXES = {
    "swa_loc": GpuPlan(0, 1,
                       (Step("0.5.12.post1", "sglab.swa_loc.sglang:gpu_probe", {"device": "cpu"}),
                        Step("0.5.23", "sglab.swa_loc.sglang:gpu_probe",
                             {"device": "cpu", "buffers": False})), "cpu path"),
}
# the session answers these with its other calls (conftest)
REAL_CALLS = [(s.probe, s.params, (s.release,)) for plan in CPU_FIXES.values() for s in plan.steps]


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    from sglab.sglang.releases import release_installed

    missing = [
        s.release for p in CPU_FIXES.values() for s in p.steps if not release_installed(s.release)
    ]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"sglang {', '.join(missing)} not installed", pytrace=False)
        pytest.skip(f"sglang {', '.join(missing)} not installed")
    root = tmp_path_factory.mktemp("runs")
    return {
        name: read_run(
            record.record_fix(name, plan, out=root, echo=lambda *_: None, runner=probe_one)[0])
        for name, plan in CPU_FIXES.items()
    }


def test_swa_loc_cpu_path_translates_per_layer_once_or_never(cpu_runs):
    run = cpu_runs["swa_loc"]
    for release, k in (("0.5.12.post1", 2), ("0.5.23", 1)):
        ran(run, release)
        calls = {
            v: value(run, release=release, variant=v, metric="translate_calls")
            for v in swa_loc.GPU_VARIANTS
        }
        assert calls == {"per_layer": len(swa_loc.GPU_SWA_LAYERS), "once_in_graph": 1, "preset": 0}
        for v in swa_loc.GPU_VARIANTS:
            assert value(run, release=release, variant=v, metric="rows_landed") is True
        assert value(run, release=release, metric="expected_nodes_per_swa_layer") == k
    assert value(run, release="0.5.12.post1", variant="decode_buffers", metric="dtype") == "int32"
    assert (run.manifest.params["shims"]["0.5.23"] == run.manifest.params["shims"]["0.5.12.post1"])


# -- on a GPU
# --------------------------------------------------------------------------------------------------
def _gpu_run(name: str, tmp_path_factory):
    fix = get(name)
    root = os.environ.get("SGLAB_REAL_GPU_RUNS")
    if root:
        paths = list_runs(fix.gpu_experiment, root=Path(root))
        if not paths:
            pytest.fail(f"no {fix.gpu_experiment} run under {root}", pytrace=False)
        return read_run(paths[-1])
    from sglab.sglang.releases import release_installed

    missing = sorted({s.release for s in fix.gpu.steps if not release_installed(s.release)})
    # GPU tests never run in CI; on a GPU box the releases come from scripts/real_gpu.sh
    if missing:
        pytest.skip(f"sglang {', '.join(missing)} not installed here (scripts/real_gpu.sh installs "
                    "them)")
    return read_run(
        record.record_fix(name, fix.gpu, out=tmp_path_factory.mktemp(name),
                          echo=lambda *_: None)[0])


@pytest.mark.gpu
def test_gpu_swa_loc_nodes_per_swa_layer_equal_the_release_translation(tmp_path_factory):
    run = _gpu_run("swa_loc", tmp_path_factory)
    n_swa = len(swa_loc.GPU_SWA_LAYERS)
    for release in ("0.5.12.post1", "0.5.23"):
        ran(run, release)
        k = swa_loc.kernels_per_translation(swa_loc.release_translation(release),
                                            value(run, release=release, metric="mapping_dtype"))
        nodes = {
            v: value(run, release=release, variant=v, metric="kernel_nodes")
            for v in swa_loc.GPU_VARIANTS
        }
        for v in swa_loc.GPU_VARIANTS:
            assert value(run, release=release, variant=v,
                         metric="replay_kernels") == nodes[v], (release, v)
            assert value(run, release=release, variant=v,
                         metric="rows_landed") is True, (release, v)
        assert nodes["per_layer"] - nodes["preset"] == k * n_swa, (release, nodes, k)
        assert nodes["once_in_graph"] - nodes["preset"] == k, (release, nodes, k)
        assert value(run, release=release, metric="nodes_per_swa_layer") == k
        assert value(run, release=release, metric="expected_nodes_per_swa_layer") == k
        slow, fast = (value(run, release=release, variant=v, metric="replay_us_median")
                      for v in ("per_layer", "preset"))
        assert slow > fast, (release, slow, fast)


@pytest.mark.gpu
def test_gpu_decode_buffers_int32_and_zeroed_padding_from_0_5_12(tmp_path_factory):
    run = _gpu_run("swa_loc", tmp_path_factory)
    for release in ("0.5.11", "0.5.12.post1"):
        ran(run, release)
    get = lambda v, m: value(run, release=v, variant="decode_buffers", metric=m)  # noqa: E731
    assert get("0.5.11", "dtype") == "int64" and get("0.5.12.post1", "dtype") == "int32"
    assert get("0.5.12.post1", "padded_tail_after_padded_populate") == [0, 0]
    assert get("0.5.11", "padded_tail_after_padded_populate") != [0, 0]
