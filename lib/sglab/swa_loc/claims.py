"""What every swa_loc run must show (see :mod:`sglab.core.claims`): four claims a reader checks,
the instrument checks folded under the first, the review card, and the real engine's claims."""

from __future__ import annotations

from typing import Optional

from sglab.core.card import Card
from sglab.core.claims import Claim, Headline, engine_claims, holds
from sglab.core import engine_records, engine_stats, kernel_table, runs
from sglab.core.text import count, span
from sglab.swa_loc import model_config, show
from sglab.swa_loc.measure import EXPERIMENT, GPUS, HEADLINE_CONFIG
from sglab.swa_loc.rebuild import hybrid_layer_ids
from sglab.swa_loc.sglang import KERNELS_PER_TRANSLATION_TODAY, PR_ERA_RELEASES  # noqa: F401


CLAIM = ("Presetting the SWA cache location before decode-graph capture removes the full→SWA slot "
         "translation (an index gather and an int32 cast) from every SWA layer of every replay; "
         "#24743's zeroing of the padded tail keeps padded tokens out of live SWA slots.")
EXTRA_PER_SWA_LAYER = 2  # the rebuild's translation: full_to_swa_index_mapping[loc], .to(int32)
MIN_RATIO = 1.10


def _cell(c: Optional[dict] = None) -> tuple:
    c = c or HEADLINE_CONFIG
    return int(c["swa_per_full"]), int(c["num_layers"]), int(c["batch_size"])


def _at(table, cell: tuple):
    """The row at ``cell`` (swa_per_full, num_layers, ..., batch_size) of a table, or None."""
    sel = table.xs(cell, level=("swa_per_full", "num_layers", "batch_size"))
    return sel.iloc[0] if len(sel) else None


def _has_headline_cell(run) -> Optional[str]:
    ratio, layers, bs = _cell()
    d = run.df[run.df.metric == "time_median"]
    if ((d.swa_per_full == ratio) & (d.num_layers == layers) & (d.batch_size == bs)).any():
        return None
    return f"the run has no {layers}-layer {ratio}:1 bs {bs} cell (the headline configuration)"


# -- the claims a reader checks --------------------------------------------------------------------
def _extra_kernels(run):
    extra = show.extra_per_swa_layer(run.df)
    values = sorted({float(x) for x in extra})
    ok = int((extra == EXTRA_PER_SWA_LAYER).sum())
    value = dict(per_swa_layer_min=values[0], per_swa_layer_max=values[-1], cells=int(len(extra)))
    nodes, _ = show.kernel_counts(run.df)
    row = _at(nodes, _cell()) if _has_headline_cell(run) is None else None
    text = span(values, "{:g}", " per SWA layer")
    if row is not None:
        value.update(before=int(row["before"]), after=int(row["pr24743"]))
        text += f"; {row['before']} → {row['pr24743']} at the headline cell"
    return holds(ok == len(extra), f"{text} ({ok}/{len(extra)} cells at {EXTRA_PER_SWA_LAYER})",
                 value)


def _pad_bug(run):
    t = show.pad_table(run.df)
    bug = t.loc["pr23552"]
    ok = (bug.pad_matches_prediction == 1 and bug.pad_corrupted_slots == bug.pad_predicted_slots > 0
          and all(t.loc[v, "pad_corrupted_slots"] == 0 and t.loc[v, "pad_matches_prediction"] == 1
                  for v in ("before", "pr24743")))
    value = dict(pr23552_corrupted=int(bug.pad_corrupted_slots), pr23552_predicted=int(
        bug.pad_predicted_slots), before_corrupted=int(t.loc["before", "pad_corrupted_slots"]),
                 pr24743_corrupted=int(t.loc["pr24743", "pad_corrupted_slots"]))
    return holds(
        ok, f"#23552 corrupted {value['pr23552_corrupted']} of {value['pr23552_predicted']} "
        f"predicted pairs (exactly those); before {value['before_corrupted']}, #24743 "
        f"{value['pr24743_corrupted']}", value)


