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
# Upstream: [sgl-project/sglang#23552](https://github.com/sgl-project/sglang/pull/23552) (pre-set SWA cache
# location in `CudaGraphRunner`) and [#24743](https://github.com/sgl-project/sglang/pull/24743) (zero
# `out_cache_loc_swa` on pad, int32). Rebuilt in `sglab.fixes.swa_loc`, measured by `sglab.experiments.swa_loc`.

# %% tags=["parameters"]
MODE = "auto"          # "auto" | "live" | "recorded"
PARAMS = {}            # overrides of experiment.DEFAULT_PARAMS; experiment.FULL_SWEEP is the method-1 sweep

# %%
import inspect

import pandas as pd
from IPython.display import display

from sglab.core import notebook as nb
from sglab.sglang import upstream
from sglab.experiments import swa_loc as experiment
from sglab.experiments.swa_loc import analysis, figures, rebuild
from sglab.fixes import swa_loc as fx

pd.set_option("display.width", 160)
wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% tags=["needs-gpu"]
if wb.live:
    params = {**experiment.DEFAULT_PARAMS, **PARAMS}
    wb.measure(lambda: experiment.run(params, progress=False), params=params,
               method_version=experiment.METHOD_VERSION, gpu_count=experiment.GPUS)

# %%
shown = wb.shown()          # this session's live run, else the newest recorded run of each GPU model
run = shown[0] if shown else None
nb.slide(experiment.EXPERIMENT, shown, figures.mechanism(run))

# %% [markdown]
# The picture is drawn from the rebuild: the ops the captured step runs in one SWA layer's KV write, one box
# per kernel node (and, for runs that carry an eager kernel table, the CUDA kernel under each box).
#
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
rebuild.variants_table()

# %% [markdown]
# Which released SGLang has which state (read in the released wheels, `data/upstream/releases.csv`), then each
# PR's released hunk beside the rebuilt method: #23552's preset in `capture_one_batch_size`, #24743's zeroing in
# `populate_from_forward_batch`.

# %%
from sglab.sglang import wheels as upstream_figures, hunks

upstream_figures.timeline_row_figure(experiment.EXPERIMENT)

# %%
hunks.beside(experiment.EXPERIMENT, fx.DecodeGraphRunner.capture_one_batch_size,
             symbol="CudaGraphRunner.capture_one_batch_size")

# %%
hunks.beside(experiment.EXPERIMENT, fx.DecodeInputBuffers.populate_from_forward_batch, pr=24743,
             symbol="DecodeInputBuffers.populate_from_forward_batch")

# %% [markdown]
# ## Rebuild: what each runner records (CPU, live)
#
# Without a GPU the runner captures by running the step with the Python state it would be captured with, and
# replays by re-running it with that state — the same static buffers, the same `swa_loc`. The
# `translate_loc_from_full_to_swa` counter during capture is therefore exactly what a real graph records.

# %%
rebuild.capture_calls()

# %% [markdown]
# One translation per SWA layer without the preset, none with it; each is two kernels in the graph, the gather and
# the int32 cast, as in 0.5.10.post1–0.5.12.post1 (counted on the GPU below; from 0.5.13 SGLang's is one gather). Eagerly, the pool writes the same K/V either way:

# %%
rebuild.eager_paths()

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
rebuild.pad_scenarios(num_layers=12)

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
rebuild.dtypes_table()

# %% [markdown]
# In this rebuild the values written are identical either way (the CPU tests check it); the K/V write is
# torch's `index_put_`, which needs int64 indices, so here an int32 location costs one conversion kernel per
# SWA layer that SGLang's `store_cache` kernel (int32 or int64 natively) does not have. The kernel counts
# below show it as the gap between `pr23552` and `pr24743`.
#
# ## The real SGLang, before and after
#
# The released pool and allocator (`SWAKVPool`, `SWATokenToKVPoolAllocator`), one subprocess per release
# (`sglab.sglang.probes.swa_loc`), write one 3-token decode step through 4 layers (SWA layers 0 and 2) on the CPU:
# how many times the layers translate the location, with and without it set or passed in beforehand, and whether
# the SWA rows land at the allocator's paired slots; `DecodeInputBuffers` (dtype and padded tail after a padded
# populate) where the release has the PR-era runner. One translation is also run under a dispatch recorder: each
# aten op it dispatches that is not a view is one kernel on a GPU (one kernel node in a captured graph). The
# rebuild answers the same questions in the same shapes; where no rebuilt variant exists (0.5.13 on), the number
# to match is the claims module's.
#
# Recorded mode shows the answers recorded on the CPU box (`data/recorded/real_cpu/`, written by `sglab real record`;
# the tests check that they still equal a live run); `SGLAB_REAL=live` runs the installed releases here instead,
# about 8 s a release.

