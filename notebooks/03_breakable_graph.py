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
# # 03 · Breakable CUDA graph for multi-request prefill
#
# Upstream: [sgl-project/sglang#24662](https://github.com/sgl-project/sglang/pull/24662) ("Breakable Cuda Graph
# Support for bs > 1"), in `python/sglang/srt/model_executor/breakable_cuda_graph_runner.py`. Rebuilt in
# `sglab.fixes.breakable_graph` around the shared decoder `sglab.core.toy_decoder`, measured by
# `sglab.experiments.breakable_graph`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of sglab.experiments.breakable_graph.DEFAULT_PARAMS for a live run

# %%
import inspect

import pandas as pd
from IPython.display import display

from sglab.core import notebook as nb
from sglab.sglang import upstream
from sglab.experiments import breakable_graph as experiment
from sglab.experiments.breakable_graph import figures
from sglab.experiments.breakable_graph import real
from sglab.fixes import breakable_graph as bg
from sglab.sglang import compare_old as compare, compare_old as report

pd.set_option("display.width", 160)
wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% tags=["needs-gpu"]
if wb.live:
    params = {**experiment.DEFAULT_PARAMS, **PARAMS}
    wb.measure(lambda: experiment.run(params), params=params, method_version=experiment.METHOD_VERSION)

# %%
shown = wb.shown()  # this session's live run, else the newest recorded run of each GPU model
nb.slide(experiment.EXPERIMENT, shown, figures.slide_picture(shown[-1] if shown else None))

# %% [markdown]
# The picture is one captured forward of the measured model (16 layers), recorded through the runner's own
# capture path: blue boxes are CUDA-graph segments, grey boxes the attention calls that run eagerly between
# them. Before #24662 the last segment also holds the logits tail (red), captured for one request; after it,
# the tail runs eagerly outside the graph (green) with the live batch.
#
# ## The problem
#
# Prefill attention needs per-batch metadata (where each request starts and ends), so it cannot sit inside a
# CUDA graph captured once. SGLang's *breakable* CUDA graph captures a forward as a list of
# `torch.cuda.CUDAGraph` segments, all allocating from one memory pool, and cuts the capture at every
# function decorated `@eager_on_graph(True)` (attention, mamba). At replay the segments replay and the cut
# functions run eagerly in between, reading the live metadata.
#
# Everything in a segment is token-major: it works on a `(num_tokens, hidden)` tensor and does not care how
# the tokens split into requests — except the logits tail. For an extend batch `LogitsProcessor` keeps the
# last token of each request, `hidden[cumsum(extend_seq_lens) - 1]`, then applies the lm_head: a
# `(batch_size, vocab)` result. Where the capture boundary sits decides whether that tail is in the graph:
#
# | | before #24662 | after #24662 |
# |---|---|---|
# | captured | `model.forward` (layers **and** logits tail) | `layer_model.forward` (the layer stack) |
# | capture batch | bs=1, per-request fields are `[:1]` slices of static `(max_bs,)` buffers | bs=1 as a metadata placeholder only |
# | at replay | copy live lens into the static buffers, replay | outer `model.forward` runs eagerly; `layer_model.forward` swapped for "replay, return the output buffer" |
# | `can_run` | `False` when `batch_size > 1` | no batch-size condition |
# | needs | — | to find `layer_model` on the model object |
#
# The model is the shared toy decoder with learned positions: embedding → L × (RMSNorm, qkv, **attention
# break**, o_proj, RMSNorm, gated MLP) → norm → logits tail. The attention break is a dense SDPA with a
# block-diagonal causal mask built from the live request lengths, so tokens mix only within their request:

# %%
print(inspect.getsource(bg.varlen_attention))
print(inspect.getsource(bg.LogitsProcessor))

# %% [markdown]
# ## Rebuild: the two capture boundaries
#
# `BreakableGraphRunner(model, boundary=...)` mirrors `BreakableCudaGraphRunner`. The parts that differ:

