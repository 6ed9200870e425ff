"""What every ``sglab`` command's parser shares: the one-line refusal, two argparse helpers and
``--param`` (:mod:`.cli` registers the commands, :mod:`.engine_cmd`, :mod:`.run_cmd` and
:mod:`.upstream` add their own)."""

import ast


class Refused(Exception):
    """A command's one-line refusal: ``sglab COMMAND: <why>`` on stderr, exit status 2."""


def command(sub, fn, *args, **kw):
    """A command's parser running ``fn``; its --help opens with its description, else its help."""
    p = sub.add_parser(*args, **{"description": kw.get("help"), **kw})
    p.set_defaults(fn=fn)
    return p


def flag(p, name: str, help: str) -> None:
    p.add_argument(name, action="store_true", help=help)


def parse_params(items: list[str]) -> dict:
    """``--param NAME=VALUE`` items as a dict, each value a Python literal where it parses."""
    out = {}
    for item in items or []:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"--param needs NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k.strip()] = v
    return out
