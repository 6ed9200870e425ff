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
# # 01 · Let a VLM wrapper through the piecewise-CUDA-graph gate without registering its LLM twice
#
# Upstream: [sgl-project/sglang#26382](https://github.com/sgl-project/sglang/pull/26382), part A
# (the `.model` alias; part B, the allreduce-fusion workspace floor, is notebook 02).

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of measure.DEFAULT_PARAMS for a live run
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import inspect

import pandas as pd
import torch

from sglab.core import engine_view
from sglab.core.notebook import Workbook, card, reveal, show_figure, verdict
from sglab.pcg_gate import claims, measure, rebuild, serving, sglang, show
from sglab.sglang import codepath


pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 80)
wb = Workbook(claims, mode=MODE)
run = wb.run(measure, PARAMS)  # the rebuild on one GPU: measured here, else recorded
engine = sglang.FIX.recorded_engine()  # SGLang's own engine, recorded on GPU boxes
card(sglang.FIX, claims, run, engine)

# %% [markdown]
# ## The mechanism
#
# Each wrapper, left to right: how it defines `.model`, what the gate's `hasattr` test answers,
# what the gate's write-back `wrapper.model = ...` does to it, and which keys `state_dict()` holds
# afterwards. The PR's wrapper is the last row.

# %%
show_figure(show.mechanism(run))

# %% [markdown]
# ## The lesson
#
# ### The problem, beside the released fix
#
# At startup `ModelRunner.init_piecewise_cuda_graphs` decides whether prefill gets piecewise CUDA
# graphs (PCG). Three of its steps matter for a vision-language wrapper (the whole gate, rebuilt
# line by line, is in the appendix):
#
# | step | code | for `KimiK25ForConditionalGeneration` |
# |---|---|---|
# | gate | `hasattr(model, "model")` | **False** (the LLM is `language_model`): PCG off |
# | write-back | `model.model = resolve_language_model(model)` | runs on every model that passed |
# | layer stack | `getattr(model, "language_model", model)`, `.model.layers` | found |
#
# The write-back is the trap. `torch.nn.Module.__setattr__` looks at the *value* first: a `Module`
# goes straight into `self._modules[name]`, before any class attribute of that name is consulted,
# so a `@property`, even one with a setter, never sees the assignment. The PR adds the property and
# a guard in front of `nn.Module.__setattr__`; the guard as released, beside the rebuilt wrapper:

# %%
sglang.released(rebuild.KimiPropertyGuard, symbol="KimiK25ForConditionalGeneration.__setattr__")

# %% [markdown]
# ### Each wrapper through the gate
#
# A Kimi-shaped wrapper (`vision_tower`, `mm_projector`, and the shared decoder as a 2-layer
# CausalLM under `language_model`) in the variants of `rebuild.VARIANTS`: `no_alias` (0.5.11 to
# 0.5.12.post1), `plain_alias` (`self.model = self.language_model.model` in `__init__`, as in
# 0.5.10.x), `property_only`, `property_guard` (the PR) and `property_setter`. Each goes through the
# rebuilt gate; then its `state_dict()` is loaded strictly into a fresh instance (the state at
# weight-loading time), and a checkpoint with the HF naming (`language_model.*` only) into the
# gated one.


# %%
def gated(variant):
    """A wrapper of ``variant`` after the gate ran on it, the gate's result, its keys when built."""
    w = rebuild.build_wrapper(variant)
    built = list(w.state_dict())
    with rebuild.quiet_gate():
        res = rebuild.init_piecewise_cuda_graphs(
            rebuild.ModelRunnerState(w, num_hidden_layers=rebuild.TINY_LM.num_layers))
    return w, res, built


hf_checkpoint = rebuild.build_wrapper("no_alias").state_dict()  # language_model.* only
rows = {}
for v in rebuild.ALL_VARIANTS:
    w, res, built = gated(v)
    keys = list(w.state_dict())
    fresh = rebuild.build_wrapper(v, seed=1)
    rows[v] = {
        "gate": "PCG on" if res.enabled else "PCG off", "gate message": res.message,
        "layer stack": res.layer_model_path or "-", "keys (built)": len(built),
        "keys (after gate)": len(keys), "of which model.*": sum(
            k.startswith("model.") for k in keys),
        "'model' in _modules": rebuild.has_duplicate_registration(w),
        "save -> fresh load (strict)": rebuild.strict_load(fresh, w.state_dict()).summary,
        "HF checkpoint -> load (strict)": rebuild.strict_load(w, hf_checkpoint).summary
    }
