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
# Upstream: [sgl-project/sglang#23552](https://github.com/sgl-project/sglang/pull/23552) (preset
# the SWA cache location in `CudaGraphRunner`) and
# [#24743](https://github.com/sgl-project/sglang/pull/24743) (zero `out_cache_loc_swa` on pad,
# int32).

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
# overrides of measure.DEFAULT_PARAMS (the method-1 sweep: layer_counts=[6, 12, 24, 48],
# batch_sizes=[1, 8, 32, 128], repeat=150)
PARAMS = {}
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import inspect

import pandas as pd
import torch

from sglab.core import engine_records, engine_view, runs
from sglab.core.notebook import Workbook, card, reveal, show_figure, verdict
from sglab.sglang import codepath
from sglab.swa_loc import claims, measure, rebuild, sglang, show


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE)
run = wb.run(measure, PARAMS)  # the rebuild on a GPU: measured now, or the committed runs
engine = sglang.FIX.recorded_engine()  # SGLang's own engine, recorded on GPU boxes
card(sglang.FIX, claims, run, engine)

# %% [markdown]
# ## The mechanism
#
# One SWA layer's KV write inside the captured decode graph, drawn from the rebuild: one box per
# kernel node, and under it the CUDA kernel a recorded run's eager trace names.

# %%
show_figure(show.mechanism(run))

# %% [markdown]
# ## The lesson
#
# A hybrid model (Gemma-3: five sliding-window layers per full layer; gpt-oss: alternating) keeps
# two KV pools. The scheduler gives each token a slot in the **full** pool (`out_cache_loc`); its
# slot in the smaller **SWA** pool comes from `full_to_swa_index_mapping`. The batch is translated
# once (`ForwardBatch.out_cache_loc_swa`), yet PR-era `SWAKVPool.set_kv_buffer` decides per call, in
# Python, whether to translate again:

# %%
print(inspect.getsource(rebuild.SWAKVPool.set_kv_buffer))
print(inspect.getsource(rebuild.SWAKVPool.translate_loc_from_full_to_swa))

# %% [markdown]
# A CUDA graph freezes the branch that was live when it was captured. Before #23552 nothing had set
# `swa_loc` when `CudaGraphRunner` captured the decode graphs, so every SWA layer recorded the
# translation and replayed it at every step. #23552 sets `swa_loc` to a static buffer before
# capture; #24743 makes the buffer int32 and zeroes it on a padded batch. The released hunks beside
# the rebuild, whose three states come from one switch, `rebuild.runner_config`:

# %%
sglang.released(rebuild.DecodeGraphRunner.capture_one_batch_size,
                symbol="CudaGraphRunner.capture_one_batch_size")

# %%
sglang.released(rebuild.DecodeInputBuffers.populate_from_forward_batch, pr=24743,
                symbol="DecodeInputBuffers.populate_from_forward_batch")

# %%
show.variants_table()

# %% [markdown]
# ### Predict, then run: the translations a graph records
#
# Without a GPU a runner "captures" by running the step with the Python state it would be captured
# with, so its counter is exactly what a real graph holds. **Predict** how many translations the
# decode graph of a 48-layer model with five sliding-window layers per full layer records, without
# the preset and with it. Then run the loop and open the answer.

# %%
SMALL = dict(size=64, size_swa=32, head_num=1, head_dim=8)
rows = []
for swa_per_full in (5, 1):
    for layers in (6, 12, 24, 48):
        swa_layers, _ = rebuild.hybrid_layer_ids(layers, swa_per_full)
        row = {"layers": layers, "SWA:full": f"{swa_per_full}:1", "SWA layers": len(swa_layers)}
        for variant in rebuild.VARIANTS:
            s = rebuild.build_setup(num_layers=layers, swa_per_full=swa_per_full, **SMALL)
            runner = rebuild.DecodeGraphRunner.for_variant(s.model, [8], variant)
            runner.capture()
            row[f"translations captured ({variant})"] = runner.capture_translate_calls[8]
        rows.append(row)
reveal(pd.DataFrame(rows))

# %% [markdown]
# Each translation is two kernels in a graph, the gather and the int32 cast (one gather from 0.5.13,
# where SGLang translates once per forward). Eagerly, the pool writes the same K/V either way:

# %%
a, b = (rebuild.build_setup(num_layers=12, swa_per_full=5, **{**SMALL, "head_num": 2})
        for _ in range(2))
