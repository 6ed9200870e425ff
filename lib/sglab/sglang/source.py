"""Python source read as syntax: find a function or class by its dotted name (as a reviewer names
it, never by line numbers, so the same name finds it in every release), take its text, look inside
it; each fix's ``check(read)`` is built from these. Nothing here imports the code it reads."""

from __future__ import annotations

import ast
import textwrap
from functools import lru_cache


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


@lru_cache(maxsize=64)
def parse(source: str) -> ast.Module | None:
    """The module's syntax tree, or None when the text does not parse."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def parsed(read, rel: str) -> tuple[str | None, ast.Module | None]:
    """(text, tree) of ``rel`` through ``read``; tree None where missing or unparsable."""
    text = read(rel)
    return text, (parse(text) if text is not None else None)


def find(tree: ast.AST | None, qualname: str) -> ast.AST | None:
    """The class or function ``qualname`` in ``tree`` (the last definition of a name wins)."""
    node = tree
    for part in qualname.split("."):
        body = getattr(node, "body", None) or []
        hits = [n for n in body if isinstance(n, _DEFS) and n.name == part]
        if not hits:
            return None
        node = hits[-1]
    return node


def text(source: str, node: ast.AST) -> str:
    """The source lines of ``node`` with its decorators, dedented, ending in one newline."""
    first = min([d.lineno for d in node.decorator_list] + [node.lineno])
    lines = source.splitlines()[first - 1:node.end_lineno]
    return textwrap.dedent("\n".join(lines)).rstrip() + "\n"


def symbol_text(source: str | None, qualname: str) -> str | None:
    """Text of ``qualname`` in ``source``, or None when the file or the symbol is not there."""
    node = find(parse(source), qualname) if source is not None else None
    return None if node is None else text(source, node)


def _walk(node: ast.AST | None):
    return ast.walk(node) if node is not None else ()


def callee_name(call: ast.Call) -> str:
    """The called name without its object: ``f`` for ``f(x)`` and for ``self.pool.f(x)``."""
    return getattr(call.func, "attr", None) or getattr(call.func, "id", "")


def calls(node: ast.AST | None, name: str) -> list[ast.Call]:
    """Every call of ``name`` (as a plain name or an attribute) anywhere under ``node``."""
    return [n for n in _walk(node) if isinstance(n, ast.Call) and callee_name(n) == name]


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    """The expression passed as ``name=`` in ``call``, or None."""
    return next((k.value for k in call.keywords if k.arg == name), None)


def assignments(node: ast.AST | None, target: str) -> list[ast.expr]:
    """Values assigned to ``target`` (spelled as in the source: ``"self.model"``) under ``node``."""
    out = []
    for n in _walk(node):
        if isinstance(n, ast.Assign) and any(ast.unparse(t) == target for t in n.targets):
            out.append(n.value)
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and n.value is not None \
                and ast.unparse(n.target) == target:
            out.append(n.value)
    return out


def mentions(node: ast.AST | None, spelled: str) -> bool:
    """Whether the expression ``spelled`` (as ``ast.unparse`` writes it) occurs under ``node``."""
    return any(isinstance(n, ast.expr) and ast.unparse(n) == spelled for n in _walk(node))


def string_constants(node: ast.AST | None) -> list[str]:
    """Every string literal under ``node``, f-string pieces included."""
    values = (n.value for n in _walk(node) if isinstance(n, ast.Constant))
    return [v for v in values if isinstance(v, str)]
