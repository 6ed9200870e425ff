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
# # 05 · A tiny tensor on `cuda:0` and a CUDA context on GPU 0 in every TP rank
#
# **Claim:** Kimi-K2.5's GPU image preprocessor left the per-image grid `grid_thws` on `cuda:0`; pickling
# ships a CUDA tensor together with its device, so every scheduler TP rank that unpickled the request opened a
# CUDA context on GPU 0 (hundreds of MiB each, on a GPU that belongs to rank 0). `grid_thws.cpu()` removes
# that, and renaming the key to `image_grid_thw` lets SGLang split a multi-image request per image, so the
# vision embedding cache hits per image instead of per identical image set.
#
# Upstream: [sgl-project/sglang#22858](https://github.com/sgl-project/sglang/pull/22858) — "[VLM] Enable
# per-image ViT cache and avoid TP CUDA context creation for Kimi-K2.5".
# Rebuild: `sglab.fixes.grid_thw` (mirrors `multimodal/processors/kimi_k25.py` `_gpu_call`,
# `base_processor.py` `FEATURE_NAMES` / `process_mm_data`, `managers/mm_utils.py` `get_new_expanded_mm_items`,
# `utils/common.py` `broadcast_pyobj`).

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
TP_SIZES = [2, 4]  # measured where this many GPUs are present
REPEATS = 3  # fresh processes per variant and repeat
CACHE_REQUESTS, CACHE_POOL, CACHE_MAX_IMAGES, SEED = 200, 24, 4, 0

# %%
import pickle

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display

from sglab import hardware, plots, upstream
from sglab import notebook as nb
from sglab.experiments import grid_thw as experiment
from sglab.fixes import grid_thw as fx

wb = nb.Workbook("grid_thw", gpus=2, mode=MODE)

# %% [markdown]
# ## The problem
#
# A request with images travels from the tokenizer manager (which preprocesses images on `cuda:0` when GPU
# preprocessing is on) to scheduler rank 0, and from there to the other TP ranks:
#
# | hop | SGLang mechanism | what happens to a CUDA tensor in the payload |
# |---|---|---|
# | tokenizer → scheduler rank 0 | ZMQ `send_pyobj` / `recv_pyobj` = `pickle.dumps` / `pickle.loads` | written by value **with its device**; re-created on `cuda:0` by the receiver |
# | rank 0 → ranks 1..N-1 | `broadcast_pyobj`: pickle → two gloo broadcasts (size, bytes) → `pickle.loads` | same: every rank re-creates it on `cuda:0` |
# | (alternative) `torch.multiprocessing` queue | `ForkingPickler` with torch's reducers | a CUDA IPC handle; the receiver opens it on `cuda:0` |
#
# Re-creating a tensor on `cuda:0` means initialising CUDA on GPU 0 in that process: a full context, whatever the
# tensor's size. `process_mm_data` moves only the tensors named in `FEATURE_NAMES` to the CPU before the hop;
# Kimi's `grid_thws` is not one of them.

# %%
print("FEATURE_NAMES =", fx.FEATURE_NAMES)
images = [fx.synthetic_image(i) for i in range(3)]
rows = []
for label, fixed in (("before", False), ("after", True)):
    out = fx.gpu_call(fx.prompt_for(len(images)), images, fixed=fixed, device="cpu")
    key = fx.grid_key(out)
    offloaded = fx.offload_features(dict(out))
    rows.append({"variant": label, "grid key": key, "grid": out[key].tolist(),
                 "pixel_values": tuple(out["pixel_values"].shape),
                 "moved to CPU by FEATURE_NAMES": [k for k in out if k in fx.FEATURE_NAMES],
                 "grid moved by .cpu() in _gpu_call": fixed})
display(pd.DataFrame(rows).set_index("variant"))

# %% [markdown]
# The device travels inside the pickle: a tensor's storage is pickled through `torch.save`, which records a
# location tag next to the bytes, and `pickle.loads` restores the storage to that location. Here the grid is on
# the CPU and the tag reads `cpu`; for the PR-era grid it read `cuda:0`, and the landing table below shows it
# re-created on `cuda:0` in every rank that received it.

# %%
grid = fx.gpu_call(fx.prompt_for(len(images)), images, fixed=True, device="cpu")["image_grid_thw"]
blob = pickle.dumps(grid)
tag = next(t for t in (b"cuda:0", b"cpu") if t in blob)
print(f"grid of {len(images)} images: {grid.nelement() * grid.element_size()} bytes of int64; "
      f"pickle.dumps(grid): {len(blob)} bytes; storage location tag inside: {tag.decode()!r}")

