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
# Enable per-image ViT cache and avoid TP CUDA context creation for Kimi-K2.5").

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

from sglab.core import engine_view
from sglab.core.notebook import Workbook, card, reveal, show_figure, verdict
from sglab.grid_thw import claims, measure, rebuild, sglang, show
from sglab.sglang import codepath


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE)
for tp in measure.tp_sizes(TP_SIZES):  # live: each TP size this machine has the GPUs for
    wb.run(measure, {**PARAMS, "tp_size": tp})
run = wb.run()  # the rebuild: measured now, else the committed runs (newest per GPU and TP size)
engine = sglang.FIX.recorded_engine()  # SGLang's own engine, recorded on GPUs
card(sglang.FIX, claims, run, engine)

# %%
show_figure(show.mechanism(engine))

# %% [markdown]
# One row per process of SGLang's engine, one column per GPU; each cell splits the MiB that process
# holds on that GPU after one image request: with the PR's line reverted | as released. Rank r
# belongs on GPU r, and the main process (the tokenizer, which preprocesses the image) on GPU 0. A
# red cell is a context a rank opened only because the grid reached it on `cuda:0`.
#
# ## The problem
#
# An image request goes from the tokenizer, which preprocesses images on `cuda:0`, to scheduler
# rank 0 (ZMQ `send_pyobj`: pickle), and from rank 0 to the other ranks (`broadcast_pyobj`:
# pickle again). Pickle writes a CUDA tensor by value **with its device**, and `pickle.loads`
# re-creates it there: on `cuda:0`, in every rank. Touching `cuda:0` makes a process create a CUDA
# context on GPU 0, whatever the tensor's size. `process_mm_data` moves the tensors named in
# `FEATURE_NAMES` to the CPU before the hop; Kimi's `grid_thws` is not one of them. The releases
# that carry the fix (read from the released wheels), then the released `_gpu_call` beside the
# rebuilt one:

# %%
sglang.released(rebuild.gpu_call, symbol="KimiGPUProcessorWrapper._gpu_call")

# %% [markdown]
# ## The lesson, on the CPU
#
# The rebuild's `process_mm_data` preprocesses three images each way and applies the
# `FEATURE_NAMES` offload. On the CPU the `before` grid stays on the CPU; on a GPU box it would stay
# on `cuda:0`. Then what pickle writes for the grid: the storage's location tag travels with the
# bytes.

# %%
print("FEATURE_NAMES =", rebuild.FEATURE_NAMES)
images = [rebuild.synthetic_image(i) for i in range(3)]
rows = []
for variant, fixed in (("before", False), ("after", True)):
    out = rebuild.process_mm_data(rebuild.prompt_for(len(images)), images, fixed=fixed,
                                  device="cpu")
    key = rebuild.grid_key(out)
    moved = [k for k in out if k in rebuild.FEATURE_NAMES]
    rows.append({
        "variant": variant, "grid key": key, "grid": out[key].tolist(),
        "pixel_values": tuple(out["pixel_values"].shape), "moved to CPU by FEATURE_NAMES": moved,
        "grid moved by .cpu() in _gpu_call": fixed
    })
grid = out["image_grid_thw"]
blob = rebuild.send_pyobj(grid)
tag = next(t for t in (b"cuda:0", b"cpu") if t in blob)
print(f"grid of {len(images)} images: {grid.nelement() * grid.element_size()} bytes of int64; "
      f"pickle.dumps(grid): {len(blob)} bytes, location tag inside: {tag.decode()!r}, the same "
      f"bytes as pickle: {blob == pickle.dumps(grid)}")
pd.DataFrame(rows).set_index("variant")

# %% [markdown]
# **Predict, then run.** `get_new_expanded_mm_items` splits a request's image item into one item
# per image **only if it finds `image_grid_thw`** (patches per image = t·h·w). A request carries
# three images. Under Kimi's old key `grid_thws` and under `image_grid_thw`: how many items, and how
# many cache keys (hashes), does the request become?

# %%
rows = []
for variant, fixed in (("before", False), ("after", True)):
    out = rebuild.process_mm_data(rebuild.prompt_for(len(images)), images, fixed=fixed,
                                  device="cpu")
    for item in rebuild.items_for_request(out):
        rows.append({
            "variant": variant, "offsets": item.offsets, "feature rows": int(item.feature.shape[0]),
            "model data": list(item.model_specific_data), "hash": f"{item.hash:016x}"
        })
reveal(pd.DataFrame(rows))

# %% [markdown]
# **Predict, then run.** A seeded stream of multi-image requests (1 to a few images each, drawn from
# a small pool, so the same image comes back in other company) goes through the processor path and
# the embedding cache. Of all the images requested, what share does the vision tower *not* have to
# encode, with one cache key per request and with one per image?

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
print(f"{len(stream)} requests of 1–{p['cache_max_images']} images from a pool of "
      f"{p['cache_pool']} (seed {p['seed']})")
reveal(show.cache_answer(stats))

# %% [markdown]
# ## Real SGLang
#
# The request's path through the first release with the fix, each box linked to its line at the
# release's tag:

# %%
codepath.show(sglang.CODE_PATH_RELEASE, sglang.CODE_PATH, "An image request's grid, tokenizer to "
              "model")

# %% [markdown]
# The releases' own code on the CPU, one process per release, each answer checked fact for fact
# against the rebuild: which key `get_image_feature` reads, what `_gpu_call` returns on the
# rebuild's images (0.5.23 moves images to CUDA itself, so it is not driven here), and what the
# release's wire does to the grid (pickle in 0.5.1x, msgpack in 0.5.23). 0.5.10.post1 is matched
# with `before` on the key only: its grid came from the CPU HF processor. Recorded mode shows the
# answers recorded on the CPU box (`sglab real record`); `SGLAB_REAL=live` runs the installed
# releases here.

