"""grid_thw claims on the committed runs, and on damaged copies of them: every recorded run verifies; each kind of
damage fails, naming the claim that catches it."""

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
    assert _runs(), "no recorded grid_thw run"
    assert cli.main(["verify", "grid_thw"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "n/a   grid_thw.tp_scaling" in out  # the TP 2 runs say why it does not apply


def _mem(df, variant, rank, gpu, phase=None):
    sel = (df.metric == "gpu_memory") & (df.variant == variant) & (df["rank"] == rank) & (df.gpu == gpu)
    return sel & (df.phase == phase) if phase else sel


DAMAGE = {
    "after_holds_gpu0": (lambda df: df.assign(value=df.value.mask(_mem(df, "after", 1, 0, "kernel"), 2.0)),
                         "grid_thw.after.gpu0_untouched"),
    "no_stray_context": (lambda df: df.assign(value=df.value.mask(_mem(df, "before", 1, 0, "received"), 0.0)),
                         "grid_thw.before.stray_context_gpu0"),
    "process_left": (lambda df: df.assign(value=df.value.mask((df.metric == "processes_alive")
                                                              & (df.variant == "ipc"), 1.0)),
                     "grid_thw.no_process_left"),
    "after_lands_on_cuda0": (lambda df: df.assign(value=df.value.mask((df.metric == "grid_device")
                                                                      & (df.variant == "after") & (df["rank"] == 1),
                                                                      0.0)), "grid_thw.landing"),
    "gpu_labels_swapped": (lambda df: df.assign(gpu=df.gpu.mask(_mem(df, "before", 1, 0), -2).mask(
        _mem(df, "before", 1, 1), 0).replace(-2, 1)), "grid_thw.before.context_grows"),
    "after_dropped": (lambda df: df[df.variant != "after"], "grid_thw.after.gpu0_untouched"),
    "rank1_dropped": (lambda df: df[~((df.variant == "before") & (df["rank"] == 1))],
                      "grid_thw.before.stray_context_gpu0"),
    "cache_worse_after": (lambda df: df.assign(value=df.value.mask((df.metric == "cache_item_hit_rate")
                                                                   & (df.variant == "after"), 0.01)),
                          "grid_thw.cache.per_image_hits"),
}


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
    _gz(mem_path, mem.assign(mib=mem.mib.mask(stray & (mem.mib == top), 522.0)))  # no growth step any more
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
