"""Notebook 00's table of notebooks shows every cell whole."""

from html.parser import HTMLParser
from types import SimpleNamespace

from sglab.tools import fixes, report


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
    assert len(cells) == len(fixes.NOTEBOOKS) * 7
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
