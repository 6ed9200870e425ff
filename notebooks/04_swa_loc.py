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
# # 04 · Preset the SWA cache location before decode-graph capture
#
# **Claim.** In a hybrid sliding-window model, a decode CUDA graph captured without `set_swa_loc` replays
# the full→SWA slot translation (an index gather and an int32 cast: two kernels) in every SWA layer of every
# decode step; presetting the location from a static buffer before capture removes them. The preset's first
# version let padded batches write into live SWA slots, which the follow-up fixed by zeroing the buffer.
#
# Upstream: [sgl-project/sglang#23552](https://github.com/sgl-project/sglang/pull/23552) (pre-set SWA cache
# location in `CudaGraphRunner`) and [#24743](https://github.com/sgl-project/sglang/pull/24743) (zero
# `out_cache_loc_swa` on pad, int32). Rebuilt in `sglab.fixes.swa_loc`, measured by `sglab.experiments.swa_loc`.

# %% tags=["parameters"]
MODE = "auto"          # "auto" | "live" | "recorded"
PARAMS = {}            # overrides of sglab.experiments.swa_loc.DEFAULT_PARAMS for a live run
HEADLINE = {"num_layers": 48, "swa_per_full": 5, "batch_size": 32}   # the configuration quoted below
CPU_LAYER_COUNTS = [6, 12, 24, 48]

# %%
import inspect

import pandas as pd
import torch

from sglab import notebook as nb
from sglab import plots, upstream
from sglab.experiments import swa_loc as experiment
from sglab.fixes import swa_loc as fx

pd.set_option("display.width", 140)
wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% [markdown]
# ## The problem
#
# A hybrid model (Gemma-3: five sliding-window layers per global layer; gpt-oss: alternating) keeps two KV
# pools. The scheduler allocates a token a slot in the **full** pool (`out_cache_loc`); its slot in the smaller
# **SWA** pool is found through `full_to_swa_index_mapping` (int64, slot 0 = padding slot, a trailing `-1` so
# that `-1` maps to `-1`). PR-era `SWAKVPool.set_kv_buffer` chooses per call, in Python:

# %%
print(inspect.getsource(fx.SWAKVPool.set_kv_buffer))
print(inspect.getsource(fx.SWAKVPool.translate_loc_from_full_to_swa))

# %% [markdown]
# A CUDA graph freezes whichever branch was live when it was captured. Before #23552 nothing had set
# `swa_loc` when `CudaGraphRunner` captured the decode graphs, so the translation — `index` + `.to(int32)` —
# was recorded into every SWA layer and re-ran at every replay, although the batch had already been
# translated once outside the graph (`ForwardBatch.out_cache_loc_swa`). The three states rebuilt here:

# %%
rows = []
for v in fx.VARIANTS:
    cfg = fx.runner_config(v)
    rows.append({"variant": v,
                 "set_swa_loc before capture": cfg.preset_swa_loc,
                 "out_cache_loc_swa buffer": str(cfg.swa_loc_dtype).replace("torch.", "") if cfg.swa_loc_dtype else "—",
                 "zeroed on a padded batch": cfg.zero_swa_on_pad if cfg.preset_swa_loc else "n/a"})
pd.DataFrame(rows).set_index("variant")

# %% [markdown]
# ## Rebuild: what each runner records (CPU, live)
#
# Without a GPU the runner captures by running the step with the Python state it would be captured with, and
# replays by re-running it with that state — the same static buffers, the same `swa_loc`. The
# `translate_loc_from_full_to_swa` counter during capture is therefore exactly what a real graph records.

# %%
rows = []
for ratio in (5, 1):
    for L in CPU_LAYER_COUNTS:
        row = {"swa_per_full": ratio, "layers": L}
        for v in fx.VARIANTS:
            s = fx.build_setup(num_layers=L, swa_per_full=ratio, size=64, size_swa=32, head_num=1, head_dim=8)
            r = fx.DecodeGraphRunner.for_variant(s.model, [8], v)
            r.capture()
            row["SWA layers"] = len(s.swa_layer_ids)
            row[f"translate calls in capture ({v})"] = r.capture_translate_calls[8]
        rows.append(row)
capture_table = pd.DataFrame(rows).set_index(["swa_per_full", "layers"])
capture_table

# %% [markdown]
# One translation per SWA layer without the preset, none with it; each is two kernels in the graph (checked on
# the GPU below). Eagerly, the pool writes the same K/V either way:

