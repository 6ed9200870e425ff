"""The real hybrid-SWA pool and decode buffers, against ``sglab.fixes.swa_loc``.

Releases: 0.5.10.post1 (before #23552: no buffer field), 0.5.11 (#23552: int64 buffer, tail not cleared),
0.5.12.post1 (#24743: int32, zeroed on padding), 0.5.23 (``set_swa_loc`` gone; the caller translates once).
"""

import pytest
import torch

from sglab.fixes import swa_loc as fix
from sglab.real.testing import probe_all, require, value

RELEASES = ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.23")
VARIANT_OF = {"0.5.10.post1": "before", "0.5.11": "pr23552", "0.5.12.post1": "pr24743"}


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, "swa_loc:run")


def rebuild_translations(preset: bool) -> int:
    """The rebuild's pool, the probe's shape (16 full / 6 SWA slots, SWA layers 0 and 2): translations made by
    one 3-token write through 4 layers."""
    pool = fix.SWAKVPool(16, 6, 2, 4, torch.float32, [0, 2], [1, 3], "cpu")
    alloc = fix.SWATokenToKVPoolAllocator(16, 6, pool)
    loc = alloc.alloc(3)
    if preset:
        pool.set_swa_loc(alloc.translate_loc_from_full_to_swa(loc))
    pool.translate_calls = 0
    k = torch.ones(3, 2, 4)
    for layer in range(4):
        pool.set_kv_buffer(layer, loc, k, -k)
    return pool.translate_calls


def rebuild_tail(variant: str) -> tuple[str, list]:
    """(dtype, padded tail) of the rebuild's buffer after a full then a padded populate (as the probe does)."""
    cfg = fix.runner_config(variant)
    buf = fix.DecodeInputBuffers.create(device="cpu", max_bs=4, is_hybrid_swa=True, swa_loc_dtype=cfg.swa_loc_dtype)
    for swa, raw_bs in (([11, 12, 13, 14], 4), ([21, 22], 2)):
        fb = fix.ForwardBatch(torch.zeros(raw_bs, dtype=torch.int64), torch.full((raw_bs,), 5, dtype=torch.int32),
                              torch.arange(1, raw_bs + 1), torch.tensor(swa, dtype=torch.int32))
        buf.populate_from_forward_batch(forward_batch=fb, raw_bs=raw_bs, bs=4, zero_swa_on_pad=cfg.zero_swa_on_pad)
    return str(buf.out_cache_loc_swa.dtype).replace("torch.", ""), buf.out_cache_loc_swa[2:4].tolist()


@pytest.mark.parametrize("release", ["0.5.10.post1", "0.5.11", "0.5.12.post1"])
def test_pr_era_pool_translates_per_swa_layer_unless_preset(real, release):
    r = require(real[release])
    assert value(r, part="pool", case="has_set_swa_loc", metric="value") is True
    assert value(r, part="pool", case="no_swa_loc", metric="translate_calls") == rebuild_translations(False) == 2
    assert value(r, part="pool", case="set_swa_loc", metric="translate_calls") == rebuild_translations(True) == 0
    for case in ("no_swa_loc", "set_swa_loc"):
        assert value(r, part="pool", case=case, metric="swa_rows_at_paired_slots") is True
        assert value(r, part="pool", case=case, metric="translate_dtype") == "int32"   # .to(torch.int32), as rebuilt


def test_0523_never_translates_inside_the_pool(real):
    """Today's design: the write location carries the SWA slots, translated once per forward by the caller;
    a write without them is refused, so there is nothing left for ``set_swa_loc`` to save."""
    r = require(real["0.5.23"])
    assert value(r, part="pool", case="has_set_swa_loc", metric="value") is False
    assert value(r, part="pool", case="no_swa_loc", metric="error").startswith("AssertionError")
    assert value(r, part="pool", case="write_loc", metric="translate_calls") == 0
    assert value(r, part="pool", case="write_loc", metric="swa_rows_at_paired_slots") is True
    assert value(r, part="pool", case="write_loc", metric="translate_dtype") == "int64"   # no int32 cast any more


def test_0510_has_no_swa_buffer_like_the_rebuild_before(real):
    r = require(real["0.5.10.post1"])
    assert value(r, part="buffers", metric="has_out_cache_loc_swa") is False
    assert fix.SWA_LOC_BUFFER_DTYPE["before"] is None


@pytest.mark.parametrize("release, stale_tail", [("0.5.11", [13, 14]), ("0.5.12.post1", [0, 0])])
def test_decode_buffer_dtype_and_padding_match_the_rebuild(real, release, stale_tail):
    """0.5.11 (#23552) leaves the previous batch's SWA slots in the padded tail; 0.5.12.post1 (#24743) zeroes it
    and uses int32. The rebuild's variant for each release gives the same dtype and the same tail."""
    r = require(real[release])
    dtype, tail = rebuild_tail(VARIANT_OF[release])
    assert value(r, part="buffers", metric="has_out_cache_loc_swa") is True
    assert value(r, part="buffers", metric="dtype") == dtype
    assert value(r, part="buffers", metric="padded_tail_after_padded_populate") == tail == stale_tail
    assert value(r, part="buffers", metric="real_part_after_padded_populate") == [21, 22]
