"""Each PR as it was released: the symbols it touched (found by name, never by line numbers) in the
last release without it and the first with it, committed under ``data/upstream/<fix>/``; shown
whole, or one symbol's changes beside the rebuilt lines that correspond (:func:`render_beside`)."""

from __future__ import annotations

import ast
import builtins
import difflib
import html
import inspect
import json
import keyword
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from sglab.sglang import source as S
from sglab.sglang.fix import Spec
from sglab.sglang.upstream import data_dir, run_check


ABSENT = "# (not in this release)"
HEADER = "# ── sglang/"


@dataclass(frozen=True)
class Hunk:
    """One PR's symbols before and after, as released, each under a :data:`HEADER` line."""

    fix: str
    pr: int
    symbols: tuple[str, ...]
    before_version: str
    after_version: str
    before: str
    after: str
    diff: str
    before_wheel: dict
    after_wheel: dict

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f"sglang/{s.split('::')[0]}" for s in self.symbols))

    @property
    def title(self) -> str:
        return f"sgl-project/sglang#{self.pr} · {self.before_version} → {self.after_version}"

    def blocks(self, side: str = "after") -> dict[str, str | None]:
        """``{qualname: text}`` of one side (None where the symbol was not in that release)."""
        out, name, lines = {}, None, []
        for line in getattr(self, side).splitlines(keepends=True) + [HEADER + "end · end\n"]:
            if line.startswith(HEADER):
                if name is not None:
                    body = "".join(lines).strip("\n")
                    out[name] = None if body == ABSENT else body + "\n"
                name, lines = line.rstrip("\n").split(" · ", 1)[1], []
            else:
                lines.append(line)
        return out


def side_text(read, symbols) -> str:
    """Every symbol of one side, each under its header line (its text, or :data:`ABSENT`)."""
    blocks = []
    for path, qual in (s.split("::") for s in symbols):
        text = S.symbol_text(read(path), qual)
        blocks.append(f"{HEADER}{path} · {qual}\n{text if text is not None else ABSENT + chr(10)}")
    return "\n".join(blocks)


def unified(before: str, after: str, before_version: str, after_version: str) -> str:
    lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    diff = difflib.unified_diff(*lines, fromfile=f"sglang {before_version}",
                                tofile=f"sglang {after_version}", n=3)
    return "".join(diff)


def find_window(spec: Spec, fix, versions: list[str], reader_for) -> tuple[str, str]:
    """(last release without the change, first with it) among ``versions`` (oldest first)."""
    for i, v in enumerate(versions):
        read = reader_for(v)
        if (spec.first_with(read)
                if spec.first_with is not None else run_check(fix, read).status == "pr-era"):
            if i == 0:
                raise ValueError(f"{fix.name} #{spec.pr}: already in {v}, the oldest release read")
            return versions[i - 1], v
    raise ValueError(f"{fix.name} #{spec.pr}: no release among {versions[0]}..{versions[-1]} has "
                     "it")


def build(spec: Spec, fix: str, before: tuple, after: tuple) -> Hunk:
    """``before``/``after`` are ``(version, read, wheel_facts)``."""
    (bv, bread, bfacts), (av, aread, afacts) = before, after
    btext, atext = side_text(bread, spec.symbols), side_text(aread, spec.symbols)
    keep = lambda f: {k: f[k] for k in ("wheel", "sha256", "build_date") if k in f}  # noqa: E731
    return Hunk(fix, spec.pr, spec.symbols, bv, av, btext, atext, unified(btext, atext, bv, av),
                keep(bfacts), keep(afacts))


META = ("fix", "pr", "paths", "symbols", "before_version", "after_version", "before_wheel",
        "after_wheel")
SIDES = ("before", "after")


def _stem(fix: str, pr: int, root: Path | None) -> Path:
    return Path(root or data_dir()) / fix / f"pr{pr}"


def write(hunk: Hunk, root: Path | None = None) -> Path:
    stem = _stem(hunk.fix, hunk.pr, root)
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(hunk, k) for k in META}
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    for side in SIDES:
        Path(f"{stem}.{side}.txt").write_text(getattr(hunk, side))
    Path(f"{stem}.diff").write_text(hunk.diff)
    return stem.parent


