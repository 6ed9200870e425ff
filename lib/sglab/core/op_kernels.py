"""A per-kernel table of one eager step: which op launched which kernel, how often, and how long it ran, from
torch.profiler and from nsight-python, so that each tool checks the other.

    steps = {"before": lambda mode: step_a(mode),    # each runs one step; may label parts with mode.scope("...")
             "after": lambda mode: step_b(mode)}
    ns, why = nsight_table(steps, runs=5)            # nsight-python's CUPTI backend, or (None, why not) -- first
    tp = torch_table(steps, runs=5)                  # torch.profiler (Kineto)

Both tables have :data:`COLUMNS`: ``variant`` (the key of ``steps``), ``scope, step, op`` (from
:mod:`sglab.core.ops` labels), ``kernel`` (demangled), ``calls`` (per step), ``median_us`` (per call, over every
call of every run) and ``backend``.

Eager only: nsight-python's CUPTI backend attributes a kernel to the annotation that was open when it was
*launched* (``cuLaunchKernel*``), and a graph replay launches its kernels through ``cuGraphLaunch``, so kernels
inside a replay are attributed to nothing. CUPTI has one subscriber per process: nsight-python must run before
torch.profiler has been used in the process (it releases CUPTI when done, and torch.profiler works afterwards).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from sglab.core import ops

COLUMNS = ["variant", "scope", "step", "op", "kernel", "calls", "median_us", "backend"]
TORCH, NSIGHT = "torch.profiler", "nsight-python (CUPTI)"
KEY = ["variant", "scope", "step", "op", "kernel"]

Step = Callable[[ops.OpRanges], object]


def aggregate(samples, *, runs: int, backend: str):
    """Per (variant, scope, step, op, kernel): calls per step and the median duration per call.

    ``samples``: one row per kernel execution with ``variant``, ``label`` (an op label), ``kernel``, ``dur_us``.
    ``step`` is -1 for ops outside any scope."""
    import pandas as pd

    if not len(samples):
        return pd.DataFrame(columns=COLUMNS)
    parsed = [ops.parse_label(lbl) for lbl in samples["label"]]
    df = samples.assign(scope=[c.scope for c in parsed], step=[-1 if c.step is None else c.step for c in parsed],
                        op=[c.op for c in parsed])
    g = df.groupby(KEY, sort=False).dur_us
    out = g.agg(n="size", median_us="median").reset_index()
    out["calls"] = out.n / runs
    out["backend"] = backend
    return out[COLUMNS]


def _run_steps(step: Step, enter, runs: int, *, unique: bool = False) -> None:
    for _ in range(runs):
        with ops.OpRanges(enter, unique=unique) as mode:
            step(mode)


def _warm(steps: Mapping[str, Step], warmup: int) -> None:
    import torch

    for step in steps.values():
        _run_steps(step, None, warmup)
    torch.cuda.synchronize()


def torch_table(steps: Mapping[str, Step], *, runs: int = 5, warmup: int = 1):
    """torch.profiler over ``runs`` steps, one session per variant, every op in a ``record_function`` range;
    kernels are attributed through the device-side copy of the range, which spans the kernels launched inside."""
    import pandas as pd

    from sglab.core import trace

    _warm(steps, warmup)
    parts = []
    for variant, step in steps.items():
        with trace.Recorder() as rec:
            _run_steps(step, trace.phase, runs)
        ev = rec.events
        k = ev[(ev.category == "kernel") & (ev.phase != "")]
        parts.append(pd.DataFrame({"variant": variant, "label": k.phase.to_numpy(), "kernel": k.name.to_numpy(),
                                   "dur_us": k.dur_us.to_numpy()}))
    return aggregate(pd.concat(parts, ignore_index=True), runs=runs, backend=TORCH)


def nsight_available() -> tuple[bool, str]:
    """Whether nsight-python's CUPTI backend can be imported here, and if not, why."""
    os.environ.setdefault("NSPY_NCU_INIT_AT_IMPORT", "0")  # importing nsight would otherwise load Nsight Compute
    try:
        import nsight  # noqa: F401
        from nsight.collection import cupti
    except ImportError as e:
        return False, f"nsight-python is not installed ({e})"
    if not getattr(cupti, "CUPTI_AVAILABLE", False):
        return False, "nsight-python is installed but cupti-python is not importable"
    return True, f"nsight-python {getattr(nsight, '__version__', '?')} with CUPTI"


