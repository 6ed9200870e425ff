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
# Upstream: [sgl-project/sglang#24662](https://github.com/sgl-project/sglang/pull/24662)
# ("Breakable Cuda Graph Support for bs > 1"), in
# `python/sglang/srt/model_executor/breakable_cuda_graph_runner.py`. Rebuilt in
# `sglab.breakable_graph.rebuild` around the shared decoder `sglab.core.toy_decoder`, measured by
# `sglab.breakable_graph.measure`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of measure.DEFAULT_PARAMS for a live run
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import inspect

import pandas as pd

from sglab.breakable_graph import claims, measure, rebuild, sglang, show
from sglab.core.notebook import Workbook, slide, verdict


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE)
# live: measured now on this GPU; recorded: the committed run of each GPU
run = wb.run(measure, PARAMS)
slide(claims, run, show.mechanism(run))

# %% [markdown]
# The picture is one captured forward of the measured model, recorded through the runner's own
# capture path: blue boxes are CUDA-graph segments, grey boxes the attention calls that run eagerly
# between them. Before #24662 the last segment also holds the logits tail (red), captured for one
# request; after it, the tail runs eagerly outside the graph (green) with the live batch.
#
# ## The problem
#
# Prefill attention needs per-batch metadata (where each request starts and ends), so it cannot
# sit inside a CUDA graph captured once. SGLang's *breakable* CUDA graph captures a forward as a
# list of `torch.cuda.CUDAGraph` segments, all allocating from one memory pool, and cuts the
# capture at every function decorated `@eager_on_graph(True)` (attention, mamba). At replay the
# segments replay and the cut functions run eagerly in between, reading the live metadata.
#
# Everything in a segment is token-major: it works on a `(num_tokens, hidden)` tensor and does not
# care how the tokens split into requests — except the logits tail. For an extend batch
# `LogitsProcessor` keeps the last token of each request, `hidden[cumsum(extend_seq_lens) - 1]`,
# then applies the lm_head: a `(batch_size, vocab)` result. Where the capture boundary sits decides
# whether that tail is in the graph:
#
# | | before #24662 | after #24662 |
# |---|---|---|
# | captured | `model.forward`: layers **and** logits tail | `layer_model.forward`: the stack |
# | capture batch | bs=1; fields are `[:1]` of static `(max_bs,)` buffers | bs=1, metadata only |
# | at replay | live lens into the static buffers, replay | outer forward eager, stack → replay |
# | `can_run` | `False` when `batch_size > 1` | no batch-size condition |
# | needs | — | to find `layer_model` on the model object |
#
# The model is the shared toy decoder with learned positions: embedding → L × (RMSNorm, qkv,
# **attention break**, o_proj, RMSNorm, gated MLP) → norm → logits tail. The attention break is a
# dense SDPA with a block-diagonal causal mask built from the live request lengths, so tokens mix
# only within their request:

# %%
print(inspect.getsource(rebuild.varlen_attention))
print(inspect.getsource(rebuild.LogitsProcessor))

# %% [markdown]
# Which released SGLang has which runner (read in the released wheels), then #24662's released
# `can_run` beside the rebuilt one, and the rebuilt capture batch and replay, whose boundary is
# the one switch `boundary=` (`rebuild.BOUNDARIES`):

# %%
sglang.released(rebuild.BreakableGraphRunner.can_run, symbol="BreakableCudaGraphRunner.can_run")

# %%
print(inspect.getsource(rebuild.BreakableGraphRunner._build_capture_forward_batch))
print(inspect.getsource(rebuild.BreakableGraphRunner.replay))

# %% [markdown]
# ## The lesson, on the CPU: capture, replay for three requests, count
#
# Without CUDA each captured graph is *emulated*: replay re-runs the captured closure over the same
# static buffers and the same capture-time batch object, exactly what a real graph reads (the GPU
# run below does the same with real segments). A tiny model, buckets of 16/32/64 tokens, a batch of
# three requests with 10 + 12 + 10 tokens, each graph replayed whatever `can_run` says:

