"""The real engine beside the rebuild: the recorded ``sglab engine`` runs of one fix
(``data/recorded/engine_<fix>/``), read as one table per release and case.

A scenario is recorded one release batch at a time, so one variant (``0.5.11+before``) may have
errored in an early run (a missing kernel header) and run in a later one: :func:`latest` keeps,
per model and variant, the newest run in which it started, and says which run each row came from.
Every number is what SGLang's own tool printed (``bench_one_batch`` or ``Engine.generate`` timed
around the call), read from its log by :mod:`sglab.sglang.engine`.
"""

from __future__ import annotations

import pandas as pd

from sglab.core import hardware, runs
from sglab.sglang.releases import parse_version


KEYS = ["model", "release", "case"]


def _model_of(run) -> dict:
    """``{variant: model name}`` from the run's manifest."""
    return {
        e["variant"]: (e.get("model") or {}).get("name", "?")
        for e in run.manifest.get("engine_runs", [])
    }


def label(run) -> str:
    return f"{runs.gpu_short(run.manifest)}, {run.manifest.get('created_utc', '')[:10]}"


def latest(runs_: list) -> pd.DataFrame:
    """All rows of the newest answer per (model, variant), oldest run first; columns of the run
    CSVs plus ``model`` and ``run`` (GPU and date). One run's rows are worked out once per run
    (:meth:`~sglab.core.runs.Run.memo`): the tables, claims and reruns of a notebook read each run
    many times."""
    if len(runs_) == 1 and hasattr(runs_[0], "memo"):
        return runs_[0].memo("engine_runs.latest", lambda: _latest(runs_))
    return _latest(runs_)


def _latest(runs_: list) -> pd.DataFrame:
    frames = []
    for order, run in enumerate(sorted(runs_, key=lambda r: r.manifest.get("created_utc", ""))):
        df = run.df.copy()
        named = df["variant"].map(_model_of(run))  # a merged run keeps its rows' own model
        df["model"] = (df["model"].fillna(named) if "model" in df else named).fillna("?")
        df["run"], df["_order"] = label(run), order
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=[*KEYS, "metric", "value", "run"])
    rows = pd.concat(frames, ignore_index=True)
    status = rows[rows.metric == "status"].assign(ok=lambda d: d.value == "ok")
    pick = (status.sort_values(["ok", "_order"]).groupby(["model", "variant"
                                                          ]).tail(1)[["model", "variant",
                                                                      "_order"]])
    out = rows.merge(pick, on=["model", "variant", "_order"])
    return out.drop(columns="_order")


def merged(runs_: list):
    """The runs of one engine experiment as one :class:`~sglab.core.runs.Run`: the rows of the
    newest answer per (model, variant) (:func:`latest`), every run's engine entries and specs in
    the manifest (oldest first), each entry's log sidecar as its own run has it (by path), the
    newest run's manifest and path otherwise."""
    import copy

    ordered = sorted(runs_, key=lambda r: r.manifest.get("created_utc", ""))
    newest = ordered[-1]
    manifest = copy.deepcopy(newest.manifest)
    manifest["engine_runs"] = [e for r in ordered for e in r.manifest.get("engine_runs", [])]
    # each engine entry keeps its own log (``log_<i>`` follows the entries), read from its own run
    cars = {
        n: str(newest.path.parent / f)
        for n, f in (newest.manifest.get("sidecars") or {}).items() if not n.startswith("log_")
    }
    at = 0
    for r in ordered:
        own = r.manifest.get("sidecars") or {}
        for i in range(len(r.manifest.get("engine_runs", []))):
            if f"log_{i}" in own:
                cars[f"log_{at}"] = str(r.path.parent / own[f"log_{i}"])
            at += 1
    manifest["sidecars"] = cars
    manifest.setdefault("params", {})["specs"] = [
        e for r in ordered for e in (r.manifest.get("params") or {}).get("specs", [])
    ]
    manifest["merged_from"] = [r.path.name for r in ordered]
    # each row keeps its model: two runs may share a variant name (0.5.13+pcg-off) for two models
    df = latest(ordered).drop(columns=["run"])
    manifest["rows"] = len(df)
    return runs.Run(df, manifest, newest.path)


