"""``sglab verify``: a verdict for any run — recorded, live here, or copied from someone's cluster.

Exit status: 0 when every applicable claim holds; 1 when one fails or, with ``--against``, a value
lies beyond its tolerance; 2 for bad input (one line)."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sglab.core import claims, hardware, runs
from sglab.sglang import engine as eng
from sglab.tools import fixes


class BadInput(Exception):
    """A missing or unreadable run, or an unknown experiment: one line, exit status 2."""


def load_run(path: str | Path, *, live: bool = False) -> runs.Run:
    """Read a run (CSV + manifest) and check that it is whole."""
    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix(".csv")
    if not path.exists():
        raise BadInput(f"no such run file: {path}")
    if path.is_dir():
        raise BadInput(f"{path} is a folder: name a run's .csv file (its .json manifest beside it)")
    mpath = path.with_suffix(".json")
    if not mpath.exists():
        raise BadInput(f"{path} has no manifest ({mpath.name} is missing)")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{mpath} is not a valid JSON manifest ({e})") from None
    if not isinstance(manifest, dict) or "experiment" not in manifest:
        raise BadInput(f"{mpath} is not a run manifest (no 'experiment' field)")
    try:
        df = pd.read_csv(path)
    except Exception as e:  # noqa: BLE001 - pandas raises several kinds for a damaged file
        raise BadInput(f"{path} cannot be read as a run CSV ({type(e).__name__}: "
                       f"{str(e).splitlines()[0]})") from None
    missing = [c for c in ("experiment", *runs.REQUIRED) if c not in df.columns]
    if missing:
        raise BadInput(f"{path} lacks the column(s) {missing} of a tidy run")
    if manifest.get("rows") is not None and int(manifest["rows"]) != len(df):
        raise BadInput(f"{path} has {len(df)} rows but its manifest recorded {manifest['rows']} "
                       "(truncated?)")
    if df["value"].isna().any() and not pd.api.types.is_numeric_dtype(df["value"]):
        raise BadInput(f"{path} has non-numeric values in the 'value' column")
    if manifest["experiment"] not in fixes.experiments():
        raise BadInput(f"{path}: unknown experiment {manifest['experiment']!r}; known: "
                       f"{', '.join(fixes.experiments())}")
    return runs.Run(df, manifest, path, live=live)


def targets(names: list[str], all_: bool) -> list[runs.Run]:
    """Runs named on the command line: experiments (all their recorded runs) or run files."""
    named = set(names)
    if all_:
        names = [*names, *fixes.experiments()]
    if not names:
        raise BadInput("say what to verify: an experiment, a run file, --all or --live")
    out: list[runs.Run] = []
    for name in dict.fromkeys(names):
        if name.endswith((".csv", ".json")) or "/" in name:
            out.append(load_run(name))
        elif name in fixes.experiments():
            found = runs.list_runs(name)
            if not found and name in named:  # a verify that verified nothing is not a pass
                raise BadInput(f"{name}: no recorded run to verify (record one, or sglab verify "
                               f"--live {name} on a machine that can run it)")
            out.extend(load_run(p) for p in found)
        else:
            raise BadInput(f"unknown experiment or run file {name!r}; experiments: "
                           f"{', '.join(fixes.experiments())}")
    return out


def gpus_for(measure, params: dict) -> int:
    return int(measure.gpus(params)) if hasattr(measure, "gpus") else measure.GPUS


_KIND = {  # what a --param of record must be, by the type of its default
    int: "an integer", (int, float): "a number", bool: "True or False", str: "a string",
    (list, tuple): "a list such as [1, 2]", dict: "a dict such as {'a': 1}"
}


def record(name: str, params: dict | None = None, *, recorded: bool = False,
           progress: bool = True) -> Path:
    """Run fix ``name``'s measurement live and save the run (data/runs/, or data/recorded/)."""
    mod = fixes.measure(name)
    defaults = mod.DEFAULT_PARAMS
    unknown = set(params or {}) - set(defaults)
    if unknown:
        raise BadInput(f"unknown parameter(s) for {name}: {sorted(unknown)}; known: "
                       f"{sorted(defaults)}")
    for k, v in (params or {}).items():
        d = defaults[k]
        kinds = {float: (int, float), list: (list, tuple)}.get(type(d), type(d))
        if d is not None and (not isinstance(v, kinds)
                              or isinstance(v, bool) != isinstance(d, bool)):
            kind = _KIND.get(kinds, f"a {type(d).__name__}")
            raise BadInput(f"--param {k}={v!r}: {name}'s {k} must be {kind} (default {d!r})")
    merged = {**defaults, **(params or {})}
    need = gpus_for(mod, merged)
    ok, why = hardware.meets(need)
    if not ok:
        raise BadInput(f"cannot record {name} live: {why}")
    t0 = time.perf_counter()
    path, rows = runs.measure(lambda: mod.run(merged, progress=progress), experiment=mod.EXPERIMENT,
                              method_version=mod.METHOD_VERSION, params=merged, gpu_count=need,
                              root=runs.data_dir("recorded") if recorded else None)
    print(f"[sglab] {name}: {rows} rows in {time.perf_counter() - t0:.1f} s → {path}")
    return path


