"""Claims as code: what a fix's runs must show, checked on any run (recorded, live, or a cluster's).
A fix's ``claims`` module has ``CLAIM``, ``CLAIMS`` (at most five :class:`Claim` s, their checks
``folded`` under them), ``shown(runs)``, ``HEADLINE``, ``CARD`` and ``ENGINE``; :func:`reference`
is the one rule for what a rerun is compared with."""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Callable, Optional


PASS, FAIL, NA = "pass", "fail", "n/a"
STATUSES = (PASS, FAIL, NA)


@dataclass(frozen=True)
class Outcome:
    """What a check found: ``value`` the number(s) headlines read, ``measured`` its text."""

    status: str
    measured: str = ""
    value: Any = None
    reason: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def holds(condition: bool, measured: str, value: Any = None, *, why_not: str = "") -> Outcome:
    """PASS when ``condition`` holds, else FAIL with ``why_not`` (default: the measured text)."""
    return Outcome(PASS, measured, value) if condition else Outcome(
        FAIL, measured, value, why_not or f"measured {measured}")


def not_applicable(reason: str) -> Outcome:
    return Outcome(NA, "", None, reason)


@dataclass(frozen=True)
class Claim:
    """One executable claim. ``methods``: the method versions it covers; ``applies``: ``run ->
    reason it is n/a or None``; ``drift``: the relative difference ``--against`` tolerates (None:
    exact), widened by the A/A gap under key ``noise``; ``context``: value keys not compared."""

    id: str
    statement: str
    expected: str
    check: Callable[[Any], Outcome]
    methods: tuple = (1, None)
    applies: Optional[Callable[[Any], Optional[str]]] = None
    drift: Optional[float] = None
    folded: tuple = ()
    context: tuple = ()
    noise: str = ""


@dataclass
class Result:
    claim: Claim
    outcome: Outcome
    parent: Optional[str] = None  # the reader-facing claim a folded check belongs to

    @property
    def status(self) -> str:
        return self.outcome.status


class ClaimsError(RuntimeError):
    """A run or a fix the claims cannot be evaluated on (one-line message for the command line)."""


# -- evaluating ------------------------------------------------------------------------------------
def evaluate_claim(claim: Claim, run) -> Outcome:
    mv, (lo, hi) = run.manifest.method_version, claim.methods
    if mv < lo or (hi is not None and mv > hi):
        span = f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}–{hi}")
        return not_applicable(f"run has method version {mv}; this claim covers method version "
                              f"{span}")
    try:
        if claim.applies is not None and (reason := claim.applies(run)):
            return not_applicable(reason)
        out = claim.check(run)
    except Exception as e:  # noqa: BLE001 - a check that cannot read the run fails, naming why
        return Outcome(FAIL, "", None, f"could not evaluate: {type(e).__name__}: {e}")
    if not isinstance(out, Outcome):
        return Outcome(FAIL, "", None, f"check returned {type(out).__name__}, not an Outcome")
    return out


def evaluate(mod, run) -> list[Result]:
    """Each claim of ``mod`` on ``run``, then its folded checks (one failing fails the claim)."""
    name = getattr(mod, "EXPERIMENT", None)
    if name and run.manifest.experiment != name:
        raise ClaimsError(f"{getattr(run, 'path', 'run')} is a {run.manifest.experiment!r} "
                          f"run, not {name!r}")
    out = []
    for c in mod.CLAIMS:
        top = Result(c, evaluate_claim(c, run))
        folded = [Result(f, evaluate_claim(f, run), parent=c.id) for f in c.folded]
        bad = [f.claim.id for f in folded if f.status == FAIL]
        if bad and top.status != FAIL:
            why = f"folded check fails: {', '.join(bad)}"
            top = Result(c, replace(top.outcome, status=FAIL, reason=why))
        out += [top, *folded]
    return out