def same_gpu(run, candidates: list) -> list:
    """The recorded runs of ``run``'s GPU model on as many GPUs, ``run`` itself left out: several
    machines' record, whose range a rerun's numbers are compared with (``claims.compare(...,
    record=)``) and held to. A TP-2 rerun is not held to a TP-4 run (other ranks and variants)."""
    return [c for c in runs.others(run, candidates) if held_to(run, c)]


def _same_model(run, candidates: list) -> list:
    gpu = runs.gpu_short(run.manifest)
    return [c for c in runs.others(run, candidates) if runs.gpu_short(c.manifest) == gpu]


def _count(run):
    return run.manifest.get("gpu_count")


def held_to(run, reference) -> bool:
    """Whether a drift of ``run`` from ``reference`` fails it: the same GPU model on as many GPUs.
    Against another model or count the drift is shown and fails nothing."""
    return (runs.gpu_short(run.manifest) == runs.gpu_short(reference.manifest)
            and _count(run) == _count(reference))


def reference(run, candidates: list) -> tuple:
    """What a live engine run is compared with: the recorded runs of the same GPU model on as many
    GPUs merged (:func:`merged`), else those of the same model on other counts, else those of other
    GPUs, the last two said explicitly; ``(None, reason)`` when there are none."""
    others = runs.others(run, candidates)
    gpu, n = runs.gpu_short(run.manifest), _count(run)
    same = same_gpu(run, candidates)
    if same:
        return merged(same), (f"the recorded {gpu} ×{n} engine runs ({len(same)}), newest answer "
                              "per variant; each number against the range they span")
    model = _same_model(run, candidates)
    if model:
        return merged(model), (f"no recorded {gpu} ×{n} engine run: the recorded {gpu} runs on "
                               f"other GPU counts ({len(model)}), newest answer per variant; "
                               "shown, not held to")
    if others:
        return merged(others), (f"no recorded {gpu} engine run: the recorded runs of other GPUs "
                                f"({len(others)}), newest answer per variant")
    return None, "no recorded engine run of this experiment to compare with"


def number(df: pd.DataFrame, metric: str, *, started: bool = False) -> pd.DataFrame:
    """The rows of ``metric`` with ``value`` as a float (``started``: of variants that started).
    Where a variant ran as several engine starts, one row per shape: the median over the starts,
    with the lowest and highest start in ``lo`` and ``hi`` and their count in ``starts``."""
    d = df[df.metric == metric].copy()
    d["value"] = pd.to_numeric(d["value"], errors="coerce")
    if started and not d.empty:  # (an empty list would select no columns, not no rows)
        ok = releases_ok(df)
        d = d[[ok.get(tuple(k), False) for k in d[KEYS].itertuples(index=False)]]
    return over_starts(d)


def over_starts(d: pd.DataFrame) -> pd.DataFrame:
    """Numeric rows of one metric, the engine starts of each variant and shape folded into one row
    (the median; ``lo``, ``hi``, ``starts``). Rows without a ``start`` column (runs recorded before
    starts were) count as one start."""
    if d.empty or "start" not in d or d["start"].nunique(dropna=True) < 2:
        return d.assign(lo=d["value"], hi=d["value"], starts=1)
    keys = [c for c in d.columns if c not in ("start", "value", "_order")]
    g = d.groupby(keys, dropna=False, sort=False)["value"]
    out = g.agg(value="median", lo="min", hi="max", starts="count").reset_index()
    return out


def start_range(num: tuple, den: tuple) -> tuple[float, float]:
    """The widest ``num`` ÷ ``den`` the engine starts allow, each side its ``(lowest, highest)``
    start: the fastest ``num`` start over the slowest ``den`` start, and the reverse."""
    return num[0] / den[1], num[1] / den[0]


