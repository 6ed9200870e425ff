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
# Upstream: [sgl-project/sglang#22858](https://github.com/sgl-project/sglang/pull/22858) ("[VLM] Enable per-image
# ViT cache and avoid TP CUDA context creation for Kimi-K2.5"); rebuilt in `sglab.fixes.grid_thw`, measured by
# `sglab.experiments.grid_thw`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of experiment.DEFAULT_PARAMS for a live run
TP_SIZES = [2, 4]  # measured live where this many GPUs are present

# %%
import pickle

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from sglab.core import hardware
from sglab.sglang import upstream
from sglab.core import notebook as nb
from sglab.experiments import grid_thw as experiment
from sglab.experiments.grid_thw import figures
from sglab.experiments.grid_thw import real
from sglab.fixes import grid_thw as fx
from sglab.sglang import compare_old as compare, compare_old as report

wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% tags=["needs-gpu"]
if wb.live:
    for tp in TP_SIZES:
        if hardware.meets(tp)[0]:
            params = {**experiment.DEFAULT_PARAMS, **PARAMS, "tp_size": tp}
            wb.measure(lambda: experiment.run(params), params=params, method_version=experiment.METHOD_VERSION,
                       gpu_count=tp)

# %%
shown = wb.shown()
nb.slide(experiment.EXPERIMENT, shown, figures.mechanism(figures.slide_run(shown)))

# %% [markdown]
# The picture: one row per process, one column per GPU, each cell split into the MiB that process holds on that GPU
# before | after the fix, once a kernel has run on the grid. Rank r belongs on GPU r and the tokenizer on GPU 0 (it
# preprocesses images there) in both variants. The red cells are contexts a rank opened only because the grid arrived
# on `cuda:0`: on GPU 0 always, and on a machine with more GPUs also on every other GPU.
#
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
# Re-creating a tensor on `cuda:0` initialises CUDA on GPU 0 in that process: a whole context, whatever the tensor's
# size. `process_mm_data` moves only the tensors named in `FEATURE_NAMES` to the CPU before the hop; Kimi's
# `grid_thws` is not one of them. The rebuild, on the CPU (the `before` grid would be on `cuda:0` on a GPU box):

# %%
print("FEATURE_NAMES =", fx.FEATURE_NAMES)
images = [fx.synthetic_image(i) for i in range(3)]
rows = []
for label, fixed in (("before", False), ("after", True)):
    out = fx.gpu_call(fx.prompt_for(len(images)), images, fixed=fixed, device="cpu")
    key = fx.grid_key(out)
    rows.append({"variant": label, "grid key": key, "grid": out[key].tolist(),
                 "pixel_values": tuple(out["pixel_values"].shape),
                 "moved to CPU by FEATURE_NAMES": [k for k in out if k in fx.FEATURE_NAMES],
                 "grid moved by .cpu() in _gpu_call": fixed})
display(pd.DataFrame(rows).set_index("variant"))

# %% [markdown]
# The device travels inside the pickle: a tensor's storage is pickled through `torch.save`, which records a location
# tag next to the bytes, and `pickle.loads` restores the storage to that location. Here the grid is on the CPU and the
# tag reads `cpu`; for the PR-era grid it read `cuda:0`, and the landing table below shows it re-created on `cuda:0`
# in every rank that received it.

# %%
grid = fx.gpu_call(fx.prompt_for(len(images)), images, fixed=True, device="cpu")["image_grid_thw"]
blob = pickle.dumps(grid)
tag = next(t for t in (b"cuda:0", b"cpu") if t in blob)
print(f"grid of {len(images)} images: {grid.nelement() * grid.element_size()} bytes of int64; "
      f"pickle.dumps(grid): {len(blob)} bytes; storage location tag inside: {tag.decode()!r}")
print("wires:", {name: w.cuda_tensor for name, w in fx.WIRES.items()})

# %% [markdown]
# ## The second half of the fix: per-image items
#
# `process_and_combine_mm_data` builds one bundled item per modality and then calls `get_new_expanded_mm_items`,
# which splits an image item into one item per image **only if it finds `image_grid_thw`** (patches per image =
# t·h·w). Under Kimi's old key there is no grid to split by, so the whole request stays one item and its cache key is
# the hash of all its pixels together.

# %%
for label, fixed in (("before", False), ("after", True)):
    items = fx.items_for_request(fx.process_mm_data(fx.prompt_for(3), images, fixed=fixed, device="cpu"))
    print(f"{label:>6}: {len(items)} item(s); offsets {[it.offsets for it in items]}; "
          f"feature rows {[int(it.feature.shape[0]) for it in items]}")

# %% [markdown]
# A seeded stream of multi-image requests (1–4 images each, drawn from a pool, so the same image comes back in
# different company) through the processor path and the embedding cache, on the CPU. Look at how many images the
# vision tower has to encode.