# %%
from sglab.experiments.swa_loc import claims, real
from sglab.sglang import compare_old as report

real_results = real.probe()
print(report.status_lines(real_results))
real_table = real.comparison(real_results)
report.check_table(real_table, what="(release, behaviour) rows")
real_table

# %% [markdown]
# **Kernels per SWA layer, from the released code.** The rebuild's "2 extra kernel nodes per SWA layer" (the
# claim `swa_loc.extra_kernels_per_swa_layer`) is the cost of the PR-era translation. Each release's own
# `return` line and the kernels one translation dispatches:

# %%
print(real.kernels_statement(real_results))
print(f"claims: {claims.EXTRA_PER_SWA_LAYER} extra kernel nodes per SWA layer without the preset in "
      f"{', '.join(claims.PR_ERA_RELEASES)}; {claims.KERNELS_PER_TRANSLATION_TODAY} gather per translation "
      f"from 0.5.13, which translates once per forward and passes the location to every write")

# %% [markdown]
# So the 2 holds for the releases #23552 and #24743 shipped in (0.5.11, 0.5.12.post1) and the one before them:
# the translation was a gather plus an int32 cast of the int64 mapping. Today's SGLang (0.5.13 on) translates
# with a single gather, once per forward, and has no `set_swa_loc` left to forget: the state #23552 fixed cannot
# arise there. On a GPU, the released pool captured in a CUDA graph (kernel nodes per SWA layer with and without
# the preset on 0.5.12.post1, translated once or per layer on 0.5.23), where such a run is recorded:

# %%
from sglab.sglang import compare_old as compare  # noqa: E402

compare.show_recorded(real.RECORDED);

# %% [markdown]
# What the released pool says, read from the recorded run (and checked by `tests/test_real_gpu_summary.py`):
# without the preset, **0.5.12.post1's pool adds 2 kernel nodes per SWA layer** (the gather and the int32 cast of
# `full_to_swa_index_mapping[loc].to(torch.int32)`), exactly the rebuild's count and this notebook's claim; on
# 0.5.23 the same per-layer translation would cost 1 (a gather), which is moot there because the location is
# translated once per forward. #24743 shows in the buffers: 0.5.11 keeps an int64 `out_cache_loc_swa` whose
# padded tail holds stale slots after a padded populate, 0.5.12.post1 an int32 one with the tail zeroed.

# %% [markdown]
# ## Kernels per replay (GPU)
#
# For each layout and batch size the run captures the three graphs and counts their kernel nodes statically
# (cuda-bindings), then counts the kernels torch.profiler sees in one replay. One row per layout: the count is
# the same for every captured batch size.

# %%
if run is None:
    print("No GPU run to show: the kernel counts, replay times and on-GPU padding check need one "
          "(`sglab record swa_loc` on one H100/H200).")
else:
    print(f"{run.label} (method {run.manifest.get('method_version')}):")
    display(analysis.kernel_table(run.df))
    for r in shown:
        a = analysis.profiler_agreement(r.df)
        print(f"{r.label}: profiler = static in {a['equal']}/{a['cells']} (layout, bs, variant) cells")

# %%
if run is not None:
    figures.kernels_per_replay(run, shown)

# %% [markdown]
# ## Replay time (GPU)
#
# CUDA-event time of one `graph.replay()` through `sglab.core.timing.interleaved` (the variants alternate in
# rounds; median and p10–p90 of the pooled samples). `#23552` is below `#24743` here only because this rebuild's
# K/V write (`index_put_`) converts an int32 location back to int64 — one kernel per SWA layer that SGLang's
# `store_cache` does not have (see the int64/int32 section).

# %%
if run is not None:
    print(f"{run.label}:")
    display(analysis.time_table(run.df).round(2))
    if len(shown) > 1:
        print("before / #24743 on each GPU (newest run per GPU), batch size in the columns:")
        display(pd.concat({analysis.short_gpu(r): analysis.time_table(r.df)["before / #24743"]
                           .unstack("batch_size") for r in shown}, axis=1).round(3))

