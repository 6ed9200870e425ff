"""`sglab capture-sizes`: real releases parse the server arguments; the tables are compared with lists worked out
by hand below (from ServerArgs' defaults and the runners' rules, quoted in each comment).

Defaults on the assumed machine (141 GB per GPU, an MLA model), from server_args.py of 0.5.10.post1 to 0.5.13:
- piecewise list (``_generate_piecewise_cuda_graph_tokens``, max 2048 for MLA): 4..32 step 4, 48..256 step 16,
  288..512 step 32, 576..1024 step 64, 1280..2048 step 256 -> 8 + 14 + 8 + 8 + 4 = 42 sizes;
- ``cuda_graph_max_bs``: 512 at tp >= 4, 256 below (the 90-160 GB branch of ``_handle_gpu_memory_settings``);
- decode list (``_generate_cuda_graph_batch_sizes``): 1, 2, 4, 8, 12, then 16..256 step 8, then 272..max step 16.
"""

import os

import pytest

from sglab.tools import cli
from sglab.investigate import capture_sizes as cs
from sglab.sglang import installed_releases

RELEASES = ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.23")
FILTERED = ("0.5.11", "0.5.12.post1", "0.5.13")   # #23972's filter is in these runners

# 42 sizes, derived in the module doc
PIECEWISE = [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288,
             320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536, 1792, 2048]
# the sizes of PIECEWISE that are 4 mod 8 (every size from 48 on is a multiple of 16)
ODD_FOURS = [4, 12, 20, 28]
# PIECEWISE without ODD_FOURS: 42 - 4 = 38 sizes, all multiples of 8
PIECEWISE_X8 = [8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384,
                416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536, 1792, 2048]
# PIECEWISE rounded up to multiples of 16: 4, 8, 12, 16 -> 16; 20, 24, 28, 32 -> 32; the rest stay: 2 + 34 = 36
PIECEWISE_UP16 = [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416,
                  448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536, 1792, 2048]
# the decode list at cuda_graph_max_bs 512: 5 + 31 + 16 = 52 sizes
DECODE_512 = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168,
              176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 272, 288, 304, 320, 336, 352, 368, 384, 400,
              416, 432, 448, 464, 480, 496, 512]
# at cuda_graph_max_bs 256 (tp < 4): 5 + 31 = 36 sizes
DECODE_256 = DECODE_512[:36]
# DECODE_512 keeping multiples of 8: drop 1, 2, 4, 12 -> 48 sizes
DECODE_512_X8 = [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168, 176, 184,
                 192, 200, 208, 216, 224, 232, 240, 248, 256, 272, 288, 304, 320, 336, 352, 368, 384, 400, 416, 432,
                 448, 464, 480, 496, 512]
# DECODE_512 keeping multiples of 16 (two-batch overlap doubles 8): 16..256 step 16 (16) + 272..512 (16) = 32
DECODE_512_X16 = [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 272, 288, 304, 320, 336,
                  352, 368, 384, 400, 416, 432, 448, 464, 480, 496, 512]
# DECODE_512 keeping multiples of 4: drop 1, 2 -> 50 sizes
DECODE_512_X4 = DECODE_512[2:]
# DECODE_512 keeping multiples of 2: drop 1 -> 51 sizes
DECODE_512_X2 = DECODE_512[1:]
# DECODE_256 keeping multiples of 4: drop 1, 2 -> 34 sizes
DECODE_256_X4 = [4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168,
                 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256]

CASES = {
    # the crash report: attention TP 8 (no DP attention, CP 1), dense MLP at TP 1 -> tokens scattered over 8 ranks
    "tp8_dense1": "--tp 8 --moe-dense-tp-size 1",
    # attention TP 4 / 2 = 2; DP attention gathers the MLP input; DP attention turns the piecewise runner off
    "tp4_dp2": "--tp 4 --enable-dp-attention --dp 2",
    # attention TP 8 / 2 = 4, CP 2; context parallelism turns the piecewise runner off ...
    "tp8_cp2_dense1": "--tp 8 --attn-cp-size 2 --moe-dense-tp-size 1",
    # ... unless enforced; mul_base = 4 (4 % 2 == 0), every default size is a multiple of 4
    "tp8_cp2_dense1_enforced": "--tp 8 --attn-cp-size 2 --moe-dense-tp-size 1 --enforce-piecewise-cuda-graph",
    # attention TP 2, cuda_graph_max_bs 256; two-batch overlap doubles the decode base (and the round-up's) to 4
    "tp2_dense1_tbo": "--tp 2 --moe-dense-tp-size 1 --enable-two-batch-overlap",
    # as the crash report, with two-batch overlap: decode and round-up align to 16, the PR's filter to 8
    "tp8_dense1_tbo": "--tp 8 --moe-dense-tp-size 1 --enable-two-batch-overlap",
    # plain TP 2: nothing is scattered (all-reduce), so nothing is filtered or refused
    "tp2": "--tp 2",
    # bad input: a misspelt flag, and two contradictions SGLang's handlers assert on
    "misspelt": "--tpp 8",
    "cp_not_dividing": "--tp 8 --attn-cp-size 3",
    "lm_head_without_dp_attention": "--dp 2 --enable-dp-lm-head",
}

