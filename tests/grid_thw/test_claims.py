"""grid_thw claims on the committed runs, and on damaged copies of them: every recorded run
verifies; each kind of damage fails, naming the claim (or folded check) that catches it; the
headline's numbers equal those read straight from the CSVs."""

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sglab.tools import cli
from sglab.core import runs


RECORDED = runs.data_dir("recorded") / "grid_thw"


def _runs(method=None):
    out = []
    for p in runs.list_runs("grid_thw"):
        m = json.loads(p.with_suffix(".json").read_text())
        if method is None or m.get("method_version") == method:
            out.append(p)
    return out


def _copy(src: Path, dst: Path) -> Path:
    """The run's CSV, manifest and sidecars, copied to ``dst``."""
    m = json.loads(src.with_suffix(".json").read_text())
    for name in [src.name, src.with_suffix(".json").name, *(m.get("sidecars") or {}).values()]:
        shutil.copy2(src.parent / name, dst / name)
    return dst / src.name


def _rewrite(path: Path, df: pd.DataFrame) -> None:
    """Write a changed frame back, keeping the manifest's row count in sync."""
    df.to_csv(path, index=False)
    m = json.loads(path.with_suffix(".json").read_text())
    m["rows"] = len(df)
    path.with_suffix(".json").write_text(json.dumps(m))


def test_every_recorded_run_verifies(capsys):
    from tests.edits import all_claims
    from sglab.grid_thw import claims

    assert _runs(), "no recorded grid_thw run"
    assert cli.main(["verify", "grid_thw"]) == 0
    out = capsys.readouterr().out
    # the TP 2 runs say why it does not apply
    assert "FAIL" not in out and "n/a   └ grid_thw.tp_scaling" in out
    assert out.count("5/5 claims hold on H200") == len(_runs())
    assert len(claims.CLAIMS) <= 5 and len(all_claims(claims)) == 15
    assert all(f"  {c.id}" in out or f"└ {c.id}" in out for c in all_claims(claims))


def _mem(df, variant, rank, gpu, phase=None):
    sel = ((df.metric == "gpu_memory") & (df.variant == variant) & (df["rank"] == rank)
           & (df.gpu == gpu))
    return sel & (df.phase == phase) if phase else sel


def _set(mask, value):
    return lambda df: df.assign(value=df.value.mask(mask(df), value))


DAMAGE = {
    "after_holds_gpu0": (_set(lambda df: _mem(df, "after", 1, 0, "kernel"),
                              2.0), "grid_thw.after.gpu0_untouched"),
    "no_stray_context": (_set(lambda df: _mem(df, "before", 1, 0, "received"),
                              0.0), "grid_thw.before.stray_context_gpu0"),
    "process_left": (_set(lambda df: (df.metric == "processes_alive") & (df.variant == "ipc"),
                          1.0), "grid_thw.no_process_left"),
    "after_lands_on_cuda0": (_set(
        lambda df: (df.metric == "grid_device") & (df.variant == "after")
        & (df["rank"] == 1), 0.0), "grid_thw.landing"),
    "gpu_labels_swapped": (lambda df: df.assign(gpu=df.gpu.mask(_mem(df, "before", 1, 0), -2).mask(
        _mem(df, "before", 1, 1), 0).replace(-2, 1)), "grid_thw.before.context_grows"),
    "after_dropped": (lambda df: df[df.variant != "after"], "grid_thw.after.gpu0_untouched"),
    "rank1_dropped": (lambda df: df[~(
        (df.variant == "before") & (df["rank"] == 1))], "grid_thw.before.stray_context_gpu0"),
    "cache_worse_after": (_set(
        lambda df: (df.metric == "cache_item_hit_rate")
        & (df.variant == "after"), 0.01), "grid_thw.cache.per_image_hits"),
}


def test_a_failing_folded_check_fails_its_claim(tmp_path, capsys):
    src = _runs()[-1]
    path = _copy(src, tmp_path)
    _rewrite(path, DAMAGE["process_left"][0](pd.read_csv(path)))
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL grid_thw.after.gpu0_untouched in {path.name}" in out
    assert "folded check fails: grid_thw.no_process_left" in out


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_copy_fails_naming_the_claim(tmp_path, capsys, damage):
    change, claim = DAMAGE[damage]
    for src in _runs():
        path = _copy(src, tmp_path)
        _rewrite(path, change(pd.read_csv(path)))
        assert cli.main(["verify", str(path)]) == 1, (damage, src.name)
        out = capsys.readouterr().out
        assert f"FAIL {claim} in {path.name}" in out, (damage, src.name, out[-2000:])


def _gz(path: Path, df: pd.DataFrame) -> None:
    with gzip.open(path, "wt") as f:
        df.to_csv(f, index=False)