# %%
if run is not None:
    figures.replay_times(shown)

# %% [markdown]
# ## The padding scenario on real graphs (GPU)
#
# The same two decode steps as above, captured and replayed as CUDA graphs; slots are (layer, slot) pairs.

# %%
if run is not None:
    display(pd.concat({analysis.short_gpu(r): analysis.pad_table(r.df) for r in shown}, axis=1))

# %% [markdown]
# ## See it in the profiler
#
# One replay of each graph at the headline layout under torch.profiler. Look at the stream lane: without the
# preset the translation's gather and cast (highlighted) sit in every SWA layer, between the layer's
# elementwise kernels and its stores; with it they are gone, and the replay is shorter by about their sum.

# %%
if run is not None:
    fig, why = figures.replay_timeline(run)
    print(why or f"Perfetto file: {run.sidecar('trace')}")
    if why is None:
        counts = analysis.trace_counts(run.sidecar("events"))
        print("; ".join(f"{v}: {c['kernels']} kernels in the traced replay" for v, c in counts.items()))

# %% [markdown]
# Per kernel, in an eager decode step (nsight-python's CUPTI backend attributes kernels by their launch call,
# and a graph replay makes none of its own): which op launched which kernel, calls per step and median time,
# from nsight-python and torch.profiler side by side. The SWA layers' KV write rows are the mechanism.

# %%
eager = run.sidecar("eager_kernels") if run is not None else None
if eager is None:
    print(figures.NO_TRACE.format(mv=run.manifest.get("method_version", "?") if run is not None else "-"))
else:
    info = run.manifest.get("eager_kernels", {})
    print(f"backends: {', '.join(info.get('backends', []))}; nsight-python: {info.get('nsight')} "
          f"({info.get('nsight_reason')})")
    display(analysis.eager_table(eager).round(2))

# %% [markdown]
# ## Does the installed SGLang have it?

# %%
v = upstream.check(__import__("sglab.swa_loc.sglang", fromlist=["FIX"]).FIX)
print(f"{v.status}: {v.detail}" if v.detail else v.status)

# %% [markdown]
# ## Your own setup
#
# Layers, sliding-window layers per full layer (every N+1-th layer full, as Gemma 3's pattern) and batch size →
# the extra kernels and µs a decode step pays without the preset, from the per-SWA-layer costs of the recorded
# runs, and the bytes #23552's int64 buffer wastes for the captured slots.
#
# A real model's Hugging Face `config.json` on the command line: `sglab swa-cost CONFIG.json --batch-size B --max-bs N`

# %%
from sglab.investigate import widgets

widgets.swa_layout()

# %% [markdown]
# ## Verdict
#
# Every claim of the experiment, checked on each run shown (`sglab verify swa_loc` does the same on the command
# line).

# %%
nb.verdict(experiment.EXPERIMENT, shown)

# %% [markdown]
# ## Takeaways
#
# - A Python branch inside a captured region is decided once, at capture. `set_kv_buffer`'s
#   `if self.swa_loc is not None` looked like a per-step choice but was frozen into every decode graph as the
#   slow branch: two kernels per SWA layer per step in the PR-era pool (0.5.10.post1–0.5.12.post1), for a
#   translation already done once per batch.
# - The fix is to make the capture-time state the serving-time state: a static `out_cache_loc_swa` buffer,
#   filled at populate time, set on the pool before capture.
# - Static buffers inherit every padding rule of the inputs they shadow. `out_cache_loc` was zeroed on pad;
#   its SWA twin was not, and padded tokens overwrote exactly the SWA slots the previous, larger batch left in
#   the tail — live slots of running requests, silently (the follow-up saw it as an accuracy drop).
#
# Review points worth discussing:
#
# - Would a graph-capture assertion ("no `translate_loc_from_full_to_swa` call while capturing") have caught
#   the problem earlier? The counter here is that assertion.
# - `swa_loc` is a side channel on a shared pool, left set after each eager forward; later PRs removed it in
#   favour of a location passed with each write (#25824, #27091, #27617).
# - The dtype of a shadow buffer should match its source (int32 here): a mismatch costs a converting copy and
#   makes graph and eager paths hand different dtypes to the same kernel.
# - The toy layer does only the KV write, so the time ratio is an upper bound; the transferable numbers are the
#   kernel counts and the saved µs per SWA layer.
