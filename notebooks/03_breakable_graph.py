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
# `python/sglang/srt/model_executor/breakable_cuda_graph_runner.py`; rebuilt in
# `sglab.breakable_graph.rebuild`.

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
from sglab.core import engine_view
from sglab.core.notebook import Workbook, card, reveal, show_figure, verdict
from sglab.sglang import codepath


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE)
run = wb.run(measure, PARAMS)  # live: measured now on this GPU; recorded: the newest of each GPU
first = run.first if run else run  # the run a single-run picture reads (or the NoRun)
engine = sglang.FIX.recorded_engine()  # SGLang's own engine, before and after #24662
card(sglang.FIX, claims, run, engine)

# %% [markdown]
# ## The mechanism
#
# One captured forward of the measured model, recorded through the runner's own capture path: blue
# boxes are CUDA-graph segments, grey boxes the attention calls that run eagerly between them.
# Before #24662 the last segment also holds the logits tail (red), captured for one request; after
# it, the tail runs eagerly outside the graph (green) with the live batch.

# %%
show_figure(show.mechanism(first))

# %% [markdown]
# ## The lesson
#
# Prefill attention needs per-batch metadata (where each request starts and ends), so it cannot
# sit inside a CUDA graph captured once. The *breakable* CUDA graph captures a forward as a list of
# graph segments sharing one memory pool, cut at every function decorated `@eager_on_graph(True)`
# (attention): at replay the segments replay and the cut functions run eagerly in between, reading
# the live metadata. Everything in a segment is token-major — except the logits tail, which keeps
# the last token of each request, `hidden[cumsum(extend_seq_lens) - 1]`, then applies the lm_head:
# a `(batch_size, vocab)` result. Where the capture boundary sits decides whether that tail is in
# the graph:
#
# | | before #24662 | after #24662 |
# |---|---|---|
# | captured | `model.forward`: layers **and** logits tail | `layer_model.forward`: the stack |
# | capture batch | bs=1; fields are `[:1]` of static `(max_bs,)` buffers | bs=1, metadata only |
# | at replay | live lens into the static buffers, replay | outer forward eager, stack → replay |
# | `can_run` | `False` when `batch_size > 1` | no batch-size condition |
#
# The released `can_run` of #24662 beside the rebuilt one (the rebuild's switch is `boundary=`):

# %%
sglang.released(rebuild.BreakableGraphRunner.can_run, symbol="BreakableCudaGraphRunner.can_run")

# %% [markdown]
# ### Predict, then run: three requests through the one-request graph
#
# A tiny model on the CPU (each graph emulated: replay re-runs the captured closure over the same
# static buffers), buckets of 16/32/64 tokens, one batch of three requests of 10 + 12 + 10 tokens,
# each graph replayed whatever `can_run` says. **Predict** how many logit rows each graph returns,
# and what `can_run` answers.

# %%
model = rebuild.build_model(rebuild.TINY_CONFIG)
batch = rebuild.make_batch([10, 12, 10], vocab_size=rebuild.TINY_CONFIG.vocab_size, seed=1)
eager = rebuild.run_eager(model, batch)
rows = [{"path": "eager", "logit rows": len(eager), "max |diff| vs eager": 0.0, "can_run": ""}]
for b in rebuild.BOUNDARIES:
    r = rebuild.BreakableGraphRunner(model, boundary=b, capture_num_tokens=[16, 32, 64])
    out = r.replay(batch)
    rows.append({
        "path": f"{b} graph", "logit rows": len(out), "can_run": r.can_run(batch),
        "max |diff| vs eager": (out - eager[:len(out)]).abs().max().item()
    })
reveal(pd.DataFrame(rows).set_index("path"))

# %% [markdown]
# The captured tail computed `cumsum(static_extend_seq_lens[:1]) - 1`: replay copies the three
# live lengths into `static_extend_seq_lens[:3]`, but the graph reads only element 0, so it returns
# request 0's logits and nothing for requests 1 and 2. Hence the `batch_size > 1` rejection, and
# the eager fallback for every multi-request prefill.
#
# How often each runner uses its graph on a seeded stream of prefill batches
# (`measure.prefill_stream`: one request with probability `p_single`, else 2..`max_bs`; lengths
# log-uniform; `can_run` only, nothing captured):