def live(progress: bool = True, only=None) -> tuple[list[runs.Run], list[str]]:
    """Record every fix (or those of ``only``) this machine can run: (runs, skipped with why)."""
    done, skipped = [], []
    for name in [n for n in fixes.NAMES if only is None or n in only]:
        mod = fixes.measure(name)
        ok, why = hardware.meets(gpus_for(mod, mod.DEFAULT_PARAMS))
        if not ok:
            skipped.append(f"{name}: {why}")
            continue
        done.append(load_run(record(name, progress=progress), live=True))
    return done, skipped


def live_engines(progress: bool = True, only=None) -> tuple[list[runs.Run], list[str]]:
    """Run each engine scenario with claims this machine can start: (runs, skipped with why)."""
    echo = print if progress else (lambda _line: None)
    checked = {e.removeprefix("engine_") for e in fixes.experiments() if e.startswith("engine_")}
    done, skipped = [], []
    for sc in fixes.scenarios():
        if sc.fix not in checked or (only is not None and sc.experiment not in only):
            continue
        ok, why = hardware.meets(sc.gpus)
        if not ok:
            skipped.append(f"{sc.name}: {why}")
            continue
        results = []
        for spec in sc.specs():
            try:
                results.append(eng.run(spec, echo=echo))
            except eng.EngineError as e:
                skipped.append(f"{sc.name} {spec.variant}: {e}")
        if results:
            done.append(load_run(eng.record(results, sc.fix), live=True))
    return done, skipped


MARK = {claims.PASS: "pass", claims.FAIL: "FAIL", claims.NA: "n/a "}


