"""Notebook 00's tables: the reading order covers every notebook, "does it affect us?" has one row
per fix made from its card, its wheels and its recorded runs, the glossary defines the fix
notebooks' jargon, and the notebooks table shows every cell whole."""

import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import jupytext
import pandas as pd
import pytest

from sglab.core import runs
from sglab.core.card import releases_line
from sglab.tools import fixes, front_door as F, report


ROOT = Path(__file__).resolve().parents[2]
# words a GPU engineer reads without a glossary
COMMON = {
    "GPU", "GPUs", "CPU", "CUDA", "PR", "PRs", "NCCL", "LLM", "VLM", "NVML", "HF", "GEMM", "GEMMs",
    "CSV", "LM", "SDPA", "CUPTI", "ZMQ", "MLP", "MLPs", "JSON", "API"
}
# the workbook's own jargon, written out
PHRASES = ("A/A", "high-water mark", "hwm", "two-batch overlap", "Lamport", "dummy weights",
           "harness adjustment", "shim", "piecewise CUDA graph", "breakable CUDA graph",
           "context parallelism", "recorded run", "live run")
# the terms a reader new to SGLang work asked for
ASKED = ("PCG", "BCG", "A/A control", "hwm", "TBO", "CP", "Lamport buffer", "shim",
         "harness adjustment", "dummy weights", "recorded run", "live run")


def _defined() -> set[str]:
    out = set()
    for term, aliases, _ in F.GLOSSARY:
        out |= {t.strip().lower() for t in term.split(",")} | {a.lower() for a in aliases}
    return out


def _markdown(stem: str) -> str:
    """A notebook's markdown cells, code spans and link targets left out."""
    nb = jupytext.read(ROOT / "notebooks" / f"{stem}.py")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", " ", text))


# --------------------------------------------------------------------------------------------------
# does it affect us?
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rows():
    return F.affects_rows()


def test_one_row_per_fix_with_the_releases_read_from_the_wheels(rows):
    assert [r["notebook"] for r in rows] == [f.stem for f in fixes.FIXES]
    for r, fix in zip(rows, fixes.FIXES):
        assert r["releases"] == releases_line(fix.releases(told=True))
    md = F.affects_markdown(rows).splitlines()
    assert len(md) == 2 + len(fixes.FIXES)
    for line, fix in zip(md[2:], fixes.FIXES):
        assert f"[{fix.stem}]({fix.stem}.ipynb)" in line
        # each range on its own line, the affected ones in bold
        for state, _ in fix.releases():
            if state in F.AFFECTED:
                assert "**affected" in line


def test_bug_and_who_are_the_cards_own_first_words_cut_at_a_word(rows):
    for r, fix in zip(rows, fixes.FIXES):
        card = fixes.claims(fix.name).CARD
        for shown, full in ((r["bug"], card.bug), (r["who"], card.affects)):
            full = " ".join(full.split())
            head = shown.removesuffix(" …")
            assert full.startswith(head), (fix.name, shown)
            assert len(full) == len(head) or not full[len(head)].isalnum(), (fix.name, shown)
            assert shown.endswith(" …") == (len(head) < len(full)), (fix.name, shown)
            assert head.count("(") == head.count(")"), (fix.name, shown)


def test_each_quoted_line_is_sglangs_own_on_an_affected_release(rows):
    from sglab.core import engine_records
    from sglab.sglang import store

    rec = store.newest()
    quoted = 0
    for r, fix in zip(rows, fixes.FIXES):
        m = re.search(r"“(.+)”", r["symptom"])
        if not m:
            assert "SGLang's own line" not in r["source"]
            continue
        quoted += 1
        state = dict(fix.releases())
        said = {}
        for (_, release), d in (rec.results.items() if rec else []):
            if fix.probe and d["probe"] == fix.probe.fn:
                for row in d["rows"]:
                    if isinstance(row.get("value"), list):
                        said.setdefault(release, set()).update(map(str, row["value"]))
        shown = list(getattr(fix.recorded_engine(), "shown", []) or [])
        if shown:
            df = engine_records.frame(shown)
            for release, value in df[df.metric == "status"][["release",
                                                             "value"]].itertuples(index=False):
                said.setdefault(str(release), set()).add(str(value))
        hits = {rel for rel, lines in said.items() if any(m.group(1) in x for x in lines)}
        assert hits and all(state.get(rel) in F.AFFECTED for rel in hits), (fix.name, hits)
    assert quoted >= 1


