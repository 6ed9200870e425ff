"""`sglab capture-sizes`: real releases parse the server arguments and resolve their own
configuration; the tables are compared with lists worked out by hand below (from ServerArgs'
defaults and the runners' rules, quoted in each comment). Then the notebook's control.

On the assumed machine (141 GB per GPU, a CUDA host):
- 0.5.10.post1 to 0.5.13 (an MLA model assumed): piecewise list ``_generate_piecewise_cuda_graph_
  tokens`` up to 2048 (the MLA maximum): 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024
  step 64, 1280..2048 step 256 -> 8 + 14 + 8 + 8 + 4 = 42 sizes; ``cuda_graph_max_bs`` 512 at tp >=
  4, 256 below (the 90-160 GB branch of ``_handle_gpu_memory_settings``); decode list 1, 2, 4, 8,
  12, 16..256 step 8, 272..max step 16.
- 0.5.14 (the shipped tiny DeepSeek-V3 config: MLA): the same lists (prefill ``max_bs`` 2048 for
  MLA, decode ``max_bs`` 512 / 256); the tc_piecewise prefill graph is turned off for DP attention
  and for attention CP > 1; no alignment (the PR's filter was lost).
- 0.5.23 (the same config): chunked prefill 8192, prefill ``max_bs`` min(8192, chunked) for MLA ->
  the list goes on 2304..4096 step 256, 4608..8192 step 512: 42 + 8 + 8 = 58 sizes; with DP
  attention the chunked prefill size is split over the attention-DP ranks (8192 / 2 = 4096: 50
  sizes); the breakable prefill graph (the CUDA default) is turned off under two-batch overlap and
  attention CP; sizes rounded up to the decode runner's alignment.
"""

import os
from pathlib import Path

import pytest

from sglab.capture_sizes import server_args, show
from sglab.capture_sizes import sglang as cs
from sglab.core import runs
from sglab.sglang import runner
from sglab.sglang.releases import installed_releases
from sglab.tools import cli


RELEASES = ("0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.14", "0.5.23")
FILTERED = ("0.5.11", "0.5.12.post1", "0.5.13")  # #23972's filter is in these runners

PIECEWISE = [
    4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
    288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280, 1536,
    1792, 2048
]
# the sizes of PIECEWISE that are 4 mod 8 (every size from 48 on is a multiple of 16)
ODD_FOURS = [4, 12, 20, 28]
# PIECEWISE without ODD_FOURS: 38 sizes, all multiples of 8 (rounding up to 8 merges the four)
PIECEWISE_X8 = [n for n in PIECEWISE if n not in ODD_FOURS]
# 0.5.23's list up to 4096 (50 sizes) and 8192 (58 sizes)
PIECEWISE_4096 = PIECEWISE + list(range(2304, 4097, 256))
PIECEWISE_8192 = PIECEWISE_4096 + list(range(4608, 8193, 512))
PIECEWISE_8192_X8 = [n for n in PIECEWISE_8192 if n not in ODD_FOURS]
# the decode list at cuda_graph_max_bs 512: 5 + 31 + 16 = 52 sizes
DECODE_512 = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 513, 16))
DECODE_256 = DECODE_512[:36]  # at max bs 256 (tp < 4): 5 + 31
DECODE_512_X8 = [n for n in DECODE_512 if n % 8 == 0]  # drop 1, 2, 4, 12: 48 sizes
DECODE_512_X16 = [n for n in DECODE_512 if n % 16 == 0]  # two-batch overlap doubles 8: 32
DECODE_512_X4 = DECODE_512[2:]  # drop 1, 2: 50 sizes
DECODE_512_X2 = DECODE_512[1:]  # drop 1: 51 sizes
DECODE_256_X4 = DECODE_256[2:]  # drop 1, 2: 34 sizes