# %%
model = rebuild.build_model(rebuild.TINY_CONFIG)
runners = {
    b: rebuild.BreakableGraphRunner(model, boundary=b, capture_num_tokens=[16, 32, 64])
    for b in rebuild.BOUNDARIES
}
batch = rebuild.make_batch([10, 12, 10], vocab_size=rebuild.TINY_CONFIG.vocab_size, seed=1)
eager = rebuild.run_eager(model, batch)
rows = [{
    "path": "eager", "logits shape": tuple(eager.shape), "max |diff| vs eager": 0.0, "can_run": "",
    "requests without logits": 0
}]
for b, r in runners.items():
    out = r.replay(batch)
    rows.append({
        "path": f"{b} graph", "logits shape": tuple(out.shape), "can_run": r.can_run(batch),
        "max |diff| vs eager": (out - eager[:len(out)]).abs().max().item(),
        "requests without logits": len(eager) - len(out)
    })
pd.DataFrame(rows).set_index("path")

# %% [markdown]
# The captured tail computed `cumsum(static_extend_seq_lens[:1]) - 1`: replay copies the three live
# lengths into `static_extend_seq_lens[:3]`, but the graph reads only element 0, so it returns the
# logits of request 0's last token and nothing for requests 1 and 2. Downstream the sampler would
# produce one token for three requests — hence the `batch_size > 1` rejection, and the eager
# fallback for every multi-request prefill.
#
# What one capture consists of: the runner's own capture path, run inside a capture that records
# module names where the real one opens a CUDA graph (`show.capture_structure`), for a model of a
# few layers:

# %%
rows = []
for b in rebuild.BOUNDARIES:
    s = show.capture_structure(b, num_layers=4)
    rows.append({
        "boundary": b, "graph segments": len(s.segments), "eager breaks": len(s.breaks),
        "logits tail in a segment": s.tail_in_graph, "first segment": show.segment_label(
            s.segments[0]), "last segment": show.segment_label(s.segments[-1])
    })
pd.DataFrame(rows).set_index("boundary")

# %% [markdown]
# One segment more than the layers and one break per layer, for either boundary: moving the
# boundary changes only what the last segment holds.
#
# ### How often each runner uses its graph
#
# `can_run` only; nothing is captured. A seeded stream of prefill batches (`measure.prefill_stream`:
# one request with probability `p_single`, otherwise 2..`max_bs` requests; request lengths
# log-uniform; the run's buckets, a batch with more tokens than the largest runs eagerly with
# either runner):

# %%
p = measure.DEFAULT_PARAMS
print({k: v for k, v in p.items() if k.startswith("stream_") or k == "capture_num_tokens"})
stream = measure.stream(p)
rows = []
for b in rebuild.BOUNDARIES:
    r = rebuild.BreakableGraphRunner(model, boundary=b, capture_num_tokens=p["capture_num_tokens"],
                                     capture=False)
    rows.append({"runner": b, **measure.graph_hit_rate(r, stream)})
pd.DataFrame(rows).set_index("runner")

# %% [markdown]
# ### Resolving `layer_model`
#
# The "after" runner must find the inner stack on the model object. #24662 resolves
# `getattr(model, "language_model", model).model` when it has `.layers`; otherwise it sets
# `layer_model = None`, logs a warning and disables itself (prefill runs eagerly). The reviewer's
# point was that attribute names are fragile and a failure must at least say so. Later SGLang
# walks the `.model` chain to any depth (cf. #30006). Four model shapes, both rules:

# %%
print(inspect.getsource(rebuild.resolve_layer_model))
rows = []
for shape in rebuild.MODEL_SHAPES:
    m = rebuild.build_model(shape=shape)
    for rule, walk in measure.RESOLVERS.items():
        found, warnings = measure.resolve(m, walk=walk)  # resolve_layer_model, warnings kept
        rows.append({
            "model shape": shape, "rule": rule, "layer_model": measure.module_path(m, found),
            "warning": " ".join(warnings)
        })
