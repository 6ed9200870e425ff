"""A released hunk for a reader: a coloured unified diff in a notebook, the same text anywhere else, and the
released symbol beside the rebuilt one.

Everything returned here is a :class:`Rendered` — HTML for Jupyter (``_repr_html_``) with its plain-text twin as the
``repr``, so a terminal, a text export or a test sees the same content.
"""

from __future__ import annotations

import html
import inspect

from sglab.sglang.hunks import HEADER

_STYLE = {"+": "background:#e6ffec;color:#1a7f37", "-": "background:#ffebe9;color:#b42318",
          "@": "background:#eef4fb;color:#4a6fa5", "#": "color:#6e7781;font-weight:bold", " ": ""}
_PRE = ("font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;line-height:1.35;"
        "margin:0;padding:6px 8px;overflow-x:auto;border:1px solid #d0d7de;border-radius:4px;background:#fff")


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
    """The released ``symbol`` (default: the hunk's first one present on ``side``) next to the rebuilt code."""
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
    html_text = (f"<table style='width:100%;border-collapse:collapse'><tr><th {cell}>{html.escape(left_title)}</th>"
                 f"<th {cell}>{html.escape('rebuilt: ' + right_title)}</th></tr><tr>"
                 f"<td {cell}>{code_html(blocks[symbol])}</td><td {cell}>{code_html(right)}</td></tr></table>")
    plain = f"== {left_title}\n{blocks[symbol]}\n== rebuilt: {right_title}\n{right}"
    return Rendered(html_text, plain)
