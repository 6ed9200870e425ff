"""``sglab upstream``: which fixes an SGLang has — the installed one, a source tree, or every
release."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglab.tools.commands import Refused, flag


FIGURE = "reports/upstream_releases.png"  # where --releases saves its figure, unless told


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", help="an SGLang package folder to read instead of the installed one")
    p.add_argument(
        "--releases", nargs="*", metavar="VERSION",
        help="classify released wheels: every release from 0.5.10 to the newest, or the "
        "ones listed")
    flag(p, "--offline", "with --releases: no network; cached wheels, else the committed table")
    flag(p, "--no-write",
         "with --releases: write nothing (neither data/upstream/ nor the timeline figure)")
    p.add_argument(
        "--figure", help="with --releases: where to save the timeline figure ('' for none; "
        f"default {FIGURE})")


def run(args) -> int:
    if args.releases is not None and args.root:
        raise Refused("--root and --releases do not go together: --root reads one tree, --releases "
                      "the wheels")
    if args.releases is not None:
        return _releases(args)
    on = dict(offline=args.offline, no_write=args.no_write, figure=args.figure is not None)
    given = [f"--{k.replace('_', '-')}" for k, v in on.items() if v]
    if given:
        raise Refused(f"{' and '.join(given)}: for --releases only (the installed SGLang, or "
                      "--root's, is read without network and nothing is written)")
    from sglab.sglang.upstream import check_all, installed
    from sglab.tools.fixes import FIXES

    root = Path(args.root) if args.root else None
    if root is None and installed() is None:
        raise Refused("SGLang is not installed here (`pip install --no-deps sglang`: it is read as "
                      "source, none of its dependencies needed; or --root DIR reads a source tree, "
                      "--releases the released wheels)")
    if root is not None and not (root / "srt").is_dir():
        raise Refused(f"{root} is not an SGLang package folder (expected {root}/srt/): pass the "
                      f"folder that holds srt/, e.g. an unpacked wheel's sglang/ or a checkout's "
                      f"python/sglang/")
    print(check_all(FIXES, root=root).to_string(index=False))
    return 0


def _releases(args) -> int:
    from sglab.sglang import hunks as H
    from sglab.sglang import wheels as R
    from sglab.sglang.releases import parse_version
    from sglab.tools.fixes import FIXES

    try:
        for v in args.releases or []:
            parse_version(v)
        tl = R.timeline(FIXES, args.releases or None, offline=args.offline,
                        progress=sys.stderr.isatty())
    except ValueError as e:
        raise Refused(e) from None
    if tl.unknown and len(tl.unknown) == len(set(args.releases or [])):
        raise Refused(f"no such SGLang release on the package index: {', '.join(tl.unknown)}")
    for note in tl.notes:
        print(note)
    if tl.frame.empty:
        raise Refused("no release could be read: no wheel, no network and no committed table")
    table = R.summary(tl.frame)
    if (tl.frame["source"] != "wheel").any():
        table = table.assign(read_from=tl.frame["source"])
    print("\n" + table.to_string(index=False))
    print("\nwhere a state or its reason changes:")
    for fix, version, state, reason in R.changes(tl.frame):
        print(f"  {fix:16s} {version:13s} {state:9s} {reason}")
    figure = FIGURE if args.figure is None else args.figure
    if figure and args.no_write:
        print("figure not saved (--no-write)")
    elif figure:
        import matplotlib

        matplotlib.use("Agg")
        path = Path(figure)
        path.parent.mkdir(parents=True, exist_ok=True)
        R.timeline_figure(tl.frame).savefig(path, bbox_inches="tight")
        print(f"figure: {path}")
    if args.no_write:
        print("data/upstream/ not rewritten (--no-write)")
    elif not tl.complete:
        why = ("only the listed releases were read" if args.releases else
               "the release list could not be checked on the package index, or some releases came "
               "from the committed table")
        print(f"data/upstream/ not rewritten: {why}")
    else:
        path = R.table_path()
        old = path.read_text() if path.exists() else None
        R.write_table(tl.frame, path)
        status = "unchanged" if old == path.read_text() else "updated"
        hunks = H.generate(FIXES, list(tl.frame["version"]), tl.wheels)
        print(f"wrote {path} ({len(tl.frame)} releases, {status}) and {len(hunks)} PR hunks under "
              f"{path.parent}/")
    return 0
