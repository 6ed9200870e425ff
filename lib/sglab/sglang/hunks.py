"""Each PR as it was released: the symbols it touched, in the last release without it and the first
release with it.

Symbols are found by name with :mod:`ast` in the real released files (the wheels), never by line
numbers, and only the functions the PR touched are kept, so a hunk stays a page or two. They are
committed under ``data/upstream/<fix>/`` (``pr<N>.json`` with the versions and wheels,
``pr<N>.before.txt``, ``pr<N>.after.txt``, ``pr<N>.diff``), so a notebook shows the real released
hunk beside the rebuilt function with neither SGLang nor a network. A release window may carry other
changes to the same functions; the diff shows those too, as released.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from sglab.sglang import source as S
from sglab.sglang.fix import Spec
from sglab.sglang.upstream import data_dir, run_check
import html
import inspect


ABSENT = "# (not in this release)"
HEADER = "# ── sglang/"


def _name(fix) -> str:
    return fix if isinstance(fix, str) else fix.name


def has_change(spec: Spec, fix, read) -> bool:
    """Whether a release (``read``) has the PR of ``spec``: its own test, else the fix's check says
    "pr-era"."""
    if spec.first_with is not None:
        return bool(spec.first_with(read))
    return run_check(fix, read).status == "pr-era"


@dataclass(frozen=True)
class Hunk:
    """One PR's symbols before and after, as released. ``before``/``after`` hold every symbol under
    a ``# ── sglang/<file> · <symbol>`` header (``# (not in this release)`` where it did not
    exist)."""

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
    def path(self) -> str:
        """The file the PR's main symbol lives in (``sglang/srt/...``)."""
        return self.paths[0]

    @property
    def title(self) -> str:
        return f"sgl-project/sglang#{self.pr} · {self.before_version} → {self.after_version}"

    def blocks(self, side: str = "after") -> dict[str, str | None]:
        """``{qualname: text}`` of one side (None where the symbol was not in that release)."""
        return split_blocks(self.after if side == "after" else self.before)

    def __repr__(self) -> str:
        plus = sum(
            1 for ln in self.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
        minus = sum(
            1 for ln in self.diff.splitlines() if ln.startswith("-") and not ln.startswith("---"))
        return (f"<Hunk {self.fix} {self.title}: {len(self.symbols)} symbols, +{plus} -{minus} "
                "lines>")

    def __str__(self) -> str:
        from sglab.sglang.hunks import hunk_text

        return hunk_text(self)

    def _repr_html_(self) -> str:
        from sglab.sglang.hunks import hunk_html

        return hunk_html(self)


# -- reading symbols out of a release
# ---------------------------------------------------------------------------
def header(symbol: str) -> str:
    path, qual = symbol.split("::")
    return f"{HEADER}{path} · {qual}"


def symbol_block(read, symbol: str) -> str:
    """One symbol of a release as it is stored: its header line, then its text (or the absent
    marker)."""
    path, qual = symbol.split("::")
    text = S.symbol_text(read(path), qual)
    body = text if text is not None else ABSENT + "\n"
    return f"{header(symbol)}\n{body}"


def side_text(read, symbols) -> str:
    """Every symbol of one side, in order, separated by a blank line."""
    return "\n".join(symbol_block(read, s) for s in symbols)


def split_blocks(text: str) -> dict[str, str | None]:
    out, name, lines = {}, None, []
    for line in text.splitlines(keepends=True) + [HEADER + "end · end\n"]:
        if line.startswith(HEADER):
            if name is not None:
                body = "".join(lines).strip("\n")
                out[name] = None if body == ABSENT else body + "\n"
            name, lines = line.rstrip("\n").split(" · ", 1)[1], []
        else:
            lines.append(line)
    return out


def unified(before: str, after: str, before_version: str, after_version: str) -> str:
    return "".join(
        difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                             fromfile=f"sglang {before_version}", tofile=f"sglang {after_version}",
                             n=3))


