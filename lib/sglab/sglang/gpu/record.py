"""Real SGLang code on the GPUs (``sglab real gpu``), recorded like every other run: one run per
fix.

Each fix's record names its GPU plan (:class:`sglab.sglang.fix.GpuPlan`: the GPUs it needs, one
probe step per release). For each fix the GPU count allows, each step runs in a fresh worker
subprocess of its release (:func:`sglab.sglang.runner.run_probe`: shims applied there, a timeout,
the process group killed on expiry, GPU memory released when the process ends), one after the other.
The probes' rows become one tidy run ``real_<fix>`` (:func:`sglab.core.runs.write_run`) whose
manifest names every release, its wheel, the shims it applied and why, and what did not run: a
reader sees which SGLang produced each number.

A step that could not run gives one row (``variant`` ``not-run`` or ``error``, ``metric``
``status``, the reason as ``value``); the run is still written, and the command exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

from sglab.sglang.fix import Fix, GpuPlan


INT_COLUMNS = ("gpu", "rank", "step", "tokens")


def _hole(v) -> bool:
    return isinstance(v, float) and v != v


def records(df, drop=("probe",)) -> list[dict]:
    """A worker's frame as row dicts without the NaN holes pandas adds (a column only some rows
    use), integer columns back to ``int``, ``drop`` columns left out: the rows the probe made."""
    out = []
    for row in df.drop(columns=list(drop), errors="ignore").to_dict("records"):
        row = {k: v for k, v in row.items() if not _hole(v)}
        for col in INT_COLUMNS:
            if isinstance(row.get(col), float) and row[col].is_integer():
                row[col] = int(row[col])
        out.append(row)
    return out


def check_releases(fixes, carried) -> None:
    """Every step's release is one the GPU carry holds (a typo would only show on the GPU box)."""
    for fix in fixes:
        for s in fix.gpu.steps:
            if s.release not in carried:
                raise ValueError(f"{fix.name}: release {s.release} is not in the GPU carry "
                                 f"{tuple(carried)}")


def plan_for(fixes, names: list[str], gpu_count: int) -> tuple[list[Fix], list[str]]:
    """(fixes to run, one skip line per fix that needs more GPUs than ``gpu_count``) among the
    records with a GPU plan. Unknown names raise ``ValueError`` with the known ones."""
    known = {f.name: f for f in fixes if f.gpu is not None}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown fix {', '.join(unknown)} (known: {', '.join(known)})")
    run, skipped = [], []
    for name in dict.fromkeys(names):
        fix = known[name]
        if fix.gpu.gpus > gpu_count:
            skipped.append(f"{name}: skipped, needs {fix.gpu.gpus} "
                           f"GPU{'s' if fix.gpu.gpus > 1 else ''}, have {gpu_count}")
        else:
            run.append(fix)
    return run, skipped


def describe(fixes) -> list[str]:
    """One line per step, for ``--dry-run``."""
    lines = []
    for fix in fixes:
        g = fix.gpu
        lines.append(f"{fix.name} -> {fix.gpu_experiment} (method {g.method_version}, {g.gpus} "
                     f"GPU): {g.what}")
        for s in g.steps:
            extra = f" {s.params}" if s.params else ""
            lines.append(f"  sglang {s.release}: {s.probe}{extra} (timeout {s.timeout:.0f} s)")
    return lines


def step_rows(result) -> list[dict]:
    """The tidy rows of one step: the probe's rows with their release, or one status row saying why
    not."""
    if result.ok:
        return records(result.rows)
    status = "not-run" if result.status == "not-run" else "error"
    return [{
        "release": result.release, "variant": status, "metric": "status", "value": result.reason,
        "unit": ""
    }]


def manifest_parts(name: str, plan: GpuPlan, results: list) -> tuple[dict, dict]:
    """(``params``, extra manifest fields): releases, probe parameters and shims per release."""
    from sglab.sglang.releases import read_stamp, release_dir

    params = {
        "releases": plan.releases, "fix": name,
        "steps": [{"release": s.release, "probe": s.probe, "params": s.params} for s in plan.steps],
        "shims": {r.release: r.shim_names()
                  for r in results}
    }
    sglang = {}
    for r in results:
        stamp = read_stamp(release_dir(r.release)) or {}
        sglang[r.release] = {
            "status": r.status, "reason": r.reason, "wheel": stamp.get("wheel"), "shims": r.shims,
            "seconds": round(r.seconds, 1), "prepare_seconds": r.prepare_seconds
        }
    return params, {"sglang": sglang, "method": plan.what}


