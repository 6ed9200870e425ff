"""The grid_thw measurement on the CPU: the cache point, the whole tokenizer -> rank 0 -> broadcast
path on gloo (fresh processes from a fork server, every step marked, nothing left behind), the
parameter checks, and the time series reduced to sidecars and a Perfetto file."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from sglab.grid_thw import measure
from sglab.grid_thw import rebuild as fx


def test_cache_hits_handmade_stream():
    stream = [[0, 1], [1, 0], [0, 1], [2], [1]]
    before = measure.simulate_cache(stream, fixed=False)
    after = measure.simulate_cache(stream, fixed=True)
    # per request: only the repeated identical (ordered) set [0, 1] hits
    assert (before.lookups, before.hits, before.images, before.images_encoded) == (5, 1, 8, 6)
    # per image: images 0, 1, 2 are encoded once each
    assert (after.lookups, after.hits, after.images, after.images_encoded) == (8, 5, 8, 3)
    assert after.hit_rate == 5 / 8 and after.image_hit_rate == 5 / 8
    assert before.hit_rate == 1 / 5 and before.image_hit_rate == 2 / 8


EXPECTED_SEEDED_BEFORE = (60, 7, 143)  # (lookups, hits, images encoded) of 151 images
EXPECTED_SEEDED_AFTER = (151, 139, 12)


def test_cache_hits_seeded_stream():
    stream = fx.request_stream(60, 12, 4, seed=0)
    assert stream == fx.request_stream(60, 12, 4, seed=0)
    before = measure.simulate_cache(stream, fixed=False)
    after = measure.simulate_cache(stream, fixed=True)
    n_images = sum(len(r) for r in stream)
    assert after.images == before.images == n_images
    assert after.images_encoded == len({i for r in stream for i in r})  # each image once
    assert (before.lookups, before.hits, before.images_encoded) == EXPECTED_SEEDED_BEFORE
    assert (after.lookups, after.hits, after.images_encoded) == EXPECTED_SEEDED_AFTER


def test_cache_rows():
    rows = measure.cache_rows(n_requests=60, pool=12, max_images=4, seed=0)
    v = {(r["variant"], r["metric"]): r["value"] for r in rows}
    assert v[("before", "images_encoded")] == 143 and v[("after", "images_encoded")] == 12
    assert v[("after", "cache_item_hit_rate")] == 139 / 151


def test_gpus_is_the_tp_size():
    assert measure.gpus({"tp_size": 4}) == 4 and measure.gpus({}) == measure.GPUS == 2
    assert measure.FORKSERVER_PRELOAD == ("torch", "sglab.grid_thw.measure")


# --- the whole path on gloo: tokenizer process -> rank 0 (pickled bytes) -> broadcast -> rank 1 ---
@pytest.fixture(scope="module")
def gloo_run():
    """Two groups (before, after) at once on the CPU, forked from a fork server: the rows and the
    parent's children right after."""
    out = measure.run({"variants": ["before", "after"], "repeats": 1, "cache_requests": 20},
                      backend="gloo", progress=False)
    return out, _python_children()


def _python_children() -> list[str]:
    """Command lines of this process's live Python children (the resource tracker may stay)."""
    import os

    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (int(fields[1]) == me and fields[0] not in "ZX" and "python" in cmd
                and "resource_tracker" not in cmd):
            out.append(cmd)
    return out


@pytest.mark.parametrize("variant", ["before", "after"])
def test_transport_on_gloo_lands_and_cleans_up(gloo_run, variant):
    out, children = gloo_run
    rows = out.df[out.df.variant == variant]
    by = {(r.metric, r.rank): r.value for r in rows.itertuples()}
    for rank in (0, 1):
        assert by[("grid_device", rank)] == -1  # CPU run: everything on the CPU
        assert by[("pixel_values_device", rank)] == -1
        assert by[("grid_key_is_image_grid_thw", rank)] == (1.0 if variant == "after" else 0.0)
    assert by[("processes_alive", -1)] == 0
    assert by[("tokenizer_exitcode", -1)] == 0
    assert rows[rows.metric == "gpu_memory"].empty  # no NVML on a CPU run
    assert children == []  # no rank, tokenizer or fork server left behind