CASES = {
    # the crash report: attention TP 8 (no DP attention, CP 1), dense MLP at TP 1 -> tokens
    # scattered over 8 ranks
    "tp8_dense1": "--tp 8 --moe-dense-tp-size 1",
    # attention TP 4 / 2 = 2; DP attention gathers the MLP input; 0.5.10.post1-0.5.14 turn the
    # piecewise runner off for DP attention
    "tp4_dp2": "--tp 4 --enable-dp-attention --dp 2",
    # attention TP 8 / 2 = 4, CP 2; context parallelism turns the prefill graph off ...
    "tp8_cp2_dense1": "--tp 8 --attn-cp-size 2 --moe-dense-tp-size 1",
    # ... unless enforced (a flag 0.5.23 no longer has); mul_base = 4 (4 % 2 == 0): every default
    # size is a multiple of 4
    "tp8_cp2_dense1_enforced": "--tp 8 --attn-cp-size 2 --moe-dense-tp-size 1 "
    "--enforce-piecewise-cuda-graph",
    # attention TP 2, max bs 256; two-batch overlap doubles the decode base (and the round-up's)
    "tp2_dense1_tbo": "--tp 2 --moe-dense-tp-size 1 --enable-two-batch-overlap",
    # the crash report with two-batch overlap: decode and round-up align to 16, the PR to 8
    "tp8_dense1_tbo": "--tp 8 --moe-dense-tp-size 1 --enable-two-batch-overlap",
    # plain TP 2: nothing is scattered (all-reduce), so nothing is filtered or refused
    "tp2": "--tp 2",
    # bad input: a misspelt flag, and two contradictions SGLang's handlers assert on
    "misspelt": "--tpp 8",
    "cp_not_dividing": "--tp 8 --attn-cp-size 3",
    "lm_head_without_dp_attention": "--dp 2 --enable-dp-lm-head",
}

# (case, release group) -> piecewise captured (None: off, with this in the note), refused, decode
EXPECTED = {
    ("tp8_dense1", "unfiltered"): (PIECEWISE, ODD_FOURS, DECODE_512_X8),
    ("tp8_dense1", "filtered"): (PIECEWISE_X8, [], DECODE_512_X8),
    ("tp8_dense1", "0.5.23"): (PIECEWISE_8192_X8, [], DECODE_512_X8),
    ("tp4_dp2", "all"): ("DP attention", [], DECODE_512_X2),
    ("tp4_dp2", "0.5.23"): (PIECEWISE_4096, [], DECODE_512_X2),
    ("tp8_cp2_dense1", "all"): ("ontext parallel", [], DECODE_512_X4),
    ("tp8_cp2_dense1", "0.5.23"): ("disable_breakable_cudagraph_if_incompatible", [],
                                   DECODE_512_X4),
    ("tp8_cp2_dense1_enforced", "all"): (PIECEWISE, [], DECODE_512_X4),
    ("tp2_dense1_tbo", "all"): (PIECEWISE, [], DECODE_256_X4),
    ("tp2_dense1_tbo", "0.5.23"): ("two-batch overlap", [], DECODE_256_X4),
    ("tp8_dense1_tbo", "unfiltered"): (PIECEWISE, ODD_FOURS, DECODE_512_X16),
    ("tp8_dense1_tbo", "filtered"): (PIECEWISE_X8, [], DECODE_512_X16),
    ("tp8_dense1_tbo", "0.5.23"): ("two-batch overlap", [], DECODE_512_X16),
    ("tp2", "all"): (PIECEWISE, [], DECODE_256),
    ("tp2", "0.5.23"): (PIECEWISE_8192, [], DECODE_256),
}
ERRORS = {
    "misspelt": "sglang.launch_server: error: unrecognized arguments: --tpp 8",
    "cp_not_dividing": "AssertionError: tp_size must be divisible by attn_cp_size",
    "lm_head_without_dp_attention": "AssertionError: Please enable dp attention when setting "
    "enable_dp_lm_head.",
}
ERRORS_0523 = {
    "tp8_cp2_dense1_enforced": "sglang.launch_server: error: unrecognized arguments: "
    "--enforce-piecewise-cuda-graph",
    "lm_head_without_dp_attention": "AssertionError: --enable-dp-lm-head requires attention DP "
    "(--attn-dp-size).",
}

# the calls of the module fixture and of the command's tests, answered with the session's (conftest)
AS_LLAMA = Path(__file__).resolve().parents[1] / "data" / "configs" / "deepseek_tiny_as_llama.json"
REAL_CALLS = [
    cs.probe_call({k: v.split()
                   for k, v in CASES.items()}, RELEASES),
    cs.probe_call({"args": CASES["tp8_dense1"].split()}, ("0.5.10.post1", "0.5.11")),
    cs.probe_call({"args": CASES["tp8_dense1"].split()}, ("0.5.14",), model=str(AS_LLAMA)),
    cs.probe_call({"args": ["--tp", "2"]}, ("0.5.10.post1", "0.5.11")),
    *(cs.probe_call({"args": CASES[case].split()}, ("0.5.11",))
      for case in ("misspelt", "cp_not_dividing"))
]