# What a timing ratio reads of a variant's engine starts: ``{stat: (metric suffix, column)}``, the
# column of :func:`number` on the metric with that suffix. "median": the median over starts of each
# start's median repeat; "fastest": the fastest start's median repeat; "floor": the fastest repeat
# of any start (the ``_min`` metric's lowest start).
STATS = {"median": ("", "value"), "fastest": ("", "lo"), "floor": ("_min", "lo")}
STAT_NAMES = {
    "median": "median of starts", "fastest": "fastest start", "floor": "fastest repeat of any start"
}
# The statistic every engine timing claim reads. On the lent machines (KVM guests) each vCPU's
# per-launch cost flips between a fast and a slow level from one few-second window to the next,
# with no CPU time stolen and on any CPU (``python -m sglab.core.hostprobe``; recorded under
# data/recorded/host_probe). Launch-bound steps pay it in full, and it only ever adds time. The
# fastest of a variant's repeats over all its starts is the one most likely to have run in a fast
# window: its own cost on this host.
STAT = "floor"


def reading(df: pd.DataFrame, metric: str, stat: str = "median") -> pd.DataFrame:
    """:func:`number` of ``metric`` (variants that started) with ``value`` the statistic ``stat``
    (:data:`STATS`) of each shape's starts; ``lo``, ``hi`` and ``starts`` stay those of the metric
    the statistic reads. Empty where the run did not record that metric."""
    suffix, col = STATS[stat]
    d = number(df, metric + suffix, started=True)
    return d.assign(value=d[col]) if col != "value" and not d.empty else d


def over_base(df: pd.DataFrame, metric: str, across: str, base: str, stat: str = "median") -> dict:
    """Each case against ``base`` of its own model and release, of variants that started:
    ``{(model, release, case): {x: (base ÷ case, lo, hi)}}`` per value ``x`` of ``across``, the
    ratio of ``stat`` (:data:`STATS`) of each side's starts, ``lo``–``hi`` the widest the starts
    allow (:func:`start_range`)."""
    d = reading(df, metric, stat)
    per = {
        tuple(k): {
            int(n): (v, lo, hi)
            for n, v, lo, hi in zip(g[across], g["value"], g["lo"], g["hi"])
        }
        for k, g in d.groupby(KEYS)
    }
    out = {}
    for (model, rel, case), times in per.items():
        ref = per.get((model, rel, base))
        if case != base and ref:
            out[(model, rel, case)] = {
                n: (ref[n][0] / t[0], *start_range(ref[n][1:], t[1:]))
                for n, t in times.items() if n in ref
            }
    return out


def starts_in(df: pd.DataFrame, metric: str) -> int:
    """The most engine starts behind any one value of ``metric``."""
    return int(number(df, metric)["starts"].max())


def timing_source(starts: int, host: float | None, stat: str = "median") -> str:
    """Where a ratio of engine timings comes from: which of how many starts, and the host's
    cost."""
    return starts_how(starts, stat) + (f", host {host:.1f} µs per launch" if host else "")


def count_span(values) -> str:
    """Counts as text: one figure where they all agree, else ``lowest–highest``."""
    got = sorted({int(v) for v in values})
    return f"{got[0]}" if len(got) == 1 else f"{got[0]}–{got[-1]}"


def aa_noise(df: pd.DataFrame, metric: str, across: str, stat: str = "median") -> dict:
    """The A/A control's verdict on ``metric``: per (model, release), the largest relative gap
    between a case and its control copy ``<case>-again`` (the same flags, started in the same
    interleaved rounds) over the values of ``across``, each side ``stat`` of its starts
    (:data:`STATS`). ``{}`` where the run has no control."""
    from sglab.sglang.engine.spec import AGAIN

    d = reading(df, metric, stat)
    if d.empty:
        return {}
    per = {tuple(k): dict(zip(g[across].astype(int), g["value"])) for k, g in d.groupby(KEYS)}
    out = {}
    for (model, rel, case), again in per.items():
        base = per.get((model, rel, case.removesuffix(AGAIN)))
        if case.endswith(AGAIN) and base:
            gaps = [abs(base[n] / v - 1) for n, v in again.items() if n in base and v]
            if gaps:
                out[(model, rel)] = max(gaps)
    return out


