"""The release table: the committed data/upstream/releases.csv is complete and consistent, agrees
with the installed releases where they are here, and ``sglab upstream --releases`` reads wheels,
falls back to the cache or the committed table without network, and says which."""

from __future__ import annotations

import hashlib
import re
import zipfile
from datetime import datetime
from pathlib import Path

import pytest

from sglab.tools import cli
from sglab.tools.fixes import FIXES, NAMES, get
from sglab.core import runs
from sglab.sglang import upstream
from sglab.sglang.upstream import RELEASE_STATES
from sglab.capture_sizes import sglang as capture_sizes
from sglab.pcg_gate import sglang as checks
from sglab.sglang import wheels as R

# first release whose state is "pr-era", as read from the wheels (the notebooks and the README rely
# on these)
FIRST_WITH_FIX = {
    "pcg_gate": "0.5.13", "workspace_floor": "0.5.13", "breakable_graph": "0.5.12",
    "swa_loc": "0.5.11", "grid_thw": "0.5.11", "capture_sizes": "0.5.11"
}
INSTALLED = runs.repo_root() / ".sglang" / "releases"


@pytest.fixture(scope="module")
def table():
    return R.load_table()


# -- the committed table
# ----------------------------------------------------------------------------------------
def test_table_has_every_release_from_0_5_10(table):
    versions = list(table["version"])
    assert (versions[0] == R.FIRST and versions == R.select(versions)
            and len(set(versions)) == len(versions))
    minors = sorted({int(v.split(".")[2]) for v in versions})
    assert minors == list(range(10, minors[-1] + 1)), "a 0.5.N release is missing"
    assert {"0.5.10.post1", "0.5.11", "0.5.12.post1", "0.5.13", "0.5.14", "0.5.23"} <= set(versions)
    assert list(table.columns) == R.columns(FIXES)


def test_table_rows_are_wheels_with_dates_and_reasons(table):
    dates = [datetime.fromisoformat(d) for d in table["build_date"]]
    assert dates == sorted(dates), "build dates should grow with the version"
    for r in table.to_dict("records"):
        assert re.fullmatch(r"[0-9a-f]{64}", r["sha256"])
        assert r["wheel"].startswith(f"sglang-{r['version']}-") and r["wheel"].endswith(".whl")
        for fix in NAMES:
            assert r[fix] in RELEASE_STATES, (r["version"], fix, r[fix])
            reason = r[f"{fix}_reason"]
            assert reason.strip() and "\n" not in reason, (r["version"], fix)


@pytest.mark.parametrize("fix,first", sorted(FIRST_WITH_FIX.items()))
def test_first_release_with_each_fix(table, fix, first):
    assert _first_release(fix, frame=table) == first
    row = R.timeline_row(fix, table)
    before = row[row["version"].map(R.parse_version) < R.parse_version(first)]
    assert set(before["state"]) <= {"absent", "before"}


def test_later_history_read_from_the_wheels(table):
    by = {(r["version"], fix): r[fix] for r in table.to_dict("records") for fix in NAMES}
    newest = table["version"].iloc[-1]
    assert by[("0.5.10.post1", "breakable_graph")] == by[("0.5.10.post1", "grid_thw")] == "absent"
    assert [by[(v, "capture_sizes")] for v in ("0.5.13.post1", "0.5.14", "0.5.21", "0.5.22")] == \
        ["pr-era", "regressed", "regressed", "changed"]
    assert _first_release("swa_loc", ("changed",), table) == "0.5.13"
    assert _first_release("breakable_graph", ("changed",), table) == "0.5.14"
    assert _first_release("grid_thw", ("changed",), table) == "0.5.17"
    assert by[(newest, "pcg_gate")] == by[(newest, "workspace_floor")] == "pr-era"
    reasons = dict(zip(table["version"], table["swa_loc_reason"]))
    assert "#24743 not yet" in reasons["0.5.11"] and "padded tail zeroed" in reasons["0.5.12"]


def test_no_fix_falls_back_to_its_pr_era_before(table):
    """Once a release has a fix (pr-era or changed), no later one is "before" or "absent": a loss
    must be classified "regressed" (a check that forgot a later layout would show up here)."""
    for fix in NAMES:
        seen_fix = False
        for v, s in zip(table["version"], table[fix]):
            seen_fix = seen_fix or s in ("pr-era", "changed")
            assert not (seen_fix and s in ("before", "absent")), (fix, v, s)


@pytest.mark.skipif(not INSTALLED.is_dir(),
                    reason="no SGLang release installed under .sglang/releases/")
def test_table_agrees_with_the_installed_releases(table):
    rows = {r["version"]: r for r in table.to_dict("records")}
    compared = 0
    for folder in sorted(INSTALLED.iterdir()):
        root = folder / "sglang"
        if not (root / "srt").is_dir() or folder.name not in rows:
            continue
        for fix in NAMES:
            v = upstream.check(get(fix), root=root)
            assert (v.status, v.detail) == (rows[folder.name][fix],
                                            rows[folder.name][f"{fix}_reason"]), \
                (folder.name, fix)
        compared += 1
    assert compared, "no installed release is in the table"


