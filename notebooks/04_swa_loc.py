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
# Upstream: [sgl-project/sglang#23552](https://github.com/sgl-project/sglang/pull/23552) (pre-set
# the SWA cache location in `CudaGraphRunner`) and
# [#24743](https://github.com/sgl-project/sglang/pull/24743) (zero `out_cache_loc_swa` on pad,
# int32). Rebuilt in `sglab.swa_loc.rebuild`, measured by `sglab.swa_loc.measure`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
# overrides of measure.DEFAULT_PARAMS; measure.FULL_SWEEP is the method-1 sweep
PARAMS = {}
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import inspect

import pandas as pd
import torch

from sglab.core.notebook import Workbook, slide, verdict
from sglab.swa_loc import claims, measure, rebuild, sglang, show


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE)
# live: measured now on this GPU; recorded: the committed run of each GPU
run = wb.run(measure, PARAMS)
slide(claims, run, show.mechanism(run))

# %% [markdown]
# The picture is drawn from the rebuild: the ops the captured step runs in one SWA layer's KV write,
# one box per kernel node (and, for runs that carry an eager kernel table, the CUDA kernel under
# each box).
#
# ## The problem
#
# A hybrid model (Gemma-3: five sliding-window layers per global layer; gpt-oss: alternating) keeps
# two KV pools. The scheduler gives a token a slot in the **full** pool (`out_cache_loc`); its slot
# in the smaller **SWA** pool is found through `full_to_swa_index_mapping` (int64, slot 0 = padding
# slot, a trailing `-1` so that `-1` maps to `-1`). PR-era `SWAKVPool.set_kv_buffer` chooses per
# call, in Python:

# %%
print(inspect.getsource(rebuild.SWAKVPool.set_kv_buffer))
print(inspect.getsource(rebuild.SWAKVPool.translate_loc_from_full_to_swa))

# %% [markdown]
# A CUDA graph freezes whichever branch was live when it was captured. Before #23552 nothing had set
# `swa_loc` when `CudaGraphRunner` captured the decode graphs, so the translation — `index` +
# `.to(int32)` — was recorded into every SWA layer and re-ran at every replay, although the batch
# had already been translated once outside the graph (`ForwardBatch.out_cache_loc_swa`). The three
# states rebuilt here, from the one switch `rebuild.runner_config`:

# %%
pd.DataFrame([{"variant": v, **vars(rebuild.runner_config(v))} for v in rebuild.VARIANTS
              ]).set_index("variant")

# %% [markdown]
# Which released SGLang has which state (read in the released wheels), then #23552's released hunk
# beside the rebuilt `capture_one_batch_size`, and #24743's zeroing in
# `populate_from_forward_batch`:

# %%
sglang.released(rebuild.DecodeGraphRunner.capture_one_batch_size,
                symbol="CudaGraphRunner.capture_one_batch_size")

# %%
sglang.released(rebuild.DecodeInputBuffers.populate_from_forward_batch, pr=24743,
                symbol="DecodeInputBuffers.populate_from_forward_batch")

# %% [markdown]
# ## The lesson, on the CPU: what each runner records
#
# Build a pool, capture each variant, count the translations. Without a GPU a runner "captures" by
# running the step with the Python state it would be captured with, so the counter is exactly what a
# real graph holds.

# %%
SMALL = dict(size=64, size_swa=32, head_num=1, head_dim=8)
rows = []
for swa_per_full in (5, 1):
    for layers in (6, 12, 24, 48):
        row = {
            "layers": layers, "SWA:full": f"{swa_per_full}:1",
            "SWA layers": len(rebuild.hybrid_layer_ids(layers, swa_per_full)[0])
        }
        for variant in rebuild.VARIANTS:
            s = rebuild.build_setup(num_layers=layers, swa_per_full=swa_per_full, **SMALL)
            runner = rebuild.DecodeGraphRunner.for_variant(s.model, [8], variant)
            runner.capture()
            row[f"translations captured ({variant})"] = runner.capture_translate_calls[8]
        rows.append(row)
pd.DataFrame(rows)

