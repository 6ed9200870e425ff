"""The grid_thw measurement on the CPU: the cache point, the whole tokenizer -> rank 0 -> broadcast
path on gloo (fresh processes from a fork server, every step marked, nothing left behind), the
parameter checks."""

from __future__ import annotations

import pytest

from sglab.grid_thw import measure, series
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
    assert series.KERNEL_STEPS == ("first kernel", "reduce", "item", "copy to own GPU",
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
