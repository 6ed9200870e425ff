"""Every recorded real-engine run, one row each: the ledger of ``docs/operating.md``."""

from __future__ import annotations

from collections import Counter

from sglab.core import claims, engine_records, runs
from sglab.tools import fixes


START, END = "<!-- engine-runs:start -->", "<!-- engine-runs:end -->"
HEADER = (
    "| run (UTC) | scenario | releases: cases | starts | engines | host µs/launch | claims |\n"
    "|---|---|---|---|---|---|---|")


def scenario_of(run) -> str:
    """The fix's scenario that holds every case the run started; else its model and TP size."""
    specs = run.manifest.params.get("specs", [])
    fix = run.manifest.experiment.removeprefix("engine_")
    models = {s.get("model") for s in specs}
    tps = {s["tp"] for s in specs}
    cases = {s.get("case") for s in specs}
    tools = {s.get("tool", "bench") for s in specs}  # the spec's default tool
    for sc in fixes.scenarios():
        labels = {c.label for c in sc.all_cases()}
        if (sc.fix == fix and models == {sc.model} and tps == {sc.gpus} and cases <= labels
                and tools == {sc.tool}):
            return sc.name
    return f"{', '.join(sorted(map(str, models)))} at TP {', '.join(map(str, sorted(tps)))}"


def row(run) -> str:
    m = run.manifest
    specs = m.params.get("specs", [])
    host = engine_records.run_host_us(run)
    when = m.created_utc[:16].replace("T", " ")
    of = m.gpu_count_machine
    part = f" of {of}" if of and of != m.gpu_count else ""  # a TP-2 run on a 4-GPU machine
    where = f"{m.gpu} ×{m.gpu_count}{part}{engine_records.pinned(run)}"
    host = "" if host is None else f"{host:.1f}"
    per: dict = {}
    for s in specs:
        per.setdefault(s.get("release"), dict())[s.get("case")] = None
    cases = "; ".join(
        f"{v}: {', '.join(c) if len(c) <= 4 else f'{len(c)} cases'}" for v, c in per.items())
    # the interleaved starts of each variant, and whether a launch-counting pass followed
    counted = [s.get("profile") and s.get("profile_stage") == "prefill" for s in specs]
    n = 1 + max((s.get("start") or 0 for s, c in zip(specs, counted) if not c), default=0)
    # how the engines ended: their number where all answered, else each status counted
    by = Counter(e.get("status", "?") for e in m.engine_runs)
    ended = (f"{len(m.engine_runs)} ok" if set(by) <= {"ok"} else ", ".join(
        f"{count} {status}" for status, count in sorted(by.items(), key=lambda x: x[0] != "ok")))
    verdict = (claims.verdict(claims.evaluate(fixes.claims(m.experiment), run))
               if m.experiment in fixes.experiments() else "no claims")  # as 07 shows it
    cells = (f"{when} {where}", f"`{scenario_of(run)}`", cases,
             f"{n}{' + launch pass' if any(counted) else ''}", ended, host, verdict)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def every_run() -> list:
    """The recorded engine runs of every fix, oldest first."""
    found = [r for f in fixes.FIXES if f.engine for r in runs.load_all_recorded(f"engine_{f.name}")]
    return sorted(found, key=lambda r: str(r.manifest.created_utc))


def not_recorded(found: list) -> list[str]:
    """One line per scenario with releases that no recorded run started."""
    started: dict = {}
    for r in found:
        started.setdefault(scenario_of(r), set()).update(
            s.get("release") for s in r.manifest.params.get("specs", []))
    out = []
    for sc in fixes.scenarios():
        missing = [v for v in sc.releases if v not in started.get(sc.name, set())]
        if missing:
            out.append(f"- `{sc.name}` ({sc.gpus} GPU{'s' if sc.gpus > 1 else ''}): "
                       f"{', '.join(missing)}")
    return out


def block() -> str:
    found = every_run()
    gpus = sorted({f"{runs.gpu_short(r.manifest)} ×{r.manifest.gpu_count}" for r in found})
    days = sorted({str(r.manifest.created_utc)[:10] for r in found})
    said = (f"{len(found)} recorded runs on {', '.join(gpus)}, {days[0]} to {days[-1]}"
            if found else "No recorded engine run yet.")
    lines = [START, said, "", HEADER, *(row(r) for r in found)]
    missing = not_recorded(found)
    if missing:
        lines += ["", "Releases of a scenario that no recorded run has started:", "", *missing]
    return "\n".join([*lines, END])
