"""The release system stays readable: no module of ``lib/sglab/sglang`` over 600 lines, and each
says what it is in at most 8 lines."""

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[2] / "lib" / "sglab" / "sglang"


def test_every_module_is_short_and_says_what_it_is_briefly():
    long, wordy = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 600:
            long.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        first = ast.parse(text).body[0]
        assert isinstance(first, ast.Expr) and isinstance(first.value.value, str), path
        if first.end_lineno - first.lineno + 1 > 8:
            wordy.append(f"{path.relative_to(PACKAGE)}: {first.end_lineno - first.lineno + 1}")
    assert not long and not wordy, (long, wordy)
