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
# Upstream: [sgl-project/sglang#22858](https://github.com/sgl-project/sglang/pull/22858) ("[VLM]
# Enable per-image ViT cache and avoid TP CUDA context creation for Kimi-K2.5"). Rebuilt in
# `sglab.grid_thw.rebuild`, measured by `sglab.grid_thw.measure`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of measure.DEFAULT_PARAMS for a live run
TP_SIZES = [2, 4]  # measured live where this machine has that many GPUs
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import pickle

import pandas as pd

from sglab.core.notebook import Workbook, slide, verdict
from sglab.grid_thw import claims, measure, rebuild, sglang, show


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE)
for tp in measure.tp_sizes(TP_SIZES):  # live: each TP size this machine has the GPUs for
    wb.run(measure, {**PARAMS, "tp_size": tp})
# the runs measured now, else the committed runs (the newest per GPU model and TP size)
run = wb.run()
slide(claims, run, show.mechanism(run))

# %% [markdown]
# The picture: one row per process, one column per GPU, each cell split into the MiB that process
# holds on that GPU before | after the fix, once a kernel has run on the grid. Rank r belongs on
# GPU r and the tokenizer on GPU 0 (it preprocesses images there) in both variants. The red cells
# are contexts a rank opened only because the grid arrived on `cuda:0`: on GPU 0 always, and on a
# machine with more GPUs also on every other GPU.
#
# ## The problem
#
# A request with images travels from the tokenizer manager (which preprocesses images on `cuda:0`
# when GPU preprocessing is on) to scheduler rank 0, and from there to the other TP ranks:
#
# - tokenizer → scheduler rank 0: ZMQ `send_pyobj` / `recv_pyobj` = `pickle.dumps` /
#   `pickle.loads`. A CUDA tensor is written by value **with its device** and re-created on
#   `cuda:0` by the receiver.
# - rank 0 → ranks 1..N-1: `broadcast_pyobj`, pickle → two gloo broadcasts (size, bytes) →
#   `pickle.loads`. The same: every rank re-creates it on `cuda:0`.
# - (the alternative) a `torch.multiprocessing` queue: `ForkingPickler` with torch's reducers. A
#   CUDA IPC handle, which the receiver opens on `cuda:0`.
#
# Re-creating a tensor on `cuda:0` initialises CUDA on GPU 0 in that process: a whole context,
# whatever the tensor's size. `process_mm_data` moves only the tensors named in `FEATURE_NAMES` to
# the CPU before the hop; Kimi's `grid_thws` is not one of them. Which releases carry the fix (read
# from the released wheels), and the released `_gpu_call` of the first release with it (0.5.11)
# beside the rebuilt one:

# %%
sglang.released(rebuild.gpu_call, symbol="KimiGPUProcessorWrapper._gpu_call")

# %% [markdown]
# ## The lesson, on the CPU: what the tokenizer ships
#
# Preprocess three images each way, then apply the `FEATURE_NAMES` offload. On the CPU the `before`
# grid stays on the CPU; on a GPU box it would stay on `cuda:0`.

# %%
print("FEATURE_NAMES =", rebuild.FEATURE_NAMES)
images = [rebuild.synthetic_image(i) for i in range(3)]
rows = []
for variant, fixed in (("before", False), ("after", True)):
    out = rebuild.process_mm_data(rebuild.prompt_for(len(images)), images, fixed=fixed,
                                  device="cpu")
    key = rebuild.grid_key(out)
    rows.append({
        "variant": variant, "grid key": key, "grid": out[key].tolist(),
        "pixel_values": tuple(out["pixel_values"].shape), "moved to CPU by FEATURE_NAMES": [
            k for k in out if k in rebuild.FEATURE_NAMES
        ], "grid moved by .cpu() in _gpu_call": fixed
    })
pd.DataFrame(rows).set_index("variant")

# %% [markdown]
# The device travels inside the pickle: a tensor's storage is pickled through `torch.save`, which
# records a location tag next to the bytes, and `pickle.loads` restores the storage to that
# location. Here the grid is on the CPU and the tag reads `cpu`; for the PR-era grid it read
# `cuda:0`, and the landing table below shows it re-created on `cuda:0` in every rank that received
# it.

# %%
grid = out["image_grid_thw"]
blob = rebuild.send_pyobj(grid)
tag = next(t for t in (b"cuda:0", b"cpu") if t in blob)
print(f"grid of {len(images)} images: {grid.nelement() * grid.element_size()} bytes of int64; "
      f"pickle.dumps(grid): {len(blob)} bytes; storage location tag inside: {tag.decode()!r}; "
      f"the same as pickle: {blob == pickle.dumps(grid)}")
pd.DataFrame([{"wire": name, "a CUDA tensor": w.cuda_tensor} for name, w in rebuild.WIRES.items()])

