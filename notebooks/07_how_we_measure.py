# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · How we measure
#
# Every real-engine number of notebooks 01–06 is SGLang's own tool (`bench_one_batch`,
# `Engine.generate`) timing or counting inside a freshly started engine, on a GPU machine whose host
# is shared (a cloud VM). This notebook shows, for every fix, how those numbers are made to repeat
# and how far to trust them: one timing taken apart, the A/A control, the host beside each run,
# reruns on other days and machines, each run's verdict, and each claim's tolerance. Each section
# ends with what to conclude; every number is computed from `data/recorded/`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded": every mode reads data/recorded/ (nothing is measured)
ROWS = 8  # rows of a long table shown before the rest folds away
# "one timing, taken apart": False, one static table (what papermill, `jupyter execute` and `sglab
# run` save); True, drop-downs in JupyterLab to pick the fix and the shape
INTERACTIVE = False

# %%
import importlib

import pandas as pd

from sglab.core import engine_records, engine_stats, hostprobe, method, text
from sglab.core.notebook import explore, show_figure, show_table
from sglab.pcg_gate import tables as pcg_tables
from sglab.tools import fixes, verify


pd.set_option("display.width", 160)
found = [(f, engine_records.load(f.name, f.number),
          getattr(importlib.import_module(f"sglab.{f.name}.show"), "VIEW", None),
          fixes.claims(f.name).ENGINE) for f in fixes.FIXES]
probes = hostprobe.recorded()
method.banner(MODE, sum(len(rs.every()) for _, rs, _, _ in found if rs), len(found), len(probes))

# %% [markdown]
# ## Real SGLang timings: what one number is
#
# A scenario starts each case several times, **interleaved**: the cases take turns within a round
# and the order rotates from round to round (A B C, B C A, C A B), so that a slow minute of the host
# falls on every case alike. Each start repeats the step; a start's value is the median of its
# repeats, and a variant's figure is read from its starts by one of three statistics. One control
# case, `<case>-again`, starts the **same flags** as `<case>` in the same rounds: the **A/A gap**
# between the two is what two identical engines differ by, and the bar a speed-up must clear.
#
# One recorded run's rounds, then one shape of it taken apart (its fix and shape are drop-downs with
# `INTERACTIVE = True`):

# %%
paired = {
    f.number: (rs, p)
    for f, rs, view, _ in found if rs
    for p in getattr(view, "pairs", ())[:1] if method.example_run(rs, p.base, p.metric)
}
first = next(iter(paired))
rs, p = paired[first]
example = method.example_run(rs, p.base, p.metric)
print(f"the newest run notebook {first} shows with an A/A control: "
      f"{engine_records.run_label(example)}")
show_table(method.launch_order(example))


def taken_apart(fix: str, shape: int) -> pd.DataFrame:
    rs, p = paired[fix]
    run = method.example_run(rs, p.base, p.metric)
    one = method.one_timing(run, p.metric, p.across, p.base, p.cases, shape)
    out = one.map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)  # one precision per cell
    out.columns.name = f"{engine_records.run_label(run)}: {one.columns.name}"  # which run
    return out


shapes = {
    n: sorted({int(x)
               for x in engine_records.frame(rs.shown)[p.across].dropna()})
    for n, (rs, p) in paired.items()
}
one = taken_apart(first, shapes[first][0])
explore(taken_apart, {"fix": list(paired), "shape": sorted(set().union(*shapes.values()))},
        static=[{"fix": first, "shape": shapes[first][0]}], title="One timing, taken apart",
        interactive=INTERACTIVE)

# %%
said = one["spread between starts"]  # as the table says it
spread = said.str.rstrip("%").astype(float)
method.conclude(
    f"one start of `{spread.idxmax()}` lies {said[spread.idxmax()]} from another while "
    f"`{spread.idxmin()}` stays within {said[spread.idxmin()]}: a single engine start can be off "
    "by that much, so every figure reads several starts, and a speed-up counts only above the gap "
    "its A/A control shows on the same statistic.")

# %% [markdown]
# ### The A/A gap of every fix with a timing
#
# Per GPU model, every recorded control (a run, model and release): the gap read by each statistic,
# median (lowest–highest), and how often that statistic's gap is the smallest of the three. Every
# control of every run is in the folded table.

# %%
timed = [(f, rs, m, a, mod) for f, rs, view, mod in found if rs
         for m, a in method.timed(view, engine_records.frame(rs.shown))]
best = []
for f, rs, m, a, mod in timed:
    controls = method.aa_controls(rs, m, a)
    print(f"{f.number} {f.name} · {m} by {a}")
    if not controls:
        reads = [c.id for c in mod.CLAIMS if c.noise]
        print("  no A/A control recorded; " + ("its timing claims: " + ", ".join(reads) if reads
                                               else "none of its engine claims reads a timing"))
        continue
    best.append((f.number, *method.best_statistic(controls)))
    show_table(method.aa_summary(controls))
    method.folded(engine_stats.aa_table(rs, m, a), f"{f.number}: the A/A gap of every run")