# %% [markdown]
# One translation per SWA layer without the preset, none with it; each is two kernels in the graph,
# the gather and the int32 cast, as in 0.5.10.post1–0.5.12.post1 (counted on the GPU below; from
# 0.5.13 SGLang's is one gather). Eagerly, the pool writes the same K/V either way:

# %%
a, b = (rebuild.build_setup(num_layers=12, swa_per_full=5, **{**SMALL, "head_num": 2})
        for _ in range(2))
batch_a, batch_b = (rebuild.decode_batch(s, [3, 9, 27], [4, 5, 6]) for s in (a, b))
a.pool.translate_calls = b.pool.translate_calls = 0
rebuild.forward_eager(a.model, batch_a, use_precomputed_swa_loc=False)
rebuild.forward_eager(b.model, batch_b, use_precomputed_swa_loc=True)
{
    "translations, per-layer path": a.pool.translate_calls,
    "translations, preset path": b.pool.translate_calls,
    "pools identical": rebuild.pool_diff(a.pool, b.pool, skip_padding_slot=False) == {}
}

# %% [markdown]
# ## The #24743 padding bug (CPU)
#
# A decode batch of `raw_bs` tokens replays the graph of the next captured size `bs`;
# `populate_from_forward_batch` zeroes `out_cache_loc` for the padded tokens, so they write into
# slot 0. PR #23552 copied `out_cache_loc_swa[:raw_bs]` but left `[raw_bs:bs]` as the previous
# replay left it.
#
# Scenario (`measure.pad_bug_scenario`): eight requests with a few context tokens each; step 1
# decodes all eight in the bs=8 graph; requests 2 and 4 finish, the batch is filtered in order, and
# step 2 decodes six tokens padded to 8. The tail `[6:8]` still holds the SWA slots where requests 6
# and 7 — still running — wrote their step-1 token. Each pool is compared with the same two steps
# run eagerly.

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
pd.DataFrame(rows).set_index("variant")

# %% [markdown]
# Before #23552 the padded tokens translated the zeroed `out_cache_loc` (full slot 0 → SWA slot 0);
# with #23552 they wrote into two live slots of requests 6 and 7 in every SWA layer; #24743's
# `out_cache_loc_swa.zero_()` sends them to slot 0 again.
#
# ## int64 or int32 (CPU)
#
# `translate_loc_from_full_to_swa` returns int32, and so does `ForwardBatch.out_cache_loc_swa`. The
# static buffer of #23552 was int64, so `populate_from_forward_batch` did a converting copy and the
# graph handed `set_kv_buffer` another dtype than the eager path:

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
# The values written are identical either way (the tests check it). The rebuild's K/V write is
# torch's `index_put_`, which needs int64 indices, so an int32 location costs it one conversion
# kernel per SWA layer that SGLang's `store_cache` kernel (int32 or int64 natively) does not have:
# the gap between `pr23552` and `pr24743` in the kernel counts below.
#
# ## The real SGLang, before and after
#
# The released pool and allocator (`SWAKVPool`, `SWATokenToKVPoolAllocator`), one worker process per
# release, write one 3-token decode step through 4 layers (SWA layers 0 and 2) on the CPU: how many
# times the layers translate, with and without the location set or passed in beforehand, and whether
# the SWA rows land at the allocator's paired slots; `DecodeInputBuffers` where the release has the
# PR-era runner; the aten ops of one translation (each one kernel on a GPU). Recorded mode shows the
# answers recorded on the CPU box (`SGLAB_REAL=live` runs the installed releases here instead, about
# 8 s a release).

# %%
sglang.compare()

# %% [markdown]
# So the 2 kernels per SWA layer hold for the releases #23552 and #24743 shipped in (0.5.11,
# 0.5.12.post1) and the one before them; today's SGLang (0.5.13 on) translates with one gather, once
# per forward, and has no `set_swa_loc` left to forget. The engine below counts the kernels of a
# captured decode replay in SGLang's own trace.