batch_a, batch_b = (rebuild.decode_batch(s, [3, 9, 27], [4, 5, 6]) for s in (a, b))
a.pool.translate_calls = b.pool.translate_calls = 0
rebuild.forward_eager(a.model, batch_a, use_precomputed_swa_loc=False)
rebuild.forward_eager(b.model, batch_b, use_precomputed_swa_loc=True)
same = rebuild.pool_diff(a.pool, b.pool, skip_padding_slot=False) == {}
print(f"one decode step through {a.model.num_layers} layers ({len(a.swa_layer_ids)} SWA): "
      f"{a.pool.translate_calls} translations on the per-layer path, {b.pool.translate_calls} on "
      f"the preset path; the two pools after it: {'identical' if same else 'different'}")

# %% [markdown]
# ### Predict, then run: the padding bug #24743 fixed
#
# A decode batch of `raw_bs` tokens replays the graph of the next captured size `bs`;
# `populate_from_forward_batch` zeroes `out_cache_loc` for the padded tokens, so they write into
# slot 0. #23552 copied `out_cache_loc_swa[:raw_bs]` and left `[raw_bs:bs]` as the last replay left
# it. Eight requests decode in the bs 8 graph; requests 2 and 4 finish, the batch is filtered in
# order, and the next step decodes six tokens padded to 8. **Predict**, for each variant, where the
# two padded tokens write their SWA rows and whose slots those are. The loop runs both steps through
# each runner and compares its pool with the same steps run eagerly (`measure.pad_bug_scenario`).

# %%
rows = []
for variant in rebuild.VARIANTS:
    r = measure.pad_bug_scenario(variant, num_layers=12)
    hit = [layer for layer in r["swa_layer_ids"] if layer in r["corrupted"]]
    slots = sorted({tuple(x) for x in r["corrupted"].values()}) or "none"
    rows.append({
        "variant": variant, "stale tail slots (SWA)": r["stale_tail_swa_slots"],
        "their owners, still running": r["owners_still_running"],
        "SWA layers corrupted": f"{len(hit)} of {len(r['swa_layer_ids'])}",
        "slots per SWA layer": slots, "exactly as predicted": r["matches_prediction"]
    })
reveal(pd.DataFrame(rows).set_index("variant"))

# %% [markdown]
# Before #23552 the padded tokens translated the zeroed `out_cache_loc` (full slot 0 → SWA slot 0);
# with #23552 they wrote into the slots of two running requests in every SWA layer; #24743's
# `out_cache_loc_swa.zero_()` sends them to slot 0 again. It also made the buffer int32, the dtype
# `translate_loc_from_full_to_swa` returns, so populate no longer converts and the graph hands
# `set_kv_buffer` what the eager path does:

# %%
rows = []
for variant in rebuild.VARIANTS:
    s = rebuild.build_setup(num_layers=6, swa_per_full=5, **SMALL)
    runner = rebuild.DecodeGraphRunner.for_variant(s.model, [4], variant)
    runner.capture()
    buf = runner.buffers.out_cache_loc_swa
    eager = rebuild.decode_batch(s, [1], [2]).out_cache_loc_swa
    rows.append({
        "variant": variant,
        "eager batch": str(eager.dtype),
        "graph buffer": str(getattr(buf, "dtype", "—")),  # the "before" has no buffer
        "buffer bytes / token": buf.element_size() if torch.is_tensor(buf) else 0
    })
pd.DataFrame(rows).set_index("variant")

# %% [markdown]
# ## Real SGLang
#
# A decode step's SWA write in the release with both PRs, each box linked to its line at the
# release's tag:

# %%
codepath.show(sglang.CODE_PATH_RELEASE, sglang.CODE_PATH, "A decode step's SWA write")

# %% [markdown]
# The releases' own pool and allocator (`SWAKVPool`, `SWATokenToKVPoolAllocator`), one worker
# process per release, write one 3-token decode step through 4 layers (SWA layers 0 and 2) on the
# CPU: translations with and without the location set beforehand, where the SWA rows land,
# `DecodeInputBuffers` where the release has the PR-era runner, and the aten ops of one translation
# (each one kernel on a GPU). Recorded mode shows the answers recorded on the CPU box
# (`SGLAB_REAL=live` runs the installed releases here, about 8 s a release).

# %%
sglang.compare()