plain = [
    f.number
    for f, rs, view, _ in found if not rs or not method.timed(view, engine_records.frame(rs.shown))
]
method.conclude(
    "; ".join(f"on {n}'s controls the {engine_stats.STAT_NAMES[s]} has the smallest gap in {k} of "
              f"{total}" for n, s, k, total in best) +
    f". Every timing claim reads the {engine_stats.STAT_NAMES[engine_stats.STAT]}: slowness only "
    "adds time, so the fastest repeat is the engine's own cost. "
    f"{', '.join(plain)} show no timed figure: their claims read counts, decisions and sizes.")

# %% [markdown]
# ## The host
#
# A launch-bound step (a small prefill, a decode replay) costs what the host's CPU takes to launch
# each kernel. A run times the host's bare per-launch cost (bursts of empty kernel launches) before
# and after its engines; the earliest runs predate this (the line under the table says which runs
# have it), and the per-run costs fold away under the table.

# %%
every = sorted((r for _, rs, _, _ in found if rs
                for r in rs.every()), key=lambda r: r.manifest.created_utc)
show_table(method.host_by_gpu(every))
beside = [bool(engine_records.host_medians(r)) for r in every]
since = beside.index(True) if any(beside) else len(every)
print(f"measured beside every run from {engine_records.run_label(every[since])} on: "
      f"{sum(beside)} of {len(every)} runs" if any(beside) and all(beside[since:]) else
      f"measured beside {sum(beside)} of {len(every)} runs")
method.folded(text.blank(method.host_costs(every).round(2)), "the host's µs per launch, each run")
host = method.host_costs(every)
moved = (host["after"] / host["before"]).dropna()
method.conclude(
    "within one run the bare launch cost moved by up to "
    f"{max(moved.max(), 1 / moved.min()) - 1:.0%}, and across runs it spans "
    f"{text.span(pd.concat([host.before, host.after]), '{:.1f}')} µs: a host-bound time holds for "
    "the host beside it, so the notebooks compare ratios measured in one run, never times across "
    "machines.")

# %% [markdown]
# The host probes (`python -m sglab.core.hostprobe`) time each vCPU of a machine alone, beside
# a busy loop, and again in rounds a few seconds apart:

# %%
with pd.option_context("display.max_colwidth", None):
    method.folded(hostprobe.table(probes), "every host probe", ROWS)
show_figure(hostprobe.figure(probes))
rounds = [p for _, p in probes if p.get("rounds")]
flipped = sum(bool(hostprobe.moved(p["rounds"])) for p in rounds)
method.conclude(
    f"in {flipped} of {len(rounds)} probes with rounds some vCPU ran over 1.3× slower in one round "
    "than in another, seconds apart: the hypervisor moves a vCPU's speed, so pinning inside the "
    "guest cannot fix it, and only several interleaved starts average it out.")

# %% [markdown]
# Each start beside what the host did meanwhile (CPU time stolen by the hypervisor, every CPU's busy
# share, the engine's involuntary context switches), for the runs each fix's notebook shows:

# %%
said, by_chance = [], []
for f, rs, m, a, _ in timed:
    df = engine_records.frame(rs.shown)
    k, n, starts, stolen = method.slowest_starts(df, m)
    if n:
        by_chance.append((k, n, starts))
        said.append(
            f"{f.number}: the slowest start was also the most preempted in {k} of {n} "
            f"variants (by chance about {n / starts:.0f}), at most {stolen:.2f}% CPU stolen")
        method.folded(engine_stats.starts_and_host(df, m), f"{f.number}: each start and its host")
chance = all(k <= 1.5 * n / starts for *_, k, n, starts in by_chance)
method.conclude("; ".join(said) + (". Preemption picks the slow start no more often than chance"
                                   if chance else ". The slow start is often the most preempted") +
                ", and no start is dropped for it: the statistics read all of them.")

# %% [markdown]
# ## Reruns: the same scenario on other days and machines
#
# A timed pair recorded by more than one run: its ratio by the claims' statistic on each run
# (lowest–highest over the shapes), and its drift from the oldest run of the same GPU model.

# %%
drifts = []
for f, rs, view, _ in found:
    for p in getattr(view, "pairs", ()) if rs else ():
        again = engine_stats.reruns(rs, method.pair_ratios(p))
        if again.empty:
            continue
        print(f"{f.number} {f.name} · {p.label}")
        with pd.option_context("display.max_colwidth", None):
            show_table(method.drift_summary(again))
        method.folded(again, f"{f.number}: every run, each statistic")
        drifts += [float(d.rstrip("%")) / 100 for d in again["drift"] if d]
allowed = {c.drift for _, _, _, mod in found for c in mod.CLAIMS if c.noise and c.drift}
method.conclude(
    f"a timed ratio drifted {text.span(drifts, '{:+.0%}')} from its GPU model's first run; a "
    f"timing claim lets a rerun move by {text.span(allowed, '{:.0%}')} or its A/A gap, whichever "
    "is larger, and the bar each run must clear is its own A/A gap, not the first run's figure.")

# %% [markdown]
# Counts (kernels, launches, graph replays, objects) need no statistic: each must read one value
# per shape on every run and every start, on every GPU model.