def test_a_probe_line_counts_only_where_no_unaffected_release_printed_it(monkeypatch):
    from sglab.sglang import store

    def answer(release, lines):
        return {"probe": "p", "status": "ok", "rows": [{"metric": "messages", "value": lines}]}

    results = {("k", "1"): answer("1", ["both", "only affected"]),
               ("k", "2"): answer("2", ["both", "only fixed"])}
    monkeypatch.setattr(store, "newest", lambda: SimpleNamespace(results=results))
    fix = SimpleNamespace(probe=SimpleNamespace(fn="p"), releases=lambda: [("1", "before"),
                                                                           ("2", "pr-era")])
    assert F._probe_lines(fix) == [("1", "only affected")]
    assert F.log_line(fix) == "1 logs “only affected” (its recorded probe)."


def test_an_engine_error_counts_only_on_an_affected_release(monkeypatch):
    from sglab.core import engine_records, runs

    frame = pd.DataFrame({
        "release": ["1", "2", "1"], "metric": ["status"] * 3, "value": [
            "error: ValueError: sizes differ (log: /tmp/x/engine.log)",
            "error: RuntimeError: other", "ok"
        ]
    })
    monkeypatch.setattr(engine_records, "frame", lambda shown: frame)
    fix = SimpleNamespace(probe=None, releases=lambda: [("1", "regressed"), ("2", "pr-era")],
                          recorded_engine=lambda: runs.RunSet(["run"]))
    assert F._engine_lines(fix) == [("1", "ValueError: sizes differ")]
    assert F.log_line(fix) == "1 stops with “ValueError: sizes differ” (a recorded engine run)."
    fix = SimpleNamespace(probe=None, releases=lambda: [("1", "before")],
                          recorded_engine=lambda: runs.NoRun("engine_x", "none recorded"))
    assert F.log_line(fix) == ""


def test_lead_keeps_whole_sentences_and_cuts_at_a_clause_or_a_word():
    text = "First sentence is here. Second one has a clause; and a tail that is long."
    assert F.lead(text, 200) == text
    assert F.lead(text, 30) == "First sentence is here. …"
    assert F.lead(text, 60) == "First sentence is here. Second one has a clause …"
    long = "A first sentence (with a long parenthesis inside it, never cut) goes on and on."
    assert F.lead(long, 50) == "A first sentence …"
    assert F.lead("one " * 20, 30).endswith("one …")
    assert F.lead("unbreakable" * 10, 20) == "unbreakable" * 10  # no word to cut at: whole


# --------------------------------------------------------------------------------------------------
# the reading order and the glossary
# --------------------------------------------------------------------------------------------------
def test_the_reading_order_holds_every_notebook_once():
    stems = [s[0] for s in F.READING_ORDER]
    assert len(stems) == len(set(stems))
    assert {e.stem for e in fixes.NOTEBOOKS} - {fixes.START} <= set(stems)
    assert {f.stem for f in fixes.FIXES} <= set(stems)
    md = F.reading_markdown()
    assert all(f"[{s}]({s}.ipynb)" in md for s in stems)


def test_the_glossary_defines_every_acronym_the_fix_notebooks_use():
    defined = _defined()
    for fix in fixes.FIXES:
        words = set(
            re.findall(r"(?<![\w/-])[A-Z][A-Z0-9]*[A-Z0-9]s?(?![\w/-])", _markdown(fix.stem)))
        missing = {w for w in words - COMMON if w.lower() not in defined}
        assert not missing, f"{fix.stem} uses {sorted(missing)}, which the glossary lacks"