# %%
p = experiment.DEFAULT_PARAMS
cache = experiment.cache_table(pd.DataFrame(experiment.cache_rows(
    n_requests=p["cache_requests"], pool=p["cache_pool"], max_images=p["cache_max_images"], seed=p["seed"])))
display(cache)
fig = figures.cache_bars(cache, extra=f"{p['cache_requests']} requests, pool {p['cache_pool']}, "
                                      f"≤{p['cache_max_images']} images, seed {p['seed']}")
plt.show()
b, a = cache.loc["before"], cache.loc["after"]
print(f"The vision tower encodes {a.images_encoded:.0f} of {a.images_requested:.0f} images per image vs "
      f"{b.images_encoded:.0f} per request ({b.images_encoded / a.images_encoded:.0f}× fewer encodes).")

# %% [markdown]
# ## The real SGLang, before and after
#
# Which releases carry the fix (read from the released wheels), and the released `_gpu_call` of the first release
# with it (0.5.11) beside the rebuilt one:

# %%
compare.show_as_released(experiment.EXPERIMENT, fx.gpu_call, symbol="KimiGPUProcessorWrapper._gpu_call")

# %% [markdown]
# The released code itself, run on the CPU, one process per release: a real `MultimodalDataItem` holding the
# rebuild's grid, handed to the release's `KimiK25ForConditionalGeneration.get_image_feature` under either key
# (which one does the model read?); the release's `KimiGPUProcessorWrapper._gpu_call` on the rebuild's images as
# CPU tensors (0.5.23 moves images to CUDA itself, so it is not driven here); and the item inside what the
# tokenizer sends the scheduler, through the release's own wire — pickle (`send_pyobj`) in 0.5.1x, SGLang's
# msgpack encoding of a `TokenizedGenerateReqInput` in 0.5.23. 0.5.10.post1 is matched with `before` on the key
# only: its grid came from the CPU HF processor, so the `cuda:0` "before" of the rebuild never shipped in a
# release. Each row is checked fact for fact; a single difference prints `MISMATCH`.
#
# Recorded mode shows the answers recorded on the CPU box (`data/recorded/real_cpu/`, written by `sglab real record`;
# the tests check that they still equal a live run); `SGLAB_REAL=live` runs the installed releases here instead,
# about 8 s a release.

# %%
real_results = real.probe()  # recorded answers where they exist (SGLAB_REAL=live: run the releases now)
print(report.source_line(real_results))
real_checks = real.checks(real_results)
compare.show(real_checks, real.CLAIM)

# %% [markdown]
# On GPUs, a real item with the grid on `cuda:0` sent over the msgpack wire to a process on GPU 1, and the memory
# that process then holds on GPU 0:

# %%
compare.show_recorded(experiment.EXPERIMENT);

# %% [markdown]
# ## Measured: where the grid lands, and what it costs on GPU 0
#
# One *group* = fresh processes: a tokenizer that preprocesses on `cuda:0` and `tp_size` scheduler ranks
# (`sglab.core.dist`, rank r bound to GPU r, every GPU visible). `before`: grid on `cuda:0` under `grid_thws`, tokenizer →
# rank 0 as pickled bytes, rank 0 → the rest with `broadcast_pyobj`. `after`: `.cpu()` and `image_grid_thw`, same
# path. `ipc`: the `before` output sent to every rank as a CUDA IPC handle. `eager`: `before` with
# `CUDA_MODULE_LOADING=EAGER` in the ranks. Each group's rank 0 reads NVML for every process of the group on every GPU,
# all ranks held at a barrier: `init`, `received` (unpickled), `kernel` (kernels on the grid), `released`. Since a
# context only goes away with its process, each variant × repeat needs fresh processes; all groups run at once (NVML
# counts memory per process, and the run checks that groups do not mix). Runs shown, and where each rank's grid
# landed:

# %%
runs_ = wb.results()
gpu = experiment.frame(runs_) if runs_ else None
if gpu is None:
    print("No GPU run yet: record with `sglab record grid_thw` on a machine with 2 GPUs.")
else:
    for r in runs_:
        print(f"  {experiment.run_name(r)}  (method {r.manifest.get('method_version')}, {r.path.name})")
    display(experiment.landing(gpu))

# %% [markdown]
# Process × GPU for each variant of the run the slide draws (at `kernel`, median over repeats). `ipc` and `eager`
# look like `before`; `eager`'s stray context is larger (every module loaded up front).

# %%
if runs_:
    figures.heatmaps(figures.slide_run(shown))
    plt.show()

# %% [markdown]
# MiB per rank ≥ 1 on GPU 0, per run, variant and phase: one number when every repeat and rank read the same, a range
# otherwise (n = repeats × ranks ≥ 1). This is the repeatability check: within a run, and between runs on different
# machines and with different methods (method 1 ran the groups one after the other, method 2 all at once).