pd.DataFrame(rows)

# %% [markdown]
# ### Predict, then run: a property with a setter
#
# The PR's author reports that a `@model.setter` did not help either. The gate's write-back is
# `wrapper.model = wrapper.language_model`. Predict: how many times is the setter called, and does
# the wrapper hold the LLM's keys once or twice afterwards?

# %%
w = rebuild.build_wrapper("property_setter")
rebuild.KimiPropertySetter.setter_calls = 0
before = len(w.state_dict())
w.model = w.language_model  # what the runner's write-back does
reveal(f"setter calls: {rebuild.KimiPropertySetter.setter_calls}; 'model' in _modules: "
       f"{rebuild.has_duplicate_registration(w)}; state_dict keys: {before} → "
       f"{len(w.state_dict())}")

# %% [markdown]
# ### Predict, then run: what the guard costs
#
# Overriding `nn.Module.__setattr__` was the review's worry. On the PR's wrapper, predict which of
# these take effect: a new parameter `w.logit_scale`, reassigning a registered buffer, a new
# submodule `w.adapter`, swapping the LLM through `w.language_model`, and swapping it through
# `w.model`.

# %%
w, rows = rebuild.build_wrapper("property_guard"), []
w.logit_scale = torch.nn.Parameter(torch.ones(1))
rows.append(("w.logit_scale = Parameter(...)", "logit_scale" in dict(w.named_parameters())))
w.register_buffer("pos_table", torch.zeros(3))
w.pos_table = torch.arange(3.0)  # reassigning a buffer goes through __setattr__
rows.append(("w.pos_table = tensor (a buffer)",
             torch.equal(w._buffers["pos_table"], torch.arange(3.0))))
w.adapter = torch.nn.Linear(4, 4)
rows.append(("w.adapter = Linear(...)", "adapter.weight" in w.state_dict()))
w.language_model = new_lm = rebuild.tiny_language_model()
rows.append(("w.language_model = new_lm", w.language_model is new_lm and w.model is new_lm))
w.model = other_lm = rebuild.tiny_language_model()  # a legitimate swap: no error, no effect
rows.append(("w.model = other_lm", w.model is other_lm))
reveal(pd.DataFrame(rows, columns=["assignment", "took effect"]).set_index("assignment"))

# %% [markdown]
# ### What the gate switches on: piecewise prefill
#
# The wrapper that passes gets `rebuild.PiecewiseRunner`: one CUDA graph per piece between two
# attention calls, attention eager on the real token count, a prefill padded up to the smallest of
# the upstream token-count buckets that holds it. On the CPU the same pieces run eagerly on the
# same padded buffers; padded rows never mix with real ones (every op but attention works row by
# row), so a padded prefill equals the plain forward:

# %%
buckets = rebuild.piecewise_cuda_graph_tokens(measure.DEFAULT_PARAMS["max_tokens"])
print(f"{show.buckets_line(buckets)}.")
pads = [f"{n} → {rebuild.bucket_for(n, buckets)}" for n in measure.DEFAULT_PARAMS["token_counts"]]
print(f"The measured token counts and the bucket each pads to: {', '.join(pads)}.")
tiny = {
    **measure.DEFAULT_PARAMS, "hidden": 64, "num_layers": 3, "num_heads": 4, "intermediate": 96,
    "vocab": 50, "max_tokens": 256
}
lm = measure.language_model(measure.model_config(tiny), "cpu", torch.float32)
state = rebuild.ModelRunnerState(rebuild.build_wrapper("property_guard", language_model=lm), 3,
                                 rebuild.piecewise_cuda_graph_tokens(256))
res = rebuild.init_piecewise_cuda_graphs(state)
runner = rebuild.PiecewiseRunner(res.layer_model, state.attention_layers,
                                 state.piecewise_cuda_graph_tokens, use_graphs=False)
rows = []
with torch.no_grad():
    for n in (5, 17, 100, 256):
        ids = torch.randint(0, tiny["vocab"], (n,))
        diff = measure.compare(runner.forward(ids).clone(), lm.model(ids, torch.arange(n)))
        rows.append({
            "tokens": n, "bucket": runner.bucket(n), "max |piecewise − eager|": diff["max_abs_diff"]
        })
pd.DataFrame(rows).set_index("tokens")

# %% [markdown]
# ## Real SGLang
#
# ### The code path
#
# From the server flags to the capture, in the first release with the fix (each box links to its
# line at the release's tag):