def test_the_glossary_defines_the_workbooks_jargon_where_a_fix_notebook_uses_it():
    defined = _defined()
    text = "\n".join(_markdown(f.stem) for f in fixes.FIXES).lower()
    used = [p for p in PHRASES if p.lower() in text]
    assert used, "no jargon found: the notebooks moved"
    assert [p for p in used if p.lower() not in defined] == []
    assert [t for t in ASKED if t.lower() not in defined] == []
    md = F.glossary_markdown()
    assert md.count("\n") == 1 + len(F.GLOSSARY)


def test_each_glossary_word_is_defined_once():
    words = [w.lower() for term, aliases, _ in F.GLOSSARY for w in (term, *aliases)]
    assert sorted({w for w in words if words.count(w) > 1}) == []


# --------------------------------------------------------------------------------------------------
# the notebooks table
# --------------------------------------------------------------------------------------------------
class _Cells(HTMLParser):

    def __init__(self):
        super().__init__()
        self.cells, self._in = [], False

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self._in, self.cells = True, self.cells + [""]

    def handle_endtag(self, tag):
        self._in = self._in and tag != "td"

    def handle_data(self, data):
        if self._in:
            self.cells[-1] += data


def test_no_cell_of_the_overview_is_cut():
    parser = _Cells()
    parser.feed(report.overview()._repr_html_())  # what a notebook shows
    cells = [" ".join(c.split()) for c in parser.cells]
    assert len(cells) == len(fixes.NOTEBOOKS) * 8
    assert not [c for c in cells if c.endswith(("...", "…"))]
    for e in fixes.NOTEBOOKS:
        assert " ".join(e.claim.replace("`", "").split()) in cells


def test_recorded_runs_in_a_few_words():

    def run(gpu, n, day):
        return SimpleNamespace(manifest=SimpleNamespace(gpu_name=gpu, gpu_count=n, date=day))

    found = [
        run("NVIDIA H200", 1, "2026-11-29"),
        run("NVIDIA H100 80GB HBM3", 1, "2026-11-21"),
        run("NVIDIA H200", 1, "2026-11-23"),
        run("NVIDIA H200", 4, "2026-11-27")
    ]
    assert report.recorded_summary(found) == (
        "H100 ×1: 1 run; H200 ×1: 2 runs; H200 ×4: 1 run; newest 2026-11-29")
    assert report.recorded_summary([]) == "none yet"


def test_the_overview_counts_the_real_engines_runs_beside_the_rebuilds():
    """01's real-engine runs are newer and more than its rebuild's: 00 counts each apart."""
    df = report.overview_frame().set_index("notebook")
    for column, experiment in (("rebuild runs", "pcg_gate"), ("real-engine runs",
                                                              "engine_pcg_gate")):
        found = runs.load_all_recorded(experiment)
        assert found and df.loc["01_pcg_gate", column] == report.recorded_summary(found)
    assert df.loc["00_start_here", "real-engine runs"] == "—"


def test_the_pcg_gate_row_claims_no_direction_for_the_first_token_that_01_does_not_find(rows):
    """01 times the first token on the release that refuses the graphs (eager prefill) against the
    one that captures them, per prompt length: where the ratio falls on both sides of 1, the row
    says the first token depends on the prompt and points at 01, and claims no slower one."""
    from sglab.core import engine_records, engine_stats
    from sglab.pcg_gate import serving, sglang

    rs = sglang.FIX.recorded_engine()
    df = engine_records.frame([*rs.shown, *rs.elsewhere])
    df = df[(df.model == serving.MODEL) & (df.tool == "serve") & (df.case == serving.ON)]
    if df.release.nunique() < 2:
        pytest.skip("no full-width serving run of both releases")
    n = engine_stats.numbers(df, "ttft").pivot_table(index=["input_len", "requests"],
                                                     columns="release", values="value")
    after = n[serving.FIXED] / n.drop(columns=serving.FIXED).iloc[:, 0]
    assert (after < 1).any() and (after > 1).any()  # captured faster at some lengths, not all
    row = next(r for r in rows if r["notebook"] == "01_pcg_gate")
    assert "slower first token" not in row["symptom"]
    assert "first token" in row["symptom"] and "prompt length" in row["symptom"]
    assert "(01 " in row["symptom"]