def load(fix, pr: int | None = None, *, root: Path | None = None) -> Hunk:
    """The committed hunk of the record ``fix`` (its main PR, or ``pr``), as released."""
    stem = _stem(fix.name, fix.prs[0] if pr is None else pr, root)
    meta_path = stem.with_suffix(".json")
    if not meta_path.exists():
        raise FileNotFoundError(f"no committed hunk {meta_path} (sglab upstream --releases writes "
                                "it)")
    meta = json.loads(meta_path.read_text())
    fields = {k: meta[k] for k in META if k not in ("paths", "symbols")}
    sides = {side: Path(f"{stem}.{side}.txt").read_text() for side in SIDES}
    return Hunk(**fields, **sides, symbols=tuple(meta["symbols"]),
                diff=Path(f"{stem}.diff").read_text())


def generate(fixes, versions: list[str], wheels: dict, root: Path | None = None) -> list[Hunk]:
    """Find every hunk spec's window among ``versions`` in ``wheels`` and write its hunk."""
    from sglab.sglang.wheels import reader, wheel_facts

    readers = {v: reader(path) for v, path in wheels.items()}
    out = []
    for fix, spec in ((f, sp) for f in fixes for sp in f.hunks):
        bv, av = find_window(spec, fix, versions, readers.__getitem__)
        hunk = build(spec, fix.name, (bv, readers[bv], wheel_facts(wheels[bv])),
                     (av, readers[av], wheel_facts(wheels[av])))
        write(hunk, root)
        out.append(hunk)
    return out


def show(fix, rebuilt=None, *, pr: int | None = None, symbol: str | None = None):
    """The committed hunk of ``fix``: whole, or beside ``rebuilt`` (:func:`render_beside`)."""
    hunk = load(fix, pr)
    if rebuilt is not None:
        return render_beside(hunk, rebuilt, symbol=symbol)
    diff = diff_html(hunk.diff) if hunk.diff else "<i>no change in these symbols</i>"
    return Rendered(
        f'<div><div style="font-size:12px;color:#57606a;margin:2px 0 4px">'
        f"{html.escape(_caption(hunk))}</div>{diff}</div>", hunk_text(hunk))


_STYLE = {
    "+": "background:#e6ffec;color:#1a7f37", "-": "background:#ffebe9;color:#b42318",
    "@": "background:#eef4fb;color:#4a6fa5", "#": "color:#6e7781;font-weight:bold", " ": ""
}
_PRE = ("font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;line-height:1.35;"
        "margin:0;padding:6px 8px;overflow-x:auto;border:1px solid #d0d7de;border-radius:4px;"
        "background:#fff;white-space:pre;word-break:normal;overflow-wrap:normal")


@dataclass(frozen=True, repr=False)
class Rendered:
    """HTML for a notebook, plain text everywhere else."""

    html: str
    text: str

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def _kind(line: str) -> str:
    """"+", "-", "@" (hunk range), "#" (file or symbol header) or " " (context)."""
    if line.startswith(("+++", "---")) or line[1:].startswith(HEADER):
        return "#"
    if line.startswith("@@"):
        return "@"
    return line[0] if line[:1] in ("+", "-") else " "


def diff_html(diff: str) -> str:
    """A unified diff as a ``<pre>``, one ``<span>`` per line coloured by its first character."""
    spans = []
    for line in diff.splitlines():
        style = _STYLE[_kind(line)]
        attr = f' style="{style};display:block"' if style else ' style="display:block"'
        spans.append(f"<span{attr}>{html.escape(line) or '&nbsp;'}</span>")
    return f'<pre style="{_PRE}">{"".join(spans)}</pre>'


def _caption(hunk) -> str:
    files = ", ".join(hunk.paths)
    return (f"{hunk.title} · {files} · wheels {hunk.before_wheel.get('wheel', '?')} → "
            f"{hunk.after_wheel.get('wheel', '?')}")


