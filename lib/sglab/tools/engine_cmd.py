"""``sglab engine``: a release's real engine on this GPU, for your model config and flags, with
dummy weights."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path

from sglab.core import hardware, procs
from sglab.tools.commands import Refused, command, flag


def add_parser(sub) -> None:
    p = command(
        sub, main, "engine", help="a release's real engine on this GPU: its decisions and "
        "latencies for your model config and flags (dummy weights)",
        description="sglab engine --release V --model CONFIG.json [options] [-- SERVER ARGS]")
    p.add_argument("--release", nargs="+", action="extend", metavar="V", help="release(s) to start")
    p.add_argument("--model", type=Path, help="a Hugging Face config.json (or its folder)")
    p.add_argument(
        "--tool", choices=["bench", "engine", "serve"], default="bench",
        help="bench: python -m sglang.bench_one_batch; engine: sglang.Engine(...).generate(...); "
        "serve: python -m sglang.launch_server, then its bench_serving (TTFT, TPOT, E2E)")
    p.add_argument("--input-len", type=int, nargs="+", default=[1024], metavar="N",
                   help="prompt lengths in tokens (default 1024)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1], metavar="N",
                   help="bench: batch sizes")
    p.add_argument(
        "--requests", type=int, nargs="+", default=[1], metavar="N",
        help="engine: requests per generate call (one prefill batch); serve: requests "
        "in flight at once")
    p.add_argument("--prompts", type=int, default=4, metavar="N",
                   help="serve: prompts per pass and request in flight (default 4)")
    p.add_argument("--output-len", type=int, default=16, help="tokens decoded per request")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each shape")
    flag(p, "--profile", "bench: torch.profiler decode trace, kernels per replay")
    p.add_argument("--adjust", action="append", default=[], metavar="NAME",
                   help="a named harness adjustment")
    p.add_argument("--case", default="", help="label of this run (variant release+case)")
    p.add_argument(
        "--timeout", type=float, default=None,
        help="seconds before the whole engine is stopped (default 900, or the scenario's)")
    p.add_argument(
        "--cpus", metavar="auto|LIST", default="",
        help="run each engine (and the host's launch-cost probe) on these CPUs only: 'auto', "
        "the CPUs local to GPU 0, or a list such as 0-7,16")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME",
                   help="a real-engine scenario (sglab engine --list)")
    p.add_argument("--plan", metavar="NN", help="every scenario of notebook NN")
    p.add_argument(
        "--cases", nargs="+", action="extend", default=[], metavar="GLOB",
        help="with --scenario/--plan: only the cases these patterns match ('w512-*'), "
        "to split a long scenario over several calls")
    flag(p, "--list", "list the scenarios")
    flag(p, "--record", "write the run (data/runs/engine_<fix>/)")
    p.add_argument("--fix", default="custom",
                   help="experiment engine_<fix> of a recorded run without scenario")
    p.add_argument("--out", type=Path, help="runs root for --record (default data/runs)")
    p.add_argument("--work", type=Path,
                   help="folder for each engine's log, model folder and traces")
    flag(p, "--dry-run", "print each command; start nothing")
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="-- then SGLang server arguments")


def _groups(args):
    """[(fix, [EngineSpec])] from the scenario options or the single-run options."""
    from sglab.sglang import engine as eng
    from sglab.tools import fixes

    cpus, text = (), args.cpus  # --cpus: 'auto' (the CPUs local to GPU 0), or the list given
    if text:
        try:
            cpus = hardware.gpu_local_cpus(0) if text == "auto" else hardware.parse_cpus(text)
        except ValueError as e:
            raise eng.EngineError(f"--cpus: {e}") from None
        barred = sorted(set(cpus) - os.sched_getaffinity(0))
        if barred:
            raise eng.EngineError(f"--cpus: CPU {barred[0]} is not allowed to this process "
                                  f"(allowed: {len(os.sched_getaffinity(0))} CPUs)")
    picked = [fixes.scenario(n) for n in args.scenario]
    if args.plan:
        found = fixes.plan(args.plan)
        if not found:
            raise KeyError(f"no scenario for notebook {args.plan}")
        picked += found
    if picked:
        given = {k: v for k, v in (("cpus", cpus), ("timeout", args.timeout)) if v}
        groups = [(s.fix, s.name, [
            replace(sp, **given) for sp in s.specs(args.release) if not args.cases or any(
                fnmatch(sp.case, p) for p in args.cases)
        ]) for s in picked]
        for pattern in args.cases:
            if not any(fnmatch(sp.case, pattern) for _, _, specs in groups for sp in specs):
                known = sorted({c.label for s in picked for c in s.all_cases()})
                raise eng.EngineError(
                    f"--cases {pattern}: no case of {', '.join(s.name for s in picked)}"
                    f" matches (cases: {' '.join(known)})")
        return [g for g in groups if g[2] or not args.cases]  # scenarios left without a case drop
    if args.cases:
        raise eng.EngineError("--cases picks cases of a --scenario or --plan")
    if not args.release or not args.model:
        raise eng.EngineError("give --release and --model (or --scenario / --plan / --list)")
    eng.load_config(args.model)  # a bad config is said before what the machine lacks
    argv = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    adjust = tuple(eng.adjustment(a, fixes.adjustments()) for a in args.adjust)
    timeout = args.timeout or eng.DEFAULT_TIMEOUT_S
    shape = dict(model=args.model, tool=args.tool, server_args=tuple(argv), case=args.case,
                 batch_sizes=tuple(args.batch_size), input_lens=tuple(args.input_len),
                 requests=tuple(args.requests), output_len=args.output_len, repeats=args.repeats,
                 profile=args.profile, prompts=args.prompts, timeout=timeout, cpus=cpus,
                 adjustments=adjust)
    return [(args.fix, "", [eng.EngineSpec(release=v, **shape) for v in args.release])]


def _dry_run(spec, work, said: set) -> None:
    """Print the command a spec would start (and why it would stop); ``said``: printed already."""
    from sglab.sglang import engine as eng

    with tempfile.TemporaryDirectory(prefix="sglab-engine-") as tmp:
        try:
            spec = eng.with_model_needs(spec, lambda line: print(f"# {line}"), said)
            prep = eng.prepare(spec, work or Path(tmp), check=False)
        except eng.EngineError as e:
            print(f"# sglang {spec.variant}: would stop: {e}")
            return
        which = "the launch-count pass, profiled" if spec.profile else f"start {spec.start + 1}"
        print(f"# sglang {spec.variant} ({which}): {shlex.join(prep.sglang_command)}")
        for a in spec.adjustments:
            if a.name not in said:
                print(f"#   harness adjustment {a.name}: {a.reason}")
                said.add(a.name)
        if spec.cpus:
            print(f"#   on CPUs {hardware.cpu_text(spec.cpus)} only")
        try:
            eng.check_pins(prep.env, prep.found)
        except eng.EngineError as e:
            key = ("pins", spec.release)
            print(f"#   would stop: {f'as above (sglang {spec.release})' if key in said else e}")
            said.add(key)


def _too_few_gpus(name: str, specs) -> str:
    """Why this machine cannot start these specs ('' when it can)."""
    from sglab.tools import fixes

    need = max((sp.tp_size for sp in specs), default=1)
    if not hardware.has_cuda():
        return "" if hardware.gpu_count(
        ) else f"{name or 'this engine'}: no CUDA GPU here; needs {need}"
    return fixes.short_of(name or "this engine", need, hardware.gpu_count()) if need > 1 else ""


HOST_COST = ("import json; from sglab.core.timing import launch_cost_us; "
             "print(json.dumps(launch_cost_us()))")


def host_launch_cost(timeout: float = 120.0, cpus: tuple = ()) -> dict:
    """The host's per-launch cost (µs) measured in a process of its own on ``cpus``."""
    return procs.in_own_process(HOST_COST, timeout, cpus)


