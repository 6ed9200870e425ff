"""Capture sizes the real runners keep, against ``sglab.capture_sizes.rebuild``; the source check on
small synthetic SGLang trees.

0.5.10.post1: no piecewise filter. 0.5.11: #23972's filter (multiples of ``mul_base``). 0.5.14: the
filter lost in the runner refactor. 0.5.23: sizes rounded up to the alignment. Decode: the older
filter in every release.
"""

import pytest

from sglab.capture_sizes import rebuild as fix
from sglab.capture_sizes import sglang
from sglab.sglang import compare as report
from sglab.sglang.upstream import RELEASE_STATES, Verdict
from tests import sglang_answers as answers
from tests.sglang_answers import probe_all, require, value


RELEASES = sglang.PROBE_RELEASES
SETTINGS = sglang.SETTINGS
PIECEWISE = fix.default_piecewise_capture_sizes(2048)
PARAMS = sglang.params()
ARGS = {
    "tp8_dense_tp1": ["--model-path", "m", "--tp-size", "8", "--moe-dense-tp-size", "1"],
    "unaligned": [
        "--model-path", "m", "--tp-size", "8", "--moe-dense-tp-size", "1",
        "--piecewise-cuda-graph-tokens", "4", "12", "20"
    ], "misspelt": ["--model-path", "m", "--tp-sise", "8"]
}
# the notebook's call, and the same probe with server-argument cases (one process per release)
REAL_CALLS = ["capture_sizes", (sglang.FIX.probe.fn, {**PARAMS, "cases": ARGS}, RELEASES)]


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, sglang.FIX.probe.fn, {**PARAMS, "cases": ARGS})


@pytest.mark.parametrize("release", RELEASES)
def test_generated_default_list_is_the_rebuilt_one(real, release):
    assert value(require(real[release]), setting="defaults",
                 metric="generated_piecewise") == PIECEWISE


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_piecewise_and_decode_sizes_match_the_rebuild(real, release, name):
    r = require(real[release])
    want = sglang.rebuild_piecewise(sglang.VARIANT[release], SETTINGS[name], PIECEWISE)
    if isinstance(want, str):
        assert value(r, setting=name, metric="error") == want
        return
    assert value(r, setting=name, metric="piecewise") == want
    assert value(r, setting=name, metric="decode") == sglang.rebuild_decode(SETTINGS[name])


def test_the_filter_drops_exactly_the_sizes_that_break_at_tp8(real):
    kept = value(require(real["0.5.11"]), setting="tp8_dense_tp1", metric="piecewise")
    assert sorted(set(PIECEWISE) - set(kept)) == [4, 12, 20, 28]
    for release in ("0.5.10.post1", "0.5.14"):
        assert value(require(real[release]), setting="tp8_dense_tp1",
                     metric="piecewise") == PIECEWISE


def test_nothing_left_raises_the_prs_assertion(real):
    err = value(require(real["0.5.11"]), setting="tp8_dense_tp1_unaligned", metric="error")
    with pytest.raises(fix.NoCaptureSizes) as rebuilt:
        fix.filter_piecewise_capture_sizes([4, 12, 20], 8)
    assert err == f"AssertionError: {rebuilt.value}"
    assert value(require(real["0.5.23"]), setting="tp8_dense_tp1_unaligned",
                 metric="piecewise") == [8, 16, 24]


def test_two_batch_overlap_aligns_prefill_only_from_0523(real):
    """The PR's piecewise ``mul_base`` ignores two-batch overlap (the decode one doubles); 0.5.23
    uses one alignment for both."""
    assert value(require(real["0.5.11"]), setting="tp8_tbo_dense_tp1", metric="piecewise")[0] == 8
    assert value(require(real["0.5.23"]), setting="tp8_tbo_dense_tp1", metric="piecewise")[0] == 16


def test_todays_round_up_is_the_decode_alignment(real):
    """0.5.23 rounds to the decode runner's alignment: x2 under two-batch overlap; rounding to the
    PR's mul_base alone would give 8, 16, ... at tp 8 with TBO."""
    got = value(require(real["0.5.23"]), setting="tp8_tbo_dense_tp1", metric="piecewise")
    assert got == fix.today_capture_sizes(PIECEWISE, 8, two_batch_overlap=True) == \
        fix.policy_lists(PIECEWISE, 8, 1, True)["round_up"]
    assert got != fix.round_up_capture_sizes(PIECEWISE, fix.piecewise_mul_base(8))
    assert fix.decode_mul_base(8, two_batch_overlap=True) == 16 and fix.decode_mul_base(4, 3) == 12
    assert fix.today_capture_sizes([4, 12], 8, gathered=False) == [4, 12]