def _short(text, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def format_comparison(c: claims.Comparison) -> str:
    lines = [f"  against {c.reference.path.name} ({c.how})"]
    for e in c.env:
        lines.append(f"    env  {e['field']}: {e['this run']} here vs {e['reference']} in the "
                     "reference")
    for d in c.drift:
        drift = ("" if d["drift"] is None else
                 f"{d['drift']:+.1%}" if d["drift"] != float("inf") else "inf")
        flag = "  BEYOND" if d["beyond"] else ""
        lines.append(f"    {d['claim']}.{d['value']}: {_num(d['this run'])} vs "
                     f"{_num(d['reference'])} (drift {drift or 'n/a'}, tolerance "
                     f"{d['tolerance']}){flag}")
    if c.unmatched:
        shown = ", ".join(
            c.unmatched[:4]) + (f" and {len(c.unmatched) - 4} more" if len(c.unmatched) > 4 else "")
        lines.append(f"    not in the reference, so held to nothing: {shown}")
    return "\n".join(lines)


def _num(x) -> str:
    """A compared value as printed: a float to 4 significant digits (1.744, not 1.74362577...)."""
    return f"{x:.4g}" if isinstance(x, float) else str(x)


@dataclass
class Verified:
    run: runs.Run
    results: list
    comparison: claims.Comparison | None = None
    drifted: list = field(default_factory=list)  # values beyond tolerance, same GPU model
    how: str = ""  # why there was no reference to compare with

    @property
    def failed(self) -> list:
        return [r for r in self.results if r.status == claims.FAIL]

    @property
    def unlisted(self) -> list:
        """The drifts that fail: those ``not_repeated.json`` does not name (shown, not failed)."""
        known = {(e["claim"], e["value"]) for e in listed() if e["run"] == self.run.path.name}
        return [d for d in self.drifted if (d["claim"], d["value"]) not in known]


def verify_run(run: runs.Run, *, against: bool = False, reference: runs.Run | None = None,
               recorded: dict | None = None) -> Verified:
    """``run``'s claims; with ``against``, compared with ``reference`` or else with the record."""
    exp = run.manifest.experiment
    mod = fixes.claims(exp)
    if not against:
        return Verified(run, claims.evaluate(mod, run))
    how, record = "given on the command line", None
    recorded = {} if recorded is None else recorded
    if reference is None and exp not in recorded:
        recorded[exp] = runs.load_all_recorded(exp)
    # the record's own copy of ``run`` where it is one, unchanged: its claims evaluated once
    twin = next((c for c in recorded.get(exp, [])
                 if runs.same_file(c, run) and c.manifest == run.manifest and c.df.equals(run.df)),
                run)
    v = Verified(run, claims.evaluated(mod, twin))
    if reference is None:
        reference, how, record, held = claims.reference(run, recorded[exp])
    else:
        held = claims.held_to(run, reference)
    if reference is None:
        v.how = how
        return v
    v.comparison = claims.compare(mod, run, reference, record, mine=v.results)
    v.comparison.how = how
    v.drifted = v.comparison.beyond if held else []
    return v


def listed() -> list[dict]:
    """``data/recorded/not_repeated.json``: the figures a run does not repeat, and why."""
    path = runs.data_dir("recorded") / "not_repeated.json"
    return json.loads(path.read_text()) if path.exists() else []


def not_repeated(recorded: dict | None = None) -> pd.DataFrame:
    """The figures of :func:`listed`, each with its value, the others', the tolerance and why."""
    recorded = {} if recorded is None else recorded
    rows = []
    for e in listed():
        exp, claim = e["claim"].split(".", 1)
        if exp not in recorded:
            recorded[exp] = runs.load_all_recorded(exp)
        run = next(r for r in recorded[exp] if r.path.name == e["run"])
        d = next((d for d in verify_run(run, against=True, recorded=recorded).drifted
                  if (d["claim"], d["value"]) == (e["claim"], e["value"])), {})
        ref, host = d.get("reference", ""), run.manifest.host_launch_us
        ref = f"{ref:.3g}" if isinstance(ref, float) else ref
        cost = ", ".join(f"{host[k]['median']:.1f}" for k in ("before", "after") if k in host)
        rows.append(
            (f"{run.manifest.gpu}, {run.manifest.created_utc[:16].replace('T', ' ')}", claim,
             e["value"], f"{d['this run']:.3g}" if d else "within tolerance now", ref,
             d.get("tolerance", ""), cost, e["why"]))
    columns = ("run", "claim", "figure", "this run", "the other runs", "tolerance",
               "host µs per launch", "why")
    return pd.DataFrame(rows, columns=columns).set_index(list(columns[:3]))


def partial(run) -> str:
    """What a run cut short by a signal ran and missed, in words; '' for a whole run."""
    p = run.manifest.partial
    if not p:
        return ""
    starts = Counter(m.split(" start ")[0] for m in p.get("missing") or [])
    missing = ", ".join(v + (f" ×{n}" if n > 1 else "") for v, n in starts.items()) or "none"
    return (f"{p.get('ran')} of {p.get('planned')} engines, stopped by {p.get('stopped_by')}; "
            f"not run: {missing}")


def block(v: Verified) -> tuple[list[str], list[str]]:
    """One verified run's lines and its FAIL lines (printed after the count)."""
    m, out, bad = v.run.manifest, [], []
    out.append(f"== {m.experiment} · {v.run.path.name} (method {m.method_version})")
    # one line per claim (its folded checks indented under it), the ids padded to the longest
    names = [("└ " if r.parent else "") + r.claim.id for r in v.results]
    width = max(map(len, names), default=0)
    for r, name in zip(v.results, names):
        detail = r.outcome.measured if r.status != claims.NA else r.outcome.reason
        out.append(f"  {MARK[r.status]}  {name:<{width}}  {_short(detail, 70)}  "
                   f"(expected {_short(r.claim.expected, 50)})")
        if r.status == claims.FAIL and r.outcome.reason and r.outcome.reason != r.outcome.measured:
            out.append(f"        why: {_short(r.outcome.reason, 120)}")
    out.append("  → " + claims.verdict_line(v.results, v.run))
    cut = partial(v.run)
    if cut:
        out.append(f"  partial: {cut}")
        bad.append(f"FAIL {v.run.path.name}: a partial run ({cut}), not a record: rerun the "
                   "scenario whole")
    if v.comparison is not None:
        out.append(format_comparison(v.comparison))
    elif v.how:
        out.append(f"  against: {v.how}")
    for r in v.failed:
        bad.append(f"FAIL {r.claim.id} in {v.run.path.name}: "
                   f"{r.outcome.reason or r.outcome.measured}")
    unlisted = v.unlisted
    for d in v.drifted:
        said = (f"{v.run.path.name}: {d['claim']}.{d['value']} is {_num(d['this run'])} against "
                f"{_num(d['reference'])} in a reference of the same GPU model, beyond its "
                f"tolerance ({d['tolerance']})")
        if d in unlisted:
            bad.append(f"FAIL {said}")
        else:
            out.append(f"  not repeated, as data/recorded/not_repeated.json says (07 shows why): "
                       f"{said}")
    return out, bad


def tail(vs: list[Verified], bad: list[str]) -> tuple[str, int]:
    """The count of runs that hold and fail, then every FAIL line (``bad``); the exit status."""
    n_fail = sum(1 for v in vs if v.failed or v.unlisted or partial(v.run))
    return "\n".join([f"\n{len(vs)} run(s): {len(vs) - n_fail} hold, {n_fail} fail",
                      *bad]), (1 if n_fail else 0)


def junit(vs: list[Verified]) -> str:
    return claims.junit_xml([
        (f"{v.run.manifest.experiment}.{v.run.path.stem}", v.results) for v in vs
    ])
