"""``python -m sglab.sglang.gpu record [--fix F ...] [--out DIR] [--dry-run]``: real SGLang on the GPUs, one run per fix.

For each fix the GPU count allows (:mod:`.plan`), each step runs in a fresh worker subprocess of its release
(:func:`sglab.sglang.runner.run_probe`: shims applied there, a timeout, the process group killed on expiry, GPU
memory released when the process ends), one after the other. The probes' rows become one tidy run
``real_<fix>`` (:func:`sglab.core.runs.write_run`) whose manifest names every release, its wheel, the shims it
applied and why, and what did not run: a reader sees which SGLang produced each number.

A step that could not run gives one row (``variant`` ``not-run`` or ``error``, ``metric`` ``status``, the
reason as ``value``); the run is still written, and the command exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

from sglab.sglang.gpu import plan as _plan
from sglab.sglang.gpu.rows import records


def step_rows(result) -> list[dict]:
    """The tidy rows of one step: the probe's rows with their release, or one status row saying why not."""
    if result.ok:
        return records(result.rows)
    status = "not-run" if result.status == "not-run" else "error"
    return [{"release": result.release, "variant": status, "metric": "status", "value": result.reason,
             "unit": ""}]


def manifest_parts(fix, results: list) -> tuple[dict, dict]:
    """(``params``, extra manifest fields): releases, probe parameters and shims per release."""
    from sglab.sglang.releases import read_stamp, release_dir

    params = {"releases": fix.releases, "fix": fix.name,
              "steps": [{"release": s.release, "probe": s.probe, "params": s.params} for s in fix.steps],
              "shims": {r.release: r.shim_names() for r in results}}
    sglang = {}
    for r in results:
        stamp = read_stamp(release_dir(r.release)) or {}
        sglang[r.release] = {"status": r.status, "reason": r.reason, "wheel": stamp.get("wheel"),
                             "shims": r.shims, "seconds": round(r.seconds, 1),
                             "prepare_seconds": r.prepare_seconds}
    return params, {"sglang": sglang, "method": fix.what}


MIN_STEP_S = 30.0


def _out_of_budget(step):
    from sglab.sglang.runner import ProbeResult

    return ProbeResult(step.release, step.probe, "not-run", None,
                       reason=f"sglang {step.release}: not started, the record budget was spent "
                              f"(under {MIN_STEP_S:.0f} s left)")


def record_fix(fix, *, out: Optional[Path] = None, echo=print, runner=None,
               deadline: Optional[float] = None) -> tuple[Optional[Path], bool]:
    """Run every step of ``fix`` and write its run; (CSV path, every step ran). ``deadline``
    (``time.monotonic()`` value): no step's timeout reaches past it, and a step with under
    :data:`MIN_STEP_S` left is not started (its row says so)."""
    from sglab.core.runs import tidy, write_run

    from sglab.sglang.runner import run_probe

    runner = runner or run_probe
    results, rows = [], []
    for step in fix.steps:
        t0 = time.perf_counter()
        left = float("inf") if deadline is None else deadline - time.monotonic()
        if left < MIN_STEP_S:
            r = _out_of_budget(step)
        else:
            r = runner(step.release, step.probe, step.params, timeout=min(step.timeout, left))
        echo(f"  {fix.name} / {r.summary()} [{time.perf_counter() - t0:.1f} s]")
        if not r.ok and r.traceback:
            echo("    " + r.traceback.strip().splitlines()[-1])
        results.append(r)
        rows += step_rows(r)
    params, extra = manifest_parts(fix, results)
    df = tidy(fix.experiment, rows)
    path = write_run(df, experiment=fix.experiment, method_version=fix.method_version, params=params,
                     root=out, gpu_count=fix.gpus, extra=extra)
    return path, all(r.ok for r in results)


def _gpu_count() -> int:
    from sglab.core import hardware

    return hardware.gpu_count() if hardware.has_cuda() else 0


def _dry_run(fixes, skipped, gpus: int) -> int:
    from sglab.sglang.releases import release_installed

    print(f"dry run: {gpus} GPU(s) here; would run {len(fixes)} fix(es)")
    for line in _plan.describe(fixes):
        print(line)
    for line in skipped:
        print(line)
    for v in dict.fromkeys(s.release for f in fixes for s in f.steps):
        print(f"sglang {v}: {'installed' if release_installed(v) else 'not installed'}")
    return 0


def cmd_record(args) -> int:
    try:
        _plan.check_releases()
        gpus = args.gpus if args.gpus is not None else _gpu_count()
        fixes, skipped = _plan.plan_for(args.fix or list(_plan.FIXES), gpus)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.budget is not None and args.budget <= 0:
        print(f"error: --budget must be positive, got {args.budget:g}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(fixes, skipped, gpus)
    for line in skipped:
        print(line)
    ok = True
    deadline = time.monotonic() + args.budget if args.budget else None
    for fix in fixes:
        t0 = time.perf_counter()
        print(f"{fix.name}: {len(fix.steps)} step(s) on {', '.join(fix.releases)}")
        path, fine = record_fix(fix, out=args.out, deadline=deadline)
        ok = ok and fine
        print(f"{fix.name}: {'ok' if fine else 'INCOMPLETE'} in {time.perf_counter() - t0:.1f} s -> {path}")
    return 0 if ok else 1


def main(argv=None) -> int:
    from sglab.core.bytecode import enable

    enable()  # the probe processes import torch and a release each: keep their bytecode (sglab.core.bytecode)
    ap = argparse.ArgumentParser(prog="python -m sglab.sglang.gpu", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("record", help="run the GPU probes on real SGLang and write one run per fix")
    p.add_argument("--fix", nargs="+", metavar="F", help=f"fixes (default: all of {', '.join(_plan.FIXES)})")
    p.add_argument("--out", type=Path, help="runs root (default data/runs); the run goes to OUT/real_<fix>/")
    p.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    p.add_argument("--gpus", type=int, help="GPU count to plan for (default: the GPUs visible here)")
    p.add_argument("--budget", type=float, help="seconds for all steps together: timeouts are cut to fit, and a "
                                                "step that no longer fits is recorded as not started")
    args = ap.parse_args(argv)
    return cmd_record(args)


if __name__ == "__main__":
    sys.exit(main())