def _need(releases):
    missing = [v for v in releases if v not in installed_releases()]
    if missing:
        msg = f"SGLang releases not installed: {', '.join(missing)} (run `sglab real install`)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)


@pytest.fixture(scope="module")
def rows():
    return cs.ask({k: v.split() for k, v in CASES.items()}, RELEASES)


def _expected(case: str, release: str):
    groups = (release, "filtered" if release in FILTERED else "unfiltered", "all")
    return next(EXPECTED[(case, g)] for g in groups if (case, g) in EXPECTED)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("case", sorted({c for c, _ in EXPECTED}))
def test_captured_sizes_match_the_hand_tables(rows, case, release):
    if release == "0.5.23" and case in ERRORS_0523:
        return
    _need((release,))
    piecewise, refused, decode = _expected(case, release)
    t = server_args.sizes_table(rows, case)
    pw = t[(t.release == release) & (t.list == "piecewise")].iloc[0]
    dec = t[(t.release == release) & (t.list == "decode")].iloc[0]
    if isinstance(piecewise, str):
        assert pw.status == "off" and pw.captured == [] and piecewise in pw.note, pw.note
    else:
        assert pw.status == "captured" and pw.captured == piecewise
        assert pw.configured == (PIECEWISE_8192 if release == "0.5.23" and case != "tp4_dp2" else
                                 PIECEWISE_4096 if release == "0.5.23" else PIECEWISE)
    assert pw.refused == refused
    assert dec.status == "captured" and dec.captured == decode and dec.refused == []


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("case", sorted(ERRORS) + ["tp8_cp2_dense1_enforced"])
def test_bad_arguments_get_sglangs_message(rows, case, release):
    _need((release,))
    want = ERRORS_0523.get(case, ERRORS.get(case)) if release == "0.5.23" else ERRORS.get(case)
    if want is None:
        return
    t = server_args.sizes_table(rows, case)
    row = t[t.release == release].iloc[0]
    assert (row.status, row.note) == ("error", want)


def test_rebuild_columns(rows):
    _need(("0.5.10.post1", "0.5.11", "0.5.23"))
    t = server_args.sizes_table(rows, "tp8_dense1").set_index(["release", "list"])
    pw = t.loc[("0.5.10.post1", "piecewise")]
    # PR filter: multiples of 8; round-up to 8 moves 4->8, 12->16, 20->24, 28->32, all merge
    assert (pw.filter_base, pw.filter_keeps) == (8, PIECEWISE_X8)
    assert (pw.round_up_alignment, pw.round_up) == (8, PIECEWISE_X8)
    # the rebuild's decode rule gives what the release captured
    assert t.loc[("0.5.11", "decode")].filter_keeps == DECODE_512_X8
    # the rebuild's round-up on 0.5.23's own configured list is what 0.5.23 captures
    new = t.loc[("0.5.23", "piecewise")]
    assert new.round_up == new.captured == PIECEWISE_8192_X8
    tbo = server_args.sizes_table(rows, "tp8_dense1_tbo").set_index(["release", "list"])
    tbo = tbo.loc[("0.5.11", "piecewise")]
    assert (tbo.filter_base, tbo.filter_keeps) == (8, PIECEWISE_X8)
    assert (tbo.round_up_alignment, tbo.round_up[:2]) == (16, [16, 32])
    plain = server_args.sizes_table(rows, "tp2").set_index(["release",
                                                            "list"]).loc[("0.5.11", "piecewise")]
    assert not plain.gathered
    assert (plain.filter_base, plain.filter_keeps, plain.round_up) == (1, PIECEWISE, PIECEWISE)


def test_two_batch_overlap_note_says_what_the_filter_keeps_beyond_the_alignment(rows):
    """With attention TP 8 the PR's filter keeps 8 and 24, which the round-up to 16 moves; with
    attention TP 2 every size it keeps (multiples of 2) is a multiple of 4 as well."""
    _need(("0.5.11",))
    head = "two-batch overlap: the decode rule and the 0.5.22+ round-up align to"
    assert server_args.notes(server_args.sizes_table(rows, "tp8_dense1_tbo")) == [
        f"{head} 16, the PR's filter to 8; it keeps 2 sizes that are not multiples of 16 (8, 24)"
    ]
    assert server_args.notes(server_args.sizes_table(rows, "tp2_dense1_tbo")) == [
        f"{head} 4, the PR's filter to 2; on this list they agree: every size the filter keeps "
        "is a multiple of 4"
    ]
    one = server_args.sizes_table(rows, "tp8_dense1_tbo")
    one["filter_keeps"] = [[8, 16, 32] if k == "piecewise" else [] for k in one.list]
    assert server_args.notes(one) == [
        f"{head} 16, the PR's filter to 8; it keeps 1 size that is not a multiple of 16 (8)"
    ]