# %% [markdown]
# ## The second half of the fix: per-image items
#
# `process_and_combine_mm_data` builds one bundled item per modality and then calls
# `get_new_expanded_mm_items`, which splits an image item into one item per image **only if it
# finds `image_grid_thw`** (patches per image = t·h·w). Under Kimi's old key there is no grid to
# split by, so the whole request stays one item and its cache key is the hash of all its pixels
# together.

# %%
rows = []
for variant, fixed in (("before", False), ("after", True)):
    out = rebuild.process_mm_data(rebuild.prompt_for(3), images, fixed=fixed, device="cpu")
    for item in rebuild.items_for_request(out):
        rows.append({
            "variant": variant, "offsets": item.offsets, "feature rows": int(item.feature.shape[0]),
            "model data": list(item.model_specific_data), "hash": f"{item.hash:016x}"
        })
pd.DataFrame(rows)

# %% [markdown]
# A seeded stream of multi-image requests (1–4 images each, drawn from a pool, so the same image
# comes back in different company) through the processor path and the embedding cache, on the CPU.
# Look at how many images the vision tower has to encode.

# %%
p = measure.DEFAULT_PARAMS
stream = rebuild.request_stream(p["cache_requests"], p["cache_pool"], p["cache_max_images"],
                                p["seed"])
pool = {i: rebuild.synthetic_image(i) for i in range(p["cache_pool"])}
stats = {}
for variant, fixed in (("before", False), ("after", True)):
    cache = rebuild.EmbeddingCache()
    for ids in stream:
        imgs = [pool[i] for i in ids]
        out = rebuild.process_mm_data(rebuild.prompt_for(len(imgs)), imgs, fixed=fixed,
                                      device="cpu")
        cache.lookup_request(rebuild.items_for_request(out))
    stats[variant] = cache.stats
show.cache_point(
    stats, f"{len(stream)} requests, pool {p['cache_pool']}, "
    f"≤{p['cache_max_images']} images, seed {p['seed']}")

# %% [markdown]
# ## The real SGLang, before and after
#
# The released code itself, run on the CPU, one process per release: a real `MultimodalDataItem`
# holding the rebuild's grid, handed to the release's
# `KimiK25ForConditionalGeneration.get_image_feature` under either key (which one does the model
# read?); the release's `KimiGPUProcessorWrapper._gpu_call` on the rebuild's images as CPU tensors
# (0.5.23 moves images to CUDA itself, so it is not driven here); and the item inside what the
# tokenizer sends the scheduler, through the release's own wire: pickle (`send_pyobj`) in 0.5.1x,
# SGLang's msgpack encoding of a `TokenizedGenerateReqInput` in 0.5.23. 0.5.10.post1 is matched with
# `before` on the key only: its grid came from the CPU HF processor, so the `cuda:0` "before" of the
# rebuild never shipped in a release. Each row is checked fact for fact.
#
# Recorded mode shows the answers recorded on the CPU box (`data/recorded/real_cpu/`, written by
# `sglab real record`; the tests check that they still equal a live run); `SGLAB_REAL=live` runs the
# installed releases here instead, about 8 s a release.

# %%
sglang.compare()

# %% [markdown]
# ### The real engine at TP 2 and TP 4
#
# SGLang's whole engine on the tiny Kimi-K2.5, fed one 448×448 image: each process's memory on each
# GPU (NVML, after the request) with 0.5.11 as released (grid on the CPU) and with the one line of
# the PR (#22858) reverted, at TP 2 and at TP 4. A machine without network has no Kimi-K2.5
# processor files, so the release's `get_processor` is handed a processor made here
# (`sglab.grid_thw.stand_in`: the harness's tokenizer with Kimi's media tokens, Kimi-K2.5's patch
# settings); the preprocessing on GPU 0, the grid and its trip to the ranks are the release's own.
# The engine runs with decode graphs up to batch 4, no all-reduce fusion and no grammar backend
# (start-up time and what the bundles carry; none of them touches the grid). The first table is the
# newest run of each TP size; the second, every run, is the lesson: GPU 0's total grows by one CUDA
# context per rank ≥ 1. The lines under it name the other GPUs where a rank ≥ 1 picked up a context
# too. Rerun with `bash scripts/engine_gpu.sh --plan 05` (2 or 4 GPUs; a plan skips what the machine
# cannot run).

# %%
engine = sglang.FIX.recorded_engine()
show.engine(engine)
verdict(claims.ENGINE, engine)

