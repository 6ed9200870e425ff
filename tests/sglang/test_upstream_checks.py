"""The per-fix source checks on small synthetic SGLang trees shaped like the real releases: every
state of every check is reached, each verdict carries its reason, and the same checks read a folder
on disk."""

from __future__ import annotations

import textwrap

import pytest

from sglab.sglang import upstream
from sglab.tools.fixes import FIXES, NAMES, get
from sglab.sglang.upstream import RELEASE_STATES, STATES, Verdict
from sglab.sglang import source as S


def state(check, files: dict) -> Verdict:
    v = check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


# -- every state reachable; the folder path; the verdict contract ---------------------------------
def test_every_release_state_is_reached_by_some_check():
    from sglab.capture_sizes import sglang as cs
    from sglab.pcg_gate import sglang as pcg
    from sglab.swa_loc import sglang as swa
    from tests.capture_sizes.test_sglang import PREFILL
    from tests.pcg_gate.test_sglang import KIMI
    from tests.swa_loc.test_sglang import POOL_LATER

    reached = {
        state(pcg.check, {}).status,
        state(pcg.check, {pcg.KIMI_MODEL: KIMI["guard"]}).status,
        state(pcg.check, {pcg.KIMI_MODEL: KIMI["no_alias"]}).status,
        state(swa.check, {swa.SWA_POOL: POOL_LATER}).status,
        state(cs.check,
              {cs.PREFILL_RUNNER: PREFILL.replace("CAPTURE", "sorted(capture_tokens)")}).status,
        state(pcg.check, {pcg.KIMI_MODEL: "class Other:\n    pass\n"}).status
    }
    assert reached == set(RELEASE_STATES)
    assert set(STATES) == set(RELEASE_STATES) | {"not-installed"}


def test_checks_read_a_folder_on_disk(tmp_path):
    from sglab.capture_sizes import sglang as cs
    from sglab.pcg_gate import sglang as pcg
    from tests.capture_sizes.test_sglang import PCG_PR
    from tests.pcg_gate.test_sglang import KIMI

    for rel, text in {pcg.KIMI_MODEL: KIMI["guard"], cs.PIECEWISE_RUNNER: PCG_PR}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert upstream.check(get("pcg_gate"), root=tmp_path).status == "pr-era"
    assert upstream.check(get("capture_sizes"), root=tmp_path).status == "pr-era"
    assert upstream.check(get("grid_thw"), root=tmp_path).status == "absent"
    frame = upstream.check_all(FIXES, root=tmp_path)
    assert list(frame["check"]) == list(NAMES) and frame["detail"].str.len().min() > 0
    # a folder without srt/ in it is not an SGLang tree
    v = upstream.check(get("pcg_gate"), root=tmp_path / "srt")
    assert v.status == "unknown" and "not an SGLang package folder" in v.detail


def test_verdict_needs_a_known_state_and_a_one_line_reason():
    with pytest.raises(ValueError, match="must be one of"):
        Verdict("fix", "old vocabulary")
    for bad in ("", "   ", "two\nlines"):
        with pytest.raises(ValueError, match="one-line reason"):
            Verdict("unknown", bad)
    assert str(Verdict("before", "why")) == "before: why"


def test_a_raising_check_answers_unknown_with_the_error(monkeypatch):

    def boom(read):
        raise RuntimeError("cannot read\nthis")

    from sglab.sglang.fix import Fix

    v = upstream.run_check(Fix("boom", "99", "raises", (1,), 0, boom), {}.get)
    assert v.status == "unknown" and "RuntimeError: cannot read this" in v.detail
    with pytest.raises(ValueError, match="unknown fix"):
        get("no_such_fix")
    if upstream.installed() is None:
        v = upstream.check(get("pcg_gate"))
        # no sglab extra installs it: the one command that does, and why torch is not needed
        assert v.status == "not-installed" and "pip install --no-deps sglang" in v.detail


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
