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
# # sglab — start here
#
# **sglab rebuilds real SGLang fixes with plain PyTorch, runs each one before and after on GPUs, and
# checks the rebuild against real SGLang.** Each notebook takes one upstream change: the mechanism
# rebuilt small enough to read beside the released hunk, the lesson run in cells, the real releases'
# code (and engines) beside it, the measurement on GPUs, the profiler's picture, and a verdict over
# claims written as code. Read this one first: the order to read the others in, which fixes can
# touch your deployment, the ideas they assume, and the words they use.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"

# %%
import pandas as pd

from sglab.core.notebook import Workbook
from sglab.tools import front_door, report


wb = Workbook(experiment="start_here", gpus=0, mode=MODE)

# %% [markdown]
# ## Reading order
#
# Graphs first, then tensor parallelism; the numbers' method last. Each fix notebook opens with its
# review card: the bug, who it affects, the releases, and what the real engine and the rebuild show.

# %%
front_door.show(front_door.reading_markdown())

# %% [markdown]
# ## Does it affect us?
#
# One row per fix, computed: the bug and who it affects are the first words of the fix's card (the
# whole card opens its notebook), the releases are read from every released wheel ("no such code":
# the feature is not there yet; "affected again": the fix was lost), and what you see is stated
# from the card, with SGLang's own log line or error where one was recorded on an affected release.

# %%
front_door.show(front_door.affects_markdown())

# %% [markdown]
# ## A primer
#
# ### CUDA graphs: capture once, replay with one launch
#
# Every PyTorch op launches one or more GPU kernels, and each launch costs the host microseconds of
# Python, dispatcher and driver work. A decode step is hundreds of small kernels, so at small
# batches the GPU finishes each kernel before the host has launched the next: the step is
# *launch-bound*, and its time is the host's. A CUDA graph records a stream of kernels once
# (capture) and replays them all with one launch. Replay repeats what capture froze: shapes, memory
# addresses and every Python branch taken while capturing; so a graph is captured per size, inputs
# are copied into static buffers, and a batch is padded up to the next captured size.
#
# ### Three ways SGLang graphs a forward
#
# Decode is easy to graph: one new token per request, so the batch size fixes every shape. Prefill
# attention needs per-batch metadata (where each request starts and ends), so it stays eager and
# the rest is captured around it, per token count:
#
# ```
# decode graph  [embed · layer 0 · … · layer N · logits]        one graph per batch size
# PCG           [piece] attn [piece] attn … [piece]  logits     one set per token count
# BCG           [segment] attn [segment] … [segment]  logits    segments share one memory pool
#               in brackets: captured; outside them: eager (BCG's logits since #24662)
# ```
#
# | CUDA graph | captures | per | on | notebooks |
# |---|---|---|---|---|
# | decode | the whole decode step | batch size | default | 04 |
# | piecewise (PCG) | prefill, in pieces between attention calls | token count | default* | 01, 06 |
# | breakable (BCG) | prefill, in segments cut at `@eager_on_graph` | token count | by flag* | 03 |
#
# \* SGLang turns PCG off for multimodal models, DP attention, CP and more, unless
# `--enforce-piecewise-cuda-graph`; BCG needs `--enable-breakable-cuda-graph` (experimental). The
# runners: `CudaGraphRunner`, `PiecewiseCudaGraphRunner`, `BreakableCudaGraphRunner`.
#
# ### Tensor parallelism: attention TP, dense and MoE TP, context parallelism
#
# `--tp-size N` splits each layer's weights over N GPUs (ranks); each computes a slice, and an
# all-reduce sums the partial results after attention and after the MLP. Parts of the model can
# use other widths. Attention TP is TP ÷ DP ÷ CP: with DP attention (`--enable-dp-attention`) groups
# of ranks run attention on requests of their own, and with context parallelism (`--attn-cp-size`)
# the ranks of a group split a prefill's tokens. MoE layers split their experts over the same
# ranks, by tensor (MoE TP) or by expert (`--ep-size`). `--moe-dense-tp-size 1` keeps each dense MLP
# whole on every rank: tokens are then reduce-scattered over the attention-TP ranks (each rank gets
# its own share, summed), which needs a token count the attention-TP size divides (06).
#
# ### Sliding-window attention, two KV pools and the location preset
#
# A sliding-window (SWA) layer attends to the last W tokens only; a hybrid model (Gemma-3, gpt-oss)
# mixes such layers with full-attention ones. SGLang keeps two KV pools: the full pool, where the
# scheduler gives every token a slot (`out_cache_loc`), and a smaller SWA pool, whose slot for a
# token comes from `full_to_swa_index_mapping`. The batch is translated once, but PR-era
# `SWAKVPool.set_kv_buffer` translates again in each SWA layer unless `swa_loc` is set. The
# location preset (#23552) sets `swa_loc` before the decode graphs are captured, so the graphs
# record no per-layer translation (04).
#
# ### The allreduce-fusion workspace
#
# `--enable-flashinfer-allreduce-fusion` turns the TP all-reduce, the residual add and the RMSNorm
# after it into one FlashInfer kernel that writes straight into its peers' GPU memory. Each rank
# therefore holds a *workspace* sized for a maximum token count: three buffers (data, barrier flags,
# a Lamport buffer), exported as CUDA IPC handles and opened by every peer. Creating one is
# collective (every rank allocates, all-gathers the handles, opens its peers' buffers, fills the
# Lamport buffer, waits at barriers), so re-creating it for a larger batch blocks every rank, and it
# cannot happen inside graph capture: SGLang creates it before capture
# (`pre_initialize_workspaces`), and 02 is about the size it asks for.
#
# ## Glossary