# %%
a, b = (fx.build_setup(num_layers=12, swa_per_full=5, size=64, size_swa=32, head_num=2, head_dim=8) for _ in range(2))
ba, bb = fx.decode_batch(a, [3, 9, 27], [4, 5, 6]), fx.decode_batch(b, [3, 9, 27], [4, 5, 6])
a.pool.translate_calls = b.pool.translate_calls = 0
fx.forward_eager(a.model, ba, use_precomputed_swa_loc=False)
fx.forward_eager(b.model, bb, use_precomputed_swa_loc=True)
print(f"translate calls: per-layer path {a.pool.translate_calls}, preset path {b.pool.translate_calls}; "
      f"pools identical: {fx.pool_diff(a.pool, b.pool, skip_padding_slot=False) == {}}")

# %% [markdown]
# ## The #24743 padding bug (CPU, live)
#
# A decode batch of `raw_bs` tokens replays the graph of the next captured size `bs`; `populate_from_forward_batch`
# zeroes `out_cache_loc` for the padded tokens, so they write into slot 0. #23552 copied
# `out_cache_loc_swa[:raw_bs]` but left `[raw_bs:bs]` as the previous replay left it.
#
# Scenario (`experiment.pad_bug_scenario`): eight requests, each with a few context tokens; step 1 decodes all
# eight in the bs=8 graph; requests 2 and 4 finish, the batch is filtered in order, and step 2 decodes six
# tokens padded to 8. The tail `[6:8]` still holds the SWA slots where requests 6 and 7 — still running —
# wrote their step-1 token. Each pool is compared with the same two steps run eagerly.

# %%
pad = {v: experiment.pad_bug_scenario(v, num_layers=12) for v in fx.VARIANTS}
pd.DataFrame([{
    "variant": v,
    "stale tail slots (SWA)": r["stale_tail_swa_slots"],
    "their owners (still running)": r["owners_still_running"],
    "predicted corrupted slots": r["predicted_slots"],
    "SWA layers corrupted": f"{sum(1 for l in r['swa_layer_ids'] if l in r['corrupted'])} of {len(r['swa_layer_ids'])}",
    "slots corrupted per SWA layer": sorted({tuple(x) for x in r["corrupted"].values()}) or "none",
    "full layers corrupted": [l for l in r["full_layer_ids"] if l in r["corrupted"]] or "none",
    "exactly as predicted": r["matches_prediction"],
} for v, r in pad.items()]).set_index("variant")

# %% [markdown]
# Before #23552 the padded tokens translated the zeroed `out_cache_loc` (full slot 0 → SWA slot 0); #23552
# wrote them into two live slots of requests 6 and 7 in every SWA layer; #24743's `out_cache_loc_swa.zero_()`
# sends them to slot 0 again.
#
# ## The int64 / int32 point (CPU, live)
#
# `translate_loc_from_full_to_swa` returns int32, and so does `ForwardBatch.out_cache_loc_swa`. #23552
# allocated the static buffer as int64, so the graph path handed `set_kv_buffer` a different dtype than the
# eager path, and `populate_from_forward_batch` did a converting copy. Which dtype reaches the SWA sub-pool:

# %%
def seen_dtypes(variant):
    s = fx.build_setup(num_layers=6, swa_per_full=5, size=64, size_swa=32, head_num=1, head_dim=8)
    seen = []
    orig = s.pool.swa_kv_pool.set_kv_buffer
    s.pool.swa_kv_pool.set_kv_buffer = lambda i, loc, k, v: (seen.append(str(loc.dtype).replace("torch.", "")), orig(i, loc, k, v))
    batch = fx.decode_batch(s, [1, 2, 3], [4, 5, 6])
    fx.forward_eager(s.model, batch)
    eager = sorted(set(seen)); seen.clear()
    r = fx.DecodeGraphRunner.for_variant(s.model, [4], variant)
    s.pool.set_swa_loc(None)
    r.capture(); seen.clear()
    r.replay(fx.decode_batch(s, [1, 2, 3], [4, 5, 6]))
    buf = r.buffers.out_cache_loc_swa
    return {"variant": variant, "eager path": eager, "graph path": sorted(set(seen)),
            "buffer bytes / token": buf.element_size() if buf is not None else 0}

pd.DataFrame([seen_dtypes(v) for v in fx.VARIANTS]).set_index("variant")

# %% [markdown]
# In this rebuild the values written are identical either way (the CPU tests check it); the K/V write is
# torch's `index_put_`, which needs int64 indices, so here an int32 location costs one conversion kernel per
# SWA layer that SGLang's `store_cache` kernel (int32 or int64 natively) does not have. The kernel counts
# below show it as the gap between `pr23552` and `pr24743`.
#
# ## Measure (GPU)
#
# For layer counts × SWA ratios × batch sizes: translate calls during capture, kernel nodes in each captured
# graph (static, cuda-bindings), kernels in one replay (torch.profiler), KV pool after a populated replay vs an
# eager reference, replay time (CUDA events; rounds interleave the variants), then the padding scenario on real
# graphs.

# %% tags=["needs-gpu"]
if wb.live:
    params = {**experiment.DEFAULT_PARAMS, **PARAMS}
    wb.measure(lambda: experiment.run(params), params=params, method_version=experiment.METHOD_VERSION)

