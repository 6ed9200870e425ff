"""Capture sizes the real runners keep, against ``sglab.fixes.capture_sizes``.

0.5.10.post1: no piecewise filter. 0.5.11: #23972's filter (multiples of ``mul_base``). 0.5.14: the filter lost
in the runner refactor. 0.5.23: sizes rounded up to the alignment. Decode: the older filter in every release.
"""

import pytest

from sglab.experiments.capture_sizes import real as real_section
from sglab.experiments.capture_sizes.analysis import policy_lists
from sglab.fixes import capture_sizes as fix
from sglab.sglang import compare_old as report
from sglab.sglang.probes.capture_sizes import SETTINGS
from sglab.sglang.testing import probe_all, require, value

RELEASES = real_section.RELEASES
PIECEWISE = fix.default_piecewise_capture_sizes(2048)
PARAMS = real_section.params(2048)


ARGS = {"tp8_dense_tp1": ["--model-path", "m", "--tp-size", "8", "--moe-dense-tp-size", "1"],
        "unaligned": ["--model-path", "m", "--tp-size", "8", "--moe-dense-tp-size", "1",
                      "--piecewise-cuda-graph-tokens", "4", "12", "20"],
        "misspelt": ["--model-path", "m", "--tp-sise", "8"]}
REAL_CALLS = [("capture_sizes:run_with_args", {**PARAMS, "server_args": ARGS}, RELEASES)]


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, "capture_sizes:run_with_args", {**PARAMS, "server_args": ARGS})


widths = real_section.widths


def expected_piecewise(release: str, setting: dict) -> list[int]:
    return real_section.rebuild_piecewise(real_section.VARIANT[release], setting, PIECEWISE)


def expected_decode(setting: dict) -> list[int]:
    return real_section.rebuild_decode(setting)


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


def test_the_section_table_agrees_everywhere(real):
    for v in RELEASES:
        require(real[v])
    table = real_section.comparison(real)
    assert len(table) == len(RELEASES) * len(real_section.settings())
    assert report.check_table(table), table[~table.agrees].to_string()
    assert "DIFFERS" not in real_section.round_up_note(real)


def test_todays_round_up_is_the_decode_alignment_and_the_notebook_uses_it(real):
    """0.5.23 rounds to the decode runner's alignment: x2 under two-batch overlap. The notebook's round_up policy
    follows it (rounding to the PR's mul_base alone would give 8, 16, ... at tp 8 with TBO)."""
    got = value(require(real["0.5.23"]), setting="tp8_tbo_dense_tp1", metric="piecewise")
    assert got == fix.today_capture_sizes(PIECEWISE, 8, two_batch_overlap=True) == policy_lists(PIECEWISE, 8, 1,
                                                                                                  True)["round_up"]
    assert got != fix.round_up_capture_sizes(PIECEWISE, fix.piecewise_mul_base(8))
    assert fix.today_alignment(8, two_batch_overlap=True) == 16 and fix.today_alignment(4, 3) == 12
    assert fix.today_alignment(8, gathered=False) == 1


def test_a_wrong_rule_would_be_caught(real):
    """The check can fail: comparing 0.5.23 with the PR's filter disagrees in the settings where they differ."""
    r = require(real["0.5.23"])
    saved = dict(real_section.VARIANT)
    try:
        real_section.VARIANT["0.5.23"] = "pr_filter"
        table = real_section.comparison({"0.5.23": r})
    finally:
        real_section.VARIANT.clear()
        real_section.VARIANT.update(saved)
    assert not table.agrees.all()


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/ (the probe without the server-argument cases,
    which this module's live run adds as ``args:`` settings): it must say what the releases say now."""
    from sglab.sglang.testing import assert_recording_matches

    def notebook_rows(rows):
        return rows[~rows.setting.str.startswith("args:")]

    assert assert_recording_matches(real, "capture_sizes:run", PARAMS, keep=notebook_rows) == len(RELEASES)