# %% [markdown]
# ## The second half of the fix: per-image items
#
# `process_and_combine_mm_data` builds one bundled item per modality and then calls
# `get_new_expanded_mm_items`, which splits an image item into one item per image **only if it finds
# `image_grid_thw`** (patches per image = t·h·w). Under Kimi's old key there is no grid to split by, so the whole
# request stays one item and its cache key is the hash of all its pixels together.

# %%
for label, fixed in (("before", False), ("after", True)):
    items = fx.items_for_request(fx.process_mm_data(fx.prompt_for(3), images, fixed=fixed, device="cpu"))
    print(f"{label:>6}: {len(items)} item(s); offsets {[it.offsets for it in items]}; "
          f"feature rows {[int(it.feature.shape[0]) for it in items]}")

# %% [markdown]
# A seeded stream of multi-image requests (1–4 images each, drawn from a pool of images, so the same image comes
# back in different company): the embedding cache, keyed by item hash, on the real processor path (on the CPU).

# %%
cache = pd.DataFrame(experiment.cache_rows(n_requests=CACHE_REQUESTS, pool=CACHE_POOL,
                                           max_images=CACHE_MAX_IMAGES, seed=SEED))
cache_t = cache.pivot_table(index="variant", columns="metric", values="value").loc[["before", "after"]]
display(cache_t)
fig, ax = plots.figure(width=6, height=3)
ax.bar(["per request (before)", "per image (after)"], cache_t["cache_image_hit_rate"] * 100,
       color=[plots.PALETTE["before"], plots.PALETTE["after"]])
ax.set_ylabel("images served from cache, %")
ax.set_ylim(0, 100)
plots.caption(fig, None,
              extra=f"{CACHE_REQUESTS} requests, pool {CACHE_POOL}, ≤{CACHE_MAX_IMAGES} images, seed {SEED}")
b, a = cache_t.loc["before"], cache_t.loc["after"]
print(f"Vision tower encodes {a.images_encoded:.0f} of {a.images_requested:.0f} images per image vs "
      f"{b.images_encoded:.0f} per request ({b.images_encoded / a.images_encoded:.1f}x fewer encodes).")

# %% [markdown]
# ## Measure: where the grid lands, and what it costs on GPU 0
#
# One variant = fresh processes: a tokenizer process that preprocesses on `cuda:0`, and `tp_size` scheduler ranks
# (`sglab.dist`, rank r bound to GPU r, every GPU visible). `before`: grid on `cuda:0` under `grid_thws`,
# tokenizer → rank 0 as pickled bytes over a Unix socket, rank 0 → the rest with `broadcast_pyobj` on the gloo
# group. `after`: `.cpu()` and `image_grid_thw`, same path. `ipc`: the `before` output sent to every rank the way
# a `torch.multiprocessing` queue sends it. Rank 0 reads NVML memory of every process on every GPU, all ranks held
# at a barrier, at `init` (own context only), `received` (unpickled), `kernel` (a kernel ran on the grid where it
# landed, then on the rank's own GPU), `released` (tensors deleted, cache emptied). Each variant is repeated
# with fresh processes; afterwards no process may be alive or listed by NVML.

# %% tags=["needs-gpu"]
if wb.live:
    for tp in TP_SIZES:
        if hardware.meets(tp)[0]:
            params = {**experiment.DEFAULT_PARAMS, "tp_size": tp, "repeats": REPEATS}
            wb.measure(lambda: experiment.run(params), params=params, method_version=experiment.METHOD_VERSION,
                       gpu_count=tp)

# %%
runs_ = wb.results()
gpu = experiment.frame(runs_) if runs_ else None
if gpu is None:
    print("No recorded GPU run yet: the memory heatmaps and the waste vs TP size cannot be shown here. "
          "Record with `sglab record grid_thw --param tp_size=2` (2 GPUs) and `--param tp_size=4` (4 GPUs).")
else:
    print("Runs shown below (all of them, oldest first; every table keeps them apart):")
    for r in runs_:
        print(f"  {experiment.run_name(r)}  ({r.path.name})")
    print("\nWhere each rank's grid landed (over all runs and repeats):")
    display(experiment.landing(gpu))

# %% [markdown]
# The heatmaps below are taken at `kernel`, the largest phase: one per run, process × GPU, MiB (median over
# repeats; every repeat read the same value, see the repeatability table further down).

