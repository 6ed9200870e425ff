"""The committed PR hunks (data/upstream/<fix>/pr<N>.*): they load, their windows match the release
table, their text is what the released files hold (checked against installed releases and cached
wheels where here), and they render as a coloured diff, as plain text, and beside a rebuilt
function. Also the timeline figures."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglab.core import runs
from sglab.sglang import upstream
from sglab.sglang import hunks as H
from sglab.sglang import wheels as R
from sglab.sglang.hunks import Rendered, diff_html, render_beside
from sglab.sglang.wheels import STATE_COLOURS, timeline_figure, timeline_row_figure
from sglab.tools.fixes import FIXES, NAMES, get


SPECS = [(f, s) for f in FIXES for s in f.hunks]

INSTALLED = runs.repo_root() / ".sglang" / "releases"
# one line each PR added, as released (the reason the hunk exists)
ADDED = {("pcg_gate", 26382): '+    if name == "model":',
         ("workspace_floor", 26382): "+                    max_token_num=max(x.shape[0], 2048),",
         ("breakable_graph", 24662): "+        self.layer_model.forward = replay_layer_forward",
         ("swa_loc", 23552): "+        self.model_runner.token_to_kv_pool.set_swa_loc(",
         ("swa_loc", 24743): "+            self.out_cache_loc_swa.zero_()",
         ("grid_thw", 22858): "+    grid_thws = grid_thws.cpu()",
         ("capture_sizes", 23972): '+        ), f"No piecewise CUDA graph capture sizes are '
         'multiples of {mul_base}"'}


@pytest.fixture(scope="module")
def table():
    return R.load_table()


@pytest.fixture(scope="module", params=SPECS, ids=lambda fs: f"{fs[0].name}-{fs[1].pr}")
def pair(request):
    fix, spec = request.param
    return fix, spec, H.load(fix, spec.pr)


def test_every_fix_has_its_hunk():
    assert [f.name for f in FIXES if f.hunks] == list(NAMES)
    assert {(f.name, s.pr) for f, s in SPECS} == set(ADDED)
    assert all(f.hunks[0].pr == f.prs[0] for f in FIXES)


def test_hunk_window_is_consecutive_releases_matching_the_table(pair, table):
    fix, spec, hunk = pair
    versions = list(table["version"])
    assert versions.index(hunk.after_version) == versions.index(hunk.before_version) + 1
    if spec is fix.hunks[0]:  # the main PR: the first release the check calls pr-era
        assert hunk.after_version == _first_release(fix.name, frame=table)
    rows = table.set_index("version")
    assert hunk.before_wheel["sha256"] == rows.loc[hunk.before_version, "sha256"]
    assert hunk.after_wheel["wheel"] == rows.loc[hunk.after_version, "wheel"]


def test_hunk_text_is_consistent_and_shows_the_change(pair):
    fix, spec, hunk = pair
    assert hunk.symbols == spec.symbols and hunk.paths[
        0] == f"sglang/{spec.symbols[0].split('::')[0]}"
    assert hunk.diff == H.unified(hunk.before, hunk.after, hunk.before_version, hunk.after_version)
    assert ADDED[(fix.name, spec.pr)] in hunk.diff.splitlines()
    after = hunk.blocks("after")
    assert list(after) == [s.split("::")[1] for s in spec.symbols] and all(after.values())
    assert list(hunk.blocks("before")) == list(after)


def test_symbols_new_in_the_pr_are_marked_absent_before():
    pcg = H.load(get("pcg_gate"))
    assert pcg.blocks("before") == {
        "KimiK25ForConditionalGeneration.model": None,
        "KimiK25ForConditionalGeneration.__setattr__": None
    }
    grid = H.load(get("grid_thw")).blocks(
        "before")  # the GPU processor arrived together with the fix
    assert grid["KimiGPUProcessorWrapper._gpu_call"] is None
    assert "item.grid_thws" in grid["KimiK25ForConditionalGeneration.get_image_feature"]


def test_hunks_match_the_cached_wheels():
    """Where the wheel cache holds both releases of a window, rebuild the hunk from them: same
    files. `make test` fetches them (``tests.sglang_answers.fetch_hunk_wheels``), so in CI every
    hunk is rebuilt."""
    import os

    rebuilt = 0
    for fix, spec in SPECS:
        hunk = H.load(fix, spec.pr)
        paths = [R.cached(v, R.cache_dir()) for v in (hunk.before_version, hunk.after_version)]
        if None in paths:
            continue
        rb, ra = R.reader(paths[0]), R.reader(paths[1])
        again = H.build(spec, fix.name, (hunk.before_version, rb, R.wheel_facts(paths[0])),
                        (hunk.after_version, ra, R.wheel_facts(paths[1])))
        assert again == hunk
        rebuilt += 1
    if os.environ.get("CI"):
        assert rebuilt == len(SPECS), "make test fetches every window's wheel"
    elif not rebuilt:
        pytest.skip("no wheel cached under .sglang/wheels/ (make test fetches them)")


def test_the_wheels_fetched_for_the_hunks_are_the_windows_releases():
    from tests import sglang_answers

    assert sglang_answers.hunk_versions() == sorted({
        v
        for fix, spec in SPECS
        for v in (H.load(fix, spec.pr).before_version, H.load(fix, spec.pr).after_version)
    })


def test_find_window_and_its_errors():
    spec = H.Spec(1, ("srt/a.py::f",), first_with=lambda read: read("srt/a.py") is not None)
    files = {"0.1": {}, "0.2": {}, "0.3": {"srt/a.py": "def f():\n    return 1\n"}}
    reader = lambda v: files[v].get  # noqa: E731
    demo = SimpleNamespace(name="demo")
    assert H.find_window(spec, demo, ["0.1", "0.2", "0.3"], reader) == ("0.2", "0.3")
    with pytest.raises(ValueError, match="already in 0.3, the oldest release read"):
        H.find_window(spec, demo, ["0.3"], reader)
    with pytest.raises(ValueError, match="no release among 0.1..0.2"):
        H.find_window(spec, demo, ["0.1", "0.2"], reader)
    hunk = H.build(spec, "demo", ("0.2", reader("0.2"), {}),
                   ("0.3", reader("0.3"), {"wheel": "w", "sha256": "s"}))
    assert hunk.blocks("before") == {"f": None} and hunk.blocks("after") == {
        "f": "def f():\n    return 1\n"
    }


def test_write_then_load_round_trip(tmp_path):
    hunk = H.load(get("workspace_floor"))
    H.write(hunk, root=tmp_path)
    assert H.load(get("workspace_floor"), root=tmp_path) == hunk
    with pytest.raises(FileNotFoundError, match="sglab upstream --releases"):
        H.load(get("capture_sizes"), root=tmp_path)


def test_data_upstream_stays_small():
    total = sum(p.stat().st_size for p in upstream.data_dir().rglob("*") if p.is_file())
    assert total < 400_000, f"data/upstream holds {total} bytes"


# -- display
# --------------------------------------------------------------------------------------------------
def test_show_renders_html_with_plain_text_fallback():
    shown = H.show(get("swa_loc"), pr=24743)
    assert isinstance(shown, Rendered)
    assert repr(shown).startswith("sgl-project/sglang#24743 · 0.5.11 → 0.5.12 · "
                                  "sglang/srt/model_executor/")
    html = shown._repr_html_()
    added = re.findall(r'<span style="background:#e6ffec[^"]*">([^<]*)</span>', html)
    assert "+            self.out_cache_loc_swa.zero_()" in added
    assert "torch.int64" in " ".join(
        re.findall(r'<span style="background:#ffebe9[^"]*">([^<]*)</span>', html))
    assert H.hunk_text(H.load(get("pcg_gate"))).splitlines()[1] == "--- sglang 0.5.12.post1"


def test_diff_html_escapes_and_colours_each_line():
    out = diff_html("--- a\n+++ b\n@@ -1 +1 @@\n-x = a<b\n+x = a > b\n # ── sglang/srt/x.py · f\n "
                    "ctx")
    assert "a&lt;b" in out and "a &gt; b" in out and out.count("<span") == 7
    assert 'background:#eef4fb' in out and "font-weight:bold" in out


def rebuilt_setattr(self, name, value):
    """A stand-in for a rebuilt function shown beside the released one."""
    if name == "model":
        return
    object.__setattr__(self, name, value)


# a rebuilt capture longer than SHORT lines: only the preset corresponds to #23552's change
REBUILT_CAPTURE = ("mine.capture", """def capture(self, bs):
    \"\"\"A docstring that names out_cache_loc_swa and set_swa_loc, which must not count.\"\"\"
    num_tokens = bs
    for _ in range(2):
        self._run_once(num_tokens)
    # the preset, before capture
    if self.preset and self.buffers.out_cache_loc_swa is not None:
        self.pool.set_swa_loc(self.buffers.out_cache_loc_swa[:num_tokens])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        self._run_once(num_tokens)
    self.graphs[bs] = graph
    calls = self.pool.translate_calls
    self.counts[bs] = calls
    return graph