# %%
run = wb.result()                                    # the newest run: tables below
shown = experiment.newest_per_gpu(wb.results())      # the newest run of each GPU model: cross-GPU checks, plots
print("Compared across GPUs: " + ("; ".join(r.label for r in shown) if shown else "none"))
COLORS = {"before": plots.PALETTE["before"], "pr23552": plots.PALETTE["accent"], "pr24743": plots.PALETTE["after"]}
STYLES = ["-", "--", ":", "-."]

# %% [markdown]
# ## Kernels per replay
#
# Static kernel nodes of each captured graph (cuda-bindings), one row per layout; the count is the same for every
# captured batch size, and torch.profiler sees the same number of kernels in one replay.

# %%
if run is None:
    print("No GPU run to show: the kernel counts, replay times and on-GPU padding check need one "
          "(`sglab record swa_loc` on one H100/H200).")
else:
    print(f"{run.label}:")
    display(experiment.kernel_table(run.df))
    for r in shown:
        agree = experiment.profiler_agreement(r.df)
        mism = r.df[r.df.metric == "kv_mismatch_slots"]
        print(f"{r.label}: profiler = static in {agree['equal']}/{agree['cells']} (layout, bs, variant) cells, "
              f"max |profiler − static| = {agree['max_abs_diff']}; KV pool vs eager reference: "
              f"{int(mism.value.sum())} differing (layer, slot) pairs over {len(mism)} (variant, layout) checks")
    counts = [experiment.kernel_counts(r.df)[0] for r in shown]
    print("static kernel counts identical on " + " and ".join(experiment.short_gpu(r.manifest["gpu_name"]) for r in shown)
          + f": {all(c.equals(counts[0]) for c in counts)}")

# %%
if run is not None:
    kt = experiment.kernel_table(run.df).reset_index()
    fig, axes = plots.figure(ncols=2)
    for ax, ratio in zip(axes.ravel(), sorted(kt.swa_per_full.unique(), reverse=True)):
        sub = kt[kt.swa_per_full == ratio]
        for v in fx.VARIANTS:
            ax.plot(sub.num_layers, sub[f"kernels {v}"], marker="o", label=experiment.VARIANT_LABELS[v], color=COLORS[v])
        ax.set_title(f"{ratio} SWA : 1 full")
        ax.set_xlabel("layers"); ax.set_ylabel("kernels per replay (graph kernel nodes)")
        ax.legend()
    same_bs = bool(kt["same for every batch size"].all())
    counts = [experiment.kernel_counts(r.df)[0] for r in shown]
    same_gpu = len(shown) > 1 and all(c.equals(counts[0]) for c in counts)
    plots.caption(fig, run, extra="static count via cuda-bindings"
                  + ("; identical for every captured batch size" if same_bs else "; smallest batch size shown")
                  + ("; identical on " + " and ".join(experiment.short_gpu(r.manifest["gpu_name"]) for r in shown)
                     if same_gpu else ""))

# %% [markdown]
# ## Replay time
#
# CUDA-event time of one `graph.replay()`, median and p10–p90 of the pooled samples. `#23552` is below `#24743`
# here only because this rebuild's K/V write (`index_put_`) converts an int32 location back to int64 — one
# kernel per SWA layer that SGLang's `store_cache` does not have (see the int64/int32 section).

# %%
if run is not None:
    t = experiment.time_table(run.df)
    print(f"{run.label}:")
    display(t.round(2))
    if len(shown) > 1:
        print("before / #24743 on each GPU (newest run per GPU), batch size in the columns:")
        display(pd.concat({experiment.short_gpu(r.manifest["gpu_name"]):
                           experiment.time_table(r.df)["before / #24743"].unstack("batch_size")
                           for r in shown}, axis=1).round(3))