# %%
if gpu is not None:
    display(experiment.repeatability(gpu))
    print(f"Largest spread within one run: {experiment.spread_mib(gpu):.0f} MiB.")

# %% [markdown]
# Total waste on GPU 0 grows with the TP size: N − 1 ranks each bring a context (runs are never added up).

# %%
if gpu is not None:
    display(experiment.waste_vs_tp(gpu).round(0))
    figures.waste_vs_tp(gpu, runs_)
    plt.show()

# %% [markdown]
# A second cost the GPU-0 totals leave out: on a machine with more GPUs than GPU 0 and a rank's own, every rank ≥ 1
# also holds a bare context on each other GPU after the kernel steps — GPUs it never computes on,
# including GPUs outside its TP group. With `.cpu()` none appear. A 2-GPU machine has no such GPU.

# %%
if gpu is not None:
    off = experiment.off_rank_gpus(gpu)
    off = off[off.pairs_holding > 0] if len(off) else off
    display(off if len(off) else "no rank holds memory on a GPU other than GPU 0 and its own")

# %% [markdown]
# Every process of every group must be gone when its group ends (NVML must no longer list it), and, for runs whose
# groups ran at once, each group's `init` baseline was read while other groups' processes sat on GPU 0:

# %%
if gpu is not None:
    display(experiment.leftovers(gpu))
    display(experiment.concurrency(gpu))

# %% [markdown]
# ## See it in the profiler
#
# The profiler picture of this notebook is memory over time: NVML's per-process memory on each GPU, sampled by the
# parent at 100 Hz, with the moments each process marked. Look at the thick red line (rank 1 on GPU 0): nothing until
# the rank unpickles, a whole context during the unpickling, then one more step during a kernel step.

# %%
series_run = next((r for r in reversed(shown) if r.sidecar("memory") is not None), None)
if series_run is None:
    print("The runs shown predate the memory time series (method 1, no `memory` sidecar); a new recording "
          "(`sglab record grid_thw`) adds it.")
else:
    figures.memory_series(series_run, variants=("before", "after", "eager"))
    plt.show()
    print(f"Perfetto file of the same: {series_run.sidecar('trace')}")

# %% [markdown]
# What each step added to a rank ≥ 1's memory on GPU 0 (MiB, median over repeats and ranks), the per-thread stack
# limit of that context after each kernel step, and what the run says about the growth:

# %%
if series_run is not None:
    display(experiment.growth_by_step(series_run))
    display(experiment.stack_limits(series_run.df))
    print(experiment.explain_growth(series_run))

# %% [markdown]
# What this rules out: the growth is not the grid's allocation (that is one 2 MiB allocator segment), not `.item()`'s
# copy to the host, and not a raise of the stack size; `eager` shows the growth is deferred work of lazy loading that
# eager loading does up front. The cross-device copy (`copy to own GPU`) adds nothing on a 2-GPU machine; on a machine
# with more GPUs, its mark is where to look for the contexts on the other GPUs (method 1 saw them appear between
# `received` and `kernel`; a method-2 recording on 4 GPUs pins the step).
#
# ## Verdict

# %%
nb.verdict(experiment.EXPERIMENT, shown)

# %% [markdown]
# ## Upstream today

# %%
v = upstream.check(__import__("sglab.grid_thw.sglang", fromlist=["FIX"]).FIX)
print(f"installed SGLang: {v.status} — {v.detail}")

# %% [markdown]
# ## Takeaways and review points
#
# - The cost does not depend on the tensor: a grid of a few dozen bytes on `cuda:0` costs a whole CUDA context on
#   GPU 0 in every rank that unpickles it, and the context grows once kernels run there. It stays for the life of the
#   process (`released` shows it). With TP = N that is N − 1 contexts on GPU 0, taken from rank 0's KV cache budget.
# - On a machine with more GPUs, a rank that received the foreign grid also picked up a context on every other
#   visible GPU. The `.cpu()` fix removes both.
# - The general rule: nothing that crosses a process boundary should hold a CUDA tensor unless the receiver is meant
#   to share that GPU. `FEATURE_NAMES` is an allow-list of what gets moved; a model-specific processor returning
#   extra tensors escapes it. A deny-by-default check (every tensor in the processor output on the CPU unless the
#   transport is explicitly CUDA IPC) would catch the next one.
# - `torch.multiprocessing` / CUDA IPC is not a way out: the receiver still opens the handle on the tensor's device
#   (the `ipc` variant), and the sender must keep the tensor alive until every receiver is done.
# - The key rename matters as much as the `.cpu()`: only `image_grid_thw` lets `get_new_expanded_mm_items` split per
#   image, and only then does an image that comes back in a different request hit the cache.
# - Review question from the PR: with per-image items the batching helper `vision_tower_forward_auto` was removed;
#   can one large multi-image batch now exceed the vision tower's memory? (Not measured here.)
# - Later SGLang builds Kimi's grid on the CPU from the start (see the upstream check above).