""")
CAPTURE = "CudaGraphRunner.capture_one_batch_size"


def test_beside_shows_the_changed_lines_with_three_of_context_not_the_whole_function():
    hunk = H.load(get("swa_loc"), 23552)
    released = hunk.blocks("after")[CAPTURE].splitlines()
    text = repr(render_beside(hunk, REBUILT_CAPTURE, symbol=CAPTURE))
    lines = text.splitlines()
    assert len(lines) < 40 < len(released), "a hunk with context, not the released function"
    assert lines[0] == (f"== sglang 0.5.11 · {CAPTURE}: changed from 0.5.10.post1 (#23552's "
                        "release window)")
    # the preset with three lines of context either side, as `diff -U3` gives them
    want = ("+        self.model_runner.token_to_kv_pool.set_swa_loc(", "     for _ in range(2):")
    at = [lines.index(w) for w in want]
    assert lines[at[0] - 9:at[0] - 6] == [
        "         return logits_output_or_pp_proxy_tensors", " ",
        "     self.deepep_adapter.capture(is_extend_in_batch=False)"
    ]
    assert lines[at[1] + 1] == "         self.device_module.synchronize()"
    assert at[1] - at[0] == 4
    # the window's other changes to the function, which the rebuild does not model: a line each
    left_out = [
        ln for ln in lines if ln.endswith("the rebuild leaves out (another change in this window)")
    ]
    assert len(left_out) == 3 and "attn_backend = self.attn_backend" not in text
    # the rebuilt lines that correspond, with "…" where lines are left out; not the docstring
    mine = text.split("== rebuilt: mine.capture (lines 6–9 of 15)\n")[1].splitlines()
    assert mine == [
        "…", "    # the preset, before capture",
        "    if self.preset and self.buffers.out_cache_loc_swa is not None:",
        "        self.pool.set_swa_loc(self.buffers.out_cache_loc_swa[:num_tokens])",
        "    graph = torch.cuda.CUDAGraph()", "…"
    ]


def test_pieces_are_the_symbols_unified_diff():
    import difflib

    hunk = H.load(get("capture_sizes"))
    sym = "PiecewiseCudaGraphRunner.__init__"
    before, after = (hunk.blocks(s)[sym].splitlines() for s in ("before", "after"))
    body = [
        ln for ln in list(difflib.unified_diff(before, after, n=3, lineterm=""))[2:]
        if not ln.startswith("@@")
    ]
    found = H.pieces(hunk, sym)
    assert [ln for p in found for ln in p.lines] == body and len(found) == 2
    assert {p.version for p in found} == {"0.5.11"}


def test_each_hunk_links_to_its_first_changed_line_at_the_release_tag():
    from sglab.sglang import codepath

    hunk = H.load(get("swa_loc"), 24743)
    sym = "DecodeInputBuffers.populate_from_forward_batch"
    path = "srt/model_executor/cuda_graph_runner.py"
    text = codepath.read("0.5.12", path)
    if text is None:
        pytest.skip("sglang 0.5.12 is neither installed nor cached (make test caches its wheel)")
    head = next(
        ln
        for ln in repr(H.show(get("swa_loc"), rebuilt_setattr, pr=24743, symbol=sym)).splitlines()
        if ln.startswith("@@ "))
    m = re.fullmatch(
        r"@@ (\S+):(\d+) · (https://github.com/sgl-project/sglang/blob/v0.5.12/"
        r"python/sglang/(\S+)#L(\d+))", head)
    assert m and m.group(1) == m.group(4) == path and m.group(2) == m.group(5)
    first = next(ln for ln in H.pieces(hunk, sym)[0].lines if ln[0] == "+")
    assert text.splitlines()[int(m.group(2)) - 1].strip() == first[1:].strip()


def test_a_short_rebuild_is_shown_whole_and_a_new_symbol_says_so():
    hunk = H.load(get("pcg_gate"))
    sym = "KimiK25ForConditionalGeneration.__setattr__"
    shown = render_beside(hunk, rebuilt_setattr, symbol=sym)
    text = repr(shown)
    assert text.startswith(f"== sglang 0.5.13 · {sym}: new in 0.5.13 (#26382's release window)\n")
    assert "+def __setattr__(self, name, value):" in text
    assert text.endswith("    object.__setattr__(self, name, value)\n")
    assert f"== rebuilt: {__name__}.rebuilt_setattr\n" in text
    html = shown._repr_html_()
    assert "<table" in html and "href='https://github.com/sgl-project/sglang/blob/v0.5.13/" in html
    # first symbol by default; the same through the fix's name
    assert "def model(self)" in repr(render_beside(hunk, ("mine", "x = 1\n")))
    assert repr(H.show(get("pcg_gate"), rebuilt_setattr, symbol=sym)) == text
    with pytest.raises(KeyError, match="not a symbol of"):
        render_beside(hunk, ("mine", ""), symbol="Nope.nope")


def test_released_keeps_the_notebooks_call(capsys):
    from sglab.sglang import compare

    compare.released(get("swa_loc"), REBUILT_CAPTURE, symbol=CAPTURE)
    out = capsys.readouterr().out
    assert "self.model_runner.token_to_kv_pool.set_swa_loc(" in out and len(out.splitlines()) < 40


# -- figures
# --------------------------------------------------------------------------------------------------
def test_timeline_figure_colours_each_cell_by_state(table):
    from matplotlib.colors import to_hex

    fig = timeline_figure(table)
    ax = fig.axes[0]
    cells = ax.patches
    assert len(cells) == len(table) * len(NAMES)
    fixes = list(NAMES)
    want = [STATE_COLOURS[s] for fix in fixes for s in table[fix]]
    assert [to_hex(c.get_facecolor()) for c in cells] == want
    assert [t.get_text() for t in ax.get_yticklabels()] == fixes
    assert [t.get_text() for t in ax.get_xticklabels()] == list(table["version"])
    assert {t.get_text()
            for t in ax.get_legend().get_texts()
            } == {"absent", "before", "pr-era", "changed", "regressed"}


def test_timeline_row_figure_labels_each_run_of_states(table):
    from matplotlib.colors import to_hex

    fig = timeline_row_figure(get("capture_sizes"), table)
    ax = fig.axes[0]
    assert [to_hex(b.get_facecolor()) for b in ax.patches
            ] == [STATE_COLOURS[s] for s in table["capture_sizes"]]
    assert [t.get_text() for t in ax.texts] == ["before", "pr-era", "regressed", "changed"]
    with pytest.raises(KeyError):
        timeline_row_figure(SimpleNamespace(name="no_such_fix", title=""), table)


def test_timeline_row_from_the_committed_table():
    row = R.timeline_row("grid_thw")
    assert list(row.columns) == ["version", "build_date", "state", "reason"]
    assert row.set_index("version").loc["0.5.10.post1", "state"] == "absent"
    with pytest.raises(KeyError):
        R.timeline_row("no_such_fix")
    assert Path(R.table_path()).name == "releases.csv"


def test_hunks_match_the_installed_releases():
    """The committed hunks equal the symbols read again from the releases `make test` installs (both
    sides of every window whose two releases are pinned: 5 of the 7). In CI the releases must be
    there."""
    import os

    from sglab.sglang.releases import package_dir, release_installed

    def reader(version):
        root = package_dir(version)
        return lambda rel: (root / rel).read_text() if (root / rel).is_file() else None

    compared = 0
    for fix, spec in SPECS:
        hunk = H.load(fix, spec.pr)
        if not (release_installed(hunk.before_version) and release_installed(hunk.after_version)):
            continue
        assert H.side_text(reader(hunk.before_version),
                           spec.symbols) == hunk.before, (fix.name, "before")
        assert H.side_text(reader(hunk.after_version),
                           spec.symbols) == hunk.after, (fix.name, "after")
        compared += 1
    if os.environ.get("CI"):
        assert compared == 5
    elif not compared:
        pytest.skip("no pinned release pair installed (make sglang-releases)")


def _first_release(fix: str, states=("pr-era",), frame=None) -> str | None:
    """The oldest release whose state for ``fix`` is one of ``states``."""
    row = R.timeline_row(fix, frame)
    hits = row[row["state"].isin(states)]
    return None if hits.empty else hits["version"].iloc[0]