def find_window(spec: Spec, fix, versions: list[str], reader_for) -> tuple[str, str]:
    """(last release without the change, first release with it) among ``versions`` (oldest
    first)."""
    for i, v in enumerate(versions):
        if has_change(spec, fix, reader_for(v)):
            if i == 0:
                raise ValueError(f"{_name(fix)} #{spec.pr}: already in {v}, the oldest release "
                                 "read")
            return versions[i - 1], v
    raise ValueError(f"{_name(fix)} #{spec.pr}: no release among {versions[0]}..{versions[-1]} has "
                     "it")


def build(spec: Spec, fix: str, before: tuple, after: tuple) -> Hunk:
    """``before``/``after`` are ``(version, read, wheel_facts)``."""
    (bv, bread, bfacts), (av, aread, afacts) = before, after
    btext, atext = side_text(bread, spec.symbols), side_text(aread, spec.symbols)
    keep = lambda f: {k: f[k] for k in ("wheel", "sha256", "build_date") if k in f}  # noqa: E731
    return Hunk(fix, spec.pr, spec.symbols, bv, av, btext, atext, unified(btext, atext, bv, av),
                keep(bfacts), keep(afacts))


# -- committed files
# --------------------------------------------------------------------------------------------
def _stem(fix: str, pr: int, root: Path | None) -> Path:
    return Path(root or data_dir()) / fix / f"pr{pr}"


def write(hunk: Hunk, root: Path | None = None) -> Path:
    stem = _stem(hunk.fix, hunk.pr, root)
    stem.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "fix": hunk.fix, "pr": hunk.pr, "paths": list(hunk.paths), "symbols": list(hunk.symbols),
        "before_version": hunk.before_version, "after_version": hunk.after_version,
        "before_wheel": hunk.before_wheel, "after_wheel": hunk.after_wheel
    }
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    Path(f"{stem}.before.txt").write_text(hunk.before)
    Path(f"{stem}.after.txt").write_text(hunk.after)
    Path(f"{stem}.diff").write_text(hunk.diff)
    return stem.parent


def load(fix, pr: int | None = None, *, root: Path | None = None) -> Hunk:
    """The committed hunk of ``fix`` (a record or a name; its main PR, or ``pr``), as released."""
    if pr is None:
        pr = fix.prs[0] if not isinstance(fix, str) else _main_pr(fix, root)
    stem = _stem(_name(fix), pr, root)
    meta_path = stem.with_suffix(".json")
    if not meta_path.exists():
        raise FileNotFoundError(f"no committed hunk {meta_path} (sglab upstream --releases writes "
                                "it)")
    meta = json.loads(meta_path.read_text())
    return Hunk(meta["fix"], meta["pr"], tuple(meta["symbols"]), meta["before_version"],
                meta["after_version"],
                Path(f"{stem}.before.txt").read_text(),
                Path(f"{stem}.after.txt").read_text(),
                Path(f"{stem}.diff").read_text(), meta["before_wheel"], meta["after_wheel"])


def _main_pr(name: str, root: Path | None) -> int:
    """The main (first, lowest-numbered) PR committed for a fix name."""
    found = sorted(int(p.stem[2:]) for p in (Path(root or data_dir()) / name).glob("pr*.json"))
    if not found:
        raise FileNotFoundError(f"no committed hunk for {name!r} under "
                                f"{Path(root or data_dir()) / name}")
    return found[0]


def generate(fixes, versions: list[str], wheels: dict, root: Path | None = None) -> list[Hunk]:
    """Find every PR's window among ``versions`` (oldest first) in the wheels ``{version: path}``,
    write each hunk; ``fixes`` are the records (each with its hunk specs)."""
    from sglab.sglang.wheels import WheelReader, wheel_facts

    readers = {}

    def reader_for(v):
        if v not in readers:
            readers[v] = WheelReader(wheels[v])
        return readers[v]

    out = []
    try:
        for fix, spec in ((f, sp) for f in fixes for sp in f.hunks):
            bv, av = find_window(spec, fix, versions, reader_for)
            hunk = build(spec, fix.name, (bv, reader_for(bv), wheel_facts(wheels[bv])),
                         (av, reader_for(av), wheel_facts(wheels[av])))
            write(hunk, root)
            out.append(hunk)
    finally:
        for r in readers.values():
            r.close()
    return out