def evaluated(mod, run) -> list[Result]:
    """:func:`evaluate`, once per run (``Run.memo``)."""
    if not hasattr(run, "memo"):
        return evaluate(mod, run)
    return run.memo(f"claims of {getattr(mod, 'EXPERIMENT', '')}", lambda: evaluate(mod, run))


def reader_facing(results: list[Result]) -> list[Result]:
    return [r for r in results if r.parent is None]


def values(mod, run) -> dict:
    """``{claim id: Outcome}`` of one run (folded checks included)."""
    return {r.claim.id: r.outcome for r in evaluated(mod, run)}


def claim_values(mod, run) -> dict:
    """``{claim id: its value}`` of one run: what headlines and cards format."""
    return {k: o.value for k, o in values(mod, run).items()}


def counts(results: list[Result]) -> dict:
    return {s: sum(r.status == s for r in results) for s in STATUSES}


def verdict(results: list[Result]) -> str:
    """E.g. "3/4 claims hold, 1 fails (x), 1 n/a" over the reader-facing claims."""
    top = reader_facing(results)
    c = counts(top)
    if not c[PASS] + c[FAIL]:
        return f"no claim applies ({c[NA]} n/a)"
    text = f"{c[PASS]}/{c[PASS] + c[FAIL]} claims hold"
    if c[FAIL]:
        failed = ", ".join(r.claim.id for r in top if r.status == FAIL)
        text += f", {c[FAIL]} fail{'s' if c[FAIL] == 1 else ''} ({failed})"
    return text + (f", {c[NA]} n/a" if c[NA] else "")


def verdict_line(results: list[Result], run) -> str:
    """:func:`verdict` on the run's GPU(s) and day(s): "5/5 claims hold on H100 ×1, 2026-11-21"."""
    m = run.manifest
    counts = " and ".join(f"×{n}" for n in m.merged_span.get("gpu_counts") or [m.gpu_count])
    first, last = m.merged_span.get("dates") or [m.date, m.date]
    return f"{verdict(results)} on {m.gpu} {counts}, {first}" + (f" to {last}" * (last != first))


def table(results: list[Result]):
    """One row per claim and folded check (indented under its claim)."""
    import pandas as pd

    return pd.DataFrame([{
        "claim": ("  └ " if r.parent else "") + r.claim.id, "statement": r.claim.statement,
        "status": r.status, "measured": r.outcome.measured, "expected": r.claim.expected,
        "reason": r.outcome.reason
    } for r in results])


# -- what readers see: the README index, the notebooks' first screens and the report use these -----
def shown(mod, runs_: list) -> list:
    return list(mod.shown(runs_)) if runs_ else []


def engine_claims(**parts) -> SimpleNamespace:
    """A fix's engine claims, read as its claims module is (``CLAIMS``, ``HEADLINE``, ...); every
    run given is shown (a rebuild's ``shown`` keeps the newest per GPU model)."""
    return SimpleNamespace(shown=list, **parts)


class _Missing(Exception):
    pass


class _Formatter(string.Formatter):
    """``str.format`` where a missing or n/a value (None) drops the part instead of failing."""

    def get_field(self, field_name, args, kwargs):
        try:
            obj, used = super().get_field(field_name, args, kwargs)
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise _Missing(field_name) from e
        if obj is None:
            raise _Missing(field_name)
        return obj, used

    def format_field(self, value, spec):  # {r:%lower|higher}: "11% lower", "25% higher"; /%: 1/r
        if "|" not in spec:
            return super().format_field(value, spec)
        if not value:  # a zero ratio (nothing timed) drops the part, as a missing value does
            raise _Missing(spec)
        r, (less, more) = 1 / value if spec[0] == "/" else value, spec.lstrip("/%").split("|")
        return f"{abs(r - 1):.0%} {less if r < 1 else more}".rstrip()


# "11.5–11.5 µs" where the smallest and largest value agree (one run shown) reads "11.5 µs"
_SAME_RANGE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)–\1(?![\d.])")