# %%
print(inspect.getsource(bg.BreakableGraphRunner._build_capture_forward_batch))
print(inspect.getsource(bg.BreakableGraphRunner.can_run))
print(inspect.getsource(bg.BreakableGraphRunner.replay))

# %% [markdown]
# ### Live on this machine: what the "before" graph returns for three requests
#
# On a machine without CUDA the runner keeps every code path but replaces each captured graph by an
# *emulated* replay: the captured closure is re-run over the same static buffers and the same capture-time
# batch object — exactly what a real graph reads (the GPU run below does the same with real segments). A tiny
# model, buckets of 16/32/64 tokens, a batch of three requests with 10 + 12 + 10 tokens:

# %%
experiment.three_requests()

# %% [markdown]
# The captured tail computed `cumsum(static_extend_seq_lens[:1]) - 1`: replay copies the three live lengths
# into `static_extend_seq_lens[:3]`, but the graph reads only element 0, so it returns the logits of request
# 0's last token and nothing for requests 1 and 2. Downstream, the sampler would produce one token for three
# requests — hence the `batch_size > 1` rejection, and the eager fallback for every multi-request prefill.
#
# ### Live on this machine: graph hit rate on a mixed prefill stream
#
# `can_run` only; nothing is captured. The stream is seeded: one request with probability 0.35, otherwise
# 2..8 requests; request lengths log-uniform in 16..2048 tokens; buckets up to 4096 tokens (a batch with more
# tokens runs eagerly with either runner).

# %%
experiment.hit_table(experiment.hit_rate_rows())

# %% [markdown]
# ### Live on this machine: resolving `layer_model`
#
# The "after" runner must find the inner stack on the model object. #24662 resolves
# `getattr(model, "language_model", model).model` when it has `.layers`; otherwise it sets `layer_model =
# None`, logs a warning and disables itself (prefill runs eagerly). The reviewer's point was that attribute
# names are fragile and a failure must at least say so. Later SGLang (cf. #30006) walks the `.model` chain to
# any depth. Four model shapes:

# %%
print(inspect.getsource(bg.resolve_layer_model))
experiment.resolution_table()

# %% [markdown]
# A GPT-style model that keeps its stack under `.transformer` is not found by either rule; an extra wrapper
# level (`.model.model.layers`, e.g. an OCR model around a whole causal LM) is found only by the later walk.
# Falling back to the whole model instead of `None` would not be safe: the runner would capture the logits
# tail again — the "before" bug without the `can_run` guard.
#
# ## The real SGLang, before and after
#
# Which releases carry the change (read from the released wheels), and the released `can_run` of the first
# release with it beside the rebuilt one:

# %%
compare.show_as_released(experiment.EXPERIMENT, bg.BreakableGraphRunner.can_run,
                         symbol="BreakableCudaGraphRunner.can_run")

# %% [markdown]
# The released runner itself, run on the CPU: `BreakableCudaGraphRunner.__init__` of each release, in its
# own process, on a stand-in model runner around the rebuild's four model shapes, stopped where it would ask for
# the CUDA graph memory pool (nothing is captured); then the release's `can_run` on 1, 3 and 8 requests and on
# more tokens than the largest bucket, and its `_build_capture_forward_batch`. The rebuild's runner answers the
# same questions on the same models; `agrees` compares every fact, and a single difference prints `MISMATCH`
# with the facts that differ.
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
# The real breakable graph capturing and replaying on a GPU (`BreakableCUDAGraph`, outputs against eager):

# %%
compare.show_recorded(experiment.EXPERIMENT);

# %% [markdown]
# ## Measured on the GPU
#
# One run (`sglab record breakable_graph`, default parameters): the 16-layer model (hidden 1024, 8 heads × 128,
# MLP 2816, vocab 32000, bf16), token buckets 128..4096 captured for both boundaries into one shared graph pool;
# then (a) the "before" graph replayed for 3 requests, (b) "after" vs eager logits for 1, 3 and 8 requests at
# 128, 512 and 2048 tokens (and 1000 tokens, padded to the 1024 bucket), (c) the hit rate of the same stream
# with the real runners, (d) prefill latency of eager, the "before" runner (graph for one request, eager
# otherwise) and the "after" runner — CUDA events, 15 timed calls each in three alternating rounds, median and
# p10/p90 — and a traced pass for the launches per prefill. Runs recorded before method 3 swept 1..8 requests.

