"""What every ``sglab`` command's parser shares: the one-line refusal and two argparse helpers
(:mod:`.cli` registers the commands, :mod:`.engine_cmd` and :mod:`.upstream` add their own)."""


class Refused(Exception):
    """A command's one-line refusal: ``sglab COMMAND: <why>`` on stderr, exit status 2."""


def command(sub, fn, *args, **kw):
    """A command's parser running ``fn``; its --help opens with its description, else its help."""
    p = sub.add_parser(*args, **{"description": kw.get("help"), **kw})
    p.set_defaults(fn=fn)
    return p


def flag(p, name: str, help: str) -> None:
    p.add_argument(name, action="store_true", help=help)