def test_server_args_are_parsed_by_the_release_and_kept_by_its_runner(real):
    r = require(real["0.5.11"])

    def got(metric):
        return value(r, case="tp8_dense_tp1", metric=metric)

    assert got("configured_piecewise") == PIECEWISE  # MLA default maximum, assumed
    assert got("tp_size") == 8 and got("attn_tp_size") == 8 and got("gathered_buffer") is True
    assert got("piecewise") == fix.filter_piecewise_capture_sizes(PIECEWISE, 8)
    assert got("decode") == fix.filter_decode_batch_sizes(got("configured_decode"), 8,
                                                          num_max_requests=got("pool_size"))
    assert value(require(real["0.5.10.post1"]), case="tp8_dense_tp1",
                 metric="piecewise") == PIECEWISE
    # 0.5.14 resolves its configuration on the model config and keeps every size (the filter lost)
    assert value(require(real["0.5.14"]), case="tp8_dense_tp1", metric="piecewise") == PIECEWISE


def test_server_args_errors_are_sglangs_own_one_line(real):
    r = require(real["0.5.11"])
    assert value(r, case="unaligned", metric="error") == \
        "AssertionError: No piecewise CUDA graph capture sizes are multiples of 8"
    assert value(r, case="misspelt", metric="error") == \
        "sglang.launch_server: error: unrecognized arguments: --tp-sise 8"
    assert value(require(real["0.5.10.post1"]), case="unaligned", metric="piecewise") == [4, 12, 20]


def test_the_section_table_agrees_everywhere(real):
    for v in RELEASES:
        require(real[v])
    table = sglang.comparison(real)
    assert len(table) == len(RELEASES) * len(SETTINGS)
    assert report.check_table(table), table[~table.agrees].to_string()
    assert "DIFFERENT" not in sglang.defaults_line(real)


def test_the_section_shows_one_column_per_release_and_the_agreement(capsys, monkeypatch):
    """The notebook's section: one row per setting, one column per release named with the rule it
    must match, then the agreement line and the default lists (the recorded answers)."""
    import pandas as pd

    from sglab.core import notebook

    shown = []
    monkeypatch.setattr(notebook, "show_table", shown.append)
    sglang.compare()
    out = capsys.readouterr().out
    if "agree on all" not in out:
        pytest.skip("no recorded or installed release answered")
    (wide,) = shown
    assert isinstance(wide, pd.DataFrame)
    assert list(wide.columns) == [f"{v} ({sglang.VARIANT[v]})" for v in RELEASES]
    assert [b.split(" (")[0] for b in wide.index] == list(SETTINGS)
    assert wide.loc["tp8_dense_tp1 (attention TP/CP 8/1)", "0.5.11 (pr_filter)"] == \
        "38 sizes, drops [4, 12, 20, 28]"
    assert f"agree on all {len(RELEASES) * len(SETTINGS)} (release, setting) rows" in out


def test_the_code_path_names_symbols_the_release_has():
    from sglab.sglang import codepath

    answers.package(sglang.CODE_PATH_RELEASE)
    lines = [codepath.line_of(sglang.CODE_PATH_RELEASE, n) for n in sglang.CODE_PATH]
    assert all(lines), dict(zip((n.symbol for n in sglang.CODE_PATH), lines))
    assert sglang.check(lambda rel: (answers.package(sglang.CODE_PATH_RELEASE) / rel).read_text()
                        if rel == sglang.PIECEWISE_RUNNER else None).status == "pr-era"


