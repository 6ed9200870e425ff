"""The review card: releases as ranges of one state, the engine's answer before the rebuild's, and
the PR's words beside what was found, filled from the claims' values."""

from types import SimpleNamespace

from sglab.core import card as K
from sglab.core import engine_records as R, notebook, runs
from sglab.swa_loc import claims, sglang


def test_consecutive_releases_of_one_state_read_as_one_range():
    line = K.releases_line([("0.5.10", "before"), ("0.5.11", "before"), ("0.5.12", "pr-era"),
                            ("0.5.14", "regressed"), ("0.5.22", "changed"), ("0.5.23", "changed")])
    assert line == ("affected 0.5.10–0.5.11 · fixed (the PR's code) 0.5.12 · affected again (the "
                    "fix was lost) 0.5.14 · fixed (code since rewritten) 0.5.22–0.5.23")


def test_the_engine_answers_first_and_a_pair_without_its_value_is_left_out():
    card = K.Card(
        bug="b", affects="a",
        found=(("the PR",
                "{e[engine_swa_loc.reverted_preset_extra_kernels][per_swa_layer]:.0f} per layer"),
               ("never shown", "{e[no.such.claim]}"), ("each number's GPU", "{gpu} / {rgpu}")))
    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    p = K.parts(card, sglang.FIX, claims, run, sglang.FIX.recorded_engine())
    # the GPU models the engine's merged run and the rebuild's first shown run were read on
    engine_gpu = R.per_gpu(sglang.FIX.recorded_engine())[0].manifest.gpu
    gpus = f"{engine_gpu} / {list(run)[0].manifest.gpu}"
    assert p["found"] == [("the PR", "2 per layer"), ("each number's GPU", gpus)]
    md = K.markdown(p)
    assert md.index("Real SGLang engine") < md.index("The rebuild")
    assert p["releases"].startswith("affected 0.5.10")
    assert p["engine_verdicts"] and all("claims hold on" in v for v in p["engine_verdicts"])
    none = K.parts(card, sglang.FIX, claims, runs.NoRun("swa_loc", "x"),
                   runs.NoRun("engine_swa_loc", "none recorded"))
    assert "none recorded" in none["engine"] and none["engine_verdicts"] == []
    assert none["found"] == []


def test_a_card_names_its_fixs_releases(monkeypatch):
    fix = SimpleNamespace(releases=lambda: [("0.5.10", "absent"), ("0.5.11", "pr-era")])
    assert K.releases_line(fix.releases()) == "no such code 0.5.10 · fixed (the PR's code) 0.5.11"


def test_a_release_with_the_pr_but_not_its_follow_up_is_told_apart():
    """0.5.11 has #23552's preset but not #24743's zeroing of the padded tail: its state is the
    PR's, and the card tells a reader it is only partly fixed."""
    from sglab.swa_loc import sglang

    assert dict(sglang.FIX.releases())["0.5.11"] == "pr-era"
    told = dict(sglang.FIX.releases(told=True))
    assert told["0.5.11"].startswith("partly fixed (#23552 without #24743")
    assert told["0.5.12"] == "pr-era" and told["0.5.10"] == "before"
    assert " partly fixed (#23552 without #24743" in K.releases_line(list(told.items()))


def test_the_pr_beside_us_is_a_table_of_its_own_that_nbconvert_renders():
    """The table follows the quote (inside one, nbconvert shows its pipes as text), a pipe in a
    cell is escaped, and the HTML card names the rebuild's answer too."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    p = {
        "bug": "b", "affects": "a", "releases": "r", "engine": "e", "engine_verdicts": [],
        "rebuild": "the rebuild says", "rebuild_verdicts": [], "found": [("x | y", "z")]
    }
    md = K.markdown(p)
    html = markdown2html_mistune(md)
    assert "<table>" in html and "<td>x | y</td>" in html and "| the PR says" not in html
    assert md.splitlines()[-4] == "" and "> **The rebuild.** the rebuild says" in md
    assert "<b>The rebuild.</b> the rebuild says" in K.html_card(p)


def test_an_engine_answer_of_several_lines_is_a_list_under_its_first_on_the_card_only():
    """Its first line leads; the other lines are a list, in the notebook (through nbconvert) and on
    the report's index; the verdicts follow the list; the README's row puts one a line."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    p = {
        "bug": "b", "affects": "a", "releases": "r", "engine": "The claim.\nfirst part\nsecond",
        "engine_verdicts": ["5/5 claims hold"], "rebuild": "x", "rebuild_verdicts": [], "found": []
    }
    page = markdown2html_mistune(K.markdown(p))
    assert "<strong>Real SGLang engine.</strong> The claim.</p>" in page
    listed = "<ul>\n<li>first part</li>\n<li>second</li>\n</ul>\n"
    assert listed + "<p><em>5/5 claims hold.</em>" in page
    index = "<b>Real SGLang engine.</b> The claim.</p><ul><li>first part</li><li>second</li></ul>"
    assert index + "<p><b>The rebuild.</b>" in K.html_card(p)
    assert "Real engine: The claim.<br>• first part<br>• second<br> Rebuild: x" in K.summary(p)
    one = K.markdown({**p, "engine": "The claim. one line"})
    assert "> **Real SGLang engine.** The claim. one line\n> *5/5 claims hold.*" in one
    assert "<ul>" not in K.html_card({**p, "engine": "The claim. one line"})


def test_a_notebooks_card_engine_section_and_verdict_evaluate_each_runs_claims_once(monkeypatch):
    """The card, the engine section's verdict lines and the Verdict section read one run's claims:
    each (claims, run) is evaluated once in the notebook's process, and read again from its memo."""
    from sglab.core import claims as C
    from sglab.core import engine_view
    from sglab.swa_loc import show

    calls, evaluate = [], C.evaluate
    # the objects themselves are kept: an id freed by one rendering's merged run may come back
    monkeypatch.setattr(C, "evaluate", lambda m, r: calls.append((m, r)) or evaluate(m, r))
    monkeypatch.setattr(engine_view, "display", lambda *a, **k: None)
    run = notebook.Workbook(claims, mode="recorded", show=False).run()
    engine = sglang.FIX.recorded_engine()
    for _ in range(2):
        K.parts(claims.CARD, sglang.FIX, claims, run, engine)
        engine_view.section(show.VIEW, engine, claims.ENGINE)
        notebook.verdict(claims, run)
    assert calls and len(calls) == len({(id(m), id(r)) for m, r in calls})