# %%
p = measure.DEFAULT_PARAMS
print(f"The stream: {p['stream_batches']} prefill batches, each one request with probability "
      f"{p['stream_p_single']:g}, else 2 to {p['stream_max_bs']}; request lengths log-uniform from "
      f"{p['stream_min_len']} to {p['stream_max_len']} tokens. Buckets captured: "
      f"{', '.join(map(str, p['capture_num_tokens']))} tokens.")
stream = measure.stream(p)
rows = []
for b in rebuild.BOUNDARIES:
    r = rebuild.BreakableGraphRunner(model, boundary=b, capture_num_tokens=p["capture_num_tokens"],
                                     capture=False)
    rows.append({"runner": b, **measure.graph_hit_rate(r, stream)})
pd.DataFrame(rows).set_index("runner")

# %% [markdown]
# ### Predict, then run: where is `layer_model`?
#
# The "after" runner must find the inner stack on the model object. #24662 takes
# `getattr(model, "language_model", model).model` when it has `.layers`, else it logs a warning and
# disables itself (prefill runs eagerly); later SGLang walks the `.model` chain to any depth
# (cf. #30006). **Predict** which of four model shapes each rule finds: a plain causal LM, a VLM
# around one, a GPT-style model with its stack under `.transformer`, and an extra wrapper level
# (`.model.model.layers`).

# %%
rows = []
for shape in rebuild.MODEL_SHAPES:
    m = rebuild.build_model(shape=shape)
    for rule, walk in measure.RESOLVERS.items():
        found, warnings = measure.resolve(m, walk=walk)  # resolve_layer_model, warnings kept
        rows.append({
            "model shape": shape, "rule": rule, "layer_model": str(measure.module_path(m, found)),
            "warning": " ".join(warnings)
        })
reveal(pd.DataFrame(rows).set_index(["model shape", "rule"]))

# %% [markdown]
# Falling back to the whole model instead of `None` would not be safe: the runner would capture
# the logits tail again — the "before" bug without the `can_run` guard.
#
# ## Real SGLang
#
# The path of a prefill batch through the breakable graph in the release with #24662 that the
# engine runs below use (each box links to its line at the release's tag):

# %%
codepath.show(claims.AFTER_RELEASE, sglang.CODE_PATH, "A prefill batch through the breakable graph")

# %% [markdown]
# ### The releases' own runner, on the CPU
#
# `BreakableCudaGraphRunner.__init__` of each release, in its own process, on a stand-in model
# runner around the rebuild's four model shapes, stopped where it would ask for the graph memory
# pool; then its `can_run` on 1, 3 and 8 requests and on more tokens than the largest bucket, and
# its `_build_capture_forward_batch`. The rebuild answers the same questions; `agrees` compares
# every fact (recorded mode shows the answers recorded on the CPU box; `SGLAB_REAL=live` runs the
# installed releases).

# %%
sglang.compare()

# %% [markdown]
# ### The real engine, before and after
#
# SGLang's whole engine with `--enable-breakable-cuda-graph` (and without, for eager): a
# Llama-style model of 32 layers x hidden 512 with dummy weights, `Engine.generate` on 1, 2, 4 and 8
# prompts of 128 tokens at once, one output token (`sglab engine --plan 03` on a GPU box). Whether
# a prefill batch ran on the graph comes from the scheduler's own "Prefill batch" log line; the time
# is the whole call. 0.5.11 is the last release before #24662, and 0.5.12.post1 the release with
# it that these runs use (#24662 first shipped in 0.5.12, as the card's release line shows);
# `eager-again` is the A/A control (eager started twice).

# %%
engine_view.section(show.VIEW, engine, claims.ENGINE)