def aa_statistics(run, metric: str, across: str) -> pd.DataFrame:
    """Per run (of every GPU model) and (model, release): the A/A control's gap
    (:func:`aa_noise`) read by each statistic of :data:`STATS`, the one with the smaller gap being
    the one a rerun can repeat."""
    rows = {}
    for r in every_run(run):
        df = latest([r])
        gaps = {s: aa_noise(df, metric, across, s) for s in STATS}
        for key in gaps[STAT]:
            rows[(run_label(r), " ".join(key))] = {
                f"A/A gap, {STAT_NAMES[s]}": f"{g[key]:.1%}" if key in g else ""
                for s, g in gaps.items()
            }
    out = pd.DataFrame.from_dict(rows, orient="index")
    if not out.empty:
        out.index.names = ["run", "model and release"]
    return out


def aa_spans(aa: pd.DataFrame) -> str:
    """The range of each statistic's A/A gap over the rows of :func:`aa_statistics`, as one
    sentence."""
    parts = []
    for col in aa.columns:
        gaps = [float(v.rstrip("%")) for v in aa[col] if v]
        if gaps:
            parts.append(f"{col.removeprefix('A/A gap, ')} {min(gaps):.1f}–{max(gaps):.1f}%")
    return f"Over {len(aa)} runs: {'; '.join(parts)}." if parts else ""