def _kv_matches(run):
    d = run.df[run.df.metric == "kv_mismatch_slots"]
    n = int(d.value.sum())
    return holds(n == 0 and len(d) > 0,
                 f"{n} differing (layer, slot) pairs over {len(d)} (variant, layout) "
                 "checks", {"differing": n, "checks": int(len(d))})


def _ratio(run):
    t = show.time_table(run.df)
    row = _at(t, _cell())
    r = float(row["before / #24743"])
    cost = model_config.step_cost(run, **model_config.LAYOUT)
    value = dict(ratio=r, before_us=float(row["before µs"]), after_us=float(row["pr24743 µs"]),
                 ratio_min=float(t["before / #24743"].min()),
                 ratio_max=float(t["before / #24743"].max()), layout_kernels=cost["kernels"],
                 layout_us=cost["us"])
    return holds(
        r >= MIN_RATIO, f"{value['before_us']:.0f} → {value['after_us']:.0f} µs ({r:.2f}×); sweep "
        f"{value['ratio_min']:.2f}–{value['ratio_max']:.2f}×", value)


# -- the instrument checks folded under the kernel claim -------------------------------------------
def _translate_calls(run):
    d = show.sweep_rows(run.df)
    d = d[d.metric == "translate_calls_capture"]
    want = d.apply(lambda r: r.n_swa_layers if r.variant == "before" else 0, axis=1)
    bad = int((d.value != want).sum())
    before = d[d.variant == "before"]
    return holds(bad == 0 and len(d) > 0,
                 f"{len(d) - bad}/{len(d)} cells as expected (before: one call per SWA layer)",
                 {"cells": int(len(d)), "wrong": bad, "before_calls_max": int(before.value.max())})


def _profiler_equals_static(run):
    a = show.profiler_agreement(run.df)
    return holds(
        a["max_abs_diff"] == 0 and a["cells"] > 0,
        f"{a['equal']}/{a['cells']} cells equal, max |profiler − static| = {a['max_abs_diff']}", a)


def _traced(run) -> Optional[str]:
    p = run.manifest.params
    tc = p.get("trace_config") or {}
    if not tc:
        return "the run's parameters name no trace_config"
    if tc.get("num_layers") not in p.get("layer_counts", []) or tc.get("swa_per_full") not in p.get(
            "swa_per_full", []) or tc.get("batch_size") not in p.get("batch_sizes", []):
        return f"trace_config {tc} is not a cell of the run's sweep, so nothing was traced"
    return None


def _sidecar(run, name: str):
    if (table := run.sidecar(name)) is None:
        raise ValueError(f"the run lists no readable {name!r} sidecar")
    return table


def _trace_equals_static(run):
    events = _sidecar(run, "events")
    nodes, _ = show.kernel_counts(run.df)
    row = _at(nodes, _cell(run.manifest.params.get("trace_config")))
    traced = show.trace_counts(events)
    value = {v: dict(trace=traced.get(v, {}).get("kernels", 0), static=int(row[v])) for v in nodes}
    ok = all(x["trace"] == x["static"] for x in value.values())
    return holds(ok,
                 "; ".join(f"{v} {x['trace']} (static {x['static']})" for v, x in value.items()),
                 value)


def _trace_translation(run):
    events, gk = _sidecar(run, "events"), _sidecar(run, "graph_kernels")
    names = show.translation_kernels(gk)
    ratio, layers, _ = _cell(run.manifest.params.get("trace_config"))
    n_swa = len(hybrid_layer_ids(layers, ratio)[0])
    traced = show.trace_counts(events, show.name_pattern(names))
    before, after = (traced.get(v, {}).get("matching", -1) for v in ("before", "pr24743"))
    value = dict(kernels_per_swa_layer=len(names), nodes_each=sorted(set(names.values())),
                 trace_before=before, trace_after=after, n_swa_layers=n_swa)
    ok = (len(names) == EXTRA_PER_SWA_LAYER and set(names.values()) == {n_swa}
          and before == len(names) * n_swa and after == 0)
    short = ", ".join(show.short_kernel(n) for n in sorted(names))
    return holds(
        ok, f"{len(names)} kernels × {n_swa} SWA layers ({short}); in the traced replay before "
        f"{before}, #24743 {after}", value)