# %%
codepath.show(sglang.CODE_PATH_RELEASE, sglang.CODE_PATH, "Kimi-K2.5 through the piecewise gate")

# %% [markdown]
# ### The releases' own class, on the CPU
#
# Each release's `KimiK25ForConditionalGeneration.__init__` around the rebuild's 2-layer LLM (its
# vision tower and projector replaced by tiny modules), then the release's own gate on a stand-in
# model runner, one process per release. "guard removed" is the real class with
# `nn.Module.__setattr__` put back. Each row is checked fact by fact against the rebuild's variant
# for that release (recorded on the CPU box; `SGLAB_REAL=live` runs the installed releases here).

# %%
sglang.compare()

# %% [markdown]
# ### The engine, before and after
#
# The PR measures the full Kimi-K2.5 under serving load: TTFT, TPOT and E2E from SGLang's own
# `bench_serving`. Here the same tool measures Kimi-K2.5's real widths (hidden 7168, MLA, 384
# experts; 2 of its 61 layers, one dense and one MoE, what an 80-GB GPU holds with dummy weights)
# served by the release's own server, piecewise graphs enforced against off, over three interleaved
# engine starts with the A/A control (`01-kimi-full-serve`):

# %%
serving.show(engine)

# %% [markdown]
# Read both tables as the PR reads its own, after ÷ before: below 1× piecewise graphs are faster.
# At full width they do not cut TTFT. From about 1024 tokens the captured prefill is slower than
# eager in every run, and `bench_one_batch` finds the same (the width figure below, squares). At
# 128 tokens `bench_one_batch`'s prefill step gains, but that saving is a small share of a
# request's TTFT (its round trip to the server, tokenizing, scheduling, the first decode step):
# the line under the tables gives each recorded run alone, and there the gain clears its A/A gap
# on one machine and not on another.
#
# **Why TPOT does not move here.** Piecewise graphs cover prefill only: decode replays its own
# CUDA graphs with them or without, so a decode step takes the same time (`bench_one_batch`, and
# TPOT with one request in flight). `bench_serving`'s TPOT is (E2E − TTFT) ÷ (output tokens − 1),
# so it also holds the time a request waits while other requests' prefills run: with 4 in flight it
# moves a few percent, either way, and the scheduler's log (the line under the table) counts as
# many prefill batches of several requests with the graphs as without. The PR's +42% is not
# reproduced on one GPU at this width; what these runs rule out as its cause is a slower decode
# step. How tightly they rule it out depends on the host: `bench_one_batch`'s decode step includes
# the scheduler's own work per step, and on machines with a slower per-launch cost it moved from
# one engine start to the next whatever the flags (the A/A copies moved as much), which is why each
# bound in the card is twice its own source's A/A gap wherever that is larger than the claim's
# fixed floor.

# %% [markdown]
# **Why the captured step loses from about 1024 tokens.** Inside a piecewise graph the release
# runs Kimi-K2.5's attention in its absorbed form: `handle_attention_triton`
# (`srt/models/deepseek_common/attention_backend_handler.py`, 0.5.13) returns
# `AttnForwardMethod.MLA` whenever `is_in_piecewise_cuda_graph()`, while an eager prefill with no
# cached prefix gets `AttnForwardMethod.MHA` (the server logs "Piecewise CUDA graph is enabled, use
# MLA for prefill"). Absorbed attention works in the 512-wide latent plus the 64-wide rope key for
# every head and query–key pair, and returns 512 wide; MHA works in 128 + 64 and returns 128: about
# 3.4× the attention arithmetic, a cost that grows with the square of the prompt. The launch pass
# times each kernel of one prefill step:

# %%
serving.kernels(engine)

# %% [markdown]
# Up to the largest capture the graphs remove the same launches at every length (the launch counts
# are in the engine section's table below). At 128 tokens that saving is most of the step; from
# 1024 tokens the absorbed attention's extra kernel time outweighs it, and the MoE kernels take the
# same time either way. Beyond the largest capture (4096) both steps are eager MHA and cost the
# same. The reversal is the attention form a captured piece requires, not the graphs: where it
# crosses over depends on the heads per GPU (a TP-4 rank has a quarter of them) and the capture cap
# (`--piecewise-cuda-graph-max-tokens`).

