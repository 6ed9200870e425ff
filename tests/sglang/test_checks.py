"""The per-fix source checks on small synthetic SGLang trees shaped like the real releases: every
state of every check is reached, each verdict carries its reason, and the same checks read a folder
on disk."""

from __future__ import annotations

import textwrap

import pytest

from sglab.sglang import upstream
from sglab.tools.fixes import FIXES, NAMES, get
from sglab.sglang.upstream import RELEASE_STATES, STATES, Verdict
from sglab.sglang import checks
from sglab.sglang import source as S


def state(check, files: dict) -> Verdict:
    v = check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v




# -- #23972 -----------------------------------------------------------------------------------------------------
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
ROUND_UP = "def get_cuda_graph_max_batch_size(n):\n    return ceil_align(n, get_cuda_graph_batch_size_alignment())\n"


@pytest.mark.parametrize("files,status,words", [
    ({}, "absent", "no piecewise or prefill"),
    ({checks.PIECEWISE_RUNNER: PCG_BEFORE}, "before", "every configured size"),
    ({checks.PIECEWISE_RUNNER: PCG_PR}, "pr-era", "divisible by mul_base"),
    ({checks.PREFILL_RUNNER: PREFILL.replace("CAPTURE", "sorted(capture_tokens)")}, "regressed",
     "sorted(capture_tokens) with no TP/CP alignment"),
    ({checks.PREFILL_RUNNER: PREFILL.replace("CAPTURE", "get_prefill_num_tokens_to_capture(capture_tokens)"),
      "srt/utils/common.py": ROUND_UP}, "changed", "get_cuda_graph_max_batch_size → ceil_align"),
    ({checks.PREFILL_RUNNER: PREFILL.replace("CAPTURE", "[n for n in capture_tokens if n % mul_base == 0]")},
     "changed", "filters"),
    ({checks.PREFILL_RUNNER: PREFILL.replace("self.capture_num_tokens = CAPTURE", "pass")}, "unknown", "does not set"),
    ({checks.PIECEWISE_RUNNER: "class Other:\n    pass\n"}, "unknown", "no PiecewiseCudaGraphRunner.__init__")])
def test_capture_sizes_states(files, status, words):
    v = state(checks.capture_sizes, files)
    assert v.status == status and words in v.detail, v


def test_round_up_helper_without_ceil_align_is_not_a_round_up():
    files = {checks.PREFILL_RUNNER: PREFILL.replace("CAPTURE", "get_prefill_num_tokens_to_capture(capture_tokens)"),
             "srt/utils/common.py": "def get_cuda_graph_max_batch_size(n):\n    return n\n"}
    assert state(checks.capture_sizes, files).status == "regressed"


# -- every state reachable; the folder path; the verdict contract -----------------------------------------------
def test_every_release_state_is_reached_by_some_check():
    from sglab.pcg_gate import sglang as pcg
    from sglab.swa_loc import sglang as swa
    from tests.pcg_gate.test_sglang import KIMI
    from tests.swa_loc.test_sglang import POOL_LATER

    reached = {state(pcg.check, {}).status,
               state(pcg.check, {pcg.KIMI_MODEL: KIMI["guard"]}).status,
               state(pcg.check, {pcg.KIMI_MODEL: KIMI["no_alias"]}).status,
               state(swa.check, {swa.SWA_POOL: POOL_LATER}).status,
               state(checks.capture_sizes,
                     {checks.PREFILL_RUNNER: PREFILL.replace("CAPTURE",
                                                             "sorted(capture_tokens)")}).status,
               state(pcg.check, {pcg.KIMI_MODEL: "class Other:\n    pass\n"}).status,}
    assert reached == set(RELEASE_STATES)
    assert set(STATES) == set(RELEASE_STATES) | {"not-installed"}


def test_checks_read_a_folder_on_disk(tmp_path):
    from sglab.pcg_gate import sglang as pcg
    from tests.pcg_gate.test_sglang import KIMI

    for rel, text in {pcg.KIMI_MODEL: KIMI["guard"], checks.PIECEWISE_RUNNER: PCG_PR}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert upstream.check(get("pcg_gate"), root=tmp_path).status == "pr-era"
    assert upstream.check(get("capture_sizes"), root=tmp_path).status == "pr-era"
    assert upstream.check(get("grid_thw"), root=tmp_path).status == "absent"
    frame = upstream.check_all(FIXES, root=tmp_path)
    assert list(frame["check"]) == list(NAMES) and frame["detail"].str.len().min() > 0
    v = upstream.check(get("pcg_gate"), root=tmp_path / "srt")  # a folder without srt/ in it: not an SGLang tree
    assert v.status == "unknown" and "not an SGLang package folder" in v.detail


def test_verdict_needs_a_known_state_and_a_one_line_reason():
    with pytest.raises(ValueError, match="must be one of"):
        Verdict("fix", "old vocabulary")
    for bad in ("", "   ", "two\nlines"):
        with pytest.raises(ValueError, match="one-line reason"):
            Verdict("unknown", bad)
    assert str(Verdict("before", "why")) == "before: why" and Verdict("before",
                                                                      "why").reason == "why"


def test_a_raising_check_answers_unknown_with_the_error(monkeypatch):
    def boom(read):
        raise RuntimeError("cannot read\nthis")

    from sglab.sglang.fix import Fix

    v = upstream.run_check(Fix("boom", "99", "raises", (1,), 0, boom), {}.get)
    assert v.status == "unknown" and "RuntimeError: cannot read this" in v.detail
    with pytest.raises(ValueError, match="unknown fix"):
        get("no_such_fix")
    if upstream.installed() is None:
        assert upstream.check(get("pcg_gate")).status == "not-installed"


def test_source_helpers_find_symbols_by_name():
    src = textwrap.dedent("""
        class A:
            @property
            def model(self):
                return 1

            class Inner:
                def f(self):
                    pass
        def g():
            return A().model
        """)
    assert S.symbol_text(src, "A.model") == "@property\ndef model(self):\n    return 1\n"
    assert S.symbol_text(src, "A.Inner.f").startswith("def f(self):")
    assert S.symbol_text(src, "A.nope") is None and S.symbol_text(None, "g") is None
    assert S.parse("def broken(:") is None and S.find(None, "g") is None
    assert len(S.calls(S.find(S.parse(src), "g"), "A")) == 1