# %% [markdown]
# ### The rebuild beside the engine
#
# The counts first: exact, the same on any host. Then the timings: the rebuild times the prefill
# forward alone, the engine a whole `Engine.generate` call (tokenizing, scheduling, the decode
# step), so its ratios are smaller. What must agree is the shape: before #24662 a batch of several
# requests gains nothing from the graph, with #24662 every request count gains.

# %%
engine_view.beside(show.beside_rows(first, engine))

# %% [markdown]
# ## Your own setup
#
# Your prefill traffic — how often a batch holds one request, how many at most, how long a request
# gets, the largest captured bucket — and the share of batches (and tokens) each runner serves from
# its graph, routed by the rebuilt `can_run` (exact, no GPU). Which batches run on the graph is the
# scheduler's decision and does not move; the time it saves is the host's work per eager kernel,
# which grows on a slower or busier host and shrinks as the model gets wider. Latency on your own
# GPU: `sglab record breakable_graph --param token_counts=[...] --param batch_sizes=[...]`.

# %%
show.your_setup(interactive=INTERACTIVE)

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
#   the eager forward's (the launch counts in the appendix); for one request, compare "before" and
#   "after" at one request in the latency figure of the appendix (the table under it covers only
#   batches of several requests).
# - Break-point tensors: the PR-era code kept them with weak references, relying on the pool's use
#   count. SGLang later found that unsafe across buckets (#30584, #37606); this rebuild holds strong
#   references.
#
# How each number is made to repeat (engine starts, A/A controls, reruns on other machines):
# [07 · how we measure](07_how_we_measure.ipynb).

# %% [markdown]
# ## Appendix
#
# ### The rebuild's code
#
# The attention break (a dense SDPA with a block-diagonal causal mask from the live request
# lengths), the logits tail, and the rebuilt capture batch and replay; `boundary=` switches between
# before and after:

# %%
for fn in (rebuild.varlen_attention, rebuild.LogitsProcessor,
           rebuild.BreakableGraphRunner._build_capture_forward_batch,
           rebuild.BreakableGraphRunner.replay):
    print(inspect.getsource(fn))

# %% [markdown]
# What one capture consists of: the runner's own capture path, run inside a capture that records
# module names where the real one opens a CUDA graph (`show.capture_structure`), for a model of a
# few layers. One segment more than the layers and one break per layer, for either boundary: moving
# the boundary changes only what the last segment holds.

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
# ### Measured on the GPU: correctness
#
# `sglab record breakable_graph` (`measure.DEFAULT_PARAMS`): the toy decoder at a real model's
# widths in bf16, token buckets captured for both boundaries into one shared graph pool; then (a)
# the "before" graph replayed for 3 requests, (b) "after" against eager logits for every request
# count at bucket-sized token counts and at one padded to the next bucket. Per GPU:

# %%
show.correctness(run)

# %% [markdown]
# ### Prefill latency by request count
#
# Whole prefill (forward and logits tail) of eager, the "before" runner (graph for one request,
# eager otherwise) and the "after" runner: CUDA events, timed in alternating rounds, median and
# p10/p90. At these sizes a prefill is mostly host time, so eager's latency moves with the host's
# launch cost. For 2+ requests "before" runs the very same eager code as "eager" (the `before vs
# eager` columns: the run's own A/A control); "after" replays the same graph for every request
# count at a token count and should be flat. Last, the hit rate of the mixed stream routed by the
# run's own runners.

# %%
show.latency(run)

# %% [markdown]
# ### Launches per prefill
#
# From a traced pass after the timed ones: host kernel launches, graph launches (one per segment
# replayed) and the kernels that ran on the GPU, per request count; then the segments and breaks
# captured per bucket. Exact on any host. For one request the two graphs differ only by the logits
# tail: captured in "before", launched eagerly by "after".

# %%
show.launches(run)

# %% [markdown]
# ### In the profiler
#
# One 3-request prefill per runner from the traced pass. "before" rejects the batch, so every
# kernel is launched from Python; "after" launches one graph per segment (highlighted) with the
# eager attention kernels between them and the logits tail at the end.

# %%
show.profiler(run)

# %% [markdown]
# ### The claims
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# breakable_graph` does the same on the command line).

# %%
verdict(claims, run)