# %% [markdown]
# What the workbook has measured: SGLang's whole engine with dummy weights (`sglab engine --plan
# 01`): a tiny Kimi-K2.5 (2 DeepSeek-V3 layers, a 1-layer vision tower) with default flags, with
# `--enforce-piecewise-cuda-graph` and with piecewise graphs off, on 0.5.12.post1 (before the PR)
# and 0.5.13 (after); Kimi-K2.5 at its real widths and at one TP-4 rank's (the sections above); and
# a text-only Llama for comparison. The first table gives, per model and tool, the releases, cases
# and prompt lengths the recorded runs hold. Read the release's own decision (`pcg`, `pcg_reason`)
# next. Each speed-up reads each side's fastest repeat over interleaved engine starts and must
# clear the A/A control (pcg-off started twice); the launches per prefill step are counted under
# the profiler, exact on any host.

# %%
show.scope(engine)
engine_view.section(show.VIEW, engine, claims.ENGINE)

# %% [markdown]
# Where do piecewise graphs stop paying? A launch-bound prefill gains what the host spends
# launching kernels one by one; as each kernel carries more work, that share shrinks. The same 32
# Llama layers at hidden 512 to 4096 (`--json-model-override-args`, 0.5.13), the gain against the
# prefill's tokens, one panel per GPU model with the bare per-launch cost of its hosts: read off
# your own model's width and batch, as a range (the gain at short prefills moves between machines).

# %%
show.width_sweep(engine)

# %% [markdown]
# ### The rebuild beside the engine and the PR
#
# Three instruments answer "how much do piecewise graphs buy", and each times something else: the
# rebuild the forward alone of a 16-layer decoder that launches every op from Python; SGLang's
# `bench_one_batch` a whole prefill step around fewer, fused kernels; the PR the TTFT of the real
# Kimi-K2.5 under serving load. The launch counts come first: they do not change with the host.

# %%
engine_view.beside(show.beside_rows(run, engine))

# %% [markdown]
# ## Your own setup
#
# A prefill length and `--piecewise-cuda-graph-max-tokens` → the bucket it pads to (or eager above
# the largest capture) and what the recorded runs measured nearby, with the host's per-launch cost.
# Your own sizes on your own GPU: `sglab record pcg_gate --param token_counts=[...] --param
# max_tokens=N`.

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Takeaways and review points
#
# - With default flags SGLang turns piecewise graphs off for multimodal models before the gate is
#   asked: the PR changes Kimi-K2.5's prefill only for deployments that pass
#   `--enforce-piecewise-cuda-graph`.
# - The gate is a duck-typing check (`hasattr(model, "model")`), and its failure is a warning at
#   startup, not an error: a wrapper that names its LLM differently loses PCG without anyone
#   noticing except in TTFT.
# - Any alias that `nn.Module` sees as a `Module` value registers the LLM twice: `state_dict()`
#   doubles, a strict load of an HF-named checkpoint reports the alias keys missing, and a
#   checkpoint saved after the gate no longer loads into a fresh instance. A property avoids it
#   only until someone assigns the name, which the gate itself does; the guard works because it
#   sits in front of `nn.Module.__setattr__`, where a property setter sits behind it.
# - Review point: the guard silently drops every write to `model`, a deliberate one included. A
#   narrower alternative skips the write-back in the runner when `model.model is
#   resolve_language_model(model)` (later SGLang versions only write it back when it exists).
# - The payoff is largest where prefill is launch-bound (small token counts, narrow models) and
#   falls as GEMMs take over. It is the host's: scale it by your host's per-launch cost times the
#   multiple the appendix's launch-savings table shows (eager spends several times the bare launch
#   cost per kernel), and read the fastest repeat of several engine starts (07 explains why).
# - At Kimi-K2.5's real widths on one GPU, piecewise graphs do not cut serving TTFT. The prefill
#   step gains only for short prompts, too little of a TTFT to repeat from machine to machine, and
#   costs from about 1024 tokens, because a captured piece runs MLA attention absorbed (several
#   times the eager MHA attention's kernel time, the kernel table above); one TP-4 rank's narrower
#   shapes pay up to 1024 tokens. The PR's gain (TP 4) is the narrow shapes' regime: measure your
#   own TP size and prompt lengths before enforcing them, and review the capture cap against the
#   crossover.
# - The PR's own TPOT rises while TTFT falls. Here the decode step does not change with piecewise
#   graphs; TPOT moves only with several requests in flight, through the other requests' prefills.