def _nsight_ran(run) -> Optional[str]:
    info = run.manifest.eager_kernels
    why = info.get("nsight_reason") or "no record of it in the run"
    return None if info.get("nsight") == "ran" else f"nsight-python did not run: {why}"


def _nsight_matches(run):
    t = _sidecar(run, "eager_kernels")
    c = kernel_table.cross_check(t[t.backend == kernel_table.NSIGHT],
                                 t[t.backend == kernel_table.TORCH])
    ok = c["rows"] > 0 and c["equal"] == c["rows"]
    return holds(
        ok, f"{c['equal']}/{c['rows']} (variant, op, kernel) rows with equal calls per step",
        {"rows": c["rows"], "equal": c["equal"]},
        why_not=f"only nsight: {c['only_in_a'][:2]}; only torch: {c['only_in_b'][:2]}; "
        f"differ: {c['differ'][:2]}")


CLAIMS = [
    Claim(
        "swa_loc.extra_kernels_per_swa_layer",
        "Without the preset, each captured decode graph holds exactly 2 more kernel nodes per SWA "
        "layer than #24743's (the translation's gather and cast, as in SGLang "
        "0.5.10.post1-0.5.12.post1; from 0.5.13 a translation is one gather)",
        f"== {EXTRA_PER_SWA_LAYER} per SWA layer in every (layout, batch size) cell",
        _extra_kernels, folded=(
            Claim(
                "swa_loc.translate_calls_in_capture",
                "Capturing without the preset calls translate_loc_from_full_to_swa once per SWA "
                "layer; with it, never", "n_swa calls (before), 0 (#23552, #24743), every cell",
                _translate_calls),
            Claim(
                "swa_loc.profiler_equals_static",
                "torch.profiler sees as many kernels in one replay as the graph has kernel nodes",
                "equal in every (layout, batch size, variant) cell", _profiler_equals_static),
            Claim(
                "swa_loc.trace_equals_static",
                "The traced replay of each variant has as many kernels as its graph has kernel "
                "nodes", "equal for every variant", _trace_equals_static, methods=(2, None),
                applies=_traced),
            Claim(
                "swa_loc.trace_translation_kernels",
                "The kernels the preset removes are the translation's, once per SWA layer, and the "
                "traced replay without the preset runs them in every SWA layer",
                f"{EXTRA_PER_SWA_LAYER} kernel names × n_swa nodes; traced: n_swa × "
                f"{EXTRA_PER_SWA_LAYER} before, 0 after", _trace_translation, methods=(2, None),
                applies=_traced),
            Claim(
                "swa_loc.nsight_matches_profiler",
                "nsight-python and torch.profiler count the same kernels per op in the eager "
                "decode step", "equal calls per (variant, op, kernel)", _nsight_matches,
                methods=(2, None), applies=_nsight_ran))),
    Claim(
        "swa_loc.pad_bug_exact",
        "On a padded batch #23552 overwrites exactly the predicted live SWA slots in every SWA "
        "layer; before and #24743 overwrite none",
        "#23552: corrupted == predicted > 0; before, #24743: 0", _pad_bug),
    Claim(
        "swa_loc.kv_matches_eager",
        "After one populated replay, the KV pool equals an eager reference that ran the same "
        "batches", "0 differing (layer, slot) pairs", _kv_matches),
    Claim("swa_loc.replay_ratio",
          "Removing the translation makes the headline replay (48 layers, 5:1, bs 32) faster",
          f"before / #24743 >= {MIN_RATIO:.2f}", _ratio, applies=_has_headline_cell, drift=0.25,
          context=("layout_kernels", "layout_us"))
]


