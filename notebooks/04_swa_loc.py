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
run = wb.result()

# %% [markdown]
# ## Kernels per replay

# %%
if run is None:
    print("No GPU run to show: the kernel counts, replay times and on-GPU padding check need one "
          "(`sglab record swa_loc` on one H100/H200).")
else:
    df = run.df
    nodes = (df[df.metric == "graph_kernel_nodes"]
             .pivot_table(index=["swa_per_full", "num_layers", "n_swa_layers", "batch_size"], columns="variant",
                          values="value"))
    prof = (df[df.metric == "profiled_kernels"]
            .pivot_table(index=["swa_per_full", "num_layers", "n_swa_layers", "batch_size"], columns="variant",
                         values="value"))
    calls = (df[df.metric == "translate_calls_capture"]
             .pivot_table(index=["swa_per_full", "num_layers", "n_swa_layers", "batch_size"], columns="variant",
                          values="value"))
    n_swa = nodes.index.get_level_values("n_swa_layers")
    summary = nodes.copy()
    summary.columns = [f"nodes {c}" for c in summary.columns]
    summary["extra per SWA layer (before − pr24743)"] = (nodes["before"] - nodes["pr24743"]) / n_swa
    summary["extra per SWA layer (before − pr23552)"] = (nodes["before"] - nodes["pr23552"]) / n_swa
    summary["profiler = static"] = (prof == nodes).all(axis=1)
    summary["translate calls in capture (before)"] = calls["before"]
    display(summary.astype({c: int for c in summary.columns if c.startswith("nodes")}))
    mism = df[df.metric == "kv_mismatch_slots"]
    print(f"KV pool vs eager reference: {int(mism.value.sum())} differing (layer, slot) pairs over "
          f"{len(mism)} (variant, layout) checks")

# %%
if run is not None:
    fig, axes = plots.figure(ncols=2)
    axes = axes.ravel()
    bs_max = int(nodes.index.get_level_values("batch_size").max())
    for ax, ratio in zip(axes, sorted(nodes.index.get_level_values("swa_per_full").unique(), reverse=True)):
        sub = nodes.xs((ratio, bs_max), level=("swa_per_full", "batch_size")).reset_index()
        for v in fx.VARIANTS:
            ax.plot(sub["num_layers"], sub[v], marker="o", label=v,
                    color={"before": plots.PALETTE["before"], "pr24743": plots.PALETTE["after"]}.get(v, plots.PALETTE["accent"]))
        ax.set_title(f"{ratio} SWA : 1 full")
        ax.set_xlabel("layers"); ax.set_ylabel("kernel nodes in the decode graph")
        ax.legend()
    plots.caption(fig, run, extra="static count via cuda-bindings; identical for every batch size")

# %% [markdown]
# ## Replay time

# %%
if run is not None:
    t = df[df.metric.str.startswith("time_")].pivot_table(
        index=["swa_per_full", "num_layers", "n_swa_layers", "batch_size", "variant"], columns="metric", values="value")
    med = t["time_median"].unstack("variant")
    ratio_tab = pd.DataFrame({
        "before µs": med["before"] * 1e3, "pr24743 µs": med["pr24743"] * 1e3, "pr23552 µs": med["pr23552"] * 1e3,
        "before / pr24743": med["before"] / med["pr24743"],
        "saved µs per SWA layer": (med["before"] - med["pr24743"]) * 1e3 / med.index.get_level_values("n_swa_layers"),
    })
    display(ratio_tab.round(2))

    fig, axes = plots.figure(ncols=2)
    axes = axes.ravel()
    h = HEADLINE
    for ax, (xname, fixed) in zip(axes, [("batch_size", ("swa_per_full", "num_layers")),
                                         ("num_layers", ("swa_per_full", "batch_size"))]):
        key = tuple(h[k] for k in fixed)
        sub = t.xs(key, level=fixed).reset_index()
        for v in fx.VARIANTS:
            s = sub[sub.variant == v].sort_values(xname)
            err = [(s.time_median - s.time_p10) * 1e3, (s.time_p90 - s.time_median) * 1e3]
            ax.errorbar(s[xname], s.time_median * 1e3, yerr=err, marker="o", capsize=3, label=v,
                        color={"before": plots.PALETTE["before"], "pr24743": plots.PALETTE["after"]}.get(v, plots.PALETTE["accent"]))
        if xname == "batch_size":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xname.replace("_", " ")); ax.set_ylabel("replay time, µs (median, p10–p90)")
        ax.set_title(", ".join(f"{k}={h[k]}" for k in fixed))
        ax.legend()
    plots.caption(fig, run)

# %%
if run is not None:
    key = (HEADLINE["swa_per_full"], HEADLINE["num_layers"])
    row = ratio_tab.xs(key, level=("swa_per_full", "num_layers")).xs(HEADLINE["batch_size"], level="batch_size")
    kn = nodes.xs(key, level=("swa_per_full", "num_layers")).xs(HEADLINE["batch_size"], level="batch_size")
    print(f"Headline ({HEADLINE['num_layers']} layers, {HEADLINE['swa_per_full']}:1, bs={HEADLINE['batch_size']}, "
          f"{run.label}): kernels per replay {int(kn['before'].iloc[0])} → {int(kn['pr24743'].iloc[0])}; "
          f"replay {row['before µs'].iloc[0]:.1f} µs → {row['pr24743 µs'].iloc[0]:.1f} µs "
          f"({row['before / pr24743'].iloc[0]:.2f}×), "
          f"{row['saved µs per SWA layer'].iloc[0]:.2f} µs saved per SWA layer")

# %% [markdown]
# ## The padding scenario on real graphs

# %%
if run is not None:
    p = df[df.metric.str.startswith("pad_")].pivot_table(index="variant", columns="metric", values="value")
    display(p.astype(int))

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