def show(fix, pr: int | None = None):
    """The committed hunk of ``fix`` rendered for a notebook (HTML with +/- colouring; plain text
    elsewhere)."""
    from sglab.sglang.hunks import Rendered, hunk_html, hunk_text

    hunk = load(fix, pr)
    return Rendered(hunk_html(hunk), hunk_text(hunk))


def beside(fix, rebuilt, *, pr: int | None = None, symbol: str | None = None, side: str = "after"):
    """The released ``symbol`` of ``fix``'s hunk next to the rebuilt function or class
    (``rebuilt``)."""
    from sglab.sglang.hunks import render_beside as _beside

    return _beside(load(fix, pr), rebuilt, symbol=symbol, side=side)


# --------------------------------------------------------------------------------------------------
# display: A released hunk for a reader: a coloured unified diff in a notebook, the same text any
# --------------------------------------------------------------------------------------------------

_STYLE = {
    "+": "background:#e6ffec;color:#1a7f37", "-": "background:#ffebe9;color:#b42318",
    "@": "background:#eef4fb;color:#4a6fa5", "#": "color:#6e7781;font-weight:bold", " ": ""
}
_PRE = ("font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;line-height:1.35;"
        "margin:0;padding:6px 8px;overflow-x:auto;border:1px solid #d0d7de;border-radius:4px;"
        "background:#fff;white-space:pre;word-break:normal;overflow-wrap:normal")


class Rendered:
    """HTML for a notebook, plain text everywhere else."""

    def __init__(self, html_text: str, plain: str):
        self.html, self.text = html_text, plain

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


def hunk_html(hunk) -> str:
    cap = html.escape(_caption(hunk))
    return (f'<div><div style="font-size:12px;color:#57606a;margin:2px 0 4px">{cap}</div>'
            f"{diff_html(hunk.diff) if hunk.diff else '<i>no change in these symbols</i>'}</div>")


def code_html(code: str) -> str:
    return f'<pre style="{_PRE}">{html.escape(code)}</pre>'


def _source_of(rebuilt) -> tuple[str, str]:
    """(name, text) of the rebuilt function or class (or a ``(name, text)`` pair given as is)."""
    if isinstance(rebuilt, tuple):
        return rebuilt
    name = f"{rebuilt.__module__}.{rebuilt.__qualname__}"
    return name, inspect.getsource(rebuilt)


def render_beside(hunk, rebuilt, *, symbol: str | None = None, side: str = "after") -> Rendered:
    """The released ``symbol`` (default: the hunk's first one present on ``side``) next to the
    rebuilt code."""
    blocks = hunk.blocks(side)
    names = [n for n, t in blocks.items() if t is not None]
    if symbol is None:
        if not names:
            raise ValueError(f"{hunk.title}: no symbol exists on the {side!r} side")
        symbol = names[0]
    if blocks.get(symbol) is None:
        raise KeyError(f"{symbol!r} is not on the {side!r} side of {hunk.title}; there: {names}")
    version = hunk.after_version if side == "after" else hunk.before_version
    left_title = f"sglang {version} · {symbol}"
    right_title, right = _source_of(rebuilt)
    cell = 'style="vertical-align:top;padding:0 6px;width:50%;text-align:left"'
    # fixed layout: each side keeps half the width and scrolls its own long lines (never wraps them)
    html_text = (f"<table style='width:100%;table-layout:fixed;border-collapse:collapse'><tr><th "
                 f"{cell}>{html.escape(left_title)}</th>"
                 f"<th {cell}>{html.escape('rebuilt: ' + right_title)}</th></tr><tr>"
                 f"<td {cell}>{code_html(blocks[symbol])}</td><td "
                 f"{cell}>{code_html(right)}</td></tr></table>")
    plain = f"== {left_title}\n{blocks[symbol]}\n== rebuilt: {right_title}\n{right}"
    return Rendered(html_text, plain)