# %%
def draw_heatmap(ax, table, title, vmax):
    ax.imshow(table.values, cmap="Reds", vmin=0, vmax=vmax)
    ax.set_xticks(range(table.shape[1]), table.columns)
    ax.set_yticks(range(table.shape[0]), table.index)
    ax.grid(False)
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            value = table.values[i, j]
            ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=8,
                    color="white" if value > 0.6 * vmax else "black")
    ax.set_title(title)


if gpu is not None:
    for run in runs_:
        df = run.df
        tp = int(df.tp_size.max())
        variants = [v for v in ("before", "after", "ipc") if v in set(df.variant)]
        fig, axes = plots.figure(ncols=len(variants), width=4.2 * len(variants), height=1.3 + 0.55 * (tp + 1))
        tables = {v: experiment.heatmap(df, v, "kernel") for v in variants}
        vmax = max(1.0, max(float(np.nanmax(t.values)) for t in tables.values()))
        for ax, v in zip(np.ravel(axes), variants):
            draw_heatmap(ax, tables[v], f"{v}: MiB per process × GPU", vmax)
        fig.suptitle(experiment.run_name(run), fontsize=10)
        plots.caption(fig, run, extra=f"TP {tp} on a {int(df[df.metric == 'gpu_memory'].gpu.max()) + 1}-GPU machine · "
                                      "phase 'kernel' · median over repeats")
        plt.show()

# %% [markdown]
# Rank r should hold memory on GPU r only (its own context); the tokenizer's context on GPU 0 is there in both
# variants (it preprocesses there). Anything a rank ≥ 1 holds on GPU 0 is waste: memory taken from rank 0's KV
# cache budget. Per run, variant and phase, MiB per rank ≥ 1 on GPU 0: one number when every repeat and rank read
# the same, a range otherwise (n = repeats × ranks ≥ 1). The columns are the three runs, so the table is also the
# repeatability check: within a run, and between the two TP 2 runs on different machines.

# %%
if gpu is not None:
    display(experiment.repeatability(gpu))
    per_rank = experiment.gpu0_per_rank(gpu)
    spread = (per_rank.max_mib - per_rank.min_mib).max()
    before_k = per_rank[(per_rank.variant == "before") & (per_rank.phase == "kernel")]
    tp2 = before_k[before_k.tp_size == 2]
    print(f"Largest spread between repeats (and ranks) of one run: {spread:.0f} MiB.")
    if len(tp2) > 1:
        print(f"Between the {len(tp2)} TP 2 runs, rank 1 on GPU 0 after a kernel: "
              + ", ".join(f"{m:.0f} MiB ({r})" for r, m in zip(tp2.run, tp2.median_mib))
              + f"; a difference of {tp2.median_mib.max() - tp2.median_mib.min():.0f} MiB.")
        m = gpu[(gpu.metric == "gpu_memory") & (gpu["rank"] == 0) & (gpu.gpu == 0) & (gpu.phase == "init")]
        own = m[m.tp_size == 2].groupby("run").value.median()
        print("Rank 0's own context at `init` in the same runs: "
              + ", ".join(f"{v:.0f} MiB ({r})" for r, v in own.items())
              + f"; a difference of {own.max() - own.min():.0f} MiB, so the offset is the machine's, not the grid's.")

# %% [markdown]
# Total waste on GPU 0 grows with the TP size: N − 1 ranks each bring a context. Each run is plotted on its own
# (runs are never added up); `ipc` lies on top of `before`.

