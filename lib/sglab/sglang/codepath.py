"""The code path of a fix through a real release, as a picture a reader can click: one box per
function, named by file and symbol, linked to its line at the release's tag (the line read from the
installed release, else its cached wheel; without either, the box links to the file)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import lru_cache

from sglab.sglang import releases, source, upstream


TAG_URL = "https://github.com/sgl-project/sglang/blob/v{version}/python/sglang/{path}"


@dataclass(frozen=True)
class Node:
    """One step of the path: file under ``sglang/``, symbol, and what happens there."""

    path: str
    symbol: str
    note: str = ""


@lru_cache(maxsize=64)
def read(version: str, path: str) -> str | None:
    """``sglang/<path>`` of ``version`` (the installed release, else its cached wheel), or None."""
    text = upstream.read(path, root=releases.package_dir(version))
    if text is not None:
        return text
    from sglab.sglang import wheels

    wheel = wheels.cached(version, wheels.cache_dir())
    return wheels.reader(wheel)(path) if wheel is not None else None


def line_of(version: str, node: Node) -> int | None:
    """The line where ``node.symbol`` (its first decorator) starts in ``version``, else None."""
    text = read(version, node.path)
    found = source.find(source.parse(text), node.symbol) if text is not None else None
    return None if found is None else min([found.lineno, *(d.lineno for d in found.decorator_list)])


def url(version: str, node: Node, offset: int = 0) -> str:
    """The node's address at the release's tag: its line (plus ``offset``) where known."""
    line = line_of(version, node)
    return TAG_URL.format(version=version, path=node.path) + (f"#L{line + offset}" if line else "")


def html_path(version: str, nodes, title: str = "") -> str:
    """The path as HTML: boxes left to right, an arrow between each, each box a link."""
    boxes = []
    for n in nodes:
        where = f"{n.path}:{line}" if (line := line_of(version, n)) else n.path
        symbol = html.escape(n.symbol).replace(".", ".<wbr>")  # long names wrap at dots and slashes
        boxes.append(
            f"<a href='{html.escape(url(version, n))}' style='text-decoration:none;color:inherit'>"
            "<div style='border:1px solid #aab7b8;border-radius:6px;padding:.35em .6em;"
            "background:#f4f6f7;min-width:11em;max-width:19em;overflow-wrap:anywhere'>"
            f"<code style='font-size:12px'>{symbol}</code><br>"
            f"<small style='color:#566573'>{html.escape(where).replace('/', '/<wbr>')}</small>" +
            (f"<br><small>{html.escape(n.note)}</small>" if n.note else "") + "</div></a>")
    arrow = "<div style='align-self:center;font-size:18px;color:#7f8c8d'>→</div>"
    head = f"<p><b>{html.escape(title)}</b> (sglang {html.escape(version)})</p>" if title else ""
    return (f"{head}<div style='display:flex;flex-wrap:wrap;gap:.4em;align-items:stretch'>"
            + arrow.join(boxes) + "</div>")


def show(version: str, nodes, title: str = "") -> None:
    """Display the path (HTML in a notebook; one line per node elsewhere)."""
    from sglab.core.notebook import display

    text = "\n".join(
        f"{n.symbol} ({n.path}:{line_of(version, n) or '?'}) {n.note}".rstrip() for n in nodes)
    if title:
        text = f"{title} (sglang {version})\n{text}"
    display(None, text, html=html_path(version, nodes, title))