def hunk_text(hunk) -> str:
    return f"{_caption(hunk)}\n{hunk.diff or '(no change in these symbols)'}"


CONTEXT = 3  # lines of context around each change (as ``diff -U3``)
SHORT = 12  # a rebuilt function or class this short is shown whole
ALIKE = 0.75  # how alike (difflib's ratio) a rebuilt line and a released one must be to correspond
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMON = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}


@dataclass(frozen=True)
class Piece:
    """One hunk of a symbol's change: the release and line of its first change; its lines."""

    version: str
    line: int
    lines: tuple[str, ...]


def pieces(hunk, symbol: str, context: int = CONTEXT) -> list[Piece]:
    """The hunks of ``symbol``'s change across the window, each with ``context`` lines around it."""
    before, after = _sides(hunk, symbol)
    out = []
    for group in difflib.SequenceMatcher(None, before, after,
                                         autojunk=False).get_grouped_opcodes(context):
        lines, anchor = [], None
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + ln for ln in after[j1:j2]]
                continue
            if anchor is None:
                anchor = (hunk.after_version, j1 + 1) if j2 > j1 else (hunk.before_version, i1 + 1)
            lines += ["-" + ln for ln in before[i1:i2]] + ["+" + ln for ln in after[j1:j2]]
        out.append(Piece(*anchor, tuple(lines)))
    return out


def _sides(hunk, symbol: str) -> tuple[list[str], list[str]]:
    return tuple((hunk.blocks(side).get(symbol) or "").splitlines() for side in ("before", "after"))


def _names(text: str) -> set[str]:
    return {n for n in _NAME.findall(text) if n not in _COMMON and len(n) > 2}


def _code_lines(text: str) -> list[str]:
    """The lines of ``text`` (a function or a class, dedented), its docstrings blanked."""
    lines, tree = text.splitlines(), S.parse(text)
    for node in ast.walk(tree) if tree is not None else ():
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            for k in range(first.lineno - 1, first.end_lineno):
                lines[k] = ""
    return lines


def _code(line: str) -> str:
    """A line without its comment (roughly: from a ``#`` on), stripped."""
    return re.sub(r"#.*$", "", line).strip()


def matches(hunk, symbol: str, rebuilt: str) -> list[set[int]]:
    """Per piece of :func:`pieces`, the 0-based rebuilt lines that correspond to its changes."""
    before, after = _sides(hunk, symbol)
    ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    same = _names("\n".join(
        _code(ln) for tag, _, _, j1, j2 in ops if tag == "equal" for ln in after[j1:j2]))
    ours = [_code(ln) for ln in _code_lines(rebuilt)]
    out = []
    for p in pieces(hunk, symbol):
        changed = [c for ln in p.lines if ln[0] != " " for c in [_code(ln[1:])] if _names(c)]
        alike = {
            i
            for i, mine in enumerate(ours) if _names(mine) and any(
                difflib.SequenceMatcher(None, mine, c).ratio() >= ALIKE for c in changed)
        }
        wanted = _names("\n".join(changed)) - same
        out.append(alike | {i for i, mine in enumerate(ours) if _names(mine) & wanted})
    return out


def corresponding(rebuilt: str, hits: set[int], around: int = 1) -> list[tuple[int, int]]:
    """``[(first, last)]`` (inclusive) of the rebuilt lines ``hits``, with context."""
    lines = rebuilt.splitlines()
    if len(lines) <= SHORT:
        return [(0, len(lines) - 1)] if lines else []
    if not hits:
        return [(0, SHORT - 1)]
    code = _code_lines(rebuilt)
    doc = {k for k, ln in enumerate(lines) if ln.strip() and not code[k]}
    spans: list[list[int]] = []
    for i in sorted(hits):
        lo, hi = max(0, i - around), min(len(lines) - 1, i + around)
        lo, hi = next(k for k in range(lo, i + 1) if k not in doc), next(
            k for k in range(hi, i - 1, -1) if k not in doc)
        while lo > 0 and lines[lo - 1].lstrip().startswith("#"):
            lo -= 1
        if spans and all(k in doc for k in range(spans[-1][1] + 1, lo)):
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    return [(lo, hi) for lo, hi in spans]