pd.DataFrame(rows).set_index(["model shape", "rule"])

# %% [markdown]
# A GPT-style model that keeps its stack under `.transformer` is not found by either rule; an extra
# wrapper level (`.model.model.layers`, e.g. an OCR model around a whole causal LM) is found only by
# the later walk. Falling back to the whole model instead of `None` would not be safe: the runner
# would capture the logits tail again — the "before" bug without the `can_run` guard.
#
# ## The real SGLang, before and after
#
# The released runner itself, run on the CPU: `BreakableCudaGraphRunner.__init__` of each release,
# in its own process, on a stand-in model runner around the rebuild's four model shapes, stopped
# where it would ask for the CUDA graph memory pool (nothing is captured); then the release's
# `can_run` on 1, 3 and 8 requests and on more tokens than the largest bucket, and its
# `_build_capture_forward_batch`. The rebuild's runner answers the same questions on the same
# models; `agrees` compares every fact, and a difference prints a banner with the facts that differ.
# Recorded mode shows the answers recorded on the CPU box (`SGLAB_REAL=live` runs the installed
# releases here instead).

# %%
sglang.compare()

# %% [markdown]
# ### The real engine, before and after
#
# SGLang's whole engine with `--enable-breakable-cuda-graph` (and without, for the eager
# baseline): a Llama-style model of 32 layers x hidden 512 with dummy weights, `Engine.generate`
# on 1, 2, 4 and 8 prompts of 128 tokens at once (`sglab engine --plan 03` on a GPU box). Whether a
# prefill batch ran on the graph comes from the scheduler's own "Prefill batch" log line; the time
# is the whole `generate` call (prefill and one output token), median of 5. 0.5.11 is the last
# release before #24662, 0.5.12.post1 the first with it. Each case ran as three interleaved engine
# starts, and `eager-again` is the A/A control (eager started twice). A start is fast or slow as a
# whole, or flips between fast and slow within one: these machines' vCPUs change speed every few
# seconds (notebook 01's host probe), and a launch-bound step pays it in full. So the claim reads,
# as 01's does, each case's fastest repeat of any start (3 starts × 5 calls), and the A/A table
# compares the control's two copies by every statistic. The last table sets the speed-up beside
# its reruns (each run on a machine of its own; the H200 runs with their drift against the first
# H200 run), by each statistic, the claimed one first; `sglab verify RUN --against` fails a rerun
# whose ratio lies outside the range of the recorded runs of its GPU model by more than the A/A
# gap or the claim's drift.

# %%
engine = sglang.FIX.recorded_engine()
show.engine(engine)
verdict(claims.ENGINE, engine)

# %% [markdown]
# ## Measured on the GPU: correctness
#
# One run (`sglab record breakable_graph`, `measure.DEFAULT_PARAMS`): the toy decoder at a real
# model's widths in bf16, token buckets captured for both boundaries into one shared graph pool;
# then (a) the "before" graph replayed for 3 requests, (b) "after" against eager logits for every
# request count at bucket-sized token counts and at one that is padded to the next bucket. Per GPU:

# %%
show.correctness(run)

# %% [markdown]
# ### Prefill latency by request count
#
# Whole prefill (forward and logits tail) of eager, the "before" runner (graph for one request,
# eager otherwise) and the "after" runner: CUDA events, the three timed in alternating rounds,
# median and p10/p90. At these sizes a prefill is mostly host time: eager issues one kernel launch
# per op, so its latency measures the host's launch overhead and moves with the host's load. For 2+
# requests "before" runs the very same eager code as "eager" (a built-in noise check: the `before vs
# eager` columns), and "after" replays the same graph for every request count at a token count: it
# should be flat. At the largest token count "after" is bound by GPU time; there the speedup is
# eager's host overhead alone and shrinks on a faster host. Last, the hit rate of the mixed stream
# routed by the run's own runners.

