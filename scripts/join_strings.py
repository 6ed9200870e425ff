"""Rejoin string literals split across lines, then refill them to the column limit (``make format``
runs it before the formatter):

    raise ValueError("world_size must be >= 2 (the fused "
                     "allreduce needs peers)")

becomes one literal where it fits, else fewer literals broken at spaces as late as the limit allows.
A run is left as it is where refilling would neither save a line nor narrow one too wide.

A run is two or more literals with nothing but a line break between them, each on its own line after
the first, all with the same quote, none triple-quoted, bytes or raw. Plain and ``f`` literals join
(a plain part with no braces becomes part of the ``f`` literal). An ``f`` literal is broken only at
a space outside its braces. Usage: ``python scripts/join_strings.py [--check] PATH...``.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path


LIMIT = 100
PREFIX = re.compile(r"^([a-zA-Z]*)(['\"])")


def _kind(tok: str) -> tuple[str, str] | None:
    """(``"f"`` or ``""``, quote) of a literal this tool may join, else None."""
    m = PREFIX.match(tok)
    if not m or tok[len(m.group(1)):].startswith(m.group(2) * 3):
        return None
    prefix = m.group(1).lower()
    if prefix not in ("", "f"):
        return None
    return prefix, m.group(2)


def _body(tok: str) -> str:
    return tok[len(PREFIX.match(tok).group(1)) + 1:-1]


def _pieces(body: str, f: bool) -> list[str]:
    """``body`` cut after each space outside an ``f`` literal's braces (each piece keeps its
    trailing spaces)."""
    out, cur, depth, i = [], "", 0, 0
    while i < len(body):
        ch = body[i]
        if f and depth == 0 and body[i:i + 2] in ("{{", "}}"):
            cur, i = cur + body[i:i + 2], i + 2
            continue
        cur += ch
        if f and ch == "{":
            depth += 1
        elif f and ch == "}":
            depth = max(depth - 1, 0)
        elif ch == " " and depth == 0 and (i + 1 == len(body) or body[i + 1] != " "):
            out.append(cur)
            cur = ""
        i += 1
    if cur:
        out.append(cur)
    return out


def _fill(pieces: list[str], first: int, rest: int, tail: int) -> list[str] | None:
    """Greedy fill: widths ``first`` for the first line's body, ``rest`` after; the last line also
    holds ``tail`` characters. None when a piece cannot fit."""
    lines, cur = [], ""
    for p in pieces:
        width = first if not lines else rest
        if cur and len(cur) + len(p) > width:
            lines.append(cur)
            cur = ""
        cur += p
    lines.append(cur)
    widths = [first] + [rest] * (len(lines) - 1)
    if any(len(x) > w for x, w in zip(lines, widths)):
        return None
    if len(lines[-1]) + tail > widths[-1]:
        return None
    return lines


def _runs(toks: list) -> list[list]:
    """Runs of joinable literals: each next literal directly after a line break."""
    runs, i = [], 0
    while i < len(toks):
        run = [toks[i]] if toks[i].type == tokenize.STRING and _kind(toks[i].string) else []
        while run and i + 2 < len(toks) and toks[i + 1].type == tokenize.NL \
                and toks[i + 2].type == tokenize.STRING and _kind(toks[i + 2].string) \
                and _kind(toks[i + 2].string)[1] == _kind(run[0].string)[1]:
            run.append(toks[i + 2])
            i += 2
        if len(run) > 1:
            runs.append(run)
        i += 1
    return runs


def _rewrite(lines: list[str], run: list) -> bool:
    """Refill one run in ``lines`` (in place); False where it cannot or nothing would change."""
    kinds = [_kind(t.string) for t in run]
    f = any(k[0] == "f" for k in kinds)
    if f and any(k[0] == "" and ("{" in t.string or "}" in t.string) for k, t in zip(kinds, run)):
        return False
    quote = kinds[0][1]
    body = "".join(_body(t.string) for t in run)
    if "\\N{" in body:
        return False
    a, z = run[0], run[-1]
    head = lines[a.start[0] - 1][:a.start[1]]
    tail = lines[z.end[0] - 1][z.end[1]:].rstrip("\n")
    indent = run[1].start[1]
    pre = ("f" if f else "") + quote
    wrap = len(pre) + 1
    got = _fill(_pieces(body, f), LIMIT - len(head) - wrap, LIMIT - indent - wrap, len(tail))
    wide = any(len(x.rstrip("\n")) > LIMIT for x in lines[a.start[0] - 1:z.end[0]])
    if got is None or (len(got) >= len(run) and not wide):
        return False  # refilled only where that saves a line or a line is too wide
    new = [head + pre + got[0] + quote]
    new += [" " * indent + pre + g + quote for g in got[1:]]
    new = [x + "\n" for x in new]
    new[-1] = new[-1][:-1] + tail + "\n"
    lines[a.start[0] - 1:z.end[0]] = new
    return True


def refill(text: str) -> str:
    """``text`` with every run refilled (bottom-up, so that line numbers above stay valid)."""
    lines = text.splitlines(keepends=True)
    toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for run in reversed(_runs(toks)):
        _rewrite(lines, run)
    return "".join(lines)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"]
    files = [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    changed = []
    for f in files:
        old = f.read_text()
        new = refill(old)
        if new != old:
            if ast.dump(ast.parse(new)) != ast.dump(ast.parse(old)):
                raise SystemExit(f"join_strings: refilling {f} would change its meaning")
            changed.append(f)
            if not check:
                f.write_text(new)
    for f in changed:
        print(f"{'would refill' if check else 'refilled'} strings in {f}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