@dataclass(frozen=True)
class Headline:
    """The numbers sentence of a fix: ``parts`` (dropped where a value is missing) over ``v[id]``
    and ``gpu`` (the first shown run), ``lo[...]``/``hi[...]``, ``consts`` and ``runs``
    (``per_run`` of each shown run, with ``gpu``, ``count``, ``world``, and ``across``; a dict
    ``{name: template}`` gives each name its own list)."""

    parts: tuple
    per_run: str | dict = ""
    sep: str = "; "
    run_sep: str = "; "
    consts: dict = field(default_factory=dict)
    across: str = ""

    def render(self, shown: list[tuple[Any, dict]], peers: dict | None = None) -> str:
        """``shown``: ``[(run, its values)]``; ``peers``: ``{index in shown: [peers' values]}``."""
        plain = [v for _, v in shown]
        lo, hi = _extremes(plain)
        per = {"runs": self.per_run} if isinstance(self.per_run, str) else self.per_run
        texts: dict = {name: [] for name in per}
        for i, (run, v) in enumerate(shown):
            m = run.manifest
            ns = dict(self.consts, v=v, gpu=m.gpu, count=m.gpu_count,
                      world=m.params.get("world_size", m.gpu_count))
            mine = [v, *(peers or {}).get(i, [])]
            plo, phi = _extremes(mine)
            ns["across"] = (len(mine) > 1 and self.across and _format(
                self.across, {**ns, "lo": plo, "hi": phi, "n": len(mine)})) or ""
            for name, template in per.items():
                texts[name] += [t for t in [_format(template, ns)] if t is not None]
        lists = {name: self.run_sep.join(t) for name, t in texts.items()}
        ns = dict(self.consts, v=plain[0] if plain else {}, lo=lo, hi=hi, **lists,
                  gpu=shown[0][0].manifest.gpu if shown else "")
        kept = [
            _format(part, ns) for part in self.parts  # a list no run gave drops its part
            if not any(f"{{{name}}}" in part and not t for name, t in texts.items())
        ]
        return _SAME_RANGE.sub(r"\1", self.sep.join(t for t in kept if t is not None))


def _format(template: str, ns: dict) -> str | None:
    """``template`` formatted with ``ns``; None where a value it names is missing or n/a."""
    try:
        return _Formatter().vformat(template, (), ns)
    except _Missing:
        return None


def _extremes(plain: list[dict]) -> tuple[dict, dict]:
    """Per claim (and key of a dict value), the smallest and largest numeric value over the runs."""
    lo: dict = {}
    hi: dict = {}
    for v in plain:
        for cid, value in v.items():
            for key, x in (value.items() if isinstance(value, dict) else [(None, value)]):
                if _number(x) is not None:
                    for out, pick in ((lo, min), (hi, max)):
                        d, k = (out, cid) if key is None else (out.setdefault(cid, {}), key)
                        d[k] = pick(d.get(k, x), x)
    return lo, hi


def headline(mod, runs_: list, every: list | None = None) -> str:
    """``mod.HEADLINE`` of ``runs_``, its ``across`` over peers in ``every`` (default: recorded)."""
    if not runs_:
        return "no recorded run yet"
    from sglab.core.runs import load_all_recorded, others

    peers = {}
    if mod.HEADLINE.across:  # a run's peers: other machines of its GPU model, count and method
        if every is None:
            every = load_all_recorded(mod.EXPERIMENT) if hasattr(mod, "EXPERIMENT") else []

        def key(r):
            return r.manifest.gpu, r.manifest.gpu_count, r.manifest.method_version

        for i, r in enumerate(runs_):
            peers[i] = [claim_values(mod, x) for x in others(r, every) if key(x) == key(r)]
    return mod.HEADLINE.render([(r, claim_values(mod, r)) for r in runs_], peers)


# -- a run against its reference -------------------------------------------------------------------
ENV_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch", "python", "sglang")


def _flat(value, prefix="") -> dict:
    if not isinstance(value, dict):
        return {prefix.rstrip("."): value}
    return {key: x for k, v in value.items() for key, x in _flat(v, f"{prefix}{k}.").items()}