def test_gloo_run_marks_every_step_and_times_its_phases(gloo_run):
    from sglab.core import timing as phases

    out, _ = gloo_run
    assert out.sidecars == {}  # no NVML, no time series
    assert set(out.df[out.df.phase == "cache"].variant) == {"before", "after"}
    assert out.extra["concurrent_groups"] == 2
    assert measure.KERNEL_STEPS == ("first kernel", "reduce", "item", "copy to own GPU",
                                    "own-GPU kernel")
    taken = phases.take()
    assert "groups (all at once)" in taken and "rank1/kernel steps" in taken
    # a pause after every step
    assert taken["rank1/kernel steps"] >= 5 * measure.DEFAULT_PARAMS["step_pause_s"]


def test_bad_parameters_fail_before_starting_anything():
    with pytest.raises(ValueError, match="unknown variant"):
        measure.run({"variants": ["nope"]}, backend="gloo", progress=False)
    with pytest.raises(ValueError, match="tp_size must be >= 2"):
        measure.run({"tp_size": 1}, backend="gloo", progress=False)
    with pytest.raises(ValueError, match="start_method"):
        measure.run({"start_method": "fork"}, backend="gloo", progress=False)


# --- the time series: samples and marks reduced to sidecars, and the Perfetto file ---
TOK, R0, R1 = 100, 200, 201


def synthetic_group():
    """One group starting at t = 10 s: rank 1 (pid 201) unpickles at 10.5 s (a 520 MiB context on
    GPU 0, built up over two ticks), then `reduce` at 10.8 s grows it to 612 MiB through a
    transient dip to 108 MiB."""
    ticks = [10.0 + 0.05 * i for i in range(30)]  # 10.00 .. 11.45
    rows = []
    for t in ticks:
        rows += [(t, TOK, 0, 612.0), (t, R0, 0, 978.0), (t, R1, 1, 978.0)]
        if t >= 10.55:
            v = 104.0 if t < 10.6 else 520.0
            if t >= 10.85:
                v = 108.0 if t < 10.9 else 612.0
            rows.append((t, R1, 0, v))
    samples = pd.DataFrame(rows, columns=["t", "pid", "gpu", "used_mib"])
    marks = [("tokenizer", -1, "preprocess", 10.1, 10.2), ("rank 1", 1, "own context", 10.3, 10.32),
             ("rank 1", 1, "unpickle", 10.5, 10.61), ("rank 1", 1, "first kernel", 10.7, 10.71),
             ("rank 1", 1, "reduce", 10.8, 10.86), ("rank 1", 1, "item", 11.0, 11.01),
             ("rank 1", 1, "release", 11.2, 11.25)]
    group = {
        "variant": "before", "repeat": 0, "t_start": 10.0, "t_end": 11.45,
        "procs": {TOK: ("tokenizer", -1), R0: ("rank 0", 0), R1: ("rank 1", 1)}, "marks": marks
    }
    return group, samples, ticks


def test_group_tables_keep_change_points_on_the_group_clock():
    group, samples, ticks = synthetic_group()
    mem, marks = measure.group_tables([group], samples, ticks)
    assert list(mem.columns) == measure.MEMORY_COLUMNS
    assert list(marks.columns) == measure.MARK_COLUMNS
    stray = mem[(mem.process == "rank 1") & (mem.gpu == 0)]
    assert list(stray.mib) == [0.0, 104.0, 520.0, 108.0, 612.0, 612.0]
    assert stray.t_s.iloc[0] == 0.0 and stray.t_s.iloc[-1] == pytest.approx(1.45)
    own = mem[(mem.process == "rank 0")]
    assert list(own.mib) == [978.0, 978.0]  # constant: first and last tick only
    assert marks[marks["mark"] == "reduce"].t_s.iloc[0] == pytest.approx(0.8)


def test_perfetto_file_has_counters_and_slices(tmp_path):
    group, samples, ticks = synthetic_group()
    mem, marks = measure.group_tables([group], samples, ticks)
    path = measure.write_perfetto(mem, marks, tmp_path / "t.json.gz")
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(counters) == len(mem) and len(slices) == len(marks)
    assert {"rank 1 · GPU 0 (MiB)", "tokenizer · GPU 0 (MiB)"} <= {e["name"] for e in counters}
    assert any(e["name"] == "reduce" and e["ts"] == pytest.approx(0.8e6) for e in slices)