# %%
show.latency(run)

# %% [markdown]
# ### Launches per prefill
#
# From a traced pass after the timed ones: host kernel launches, graph launches (one per segment
# replayed) and the kernels that ran on the GPU (inside graphs too), per request count; then the
# segments and breaks captured per bucket. These counts are exact on any host. For one request the
# two graphs differ only by the logits tail: captured in "before", launched eagerly by "after".

# %%
show.launches(run)

# %% [markdown]
# ### The rebuild beside the real engine
#
# The counts come first: the graph launches of the rebuild's prefill and the share of the engine's
# prefill batches that its scheduler ran on the graph. They are exact and the same on any host.
# Then the timings. The rebuild times the prefill forward alone; SGLang's engine a whole
# `Engine.generate` call of one output token (tokenizing, scheduling, the decode step), so its
# ratios are smaller. Each engine figure reads the fastest repeat of several engine starts, the
# range of the starts in brackets, with the per-launch cost of the host that ran it. What must agree
# is the shape: before #24662 a batch of several requests gains nothing from the graph (rebuild
# "before" ≈ 1×, 0.5.11 at 2–8 requests ≈ 1×, where its scheduler fell back to eager) and only one
# request does; with #24662 every request count gains.
#
# On your own hardware: which batches run on the graph is the scheduler's decision and does not
# move. The time it saves is the host's work per eager kernel: the launch and the Python and
# dispatch work around it, several times the bare launch cost. It grows on a slower or busier
# host, shrinks as the model gets wider, and moves between engine starts on one host as much as the
# brackets show.

# %%
show.beside(run, engine)

# %% [markdown]
# ## See it in the profiler
#
# One 3-request prefill per runner from the traced pass. "before" rejects the batch, so every
# kernel is launched from Python (the runtime lane is dense with launches); "after" launches one
# graph per segment (highlighted) with the eager attention kernels between them and the logits tail
# at the end.

# %%
show.profiler(run)

# %% [markdown]
# ## Your own setup
#
# Your prefill traffic — how often a batch holds one request, how many at most, how long a request
# gets, the largest captured bucket — and the share of batches (and tokens) each runner serves from
# its graph, routed by the rebuilt `can_run` (exact, no GPU). Latency on your own GPU and sizes:
# `sglab record breakable_graph --param token_counts=[...] --param batch_sizes=[...]` (any key of
# `measure.DEFAULT_PARAMS`).

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Verdict
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# breakable_graph` does the same on the command line).

# %%
verdict(claims, run)

# %% [markdown]
# ## Takeaways
#
# - The capture boundary is the fix. Everything between attention breaks is token-major, so one
#   graph per token bucket serves any number of requests; only the tail (`cumsum(extend_seq_lens) -
#   1`, lm_head) is batch-shaped, and #24662 moves it out of the graph instead of guarding it.
# - The swap is a monkey-patch of `layer_model.forward` for the duration of the outer forward; it
#   must be undone on every path (here and upstream in a `finally`), and anything the outer forward
#   does before `self.model(...)` runs eagerly on the padded static batch.
# - Padding: a batch that is not exactly a bucket replays the next bucket up; padding tokens must
#   not attend to, or be attended by, real tokens (here: their own mask segment; upstream: the
#   attention backend only sees the real tokens).
#
# Review points worth discussing:
#
# - `layer_model` is found by attribute names (`language_model`, `.model`, `.layers`). #24662
#   disables the runner with a warning when that fails; later code walks the `.model` chain
#   (#30006) and the prefill graph runner raises instead. Would an explicit model hook be more
#   robust?
# - The eager tail costs host launches (cumsum, gather, lm_head) on every prefill: a handful next to
#   the eager forward's (counted above); for one request, compare "before" and "after" at the
#   smallest token count in the latency table.
# - Break-point tensors: the PR-era code kept them with weak references, relying on the pool's use
#   count. SGLang later found that unsafe across buckets (#30584, #37606); this rebuild holds strong
#   references.