def shown(runs_: list) -> list:
    """The newest run of each GPU model, H200 before H100."""
    return runs.newest(runs_, runs.gpu_short, reverse=True)


_RATIO, _LAYERS, _BS = _cell()
_K, _R, _P = "swa_loc.extra_kernels_per_swa_layer", "swa_loc.replay_ratio", "swa_loc.pad_bug_exact"
_L = model_config.LAYOUT
_L_SWA = len(hybrid_layer_ids(_L["layers"], _L["swa_per_full"])[0])
HEADLINE = Headline(
    parts=(
        f"{_LAYERS} layers ({len(hybrid_layer_ids(_LAYERS, _RATIO)[0])} SWA, {_RATIO}:1), bs "
        f"{_BS}: {{v[{_K}][before]}} → {{v[{_K}][after]}} kernels per replay, "
        f"+{{v[{_K}][per_swa_layer_min]:g}} per SWA layer in every cell",
        f"so a {_L['layers']}-layer {_L['swa_per_full']}:1 model ({_L_SWA} SWA layers) at bs "
        f"{_L['batch_size']} pays +{{v[{_R}][layout_kernels]:g}} kernels and "
        f"{{lo[{_R}][layout_us]:.0f}}–{{hi[{_R}][layout_us]:.0f}} µs per decode step without the "
        "preset (`sglab swa-cost`)",
        f"toy-layer replay {{runs}}; {{lo[{_R}][ratio_min]:.2f}}–{{hi[{_R}][ratio_max]:.2f}}× "
        "over the sweep", f"padded batches: {{v[{_P}][pr23552_corrupted]}} live (layer, slot) "
        f"pairs overwritten by #23552, {{v[{_P}][pr24743_corrupted]}} by #24743."),
    per_run=f"{{v[{_R}][before_us]:.0f}} → {{v[{_R}][after_us]:.0f}} µs "
    f"({{v[{_R}][ratio]:.2f}}×{{across}}) on {{gpu}}", run_sep=", ",
    across=f"; {{lo[{_R}][ratio]:.2f}}–{{hi[{_R}][ratio]:.2f}}× over {{n}} runs")

_E = "engine_swa_loc.reverted_preset_extra_kernels"
CARD = Card(
    bug="Before #23552, SGLang captured its decode CUDA graphs before anything had set the pool's "
    "`swa_loc`, so `SWAKVPool.set_kv_buffer` took its fallback during capture: the full→SWA slot "
    "translation (a gather and an int32 cast), already done once per batch, was recorded into "
    "every sliding-window layer and ran again at every replay. #23552's preset then left the "
    "padded tail of its static buffer stale; #24743 zeroes it.",
    affects="Hybrid sliding-window models (Gemma-3, gpt-oss and others that mix sliding-window and "
    "full attention layers) decoding with CUDA graphs; the release with #23552 but not #24743 can "
    "also write padded tokens into live requests' SWA slots.", found=((
        "#23552, in `capture_one_batch_size`: swa_loc is set before capture so that \"the graph "
        "records GPU ops using this buffer instead of the per-layer "
        "translate_loc_from_full_to_swa fallback\"",
        f"The fallback is a gather and an int32 cast: {{e[{_E}][per_swa_layer]:g}} kernels per SWA "
        f"layer in every decode replay of SGLang's engine, {{r[{_K}][per_swa_layer_min]:g}} in the "
        "rebuild's graphs. Later releases translate once per forward and hand the location to "
        "each write: no preset left to forget."
    ), ("#24743, in `populate_from_forward_batch`: \"Padded SWA indices left over from a previous "
        "replay would point into real SWA slots, so set_kv_buffer on padded tokens would corrupt "
        "active requests' KV\"",
        f"Exactly those: with #23552 alone the rebuild's padded batch overwrote "
        f"{{r[{_P}][pr23552_corrupted]}} live (layer, slot) pairs, the ones its stale tail "
        f"predicts; with #24743, {{r[{_P}][pr24743_corrupted]}}.")))