# %% [markdown]
# ## Appendix
#
# ### The rebuilt gate, in full
#
# `ModelRunner.init_piecewise_cuda_graphs` as of the PR, rebuilt in upstream order (the
# attention-layer scan shortened to the shapes used here):

# %%
print(inspect.getsource(rebuild.init_piecewise_cuda_graphs))

# %% [markdown]
# ### Kimi-K2.5's 61 layers, estimated
#
# The full-width runs hold 2 of Kimi-K2.5's 61 layers. Scaling each measured prefill step by 61 ÷ 2
# assumes every layer costs and saves alike (the dense layer as a MoE one, embedding and logits
# folded in): a rough size for the whole model's prefill step, not a measurement. At TP 4 each
# rank runs the rank widths' rows and adds two all-reduces per layer; their time is the same with
# or without graphs, so they shrink the relative gain, while their launches are among those the
# graphs remove. Neither is measured here, and the PR's own gain is a TTFT under its traffic.

# %%
serving.estimate(engine)

# %% [markdown]
# ### The PR's own before → after at full width
#
# The release before the fix and the one with it, both started with
# `--enforce-piecewise-cuda-graph` in the same interleaved rounds: 0.5.12.post1's gate refuses the
# wrapper, so its prefill runs eager (and its attention as MHA), as piecewise graphs off do in
# 0.5.13. Each side is the median of the starts that answered; this run has no A/A control, so
# read its ratios against the control's gaps in the serving table above.

# %%
serving.before_after(engine)

# %% [markdown]
# ### The duplicate keys, one by one
#
# The key list of `property_only` after the gate: the LLM's keys under `language_model.*` and again
# under `model.*`. `named_parameters()` with its default de-duplication hides it; `state_dict()`
# and `named_parameters(remove_duplicate=False)` do not.

# %%
w, _, _ = gated("property_only")
keys = list(w.state_dict())
print(f"property_only: {len(keys)} keys, {sum(k.startswith('model.') for k in keys)} under "
      f"'model.'; named_parameters(): {len(list(w.named_parameters()))}, with duplicates: "
      f"{len(list(w.named_parameters(remove_duplicate=False)))}")
print("\n".join(keys))

# %% [markdown]
# ### The rebuild on one GPU: eager against piecewise prefill
#
# The shared decoder in bf16 (`measure.DEFAULT_PARAMS`) wrapped the Kimi way. The `no_alias`
# wrapper fails the gate, so its prefill is the plain forward, every op launched from Python; the
# `property_guard` wrapper passes, so its prefill runs through the piecewise runner (one graph per
# piece and bucket, one memory pool, the pieces handing activations over through fixed buffers).
# Latency is the device time of one prefill, forward only (CUDA events; warm-up, then 15 samples
# per point in three rounds that alternate the variants). Small prefills are launch-bound: the GPU
# waits for Python, so eager time there is the host's. Large prefills are GEMM-bound, and from
# 2048 tokens this runner's copy hand-off costs a few percent; the pieces that hand over their own
# tensors (`speedup_direct`) show the copies are the whole gap.

# %%
show.latency(run)

# %% [markdown]
# Small-prefill figures travel with their host: the run times a burst of tiny kernels (the host's
# per-launch cost) in the same interleaved rounds, and counts each prefill's launches under the
# profiler. Eager time is its launches at a few times that cost (`eager ÷ host cost`), and
# piecewise gains what the launches it removes cost (`gain explained`, near 1).

# %%
show.launches(run)

# %% [markdown]
# ### Does the piecewise path compute the same thing?
#
# `max_abs_diff` against the eager forward on the real tokens; `tolerance`, 8 bf16 units in the
# last place at the output's largest magnitude; `max_abs_diff_same_shape` against the same padded
# pieces run eagerly (a GEMM over 112 rows may pick another kernel than one over 100).

# %%
show.correctness(run)

# %% [markdown]
# ### In the profiler
#
# One traced prefill per variant at 64 tokens (launch-bound: the gaps between eager kernels are
# the GPU waiting for Python) and at 4096 tokens (GEMM-bound: the highlighted kernels are the
# hand-off copies, absent from `piecewise_direct`); then the trace's counts, the copies against
# piecewise's extra device time, and the per-kernel table of the eager prefill.

# %%
show.profiler(run)

# %% [markdown]
# ### The engine's prefill times and what the removed launches cost

# %%
show.engine_times(engine)

# %% [markdown]
# ### The claims
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# pcg_gate` does the same on the command line).

# %%
verdict(claims, run)
