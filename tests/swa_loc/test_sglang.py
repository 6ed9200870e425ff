"""The real hybrid-SWA pool and decode buffers, against ``sglab.swa_loc.rebuild``.

Releases: 0.5.10.post1 (before #23552: no buffer field), 0.5.11 (#23552: int64 buffer, tail not
cleared), 0.5.12.post1 (#24743: int32, zeroed on padding), 0.5.13 (``set_swa_loc`` gone,
``swa_loc=`` passed to each write, the translation one gather), 0.5.23 (a ``KVWriteLoc`` carries the
location translated once).
"""

import pytest

from sglab.sglang.upstream import RELEASE_STATES, Verdict
from sglab.swa_loc import sglang

from sglab.swa_loc import claims, sglang as real_section
from sglab.swa_loc.sglang import rebuild_buffer, rebuild_translation_ops, rebuild_write
from sglab.swa_loc import rebuild as fix
from sglab.sglang import compare as report
from sglab.sglang import compare
from sglab.sglang.testing import require, value


RELEASES = real_section.PROBE_RELEASES
VARIANT_OF = real_section.BUFFER_VARIANT
REAL_CALLS = ["swa_loc"]  # the notebook's call (conftest)


@pytest.fixture(scope="module")
def real():
    return report.answers(real_section.FIX)


def rebuild_translations(preset: bool) -> int:
    return rebuild_write(preset)["translate_calls"]


def rebuild_tail(variant: str) -> tuple[str, list]:
    return rebuild_buffer(variant)


@pytest.mark.parametrize("release", ["0.5.10.post1", "0.5.11", "0.5.12.post1"])
def test_pr_era_pool_translates_per_swa_layer_unless_preset(real, release):
    r = require(real[release])
    assert value(r, part="pool", case="has_set_swa_loc", metric="value") is True
    assert value(r, part="pool", case="no_swa_loc",
                 metric="translate_calls") == rebuild_translations(False) == 2
    assert value(r, part="pool", case="set_swa_loc",
                 metric="translate_calls") == rebuild_translations(True) == 0
    for case in ("no_swa_loc", "set_swa_loc"):
        assert value(r, part="pool", case=case, metric="swa_rows_at_paired_slots") is True
        # .to(torch.int32), as rebuilt
        assert value(r, part="pool", case=case, metric="translate_dtype") == "int32"


def test_0523_never_translates_inside_the_pool(real):
    """Today's design: the write location carries the SWA slots, translated once per forward by the
    caller; a write without them is refused, so there is nothing left for ``set_swa_loc`` to
    save."""
    r = require(real["0.5.23"])
    assert value(r, part="pool", case="has_set_swa_loc", metric="value") is False
    assert value(r, part="pool", case="no_swa_loc", metric="error").startswith("AssertionError")
    assert value(r, part="pool", case="write_loc", metric="translate_calls") == 0
    assert value(r, part="pool", case="write_loc", metric="swa_rows_at_paired_slots") is True
    # no int32 cast any more
    assert value(r, part="pool", case="write_loc", metric="translate_dtype") == "int64"


def test_0510_has_no_swa_buffer_like_the_rebuild_before(real):
    r = require(real["0.5.10.post1"])
    assert value(r, part="buffers", metric="has_out_cache_loc_swa") is False
    assert fix.SWA_LOC_BUFFER_DTYPE["before"] is None


@pytest.mark.parametrize("release, stale_tail", [("0.5.11", [13, 14]), ("0.5.12.post1", [0, 0])])
def test_decode_buffer_dtype_and_padding_match_the_rebuild(real, release, stale_tail):
    """0.5.11 (#23552) leaves the previous batch's SWA slots in the padded tail; 0.5.12.post1
    (#24743) zeroes it and uses int32. The rebuild's variant for each release gives the same dtype
    and the same tail."""
    r = require(real[release])
    dtype, tail = rebuild_tail(VARIANT_OF[release])
    assert value(r, part="buffers", metric="has_out_cache_loc_swa") is True
    assert value(r, part="buffers", metric="dtype") == dtype
    assert value(r, part="buffers",
                 metric="padded_tail_after_padded_populate") == tail == stale_tail
    assert value(r, part="buffers", metric="real_part_after_padded_populate") == [21, 22]


def test_0513_takes_the_location_translated_once_per_forward(real):
    r = require(real["0.5.13"])
    assert value(r, part="pool", case="has_set_swa_loc", metric="value") is False
    assert value(r, part="pool", case="no_swa_loc", metric="error").startswith("AssertionError")
    assert value(r, part="pool", case="swa_loc_arg",
                 metric="translate_calls") == rebuild_translations(True) == 0
    assert value(r, part="pool", case="swa_loc_arg", metric="swa_rows_at_paired_slots") is True