def test_a_wrong_rule_would_be_caught(real, monkeypatch):
    """The check can fail: comparing 0.5.23 with the PR's filter disagrees where they differ."""
    r = require(real["0.5.23"])
    monkeypatch.setitem(sglang.VARIANT, "0.5.23", "pr_filter")
    assert not sglang.comparison({"0.5.23": r}).agrees.all()


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/ (the probe without the cases,
    which this module's live run adds): it must say what the releases say now."""
    from tests.sglang_answers import assert_recording_matches

    def notebook_rows(rows):
        return rows[rows.setting.notna()].dropna(axis=1, how="all")

    assert assert_recording_matches(real, sglang.FIX.probe.fn, PARAMS,
                                    keep=notebook_rows) == len(RELEASES)


# -- the source check, on small synthetic SGLang trees shaped like the releases
# --------------------------------------------------------------------------------------------------
def state(files: dict) -> Verdict:
    v = sglang.check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


PCG_BEFORE = """
class PiecewiseCudaGraphRunner:
    def __init__(self, model_runner):
        self.capture_num_tokens = self.compile_config.get_capture_sizes()
"""
PCG_PR = PCG_BEFORE + """        if require_gathered_buffer(model_runner.server_args):
            mul_base = self.attn_tp_size
            filtered = [n for n in self.capture_num_tokens if n % mul_base == 0]
            assert filtered, f"No piecewise CUDA graph capture sizes are multiples of {mul_base}"
            self.capture_num_tokens = filtered
"""
PREFILL = """
def get_prefill_num_tokens_to_capture(capture_tokens):
    return sorted({get_cuda_graph_max_batch_size(n) for n in capture_tokens})

class PrefillCudaGraphRunner:
    def __init__(self, model_runner):
        capture_tokens = model_runner.server_args.cuda_graph_config.prefill.bs
        self.capture_num_tokens = CAPTURE
"""
ROUND_UP = ("def get_cuda_graph_max_batch_size(n):\n"
            "    return ceil_align(n, get_cuda_graph_batch_size_alignment())\n")
ROUNDED = "get_prefill_num_tokens_to_capture(capture_tokens)"


@pytest.mark.parametrize("files,status,words", [
    ({}, "absent", "no piecewise or prefill"),
    ({sglang.PIECEWISE_RUNNER: PCG_BEFORE}, "before", "every configured size"),
    ({sglang.PIECEWISE_RUNNER: PCG_PR}, "pr-era", "divisible by mul_base"),
    ({sglang.PREFILL_RUNNER: PREFILL.replace("CAPTURE", "sorted(capture_tokens)")
      }, "regressed", "sorted(capture_tokens) with no TP/CP alignment"),
    ({sglang.PREFILL_RUNNER: PREFILL.replace("CAPTURE", ROUNDED), "srt/utils/common.py": ROUND_UP
      }, "changed", "get_cuda_graph_max_batch_size → ceil_align"),
    ({
        sglang.PREFILL_RUNNER: PREFILL.replace("CAPTURE",
                                               "[n for n in capture_tokens if n % mul_base == 0]")
    }, "changed", "filters"),
    ({sglang.PREFILL_RUNNER: PREFILL.replace("self.capture_num_tokens = CAPTURE", "pass")
      }, "unknown", "does not set"),
    ({sglang.PIECEWISE_RUNNER: "class Other:\n    pass\n"
      }, "unknown", "no PiecewiseCudaGraphRunner.__init__")
])
def test_capture_sizes_states(files, status, words):
    v = state(files)
    assert v.status == status and words in v.detail, v


def test_round_up_helper_without_ceil_align_is_not_a_round_up():
    files = {
        sglang.PREFILL_RUNNER: PREFILL.replace("CAPTURE", ROUNDED),
        "srt/utils/common.py": "def get_cuda_graph_max_batch_size(n):\n    return n\n"
    }
    assert state(files).status == "regressed"


def test_the_check_reads_a_folder_on_disk(tmp_path):
    """The layout of SGLang 0.5.14+: one prefill runner; 0.5.22+ rounds each size up."""
    from sglab.sglang import upstream

    for rel, text in {
            sglang.PREFILL_RUNNER: PREFILL.replace("CAPTURE", ROUNDED),
            "srt/utils/common.py": ROUND_UP
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert upstream.check(sglang.FIX, root=tmp_path).status == "changed"
    (tmp_path / "srt/utils/common.py").write_text("def get_cuda_graph_max_batch_size(n):\n"
                                                  "    return n\n")
    assert upstream.check(sglang.FIX, root=tmp_path).status == "regressed"