# %%
front_door.show(front_door.glossary_markdown())

# %% [markdown]
# ## This machine
#
# What `sglab env` prints: GPUs, driver, the tools the measurements use (NVML for per-process
# memory, cuda-bindings for counting the kernel nodes of a captured CUDA graph, the nsight-python
# backend for kernel timing), and the real SGLang releases installed beside the workbook.

# %%
(pd.DataFrame(report.env_report(),
              columns=["item",
                       "value"]).style.hide(axis="index").set_properties(**{"text-align": "left"}))

# %% [markdown]
# ## The notebooks
#
# "Live here" says whether this machine has the GPUs a notebook's measurements need. Where it does
# not, the notebook shows the committed recorded run instead (its GPU, count, driver, torch and date
# are printed with every result), and still runs every CPU part live. "Live time" is how long the
# notebook takes when it measures live, from the newest committed `sglab run --timings` record per
# GPU model (`data/recorded/workbook/`).

# %%
report.overview()

# %% [markdown]
# ## Live and recorded
#
# Every notebook starts with a `parameters` cell holding `MODE = "auto"`:
#
# | MODE | enough GPUs here | not enough GPUs |
# |---|---|---|
# | `auto` | measures live, saves the run under `data/runs/` | shows the newest committed run |
# | `live` | measures live | stops with a clear error |
# | `recorded` | shows the committed run | shows the committed run |
#
# Nothing is ever invented: without a GPU and without a recorded run, a GPU section says "no GPU run
# to show" and why. A run is a tidy CSV with a JSON manifest (method version, time, git commit, GPU,
# driver, CUDA, torch, parameters). A live run is saved under `data/runs/<experiment>/` (the fix's
# name, or `engine_<fix>` for its real-engine runs); `sglab publish
# data/runs/<experiment>/<run>.csv` copies it with its sidecars into `data/recorded/<experiment>/`,
# refusing one whose claims fail. Verified there (`sglab verify`) and committed, it is what readers
# without GPUs see.
#
# ## One folder per fix
#
# Each fix lives in `lib/sglab/<fix>/`: `rebuild.py` (the PR-era mechanism), `measure.py` (the GPU
# run), `show.py` (tables and figures), `claims.py` (what every run must show, and the card) and
# `sglang.py` (the fix's record and its real-release probes). `docs/structure.md` draws the house on
# one page; `docs/operating.md` says how to run it on GPU machines.
#
# ## Adding a notebook
#
# The six steps, from the rebuild to `sglab index`, are in `docs/structure.md` ("Adding a
# notebook"); `tools/fixes.py` is the list of fixes, and this notebook's tables follow it, with
# each fix's place in the reading order and its symptom line from `tools/front_door.py`.
