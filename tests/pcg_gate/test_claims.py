"""The pcg_gate claims: on the committed runs (all hold or are n/a with a reason), on damaged copies
of them (the right claim fails, by name), and on synthetic method-3 runs: the launch-bound claims
hold on a fast and on a slow host of one GPU model, and their values travel between the two where
the raw speed-ups do not."""

from __future__ import annotations

import json

import pytest

from sglab.core import claims as C
from sglab.core import runs
from sglab.pcg_gate import claims, measure, tables
from sglab.tools import cli
from tests.edits import all_claims, copy_run, set_value


EXP = "pcg_gate"
RECORDED = runs.list_runs(EXP)
M2 = [
    p for p in RECORDED
    if json.loads(p.with_suffix(".json").read_text()).get("method_version", 1) == 2
]


def test_every_recorded_run_verifies(capsys):
    if not RECORDED:
        pytest.skip("no recorded pcg_gate run")
    assert cli.main(["verify", EXP]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and f"{len(RECORDED)} run(s): {len(RECORDED)} hold" in out
    assert len(claims.CLAIMS) <= 5 and "5/5 claims hold on H100" in out
    assert all(f"  {c.id}" in out or f"└ {c.id}" in out for c in all_claims(claims))


def _smallest_traced(df):
    return int(df[df.metric == "trace_busy"].num_tokens.min())


DAMAGE = {
    "pcg_gate.gate_decision": lambda df: set_value(df, 1.0, variant="eager", metric="gate_enabled"),
    "pcg_gate.piecewise_equals_eager": lambda df: set_value(df, 0.5, variant="piecewise", metric=
                                                            "max_abs_diff", num_tokens=64),
    "pcg_gate.small_prefill_speedup": lambda df: set_value(df, 50.0, variant="piecewise", metric=
                                                           "time_median", num_tokens=64),
}
DAMAGE_M2 = {
    "pcg_gate.duplicate_keys": lambda df: set_value(df, 97.0, variant="property_guard", metric=
                                                    "model_keys_after_gate"),
    "pcg_gate.copies_explain_slowdown": lambda df: set_value(df, 0.0, variant="piecewise", metric=
                                                             "trace_copy_us"),
}
# a folded check that fails fails the claim it is folded under
FOLDED_M2 = {
    ("pcg_gate.piecewise_equals_eager", "pcg_gate.graph_count"): lambda df: set_value(
        df, 849.0, variant="piecewise", metric="graphs"),
    ("pcg_gate.small_prefill_speedup", "pcg_gate.trace_launch_gaps"): lambda df: set_value(
        df, 0.9, variant="eager", metric="trace_busy", num_tokens=_smallest_traced(df)),
    ("pcg_gate.copies_explain_slowdown", "pcg_gate.kernel_counts_agree"): lambda df: df.assign(
        value=df.value.where(~((df.metric == "kernel_table_calls")
                               & (df.variant == "eager")), df.value + 1)),
}


def _failed(out: str) -> set:
    return {line.split()[1] for line in out.splitlines() if line.startswith("FAIL ")}


@pytest.mark.parametrize("claim", sorted(DAMAGE))
def test_a_damaged_copy_fails_the_right_claim(claim, tmp_path, capsys):
    if not RECORDED:
        pytest.skip("no recorded pcg_gate run")
    assert cli.main(["verify", str(copy_run(RECORDED[-1], tmp_path, DAMAGE[claim]))]) == 1
    out = capsys.readouterr().out
    assert _failed(out) == {claim}, out


@pytest.mark.parametrize("claim", sorted(DAMAGE_M2))
def test_a_damaged_method2_copy_fails_the_right_claim(claim, tmp_path, capsys):
    if not M2:
        pytest.skip("no recorded pcg_gate run of method 2 yet")
    assert cli.main(["verify", str(copy_run(M2[-1], tmp_path, DAMAGE_M2[claim]))]) == 1
    out = capsys.readouterr().out
    assert _failed(out) == {claim}, out


@pytest.mark.parametrize("parent, check", sorted(FOLDED_M2))
def test_a_failing_folded_check_fails_its_claim(parent, check, tmp_path, capsys):
    if not M2:
        pytest.skip("no recorded pcg_gate run of method 2 yet")
    assert cli.main(["verify", str(copy_run(M2[-1], tmp_path, FOLDED_M2[(parent, check)]))]) == 1
    out = capsys.readouterr().out
    if "n/a   └ pcg_gate.kernel_counts_agree" in out and check.endswith("kernel_counts_agree"):
        pytest.skip("the committed run's kernel table came from torch.profiler (check n/a)")
    assert _failed(out) == {parent, check} and f"folded check fails: {check}" in out, out


def test_a_cpu_run_has_the_gate_rows_the_claims_read():
    """The CPU path of the measurement writes the gate rows; the gate claims hold on them."""
    import torch

    from sglab.core.timing import host_time

    tiny = {
        "hidden": 64, "num_layers": 2, "num_heads": 4, "intermediate": 96, "vocab": 50,
        "max_tokens": 64, "token_counts": [16, 64], "direct_token_counts": [],
        "trace_token_counts": [16], "repeat": 1, "rounds": 1, "warmup": 0, "launch_burst": 4
    }
    p = {**measure.DEFAULT_PARAMS, **tiny}
    out = measure.sweep(p, torch.device("cpu"), use_graphs=False,
                        timer=lambda f, warmup, repeat: host_time(f, warmup=warmup, repeat=repeat))
    run = runs.Run(out.df, {"experiment": EXP, "method_version": 3, "params": p},
                   runs.repo_root() / "cpu.csv")
    v = C.values(claims, run)
    assert v["pcg_gate.gate_decision"].status == "pass"
    assert v["pcg_gate.duplicate_keys"].status == "pass"
    assert v["pcg_gate.duplicate_keys"].value["lm_keys"] == 1 + 2 * 6 + 1


# --------------------------------------------------------------------------------------------------
# the headline, recomputed straight from the committed CSVs
# --------------------------------------------------------------------------------------------------
def test_headline_numbers_from_committed_csvs():
    shown = C.shown(claims, runs.load_all_recorded(EXP))
    if not shown:
        pytest.skip("no recorded pcg_gate run committed")
    text = C.headline(claims, shown)
    assert "|" not in text and len(text) < 400
    worst, points, starts = 0.0, set(), []
    for r in shown:
        df = r.df
        med = df[df.metric == "time_median"].pivot_table(index="num_tokens", columns="variant",
                                                         values="value")
        ratio = (med["eager"] / med["piecewise"]).sort_index()
        start = [int(n) for n, x in ratio.items() if x < 1][0]
        assert all(x < 1 for x in ratio[ratio.index >= start])  # a clean crossover, not a dip
        starts.append(start)
        assert (f"{runs.gpu_short(r)} {ratio.min():.2f}–{ratio.max():.2f}× (max at "
                f"{int(ratio.idxmax())} tok") in text
        # the largest speed-up moves with the host: its range over this GPU model's runs
        peers = [
            x for x in runs.load_all_recorded(EXP) if runs.gpu_short(x) == runs.gpu_short(r)
            and x.manifest.method_version == r.manifest.method_version
        ]
        tops = [(x.df[x.df.metric == "time_median"].pivot_table(
            index="num_tokens", columns="variant", values="value").eval("eager / piecewise").max())
                for x in peers]
        across = f"; the max {min(tops):.2f}–{max(tops):.2f}× over {len(tops)} runs)"
        assert (across in text) == (len(tops) > 1), (across, text)
        d = df[(df.metric == "max_abs_diff") & (df.variant == "piecewise")]
        tol = df[df.metric == "tolerance"].set_index("num_tokens")["value"]
        assert (d.set_index("num_tokens")["value"] <= tol).all()
        worst = max(worst, float(d["value"].max()))
        points.add(len(d))
    assert f"below 1× from {min(starts)} tok" in text
    assert f"at {max(points)}/{max(points)} token counts on each GPU (max abs diff {worst:.3f})" \
        in text
    assert text.startswith("Prefill eager/piecewise (median, 16–4096 tok): ")
    # the host's per-launch cost is in the headline exactly where a shown run measured it
    assert ("per launch on the host" in text) == any(r.manifest.method_version >= 3 for r in shown)


# --------------------------------------------------------------------------------------------------
# method 3: synthetic runs of one GPU model behind a slow and a fast host
# --------------------------------------------------------------------------------------------------
COUNTS = [16, 64, 100, 256, 1024, 2048, 4096]
LE, LP = 306, 50  # launches of one prefill: eager, piecewise


def method3_run(tmp_path, host_us: float, *, eager_x: float = 3.5, name: str = "run",
                edit=None) -> runs.Run:
    """A method-3 run as the GPU would record it: device times fixed by the GPU, eager small
    prefills at ``eager_x`` × ``host_us`` per launch, piecewise at its device time or its own
    launches, whichever is longer."""
    rows = []

    def row(variant, metric, value, unit="count", n=None, bucket=None):
        rows.append({
            "variant": variant, "num_tokens": n, "bucket": bucket, "metric": metric,
            "value": float(value), "unit": unit
        })

    per_launch_ms = host_us * eager_x / 1e3
    row("eager", "gate_enabled", 0, "bool")
    row("piecewise", "gate_enabled", 1, "bool")
    for v in ("no_alias", "plain_alias", "property_only", "property_guard", "property_setter"):
        dup = 98 if v in ("plain_alias", "property_only", "property_setter") else 0
        for m, x in (("gate_enabled", v != "no_alias"), ("lm_keys", 98),
                     ("state_dict_keys_built", 102), ("state_dict_keys_after_gate", 102 + dup),
                     ("model_keys_after_gate", dup), ("named_parameters_dup", 102 + dup)):
            row(v, m, x)
    for m, x in (("graphs", 850), ("buckets", 50), ("capture_time", 1.5), ("graph_pool", 20),
                 ("static_buffers", 300)):
        row("piecewise", m, x)
    row("eager", "weights", 1800, "MiB")
    for n in COUNTS:
        dev_e = 1.5 + n * 0.005  # ms of GPU work
        dev_p = dev_e * 1.08
        t = {
            "eager": max(LE * per_launch_ms, dev_e),
            "piecewise": max(dev_p, LP * per_launch_ms) * 1.05
        }
        if n >= 2048:
            t["piecewise_direct"] = t["eager"] / 0.995
        for v, ms in t.items():
            for m, f in (("time_median", 1.0), ("time_p10", 0.97), ("time_p90", 1.04)):
                row(v, m, ms * f, "ms", n, n)
        for m, x in (("max_abs_diff", 0.0), ("rel_rms_diff", 0.0), ("ref_max_abs", 5.0),
                     ("tolerance", 0.25), ("within_tol", 1), ("max_abs_diff_same_shape", 0.0)):
            row("piecewise", m, x, "abs", n, n)
        for m, x in (("launch_us", host_us), ("launch_us_p10", host_us * 0.95),
                     ("launch_us_p90", host_us * 1.1), ("launch_event_us", host_us * 0.99)):
            row(measure.HOST, m, x, "us", n, n)
        for v, launches, dev in (("eager", LE, dev_e), ("piecewise", LP, dev_p)):
            row(v, "launches", launches, "count", n, n)
            row(v, "device_us", dev * 1e3, "us", n, n)
    for n in (64, 4096):
        dev_e = (1.5 + n * 0.005) * 1e3
        for v, dev, kernels, graphs, copy in (("eager", dev_e, LE, 0, 0.0),
                                              ("piecewise", dev_e * 1.08, 371, 17, 0.07 * dev_e),
                                              ("piecewise_direct", dev_e * 1.01, LE, 17, 0.0)):
            if v == "piecewise_direct" and n != 4096:
                continue
            span = max(dev, (LE if v == "eager" else LP) * per_launch_ms * 1.2e3)
            for m, x in (("trace_kernels", kernels), ("trace_device_us", dev),
                         ("trace_span_us", span), ("trace_busy", dev / span), ("trace_copy_us",
                                                                               copy),
                         ("trace_copy_ops", 82 if copy else 0), ("trace_graph_launches", graphs),
                         ("trace_kernel_launches", LE if v == "eager" else 16), ("trace_host_us",
                                                                                 span)):
                row(v, m, x, "us", n)
    row("eager", "kernel_table_calls", LE, "count", 4096)
    df = runs.tidy(EXP, rows)
    df = edit(df) if edit else df
    manifest = {
        "experiment": EXP, "method_version": 3, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
        "created_utc": "2026-12-01T00:00:00Z", "params": {**measure.DEFAULT_PARAMS},
        "kernel_table": {"backend": "cupti", "reason": "synthetic"}
    }
    return runs.Run(df, manifest, tmp_path / f"{name}.csv")


def _status(run) -> dict:
    return {r.claim.id: r.status for r in C.evaluate(claims, run)}


@pytest.mark.parametrize("host_us", [5.0, 12.0, 20.0])
def test_method3_claims_hold_on_any_host(tmp_path, host_us):
    run = method3_run(tmp_path, host_us)
    status = _status(run)
    assert set(status.values()) == {"pass"}, status
    v = C.values(claims, run)
    assert v["pcg_gate.small_prefill_speedup"].value["launches_eager"] == LE
    assert v["pcg_gate.host_launch_cost"].value["launch_us"] == pytest.approx(host_us)
    assert v["pcg_gate.host_launch_cost"].value["eager_x"] == pytest.approx(3.5)


def test_method3_values_travel_where_raw_speedups_do_not(tmp_path):
    """Two hosts of one GPU model, 2.4× apart in per-launch cost: the raw small-prefill speed-up and
    busy share move far beyond ±25%, the method-3 values of the launch-bound claims stay within
    their tolerance, and the raw figures (under host_launch_cost) are never flagged."""
    slow, fast = method3_run(tmp_path, 12.0, name="slow"), method3_run(tmp_path, 5.0, name="fast")
    sp = {r.path.stem: tables.latency_table(r.df).loc[64, "speedup"] for r in (slow, fast)}
    assert sp["slow"] / sp["fast"] - 1 > 0.25
    drift = C.compare(claims, fast, slow).drift
    travelling = [
        d for d in drift if d["claim"] in ("pcg_gate.small_prefill_speedup",
                                           "pcg_gate.trace_launch_gaps")
    ]
    assert {d["value"]
            for d in travelling} >= {"explained", "launches_eager", "kernel_us", "device_ratio"}
    assert not [d for d in travelling if d["beyond"]], travelling
    host = [d for d in drift if d["claim"] == "pcg_gate.host_launch_cost"]
    assert {"max", "eager_busy", "launch_us"} <= {d["value"] for d in host}
    assert not any(d["beyond"] for d in host)
    assert any(d["drift"] > 0.25 for d in host)  # the raw figures did move


def test_method3_keeps_the_old_checks_for_old_runs():
    """Methods 1-2 keep their raw-ratio check (≥ 2× up to 128 tok); method 3 does not apply it."""
    if not M2:
        pytest.skip("no recorded pcg_gate run of method 2 yet")
    old = runs.read_run(M2[-1])
    v = C.values(claims, old)["pcg_gate.small_prefill_speedup"]
    assert v.status == "pass" and "min_launch_bound" in v.value and "explained" not in v.value
    host = C.values(claims, old)["pcg_gate.host_launch_cost"]
    assert host.status == "n/a" and host.value["max_at"] == 64 and "predates" in host.reason


@pytest.mark.parametrize(
    "claim, edit",
    [
        (
            # eager far slower than its launches at the host's cost
            "pcg_gate.small_prefill_speedup",
            lambda df: set_value(df, 400.0, variant="eager", metric="time_median", num_tokens=16)),
        (
            "pcg_gate.small_prefill_speedup",  # piecewise keeps most of the removed launches' cost
            lambda df: set_value(df, 8.0, variant="piecewise", metric="time_median", num_tokens=64)
        ),
        (
            "pcg_gate.host_launch_cost",  # the two clocks disagree
            lambda df: set_value(df, 30.0, variant="host", metric="launch_event_us")),
        (
            "pcg_gate.trace_launch_gaps",  # the GPU busy through the eager forward
            lambda df: set_value(df, 0.8, variant="eager", metric="trace_busy", num_tokens=64)),
    ])
def test_method3_damage_fails_the_right_check(tmp_path, claim, edit):
    status = _status(method3_run(tmp_path, 12.0, edit=edit))
    failed = {c for c, s in status.items() if s == "fail"}
    parent = {
        "pcg_gate.host_launch_cost": "pcg_gate.small_prefill_speedup",
        "pcg_gate.trace_launch_gaps": "pcg_gate.small_prefill_speedup"
    }.get(claim)
    assert failed == {claim} | ({parent} if parent else set()), status


def test_method3_headline_carries_the_host_cost(tmp_path):
    runs_ = [method3_run(tmp_path, 12.0, name="h100")]
    text = C.headline(claims, runs_)
    assert "per launch on the host" in text and "12.0 µs" in text  # one run: no range
    assert "of what the removed launches cost" in text and "H100 " in text


def test_the_headline_and_the_claim_give_the_gain_explained_by_one_statistic():
    """The headline's range of the gain over the removed launches' cost is the claim's own
    lowest–highest over every launch-bound count of every shown run (not the runs' medians), and a
    claim whose ends print alike prints one figure."""
    shown = C.shown(claims, runs.load_all_recorded(EXP))
    m3 = [r for r in shown if r.manifest.method_version >= 3]
    if not m3:
        pytest.skip("no recorded method-3 pcg_gate run")
    text = C.headline(claims, shown)
    per_run = []
    for r in m3:
        lt = tables.launch_table(r.df)
        explained = lt[lt.index <= claims.LAUNCH_BOUND]["gain explained"]
        per_run.append((explained.min(), explained.max()))
        measured = C.values(claims, r)["pcg_gate.small_prefill_speedup"].measured
        lo, hi = f"{explained.min():.2f}", f"{explained.max():.2f}"
        assert f"gains {lo if lo == hi else f'{lo}–{hi}'} of what" in measured, measured
        assert f"{lo}–{lo}" not in measured
    lo, hi = f"{min(a for a, _ in per_run):.2f}", f"{max(b for _, b in per_run):.2f}"
    said = lo if lo == hi else f"{lo}–{hi}"
    assert f"at ≤ {claims.LAUNCH_BOUND} tok the gain is {said} of what" in text, text