# %% [markdown]
# ## Measured: where the grid lands (GPU)
#
# One *group* = fresh processes: a tokenizer that preprocesses on `cuda:0` and `tp_size` scheduler
# ranks (`sglab.core.dist`, rank r bound to GPU r, every GPU visible). `before`: grid on `cuda:0`
# under `grid_thws`, tokenizer → rank 0 as pickled bytes, rank 0 → the rest with `broadcast_pyobj`.
# `after`: `.cpu()` and `image_grid_thw`, same path. `ipc`: the `before` output sent to every rank
# as a CUDA IPC handle. `eager`: `before` with `CUDA_MODULE_LOADING=EAGER` in the ranks. Each
# group's rank 0 reads NVML for every process of the group on every GPU, all ranks held at a
# barrier: `init`, `received` (unpickled), `kernel` (kernels on the grid), `released`. A context
# only goes away with its process, so each variant × repeat needs fresh processes; all groups run at
# once (NVML counts memory per process, and the run checks that groups do not mix). The runs shown,
# where each rank's grid landed, and process × GPU MiB per variant (at `kernel`, median over
# repeats) of the run with the most ranks: `ipc` and `eager` look like `before`; `eager`'s stray
# context is larger (every module loaded up front).

# %%
show.landed(run)

# %% [markdown]
# ## What it costs on GPU 0 (GPU)
#
# MiB per rank ≥ 1 on GPU 0, per run, variant and phase: one number when every repeat and rank read
# the same, a range otherwise (n = repeats × ranks ≥ 1), between runs of different machines and
# methods (method 1 ran the groups one after the other, method 2 all at once).

# %%
show.repeats(run)

# %% [markdown]
# The total on GPU 0 grows with the TP size: N − 1 ranks each bring a context (runs are never added
# up). A second cost the GPU-0 totals leave out: on a machine with more GPUs than GPU 0 and a rank's
# own, every rank ≥ 1 also holds a bare context on each other GPU after the kernel steps — GPUs it
# never computes on, including GPUs outside its TP group. With `.cpu()` none appear. A 2-GPU machine
# has no such GPU.

# %%
show.waste(run)

# %% [markdown]
# Every process of every group must be gone when its group ends (NVML must no longer list it), and,
# for runs whose groups ran at once, each group's `init` baseline was read while other groups'
# processes sat on GPU 0:

# %%
show.hygiene(run)

# %% [markdown]
# ## See it in the profiler
#
# The profiler picture of this notebook is memory over time: NVML's per-process memory on each GPU,
# sampled by the parent at 100 Hz, with the moments each process marked. Look at the thick red line
# (rank 1 on GPU 0): nothing until the rank unpickles, a whole context during the unpickling, then
# one more step during a kernel step. Below it, what each step added to a rank ≥ 1's memory on GPU 0
# (MiB, median over repeats and ranks), the per-thread stack limit of that context after each kernel
# step, and what the run says about the growth.

# %%
show.profiler(run)

# %% [markdown]
# What this rules out: the growth is not the grid's allocation (that is one 2 MiB allocator
# segment), not `.item()`'s copy to the host, and not a raise of the stack size; `eager` shows the
# growth is deferred work of lazy loading that eager loading does up front. The cross-device copy
# (`copy to own GPU`) adds nothing on a 2-GPU machine; on a machine with more GPUs, its mark is
# where to look for the contexts on the other GPUs (method 1 saw them appear between `received` and
# `kernel`; a method-2 recording on 4 GPUs pins the step).
#
# ## Your own setup
#
# A TP size and a request stream → the GPU-0 memory the ranks ≥ 1 hold before the fix (one stray
# context each, at the size measured on each recorded GPU model) and the images the vision tower
# encodes per request and per image (the stream runs here, on the CPU). On your own GPUs,
# `sglab record grid_thw --param tp_size=N` measures it.

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Verdict
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# grid_thw` does the same on the command line).

# %%
verdict(claims, run)

# %% [markdown]
# ## Takeaways and review points
#
# - The cost does not depend on the tensor: a grid of a few dozen bytes on `cuda:0` costs a whole
#   CUDA context on GPU 0 in every rank that unpickles it, and the context grows once kernels run
#   there. It stays for the life of the process (`released` shows it). With TP = N that is N − 1
#   contexts on GPU 0, taken from rank 0's KV cache budget.
# - On a machine with more GPUs, a rank that received the foreign grid also picked up a context on
#   every other visible GPU. The `.cpu()` fix removes both.
# - The general rule: nothing that crosses a process boundary should hold a CUDA tensor unless the
#   receiver is meant to share that GPU. `FEATURE_NAMES` is an allow-list of what gets moved; a
#   model-specific processor returning extra tensors escapes it. A deny-by-default check (every
#   tensor in the processor output on the CPU unless the transport is explicitly CUDA IPC) would
#   catch the next one.
# - `torch.multiprocessing` / CUDA IPC is not a way out: the receiver still opens the handle on the
#   tensor's device (the `ipc` variant), and the sender must keep the tensor alive until every
#   receiver is done.
# - The key rename matters as much as the `.cpu()`: only `image_grid_thw` lets
#   `get_new_expanded_mm_items` split per image, and only then does an image that comes back in a
#   different request hit the cache.
# - Review question from the PR: with per-image items the batching helper
#   `vision_tower_forward_auto` was removed; can one large multi-image batch now exceed the vision
#   tower's memory? (Not measured here.)
# - Later SGLang builds Kimi's grid on the CPU from the start (the `changed` state in the release
#   timeline above).
