"""``sglab`` on the command line.

The notebooks: ``run`` (headless → reports/), ``sync`` (pair each notebook's .py and .ipynb, the
edited half taken), ``record``, ``publish``, ``timings``. The evidence: ``verify``, ``upstream``,
``index``, ``real``, ``engine``, ``env``. Your own setup: ``workspace``, ``capture-sizes``,
``swa-cost``. ``sglab --help`` lists them, ``sglab COMMAND --help`` says what each argument means.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import sys
from pathlib import Path

from sglab.tools import run_cmd
from sglab.tools.commands import Refused, command, flag, parse_params


def cmd_env(_args) -> int:
    from sglab.tools.report import env_report

    for k, v in env_report():
        print(f"{k:>14}: {v}")
    return 0


def cmd_real(args) -> int:
    if args.action is None:
        raise Refused("no action: one of install (the pinned releases side by side), record "
                      "(what the notebooks' probes answer here), gpu (retired); sglab real ACTION "
                      "--help says more")
    if args.action == "record":
        from sglab.core import procs
        from sglab.tools import real_record

        with procs.Guard(watchdog=False):  # a stop signal stops the releases' workers (main says)
            return real_record.main(args.rest)
    if args.action == "gpu":
        print(
            "sglab real gpu: retired; the real engine checks the same on a GPU (sglab engine, "
            "scripts/engine_gpu.sh --plan NN)", file=sys.stderr)
        return 2
    from sglab.sglang import install

    return install.main(args.rest)


def cmd_publish(args) -> int:
    """A live run (its CSV, manifest and every sidecar) copied into data/recorded/<experiment>/."""
    from sglab.core import claims, runs
    from sglab.tools import verify

    try:
        run = verify.load_run(args.run)
        cut = verify.partial(run)
        if cut:
            raise Refused(f"{run.path.name} is a partial run ({cut}); rerun the scenario whole")
        failed = [r.claim.id for r in verify.verify_run(run).failed]
        if failed and not args.force:
            raise Refused(f"{run.path.name}: {len(failed)} claim(s) fail ({', '.join(failed)}; "
                          f"`sglab verify {shlex.quote(str(run.path))}` says why); --force "
                          "publishes it anyway")
        dest = runs.promote(run.path, force=args.force)
    except FileExistsError as e:
        raise Refused(f"{e}; --force replaces it") from None
    except (verify.BadInput, claims.ClaimsError, ValueError) as e:
        raise Refused(e) from None
    print(f"published {run.path.name} → {dest.parent} ({len(run.manifest.sidecars)} "
          "sidecar(s) with it); `sglab verify` it, then commit that folder")
    return 0


def cmd_record(args) -> int:
    from sglab.tools import fixes, verify

    try:
        verify.record(args.experiment, parse_params(args.param), recorded=args.recorded,
                      progress=not args.quiet)
    except (fixes.UnknownFix, verify.BadInput, ValueError) as e:
        raise Refused(e) from None
    return 0


def cmd_sync(args) -> int:
    from sglab.tools import nbtools

    if args.check:
        problems = [p for nb in nbtools.all_notebooks() for p in nbtools.check_pair(nb)]
        for p in problems:
            print(p)
        return 1 if problems else 0
    # each pair's side first, and nothing written where one of them cannot be decided
    sides, refused = {}, []
    for py in nbtools.pairs():
        try:
            sides[py] = nbtools.pair_side(py, args.side)
        except ValueError as e:
            refused.append(f"sglab sync: {e}")
    if refused:
        print("\n".join(refused), file=sys.stderr)
        return 1
    wrote = [pair for py, side in sides.items() if (pair := nbtools.sync(py, side))]
    for src, dst in wrote:
        print(f"{src.name} → {dst.name}")
    if not wrote:
        print(f"all {len(sides)} pairs already in sync")
    return 0


def cmd_index(args) -> int:
    from sglab.tools import readme

    try:
        if not args.check:
            print("README index, house map and engine ledger " +
                  ("updated" if readme.write_index() else "already up to date"))
            return 0
        stale = readme.stale()
    except readme.MissingMarker as e:
        raise Refused(e) from None
    for what in stale:
        print(f"out of date: {what}: run `sglab index`")
    if not stale:
        print("README index, docs/structure.md and docs/operating.md's engine ledger match the "
              "recorded runs and the tree")
    return 1 if stale else 0


def cmd_verify(args) -> int:
    from sglab.core import claims
    from sglab.tools import fixes, verify

    if args.junit and not Path(args.junit).resolve().parent.is_dir():
        raise Refused(f"--junit {args.junit}: no such folder {Path(args.junit).resolve().parent}")
    if args.junit and Path(args.junit).is_dir():
        raise Refused(f"--junit {args.junit}: is a folder (name the file to write, e.g. "
                      f"{Path(args.junit) / 'verify.xml'})")
    try:
        if args.against in fixes.experiments() and not Path(args.against).exists():
            # `--against EXP`: argparse hands EXP, what to verify, to --against's optional value
            args.targets, args.against = [args.against, *args.targets], "auto"
        if args.against not in (None, "auto") and not Path(args.against).exists():
            raise verify.BadInput(f"--against {args.against}: no such experiment or run file; "
                                  f"experiments: {', '.join(fixes.experiments())}")
        names = [t for t in args.targets if t in fixes.experiments()] if args.live else []
        given = [t for t in args.targets if t not in names]
        picked = verify.targets(given, args.all) if (given or args.all or not args.live) else []
        reference = verify.load_run(args.against) if args.against not in (None, "auto") else None
        if args.live:
            # experiments named with --live are what runs live (default: all this machine can)
            only = set(names) or None
            done, skipped = verify.live(progress=not args.quiet, only=only)
            engines, skipped_engines = verify.live_engines(progress=not args.quiet, only=only)
            done, skipped = done + engines, skipped + skipped_engines
            for s in skipped:
                print(f"[sglab] not run live: {s}")
            if not done and not picked:
                # nothing was verified: that must not read as a pass
                what = ", ".join(sorted(names)) if names else "the experiments"
                print(
                    f"sglab verify --live: this machine can run none of {what} (see above); "
                    "nothing verified", file=sys.stderr)
                return 1
            picked += done
        recorded: dict = {}  # each experiment's record read once for every run compared with it
        verified, bad = [], []
        for r in picked:  # each run's lines as soon as it is verified (--all: about 100 runs)
            against = args.against is not None
            verified.append(
                verify.verify_run(r, against=against, reference=reference, recorded=recorded))
            lines, fails = verify.block(verified[-1])
            print("\n".join(lines), flush=True)
            bad += fails
    except (verify.BadInput, claims.ClaimsError) as e:
        raise Refused(e) from None
    text, status = verify.tail(verified, bad)
    print(text)
    if args.junit:
        Path(args.junit).write_text(verify.junit(verified), encoding="utf-8")
        print(f"JUnit XML: {args.junit}")
    return status


def cmd_workspace(args) -> int:
    from sglab.workspace_floor import traffic as ws

    if args.world_size < 2:
        raise Refused("the fused all-reduce needs --world-size >= 2")
    try:
        trace = ws.read_trace(args.trace, pcg_max_tokens=args.pcg_max_tokens)
    except ws.TraceError as e:
        raise Refused(e) from None
    if not trace.tokens:
        raise Refused(f"{args.trace}: no forward step with tokens")
    print(ws.describe(trace))
    df = ws.traffic_table(trace.tokens, world_size=args.world_size, hidden_dim=args.hidden,
                          pre_initialize=args.pre_initialize)
    start = (f"pre-initialised at {args.pre_initialize} tokens"
             if args.pre_initialize else "cold start")
    print(f"world size {args.world_size}, hidden {args.hidden}, {start}")
    print(df.round(1).to_string())
    print(f"times: {df.attrs['cost_model']}")
    return 0


def cmd_capture_sizes(args) -> int:
    from sglab.capture_sizes import server_args
    from sglab.core import procs

    model = str(Path(args.model).resolve()) if args.model else server_args.sglang.MODEL
    with procs.Guard(watchdog=False):  # a stop signal stops the releases' workers (main says)
        return server_args.command(list(args.server_args), releases=args.release, mla=args.mla,
                                   gpu_mem_gb=args.gpu_mem_gb, model=model, csv=args.csv)


def cmd_swa_cost(args) -> int:
    from sglab.swa_loc import model_config as sc

    try:
        lay = sc.read_config(args.config)
    except sc.ConfigError as e:
        raise Refused(e) from None
    df = sc.predict(lay, batch_size=args.batch_size, max_bs=args.max_bs)
    print(f"{args.config}: {df.attrs['layout']}")
    print(f"SWA layers: {lay.swa_layers}")
    if df.empty:
        print("no recorded swa_loc run to take per-layer costs from")
    else:
        print(df.to_string(index=False))
        print(f"without the preset (before #23552) each decode step pays the extra kernels and µs "
              f"above; the int64 buffer of #23552 wastes 4 bytes per captured slot (--max-bs "
              f"{args.max_bs}) until #24743")
    return 0


def _commands(sub) -> None:
    """Every command: those that run the workbook (env, run, timings, record, publish, sync), then
    the evidence (upstream, index, the investigation commands, engine, verify, real)."""
    from sglab.tools import engine_cmd
    from sglab.tools import upstream as upstream_command

    command(sub, cmd_env, "env", help="describe this machine")
    p = command(sub, run_cmd.cmd_run, "run", help="execute notebooks headless and write reports/")
    p.add_argument(
        "notebooks", nargs="*",
        help="names or prefixes (01, 04_swa_loc), or notebook files of your own "
        "(path/to/mine.ipynb); default: every notebook of the workbook")
    p.add_argument("--out", help="the report folder (default reports/)")
    p.add_argument("--param", action="append", help="inject NAME=VALUE after the parameters cell")
    p.add_argument("--cell-timeout", type=int, default=900,
                   help="seconds a cell may run before it is interrupted (default 900)")
    p.add_argument("--jobs", type=int,
                   help="notebooks at a time (default: 1 where a GPU is visible, else 2)")
    flag(p, "--timings",
         "print where each notebook's time goes (phases) and save it as a workbook run")
    flag(p, "--record", "with --timings: save under data/recorded/workbook/")
    p = command(
        sub, run_cmd.cmd_timings, "timings",
        help="save the timings of notebooks run on another machine "
        "(its `sglab run --out` folder) as a workbook run")
    p.add_argument("reports", help="the folder `sglab run --out` wrote there (index.json, .ipynb)")
    p.add_argument(
        "--runs", required=True,
        help="the live runs those notebooks wrote (their data/runs/), for the "
        "measurement phases and the machine")
    flag(p, "--record", "save under data/recorded/workbook/")
    p = command(sub, cmd_record, "record", help="run an experiment live and save the run")
    p.add_argument("experiment", help="a fix's name (pcg_gate, swa_loc, ...): its GPU measurement")
    p.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="override one of the measurement's parameters (repeatable)")
    flag(p, "--recorded", "write into data/recorded/ instead of data/runs/")
    flag(p, "--quiet", "no progress lines")
    p = command(sub, cmd_publish, "publish",
                help="copy a live run with its sidecars into data/recorded/")
    p.add_argument("run", help="a run's CSV under data/runs/<experiment>/")
    flag(p, "--force",
         "replace a recorded run of the same name, and publish a run whose claims fail")
    p = command(sub, cmd_sync, "sync",
                help="pair notebooks' .py and .ipynb (the edited half is taken)")
    flag(p, "--check", "write nothing; exit 1 where an .ipynb is out of date")
    p.add_argument("--from", dest="side", choices=("py", "ipynb"),
                   help="write every pair from this half, whatever changed")
    upstream_command.add_arguments(
        command(sub, upstream_command.run, "upstream",
                help="which fixes the installed SGLang, a source tree, or each release has"))
    p = command(
        sub, cmd_index, "index",
        help="rewrite the README's notebook index, the house map (docs/structure.md) and "
        "the engine ledger (docs/operating.md) from the recorded runs and the tree")
    flag(p, "--check", "write nothing; exit 1 where a block is out of date")
    p = command(sub, cmd_workspace, "workspace",
                help="workspace re-creations per max_token_num policy for your traffic")
    p.add_argument("--trace", required=True,
                   help="CSV of token counts per forward step, or an SGLang server log")
    p.add_argument("--world-size", type=int, default=8,
                   help="TP ranks sharing the workspace (default 8)")
    p.add_argument("--hidden", type=int, default=7168,
                   help="hidden size of the model (7168: Kimi-K2.5/DeepSeek-V3)")
    p.add_argument(
        "--pcg-max-tokens", type=int, default=4096,
        help="pad prefill batches to piecewise-CUDA-graph buckets up to this size (0: no padding)")
    p.add_argument("--pre-initialize", type=int, default=0,
                   help="tokens of a workspace created before the first call")
    p = command(
        sub, cmd_capture_sizes, "capture-sizes",
        help="your SGLang server arguments → capture sizes per release, and which "
        "the attention-TP reduce-scatter refuses",
        description="sglab capture-sizes [--release V ...] [--model CONFIG.json] "
        "-- <SGLang server arguments>")
    p.add_argument("--release", nargs="+", action="extend", metavar="V",
                   help="releases to ask (default: the installed pinned ones)")
    p.add_argument(
        "--model", metavar="CONFIG.json", default=None,
        help="a model's config.json, or its folder: releases from 0.5.14 on resolve their "
        "configuration from it (default: the tiny DeepSeek-V3 config shipped in data/models)")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.add_argument(
        "--no-mla", dest="mla", action="store_false",
        help="0.5.10.post1-0.5.13: the model has no MLA attention (the piecewise "
        "maximum is then the chunked prefill size)")
    p.add_argument("--gpu-mem-gb", type=float, default=141.0,
                   help="GPU memory per GPU (sets SGLang's defaults)")
    p.add_argument("server_args", nargs=argparse.REMAINDER,
                   help="-- then the arguments of sglang.launch_server")
    engine_cmd.add_parser(sub)
    p = command(sub, cmd_swa_cost, "swa-cost",
                help="what the SWA location preset saves for a model's sliding-window layout")
    p.add_argument("config", help="a Hugging Face config.json, or the model folder that holds it")
    p.add_argument("--batch-size", type=int, default=32,
                   help="decode batch size for the µs estimate")
    p.add_argument("--max-bs", type=int, default=256,
                   help="largest captured decode batch (cuda-graph-max-bs)")
    p = command(sub, cmd_verify, "verify", help="check every claim on recorded, live or given runs")
    p.add_argument("targets", nargs="*", help="experiment names or run CSV files")
    flag(p, "--all", "every recorded run of every experiment")
    flag(
        p, "--live", "first run the experiments this machine's GPUs can run (the named "
        "ones only, where experiments are named), real engines included")
    p.add_argument(
        "--against", nargs="?", const="auto", default=None, metavar="REF",
        help="compare with a reference run (default: the newest recorded run of the "
        "same GPU model)")
    p.add_argument("--junit", metavar="FILE", help="also write the verdicts as JUnit XML")
    flag(p, "--quiet", "no progress lines")
    p = command(
        sub, cmd_real, "real",
        help="real SGLang releases side by side: `sglab real install [--releases V ...]`, "
        "`sglab real record` (the notebooks' probe answers, for recorded mode)")
    p.add_argument(
        "action", nargs="?", choices=["install", "record", "gpu"],
        help="install: the pinned releases side by side; record: what the notebooks' probes answer "
        "here (data/recorded/real_cpu/); gpu: retired (see sglab engine)")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="the action's own options: sglab real ACTION --help")


DESCRIPTION = ("The workbook on the command line: the notebooks (run, sync, record, publish, "
               "timings), the evidence (verify, upstream, index, real, engine, env) and your own "
               "setup (workspace, capture-sizes, swa-cost).")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors in one line (not the usage, which ``--help`` prints)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} ({self.prog} --help lists its arguments)\n")


def main(argv: list[str] | None = None) -> int:
    from sglab.core import bytecode, procs

    # before anything heavy is imported, and inherited by every kernel and rank started below
    bytecode.enable()
    ap = _Parser(prog="sglab", description=DESCRIPTION)
    ap.add_argument("--version", action=_Version, nargs=0, default=argparse.SUPPRESS,
                    help="print sglab's version and exit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _commands(sub)
    args, extra = ap.parse_known_args(argv)
    try:
        if extra:  # argparse would name the root parser and print its whole usage
            raise Refused(f"unrecognized argument(s) {' '.join(extra)} "
                          f"(sglab {args.cmd} --help lists its arguments)")
        _check_numbers(args)
        code = int(args.fn(args) or 0)
        sys.stdout.flush()  # a reader that went away is found here, not at exit
    except Refused as e:
        print(f"sglab {args.cmd}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sglab ... | head`: quiet, with the status of a SIGPIPE
        with contextlib.suppress(OSError, ValueError, AttributeError):  # (a test's stdout)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (procs.Terminated, KeyboardInterrupt) as e:  # what the command started is stopped
        if argv is None:  # the program itself: a second Ctrl-C cannot cut its exit short
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"sglab {args.cmd}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    return code


# numbers a command needs above 0 (each value of a list), and integers it needs at least a floor
POSITIVE = {
    "run": ("cell_timeout",), "capture-sizes": ("gpu_mem_gb",),
    "engine": ("input_len", "batch_size", "requests", "prompts", "output_len", "repeats", "timeout")
}
AT_LEAST = {
    "workspace": {"hidden": 1, "pcg_max_tokens": 0, "pre_initialize": 0},
    "swa-cost": {"batch_size": 1, "max_bs": 1}
}


def _check_numbers(args) -> None:
    """Refuse the first number of :data:`POSITIVE` or :data:`AT_LEAST` out of its range."""
    for dest in POSITIVE.get(args.cmd, ()):
        value = getattr(args, dest)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not (math.isfinite(v) and v > 0):
                why = "more than 0" if math.isfinite(v) else "a finite number"
                raise Refused(f"--{dest.replace('_', '-')} {v:g}: must be {why}")
    for dest, low in AT_LEAST.get(args.cmd, {}).items():
        if getattr(args, dest) < low:
            raise Refused(
                f"--{dest.replace('_', '-')} {getattr(args, dest)}: must be at least {low}")


class _Version(argparse.Action):
    """``--version``: ``sglab <version>`` (the metadata, else pyproject.toml's), read when asked."""

    def __call__(self, parser, namespace, values, option_string=None):
        import importlib.metadata as md

        try:
            version = md.version("sglab")
        except md.PackageNotFoundError:
            import tomllib

            from sglab.core.runs import repo_root

            version = tomllib.loads(
                (repo_root() / "pyproject.toml").read_text())["project"]["version"]
        print(f"sglab {version}")
        parser.exit()


if __name__ == "__main__":
    sys.exit(main())
