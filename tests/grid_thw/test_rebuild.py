"""The rebuilt request path of #22858 on the CPU: the key rename, the FEATURE_NAMES offload, the
per-image split and its hash, and the pickle hop."""

from __future__ import annotations

import pickle

import pytest
import torch

from sglab.grid_thw import rebuild as fx


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
    assert c == {
        "num_tokens": 4, "new_width": 50, "new_height": 30, "pad_width": 6, "pad_height": 26
    }


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
    assert fx.FEATURE_NAMES == [
        "pixel_values", "pixel_values_videos", "audio_features", "input_features"
    ]
    assert "grid_thws" not in fx.FEATURE_NAMES and "image_grid_thw" not in fx.FEATURE_NAMES
    pv, grid = _Tracked.of(torch.zeros(4, 3)), _Tracked.of(torch.ones(2, 3, dtype=torch.int64))
    result = {"input_ids": torch.zeros(1, 5), "pixel_values": pv, "grid_thws": grid}
    fx.offload_features(result)
    assert pv.moved == ["cpu"]  # the feature is moved
    assert grid.moved == []  # the grid is left wherever it was built
    assert result["grid_thws"] is grid
    assert type(result["pixel_values"]) is torch.Tensor


def test_before_stays_one_bundled_item():
    items = fx.items_for_request(
        fx.process_mm_data(fx.prompt_for(3), IMAGES, fixed=False, device="cpu"))
    assert len(items) == 1
    assert items[0].offsets == [(3, 8), (10, 12), (14, 15)]
    assert items[0].feature.shape[0] == 44
    assert list(items[0].model_specific_data) == ["grid_thws"]


def test_after_splits_per_image():
    items = fx.items_for_request(
        fx.process_mm_data(fx.prompt_for(3), IMAGES, fixed=True, device="cpu"))
    assert [it.offsets for it in items] == [[(3, 8)], [(10, 12)], [(14, 15)]]
    assert [it.feature.shape[0] for it in items] == [24, 12, 8]
    assert [it.model_specific_data["image_grid_thw"].tolist() for it in items] == [[[1, 4, 6]],
                                                                                   [[1, 6, 2]],
                                                                                   [[1, 2, 4]]]
    # an image hashes the same alone as inside a multi-image request: what makes per-image hits
    alone = fx.items_for_request(
        fx.process_mm_data(fx.prompt_for(1), [IMAGES[1]], fixed=True, device="cpu"))
    assert len(alone) == 1 and alone[0].hash == items[1].hash
    assert len({it.hash for it in items}) == 3


def test_split_falls_back_when_grid_does_not_match():
    item = fx.MMItem("image", feature=torch.zeros(10, 2), offsets=[(0, 1), (3, 4)],
                     model_specific_data={"image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2]])})
    assert fx.get_new_expanded_mm_items([item]) == [item]  # 8 patches != 10 rows: kept bundled
    simple = fx.MMItem("image", feature=torch.zeros(2, 7), offsets=[(0, 1), (3, 4)])
    out = fx.get_new_expanded_mm_items([simple])  # one row per image: simple split
    assert [o.offsets for o in out] == [[(0, 1)], [(3, 4)]]


def test_cache_counts_lookups_per_item():
    items = fx.items_for_request(
        fx.process_mm_data(fx.prompt_for(3), IMAGES, fixed=True, device="cpu"))
    cache = fx.EmbeddingCache()
    cache.lookup_request(items)
    cache.lookup_request(items[1:])
    s = cache.stats
    assert (s.lookups, s.hits, s.images, s.images_encoded) == (5, 2, 5, 3)


def test_pickle_round_trip_keeps_device():
    out = fx.process_mm_data(fx.prompt_for(2), IMAGES[:2], fixed=True, device="cpu")
    back = fx.recv_pyobj(fx.send_pyobj(out))
    assert {k: str(v.device)
            for k, v in back.items()
            } == {"input_ids": "cpu", "pixel_values": "cpu", "image_grid_thw": "cpu"}
    assert torch.equal(back["image_grid_thw"], out["image_grid_thw"])
    assert fx.send_pyobj(out) == pickle.dumps(out)
    assert fx.CUDA_IPC.per_receiver and not fx.PICKLE.per_receiver