def excerpt(text: str, spans: list[tuple[int, int]]) -> str:
    """The lines of ``spans``, with ``…`` where lines are left out."""
    lines, out, last = text.splitlines(), [], -1
    for lo, hi in spans:
        if lo > last + 1:
            out.append("…")
        out += lines[lo:hi + 1]
        last = hi
    if last < len(lines) - 1:
        out.append("…")
    return "\n".join(out) + "\n"


def render_beside(hunk, rebuilt, *, symbol: str | None = None) -> Rendered:
    """What the window changed in the released ``symbol``, beside the rebuilt lines."""
    from sglab.sglang import codepath

    after = hunk.blocks("after")
    if symbol is None:
        symbol = next(iter(after))
    if symbol not in after:
        raise KeyError(f"{symbol!r} is not a symbol of {hunk.title}; there: {list(after)}")
    path = next(s.split("::")[0] for s in hunk.symbols if s.split("::")[1] == symbol)
    node = codepath.Node(path, symbol)
    if isinstance(rebuilt, tuple):  # a (name, text) pair given as is
        name, text = rebuilt
    else:  # the rebuilt function or class
        name = f"{rebuilt.__module__}.{rebuilt.__qualname__}"
        text = textwrap.dedent(inspect.getsource(rebuilt))
    found = list(zip(pieces(hunk, symbol), matches(hunk, symbol, text)))
    kept = [bool(hits) for _, hits in found]
    if not any(kept):
        kept = [True] * len(found)
    spans = corresponding(text, set().union(*(h for (_, h), k in zip(found, kept) if k)))
    shown, n = excerpt(text, spans), len(text.splitlines())
    how = (f"new in {hunk.after_version}"
           if hunk.blocks("before")[symbol] is None else f"changed from {hunk.before_version}")
    left_title = f"sglang {hunk.after_version} · {symbol}: {how} (#{hunk.pr}'s release window)"
    right_title = f"rebuilt: {name}" + ("" if spans == [(0, n - 1)] else
                                        f" (lines {spans[0][0] + 1}–{spans[-1][1] + 1} of {n})")
    plain, left = [f"== {left_title}"], []
    for (p, _), keep in zip(found, kept):
        start = codepath.line_of(p.version, node)
        where = f"{path}:{start + p.line - 1}" if start else f"{path}, line {p.line} of {symbol}"
        link = codepath.url(p.version, node, p.line - 1)
        head = f"@@ {where} · {link}"
        a = f"<a href='{html.escape(link)}'>{html.escape(f'{where} · sglang {p.version}')}</a>"
        if keep:
            plain += [head, *p.lines]
            left.append(f"<div style='font-size:12px;margin:4px 0 2px'>{a}</div>"
                        f"{diff_html(chr(10).join(p.lines))}")
        else:
            note = (f"{sum(ln[0] != ' ' for ln in p.lines)} changed lines the rebuild leaves out "
                    "(another change in this window)")
            plain.append(f"{head}: {note}")
            left.append(f"<div style='font-size:12px;margin:4px 0;color:#57606a'>{a}: "
                        f"{html.escape(note)}</div>")
    plain += [f"== {right_title}", shown.rstrip("\n")]
    cell = 'style="vertical-align:top;padding:0 6px;width:50%;text-align:left"'
    # fixed layout: each side keeps half the width and scrolls its own long lines (never wraps them)
    html_text = (f"<table style='width:100%;table-layout:fixed;border-collapse:collapse'><tr><th "
                 f"{cell}>{html.escape(left_title)}</th><th "
                 f"{cell}>{html.escape(right_title)}</th></tr><tr><td "
                 f"{cell}>{''.join(left)}</td><td {cell}><pre "
                 f"style=\"{_PRE}\">{html.escape(shown)}</pre></td></tr></table>")
    return Rendered(html_text, "\n".join(plain) + "\n")