# %%
if run is not None:
    from matplotlib.ticker import FixedLocator, ScalarFormatter

    h = HEADLINE
    fig, axes = plots.figure(ncols=3, width=16)
    axes = axes.ravel()
    for gi, r in enumerate(shown):
        tt = r.df[r.df.metric.str.startswith("time_")].pivot_table(
            index=["swa_per_full", "num_layers", "n_swa_layers", "batch_size", "variant"], columns="metric", values="value")
        gpu = experiment.short_gpu(r.manifest["gpu_name"])
        for ax, (xname, fixed) in zip(axes[:2], [("batch_size", ("swa_per_full", "num_layers")),
                                                 ("num_layers", ("swa_per_full", "batch_size"))]):
            sub = tt.xs(tuple(h[k] for k in fixed), level=fixed).reset_index()
            for v in fx.VARIANTS:
                d = sub[sub.variant == v].sort_values(xname)
                err = [(d.time_median - d.time_p10) * 1e3, (d.time_p90 - d.time_median) * 1e3]
                ax.errorbar(d[xname], d.time_median * 1e3, yerr=err, marker="o", capsize=3, color=COLORS[v],
                            ls=STYLES[gi % len(STYLES)], label=f"{v} · {gpu}")
            ax.set_title(", ".join(f"{k.replace('_', ' ')} = {h[k]}" for k in fixed))
            ax.set_ylabel("replay time, µs (median, p10–p90)")
        tab = experiment.time_table(r.df).reset_index()
        for ratio, marker in zip(sorted(tab.swa_per_full.unique(), reverse=True), "os^"):
            d = tab[(tab.swa_per_full == ratio) & (tab.num_layers == h["num_layers"])].sort_values("batch_size")
            axes[2].plot(d.batch_size, d["µs saved per SWA layer"], marker=marker, ls=STYLES[gi % len(STYLES)],
                         color=plots.CYCLE[2 + 2 * gi % 6], label=f"{ratio}:1 · {gpu}")
    for ax in (axes[0], axes[2]):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted(run.df[run.df.batch_size > 0].batch_size.unique())))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("batch size")
    axes[1].set_xlabel("layers")
    axes[2].set_ylim(bottom=0)
    axes[2].set_title(f"before − #24743, {h['num_layers']} layers")
    axes[2].set_ylabel("µs saved per SWA layer per replay")
    for ax in axes:
        ax.legend(fontsize=7, ncol=2 if ax is not axes[2] else 1)
    plots.caption(fig, shown[0], extra=" · ".join(plots.provenance_text(r) for r in shown[1:])
                  + ("; line style = GPU" if len(shown) > 1 else ""))

# %%
if run is not None:
    h = HEADLINE
    for r in shown:
        n = experiment.headline_numbers(r, h)
        print(f"{r.label}: {h['num_layers']} layers ({n['n_swa_layers']} SWA, {h['swa_per_full']}:1), "
              f"bs={h['batch_size']}: kernels per replay {n['kernels_before']} → {n['kernels_after']} "
              f"(profiler {n['profiled_before']} → {n['profiled_after']}); replay {n['us_before']:.1f} µs → "
              f"{n['us_after']:.1f} µs ({n['ratio']:.2f}×, {(n['us_before'] - n['us_after']) / n['n_swa_layers']:.2f} µs "
              f"per SWA layer); whole sweep {n['ratio_min']:.2f}–{n['ratio_max']:.2f}×")

# %% [markdown]
# ## The padding scenario on real graphs
#
# The same two decode steps as above, captured and replayed as CUDA graphs; slots are (layer, slot) pairs.

# %%
if run is not None:
    pr = run.df[run.df.metric.str.startswith("pad_")].iloc[0]
    print(f"{int(pr.num_layers)} layers ({int(pr.n_swa_layers)} SWA), step 2 padded to bs {int(pr.batch_size)}")
    display(pd.concat({experiment.short_gpu(r.manifest["gpu_name"]):
                       r.df[r.df.metric.str.startswith("pad_")].pivot_table(index="variant", columns="metric",
                                                                           values="value").astype(int)
                       for r in shown}, axis=1))

# %% [markdown]
# ## Does the installed SGLang have it?

# %%
v = upstream.check(experiment.EXPERIMENT)
print(f"{v.status}: {v.detail}" if v.detail else v.status)

# %% [markdown]
# ## Takeaways
#
# - A Python branch inside a captured region is decided once, at capture. `set_kv_buffer`'s
#   `if self.swa_loc is not None` looked like a per-step choice but was frozen into every decode graph as the
#   slow branch: two kernels per SWA layer per step, for a translation already done once per batch.
# - The fix is to make the capture-time state the serving-time state: a static `out_cache_loc_swa` buffer,
#   filled at populate time, set on the pool before capture.
# - Static buffers inherit every padding rule of the inputs they shadow. `out_cache_loc` was zeroed on pad;
#   its SWA twin was not, and padded tokens overwrote exactly the SWA slots the previous, larger batch left in
#   the tail — live slots of running requests, silently (#24743 saw it as an accuracy drop).
#
# Review points worth discussing:
#
# - Would a graph-capture assertion ("no `translate_loc_from_full_to_swa` call while capturing") have caught
#   #23552's problem earlier? The counter here is that assertion.
# - `swa_loc` is a side channel on a shared pool, left set after each eager forward; later PRs (#25824,
#   #27091, #27617) removed it in favour of a location passed with each write.
# - The dtype of a shadow buffer should match its source (int32 here): a mismatch costs a converting copy and
#   makes graph and eager paths hand different dtypes to the same kernel.
# - The toy layer does only the KV write, so the time ratio is an upper bound; the transferable numbers are the
#   kernel counts and the saved µs per SWA layer.