# %%
per = {(f.number, m): method.exact_counts(rs, m)
       for f, rs, _, _ in found if rs for m in method.counted(engine_records.frame(rs.every()))}
exact = {k: (t["one value per shape"] == "yes").sum() for k, t in per.items()}
show_table(
    pd.DataFrame([{
        "fix": n, "count": m, "variants": len(t), "runs, at most": int(t["runs"].max()),
        "one value per shape": f"{exact[n, m]} of {len(t)}"
    } for (n, m), t in per.items()]).set_index(["fix", "count"]))
for (n, m), t in per.items():
    method.folded(t, f"{n}: {m} per variant")
whole = sum(exact[k] == len(t) for k, t in per.items())
method.conclude(f"{whole} of {len(per)} counts read one value per shape on every run and start: "
                "a count that moves is a change in the engine, not noise.")

# %% [markdown]
# ## Every recorded run and its verdict
#
# Each recorded engine run of every fix, checked alone by its fix's engine claims (`sglab verify
# engine_<fix>` does the same): per fix and GPU model here, each run with its GPU, date, TP size and
# verdict line in the folded table.

# %%
ledger = method.ledger([(f.number, r, mod) for f, rs, _, mod in found if rs for r in rs.every()])
show_table(method.ledger_summary(ledger))
method.folded(ledger, "every recorded engine run")
failing = ledger["verdict"].str.contains("fail")
method.conclude(
    f"{len(ledger)} runs on {', '.join(sorted(set(ledger.GPU)))}; {failing.sum()} of them with a "
    "failing claim. A claim that does not apply to a run (a scenario it did not start) says n/a, "
    "so each notebook's verdict reads the runs of a GPU model merged.")

# %% [markdown]
# Some figures do not repeat. Verified against the other runs of its GPU model and count (`sglab
# verify RUN --against`), a run gives these beyond their tolerance. A test keeps the list
# (`data/recorded/not_repeated.json`, with why) equal to what the record gives, and every claim
# holds on each of these runs; the host's per-launch cost before and after the run stands beside.
# `verify --against` prints a listed figure as not repeated and fails on any other.

# %%
gone = verify.not_repeated({f"engine_{f.name}": rs.every() for f, rs, _, _ in found if rs})
with pd.option_context("display.max_colwidth", None):
    show_table(gone)
method.conclude(
    f"{len(gone)} figures in {gone.index.get_level_values('run').nunique()} runs lie beyond their "
    "tolerance on another machine of the same GPU model: a short prompt's eager step and a decode "
    "step travel with their host, so read them beside the host's cost, and trust the claims, which "
    "hold on every run, over any one figure.")

# %% [markdown]
# ## Tolerances
#
# Each engine claim with what it expects, in its own words, how far a rerun may move it (`sglab
# verify --against`), and for a timing claim the A/A gap it must clear on each GPU model's runs.

# %%
tol = pd.concat([method.tolerances(f.number, mod, rs) for f, rs, _, mod in found])
with pd.option_context("display.max_colwidth", None):
    show_table(tol)
exact, gapped = (tol["rerun"] == "exact").sum(), (tol["A/A gap to clear"] != "").sum()
method.conclude(
    f"{exact} of {len(tol)} engine claims must repeat exactly, {len(tol) - exact - gapped} within "
    f"a stated drift; the {gapped} timing claims hold only where they clear their own runs' A/A "
    "gap, and a rerun may move them by their drift tolerance or that gap, whichever is larger.")

# %% [markdown]
# ## 01's width sweep on two machines
#
# Notebook 01 sweeps the hidden size of a 32-layer Llama and times prefill with piecewise graphs off
# over captured (`01-llama-width`). The same sweep on each GPU model, cell by cell:

# %%
rs01 = dict((f.name, rs) for f, rs, _, _ in found)["pcg_gate"]
gains = method.by_gpu(rs01, pcg_tables.width_gains) if rs01 else {}
gains = {g: t for g, t in gains.items() if not t.empty}
if len(gains) < 2:
    print(f"the width sweep is recorded on {len(gains)} GPU model(s); two are compared here")
else:
    table = method.side_by_side(gains, ["hidden", "tokens"], "gain")
    show_table(table.round(2))
    a, b = list(gains)
    show_figure(
        method.agreement(
            gains, ["hidden", "tokens"], "pcg-off ÷ captured prefill, "
            f"{engine_stats.STAT_NAMES[pcg_tables.STAT]}; bars: the starts"))
    ratio = table[f"{b} ÷ {a}"]
    below = {g: table.index[table[g] < 1].tolist() for g in (a, b)}
    where = (f"both fall below 1× at the same (hidden, tokens): {', '.join(map(str, below[a]))}, "
             "so where graphs stop paying repeats across machines, and how much they pay before "
             "that moves with the host" if below[a] == below[b] else "they fall below 1× at "
             + "; ".join(f"{g} {', '.join(map(str, c)) or 'none'}" for g, c in below.items()))
    method.conclude(f"cell by cell the {b} reads {text.span(ratio, unit='×')} of the {a}'s gain "
                    f"(median {ratio.median():.2f}×); {where}.")