def test_a_graph_turned_off_by_a_rule_without_a_name_says_the_releases_reason(rows):
    """0.5.23 names each rule that turns the prefill graph off, except context parallelism's
    (its warning comes later): the comment above that rule is its reason."""
    _need(("0.5.14", "0.5.23"))
    t = server_args.sizes_table(rows, "tp8_cp2_dense1").set_index(["release", "list"])
    assert t.loc[("0.5.23", "piecewise")].note == (
        "disable_breakable_cudagraph_if_incompatible: CP all_gather replay size mismatch under BCG")
    assert "context parallel" in t.loc[("0.5.14", "piecewise")].note
    off = server_args.sizes_table(rows, "tp8_dense1_tbo").set_index(["release", "list"])
    assert off.loc[("0.5.23", "piecewise")].note.endswith(": two-batch overlap")


def test_resolved_releases_report_the_model_and_what_sglang_derived(rows):
    _need(("0.5.14", "0.5.23"))
    for release, max_tokens in (("0.5.14", 2048), ("0.5.23", 8192)):
        d = rows[(rows.case == "tp8_dense1") & (rows.release == release)]
        f = dict(zip(d.metric, d.value))
        assert f["model"] == cs.MODEL and f["chunked_prefill_size"] == 8192
        assert (f["piecewise_max_tokens"], f["decode_max_bs"]) == (max_tokens, 512)


# ------------------------------------------------------------------------------------- the command
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
    assert "42: 4–2048" in row and "refused 4: 4, 12, 20, 28;" in row
    assert "keeps 38 of 42 (multiples of 8)" in row
    row = next(ln for ln in lines if ln.startswith("0.5.11        piecewise"))
    assert "38: 8–2048" in row and "refused none;" in row
    assert lines[lines.index("piecewise, sglang 0.5.11 (38 sizes):") + 1].split()[:5] == \
        ["8", "16", "24", "32", "48"]
    import pandas as pd

    table = pd.read_csv(csv)
    assert table.loc[0, "refused"] == "4 12 20 28" and len(table) == 4


def test_command_on_a_terminal_says_which_release_answered_as_it_answers(capsys, monkeypatch):
    """Several seconds per release: on a terminal, a line before the releases start and one as
    each answers (stderr; the table stays on stdout), from a worker or from this session."""
    from sglab.capture_sizes import server_args

    _need(("0.5.10.post1", "0.5.11"))
    monkeypatch.setattr(server_args, "_on_terminal", lambda: True)
    code, out, err = _cli(capsys, "--release", "0.5.10.post1", "0.5.11", "--", "--tp", "2")
    lines = err.splitlines()
    assert code == 0 and out.startswith("SGLang server arguments: --tp 2")
    assert lines[0] == "asking 2 release(s) to parse the arguments, each in its own process …"
    assert sorted(ln.split(":")[0] for ln in lines[1:]) == [
        "  sglang 0.5.10.post1", "  sglang 0.5.11"
    ]
    assert all(ln.endswith(" s)") and ": ok (" in ln for ln in lines[1:]), lines


@pytest.mark.parametrize("case", ["misspelt", "cp_not_dividing"])
def test_command_bad_arguments_one_line(capsys, case):
    _need(("0.5.11",))
    code, out, err = _cli(capsys, "--release", "0.5.11", "--", *CASES[case].split())
    assert code == 2 and out == ""
    assert err.splitlines() == [f"sglab capture-sizes: {ERRORS[case]} (sglang 0.5.11)"]


def test_command_with_a_model_config_of_another_name(capsys):
    """``--model`` takes any JSON file (copied as config.json for SGLang) or a folder; a model
    without MLA moves 0.5.14's prefill maximum to the chunked prefill size (8192 here)."""
    _need(("0.5.14",))
    import json

    # the shipped tiny DeepSeek config without MLA, as a Llama (committed, so that its call is
    # one of REAL_CALLS: the session answers it)
    cfg = json.loads((runs.repo_root() / cs.MODEL).read_text())
    cfg = {k: v for k, v in cfg.items() if "lora" not in k and "rope" not in k}
    assert json.loads(AS_LLAMA.read_text()) == {
        **cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama"
    }
    code, out, _ = _cli(capsys, "--release", "0.5.14", "--model", str(AS_LLAMA), "--",
                        *CASES["tp8_dense1"].split())
    assert code == 0 and "piecewise max tokens 8192" in out