# %% [markdown]
# ### The real engine, before and after
#
# The same count from SGLang's whole engine: `bench_one_batch` on a GPT-OSS-style model (8 layers,
# 4 of them sliding-window, dummy weights; `sglab engine --plan 04` on a GPU box), its own decode
# trace read for the kernels of one decode-graph replay. The "before" is 0.5.11 with only #23552's
# preset removed: the release before the PR pins an older torch and does not start on the GPU image
# (the harness adjustment is printed with the table). The first claim under the table checks that
# the difference is the rebuild's two kernels per SWA layer, exactly; the second, that each count
# is one number over a case's engine starts, so a rerun on any machine must find it again, not a
# number near it (the last table: every recorded run, of every GPU model). The decode times are
# shown for orientation (the table's header says how many engine starts each rests on); no claim
# rests on them: a few kernels per replay cost microseconds, less than engine starts differ by.

# %%
engine = sglang.FIX.recorded_engine()
show.engine(engine)
verdict(claims.ENGINE, engine)

# %% [markdown]
# ## Kernels per replay (GPU)
#
# For each layout and batch size the run captures the three graphs, counts their kernel nodes
# statically (cuda-bindings), and counts the kernels torch.profiler sees in one replay. One row per
# layout: the count is the same for every captured batch size.

# %%
show.kernels(run)

# %% [markdown]
# ## Replay time (GPU)
#
# CUDA-event time of one `graph.replay()` (no populate) through `sglab.core.timing.interleaved`: the
# variants alternate in rounds, median and p10–p90 of the pooled samples. `#23552` is below `#24743`
# here only because this rebuild's K/V write converts an int32 location back to int64 (see above).
# The toy layer does only its KV write, so the ratio is an upper bound; the numbers that transfer
# are the kernels and µs per SWA layer.

# %%
show.times(run)

# %% [markdown]
# ### The rebuild beside the real engine
#
# The kernel count is the figure that transfers: the rebuild counts the graph nodes of its own
# layers, the engine the kernels in its own decode trace, and both find the same extra kernels per
# SWA layer without the preset. The time each saves depends on the GPU's per-kernel cost in a
# replay, which is what the rebuild's µs per SWA layer measures.
#
# On your own hardware: the kernel count per SWA layer is the same on any GPU and host; the time it
# costs is your GPU's per-kernel cost inside a replay, so count first and time second.

# %%
show.beside(run, engine)

# %% [markdown]
# ## The padding scenario on real graphs (GPU)
#
# The same two decode steps as above, captured and replayed as CUDA graphs; slots are (layer, slot)
# pairs.

# %%
show.padding(run)

# %% [markdown]
# ## See it in the profiler
#
# One replay of each graph at the headline layout under torch.profiler: without the preset the
# translation's gather and cast (highlighted) sit in every SWA layer; with it they are gone. Below
# it, one eager decode step per op (nsight-python's CUPTI backend and torch.profiler side by side):
# the SWA layers' KV write rows are the mechanism.

# %%
show.profiler(run)

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
# ## Verdict
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# swa_loc` does the same on the command line).

# %%
verdict(claims, run)

# %% [markdown]
# ## Takeaways
#
# - A Python branch inside a captured region is decided once, at capture. `set_kv_buffer`'s test
#   of `swa_loc` looked like a per-step choice but was frozen into every decode
#   graph as the slow branch: two kernels per SWA layer per step in the PR-era pool
#   (0.5.10.post1–0.5.12.post1), for a translation already done once per batch.
# - The fix makes the capture-time state the serving-time state: a static `out_cache_loc_swa`
#   buffer, filled at populate time, set on the pool before capture.
# - Static buffers inherit every padding rule of the inputs they shadow. `out_cache_loc` was zeroed
#   on pad; its SWA twin was not, and padded tokens overwrote exactly the SWA slots the previous,
#   larger batch left in the tail — live slots of running requests, silently (the follow-up saw it
#   as an accuracy drop).
#
# Review points worth discussing:
#
# - Would a capture-time assertion ("no `translate_loc_from_full_to_swa` call while capturing") have
#   caught the problem earlier? The counter here is that assertion.
# - `swa_loc` is a side channel on a shared pool, left set after each eager forward; later PRs
#   removed it in favour of a location passed with each write (#25824, #27091, #27617).
# - The dtype of a shadow buffer should match its source (int32 here): a mismatch costs a converting
#   copy and makes graph and eager paths hand different dtypes to the same kernel.