def starts_and_host(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each engine start of a timed variant beside what the host did meanwhile (recorded per start
    by :mod:`sglab.core.hoststate`): the median of ``metric`` over the start's shapes, the share
    of CPU time stolen by the hypervisor, the share of every CPU busy, and the engine's involuntary
    context switches. Empty for runs recorded before these were."""
    host = df[df.metric.isin(["host_steal", "host_busy", "engine_preempted"])]
    times = df[df.metric == metric]
    if host.empty or times.empty or "start" not in df:
        return pd.DataFrame()
    idx = [*KEYS, "start"]
    t = times.assign(value=pd.to_numeric(times["value"], errors="coerce")).groupby(idx)["value"]
    unit = str(times["unit"].dropna().iloc[0]) if times["unit"].notna().any() else ""
    out = t.median().rename(f"{metric} ({unit}), median over shapes").to_frame()
    wide = host.assign(value=pd.to_numeric(host["value"], errors="coerce")).pivot_table(
        index=idx, columns="metric", values="value", aggfunc="first")
    out = out.join(wide, how="inner").rename(
        columns={
            "host_steal": "CPU stolen (%)", "host_busy": "CPUs busy (%)",
            "engine_preempted": "engine preempted (switches)"
        })
    out.index = out.index.set_levels(out.index.levels[-1].astype(int), level=-1)
    from sglab.core.notebook import as_counts

    return as_counts(out.round(2), ["engine preempted (switches)"])


def timing_bar(df: pd.DataFrame, metric: str, across: str,
               stat: str = "median") -> tuple[float, int, str]:
    """What a timing claim on ``metric`` must clear: ``(A/A gap, starts, how)``, the gap the
    largest of :func:`aa_noise` (0 without a control), ``how`` the sentence that says so."""
    noise = max(aa_noise(df, metric, across, stat).values(), default=0.0)
    starts = starts_in(df, metric)
    how = (f"{starts_how(starts, stat)}; A/A control within {noise:.1%}, so the bar is "
           f"{1 + noise:.2f}×" if starts > 1 else f"{starts_how(starts, stat)}; no A/A control")
    return noise, starts, how


def starts_how(starts: int, stat: str = "median") -> str:
    """What one timing is, by the number of engine starts behind it and the statistic read."""
    if starts < 2:
        return f"one engine start, {'fastest' if stat == 'floor' else 'median'} of its repeats"
    return {
        "median": "median of {n} interleaved engine starts",
        "fastest": "fastest of {n} interleaved engine starts",
        "floor": "fastest repeat of {n} interleaved engine starts"
    }[stat].format(n=starts)


def text(df: pd.DataFrame, metric: str) -> dict:
    """``{(model, release, case): value}`` of a text metric (``status``, ``pcg``,
    ``pcg_reason``); of several starts, a status other than ``ok`` wins (a variant answered only
    where every start did)."""
    d = df[df.metric == metric]
    if metric == "status":
        d = d.assign(_ok=d["value"] == "ok").sort_values("_ok", ascending=False, kind="stable")
    return {tuple(k): v for k, v in zip(d[KEYS].itertuples(index=False), d["value"])}


def table(df: pd.DataFrame, metric: str, across: str, fmt: str = "{:.2f}") -> pd.DataFrame:
    """``metric`` per (model, release, case) and per value of ``across`` (``input_len``,
    ``batch_size``), as text cells: the median, with the interquartile range of the repeats in
    brackets where the run recorded one (``{metric}_iqr``)."""
    d = number(df, metric)
    if d.empty:
        return pd.DataFrame()
    idx = [*KEYS, across]
    d[across] = d[across].astype(int)
    iqr = number(df, f"{metric}_iqr")
    spread = {}
    if not iqr.empty:
        iqr[across] = iqr[across].astype(int)
        spread = {tuple(k): v for k, v in zip(iqr[idx].itertuples(index=False), iqr["value"])}
    starts = int(d["starts"].max()) if "starts" in d else 1
    if starts > 1:  # the spread that matters: between engine starts, not within one
        d["cell"] = [  # one figure where every start gave it (a count, a decision)
            fmt.format(v) if fmt.format(lo) == fmt.format(hi) else
            f"{fmt.format(v)} [{fmt.format(lo)}–{fmt.format(hi)}]"
            for v, lo, hi in zip(d["value"], d["lo"], d["hi"])
        ]
    else:
        d["cell"] = [
            fmt.format(v) + (f" ({fmt.format(spread[tuple(k)])})" if tuple(k) in spread else "")
            for k, v in zip(d[idx].itertuples(index=False), d["value"])
        ]
    wide = d.pivot_table(index=KEYS, columns=across, values="cell", aggfunc="first").fillna("")
    unit = str(d["unit"].dropna().iloc[0]) if d["unit"].notna().any() else ""
    unit = "" if unit in ("", "fraction") else f" ({unit})"
    if starts > 1:
        kind = f", median [lowest–highest] of {starts} engine starts (one figure: all the same)"
    elif unit.strip(" ()") in ("ms", "s", "µs"):  # a timing of one start says how little it is
        kind = (", median (IQR) of" if spread else ",") + (" one engine start (the spread "
                                                           "between starts is not measured)")
    else:
        kind = ", median (IQR)" if spread else ""
    wide.columns = pd.Index(list(wide.columns), name=f"{metric}{unit}{kind} by {across}")
    return wide


def facts(df: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per (model, release, case) with the status, the run it came from and each of
    ``metrics`` (the first value of each, text as recorded)."""
    d = df[df.metric.isin(["status", *metrics])]
    wide = d.pivot_table(index=KEYS, columns="metric", values="value", aggfunc="first")
    wide = wide.reindex(columns=["status", *metrics])
    wide["run"] = d.groupby(KEYS)["run"].first()
    return wide.fillna("").map(count_text)


def count_text(value) -> str:
    """A recorded value as text, a whole number without its ``.0`` (``148.0`` -> ``148``)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return value
    return str(int(f)) if f.is_integer() and "e" not in str(value).lower() else str(value)


def recorded(fix: str, number: str = "NN"):
    """The fix's recorded engine runs of one GPU model as one :class:`~sglab.core.runs.Run`: the
    newest, with that model's runs in ``shown`` (oldest first) and the other models' in
    ``elsewhere``; or a NoRun saying how to make one. The model shown is the one whose runs answer
    the most (model, variant) pairs, then the one with more runs, then the one that recorded first
    (so a new model's runs never take the tables over by a tie): one table never mixes GPUs."""
    found = sorted(runs.load_all_recorded(f"engine_{fix}"),
                   key=lambda r: r.manifest.get("created_utc", ""))
    if not found:
        return runs.NoRun(
            f"engine_{fix}", "no recorded real-engine run; on a GPU box: "
            f"bash scripts/engine_gpu.sh --plan {number}")
    by_gpu: dict = {}
    for r in found:
        by_gpu.setdefault(runs.gpu_short(r.manifest), []).append(r)
    # by_gpu is in order of first run, and min keeps the first of equals
    gpu = min(by_gpu, key=lambda g: (-len(_answers(by_gpu[g])), -len(by_gpu[g])))
    newest = by_gpu[gpu][-1]
    newest.shown = by_gpu[gpu]
    newest.elsewhere = [r for r in found if runs.gpu_short(r.manifest) != gpu]
    return newest


def _answers(runs_: list) -> set:
    """The (model, variant) pairs that ``runs_`` answer between them."""
    return {(m, v) for r in runs_ for v, m in _model_of(r).items()}


def every_run(run) -> list:
    """The shown runs and those of other GPU models (``elsewhere``), by GPU model, then oldest
    first: the rows of a table where each run is one machine."""
    every = [*run.shown, *getattr(run, "elsewhere", [])]
    return sorted(every, key=lambda r:
                  (runs.gpu_short(r.manifest), r.manifest.get("created_utc", "")))


def counts_by_run(run, metric: str) -> pd.DataFrame:
    """A count on every recorded run, GPU models included (:func:`every_run`): one row per run,
    one column per release and case, each cell the count over its engine starts
    (:func:`count_span`: ``lowest–highest`` where they disagree) and how many starts it rests on."""
    rows = []
    for r in every_run(run):
        d = number(latest([r]), metric, started=True).dropna(subset=["value"])
        if not d.empty:
            rows.append({
                "run": run_label(r), "starts": count_span(d["starts"]),
                **{f"{x.release} {x.case}": count_span((x.lo, x.hi))
                   for x in d.itertuples()}
            })
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows).set_index("run").fillna("")
    cells = sorted((c for c in out.columns if c != "starts"), key=lambda c:
                   (parse_version(c.split()[0]), c.split()[1]))
    return out[["starts", *cells]]


def releases_ok(df: pd.DataFrame, model: str | None = None) -> dict:
    """``{(model, release, case): True/False}``: whether each variant started and answered."""
    return {k: v == "ok" for k, v in text(df, "status").items() if model in (None, k[0])}


def beside(rows: list[dict]) -> None:
    """The rebuild's figure beside the real engine's (and the PR's own, where it gave one): one row
    per source with what it measures, since each times something different."""
    from sglab.core.notebook import show_table

    with pd.option_context("display.max_colwidth", None):
        show_table(pd.DataFrame(rows, columns=["source", "measures", "figure"]).set_index("source"))


def plan_table(scenarios) -> pd.DataFrame:
    """What ``scripts/engine_gpu.sh --plan NN`` runs for these scenarios: one row per release and
    case, with the GPUs, the tool, the model, the server arguments and the harness adjustments."""
    rows = []
    for sc in scenarios:
        for v in sc.releases:
            for c in sc.cases:
                if c.releases and v not in c.releases:
                    continue
                rows.append({
                    "scenario": sc.name, "release": v, "case": c.label, "GPUs": sc.gpus,
                    "tool": sc.tool, "model": sc.model, "server args": " ".join(c.args),
                    "harness adjustments": ", ".join(c.adjustment_names)
                })
    return pd.DataFrame(rows).set_index(["scenario", "release", "case"])


def planned(run, scenarios) -> None:
    """A real-engine section for a fix whose scenarios may not have run yet: the recorded runs'
    facts and numbers where there are some, else the NoRun line; then the plan and what each
    scenario expects."""
    from sglab.core.notebook import show_table

    if run:
        df = latest(run.shown)
        numeric = pd.to_numeric(df["value"], errors="coerce").notna() & (df.metric != "status")
        section(run, sorted(set(df.metric[~numeric]) - {"status"}), [])
        shape = [
            c for c in ("requests", "batch_size", "input_len") if c in df and df[c].notna().any()
        ]
        show_table(df[numeric].set_index([*KEYS, "metric", *shape])[["value", "unit"]])
    else:
        print(getattr(run, "line", "no real-engine run to show"))
    with pd.option_context("display.max_colwidth", None):
        show_table(plan_table(scenarios))
    for sc in scenarios:
        print(f"{sc.name} ({sc.gpus} GPUs): {sc.what}. Expected: {sc.expect}")


def adjustments(run) -> list[str]:
    """The harness adjustments of the shown runs, one line each (name: reason), once each."""
    seen = {}
    for r in run.shown:
        for e in r.manifest.get("engine_runs", []):
            for a in e.get("adjustments", []):
                seen.setdefault(a["name"], a["reason"])
    return [f"{k}: {v}" for k, v in seen.items()]


def header(run, what: str = "") -> bool:
    """Where a section's engine numbers come from: SGLang's own tools, ``what`` ran, the GPU and
    date of each run, each harness adjustment with its reason; False (and the NoRun line) when
    there is no run."""
    if not run:
        print(getattr(run, "line", "no real-engine run to show"))
        return False
    names = {"bench": "bench_one_batch", "engine": "Engine.generate"}
    tools = sorted({
        names.get(e.get("tool"), str(e.get("tool")))
        for r in run.shown
        for e in r.manifest.get("engine_runs", [])
    })
    print(f"real SGLang engines, dummy weights{', ' + what if what else ''}, measured by SGLang's "
          f"own {' and '.join(tools)} (recorded: "
          f"{'; '.join(sorted({label(r) for r in run.shown}))})")
    other = getattr(run, "elsewhere", [])
    if other:
        print(
            f"also recorded: {len(other)} run(s) on {'; '.join(sorted({label(r) for r in other}))}"
            ". The tables show one GPU model; the A/A and rerun tables list every run, and a "
            "rerun is held to the runs of its own GPU model")
    for line in adjustments(run):
        print(f"harness adjustment {line}")
    for line in host_costs(run):
        print(line)
    return True


def host_costs(run) -> list[str]:
    """One line per run that measured the host's per-launch cost beside its engines: an eager,
    launch-bound step costs about its kernel launches times this, so a reader with another host
    can scale the timings."""
    out = []
    for r in run.shown:
        cost = r.manifest.get("host_launch_us") or {}
        got = {k: v["median"] for k, v in cost.items() if isinstance(v, dict) and "median" in v}
        where = pinned(r).replace(", CPUs", "; engines on CPUs")
        if got:
            out.append(f"host per-launch cost ({label(r)}): " + ", ".join(
                f"{v:.2f} µs {k} the engines" for k, v in got.items()) + where)
    return out


def host_us(run, *variant: str) -> float | None:
    """The host's per-launch cost (µs, the median of its before and after) measured beside the
    newest shown run that started ``variant`` (release, then model, then case; a prefix of them,
    or none for any run); None where none did."""
    for r in sorted(run.shown, key=lambda r: r.manifest.get("created_utc", ""), reverse=True):
        started = {(e.get("release"), (e.get("model") or {}).get("name"), e.get("case"))
                   for e in r.manifest.get("engine_runs", [])}
        if variant and not any(v[:len(variant)] == variant for v in started):
            continue
        got = run_host_us(r)
        if got is not None:
            return got
    return None


def run_host_us(r) -> float | None:
    """One run's host per-launch cost: the mean of its before and after medians (µs), else None."""
    got = [
        v["median"] for v in (r.manifest.get("host_launch_us") or {}).values()
        if isinstance(v, dict) and "median" in v
    ]
    return sum(got) / len(got) if got else None


def run_label(r) -> str:
    """One run among several of a day: GPU, date, time (UTC) and the CPUs where pinned."""
    stamp = r.manifest.get("created_utc", "")[11:16].replace(":", "")
    return f"{label(r)} {stamp}Z{pinned(r)}"


def pinned(r) -> str:
    """``", CPUs 0-7"`` where a run's engines ran pinned (``sglab engine --cpus``), else ``""``."""
    sets = sorted({tuple(e.get("cpus") or ()) for e in r.manifest.get("engine_runs", [])} - {()})
    return "".join(f", CPUs {hardware.cpu_text(c)}" for c in sets)


def reruns(run, ratios: dict) -> pd.DataFrame:
    """A timed pair on every recorded run that ran it, one row per (pair, run): another run is
    another machine. ``ratios = {name: f(one run) -> {pair: {x: ratio}}}``, one column per name
    (the first is the statistic the claim reads; a cell ``lowest–highest×`` over the x values);
    then the host's bare per-launch cost of that run and ``drift``, the first statistic's lowest
    ratio against the oldest run of the same GPU model (runs of other models, ``elsewhere``, get
    rows of their own). A run whose engines were pinned says so beside its date. Only pairs
    recorded in more than one run."""
    names = list(ratios)
    cells: dict = {}
    for r in every_run(run):
        row = run_label(r)
        for name in names:
            for pair, per in ratios[name](r).items():
                if per:
                    lo, hi = min(per.values()), max(per.values())
                    cells.setdefault(pair, {}).setdefault(row, {
                        "host": run_host_us(r), "gpu": runs.gpu_short(r.manifest)
                    })[name] = (lo, f"{lo:.2f}–{hi:.2f}×")
    rows = {}
    for pair, by_run in cells.items():
        if len(by_run) < 2:
            continue
        first: dict = {}  # per GPU model, its oldest run's lowest ratio
        for c in by_run.values():
            if names[0] in c:
                first.setdefault(c["gpu"], c[names[0]][0])
        for at, c in by_run.items():
            rows[(pair, at)] = {
                **{
                    n: c[n][1] if n in c else ""
                    for n in names
                }, "host µs per launch": "" if c["host"] is None else f"{c['host']:.1f}",
                "drift": f"{c[names[0]][0] / first[c['gpu']] - 1:+.0%}" if names[0] in c else ""
            }
    out = pd.DataFrame.from_dict(rows, orient="index")
    if not out.empty:
        out.index.names = ["pair", "run"]
        out.columns.name = "ratio, lowest–highest over the x values"
    return out


def repeatability(run, df: pd.DataFrame, metric: str, across: str, *, ratio_of, stats: tuple,
                  control: str, pair: str) -> None:
    """Whether a timed speed-up repeats, in three tables: each start beside what the host did
    meanwhile (:func:`starts_and_host`), the A/A gap by both statistics per run
    (:func:`aa_statistics`), and the speed-up on every run that recorded it (:func:`reruns`).
    ``ratio_of(df, stat) -> {pair: {x: ratio}}``; ``stats[0]`` is the statistic the claim reads."""
    from sglab.core.notebook import show_table

    crowd = starts_and_host(df, metric)
    if not crowd.empty:
        print("Each start beside what the host did while it ran (the whole start: load, capture "
              "and the timed runs): a slow start with more CPU stolen or more preemptions shared "
              "its machine")
        show_table(crowd)
    aa = aa_statistics(run, metric, across)
    if not aa.empty:
        print(f"Which statistic repeats: the A/A control ({control} started twice in the same "
              f"rounds), its two copies compared by each statistic of their starts. {aa_spans(aa)}")
        show_table(aa)
    again = reruns(run, {STAT_NAMES[s]: (lambda r, s=s: ratio_of(latest([r]), s)) for s in stats})
    if not again.empty:
        print(f"The same speed-up ({pair}) on every run that recorded it (each run is another "
              f"machine); the claim reads the {STAT_NAMES[stats[0]]}, and its drift is the lowest "
              "ratio's against the first run of the same GPU model. A rerun is verified against "
              "the range of the runs of its own GPU model:")
        show_table(again)


def section(run, facts_of: list[str], tables: list[tuple[str, str, str]]) -> None:
    """A notebook's real-engine section: the :func:`header`, one row of facts per (model,
    release, case), then each ``(metric, across, fmt)`` table."""
    from sglab.core.notebook import show_table

    if not header(run):
        return
    df = latest(run.shown)
    show_table(facts(df, facts_of))
    for metric, across, fmt in tables:
        show_table(table(df, metric, across, fmt))
    if cold_first_repeat(run):
        print(COLD_NOTE)


COLD_NOTE = ("bench_one_batch warms up its first shape only; the runs shown were recorded before "
             "sglab added an untimed sweep of every input length, so each other length's first "
             "timed repeat can hold a JIT build: it widens the IQR, not the median")


def cold_first_repeat(run) -> bool:
    """Whether a shown bench run timed each input length's first run cold (recorded before
    ``warmup_sweeps``)."""
    return any(
        e.get("tool") == "bench" and "warmup_sweeps" not in e and len(e.get("input_lens") or []) > 1
        for r in run.shown for e in r.manifest.get("params", {}).get("specs", []))