def test_damaged_time_series_fails_naming_the_claim(tmp_path, capsys):
    srcs = _runs(method=2)
    if not srcs:
        pytest.skip("no method-2 recorded run")
    path = _copy(srcs[-1], tmp_path)
    m = json.loads(path.with_suffix(".json").read_text())
    mem_path = tmp_path / m["sidecars"]["memory"]
    mem = pd.read_csv(mem_path)
    stray = (mem.variant == "before") & (mem.process == "rank 1") & (mem.gpu == 0)
    top = mem[stray].mib.max()
    # no growth step any more
    _gz(mem_path, mem.assign(mib=mem.mib.mask(stray & (mem.mib == top), 522.0)))
    df = pd.read_csv(path)
    _rewrite(path, df.assign(value=df.value.mask(df.metric == "sampler_hz", 20.0)))
    assert cli.main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL grid_thw.series.growth_step in {path.name}" in out
    assert f"FAIL grid_thw.series.rate in {path.name}" in out


def test_concurrency_claim_catches_a_mixed_baseline(tmp_path, capsys):
    srcs = _runs(method=2)
    if not srcs:
        pytest.skip("no method-2 recorded run")
    path = _copy(srcs[-1], tmp_path)
    df = pd.read_csv(path)
    _rewrite(path, df.assign(value=df.value.mask(_mem(df, "before", 1, 0, "init"), 14.0)))
    assert cli.main(["verify", str(path)]) == 1
    assert f"FAIL grid_thw.concurrent.no_mixing in {path.name}" in capsys.readouterr().out


def _recorded_csvs():
    import csv

    out = []
    for p in sorted(RECORDED.glob("*.csv")):
        manifest = json.loads(p.with_suffix(".json").read_text())
        with open(p, newline="") as f:
            out.append((p.name, manifest, list(csv.DictReader(f))))
    return out


def test_headline_numbers_from_recorded_runs():
    """The README / slide headline, checked against numbers computed straight from the CSVs of the
    runs shown."""
    from sglab.core import claims as C
    from sglab.grid_thw import claims

    recorded = _recorded_csvs()
    if not recorded:
        pytest.skip("no recorded grid_thw run")
    shown = C.shown(claims, runs.load_all_recorded("grid_thw"))
    text = C.headline(claims, shown)
    files = {r.path.name for r in shown}
    rows_of = [(m, rows) for name, m, rows in recorded if name in files]  # csv, not sglab
    assert len(rows_of) == len(shown) >= 1

    def gpu0(rows, variant, phase=None):  # MiB of every rank >= 1 on GPU 0
        return [
            float(r["value"])
            for r in rows if r["metric"] == "gpu_memory" and r["variant"] == variant and (
                phase is None or r["phase"] == phase) and int(r["rank"]) >= 1 and int(r["gpu"]) == 0
        ]

    def span(values):
        return f"{min(values):.0f}–{max(values):.0f}"

    received = [v for _, rows in rows_of for v in gpu0(rows, "before", "received")]
    kernel = [v for _, rows in rows_of for v in gpu0(rows, "before", "kernel")]
    ipc = [v for _, rows in rows_of for v in gpu0(rows, "ipc", "kernel")]
    after = [v for _, rows in rows_of for v in gpu0(rows, "after")]
    assert f"holds {span(received)} MiB on GPU 0 once it unpickles the grid" in text
    assert f"and {span(kernel)} MiB after a kernel" in text
    assert f"after a kernel, {max(after):.0f} MiB with `.cpu()`" in text and max(after) == 0.0
    assert f"Via CUDA IPC: {span(ipc)} MiB after a kernel" in text
    # the committed H200 runs: ~520 MiB after the load, ~612 MiB after a kernel, every rank >= 1
    assert 500 <= min(received) <= max(received) <= 540
    assert 600 <= min(kernel) <= max(kernel) <= 630
    for manifest, rows in rows_of:  # stray contexts of one run before the fix, never summed
        tp = int(manifest["params"]["tp_size"])
        gpus = 1 + max(int(r["gpu"]) for r in rows if r["metric"] == "gpu_memory")
        held = [
            float(r["value"]) for r in rows if r["metric"] == "gpu_memory"
            and r["variant"] == "before" and r["phase"] == "kernel" and r["repeat"] == "0"
            and int(r["rank"]) >= 1 and int(r["gpu"]) != int(r["rank"]) and float(r["value"]) > 0
        ]
        assert f"H200 TP {tp} on {gpus} GPUs: {len(held)}, {sum(held):,.0f} MiB" in text
    cache = {(r["variant"], r["metric"]): float(r["value"])
             for r in rows_of[0][1] if r["phase"] == "cache"}
    per_image = {
        v: 1 - cache[(v, "images_encoded")] / cache[(v, "images_requested")]
        for v in ("before", "after")
    }
    assert (f"Vision cache: {per_image['after']:.1%} of images served from it per image vs "
            f"{per_image['before']:.1%} per request." in text)
    assert text.startswith("Each rank ≥ 1 holds ") and "|" not in text and len(text) < 500
