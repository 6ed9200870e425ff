"""Where a notebook's wall time goes: per cell, grouped into phases, saved as a ``workbook`` run.

A cell's phase is the ``##`` section it sits in or its ``phase:NAME`` tag; "kernel start + stop" is
what no cell accounts for, so the phases add up to the wall time."""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from sglab.core import runs


EXPERIMENT = "workbook"
METHOD_VERSION = 1
KERNEL_PHASE = "kernel start + stop"
NOT_RECORDED = "not recorded yet"
_SECTION = re.compile(r"^##\s+(.+?)\s*#*\s*$", re.M)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def _start_stamp(execution: dict):
    return execution.get("iopub.status.busy") or execution.get("iopub.execute_input")


def _row(stem: str, mode: str, phase: str, cell: int, first: str, value: float,
         metric: str = "wall_s") -> dict:
    return dict(variant=stem, mode=mode, phase=phase, cell=cell, first_line=first, metric=metric,
                value=value, unit="s")


def cell_rows(nb, stem: str, mode: str, total_s: float) -> list[dict]:
    """One row per executed code cell plus the kernel row, summing to ``total_s``."""
    rows, phase = [], "setup"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            m = _SECTION.search(cell.source)
            phase = re.sub(r"[`*]", "", m.group(1)) if m else phase
            continue
        ex = cell.get("metadata", {}).get("execution") or {}
        start, end = _start_stamp(ex), ex.get("iopub.status.idle") or ex.get("shell.execute_reply")
        if cell.cell_type != "code" or not start or not end:
            continue
        s = max(0.0, _when(end) - _when(start))
        tags = cell.get("metadata", {}).get("tags", [])
        tagged = next((t.split(":", 1)[1].strip() for t in tags if t.startswith("phase:")), None)
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")[:60]
        rows.append(_row(stem, mode, tagged or phase, i, first, round(s, 3)))
    rest = max(0.0, total_s - sum(r["value"] for r in rows))
    return rows + [_row(stem, mode, KERNEL_PHASE, -1, "", round(rest, 3))]


def live_runs(result, runs_root=None) -> list:
    """CSV paths of the runs a live notebook wrote while it ran (under ``runs_root``/data/runs)."""
    from sglab.tools.fixes import by_stem

    entry = by_stem(result.path.stem)
    if result.mode != "live" or entry is None or not entry.experiment or result.started is None:
        return []
    end = result.started + result.seconds + 1.0
    found = runs.list_runs(entry.experiment, kind="runs", root=runs_root)
    return [p for p in found if result.started <= p.stat().st_mtime <= end]


def frame(results, runs_root=None):
    """The tidy frame of a whole ``sglab run`` (its live runs' phases as ``measure_s`` rows)."""
    rows = []
    for r in (r for r in results if r.nb is not None):
        rows += cell_rows(r.nb, r.path.stem, r.mode, r.seconds)
        rows += [
            _row(r.path.stem, r.mode, f"measure: {name}", -1, path.name, float(s), "measure_s")
            for path in live_runs(r, runs_root)
            for name, s in runs.read_run(path).manifest.phases_s.items()
        ]
    return runs.tidy(EXPERIMENT, rows)


def phase_table(df, metric: str = "wall_s"):
    """Seconds per notebook and phase, in order of first appearance."""
    part = df[df["metric"] == metric]
    g = part.groupby(["variant", "phase"], sort=False)["value"].sum().round(2).reset_index()
    g.columns = ["notebook", "phase", "seconds"]
    return g


def summary(df) -> str:
    """The printed breakdown: each notebook's total and phases, then the grand total."""
    lines = []
    inner = phase_table(df, "measure_s")
    for stem, part in phase_table(df).groupby("notebook", sort=False):
        mine = df[(df["variant"] == stem) & (df["metric"] == "wall_s")]
        lines.append(f"{stem} ({mine['mode'].iloc[0]}): {mine['value'].sum():.1f} s")
        own = inner[inner["notebook"] == stem]
        for rows, fmt in ((part, "  {:8.1f} s  {}"), (own, "      {:8.2f} s  {}")):
            top = rows.sort_values("seconds", ascending=False)
            lines += [fmt.format(s, p) for s, p in zip(top["seconds"], top["phase"])]
    lines.append(f"total: {df.loc[df['metric'] == 'wall_s', 'value'].sum():.1f} s")
    return "\n".join(lines)