# -- the real engine (``sglab engine --plan 04``: data/recorded/engine_swa_loc/) -------------------
def _engine_pair(run):
    df = engine_records.frame([run])
    ok = engine_stats.started(df)
    texts = engine_stats.texts(df, "decode_kernels_per_replay")
    per = {k[2]: v for k, v in texts.items() if k[1] == "0.5.11" and ok.get(k)}
    return per if {"before", "released"} <= set(per) else None


def _engine_applies(run):
    return None if _engine_pair(run) else ("this run has no 0.5.11 'before' and 'released' decode "
                                           "replays that both started")


def _engine_extra(run):
    per = _engine_pair(run)
    n_swa = show.engine_swa_layers([run])
    extra = float(per["before"]) - float(per["released"])
    value = dict(released=int(float(per["released"])), before=int(float(per["before"])),
                 extra=int(extra), swa_layers=n_swa,
                 per_swa_layer=extra / n_swa if n_swa else float("nan"))
    return holds(
        n_swa > 0 and extra == EXTRA_PER_SWA_LAYER * n_swa,
        f"0.5.11 decode replay: {value['released']} kernels as released, {value['before']} with "
        f"#23552's preset reverted (+{value['extra']} over {n_swa} SWA layers)", value)


def _replay_counts(run):
    """Kernels per decode-graph replay of each variant that started."""
    d = engine_stats.numbers(engine_records.frame([run]), "decode_kernels_per_replay",
                             only_started=True)
    return d.dropna(subset=["value"])


def _counts_apply(run):
    d = _replay_counts(run)
    return None if not d.empty and (d["starts"] > 1).all() else (
        "no variant of this run has decode replays from more than one engine start")


def _counts_exact(run):
    d = _replay_counts(run)
    value = {f"{r.release}+{r.case}": int(r.value) for r in d.itertuples()}
    split = [f"{r.release}+{r.case} {r.lo:g}–{r.hi:g}" for r in d.itertuples() if r.lo != r.hi]
    seen = ", ".join(f"{k} {v}" for k, v in value.items())
    starts = count(d["starts"])
    return holds(not split, (f"starts disagree: {', '.join(split)}"
                             if split else f"{seen} kernels in each of its {starts} starts"), value)


ENGINE = engine_claims(
    EXPERIMENT="engine_swa_loc",
    CLAIM=f"In SGLang's own engine (bench_one_batch, GPT-OSS-style 8 layers, 4 sliding-window, "
    f"dummy weights), reverting #23552's preset adds the rebuild's {EXTRA_PER_SWA_LAYER} kernels "
    f"per SWA layer to every decode-graph replay.", CLAIMS=[
        Claim(
            "engine_swa_loc.reverted_preset_extra_kernels",
            "0.5.11 with #23552's preset reverted replays 2 more kernels per SWA layer than "
            "0.5.11 as released (kernels counted in bench_one_batch's own decode trace)",
            f"before − released == {EXTRA_PER_SWA_LAYER} × SWA layers (exact)", _engine_extra,
            applies=_engine_applies),
        Claim(
            "engine_swa_loc.replay_kernels_exact",
            "Counted, not timed: every release's decode-graph replay launches one kernel count in "
            "every engine start, so a rerun on any machine must find the same count",
            "one count per release and case over its starts (exact; --against: equal)",
            _counts_exact, applies=_counts_apply)
    ], HEADLINE=Headline(
        parts=("0.5.11's decode-graph replay, as released → with the preset reverted: {runs}",
               f"+{{v[{_E}][extra]}} over {{v[{_E}][swa_layers]}} SWA layers, "
               f"{{v[{_E}][per_swa_layer]:g}} per SWA layer."),
        per_run=f"{{v[{_E}][released]}} → {{v[{_E}][before]}} kernels on {{gpu}}", run_sep=", "))