def test_command_with_no_model_config_says_so_before_any_release_starts(
        capsys, monkeypatch, tmp_path):
    from sglab.capture_sizes import sglang as cs_sglang

    monkeypatch.setattr(cs_sglang, "run_probes", lambda *a, **k: pytest.fail("a release started"))
    code, out, err = _cli(capsys, "--release", "0.5.14", "--model", str(tmp_path / "none.json"),
                          "--", "--tp", "2")
    assert (code, out) == (2, "")
    assert err == f"sglab capture-sizes: no model config at {tmp_path / 'none.json'}\n"
    code, _, err = _cli(capsys, "--model", str(tmp_path), "--", "--tp", "2")  # a folder without one
    assert code == 2 and f"no model config at {tmp_path / 'config.json'}" in err


@pytest.mark.parametrize("text, says", [
    ("not json\n", "is not a JSON model config (Expecting value: line 1 column 1 (char 0))"),
    ("[1, 2]\n", "is not a JSON model config (a JSON list, not an object)"),
])
def test_a_model_that_is_not_a_json_config_is_one_line_before_any_release_starts(
        capsys, monkeypatch, tmp_path, text, says):
    from sglab.capture_sizes import sglang as cs_sglang

    monkeypatch.setattr(cs_sglang, "run_probes", lambda *a, **k: pytest.fail("a release started"))
    model = tmp_path / "model.txt"
    model.write_text(text)
    code, out, err = _cli(capsys, "--release", "0.5.14", "--model", str(model), "--", "--tp", "2")
    assert (code, out) == (2, "")
    assert err == f"sglab capture-sizes: {model} {says}\n"


def test_a_model_config_of_another_name_leaves_no_copy_behind_and_errors_name_it(
        monkeypatch, tmp_path):
    """The copy a release reads as config.json lives in a temporary folder for as long as the
    release resolves its configuration, then goes, also where SGLang refuses the model; SGLang's
    message then names the user's file, not the copy."""
    import json

    _need(("0.5.14",))
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the workers' temporary folder
    mine, bare = tmp_path / "mine.json", tmp_path / "bare.json"
    mine.write_text(AS_LLAMA.read_text())
    bare.write_text(json.dumps({"hidden_size": 64}))
    # both in one worker of the release, as a session's calls are (one start of it, not two)
    calls = [cs.probe_call({"args": ["--tp", "2"]}, [], model=str(m))[:2] for m in (mine, bare)]
    got, _ = runner.run_release("0.5.14", calls)
    rows = got[runner.call_key(*calls[0])].rows
    facts = dict(zip(rows.metric, rows.value))
    assert facts["model"] == str(mine) and facts["piecewise_max_tokens"] == 8192
    rows = got[runner.call_key(*calls[1])].rows
    (error,) = rows.loc[rows.metric == "error", "value"]
    assert f"Unrecognized model in {bare}." in error and "sglab-model-" not in error
    assert list(temp.glob("sglab-model-*")) == []


def test_a_csv_that_cannot_be_written_is_one_line_before_any_release_starts(
        capsys, monkeypatch, tmp_path):
    from sglab.capture_sizes import sglang as cs_sglang

    monkeypatch.setattr(cs_sglang, "run_probes", lambda *a, **k: pytest.fail("a release started"))
    for csv, says in ((tmp_path / "none" / "t.csv", f"no such folder {tmp_path / 'none'}"),
                      (tmp_path, "a folder, not a file")):
        code, out, err = _cli(capsys, "--release", "0.5.11", "--csv", str(csv), "--", "--tp", "2")
        assert (code, out) == (2, "")
        assert err == f"sglab capture-sizes: --csv {csv}: {says}\n"


def test_command_missing_release_and_no_arguments(capsys):
    code, out, err = _cli(capsys, "--release", "0.5.99", "--", "--tp", "8")
    assert code == 2 and len(err.splitlines()) == 1 and "sglang 0.5.99 is not installed" in err
    code, out, err = _cli(capsys, "--release", "five", "--", "--tp", "8")
    assert code == 2 and len(err.splitlines()) == 1 and "not a release version: 'five'" in err
    code, out, err = _cli(capsys, "--")
    assert code == 2 and len(err.splitlines()) == 1 and "give SGLang server arguments after --" \
        in err


