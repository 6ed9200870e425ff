"""Claims as code: what each experiment's runs must show, checked on any run (recorded, live, or a cluster's).

Each experiment package has a ``claims`` module with

- ``CLAIMS``: a list of :class:`Claim` — an id, a sentence a reader understands, the expectation in words (with its
  tolerance) and a ``check(run) -> Outcome``;
- ``shown(runs) -> list[Run]``: which runs a reader sees (the newest per GPU model, or per world size);
- ``headline(runs) -> str``: the numbers sentence of the README index and of the notebook's first screen, built
  from the claims' measured values (:func:`values`), so that no second copy of the logic exists.

A claim that does not apply to a run (too few GPUs, another parameter set, a method version it does not cover)
says "n/a" and why; it never passes silently. A check that cannot evaluate a run (a missing metric, a dropped rank)
fails, naming what is missing.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

PASS, FAIL, NA = "pass", "fail", "n/a"
STATUSES = (PASS, FAIL, NA)


@dataclass(frozen=True)
class Outcome:
    """What a check found. ``value`` is the machine-readable measurement (a number or a dict of numbers) that
    headlines and ``--against`` comparisons use; ``measured`` is the same for a reader."""

    status: str
    measured: str = ""
    value: Any = None
    reason: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def holds(condition: bool, measured: str, value: Any = None, *, why_not: str = "") -> Outcome:
    """PASS when ``condition`` holds, else FAIL with ``why_not`` (default: the measured text)."""
    if condition:
        return Outcome(PASS, measured, value)
    return Outcome(FAIL, measured, value, why_not or f"measured {measured}")


def not_applicable(reason: str) -> Outcome:
    return Outcome(NA, "", None, reason)


@dataclass(frozen=True)
class Claim:
    """One executable claim.

    ``methods``: the method versions (inclusive range, ``None`` = open) whose runs the claim covers.
    ``applies``: optional ``run -> reason or None``; a reason makes the claim n/a for that run.
    ``drift``: for ``--against``: ``None`` means the value must equal the reference's exactly (counts, sizes);
    a number is the relative difference tolerated (timings, ratios) before the drift is reported.
    """

    id: str
    statement: str
    expected: str
    check: Callable[[Any], Outcome]
    methods: tuple = (1, None)
    applies: Optional[Callable[[Any], Optional[str]]] = None
    drift: Optional[float] = None

    def covers(self, method_version: int) -> bool:
        lo, hi = self.methods
        return method_version >= lo and (hi is None or method_version <= hi)


@dataclass
class Result:
    claim: Claim
    outcome: Outcome

    @property
    def status(self) -> str:
        return self.outcome.status


class ClaimsError(RuntimeError):
    """A run or an experiment the claims cannot be evaluated on (one-line message for the command line)."""


# --------------------------------------------------------------------------------------------------------------
# finding an experiment's claims
# --------------------------------------------------------------------------------------------------------------
def experiments() -> list[str]:
    """The experiments of the workbook, in notebook order."""
    from sglab.tools.catalog import NOTEBOOKS

    return [e.experiment for e in NOTEBOOKS if e.experiment]


def module(experiment: str):
    """``sglab.experiments.<experiment>.claims``."""
    if experiment not in experiments():
        raise ClaimsError(f"unknown experiment {experiment!r}; known: {', '.join(experiments())}")
    try:
        return importlib.import_module(f"sglab.experiments.{experiment}.claims")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith(f"sglab.experiments.{experiment}"):
            raise ClaimsError(f"experiment {experiment!r} declares no claims (sglab.experiments.{experiment}.claims "
                              "is missing)") from None
        raise


def claims_of(experiment: str) -> list[Claim]:
    return list(module(experiment).CLAIMS)


# --------------------------------------------------------------------------------------------------------------
# evaluating
# --------------------------------------------------------------------------------------------------------------
def _method(run) -> int:
    try:
        return int(run.manifest.get("method_version", 1))
    except (TypeError, ValueError):
        return 1


def evaluate_claim(claim: Claim, run) -> Outcome:
    mv = _method(run)
    if not claim.covers(mv):
        lo, hi = claim.methods
        span = f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}–{hi}")
        return not_applicable(f"run has method version {mv}; this claim covers method version {span}")
    if claim.applies is not None:
        reason = claim.applies(run)
        if reason:
            return not_applicable(reason)
    try:
        out = claim.check(run)
    except Exception as e:  # noqa: BLE001 - a check that cannot read the run fails, naming why
        return Outcome(FAIL, "", None, f"could not evaluate: {type(e).__name__}: {e}")
    if not isinstance(out, Outcome):
        return Outcome(FAIL, "", None, f"check returned {type(out).__name__}, not an Outcome")
    return out


def evaluate(experiment: str, run) -> list[Result]:
    """Every claim of ``experiment`` on ``run``."""
    if run.manifest.get("experiment") not in (None, experiment):
        raise ClaimsError(f"{getattr(run, 'path', 'run')} is a {run.manifest.get('experiment')!r} run, "
                          f"not {experiment!r}")
    return [Result(c, evaluate_claim(c, run)) for c in claims_of(experiment)]


def values(experiment: str, run) -> dict:
    """``{claim id: Outcome}`` of one run: what headlines format."""
    return {r.claim.id: r.outcome for r in evaluate(experiment, run)}


def counts(results: list[Result]) -> dict:
    return {s: sum(r.status == s for r in results) for s in STATUSES}


def verdict_line(results: list[Result], run) -> str:
    """E.g. "5/5 claims hold on H100 ×1, 2026-11-21" or "3/4 claims hold, 1 fails (x), 1 n/a on …"."""
    from sglab.core.runs import gpu_short

    c = counts(results)
    applicable = c[PASS] + c[FAIL]
    m = run.manifest
    where = f"{gpu_short(m)} ×{m.get('gpu_count', '?')}, {str(m.get('created_utc', ''))[:10]}"
    text = f"{c[PASS]}/{applicable} claims hold"
    if c[FAIL]:
        failed = ", ".join(r.claim.id for r in results if r.status == FAIL)
        text += f", {c[FAIL]} fail{'s' if c[FAIL] == 1 else ''} ({failed})"
    if c[NA]:
        text += f", {c[NA]} n/a"
    return f"{text} on {where}"


def table(results: list[Result]):
    """claim, statement, status, measured, expected, reason — one row per claim."""
    import pandas as pd

    return pd.DataFrame([{"claim": r.claim.id, "statement": r.claim.statement, "status": r.status,
                          "measured": r.outcome.measured, "expected": r.claim.expected,
                          "reason": r.outcome.reason} for r in results])


# --------------------------------------------------------------------------------------------------------------
# a run against its reference
# --------------------------------------------------------------------------------------------------------------
ENV_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "python", "sglang")


def _flat(value, prefix="") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def _number(v) -> Optional[float]:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
        return float(v)
    return None


def drift_rows(results: list[Result], ref_results: list[Result]) -> list[dict]:
    """Per claim and value: this run, the reference, the relative drift and whether it is beyond tolerance."""
    ref = {r.claim.id: r for r in ref_results}
    rows = []
    for r in results:
        rr = ref.get(r.claim.id)
        if rr is None or r.outcome.value is None or rr.outcome.value is None:
            continue
        mine, theirs = _flat(r.outcome.value, ""), _flat(rr.outcome.value, "")
        for key in sorted(set(mine) & set(theirs)):
            a, b = _number(mine[key]), _number(theirs[key])
            if a is None or b is None:
                beyond = mine[key] != theirs[key]
                rel = None
            else:
                rel = 0.0 if a == b else (abs(a - b) / abs(b) if b else math.inf)
                tol = r.claim.drift
                beyond = (a != b) if tol is None else rel > tol
            rows.append({"claim": r.claim.id, "value": key or "value", "this run": mine[key],
                         "reference": theirs[key], "drift": rel,
                         "tolerance": "exact" if r.claim.drift is None else f"±{r.claim.drift:.0%}",
                         "beyond": bool(beyond)})
    return rows


def env_diff(run, ref) -> list[dict]:
    """The environment fields that differ between a run and its reference."""
    out = []
    for k in ENV_KEYS:
        a, b = run.manifest.get(k), ref.manifest.get(k)
        if a != b:
            out.append({"field": k, "this run": a, "reference": b})
    return out


@dataclass
class Comparison:
    reference: Any
    how: str  # why this reference: same GPU model, or the nearest
    drift: list = field(default_factory=list)
    env: list = field(default_factory=list)

    @property
    def beyond(self) -> list:
        return [d for d in self.drift if d["beyond"]]


def pick_reference(experiment: str, run, candidates: list) -> tuple[Any, str]:
    """The newest candidate of the same GPU model and the same key parameters (world / TP size); else the nearest
    (same key parameters, another GPU), said explicitly. ``(None, reason)`` when there is none."""
    from sglab.core.runs import gpu_short

    def key(r):
        p = r.manifest.get("params", {}) or {}
        return tuple(p.get(k) for k in ("world_size", "tp_size"))

    others = [c for c in candidates if getattr(c, "path", None) != getattr(run, "path", None)]
    others.sort(key=lambda r: str(r.manifest.get("created_utc", "")))
    same = [c for c in others if gpu_short(c.manifest) == gpu_short(run.manifest) and key(c) == key(run)]
    if same:
        return same[-1], f"newest recorded run of the same GPU model ({gpu_short(run.manifest)}) and size"
    near = [c for c in others if key(c) == key(run)]
    if near:
        r = near[-1]
        return r, (f"no recorded {gpu_short(run.manifest)} run of this size: nearest is the newest "
                   f"{gpu_short(r.manifest)} run")
    return None, "no recorded run of this experiment and size to compare with"


def compare(experiment: str, run, reference) -> Comparison:
    return Comparison(reference, "", drift_rows(evaluate(experiment, run), evaluate(experiment, reference)),
                      env_diff(run, reference))


# --------------------------------------------------------------------------------------------------------------
# JUnit XML (for a cluster's CI)
# --------------------------------------------------------------------------------------------------------------
def junit_xml(suites: list[tuple[str, list[Result]]]) -> str:
    """One ``<testsuite>`` per run, one ``<testcase>`` per claim; fail -> ``<failure>``, n/a -> ``<skipped>``."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites")
    for name, results in suites:
        c = counts(results)
        suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(results)), failures=str(c[FAIL]),
                              skipped=str(c[NA]), errors="0")
        for r in results:
            case = ET.SubElement(suite, "testcase", classname=name, name=r.claim.id)
            ET.SubElement(case, "system-out").text = f"{r.claim.statement}\nmeasured: {r.outcome.measured}\n" \
                                                     f"expected: {r.claim.expected}"
            if r.status == FAIL:
                ET.SubElement(case, "failure", message=r.outcome.reason or "claim does not hold").text = \
                    r.outcome.measured
            elif r.status == NA:
                ET.SubElement(case, "skipped", message=r.outcome.reason)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


# --------------------------------------------------------------------------------------------------------------
# what readers see: the README index and the notebooks' first screens use these two
# --------------------------------------------------------------------------------------------------------------
def shown(experiment: str, runs_: list) -> list:
    return list(module(experiment).shown(runs_)) if runs_ else []


def headline(experiment: str, runs_: list) -> str:
    """The numbers sentence for ``runs_`` (already the runs a reader is shown)."""
    if not runs_:
        return "no recorded run yet"
    return module(experiment).headline(runs_)