# %%
if gpu is not None:
    waste = experiment.waste_vs_tp(gpu)
    display(waste.round(0))
    fig, ax = plots.figure(width=6.4)
    styles = {"before": dict(marker="o", ls="-", color=plots.PALETTE["before"]),
              "ipc": dict(marker="x", ls="--", color=plots.PALETTE["accent"], markersize=8),
              "after": dict(marker="s", ls="-", color=plots.PALETTE["after"])}
    waste["machine"] = [name.split(", ")[1] for name in waste.run]
    for (v, machine), g in waste.groupby(["variant", "machine"]):
        g = g.sort_values("tp_size")
        st = dict(styles.get(v, {}))
        if machine.startswith("2-GPU"):
            st.update(ls="none", mfc="none", markersize=10)
        ax.plot(g.tp_size, g.median_mib, label=f"{v} ({machine})", **st)
    per = per_rank[(per_rank.phase == "kernel") & (per_rank.variant == "before")].median_mib.median()
    tps = np.array(sorted(waste.tp_size.unique()))
    ax.plot(tps, (tps - 1) * per, color="#999999", lw=0.8, ls=":", label=f"(N−1) × {per:.0f} MiB")
    ax.set_xticks(tps)
    ax.set_xlabel("TP size N")
    ax.set_ylabel("MiB on GPU 0 held by ranks 1..N−1")
    ax.set_ylim(bottom=-50)
    ax.legend(loc="upper left", fontsize=8)
    plots.caption(fig, runs_[-1], extra=f"newest of {len(runs_)} runs (all listed above, all plotted) · "
                                        "phase 'kernel' · median over repeats")
    plt.show()
    w = waste.set_index(["run", "variant"]).median_mib
    for name in waste.run.unique():
        tp = int(waste[waste.run == name].tp_size.iloc[0])
        k = per_rank[(per_rank.run == name) & (per_rank.phase == "kernel")].set_index("variant").median_mib
        r = per_rank[(per_rank.run == name) & (per_rank.phase == "received")].set_index("variant").median_mib
        print(f"{name}: each rank >= 1 holds {r['before']:.0f} MiB on GPU 0 after unpickling and "
              f"{k['before']:.0f} MiB after one kernel before the fix, {k['after']:.0f} MiB after it; "
              f"total on GPU 0 {w[(name, 'before')]:.0f} MiB before, {w[(name, 'after')]:.0f} MiB after.")

# %% [markdown]
# The heatmaps of the 4-GPU machine show a second cost the GPU-0 totals leave out: at `kernel`, every rank ≥ 1
# also holds a context on each GPU that is neither GPU 0 nor its own, GPUs it never computes on, including GPUs 2
# and 3 in the TP 2 run that are not in its TP group at all. The grid is the only thing on a foreign device, so the
# trigger sits between `received` (nothing there) and `kernel`: a kernel on `cuda:0`, then a copy `cuda:0` → own
# GPU. The copy is the one cross-device step; this run does not isolate which call opens the contexts. With
# `.cpu()` none appear. On the 2-GPU machine there is no such GPU, so its run has no row here.

# %%
if gpu is not None:
    off = experiment.off_rank_gpus(gpu)
    if len(off):
        off = off[off.pairs_holding > 0]
        display(off if len(off) else "no rank holds memory on a GPU other than GPU 0 and its own")

# %% [markdown]
# Every process of every variant must be gone when the variant ends (the launcher kills stragglers; NVML must
# no longer list their pids). Checked after each variant of each repeat:

# %%
if gpu is not None:
    display(experiment.leftovers(gpu))

# %% [markdown]
# ## Upstream today

# %%
v = upstream.check("grid_thw")
print(f"installed SGLang: {v.status} — {v.detail}")

# %% [markdown]
# ## Takeaways and review points
#
# - The cost does not depend on the tensor: a grid of a few dozen bytes on `cuda:0` costs a whole CUDA context on
#   GPU 0 in every rank that unpickles it, and the context grows once a kernel runs there (lazy module loading).
#   It stays for the life of the process (`released` shows it). With TP=N that is N-1 contexts on GPU 0, which
#   shrinks rank 0's KV cache; the waste table shows the total growing by one context per extra rank.
# - On a machine with more GPUs than these two, a rank that copies the foreign grid to its own GPU also picked
#   up a context on every other visible GPU (the 4-GPU heatmaps). Whether SGLang's model code pays that too
#   depends on whether it moves `grid_thws` to its device; the `.cpu()` fix removes both.
# - The general rule: nothing that crosses a process boundary should hold a CUDA tensor unless the receiver is
#   meant to share that GPU. `FEATURE_NAMES` is an allow-list of what gets moved; a model-specific processor
#   returning extra tensors escapes it. A deny-by-default check (every tensor in the processor output on the
#   CPU unless the transport is explicitly CUDA IPC) would catch the next one.
# - `torch.multiprocessing` / CUDA IPC is not a way out: the receiver still opens the handle on the tensor's
#   device (the `ipc` variant), and the sender must keep the tensor alive until every receiver is done.
# - The key rename matters as much as the `.cpu()`: only `image_grid_thw` lets `get_new_expanded_mm_items`
#   split per image, and only then does an image that comes back in a different request hit the cache.
# - Review question from the PR: with per-image items, the batching helper `vision_tower_forward_auto` was
#   removed; can one large multi-image batch now exceed the vision tower's memory? (Not measured here.)
# - Later SGLang builds Kimi's grid on the CPU from the start (see the upstream check above).
