"""Capture sizes the real runners keep, against ``sglab.fixes.capture_sizes``.

0.5.10.post1: no piecewise filter. 0.5.11: #23972's filter (multiples of ``mul_base``). 0.5.14: the filter lost
in the runner refactor. 0.5.23: sizes rounded up to the alignment. Decode: the older filter in every release.
"""

import pytest

from sglab.fixes import capture_sizes as fix
from sglab.real.probes.capture_sizes import MAX_RUNNING_REQUESTS, SETTINGS
from sglab.real.testing import probe_all, require, value

RELEASES = ("0.5.10.post1", "0.5.11", "0.5.14", "0.5.23")
PIECEWISE = fix.default_piecewise_capture_sizes(2048)
DECODE = [1, 2, 4, 8, 12] + list(range(16, 257, 8))   # ServerArgs' decode list for --cuda-graph-max-bs 256
UNALIGNED = {"tp8_dense_tp1_unaligned": dict(tp_size=8, moe_dense_tp_size=1, piecewise=[4, 12, 20])}
PARAMS = {"piecewise": PIECEWISE, "decode": DECODE, "max_tokens": 2048, "settings": {**SETTINGS, **UNALIGNED}}


ARGS = {"tp8_dense_tp1": ["--model-path", "m", "--tp-size", "8", "--moe-dense-tp-size", "1"],
        "unaligned": ["--model-path", "m", "--tp-size", "8", "--moe-dense-tp-size", "1",
                      "--piecewise-cuda-graph-tokens", "4", "12", "20"],
        "misspelt": ["--model-path", "m", "--tp-sise", "8"]}


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, "capture_sizes:run_with_args", {**PARAMS, "server_args": ARGS})


def widths(setting: dict) -> tuple[int, int, bool, bool]:
    """(attention TP, attention CP, gathered, two-batch overlap) by the rebuild."""
    a = fix.ParallelArgs(**{k: v for k, v in setting.items() if k != "piecewise"})
    return fix.attention_tp_size(a), a.attn_cp_size, fix.require_gathered_buffer(a), a.enable_two_batch_overlap


def expected_piecewise(release: str, setting: dict) -> list[int]:
    tp, cp, gathered, tbo = widths(setting)
    sizes = setting.get("piecewise", PIECEWISE)
    if release == "0.5.11":
        return fix.filter_piecewise_capture_sizes(sizes, tp, cp, gathered=gathered)
    if release == "0.5.23":
        # today's prefill alignment is the decode one (two-batch overlap included), rounded up, not dropped
        return fix.round_up_capture_sizes(sizes, fix.decode_mul_base(tp, cp, gathered=gathered,
                                                                      two_batch_overlap=tbo))
    return list(sizes)


def expected_decode(setting: dict) -> list[int]:
    tp, cp, gathered, tbo = widths(setting)
    return fix.filter_decode_batch_sizes(DECODE, tp, cp, gathered=gathered, two_batch_overlap=tbo,
                                         num_max_requests=MAX_RUNNING_REQUESTS)


@pytest.mark.parametrize("release", RELEASES)
def test_generated_default_list_is_the_rebuilt_one(real, release):
    assert value(require(real[release]), setting="defaults", metric="generated_piecewise") == PIECEWISE


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_piecewise_and_decode_sizes_match_the_rebuild(real, release, name):
    r = require(real[release])
    assert value(r, setting=name, metric="piecewise") == expected_piecewise(release, SETTINGS[name])
    assert value(r, setting=name, metric="decode") == expected_decode(SETTINGS[name])


def test_the_filter_drops_exactly_the_sizes_that_break_at_tp8(real):
    r = require(real["0.5.11"])
    kept = value(r, setting="tp8_dense_tp1", metric="piecewise")
    assert sorted(set(PIECEWISE) - set(kept)) == [4, 12, 20, 28]
    for release in ("0.5.10.post1", "0.5.14"):
        assert value(require(real[release]), setting="tp8_dense_tp1", metric="piecewise") == PIECEWISE


def test_nothing_left_raises_the_prs_assertion(real):
    err = value(require(real["0.5.11"]), setting="tp8_dense_tp1_unaligned", metric="error")
    with pytest.raises(fix.NoCaptureSizes) as rebuilt:
        fix.filter_piecewise_capture_sizes([4, 12, 20], 8)
    assert err == f"AssertionError: {rebuilt.value}"
    assert value(require(real["0.5.23"]), setting="tp8_dense_tp1_unaligned", metric="piecewise") == [8, 16, 24]


def test_two_batch_overlap_aligns_prefill_only_from_0523(real):
    """The PR's piecewise ``mul_base`` ignores two-batch overlap (the decode one doubles); 0.5.23 uses one
    alignment for both."""
    assert value(require(real["0.5.11"]), setting="tp8_tbo_dense_tp1", metric="piecewise")[0] == 8
    assert value(require(real["0.5.23"]), setting="tp8_tbo_dense_tp1", metric="piecewise")[0] == 16


def test_server_args_are_parsed_by_the_release_and_filtered_by_its_runner(real):
    r = require(real["0.5.11"])

    def got(metric):
        return value(r, setting="args:tp8_dense_tp1", metric=metric)

    configured = got("configured_piecewise")
    assert configured == fix.default_piecewise_capture_sizes(2048)      # MLA default maximum, assumed
    assert got("tp_size") == 8
    assert got("piecewise") == fix.filter_piecewise_capture_sizes(configured, 8)
    assert got("decode") == fix.filter_decode_batch_sizes(got("configured_decode"), 8,
                                                         num_max_requests=got("assumed_max_running_requests"))
    before = require(real["0.5.10.post1"])
    assert value(before, setting="args:tp8_dense_tp1", metric="piecewise") == configured


def test_server_args_errors_are_sglangs_own_one_line(real):
    r = require(real["0.5.11"])
    assert value(r, setting="args:unaligned", metric="error") == \
        "AssertionError: No piecewise CUDA graph capture sizes are multiples of 8"
    assert value(r, setting="args:misspelt", metric="error") == \
        "sglang.launch_server: error: unrecognized arguments: --tp-sise 8"
    assert value(require(real["0.5.10.post1"]), setting="args:unaligned", metric="piecewise") == [4, 12, 20]


def test_server_args_of_later_releases_say_they_are_not_reached(real):
    assert value(require(real["0.5.23"]), setting="args:tp8_dense_tp1", metric="unsupported").startswith(
        "sglang 0.5.23 decides capture sizes while resolving its configuration")
