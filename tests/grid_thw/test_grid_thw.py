"""CPU tests of the Kimi-K2.5 grid path (#22858): key rename, FEATURE_NAMES offload, per-image split,
embedding-cache hits, and the tokenizer -> rank 0 -> broadcast path on gloo."""

from __future__ import annotations

import pickle

import pytest

from sglab.sglang import checks
import torch

from sglab.fixes import grid_thw as fx

IMAGES = [fx.synthetic_image(i) for i in range(3)]


def test_synthetic_images_are_seeded():
    assert [tuple(im.shape) for im in IMAGES] == [(3, 56, 84), (3, 84, 28), (3, 28, 56)]
    assert torch.equal(fx.synthetic_image(1), IMAGES[1])


@pytest.mark.parametrize("fixed, key", [(False, "grid_thws"), (True, "image_grid_thw")])
def test_gpu_call_key_rename(fixed, key):
    out = fx.gpu_call(fx.prompt_for(3), IMAGES, fixed=fixed, device="cpu")
    assert sorted(out) == sorted(["input_ids", "pixel_values", key])
    assert fx.grid_key(out) == key
    assert out[key].tolist() == [[1, 4, 6], [1, 6, 2], [1, 2, 4]]
    assert out[key].dtype == torch.int64
    assert tuple(out["pixel_values"].shape) == (24 + 12 + 8, 3, 14, 14)
    # 6, 3 and 2 image tokens (h*w / merge^2) replace the three placeholders
    ids = out["input_ids"].flatten().tolist()
    assert len(ids) == 18 and ids.count(fx.IMAGE_TOKEN_ID) == 11


def test_navit_resize_config_pads_to_merge_blocks():
    c = fx.navit_resize_config(50, 30)
    assert c == {"num_tokens": 4, "new_width": 50, "new_height": 30, "pad_width": 6, "pad_height": 26}


class _Tracked(torch.Tensor):
    """A CPU tensor that records the devices it was moved to (stands in for a cuda:0 tensor)."""

    moved: list

    @staticmethod
    def of(t):
        x = torch.Tensor._make_subclass(_Tracked, t)
        x.moved = []
        return x

    def to(self, *args, **kwargs):
        self.moved.append(args[0] if args else kwargs.get("device"))
        return torch.Tensor(self).clone()


def test_feature_names_offload_moves_only_features():
    assert fx.FEATURE_NAMES == ["pixel_values", "pixel_values_videos", "audio_features", "input_features"]
    assert "grid_thws" not in fx.FEATURE_NAMES and "image_grid_thw" not in fx.FEATURE_NAMES
    pv, grid = _Tracked.of(torch.zeros(4, 3)), _Tracked.of(torch.ones(2, 3, dtype=torch.int64))
    result = {"input_ids": torch.zeros(1, 5), "pixel_values": pv, "grid_thws": grid}
    fx.offload_features(result)
    assert pv.moved == ["cpu"]           # the feature is moved
    assert grid.moved == []              # the grid is left wherever it was built
    assert result["grid_thws"] is grid
    assert type(result["pixel_values"]) is torch.Tensor


def test_before_stays_one_bundled_item():
    items = fx.items_for_request(fx.process_mm_data(fx.prompt_for(3), IMAGES, fixed=False, device="cpu"))
    assert len(items) == 1
    assert items[0].offsets == [(3, 8), (10, 12), (14, 15)]
    assert items[0].feature.shape[0] == 44
    assert list(items[0].model_specific_data) == ["grid_thws"]


def test_after_splits_per_image():
    items = fx.items_for_request(fx.process_mm_data(fx.prompt_for(3), IMAGES, fixed=True, device="cpu"))
    assert [it.offsets for it in items] == [[(3, 8)], [(10, 12)], [(14, 15)]]
    assert [it.feature.shape[0] for it in items] == [24, 12, 8]
    assert [it.model_specific_data["image_grid_thw"].tolist() for it in items] == [[[1, 4, 6]], [[1, 6, 2]],
                                                                                  [[1, 2, 4]]]
    # an image hashes the same alone as inside a multi-image request: that is what makes per-image hits
    alone = fx.items_for_request(fx.process_mm_data(fx.prompt_for(1), [IMAGES[1]], fixed=True, device="cpu"))
    assert len(alone) == 1 and alone[0].hash == items[1].hash
    assert len({it.hash for it in items}) == 3


