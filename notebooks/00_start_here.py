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
# claims written as code.
#
# This notebook checks what this machine can do, lists the notebooks, and explains live and
# recorded modes.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"

# %%
import pandas as pd

from sglab.core.notebook import Workbook
from sglab.tools import fixes, report


wb = Workbook(experiment="start_here", gpus=0, mode=MODE)

# %% [markdown]
# ## This machine
#
# What `sglab env` prints: GPUs, driver, the tools the measurements use (NVML for per-process
# memory, cuda-bindings for counting the kernel nodes of a captured CUDA graph, the nsight-python
# backend for kernel timing), and the real SGLang releases installed beside the workbook.

# %%
pd.DataFrame(report.env_report(), columns=["item", "value"]).style.hide(axis="index")

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
# to show" and why. A run is a tidy CSV (`experiment, variant, <parameters>, metric, value, unit`)
# with a JSON manifest (method version, UTC time, git commit, GPU model and count, driver, CUDA,
# torch, Python, parameters) and its sidecar files. `sglab publish data/runs/<fix>/<run>.csv` copies
# a live run with its sidecars into `data/recorded/<fix>/`, where readers without GPUs see it.
#
# ## One folder per fix
#
# Each fix lives in `lib/sglab/<fix>/`: `rebuild.py` (the PR-era mechanism, one section per upstream
# file), `measure.py` (the GPU run), `show.py` (tables and figures), `claims.py` (what every run
# must show) and `sglang.py` (the fix's record, its source check and its real-release probes). The
# notebook imports those five and calls `rebuild` in its cells. `docs/structure.md` draws the house
# on one page; `docs/operating.md` says how to run it on GPU machines.
#
# ## Adding a notebook
#
# 1. `lib/sglab/<fix>/rebuild.py`: the upstream mechanism, PR-era, with a before/after switch; each
#    section names the upstream file and symbol it mirrors. No measuring.
# 2. `measure.py` (`EXPERIMENT`, `METHOD_VERSION`, `GPUS`, `DEFAULT_PARAMS`, `run(params)`),
#    `show.py`, `claims.py` (`CLAIM`, at most five `CLAIMS`, `shown`, `HEADLINE`) and `sglang.py`
#    (the record `FIX`: PRs, check, hunk specs, probe).
# 3. Add `FIX` to `sglab.tools.fixes.FIXES`; `sglab upstream --releases` cuts the released hunks.
# 4. `tests/<fix>/` (CPU, exact assertions; GPU tests marked `gpu`), `notebooks/NN_<fix>.py`, then
#    `sglab sync`; record a run on GPUs (`sglab record <fix> --recorded`) and `sglab index`.