def _run_specs(args, name: str, specs: list, alone: bool, results: list) -> int:
    """Each spec's engine in turn, into ``results``: 2 where one could not start, 1 one failed."""
    from sglab.sglang import engine as eng

    status, refused, skipped = 0, {}, Counter()  # refused: {release: why it cannot start here}
    said: set = set()  # each harness adjustment's reason is said once (_dry_run, eng.run)
    for spec in specs:
        folder = f"{name or 'engine'}-{spec.variant}" + (f"-start{spec.start}"
                                                         if spec.start else "")
        work = (args.work / folder) if args.work else None
        if args.dry_run:
            _dry_run(spec, work, said)
            continue
        if spec.release in refused:  # it would stop as the first did: counted, said below
            skipped[spec.release] += 1
            results.append(eng.EngineResult(spec, "not-started", error=refused[spec.release]))
            continue
        try:
            res = eng.run(spec, work=work, said=said)
        except eng.EngineError as e:
            if len(specs) == 1 and alone:
                raise
            print(f"sglab engine: {e}", file=sys.stderr)
            if isinstance(e, eng.ReleaseError):
                refused[spec.release] = str(e)
            res = eng.EngineResult(spec, "not-started", error=str(e))
            status = 2
        results.append(res)
        print("\n".join(eng.summary(res)))
        if not res.ok:
            status = max(status, 1)
            # every variant of the release failed its first start with one error: the rest won't
            release = spec.release
            variants = {sp.variant for sp in specs if sp.release == release}
            mine = [r for r in results if r.spec.release == release]
            firsts = [(r.error or "\n").splitlines()[0] for r in mine]
            errors = {re.sub(r" \(log: [^)]*\)$", "", line) for line in firsts}
            seen = {r.spec.variant for r in mine}
            if len(variants) > 1 and seen == variants and not any(r.ok for r in mine) \
                    and len(errors) == 1 and errors != {""}:
                refused[release] = (f"every variant of sglang {release} failed its first start "
                                    f"with {errors.pop()}")
    for release, n in skipped.items():
        print(f"sglab engine: {n} more engine(s) of sglang {release} not started (the same reason)",
              file=sys.stderr)
    return status


