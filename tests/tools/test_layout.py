"""One layout for every Python file: the ``[tool.yapf]`` setting in pyproject.toml, and no string
literal split across lines where joining it would save a line (``make format`` fixes both).

yapf takes about a minute of CPU for the whole tree, so a file whose text passed once is
remembered by its hash (in the venv, beside the interpreter) and not checked again."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ("lib", "tests", "scripts", "notebooks", "jupyter_server_config.py")
PASSED = Path(sys.prefix) / ".sglab-layout-passed.json"

sys.path.insert(0, str(ROOT / "scripts"))
import join_strings  # noqa: E402


def _files() -> list[Path]:
    out = []
    for name in LAYOUT:
        p = ROOT / name
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return [f for f in out if "__pycache__" not in f.parts and ".ipynb_checkpoints" not in f.parts]


def _digest(f: Path) -> str:
    return hashlib.sha256(f.read_bytes()).hexdigest()


def test_every_python_file_has_the_one_layout():
    config = _digest(ROOT / "pyproject.toml") + _digest(ROOT / "scripts" / "join_strings.py")
    try:
        known = json.loads(PASSED.read_text())
    except (OSError, ValueError):
        known = {}
    if known.get("config") != config:
        known = {"config": config, "files": []}
    passed = set(known["files"])
    todo = [f for f in _files() if _digest(f) not in passed]
    if todo:
        split = [
            str(f.relative_to(ROOT))
            for f in todo if join_strings.refill(f.read_text()) != f.read_text()
        ]
        p = subprocess.run([sys.executable, "-m", "yapf", "--diff", "-p", *map(str, todo)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode in (0, 1), p.stderr
        unlike = sorted({
            line[4:].split("\t")[0].strip()
            for line in p.stdout.splitlines() if line.startswith("--- ")
        })
        assert not split and not unlike, (
            f"not in the one layout (run `make format`): strings to rejoin in {split}; yapf would "
            f"change {unlike}\n{p.stdout[:3000]}")
        try:
            PASSED.write_text(
                json.dumps({"config": config, "files": sorted(passed | {_digest(f)
                                                                        for f in todo})}))
        except OSError:
            pass  # a read-only venv: the next run checks everything again


def test_the_joiner_rejoins_a_split_literal_and_keeps_its_meaning():
    """Two literals on two lines become one where that fits, an ``f`` literal only at a space
    outside its braces; a run that would need as many lines stays as it is."""
    src = ('x = ("a b c "\n     "d e")\n'
           'y = (f"{1 + 2} "\n     f"{3}")\n'
           'z = ("' + "w " * 45 + '"\n     "' + "v " * 45 + '")\n')
    out = join_strings.refill(src)
    assert out.splitlines()[:2] == ['x = ("a b c d e")', 'y = (f"{1 + 2} {3}")']
    assert out.splitlines()[2:] == src.splitlines()[4:]
    assert join_strings._pieces("{a b} c d", True) == ["{a b} ", "c ", "d"]


def test_the_joiner_refuses_a_change_of_meaning(tmp_path, monkeypatch):
    f = tmp_path / "m.py"
    f.write_text('x = ("a "\n     "b")\n')
    monkeypatch.setattr(join_strings, "refill", lambda text: 'x = "a  b"\n')
    with pytest.raises(SystemExit, match="would change its meaning"):
        join_strings.main([str(f)])


COLUMNS = 100
SCRIPTS = ("Makefile", ".ci/run")  # beside every *.sh under scripts/


def _too_long(files, root: Path = ROOT) -> list[str]:
    """``path:line (N columns)`` for every line of ``files`` wider than :data:`COLUMNS` characters
    (code, comments and docstrings alike: yapf lays out code only)."""
    return [
        f"{f.relative_to(root)}:{i} ({len(line)} columns)" for f in files
        for i, line in enumerate(f.read_text(
            encoding="utf-8").splitlines(), 1) if len(line) > COLUMNS
    ]


def test_every_line_fits_100_columns(tmp_path):
    files = [*_files(), *sorted((ROOT / "scripts").glob("*.sh")), *(ROOT / s for s in SCRIPTS)]
    assert not _too_long(files)
    wide = tmp_path / "wide.py"
    wide.write_text("# " + "µ" * (COLUMNS - 2) + "\n# " + "x" * (COLUMNS - 1) + "\n")
    # characters, not bytes: the first line's µ are two bytes each
    assert _too_long([wide], tmp_path) == ["wide.py:2 (101 columns)"]


DOCS = ("README.md", "docs/operating.md", "docs/structure.md")


def _prose_too_long(text: str) -> list[int]:
    """The lines of a Markdown text wider than :data:`COLUMNS`, leaving out table rows and
    ```text blocks (a program's output, shown as it printed it)."""
    out, verbatim = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            verbatim = line.strip() == "```text"
            continue
        if len(line) > COLUMNS and not verbatim and not line.lstrip().startswith("|"):
            out.append(i)
    return out