# %%
sglang.compare()

# %% [markdown]
# ### The engine, before and after
#
# SGLang's whole engine on the tiny Kimi-K2.5 fed one image, as released and with the PR's one line
# reverted, at TP 2 and TP 4: each process's memory on each GPU (NVML) after the request. The
# release's `get_processor` gets a processor made here (`sglab.grid_thw.stand_in`, no network for
# Kimi's files); the preprocessing on GPU 0, the grid and its trip to the ranks are the release's
# own. Rerun with `bash scripts/engine_gpu.sh --plan 05`.

# %%
engine_view.section(show.VIEW, engine, claims.ENGINE)

# %% [markdown]
# ## Your own setup
#
# A TP size and a request stream → the GPU-0 memory the ranks ≥ 1 hold before the fix (one stray
# context each, at the size a rank ≥ 1 held at that TP size on each recorded GPU model; a TP size
# with no recorded run takes the nearest one's, and the table says it is an estimate) and the images
# the vision tower encodes per request and per image (the stream runs here). On your own GPUs,
# `sglab record grid_thw --param tp_size=N` measures it.

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Takeaways and review points
#
# - The cost does not depend on the tensor: a grid of a few dozen bytes on `cuda:0` costs a whole
#   CUDA context on GPU 0 in every rank that unpickles it, for the life of the process. With TP = N
#   that is N − 1 contexts on GPU 0, after rank 0 has sized its KV cache there.
# - On a machine with more GPUs, each rank that received the foreign grid also opened a context on
#   every other GPU it can see, in the rebuild and in the real engine alike. The `.cpu()` removes
#   them all.
# - The general rule: nothing that crosses a process boundary should hold a CUDA tensor unless the
#   receiver is meant to share that GPU. `FEATURE_NAMES` is an allow-list of what gets moved; a
#   model's processor that returns another tensor escapes it. A deny-by-default check (every tensor
#   of the processor output on the CPU unless the transport is CUDA IPC on purpose) would catch the
#   next one.
# - CUDA IPC is no way out: the receiver still opens the handle on the tensor's device (the `ipc`
#   variant in the appendix), and the sender must keep the tensor alive until every receiver is
#   done.
# - The key rename matters as much as the `.cpu()`: only `image_grid_thw` lets
#   `get_new_expanded_mm_items` split per image, and only then does an image that comes back in
#   another request hit the cache.
# - Review question from the PR: with per-image items the batching helper
#   `vision_tower_forward_auto` was removed; can one large multi-image batch now exceed the vision
#   tower's memory? (Not measured here.)
# - Later SGLang builds Kimi's grid on the CPU from the start, in the releases below (read from the
#   wheels).

# %%
rewritten = [v for v, state in sglang.FIX.releases() if state == "changed"]
print(f"grid built on the CPU, no `.cpu()` needed: {rewritten[0]}–{rewritten[-1]} "
      f"({len(rewritten)} releases)" if rewritten else "no release builds the grid on the CPU yet")

# %% [markdown]
# ## Appendix
#
# ### The rebuild on GPUs: where the grid lands
#
# One *group* is fresh processes: a tokenizer that preprocesses on `cuda:0` and `tp_size` scheduler
# ranks (rank r on GPU r, every GPU visible). `before`: grid on `cuda:0` under `grid_thws`, pickled
# to rank 0, `broadcast_pyobj` to the rest. `after`: `.cpu()` and `image_grid_thw`. `ipc`: the
# `before` output sent to every rank as a CUDA IPC handle. `eager`: `before` with
# `CUDA_MODULE_LOADING=EAGER` in the ranks. Rank 0 reads NVML for every process of its group on
# every GPU at four barriers: `init`, `received` (unpickled), `kernel` (kernels on the grid),
# `released`. A context only goes away with its process, so each variant × repeat is a group of its
# own; the groups run at once (NVML counts memory per process). The runs shown, where each rank's
# grid landed, and process × GPU MiB per variant at `kernel` of the run with the most ranks.

# %%
show.landed(run)

# %% [markdown]
# ### What it costs on GPU 0, per TP size
#
# MiB a rank ≥ 1 holds on GPU 0 at each barrier (median over repeats and ranks): the context stays
# after `released`, when the rank has dropped the grid and emptied its cache; only the process's
# end frees it. Then the total on GPU 0 per TP size (N − 1 ranks each bring a context; runs are
# never added up), and what ranks ≥ 1 hold on GPUs that are neither GPU 0 nor their own (none on a
# 2-GPU machine).

# %%
show.waste(run)

# %% [markdown]
# ### The profiler: memory over time
#
# NVML's per-process memory on each GPU, sampled by the parent (the rate asked for and the rate
# reached head the figure), with the moments each process marked. The thick red line (rank 1 on
# GPU 0): nothing until the rank unpickles, a whole context during the unpickling, then one more
# step during a kernel step. Below it, what each step added to a rank ≥ 1's memory on GPU 0 (MiB,
# median over repeats and ranks), the per-thread stack limit of that context after each kernel
# step, and what the run says about the growth: not the grid's allocation, not `.item()`'s copy,
# not a raise of the stack size, but deferred work of lazy module loading that eager loading does
# up front.

# %%
show.profiler(run)

# %% [markdown]
# ### Claims
#
# Every claim of the rebuild, checked on each run shown, the checks it rests on folded under it
# (`sglab verify grid_thw` does the same on the command line).

# %%
verdict(claims, run)