# (case, release group) -> piecewise captured (None: off), refused, decode captured
EXPECTED = {
    ("tp8_dense1", "0.5.10.post1"): (PIECEWISE, ODD_FOURS, DECODE_512_X8),
    ("tp8_dense1", "filtered"): (PIECEWISE_X8, [], DECODE_512_X8),
    ("tp4_dp2", "all"): (None, [], DECODE_512_X2),
    ("tp8_cp2_dense1", "all"): (None, [], DECODE_512_X4),
    ("tp8_cp2_dense1_enforced", "all"): (PIECEWISE, [], DECODE_512_X4),
    ("tp2_dense1_tbo", "all"): (PIECEWISE, [], DECODE_256_X4),
    ("tp8_dense1_tbo", "0.5.10.post1"): (PIECEWISE, ODD_FOURS, DECODE_512_X16),
    ("tp8_dense1_tbo", "filtered"): (PIECEWISE_X8, [], DECODE_512_X16),
    ("tp2", "all"): (PIECEWISE, [], DECODE_256),
}
ERRORS = {
    "misspelt": "sglang.launch_server: error: unrecognized arguments: --tpp 8",
    "cp_not_dividing": "AssertionError: tp_size must be divisible by attn_cp_size",
    "lm_head_without_dp_attention": "AssertionError: Please enable dp attention when setting enable_dp_lm_head.",
}

# the calls of the module fixture and of the command's tests, answered with the session's (conftest)
REAL_CALLS = [cs.probe_call({k: v.split() for k, v in CASES.items()}, RELEASES),
              cs.probe_call({"args": CASES["tp8_dense1"].split()}, ("0.5.10.post1", "0.5.11")),
              *(cs.probe_call({"args": CASES[case].split()}, ("0.5.11",))
                for case in ("misspelt", "cp_not_dividing"))]


def _need(releases):
    missing = [v for v in releases if v not in installed_releases()]
    if missing:
        msg = f"SGLang releases not installed: {', '.join(missing)} (run `sglab real install`)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)


@pytest.fixture(scope="module")
def rows():
    _need(RELEASES)
    return cs.ask({k: v.split() for k, v in CASES.items()}, RELEASES)


def _expected(case: str, release: str):
    for group in (release, "filtered" if release in FILTERED else None, "all"):
        if (case, group) in EXPECTED:
            return EXPECTED[(case, group)]
    raise KeyError((case, release))


@pytest.mark.parametrize("case", sorted({c for c, _ in EXPECTED}))
def test_captured_sizes_match_the_hand_tables(rows, case):
    t = cs.sizes_table(rows, case)
    for release in RELEASES[:-1]:
        piecewise, refused, decode = _expected(case, release)
        pw = t[(t.release == release) & (t.list == "piecewise")].iloc[0]
        dec = t[(t.release == release) & (t.list == "decode")].iloc[0]
        if piecewise is None:
            assert pw.status == "off" and pw.captured == [] and "_handle_piecewise_cuda_graph" in pw.note, release
        else:
            assert pw.status == "captured" and pw.captured == piecewise, release
            assert pw.configured == PIECEWISE, release
        assert pw.refused == refused, release
        assert dec.status == "captured" and dec.captured == decode and dec.refused == [], release


def test_releases_without_the_pr_era_runner_say_why(rows):
    t = cs.sizes_table(rows, "tp8_dense1")
    row = t[t.release == "0.5.23"].iloc[0]
    assert row.status == "unsupported" and "needs the model's config" in row.note


def test_piecewise_off_names_the_releases_own_rule(rows):
    assert "DP attention" in cs.sizes_table(rows, "tp4_dp2").note.iloc[0]
    assert "Context parallel" in cs.sizes_table(rows, "tp8_cp2_dense1").note.iloc[0]


def test_rebuild_columns(rows):
    t = cs.sizes_table(rows, "tp8_dense1").set_index(["release", "list"])
    pw = t.loc[("0.5.10.post1", "piecewise")]
    # PR filter: multiples of 8 -> PIECEWISE_X8; round-up to 8 moves 4->8, 12->16, 20->24, 28->32, all merge
    assert (pw.filter_base, pw.filter_keeps) == (8, PIECEWISE_X8)
    assert (pw.round_up_alignment, pw.round_up) == (8, PIECEWISE_X8)
    # the decode rule of the rebuild gives what the release captured
    assert t.loc[("0.5.11", "decode")].filter_keeps == DECODE_512_X8
    tbo = cs.sizes_table(rows, "tp8_dense1_tbo").set_index(["release", "list"]).loc[("0.5.11", "piecewise")]
    assert (tbo.filter_base, tbo.filter_keeps) == (8, PIECEWISE_X8)
    assert (tbo.round_up_alignment, tbo.round_up) == (16, PIECEWISE_UP16)
    plain = cs.sizes_table(rows, "tp2").set_index(["release", "list"]).loc[("0.5.11", "piecewise")]
    assert not plain.gathered and (plain.filter_base, plain.filter_keeps, plain.round_up) == (1, PIECEWISE, PIECEWISE)


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_arguments_get_sglangs_message(rows, case):
    t = cs.sizes_table(rows, case)
    parsed = t[t.release != "0.5.23"]
    assert (parsed.status == "error").all() and set(parsed.note) == {ERRORS[case]}