# %%
for r in shown:
    print(r.label)
    display(experiment.bs3_table(r.df), experiment.match_table(r.df))
if not shown:
    print("No GPU run to show: record one with `sglab record breakable_graph`.")

# %% [markdown]
# ### Prefill latency by request count
#
# At these sizes a prefill is mostly host time: eager issues one kernel launch per op, so its latency measures
# host launch overhead and moves with the host's load. For 2+ requests the "before" runner runs the very same
# eager code as "eager" (a built-in noise check, printed below), and "after" replays the same graph for every
# request count at a token count: it should be flat. At the largest token count "after" is bound by GPU time
# (flat, tight p10–p90); there the speedup is eager's host overhead alone.

# %%
for r in shown:
    display(figures.latency(r))
    print(experiment.speedup_lines(r))
    print(experiment.hit_rate_line(r.df))

# %% [markdown]
# ### Launches per prefill
#
# Host kernel launches, graph launches (one per segment replayed) and the kernels that ran on the GPU (inside
# graphs too), per request count; and the segments and breaks captured per bucket.

# %%
for r in shown:
    display(experiment.launch_table(r.df), experiment.segment_table(r.df))
    print(experiment.launch_line(r))

# %% [markdown]
# ## See it in the profiler
#
# One 3-request prefill of 512 tokens per runner, from a traced pass after the timed ones. "before" rejects the
# batch, so every kernel is launched from Python (the runtime lane is dense with launches); "after" launches 17
# graphs (highlighted) with the eager attention kernels between them and the logits tail at the end.

# %%
for r in shown:
    if r.sidecar("events") is None:
        print(f"{r.label}: this run predates profiler traces; a new recording (`sglab record breakable_graph`) "
              "adds them.")
        continue
    display(figures.timeline(r))

# %% [markdown]
# ## The installed SGLang

# %%
print(upstream.check(__import__("sglab.breakable_graph.sglang", fromlist=["FIX"]).FIX))

# %% [markdown]
# ## Verdict
#
# Every claim of `sglab.experiments.breakable_graph.claims`, checked on each run shown (`sglab verify
# breakable_graph` does the same from the command line).

# %%
nb.verdict(experiment.EXPERIMENT, shown)

# %% [markdown]
# ## Takeaways
#
# - The capture boundary is the fix. Everything between attention breaks is token-major, so one graph per
#   token bucket serves any number of requests; only the tail (`cumsum(extend_seq_lens) - 1`, lm_head) is
#   batch-shaped, and #24662 moves it out of the graph instead of guarding it.
# - The swap is a monkey-patch of `layer_model.forward` for the duration of the outer forward; it must be
#   undone on every path (here and upstream in a `finally`), and anything the outer forward does before
#   `self.model(...)` runs eagerly on the padded static batch.
# - Padding: a batch that is not exactly a bucket replays the next bucket up; padding tokens must not attend
#   to, or be attended by, real tokens (here: their own mask segment; upstream: the attention backend only
#   sees the real tokens).
#
# Review points worth discussing:
#
# - `layer_model` is found by attribute names (`language_model`, `.model`, `.layers`). #24662 disables the
#   runner with a warning when that fails; later code walks the `.model` chain (#30006) and the prefill graph
#   runner raises instead. Would an explicit model hook be more robust?
# - The eager tail costs host launches (cumsum, gather, lm_head) on every prefill: a handful next to the
#   eager forward's (count above); for one request, compare "before" and "after" at 128 tokens in (d).
# - Break-point tensors: the PR-era code kept them with weak references, relying on the pool's use count.
#   SGLang later found that unsafe across buckets (#30584, #37606); this rebuild holds strong references.