def _number(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and v == v else None  # NaN: not a number


def _beside(flat: dict, key: str, name: str):
    """The value ``name`` of ``key``'s group in a flattened value, else the top-level ``name``."""
    group = f"{key.rsplit('.', 1)[0]}.{name}" if "." in key else name
    return flat.get(group, flat.get(name))


def spans(mod, runs_: list) -> dict:
    """``{(claim id, value key): [every number the runs gave]}``."""
    out: dict = {}
    for run in runs_:
        for r in evaluated(mod, run):
            for key, x in _flat(r.outcome.value, "").items():
                if _number(x) is not None:
                    out.setdefault((r.claim.id, key), []).append(_number(x))
    return out


def _rel(a: float, b: float) -> float:
    """``a``'s signed drift from ``b``, relative to ``b``."""
    return 0.0 if a == b else ((a - b) / abs(b) if b else math.inf)


def drift_rows(results: list[Result], ref_results: list[Result],
               span: dict | None = None) -> list[dict]:
    """Per claim and value: this run, the reference (or ``span``'s range), drift and tolerance."""
    ref = {r.claim.id: r for r in ref_results}
    span = span or {}
    rows = []
    for r in results:
        rr = ref.get(r.claim.id)
        if rr is None or r.outcome.value is None or rr.outcome.value is None:
            continue
        mine, theirs = _flat(r.outcome.value, ""), _flat(rr.outcome.value, "")
        for key in sorted(
                k for k in set(mine) & set(theirs) if k.rsplit(".", 1)[-1] not in r.claim.context):
            # the tolerance: the claim's drift, widened to the A/A gap either run measured
            tol, label, gap = r.claim.drift, "exact", 0.0
            if tol is not None:
                if r.claim.noise:
                    gap = max(
                        _number(_beside(v, key, r.claim.noise)) or 0.0 for v in (mine, theirs))
                label = f"±{gap:.0%} (the A/A gap)" if gap > tol else f"±{tol:.0%}"
                starts = [_beside(v, key, "starts") for v in (mine, theirs)]
                if None not in starts and starts[0] != starts[1]:
                    label += f"; starts differ: {starts[0]} here, {starts[1]} in the reference"
                tol = max(gap, tol)
            a, b = _number(mine[key]), _number(theirs[key])
            seen = span.get((r.claim.id, key), [])
            held, shown, rel = seen if len(seen) > 1 else [b], theirs[key], None
            if a is None or b is None:
                beyond = mine[key] != theirs[key]
            else:
                b = min(max(a, min(held)), max(held))  # the end of the reference's range nearer a
                rel = _rel(a, b)  # beyond: apart either way, the larger over the smaller less 1
                apart = max(a / b, b / a) - 1 if a > 0 and b > 0 else abs(rel)
                beyond = (a not in held) if tol is None else apart > tol
                if len(held) > 1:
                    lo, hi = min(held), max(held)
                    shown = f"{lo:.4g}–{hi:.4g} over {len(held)} runs" if lo != hi else lo
            rows.append({
                "claim": r.claim.id, "value": key or "value", "this run": mine[key],
                "reference": shown, "drift": rel, "tolerance": label, "beyond": bool(beyond)
            })
    return rows


def unmatched(results: list[Result], ref_results: list[Result]) -> list[str]:
    """This run's claimed values that the reference does not answer (a release first run here)."""
    ref = {r.claim.id: _flat(r.outcome.value) for r in ref_results if r.outcome.value is not None}
    return [
        f"{r.claim.id}.{k or 'value'}" for r in results if r.outcome.value is not None
        for k in sorted(_flat(r.outcome.value))
        if k not in ref.get(r.claim.id, {}) and k.rsplit(".", 1)[-1] not in r.claim.context
    ]


@dataclass
class Comparison:
    reference: Any
    how: str  # why this reference: same GPU model, or the nearest
    drift: list = field(default_factory=list)
    env: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)  # this run's values the reference lacks

    @property
    def beyond(self) -> list:
        return [d for d in self.drift if d["beyond"]]