MIN_STEP_S = 30.0


def _out_of_budget(step):
    from sglab.sglang.runner import ProbeResult

    return ProbeResult(
        step.release, step.probe, "not-run", None,
        reason=f"sglang {step.release}: not started, the record budget was spent "
        f"(under {MIN_STEP_S:.0f} s left)")


def record_fix(name: str, plan: GpuPlan, *, out: Optional[Path] = None, echo=print, runner=None,
               deadline: Optional[float] = None) -> tuple[Optional[Path], bool]:
    """Run every step of fix ``name``'s GPU ``plan`` and write its run ``real_<name>``; (CSV path,
    every step ran). ``deadline``
    (``time.monotonic()`` value): no step's timeout reaches past it, and a step with under
    :data:`MIN_STEP_S` left is not started (its row says so)."""
    from sglab.core.runs import tidy, write_run

    from sglab.sglang.runner import run_probe

    runner = runner or run_probe
    results, rows = [], []
    for step in plan.steps:
        t0 = time.perf_counter()
        left = float("inf") if deadline is None else deadline - time.monotonic()
        if left < MIN_STEP_S:
            r = _out_of_budget(step)
        else:
            r = runner(step.release, step.probe, step.params, timeout=min(step.timeout, left))
        echo(f"  {name} / {r.summary()} [{time.perf_counter() - t0:.1f} s]")
        if not r.ok and r.traceback:
            echo("    " + r.traceback.strip().splitlines()[-1])
        results.append(r)
        rows += step_rows(r)
    params, extra = manifest_parts(name, plan, results)
    experiment = f"real_{name}"
    df = tidy(experiment, rows)
    path = write_run(df, experiment=experiment, method_version=plan.method_version, params=params,
                     root=out, gpu_count=plan.gpus, extra=extra)
    return path, all(r.ok for r in results)


def _gpu_count() -> int:
    from sglab.core import hardware

    return hardware.gpu_count() if hardware.has_cuda() else 0


def dry_run(fixes, skipped, gpus: int) -> int:
    from sglab.sglang.releases import release_installed

    print(f"dry run: {gpus} GPU(s) here; would run {len(fixes)} fix(es)")
    for line in describe(fixes):
        print(line)
    for line in skipped:
        print(line)
    for v in dict.fromkeys(s.release for f in fixes for s in f.gpu.steps):
        print(f"sglang {v}: {'installed' if release_installed(v) else 'not installed'}")
    return 0


def record(fixes, args) -> int:
    """``sglab real gpu``: the fixes named (all with a GPU plan by default) that this machine's GPUs
    allow."""
    from sglab.sglang.releases import GPU_RELEASES

    try:
        check_releases([f for f in fixes if f.gpu is not None], GPU_RELEASES)
        gpus = args.gpus if args.gpus is not None else _gpu_count()
        chosen, skipped = plan_for(fixes, args.fix or [f.name for f in fixes if f.gpu is not None],
                                   gpus)
    except ValueError as exc:
        print(f"sglab real gpu: {exc}", file=sys.stderr)
        return 2
    if args.budget is not None and args.budget <= 0:
        print(f"sglab real gpu: --budget must be positive, got {args.budget:g}", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(chosen, skipped, gpus)
    for line in skipped:
        print(line)
    if not chosen:  # a record of nothing must not look like one that passed
        print(f"sglab real gpu: nothing this machine can run ({gpus} GPUs)", file=sys.stderr)
        return 2
    ok = True
    deadline = time.monotonic() + args.budget if args.budget else None
    for fix in chosen:
        t0 = time.perf_counter()
        print(f"{fix.name}: {len(fix.gpu.steps)} step(s) on {', '.join(fix.gpu.releases)}")
        path, fine = record_fix(fix.name, fix.gpu, out=args.out, deadline=deadline)
        ok = ok and fine
        print(f"{fix.name}: {'ok' if fine else 'INCOMPLETE'} in {time.perf_counter() - t0:.1f} s "
              f"-> {path}")
    return 0 if ok else 1


def add_arguments(p) -> None:
    p.add_argument("--fix", nargs="+", metavar="F",
                   help="fixes (default: every fix with a GPU plan)")
    p.add_argument("--out", type=Path,
                   help="runs root (default data/runs); the run goes to OUT/real_<fix>/")
    p.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    p.add_argument("--gpus", type=int,
                   help="GPU count to plan for (default: the GPUs visible here)")
    p.add_argument(
        "--budget", type=float,
        help="seconds for all steps together: timeouts are cut to fit, and a step that "
        "no longer fits is recorded as not started")