# %% [markdown]
# ### The engine, before and after
#
# SGLang's whole engine: `bench_one_batch` on a GPT-OSS-style model (8 layers, 4 sliding-window,
# dummy weights; `sglab engine --plan 04` on a GPU box), the kernels of one decode-graph replay read
# from its own trace. The "before" is 0.5.11 with only #23552's preset removed, since the release
# before the PR, 0.5.10.post1, pins torch 2.9.1, which the engine runs' environment (torch 2.11.0)
# does not have. The decode times are for orientation: a few kernels per replay cost less than
# engine starts differ by, and no claim rests on them.

# %%
engine_view.section(show.VIEW, engine, claims.ENGINE)

# %% [markdown]
# The rebuild beside the engine: both count the same extra kernels per SWA layer, the figure that
# transfers to any GPU and host. What they cost is the GPU's per-kernel cost inside a replay, which
# the rebuild's µs per SWA layer measures: count first, time second.

# %%
engine_view.beside(show.beside_rows(run, engine))

# %% [markdown]
# ## Your own setup
#
# Layers, sliding-window layers per full layer and batch size → the extra kernels and µs a decode
# step pays without the preset, from the per-SWA-layer costs of the recorded runs. A real model's
# Hugging Face config on the command line: `sglab swa-cost CONFIG.json --batch-size B --max-bs N`
# (or the model folder).

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Takeaways
#
# - A Python branch inside a captured region is decided once, at capture. `set_kv_buffer`'s test of
#   `swa_loc` looked like a per-step choice but was frozen into every decode graph as the slow
#   branch: the PR-era pool's gather and cast in every SWA layer of every step, for a translation
#   already done once per batch.
# - The fix makes the capture-time state the serving-time state: a static `out_cache_loc_swa`
#   buffer, filled at populate time, set on the pool before capture.
# - Static buffers inherit every padding rule of the inputs they shadow. `out_cache_loc` was zeroed
#   on pad; its SWA twin was not, and padded tokens overwrote exactly the SWA slots the previous,
#   larger batch left in the tail: live slots of running requests, silently (the follow-up saw it
#   as an accuracy drop).
#
# Review points worth discussing:
#
# - Would a capture-time assertion ("no `translate_loc_from_full_to_swa` call while capturing") have
#   caught the problem earlier? The rebuild's counter is that assertion.
# - `swa_loc` is a side channel on a shared pool, left set after each eager forward; later PRs
#   removed it in favour of a location passed with each write (#25824, #27091, #27617).
# - The dtype of a shadow buffer should match its source (int32 here): a mismatch costs a converting
#   copy and makes graph and eager paths hand different dtypes to the same kernel.

# %% [markdown]
# ## Appendix
#
# The rebuild on a GPU (live here, or the recorded runs): kernels and time per replay, the padding
# scenario on real graphs, the profiler, and every claim checked on each run shown (`sglab verify
# swa_loc engine_swa_loc` does the same on the command line). Every recorded engine run, its starts
# and its reruns: [07 · how we measure](07_how_we_measure.ipynb).
#
# ### Kernels per replay
#
# For each layout and batch size the run captures the three graphs, counts their kernel nodes
# statically (cuda-bindings) and the kernels torch.profiler sees in one replay. One row per layout:
# the count is the same for every captured batch size.

# %%
show.kernels(run)

# %% [markdown]
# ### Replay time
#
# CUDA-event time of one `graph.replay()` (no populate) through `sglab.core.timing.interleaved`: the
# variants alternate in rounds, median and p10–p90 of the pooled samples. `#23552` is below `#24743`
# only because this rebuild's K/V write converts an int32 location back to int64 (SGLang's
# `store_cache` kernel takes either). The toy layer does only its KV write, so the ratio is an upper
# bound; what transfers is the kernels and µs per SWA layer.

# %%
show.times(run)

# %% [markdown]
# ### The padding scenario on real graphs
#
# The two decode steps of the lesson, captured and replayed as CUDA graphs; slots are (layer, slot)
# pairs.

# %%
show.padding(run)

# %% [markdown]
# ### The profiler
#
# One replay of each graph at the headline layout under torch.profiler: without the preset the
# translation's gather and cast (highlighted) sit in every SWA layer; with it they are gone. Below
# it, one eager decode step per op (nsight-python's CUPTI backend and torch.profiler side by side):
# the SWA layers' KV write rows are the mechanism.

# %%
show.profiler(run)

# %% [markdown]
# ### The claims
#
# The rebuild's, on each run shown, the checks each rests on folded under it; then the engine's, on
# each GPU model's recorded runs.

# %%
verdict(claims, run)
verdict(claims.ENGINE, runs.RunSet(engine_records.per_gpu(engine)))