def _size(r) -> tuple:
    return r.manifest.gpu_count, r.manifest.tp


def held_to(run, reference) -> bool:
    """Whether a drift fails ``run``: the same GPU model, size and parameters (specs aside)."""
    a, b = ({k: v for k, v in r.manifest.params.items() if k != "specs"} for r in (run, reference))
    return run.manifest.gpu == reference.manifest.gpu and _size(run) == _size(reference) and a == b


def reference(run, candidates: list) -> tuple[Any, str, list, bool]:
    """What ``run`` is compared with: ``(reference, how, record, held)`` (:func:`held_to`)."""
    from sglab.core.engine_records import merged
    from sglab.core.runs import others as less

    m = run.manifest

    def newest_method(rs):
        top = sorted(rs, key=lambda r: r.manifest.created_utc)[-1].manifest.method_version
        return [r for r in rs if r.manifest.method_version == top], top

    others = less(run, candidates)
    same = [c for c in others if c.manifest.gpu == m.gpu and _size(c) == _size(run)]
    if same:
        record = [c for c in same if c.manifest.method_version == m.method_version]
        how = f"the recorded {m.gpu} ×{m.gpu_count} runs of this size and method"
        if record:
            how += f" ({m.method_version})"
        else:
            record, top = newest_method(same)
            how += f"; none of this run's method ({m.method_version}): method {top}"
        ref = merged(record)
        how += f", {len(record)} run(s), newest answer per variant"
        if len(record) > 1:
            how += "; each number against the range they span"
        return ref, how, record, held_to(run, ref)
    for pick, what in ((lambda c: c.manifest.gpu == m.gpu,
                        f"the recorded {m.gpu} runs of other sizes"),
                       (lambda c: _size(c) == _size(run),
                        "the recorded runs of this size on other GPU models"),
                       (lambda c: True, "the recorded runs of other GPU models and sizes")):
        near = [c for c in others if pick(c)]
        if near:
            near, _ = newest_method(near)
            return (merged(near), f"no recorded {m.gpu} ×{m.gpu_count} run of this size: {what} "
                    f"({len(near)}), newest answer per variant; shown, not held to", [], False)
    return None, "no recorded run of this experiment to compare with", [], False


def compare(mod, run, reference, record: list | None = None,
            mine: list[Result] | None = None) -> Comparison:
    """``run`` against ``reference`` (each number against ``record``'s range where given)."""
    span = spans(mod, record) if record else None
    mine = evaluate(mod, run) if mine is None else mine
    theirs = evaluated(mod, reference)  # a record's run is often the reference of several
    env = [{
        "field": k, "this run": getattr(run.manifest, k),
        "reference": getattr(reference.manifest, k)
    } for k in ENV_KEYS if getattr(run.manifest, k) != getattr(reference.manifest, k)]
    return Comparison(reference, "", drift_rows(mine, theirs, span), env, unmatched(mine, theirs))


# -- JUnit XML (for a cluster's CI) ----------------------------------------------------------------
def junit_xml(suites: list[tuple[str, list[Result]]]) -> str:
    """A ``<testsuite>`` per run, a ``<testcase>`` per claim: fail/n/a as failure/skipped."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites")
    for name, results in suites:
        c = counts(results)
        suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(results)),
                              failures=str(c[FAIL]), skipped=str(c[NA]), errors="0")
        for r in results:
            case = ET.SubElement(suite, "testcase", classname=name, name=r.claim.id)
            ET.SubElement(case, "system-out").text = (f"{r.claim.statement}\nmeasured: "
                                                      f"{r.outcome.measured}\nexpected: "
                                                      f"{r.claim.expected}")
            if r.status == FAIL:
                why = r.outcome.reason or "claim does not hold"
                ET.SubElement(case, "failure", message=why).text = r.outcome.measured
            elif r.status == NA:
                ET.SubElement(case, "skipped", message=r.outcome.reason)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