def nsight_table(steps: Mapping[str, Step], *, runs: int = 5, warmup: int = 1):
    """nsight-python's CUPTI backend over ``runs`` steps of each variant, one annotation per op: ``(table,
    reason)``, or ``(None, reason)`` when it cannot run here (not installed, CUPTI already taken by torch.profiler
    in this process, ...). Per-call durations come from nsight-python's raw CSV (``output_csv=True``): one row per
    kernel and run. Annotations must be unique within a run, hence ``unique=True`` labels."""
    ok, reason = nsight_available()
    if not ok:
        return None, reason
    import nsight

    _warm(steps, warmup)
    try:
        nsight.activate(nsight.Tool.CUPTI)
    except Exception as e:  # noqa: BLE001 - e.g. CUPTI already subscribed by torch.profiler
        return None, f"nsight-python could not take CUPTI: {type(e).__name__}: {e}"
    try:
        raw = _nsight_raw(nsight, steps, runs)
    except Exception as e:  # noqa: BLE001
        return None, f"nsight-python failed: {type(e).__name__}: {e}"
    finally:
        nsight.deactivate()  # releases CUPTI for torch.profiler
    return aggregate(raw, runs=runs, backend=NSIGHT), reason


def _nsight_raw(nsight, steps: Mapping[str, Step], runs: int):
    """One nsight-python profile per variant (annotations differ between variants, and nsight-python expects the
    same annotations in every config of one profile); its raw rows as variant, label, kernel, dur_us."""
    import glob
    import tempfile

    import pandas as pd

    parts = []
    for variant, step in steps.items():
        with tempfile.TemporaryDirectory() as tmp:
            @nsight.analyze.kernel(configs=[(0,)], runs=runs, output_prefix=tmp + "/", output_csv=True,
                                   thermal_mode="off", verbosity=nsight.VerbosityLevel.SILENT,
                                   combine_kernel_metrics=lambda a, b: a + b)
            def eager_step(_unused, step=step):
                _run_steps(step, nsight.annotate, 1, unique=True)

            eager_step()
            raw = pd.concat([pd.read_csv(f) for f in glob.glob(f"{tmp}/profiled_data-*.csv")])
        kernels = [" + ".join(ops.demangle(k) for k in str(name).split("|")) for name in raw["Kernel"]]
        parts.append(pd.DataFrame({"variant": variant, "label": raw["Annotation"].to_numpy(), "kernel": kernels,
                                   "dur_us": raw["Value"].astype(float).to_numpy() / 1e3}))
    return pd.concat(parts, ignore_index=True)


def cross_check(a, b) -> dict:
    """Compare the kernel calls per (variant, scope, step, op, kernel) of two tables: ``{"rows": n, "equal": n,
    "only_in_a": [...], "only_in_b": [...], "differ": [...]}``."""
    ca = {tuple(r[k] for k in KEY): float(r["calls"]) for _, r in a.iterrows()}
    cb = {tuple(r[k] for k in KEY): float(r["calls"]) for _, r in b.iterrows()}
    both = set(ca) & set(cb)
    return {"rows": len(set(ca) | set(cb)), "equal": sum(ca[k] == cb[k] for k in both),
            "only_in_a": sorted(set(ca) - set(cb)), "only_in_b": sorted(set(cb) - set(ca)),
            "differ": sorted(k for k in both if ca[k] != cb[k])}