# -- wheels: reading, facts, the timeline
# -----------------------------------------------------------------------
KIMI_FIXED = ("class KimiK25ForConditionalGeneration:\n    @property\n    def "
              "model(self):\n        return 1\n\n    def __setattr__(self, name, value):\n        "
              "if name == 'model':\n            return\n")
PCG_FILTER = ("class PiecewiseCudaGraphRunner:\n    def __init__(self, r):\n"
              "        self.capture_num_tokens = [n for n in sizes if n % mul_base == 0]\n")


def make_wheel(folder: Path, version: str, files: dict, when=(2026, 5, 7, 0, 5, 8)) -> Path:
    path = Path(folder) / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in {"version.py": f"__version__ = '{version}'\n", **files}.items():
            z.writestr(zipfile.ZipInfo(f"sglang/{rel}", date_time=when), text)
        z.writestr(
            zipfile.ZipInfo(f"sglang-{version}.dist-info/RECORD", date_time=(2026, 5, 6, 1, 2, 3)),
            "")
    return path


def test_wheel_reader_facts_and_classification(tmp_path):
    path = make_wheel(tmp_path, "0.5.11",
                      {checks.KIMI_MODEL: KIMI_FIXED, capture_sizes.PIECEWISE_RUNNER: PCG_FILTER})
    read = R.reader(path)
    assert read(checks.KIMI_MODEL) == KIMI_FIXED and read("srt/nothing.py") is None
    facts = R.wheel_facts(path)
    assert facts["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert facts["build_date"] == "2026-05-07T00:05:08" and facts["wheel"] == path.name
    row = R.classify_wheel("0.5.11", path, FIXES)
    assert (row["pcg_gate"] == "pr-era" and row["capture_sizes"] == "pr-era"
            and row["grid_thw"] == "absent")
    assert set(row) == set(R.columns(FIXES))


def test_versions_are_final_releases_from_0_5_10_in_order():
    assert R.select(["0.5.11", "0.5.10.post1", "0.5.9", "0.5.12rc1", "0.5.10", "0.5.100",
                     "0.6.0.dev1"]) == \
        ["0.5.10", "0.5.10.post1", "0.5.11", "0.5.100"]
    with pytest.raises(ValueError, match="not a release version"):
        R.parse_version("0.5.12rc1")
    assert R.cached("0.5.1", Path("/nonexistent")) is None


def test_timeline_downloads_once_and_is_complete(tmp_path):
    cache, fetched = tmp_path / "wheels", []
    cache.mkdir()
    make_wheel(cache, "0.5.10", {})

    def fetch(v, dest):
        fetched.append(v)
        return make_wheel(dest, v, {checks.KIMI_MODEL: KIMI_FIXED})

    tl = R.timeline(FIXES, lister=lambda: ["0.5.10", "0.5.11"], fetch=fetch, cache=cache,
                    table=tmp_path / "none.csv", progress=False)
    assert fetched == ["0.5.11"] and tl.complete and list(tl.frame["source"]) == ["wheel", "wheel"]
    assert list(tl.frame["pcg_gate"]) == ["absent", "pr-era"] and set(
        tl.wheels) == {"0.5.10", "0.5.11"}
    assert any("1 downloaded now, 1 from the cache" in n for n in tl.notes)
    R.write_table(tl.frame, tmp_path / "t.csv")
    back = R.load_table(tmp_path / "t.csv")
    assert (list(back["version"]) == ["0.5.10", "0.5.11"]
            and back["pcg_gate_reason"][1] == tl.frame["pcg_gate_reason"][1])
    tl = R.timeline(FIXES, lister=lambda: ["0.5.10", "0.5.11"], fetch=fetch, cache=cache,
                    progress=False)
    assert fetched == ["0.5.11"], "a cached wheel is not downloaded again"


def _no_network(*args, **kwargs):
    raise R.NoNetwork("pip index failed: no route to the package index")


def test_without_network_the_cache_then_the_committed_table(tmp_path, monkeypatch, table):
    monkeypatch.setattr(R, "_pip", _no_network)
    cache = tmp_path / "wheels"
    cache.mkdir()
    make_wheel(cache, "0.5.11", {checks.KIMI_MODEL: KIMI_FIXED})
    tl = R.timeline(FIXES, cache=cache, progress=False)
    assert not tl.complete and any(n.startswith("no network (pip index failed") for n in tl.notes)
    assert list(tl.frame["version"]) == list(table["version"])
    src = dict(zip(tl.frame["version"], tl.frame["source"]))
    assert src.pop("0.5.11") == "wheel" and set(src.values()) == {"table"}
    # read from the cached wheel
    assert tl.frame.set_index("version").loc["0.5.11", "pcg_gate"] == "pr-era"
    assert any("taken from the committed table (no wheel here): 0.5.10, 0.5.10.post1," in n
               for n in tl.notes)
    # a listed release that is neither cached nor committed is reported, not invented
    tl = R.timeline(FIXES, ["0.5.11", "0.5.99"], cache=cache, progress=False)
    assert list(tl.frame["version"]) == ["0.5.11"] and any(
        "not shown" in n and "0.5.99" in n for n in tl.notes)


def test_cli_without_network_says_where_each_state_came_from(tmp_path, monkeypatch, capsys, table):
    monkeypatch.setattr(R, "_pip", _no_network)
    monkeypatch.setattr(R, "cache_dir", lambda: tmp_path / "empty-cache")
    committed = R.table_path().read_bytes()
    assert cli.main(["upstream", "--releases", "--figure", ""]) == 0
    out = capsys.readouterr().out
    assert "no network (pip index failed: no route to the package index)" in out
    assert "release list: committed table + cached wheels" in out
    assert ("classified from wheels: 0" in out
            and "taken from the committed table (no wheel here): 0.5.10," in out)
    assert "read_from" in out and "data/upstream/ not rewritten" in out
    assert R.table_path().read_bytes() == committed
    assert cli.main(["upstream", "--releases", "0.5.13", "--offline", "--figure", ""]) == 0
    out = capsys.readouterr().out
    assert "offline: nothing downloaded" in out and "only the listed releases" in out
    assert re.search(r"0\.5\.13 +\S+ +pr-era +pr-era +pr-era +changed +pr-era +pr-era", out)


def test_cli_errors_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(R, "_pip", _no_network)
    for argv, message in ((["--releases", "0.5.12rc1",
                            "--offline"], "not a release version: '0.5.12rc1'"),
                          (["--releases", "--root", str(tmp_path)], "do not go together"),
                          (["--root", str(tmp_path)], "not an SGLang package folder")):
        assert cli.main(["upstream", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("sglab upstream: ") and message in err[0], err


def test_no_write_writes_neither_the_table_nor_the_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(R, "_pip", _no_network)
    monkeypatch.setattr(R, "cache_dir", lambda: tmp_path / "empty-cache")
    monkeypatch.chdir(tmp_path)  # where the default figure, reports/upstream_releases.png, goes
    committed = R.table_path().read_bytes()
    assert cli.main(["upstream", "--releases", "0.5.13", "--offline", "--no-write"]) == 0
    assert "figure not saved (--no-write)" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [] and R.table_path().read_bytes() == committed


def test_without_sglang_or_without_releases_it_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(upstream, "installed", lambda: None)
    for argv, says in (([], "SGLang is not installed here (`pip install --no-deps sglang`: "),
                       (["--offline"], "--offline: for --releases only (the installed SGLang"),
                       (["--no-write", "--figure", "x.png"], "--no-write and --figure: for ")):
        assert cli.main(["upstream", *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"sglab upstream: {says}") and err.count("\n") == 1


def test_cli_says_when_a_release_does_not_exist(tmp_path, monkeypatch, capsys):

    def pip(args, timeout):
        raise R.NoSuchRelease("No matching distribution found for sglang==9.9.9")

    monkeypatch.setattr(R, "_pip", pip)
    monkeypatch.setattr(R, "cache_dir", lambda: tmp_path / "empty-cache")
    assert cli.main(["upstream", "--releases", "9.9.9", "--figure", ""]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == ("sglab upstream: no such SGLang release on the package index: "
                                    "9.9.9")
    assert captured.out == ""


def test_released_draws_a_fixs_timeline_row_once_per_session(monkeypatch):
    """A notebook shows several released hunks of one fix (04: #23552 and #24743); the release
    timeline strip above them is drawn once."""
    from sglab.core import notebook
    from sglab.sglang import compare, hunks

    drawn, shown = [], []
    monkeypatch.setattr(compare, "_TIMELINE_DRAWN", set())
    monkeypatch.setattr(R, "timeline_row_figure", lambda fix: f"strip {fix.name}")
    monkeypatch.setattr(notebook, "show_figure", drawn.append)
    monkeypatch.setattr(notebook, "show_table", shown.append)
    monkeypatch.setattr(hunks, "show", lambda fix, rebuilt, **kw: ("beside", kw.get("pr")))
    fix = get("swa_loc")
    compare.released(fix, object, symbol="x")
    compare.released(fix, object, symbol="y", pr=24743)
    assert drawn == ["strip swa_loc"] and shown == [("beside", None), ("beside", 24743)]
    compare.released(get("grid_thw"), object)
    assert drawn == ["strip swa_loc", "strip grid_thw"]


def _first_release(fix: str, states=("pr-era",), frame=None) -> str | None:
    """The oldest release whose state for ``fix`` is one of ``states``."""
    row = R.timeline_row(fix, frame)
    hits = row[row["state"].isin(states)]
    return None if hits.empty else hits["version"].iloc[0]
