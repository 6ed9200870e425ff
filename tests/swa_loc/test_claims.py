"""The swa_loc claims on the committed recorded runs, on corrupted copies of them (each corruption
fails the claim it breaks, by id), and on a method-2 run with profiler sidecars built from a
recorded one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sglab.core import runs
from sglab.swa_loc import claims
from sglab.tools import cli, verify


ROOT = Path(__file__).resolve().parents[2]
RECORDED = sorted((ROOT / "data" / "recorded" / "swa_loc").glob("*.csv"))
H100 = next((p for p in RECORDED if "h100" in p.name), None)

pytestmark = pytest.mark.skipif(H100 is None, reason="no recorded H100 swa_loc run")


def test_every_recorded_run_holds(capsys):
    assert cli.main(["verify", "swa_loc"]) == 0
    out = capsys.readouterr().out
    assert "4/4 claims hold on H100" in out and "FAIL" not in out
    from tests.edits import all_claims
    from sglab.swa_loc import claims

    assert len(claims.CLAIMS) <= 5 and all(
        f"  {c.id}" in out or f"└ {c.id}" in out for c in all_claims(claims))


def _copy(tmp_path: Path, edit=None, manifest_edit=None) -> Path:
    """A copy of the recorded H100 run; ``edit(df) -> df`` changes its rows (the manifest's row
    count follows)."""
    dst = tmp_path / H100.name
    shutil.copy(H100, dst)
    man = json.loads(H100.with_suffix(".json").read_text())
    if edit is not None:
        df = edit(pd.read_csv(H100))
        df.to_csv(dst, index=False)
        man["rows"] = len(df)
    if manifest_edit is not None:
        manifest_edit(man)
    dst.with_suffix(".json").write_text(json.dumps(man))
    return dst


def _sel(df, variant, metric, layers=48, ratio=5, bs=32):
    return ((df.variant == variant) & (df.metric == metric) & (df.num_layers == layers)
            & (df.swa_per_full == ratio) & (df.batch_size == bs))


def _add(df, mask, delta):
    df.loc[mask, "value"] += delta
    return df


def _set(df, mask, value):
    df.loc[mask, "value"] = value
    return df


# a failing folded check fails its claim too
PARENT = {f.id: c.id for c in claims.CLAIMS for f in c.folded}
CORRUPTIONS = {
    "swa_loc.extra_kernels_per_swa_layer": lambda d: _add(
        _add(d, _sel(d, "before", "graph_kernel_nodes"), 1), _sel(d, "before", "profiled_kernels"),
        1),
    "swa_loc.profiler_equals_static": lambda d: _add(
        d, _sel(d, "pr23552", "profiled_kernels", 12, 1, 8), -1),
    "swa_loc.translate_calls_in_capture": lambda d: _set(
        d, _sel(d, "pr24743", "translate_calls_capture", 6, 5, 1), 1),
    "swa_loc.kv_matches_eager": lambda d: _set(d, (d.metric == "kv_mismatch_slots")
                                               & (d.variant == "pr23552")
                                               & (d.num_layers == 24) & (d.swa_per_full == 1), 3),
    "swa_loc.pad_bug_exact": lambda d: _set(d, (d.metric == "pad_corrupted_slots")
                                            & (d.variant == "pr24743"), 2),
    "swa_loc.replay_ratio": lambda d: _set(
        d, _sel(d, "before", "time_median"),
        float(d[_sel(d, "pr24743", "time_median")].value.iloc[0]) * 1.05),
}


@pytest.mark.parametrize("claim", sorted(CORRUPTIONS))
def test_a_corrupted_copy_fails_the_claim_it_breaks(tmp_path, capsys, claim):
    path = _copy(tmp_path, CORRUPTIONS[claim])
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    failed = {line.split()[1] for line in out.splitlines() if line.startswith("FAIL ")}
    assert failed == {claim} | ({PARENT[claim]} if claim in PARENT else set()), out


def test_a_dropped_variant_fails_and_a_missing_headline_cell_is_not_applicable(tmp_path, capsys):
    path = _copy(tmp_path,
                 lambda d: d[~(d.metric.str.startswith("pad_") & (d.variant == "pr24743"))])
    assert cli.main(["verify", str(path)]) == 1
    assert "FAIL swa_loc.pad_bug_exact" in capsys.readouterr().out
    (tmp_path / "b").mkdir()
    path = _copy(tmp_path / "b", lambda d: d[~((d.num_layers == 48) & (d.swa_per_full == 5))])
    res = {r.claim.id: r.outcome for r in verify.verify_run(verify.load_run(path)).results}
    assert (res["swa_loc.replay_ratio"].status == "n/a"
            and "headline" in res["swa_loc.replay_ratio"].reason)
    assert res["swa_loc.extra_kernels_per_swa_layer"].status == "pass"


def test_a_truncated_copy_is_bad_input(tmp_path, capsys):
    path = _copy(tmp_path)
    df = pd.read_csv(path)
    df.iloc[:-5].to_csv(path, index=False)
    assert cli.main(["verify", str(path)]) == 2
    captured = capsys.readouterr()
    assert "truncated" in captured.err + captured.out


# --------------------------------------------------------------------------------------------------
# a method-2 run: the recorded rows plus profiler sidecars consistent with them
# --------------------------------------------------------------------------------------------------
GATHER = "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<" \
         "at::native::index_kernel_impl<at::native::OpaqueType<8> >(...)"
CAST = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(" \
       "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::" \
       "operator()() const::{lambda(int)#1}, ...>"
OTHER = "void at::native::vectorized_elementwise_kernel<8, " \
        "at::native::AUnaryFunctor<MulFunctor<float> > >"


def _sidecars(n_swa=40, static=None):
    static = static or {"before": 315, "pr23552": 195, "pr24743": 235}
    gk = [{"variant": "before", "kernel": GATHER, "nodes": n_swa},
          {"variant": "before", "kernel": CAST, "nodes": n_swa}]
    gk += [{"variant": v, "kernel": OTHER, "nodes": n - (2 * n_swa if v == "before" else 0)}
           for v, n in static.items()]
    events = []
    for row in gk:
        for i in range(row["nodes"]):
            events.append({
                "lane": "stream 7", "name": row["kernel"], "category": "kernel",
                "start_us": float(i), "dur_us": 1.0, "phase": f"replay {row['variant']}",
                "variant": row["variant"]
            })
    eager = []
    for backend in ("nsight-python (CUPTI)", "torch.profiler"):
        eager += [{
            "variant": "before", "scope": "SWA layer KV write", "step": 0, "op": "index",
            "kernel": GATHER, "calls": n_swa, "median_us": 2.0, "backend": backend
        }, {
            "variant": "before", "scope": "SWA layer KV write", "step": 1, "op": "_to_copy->int32",
            "kernel": CAST, "calls": n_swa, "median_us": 1.5, "backend": backend
        }, {
            "variant": "pr24743", "scope": "", "step": -1, "op": "mul", "kernel": OTHER,
            "calls": 96, "median_us": 1.0, "backend": backend
        }]
    return {
        "events": pd.DataFrame(events), "graph_kernels": pd.DataFrame(gk),
        "eager_kernels": pd.DataFrame(eager)
    }


def _method2(data_root, sidecars=None, nsight="ran"):
    src = runs.read_run(H100)
    params = {
        **src.manifest.params, "trace_config": {
            "num_layers": 48, "swa_per_full": 5, "batch_size": 32
        }
    }
    path = runs.write_run(
        src.df, experiment="swa_loc", method_version=2, params=params, root=runs.data_dir("runs"),
        extra={
            "eager_kernels": {
                "nsight": nsight, "nsight_reason": "nsight-python 1.1.0 with CUPTI"
                if nsight == "ran" else "nsight-python is not installed"
            }
        }, sidecars=sidecars if sidecars is not None else _sidecars())
    return verify.load_run(path)


def _outcomes(run):
    return {r.claim.id: r.outcome for r in verify.verify_run(run).results}


def test_method2_sidecar_claims_hold(data_root):
    res = _outcomes(_method2(data_root))
    assert {k: o.status for k, o in res.items()} == {k: "pass" for k in res}, res
    assert res["swa_loc.trace_translation_kernels"].value["kernels_per_swa_layer"] == 2
    assert res["swa_loc.trace_translation_kernels"].value["trace_before"] == 80


@pytest.mark.parametrize("claim,edit", [
    ("swa_loc.trace_equals_static", lambda s: s["events"].drop(index=s["events"].index[-1])),
    ("swa_loc.trace_translation_kernels", lambda s: s["events"].assign(name=s["events"].name.where(
        ~((s["events"].variant == "pr24743")
          & (s["events"].index % 50 == 0)), CAST))),
])
def test_method2_trace_corruptions(data_root, claim, edit):
    side = _sidecars()
    side["events"] = edit(side)
    res = _outcomes(_method2(data_root, side))
    assert res[claim].status == "fail", res[claim]
    assert sorted(k for k, o in res.items() if o.status == "fail") == sorted([claim, PARENT[claim]])


def test_method2_nsight_cross_check(data_root):
    side = _sidecars()
    e = side["eager_kernels"]
    e.loc[(e.backend == "torch.profiler") & (e.op == "index"), "calls"] = 39
    res = _outcomes(_method2(data_root, side))
    assert res["swa_loc.nsight_matches_profiler"].status == "fail"
    res = _outcomes(_method2(data_root, nsight="did not run"))
    o = res["swa_loc.nsight_matches_profiler"]
    assert o.status == "n/a" and "not installed" in o.reason


def test_method2_without_sidecars_fails_the_trace_claims(data_root):
    res = _outcomes(_method2(data_root, sidecars={}))
    assert res["swa_loc.trace_equals_static"].status == "fail"
    assert "sidecar" in res["swa_loc.trace_equals_static"].reason