# ---------------------------------------------------------------------------------------------------- the command
def _cli(capsys, *argv):
    code = cli.main(["capture-sizes", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_command_prints_the_table(capsys, tmp_path):
    _need(("0.5.10.post1", "0.5.11"))
    csv = tmp_path / "t.csv"
    code, out, _ = _cli(capsys, "--release", "0.5.10.post1", "0.5.11", "--csv", str(csv), "--",
                        *CASES["tp8_dense1"].split())
    assert code == 0
    lines = out.splitlines()
    row = next(ln for ln in lines if ln.startswith("0.5.10.post1  piecewise"))
    assert "42: 4–2048" in row and "refused 4: 4, 12, 20, 28;" in row and "keeps 38 of 42 (multiples of 8)" in row
    row = next(ln for ln in lines if ln.startswith("0.5.11        piecewise"))
    assert "38: 8–2048" in row and "refused none;" in row
    assert lines[lines.index("piecewise, sglang 0.5.11 (38 sizes):") + 1].split()[:5] == ["8", "16", "24", "32", "48"]
    import pandas as pd

    table = pd.read_csv(csv)
    assert table.loc[0, "refused"] == "4 12 20 28" and len(table) == 4


@pytest.mark.parametrize("case", ["misspelt", "cp_not_dividing"])
def test_command_bad_arguments_one_line(capsys, case):
    _need(("0.5.11",))
    code, out, err = _cli(capsys, "--release", "0.5.11", "--", *CASES[case].split())
    assert code == 2 and out == ""
    assert err.splitlines() == [f"sglab capture-sizes: {ERRORS[case]} (sglang 0.5.11)"]


def test_command_missing_release_and_no_arguments(capsys):
    code, out, err = _cli(capsys, "--release", "0.5.99", "--", "--tp", "8")
    assert code == 2 and len(err.splitlines()) == 1 and "sglang 0.5.99 is not installed" in err
    code, out, err = _cli(capsys, "--release", "five", "--", "--tp", "8")
    assert code == 2 and len(err.splitlines()) == 1 and "not a release version: 'five'" in err
    code, out, err = _cli(capsys, "--")
    assert code == 2 and len(err.splitlines()) == 1 and "give SGLang server arguments after --" in err


# ------------------------------------------------------------------------------------------- the notebook's rules
def test_rule_table_tp8_dense_tp1():
    t = cs.rule_table(8, 1, True, False).set_index("rule")
    assert t.loc["before #23972", "captures"] == 42 and t.loc["before #23972", "refused"] == "4: 4, 12, 20, 28"
    assert t.loc["no alignment", "refused"] == "4: 4, 12, 20, 28"
    # the filter and the round-up to 8 both give PIECEWISE_X8 (38): every moved size lands on a kept one
    for rule in ("#23972 filter", "round-up"):
        assert (t.loc[rule, "multiple of"], t.loc[rule, "captures"], t.loc[rule, "refused"]) == (8, 38, "none")
    # with two-batch overlap the round-up aligns to 16: PIECEWISE_UP16 (36); the PR's filter stays at 8
    tbo = cs.rule_table(8, 1, True, True).set_index("rule")
    assert (tbo.loc["round-up", "multiple of"], tbo.loc["round-up", "captures"]) == (16, 36)
    assert (tbo.loc["#23972 filter", "multiple of"], tbo.loc["#23972 filter", "captures"]) == (8, 38)


def test_rule_table_non_power_of_two_and_no_scatter():
    t = cs.rule_table(3, 1, True, False).set_index("rule")
    # multiples of 3 in PIECEWISE: 12, 24, 48, 96, 144, 192, 240, 288, 384, 480, 576, 768, 960, 1536 -> 14;
    # the other 28 sizes are refused before the PR
    assert t.loc["#23972 filter", "captures"] == 14
    assert t.loc["#23972 filter", "smallest sizes"].startswith("12, 24, 48")
    assert t.loc["before #23972", "refused"].startswith("28: 4, 8, 16, 20, 28")
    # rounding up to 3 keeps one bucket per size (4->6, 8->9, 16->18, ...): 42, none merge
    assert t.loc["round-up", "captures"] == 42
    plain = cs.rule_table(2, 1, False, False)
    assert set(plain.refused) == {"none"} and set(plain.captures) == {42}
    assert "nothing to refuse" in plain.attrs["setting"]