def test_the_docs_prose_and_commands_fit_100_columns():
    wide = {d: _prose_too_long((ROOT / d).read_text(encoding="utf-8")) for d in DOCS}
    assert not any(wide.values()), wide
    long = "x" * (COLUMNS + 1)
    sample = f"{long}\n```bash\n{long}\n```\n```text\n{long}\n```\n| {long} |\n"
    assert _prose_too_long(sample) == [1, 3]


TOOLS = ROOT / "lib" / "sglab" / "tools"


def _pinning_commas(text: str) -> list[int]:
    """Lines of a trailing comma that pins one item per line (a comma, then only a line break and
    the closing bracket): yapf keeps such a layout, so it is checked here."""
    import io
    import tokenize

    toks = [
        t for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    ]
    return [
        a.start[0] for a, b in zip(toks, toks[1:])
        if a.string == "," and b.string in ")]}" and b.start[0] > a.start[0]
    ]


def test_the_tools_modules_are_short():
    """Every module of ``sglab.tools``: at most 600 lines, a docstring of at most 8, and no trailing
    comma pinning one item per line."""
    import ast

    long, wordy, pinned = [], [], []
    for f in sorted(TOOLS.glob("*.py")):
        text = f.read_text(encoding="utf-8")
        if len(text.splitlines()) > 600:
            long.append(f.name)
        body = ast.parse(text).body
        doc = body[0] if body and isinstance(body[0], ast.Expr) else None
        if doc is not None and doc.end_lineno - doc.lineno + 1 > 8:
            wordy.append(f.name)
        pinned += [f"{f.name}:{n}" for n in _pinning_commas(text)]
    assert not long and not wordy and not pinned, (long, wordy, pinned)
    assert _pinning_commas("f(\n    a,\n    b,\n)\n") == [3] and not _pinning_commas("f(a, b,)\n")


LIB = ROOT / "lib" / "sglab"


def _module_offenders(root: Path, skip=frozenset()) -> list[str]:
    """``path (N lines)`` of each module under ``root`` longer than 600 lines, and ``path
    (docstring of N lines)`` of each whose docstring is longer than 8."""
    import ast

    out = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if "__pycache__" in f.parts or rel in skip:
            continue
        text = f.read_text(encoding="utf-8")
        if len(text.splitlines()) > 600:
            out.append(f"{rel} ({len(text.splitlines())} lines)")
        body = ast.parse(text).body
        doc = body[0] if body and isinstance(body[0], ast.Expr) else None
        if doc is not None and isinstance(doc.value, ast.Constant) and isinstance(
                doc.value.value, str) and doc.end_lineno - doc.lineno + 1 > 8:
            out.append(f"{rel} (docstring of {doc.end_lineno - doc.lineno + 1} lines)")
    return out


def test_every_module_is_short_and_says_what_it_is_in_at_most_8_lines(tmp_path):
    offenders = _module_offenders(LIB)
    assert not offenders, "modules over 600 lines or with a docstring over 8: " + ", ".join(
        offenders)
    (tmp_path / "long.py").write_text('"""' + "a\n" * 8 + '"""\n' + "x = 1\n" * 600)
    (tmp_path / "ok.py").write_text('"""' + "a\n" * 7 + '"""\n' + "x = 1\n" * 592)
    assert _module_offenders(tmp_path) == ["long.py (609 lines)", "long.py (docstring of 9 lines)"]
