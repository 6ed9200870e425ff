"""The test session's kept recorded-mode report (:mod:`tests.recorded_report`): its key follows
every input it reads, and a kept run replaces the one before it whole."""

from tests import recorded_report as R


def _tree(root):
    for rel, text in (("lib/sglab/a.py", "A = 1\n"), ("notebooks/01_x.py", "# %%\n"),
                      ("data/recorded/x/run.csv", "v\n1\n"), ("data/runs/x/local.csv", "v\n2\n"),
                      ("pyproject.toml", "[project]\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_key_changes_with_every_input_and_with_nothing_else(tmp_path, monkeypatch):
    _tree(tmp_path)
    monkeypatch.setattr(R, "ROOT", tmp_path)
    monkeypatch.delenv("SGLAB_FRESH_REPORT", raising=False)
    first = R.inputs_key()
    (tmp_path / "notebooks" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "notebooks" / ".ipynb_checkpoints" / "01_x-checkpoint.py").write_text("old\n")
    monkeypatch.setenv("SGLAB_FRESH_REPORT", "1")
    assert R.inputs_key() == first  # a checkpoint and the fresh switch are not inputs
    seen = {first}
    for rel in ("lib/sglab/a.py", "notebooks/01_x.py", "data/recorded/x/run.csv",
                "data/runs/x/local.csv", "pyproject.toml"):
        (tmp_path / rel).write_text((tmp_path / rel).read_text() + "# edited\n")
        seen.add(R.inputs_key())
    monkeypatch.setenv("SGLAB_REAL", "recorded")
    seen.add(R.inputs_key())
    assert len(seen) == 7  # each edit, and the environment's SGLAB_ variable, made a new key


def test_a_kept_run_replaces_the_one_before_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "CACHE", tmp_path / "cache")
    for key, page in (("aaaa", "first"), ("bbbb", "second")):
        out = tmp_path / key
        out.mkdir()
        (out / "index.html").write_text(page)
        R.keep(out, f"8/8 ok ({page})", key)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["bbbb"]
    assert (tmp_path / "cache" / "bbbb" / "report" / "index.html").read_text() == "second"
    assert (tmp_path / "cache" / "bbbb" / R.SAID).read_text() == "8/8 ok (second)"


def test_a_copy_of_a_kept_run_names_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "CACHE", tmp_path / "cache")
    out, copy = tmp_path / "run" / "recorded-report", tmp_path / "later" / "recorded-report"
    out.mkdir(parents=True)
    R.keep(out, f"8/8 ok; index: {out}/index.html", "cccc")
    said = R.said_for(tmp_path / "cache" / "cccc" / "report", copy)
    assert said == f"8/8 ok; index: {copy}/index.html" and str(out) not in said