def test_split_falls_back_when_grid_does_not_match():
    item = fx.MMItem("image", feature=torch.zeros(10, 2), offsets=[(0, 1), (3, 4)],
                     model_specific_data={"image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2]])})
    assert fx.get_new_expanded_mm_items([item]) == [item]          # 8 patches != 10 rows: kept bundled
    simple = fx.MMItem("image", feature=torch.zeros(2, 7), offsets=[(0, 1), (3, 4)])
    out = fx.get_new_expanded_mm_items([simple])                   # one row per image: simple split
    assert [o.offsets for o in out] == [[(0, 1)], [(3, 4)]]


def test_cache_hits_handmade_stream():
    stream = [[0, 1], [1, 0], [0, 1], [2], [1]]
    before = fx.simulate_cache(stream, fixed=False)
    after = fx.simulate_cache(stream, fixed=True)
    # per request: only the repeated identical (ordered) set [0, 1] hits
    assert (before.lookups, before.hits, before.images, before.images_encoded) == (5, 1, 8, 6)
    # per image: images 0, 1, 2 are encoded once each
    assert (after.lookups, after.hits, after.images, after.images_encoded) == (8, 5, 8, 3)
    assert after.hit_rate == 5 / 8 and after.image_hit_rate == 5 / 8
    assert before.hit_rate == 1 / 5 and before.image_hit_rate == 2 / 8


def test_cache_hits_seeded_stream():
    stream = fx.request_stream(60, 12, 4, seed=0)
    assert stream == fx.request_stream(60, 12, 4, seed=0)
    before = fx.simulate_cache(stream, fixed=False)
    after = fx.simulate_cache(stream, fixed=True)
    n_images = sum(len(r) for r in stream)
    assert after.images == before.images == n_images
    assert after.images_encoded == len({i for r in stream for i in r})  # each distinct image once
    assert (before.lookups, before.hits, before.images_encoded) == EXPECTED_SEEDED_BEFORE
    assert (after.lookups, after.hits, after.images_encoded) == EXPECTED_SEEDED_AFTER


EXPECTED_SEEDED_BEFORE = (60, 7, 143)   # (lookups, hits, images encoded) of 151 images
EXPECTED_SEEDED_AFTER = (151, 139, 12)


def test_pickle_round_trip_keeps_device():
    out = fx.process_mm_data(fx.prompt_for(2), IMAGES[:2], fixed=True, device="cpu")
    back = fx.recv_pyobj(fx.send_pyobj(out))
    assert fx.tensor_devices(back) == {"input_ids": "cpu", "pixel_values": "cpu", "image_grid_thw": "cpu"}
    assert torch.equal(back["image_grid_thw"], out["image_grid_thw"])
    assert fx.send_pyobj(out) == pickle.dumps(out)


# --- the whole path on gloo: tokenizer process -> rank 0 (pickled bytes) -> broadcast_pyobj -> rank 1 ---


@pytest.fixture(scope="module")
def gloo_run():
    """Two groups (before, after) at once on the CPU, forked from a fork server: the rows and the parent's children
    right after."""
    from sglab.experiments import grid_thw as exp

    out = exp.run({"variants": ["before", "after"], "repeats": 1, "cache_requests": 20}, backend="gloo",
                  progress=False)
    return out, _python_children()


def _python_children() -> list[str]:
    """Command lines of this process's live Python children (the multiprocessing resource tracker may stay)."""
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
        if int(fields[1]) == me and fields[0] not in "ZX" and "python" in cmd and "resource_tracker" not in cmd:
            out.append(cmd)
    return out


@pytest.mark.parametrize("variant", ["before", "after"])
def test_transport_on_gloo_lands_and_cleans_up(gloo_run, variant):
    out, children = gloo_run
    rows = out.df[out.df.variant == variant]
    by = {(r.metric, r.rank): r.value for r in rows.itertuples()}
    for rank in (0, 1):
        assert by[("grid_device", rank)] == -1          # CPU run: everything on the CPU
        assert by[("pixel_values_device", rank)] == -1
        assert by[("grid_key_is_image_grid_thw", rank)] == (1.0 if variant == "after" else 0.0)
    assert by[("processes_alive", -1)] == 0
    assert by[("tokenizer_exitcode", -1)] == 0
    assert rows[rows.metric == "gpu_memory"].empty  # no NVML on a CPU run
    assert children == []  # no rank, tokenizer or fork server left behind


def test_gloo_run_marks_every_step_and_times_its_phases(gloo_run):
    from sglab.experiments import grid_thw as exp
    from sglab.core import timing as phases

    out, _ = gloo_run
    assert out.sidecars == {}  # no NVML, no time series
    assert set(out.df[out.df.phase == "cache"].variant) == {"before", "after"}
    assert out.extra["concurrent_groups"] == 2
    assert exp.KERNEL_STEPS == ("first kernel", "reduce", "item", "copy to own GPU", "own-GPU kernel")
    taken = phases.take()
    assert "groups (all at once)" in taken and "rank1/kernel steps" in taken
    assert taken["rank1/kernel steps"] >= 5 * exp.DEFAULT_PARAMS["step_pause_s"]  # a pause after every step


def test_bad_parameters_fail_before_starting_anything():
    from sglab.experiments import grid_thw as exp

    with pytest.raises(ValueError, match="unknown variant"):
        exp.run({"variants": ["nope"]}, backend="gloo", progress=False)
    with pytest.raises(ValueError, match="tp_size must be >= 2"):
        exp.run({"tp_size": 1}, backend="gloo", progress=False)
    with pytest.raises(ValueError, match="start_method"):
        exp.run({"start_method": "fork"}, backend="gloo", progress=False)


def test_cache_rows_and_upstream_check_registered():
    from sglab.sglang import upstream
    from sglab.tools.fixes import NAMES, get
    from sglab.experiments import grid_thw as exp

    rows = exp.cache_rows(n_requests=60, pool=12, max_images=4, seed=0)
    v = {(r["variant"], r["metric"]): r["value"] for r in rows}
    assert v[("before", "images_encoded")] == 143 and v[("after", "images_encoded")] == 12
    assert v[("after", "cache_item_hit_rate")] == 139 / 151
    assert "grid_thw" in NAMES
    call = ("class KimiGPUProcessorWrapper:\n    def _gpu_call(self, text, images):\n"
            "        pixel_values, grid_thws = _gpu_preprocess_images(images)\n")
    fixed = call + '        grid_thws = grid_thws.cpu()\n        return {"image_grid_thw": grid_thws}\n'
    assert checks.grid_thw({"srt/multimodal/processors/kimi_k25.py": fixed}.get).status == "pr-era"
    assert checks.grid_thw(lambda rel: call + '        return {"grid_thws": grid_thws}\n').status == "before"
    assert checks.grid_thw(lambda rel: None).status == "absent"


def _recorded_csvs():
    import csv
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "data" / "recorded" / "grid_thw"
    out = []
    for p in sorted(folder.glob("*.csv")):
        manifest = json.loads(p.with_suffix(".json").read_text())
        with open(p, newline="") as f:
            out.append((p.name, manifest, list(csv.DictReader(f))))
    return out


def test_headline_numbers_from_recorded_runs():
    """The README / slide headline, checked against numbers computed straight from the CSVs of the runs shown."""
    from sglab.core import claims
    from sglab.core import runs
    from sglab.tools import fixes

    recorded = _recorded_csvs()
    if not recorded:
        pytest.skip("no recorded grid_thw run")
    shown = claims.shown(fixes.claims("grid_thw"), runs.load_all_recorded("grid_thw"))
    text = claims.headline(fixes.claims("grid_thw"), shown)
    files = {r.path.name for r in shown}
    rows_of = [(m, rows) for name, m, rows in recorded if name in files]  # read with csv, not with sglab
    assert len(rows_of) == len(shown) >= 1

    def gpu0(rows, variant, phase=None):  # MiB of every rank >= 1 on GPU 0
        return [float(r["value"]) for r in rows if r["metric"] == "gpu_memory" and r["variant"] == variant
                and (phase is None or r["phase"] == phase) and int(r["rank"]) >= 1 and int(r["gpu"]) == 0]

    def span(values):
        lo, hi = min(values), max(values)
        return f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"

    received = [v for _, rows in rows_of for v in gpu0(rows, "before", "received")]
    kernel = [v for _, rows in rows_of for v in gpu0(rows, "before", "kernel")]
    after = [v for _, rows in rows_of for v in gpu0(rows, "after")]
    assert f"holds {span(received)} MiB on GPU 0 once it unpickles the grid" in text
    assert f"and {span(kernel)} MiB after a kernel" in text
    assert f"→ {span(after)} MiB with `.cpu()`" in text and max(after) == 0.0
    # the committed H200 runs: ~520 MiB after the load, ~612 MiB after a kernel, on every rank >= 1
    assert 500 <= min(received) <= max(received) <= 540 and 600 <= min(kernel) <= max(kernel) <= 630
    for manifest, rows in rows_of:  # GPU-0 total of ranks >= 1 in one repeat, never summed across runs
        tp = int(manifest["params"]["tp_size"])
        total = sum(v for v in gpu0([r for r in rows if r["repeat"] == "0"], "before", "kernel"))
        assert f"TP {tp}: {total:.0f} MiB" in text
    assert "95% of items hit per image vs 16% per request" in text
    assert "Spread within a run: 0 MiB" in text  # every repeat of a run read the same MiB
    assert text.startswith("H200: ") and "|" not in text and len(text) < 400


def test_analysis_keeps_runs_apart():
    from sglab.core import runs
    from sglab.experiments import grid_thw as experiment

    recorded = runs.load_all_recorded("grid_thw")
    if len(recorded) < 2:
        pytest.skip("needs two recorded runs")
    df = experiment.frame(recorded)
    assert df.run.nunique() == len(recorded)
    waste = experiment.waste_vs_tp(df)
    expected = sum(len(set(r.df.variant) - {"all"}) for r in recorded)
    assert len(waste) == expected
    for r in recorded:
        reps = int(r.manifest["params"]["repeats"])
        assert (waste[waste.run == experiment.run_name(r)].repeats == reps).all()
    left = experiment.leftovers(df)
    assert (left.processes_alive == 0).all() and (left.nvml_processes_listed == 0).all()