@pytest.mark.parametrize("release", RELEASES)
def test_kernels_per_translation_are_the_claims_numbers(real, release):
    """The 2 extra kernel nodes per SWA layer of the claim hold for the PR-era releases (a gather
    and an int32 cast, as rebuilt); from 0.5.13 a translation is one gather."""
    r = require(real[release])
    ops = value(r, part="translation", case="pool", metric="ops")
    assert value(r, part="translation", case="pool", metric="mapping_dtype") == "int64"
    if release in claims.PR_ERA_RELEASES:
        assert ops == rebuild_translation_ops() == ["aten::index", "aten::_to_copy"]
        assert len(ops) == claims.EXTRA_PER_SWA_LAYER
        assert value(r, part="translation", case="pool",
                     metric="source").endswith(".to(torch.int32)")
    else:
        assert ops == ["aten::index"] and len(ops) == claims.KERNELS_PER_TRANSLATION_TODAY


def test_the_section_table_agrees_everywhere(real):
    for v in RELEASES:
        require(real[v])
    table = real_section.comparison(real)
    assert set(table.release) == set(RELEASES)
    assert report.check_table(table), table[~table.agrees].to_string()
    statement = real_section.kernels_statement(real)
    assert "0.5.10.post1, 0.5.11, 0.5.12.post1: " \
           "`return self.full_to_swa_index_mapping[kv_indices].to(torch.int32)` " \
           "-> 2 kernels" in statement
    assert "0.5.13, 0.5.23: `return self.full_to_swa_index_mapping[kv_indices]` -> 1 kernel " \
           in statement


def test_a_doctored_release_disagrees(real):
    """The check can fail: a PR-era release whose translation had one op would not match the
    rebuild."""
    r = require(real["0.5.12.post1"])
    doctored = r.rows.copy()
    mask = (doctored.part == "translation") & (doctored.metric == "ops")
    doctored.loc[mask, "value"] = doctored.loc[mask, "value"].apply(lambda ops: ops[:1])
    table = real_section.comparison({"0.5.12.post1": type(r)(**{**r.__dict__, "rows": doctored})})
    assert not table.agrees.all()


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases say
    now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(real, real_section.FIX.probe.fn) == len(RELEASES)


# -- the source check, on small synthetic SGLang trees shaped like the releases
# -------------------------------
def state(check, files: dict) -> Verdict:
    v = check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


# -- #23552 / #24743
# --------------------------------------------------------------------------------------------
POOL_PR = """
class SWAKVPool:
    def set_swa_loc(self, loc):
        self.swa_loc = loc

    def set_kv_buffer(self, layer, loc, cache_k, cache_v):
        if self.swa_loc is not None:
            loc = self.swa_loc
        else:
            loc = self.translate_loc_from_full_to_swa(loc)
        self.swa_kv_pool.set_kv_buffer(None, loc, cache_k, cache_v)
"""
POOL_LATER = """
class SWAKVPool:
    def set_kv_buffer(self, layer, loc_info, cache_k, cache_v):
        loc, swa_loc = unwrap_write_loc(loc_info)
        assert swa_loc is not None
        self.swa_kv_pool.set_kv_buffer(None, swa_loc, cache_k, cache_v)
"""


def _runner(preset: bool, follow_up: bool) -> str:
    dtype = "torch.int32" if follow_up else "torch.int64"
    zero = "\n        if self.out_cache_loc_swa is not None:\n" \
           "            self.out_cache_loc_swa.zero_()" \
        if follow_up else ""
    call = ("        if self.buffers.out_cache_loc_swa is not None:\n            "
            "self.model_runner.token_to_kv_pool"
            ".set_swa_loc(self.buffers.out_cache_loc_swa[:num_tokens])\n") if preset else ""
    return f"""
class DecodeInputBuffers:
    @classmethod
    def create(cls, max_num_token, is_hybrid_swa=False):
        out_cache_loc_swa = torch.zeros((max_num_token,), dtype={dtype}) if is_hybrid_swa else None
        return cls(out_cache_loc_swa=out_cache_loc_swa)

    def populate_from_forward_batch(self, forward_batch, raw_bs, bs):
        if bs != raw_bs:
            self.out_cache_loc.zero_(){zero}

class CudaGraphRunner:
    def capture_one_batch_size(self, bs, forward, num_tokens):
{call}        return forward()
"""


def test_swa_loc_states():
    pool, runner = sglang.SWA_POOL, sglang.DECODE_RUNNER
    assert state(sglang.check, {}).status == "absent"
    v = state(sglang.check, {pool: POOL_PR, runner: _runner(False, False)})
    assert v.status == "before" and "captured into the decode graph" in v.detail
    v = state(sglang.check, {pool: POOL_PR, runner: _runner(True, False)})
    assert v.status == "pr-era" and "#24743 not yet" in v.detail and "torch.int64" in v.detail
    v = state(sglang.check, {pool: POOL_PR, runner: _runner(True, True)})
    assert v.status == "pr-era" and "padded tail zeroed, torch.int32" in v.detail
    assert state(sglang.check, {pool: POOL_LATER}).status == "changed"
    assert state(sglang.check, {pool: POOL_PR}).status == "unknown"  # no decode runner to read
    assert state(sglang.check, {pool: "class SWAKVPool:\n    pass\n"}).status == "unknown"


def test_swa_padding_zeroed_marks_the_follow_up():
    assert sglang.swa_padding_zeroed({sglang.DECODE_RUNNER: _runner(True, True)}.get)
    assert not sglang.swa_padding_zeroed({sglang.DECODE_RUNNER: _runner(True, False)}.get)
    assert not sglang.swa_padding_zeroed({}.get)