def _record_partial(args, fix: str, results: list, specs: list, host: dict, stop) -> None:
    """Record the engines that finished before a signal under ``<out>/partial/``."""
    from sglab.core.runs import data_dir
    from sglab.sglang import engine as eng

    # the handler that raised has set SIGTERM/SIGHUP aside; Ctrl-C must not cut the record short
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        why = ("Ctrl-C"
               if isinstance(stop, KeyboardInterrupt) else signal.Signals(stop.signum).name)
        done = {(r.spec.variant, r.spec.start) for r in results}
        missing = [
            sp.variant + (f" start {sp.start}" if sp.start else "")
            for sp in specs if (sp.variant, sp.start) not in done
        ]
        partial = dict(ran=len(results), planned=len(specs), stopped_by=why, missing=missing)
        extra = {"partial": partial, **({"host_launch_us": host} if host else {})}
        path = eng.record(results, fix, root=(args.out or data_dir("runs")) / "partial",
                          extra=extra)
        print(
            f"recorded (partial: {len(results)} of {len(specs)} engines, stopped by {why}): "
            f"{path}", flush=True)
    finally:
        signal.signal(signal.SIGINT, saved)


def main(args) -> int:
    from sglab.sglang import engine as eng
    from sglab.tools import fixes

    if args.list:
        for s in fixes.scenarios():
            print(f"{s.name:18} {s.experiment:24} {s.gpus} GPU  {s.tool:6} {' '.join(s.releases)}")
            print(f"{'':18} {s.what}")
        return 0
    try:
        groups = _groups(args)
        for _, name, specs in groups:
            if not specs:
                raise eng.EngineError(
                    f"scenario {name}: no run for releases {' '.join(args.release or [])} (its "
                    f"releases: {' '.join(fixes.scenario(name).releases)})")
        status = 0
        if not args.dry_run:
            # a plan skips the scenarios this machine has too few GPUs for; one named stops
            why = {name: _too_few_gpus(name, specs) for _, name, specs in groups}
            if args.plan and not args.scenario:
                for line in filter(None, why.values()):
                    print(f"sglab engine: skipped {line}")
                groups = [g for g in groups if not why[g[1]]]
                if not groups:
                    raise eng.EngineError(f"plan {args.plan}: nothing this machine can start")
            elif any(why.values()):
                raise eng.EngineError(next(w for w in why.values() if w))
        for fix, name, specs in groups:
            results = []
            cpus = specs[0].cpus
            measured = not args.dry_run and hardware.has_cuda()  # (no launches to time without)
            host = {"before": host_launch_cost(cpus=cpus)} if measured else {}
            # a signal between two engines: the engines that finished are recorded as a partial run
            with procs.Guard(watchdog=False):
                try:
                    status = max(status, _run_specs(args, name, specs, len(groups) == 1, results))
                except (procs.Terminated, KeyboardInterrupt) as stop:
                    if args.record and results:
                        _record_partial(args, fix, results, specs, host, stop)
                    raise
            if host:
                host["after"] = host_launch_cost(cpus=cpus)
                print("[sglab] host per-launch cost: " + ", ".join(
                    f"{k} {v.get('median', v.get('error'))}" + (" µs" if "median" in v else "")
                    for k, v in host.items()))
            if args.record and results:
                path = eng.record(results, fix, root=args.out,
                                  extra={"host_launch_us": host} if host else None)
                print(f"recorded: {path}")
        if len(groups) == 1 and len(groups[0][2]) == 1 and not args.dry_run and status == 1:
            raise Refused(results[0].error)
        return status
    except (eng.EngineError, KeyError) as e:
        raise Refused(str(e).strip("'\"")) from None
