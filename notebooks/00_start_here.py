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
# **sglab rebuilds real SGLang fixes with plain PyTorch, runs each one before and after on GPUs, and shows
# the difference.** Each notebook takes one upstream change, rebuilds the mechanism small enough to read side by
# side with the diff (`lib/sglab/fixes/`), measures it (`lib/sglab/experiments/`), and explains what the numbers
# say.
#
# This notebook checks what this machine can do, lists the notebooks, and explains live and recorded modes.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"

# %%
import pandas as pd

from sglab.core import runs
from sglab.core import notebook as nb
from sglab.tools import fixes
from sglab.tools.report import env_report

wb = nb.Workbook(experiment="start_here", gpus=0, mode=MODE)

# %% [markdown]
# ## This machine
#
# The report below is what `sglab env` prints: GPUs, driver, the tools the measurements use (NVML for
# per-process memory, cuda-bindings for counting the kernel nodes of a captured CUDA graph, the nsight-python
# backend for kernel timing), and whether the real SGLang package is installed for the upstream cross-checks.

# %%
pd.DataFrame(env_report(), columns=["item", "value"]).style.hide(axis="index")

# %% [markdown]
# ## The notebooks
#
# "Live here" says whether this machine has the GPUs a notebook's measurements need. Where it does not, the
# notebook shows the committed recorded run instead (its GPU, count, driver, torch and date are printed with
# every result), and still runs every CPU part live. "Live time" is how long the notebook takes when it measures
# live, from the newest committed `sglab run --timings` record per GPU model (`data/recorded/workbook/`).

# %%
index = fixes.overview()
index

# %% [markdown]
# ## Live and recorded
#
# Every notebook starts with a `parameters` cell holding `MODE = "auto"`:
#
# | MODE | enough GPUs here | not enough GPUs |
# |---|---|---|
# | `auto` | measures live, saves the run under `data/runs/` | shows the newest committed run from `data/recorded/` |
# | `live` | measures live | stops with a clear error |
# | `recorded` | shows the committed run | shows the committed run |
#
# Cells that need a GPU are tagged `needs-gpu`; a headless run without CUDA skips them
# (`sglab run`, `make workbook`). Nothing is ever invented: without a GPU and without a recorded run, a notebook
# says that it has nothing to show.
#
# A run is a tidy CSV (`experiment, variant, <parameters>, metric, value, unit`) with a JSON manifest (method
# version, UTC time, git commit, GPU model and count, driver, CUDA, torch, Python, parameters). To make a live
# run the reference that readers without GPUs see, copy its two files from `data/runs/<experiment>/` to
# `data/recorded/<experiment>/` and commit them (`sglab record EXPERIMENT --recorded` writes there directly).

# %%
pd.DataFrame([{"folder": f"data/{k}", "what": w, "files": sum(1 for _ in runs.data_dir(k).rglob("*.csv"))}
              for k, w in [("recorded", "committed reference runs"), ("runs", "this machine's live runs (git-ignored)"),
                           ("traces", "generated inputs")]])

# %% [markdown]
# ## Adding a notebook
#
# 1. `lib/sglab/fixes/<name>.py` — the upstream mechanism, PR-era, with a before/after switch; its docstring names
#    the upstream file and symbol it mirrors. No measuring here.
# 2. `lib/sglab/experiments/<name>.py` — `EXPERIMENT`, `METHOD_VERSION`, `GPUS`, `DEFAULT_PARAMS`, and
#    `run(params) -> DataFrame` (tidy rows via `sglab.core.runs.tidy`); register an upstream check with
#    `sglab.sglang.upstream.register`.
# 3. `tests/test_<name>.py` (CPU, exact assertions) and `tests/test_<name>_gpu.py` (`@pytest.mark.gpu`).
# 4. `notebooks/NN_<name>.py` (jupytext percent, the reviewed source), then `sglab sync` writes the `.ipynb`
#    without outputs. The anatomy: claim and PR link → `parameters` cell → `Workbook(...)` banner → the problem →
#    rebuild before/after → measure (`needs-gpu`) or load the recorded run → analyse and plot (captions carry GPU
#    and date) → takeaways.
# 5. Add the notebook to `sglab.tools.catalog.NOTEBOOKS` and to the README index; record a run on GPUs with
#    `sglab record <name>` and commit it under `data/recorded/`.