def write(results, *, record: bool = False, params: dict | None = None, runs_root=None,
          machine: dict | None = None):
    """Save the timings of ``results`` as a ``workbook`` run; return the CSV path."""
    df = frame(results, runs_root)
    totals = {
        r.path.stem: dict(seconds=round(r.seconds, 1), status=r.status, mode=r.mode)
        for r in results
    }
    root = runs.data_dir("recorded") if record else None
    return runs.write_run(df, experiment=EXPERIMENT, method_version=METHOD_VERSION, params=params
                          or {}, root=root, extra={"notebooks": totals, **(machine or {})})


def from_reports(reports, runs_root) -> tuple[list, dict]:
    """The results of the run that wrote ``reports``' ``index.json`` and its machine's fields."""
    reports = Path(reports)
    try:
        index = json.loads((reports / "index.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{reports}: no readable index.json ({e})") from None
    # the notebooks of the run that wrote the index: not those it kept from earlier runs into the
    # folder (an index from before entries named their run: all of them)
    this_run = max((e.get("run_utc") or "" for e in index), default="")
    results = []
    for entry in (e for e in index if e.get("run_utc", "") == this_run):
        r = entry_result(reports, entry)
        if r.nb is None:
            raise ValueError(f"{r.path}: listed in index.json but not there")
        code = [c for c in r.nb.cells if c.cell_type == "code"]
        stamps = [_start_stamp(c.get("metadata", {}).get("execution") or {}) for c in code]
        stamps = [_when(s) for s in stamps if s]
        r.started = min(stamps) - 0.5 if stamps else None  # the kernel starts before its first cell
        results.append(r)
    machines, keys = {}, ("gpu_name", "gpu_count", "gpu_count_machine", "gpu_memory_mib", "driver",
                          "cuda", "torch", "python", "platform", "git_sha")
    for r in results:
        for csv in live_runs(r, runs_root):
            m = runs.read_run(csv).manifest
            machines[csv.name] = {k: getattr(m, k) for k in keys}
    distinct = {json.dumps(m, sort_keys=True) for m in machines.values()}
    if len(distinct) != 1:
        raise ValueError(f"the live runs under {runs_root} name {len(distinct)} machines "
                         f"({', '.join(sorted(machines)) or 'no live run found'}): cannot tell "
                         "where the notebooks ran")
    machine = json.loads(distinct.pop())
    first = min((r.started for r in results if r.started is not None), default=None)
    if first is not None:  # when the notebooks ran, not when their timings were saved here
        machine["created_utc"] = datetime.fromtimestamp(first,
                                                        timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return results, machine


def entry_result(folder: Path, entry: dict):
    """The Result of an ``index.json`` entry, with its executed notebook where that reads."""
    import nbformat

    from sglab.tools.nbtools import Result

    nb = None
    with contextlib.suppress(Exception):  # a damaged copy: the Result goes without it
        nb = nbformat.read(folder / entry["notebook"], as_version=4)
    return Result(folder / entry["notebook"], entry["status"], entry["mode"],
                  float(entry["seconds"]), entry.get("error", ""), nb=nb)


def live_seconds(run) -> dict[str, float]:
    """``{notebook stem: seconds}`` of the notebooks that ran live in a recorded timing run."""
    df = run.df
    live = df[(df["mode"] == "live") & (df["metric"] == "wall_s")]
    return {str(k): float(v) for k, v in live.groupby("variant")["value"].sum().items()}


def live_times(root=None) -> dict[str, str]:
    """``{notebook stem: "H100 ×1: 23.4 s; H200 ×2: 41.0 s"}`` (newest run per GPU model)."""
    found = runs.load_all_recorded(EXPERIMENT, root=root)
    found = [r for r in found if r.manifest.gpu_name != "cpu"]
    out: dict[str, list[str]] = {}
    for gpu, run in runs.newest_by(found, runs.gpu_short).items():
        for stem, s in live_seconds(run).items():
            out.setdefault(stem, []).append(f"{gpu} ×{run.manifest.gpu_count}: {s:.1f} s")
    return {stem: "; ".join(parts) for stem, parts in out.items()}