# ------------------------------------------------------------------------ the notebook's control
def test_rule_table_tp8_dense_tp1():
    t = server_args.rule_table(8, 1, True, False).set_index("rule")
    assert t.loc["before #23972", "captures"] == 42
    assert t.loc["before #23972", "refused"] == "4: 4, 12, 20, 28"
    assert t.loc["no alignment", "refused"] == "4: 4, 12, 20, 28"
    # the filter and the round-up to 8 both give PIECEWISE_X8 (38): every moved size lands on a
    # kept one
    for rule in ("#23972 filter", "round-up"):
        assert (t.loc[rule, "multiple of"], t.loc[rule, "captures"], t.loc[rule, "refused"]) == \
            (8, 38, "none")
    # with two-batch overlap the round-up aligns to 16 (36 sizes); the PR's filter stays at 8
    tbo = server_args.rule_table(8, 1, True, True).set_index("rule")
    assert (tbo.loc["round-up", "multiple of"], tbo.loc["round-up", "captures"]) == (16, 36)
    assert (tbo.loc["#23972 filter", "multiple of"], tbo.loc["#23972 filter", "captures"]) == \
        (8, 38)


def test_rule_table_names_each_rules_releases_as_the_wheels_read_them(monkeypatch):
    """The releases column comes from the release table: a release added to it lands in its rule's
    range, with no text to edit."""
    from sglab.capture_sizes import sglang

    timeline = [("0.5.10", "before"), ("0.5.11", "pr-era"), ("0.5.13.post1", "pr-era"),
                ("0.5.14", "regressed"), ("0.5.21", "regressed"), ("0.5.22", "changed"),
                ("0.5.30", "changed")]
    monkeypatch.setattr(type(sglang.FIX), "releases", lambda self: timeline)
    server_args.releases_by_state.cache_clear()
    try:
        t = server_args.rule_table(8, 1, True, False).set_index("rule")["releases"]
    finally:
        server_args.releases_by_state.cache_clear()
    assert t.to_dict() == {
        "before #23972": "0.5.10", "#23972 filter": "0.5.11–0.5.13.post1",
        "no alignment": "0.5.14–0.5.21", "round-up": "0.5.22–0.5.30",
        "decode runner's rule on this list": "decode, every release"
    }


def test_rule_table_non_power_of_two_and_no_scatter():
    t = server_args.rule_table(3, 1, True, False).set_index("rule")
    # multiples of 3 in PIECEWISE: 12, 24, 48, 96, 144, 192, 240, 288, 384, 480, 576, 768, 960,
    # 1536 -> 14; the other 28 sizes are refused before the PR
    assert t.loc["#23972 filter", "captures"] == 14
    assert t.loc["#23972 filter", "smallest sizes"].startswith("12, 24, 48")
    assert t.loc["before #23972", "refused"].startswith("28: 4, 8, 16, 20, 28")
    # rounding up to 3 keeps one bucket per size (4->6, 8->9, 16->18, ...): 42, none merge
    assert t.loc["round-up", "captures"] == 42
    plain = server_args.rule_table(2, 1, False, False)
    assert set(plain.refused) == {"none"} and set(plain.captures) == {42}
    assert "nothing to refuse" in plain.attrs["setting"]


def test_the_notebook_control_is_a_static_table_headless(monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    assert show.your_setup is server_args.your_setup  # notebook 06 calls it as show.your_setup()
    table = show.your_setup().set_index(["attn_tp", "tbo", "rule"])
    # three layouts x five rules; at attention TP 8 the PR keeps the 38 multiples of 8 of 42, and
    # with two-batch overlap the round-up aligns to 16 (36 sizes) where the PR's filter kept 38
    assert len(table) == 3 * 5 and "static table" in capsys.readouterr().out
    assert table.loc[(8, False, "#23972 filter"), "captures"] == 38
    assert table.loc[(8, True, "round-up"), "captures"] == 36
    assert table.loc[(8, True, "#23972 filter"), "captures"] == 38


@pytest.mark.parametrize("argv, says", [
    (["--tp-size", "0"], "--tp-size 0: a parallel size must be a positive integer"),
    (["--tp", "8", "--moe-dense-tp-size=-1"], "--moe-dense-tp-size -1: a parallel size"),
    (["--tp-size"], "--tp-size (no value): a parallel size"),
])
def test_a_parallel_size_below_one_is_one_line_before_any_release_runs(capsys, argv, says):
    code, out, err = _cli(capsys, "--", *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("sglab capture-sizes: ") and says in err
