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
# Upstream: [sgl-project/sglang#26382](https://github.com/sgl-project/sglang/pull/26382) (part A: the `.model`
# alias; part B, the allreduce-fusion workspace floor, is notebook 02). Rebuilt in `sglab.fixes.pcg_gate` around
# the shared decoder `sglab.core.toy_decoder`, measured by `sglab.experiments.pcg_gate`.

# %% tags=["parameters"]
MODE = "auto"   # "auto" | "live" | "recorded"
PARAMS = {}     # overrides of sglab.experiments.pcg_gate.DEFAULT_PARAMS for a live run

# %%
import inspect

import pandas as pd
from IPython.display import display

from sglab.core import notebook as nb
from sglab.sglang import upstream
from sglab.experiments import pcg_gate as experiment
from sglab.experiments.pcg_gate import figures, real
from sglab.fixes import pcg_gate as fx
from sglab.sglang import compare_old as compare, compare_old as report

pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 80)
wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% tags=["needs-gpu"]
if wb.live:
    wb.measure(lambda: experiment.run(PARAMS), params={**experiment.DEFAULT_PARAMS, **PARAMS},
               method_version=experiment.METHOD_VERSION)

# %%
shown = wb.shown()  # this session's live run, else the newest recorded run of each GPU model
nb.slide(experiment.EXPERIMENT, shown, figures.mechanism(figures.mechanism_facts(shown[-1] if shown else None)))

# %% [markdown]
# The picture reads left to right: how each wrapper defines `.model`, what the gate's `hasattr` test answers,
# what the gate's write-back does to the wrapper, and which keys `state_dict()` holds afterwards. The PR's
# KimiK25 wrapper is the last row.
#
# ## The problem
#
# At startup `ModelRunner.init_piecewise_cuda_graphs` decides whether prefill gets piecewise CUDA graphs (PCG).
# The PR-era gate, rebuilt line by line (the attention-layer scan is shortened to the shapes used here):

# %%
print(inspect.getsource(fx.init_piecewise_cuda_graphs))

# %% [markdown]
# Three things in it matter for a vision-language wrapper:
#
# | step | code | for `KimiK25ForConditionalGeneration` |
# |---|---|---|
# | gate | `hasattr(model, "model")` | the LLM is under `language_model` → **False** → "not a language model", PCG off |
# | write-back | `model.model = resolve_language_model(model)` | runs on every model that passed the gate |
# | layer stack | `getattr(model, "language_model", model)` then `.model.layers` | `language_model.model.layers` |
#
# The write-back is the trap. `torch.nn.Module.__setattr__` looks at the *value* first: a `Module` goes
# straight into `self._modules[name]`, before (instead of) any class attribute of that name is consulted. A
# `@property` — even one with a setter — never sees the assignment:

# %%
print(inspect.getsource(fx.KimiPropertySetter))
w = fx.build_wrapper("property_setter")
fx.KimiPropertySetter.setter_calls = 0
print("before:", len(w.state_dict()), "keys; _modules:", list(w._modules))
w.model = w.language_model                  # what the runner's write-back does
print("after: ", len(w.state_dict()), "keys; _modules:", list(w._modules),
      "| setter calls:", fx.KimiPropertySetter.setter_calls)

# %% [markdown]
# ## Rebuild: the wrappers through the gate (CPU, live)
#
# A Kimi-shaped wrapper (`vision_tower`, `mm_projector`, and the shared decoder as a 2-layer CausalLM under
# `language_model`, with `.model.layers[i].self_attn.attn`) in the variants of `sglab.fixes.pcg_gate`:
# `no_alias` (0.5.11 to 0.5.12.post1, just before the PR), `plain_alias` (`self.model =
# self.language_model.model` in `__init__`, as released in 0.5.10.x: the text model, not the whole CausalLM),
# `property_only`, `property_guard` (the PR), and `property_setter` (a property with a setter, which the PR author
# reports did not help either). The `plain_alias` variant once aliased the whole CausalLM (`self.language_model`);
# running the released 0.5.10.post1 class (next section) showed the release aliases its `.model`, so the rebuild
# now does the same and its `model.*` keys are the text model's (no `lm_head`), name for name.
#
# Each runs through the gate; then its `state_dict()` is saved and loaded strictly into a fresh instance (built,
# not yet gated: the state at weight-loading time), and a checkpoint with the HF naming (`language_model.*`
# only) is loaded strictly into the gated instance. Look at the `of which model.*` row and the two load rows.

# %%
experiment.variant_table().T

# %% [markdown]
# What the duplicate looks like: the key list of `property_only` after the gate. The LLM's keys appear under
# `language_model.*` and again under `model.*`; `named_parameters()` with its default de-duplication hides it,
# `state_dict()` and `named_parameters(remove_duplicate=False)` do not.

# %%
keys = experiment.state_dict_keys("property_only")
guarded = experiment.state_dict_keys("property_guard")
print(f"property_only : {len(keys)} keys, of which under 'model.': {sum(k.startswith('model.') for k in keys)}")
print(f"property_guard: {len(guarded)} keys, of which under 'model.': {sum(k.startswith('model.') for k in guarded)}")
print("\n".join(keys))

# %% [markdown]
# ### The guard's side effects
#
# Overriding `nn.Module.__setattr__` was the review's worry. Parameters, buffers, submodules and plain
# attributes still go through `super().__setattr__` and register as usual; swapping the LLM through
# `language_model` works and the alias follows. The cost is one name: a *legitimate* `wrapper.model = x` is
# dropped without an error.

# %%
experiment.guard_table()

# %% [markdown]
# ## The real SGLang, before and after
#
# Which releases carry the alias and the guard (read from the released wheels), and the released guard of the
# first release with it (0.5.13) beside the rebuilt wrapper:

# %%
compare.show_as_released(experiment.EXPERIMENT, fx.KimiPropertyGuard,
                         symbol="KimiK25ForConditionalGeneration.__setattr__")

# %% [markdown]
# The released class itself, run on the CPU, one process per release: each release's
# `KimiK25ForConditionalGeneration.__init__` around the rebuild's own 2-layer LLM (its vision tower and projector
# replaced by tiny modules), then the release's own gate on a stand-in model runner — `init_piecewise_cuda_graphs`
# up to 0.5.13, `cuda_graph_setup.capture_prefill_graph` in 0.5.23. "guard removed" is the real class with
# `nn.Module.__setattr__` put back: the property alone. Each row is checked name for name against the rebuild's
# variant for that release (gate decision, every `state_dict` key before and after the gate, `model` in
# `_modules`, the layer stack found); a single difference prints `MISMATCH` with the facts that differ.
#
# Recorded mode shows the answers recorded on the CPU box (`data/recorded/real_cpu/`, written by `sglab real record`;
# the tests check that they still equal a live run); `SGLAB_REAL=live` runs the installed releases here instead,
# about 8 s a release.

# %%
real_results = real.probe()  # recorded answers where they exist (SGLAB_REAL=live: run the releases now)
print(report.source_line(real_results))
real_checks = real.checks(real_results)
compare.show(real_checks, real.CLAIM)

# %%
compare.show_recorded(experiment.EXPERIMENT);

# %% [markdown]
# ## The payoff: eager prefill vs piecewise CUDA graphs (GPU)
#
# What the gate switches on, on one GPU: the shared decoder in bf16 (hidden 2048, 16 layers, 16 heads, MLP 5632,
# rotary positions — `experiment.DEFAULT_PARAMS`) wrapped the Kimi way. The `no_alias` wrapper fails the gate →
# prefill runs the plain forward, every op launched from Python. The `property_guard` wrapper passes → prefill
# runs through `fx.PiecewiseRunner`: one CUDA graph per segment between two attention calls (17 for 16 layers),
# attention eager on the real token count; one set of graphs per token-count bucket of the upstream list (50
# buckets from 4 to 4096 tokens), a prefill padded to the smallest bucket that holds it; every capture in one
# graph memory pool, the segments handing activations over through fixed buffers.
#
# Latency is the device time of one prefill (CUDA events; warm-up, then 15 samples per point in three rounds
# that alternate the variants). The buckets and the padding of the measured token counts:

# %%
bucket_list = fx.piecewise_cuda_graph_tokens(experiment.DEFAULT_PARAMS["max_tokens"])
print(f"{len(bucket_list)} buckets: {bucket_list}")
print({n: fx.bucket_for(n, bucket_list) for n in experiment.DEFAULT_PARAMS["token_counts"]})

# %%
for r in shown:
    print(experiment.run_summary(r))
    lat = experiment.latency_table(r.df)
    display(lat[[c for c in lat.columns if c.endswith(" ms") or c in ("bucket", "speedup", "speedup_direct")]].round(3))
if not shown:
    print("No run to show: the latency comparison needs a GPU run (`sglab record pcg_gate`).")

# %%
if shown:
    display(figures.latency(shown))

# %% [markdown]
# Reading the curves:
#
# - **Small prefills are launch-bound.** The eager median barely moves from 16 to 1024 tokens: the GPU waits for
#   Python to launch the next kernel, so eager latency here measures the host. The piecewise path launches 17
#   graphs and the attention calls per prefill, so it too is flat at small counts, several times lower.
# - **Large prefills are GEMM-bound**, and graphs have little left to remove. From 2048 tokens the piecewise path
#   is a few percent *slower*, a gap that grows with the token count, as a copy would. The printout below
#   converts the copy hand-off's traffic (`buffer_copy_bytes`) and the gap into the bandwidth the copies would
#   need to explain it all; runs from method 2 on also time pieces that hand over their own tensors (no copies:
#   `speedup_direct`), which settles it — see the profiler section.

# %%
for r in shown:
    print(experiment.reading(r))

# %% [markdown]
# ### Does the piecewise path compute the same thing?
#
# `max_abs_diff` is the largest element-wise difference of the final hidden states against the eager forward
# on the real tokens; `tolerance` is 8 bf16 units in the last place at the output's largest magnitude;
# `rel_rms_diff` is the RMS of the difference over the RMS of the eager output. `max_abs_diff_same_shape`
# compares against the same padded segments run eagerly: it separates what graph replay changes from what
# padding changes (a GEMM over 112 rows may pick a different kernel, and so a different summation order, than
# one over 100).

# %%
if shown:
    cols = ["bucket", "max_abs_diff", "rel_rms_diff", "max_abs_diff_same_shape", "tolerance", "within_tol"]
    display(pd.concat({c: experiment.by_gpu(shown, c) for c in cols}, axis=1))
for r in shown:
    print(experiment.correctness(r))

# %% [markdown]
# ## See it in the profiler
#
# A separate traced pass after the timed ones (torch.profiler; it never feeds the timings): one prefill per
# variant at 64 tokens (launch-bound) and at 4096 tokens (GEMM-bound). At 64 tokens, look at the gaps between
# the eager kernels on the stream lane — the GPU idles while Python launches the next op — and at the
# piecewise lanes, where graph launches pack the kernels together. At 4096 tokens the highlighted kernels are
# the hand-off copies: present in `piecewise`, absent from `piecewise_direct`.

# %%
for r in shown:
    if r.sidecar("events") is None:
        print(f"{r.label}: this run predates profiler traces; a new recording (`sglab record pcg_gate`) adds them.")
        continue
    for n in sorted(experiment.trace_table(r.df).index.get_level_values(0).unique()):
        display(figures.timeline(r, int(n)))
    display(experiment.trace_table(r.df).round(1), experiment.copy_explanation(r.df).round(3))

# %% [markdown]
# The tables under the timelines count, per prefill: kernels on the device and launches on the host, device
# busy time against the device-side span of the forward (`busy`: the share the GPU was working), and the copy
# kernels and memcpys. `copy_explanation` compares the extra device time of piecewise over eager with the extra
# copy time: where the second is most of the first, the slowdown is the hand-off through fixed buffers — a cost
# of this rebuild's runner, which upstream's torch.compile pieces avoid by handing over their own outputs.
#
# ### Per kernel: the eager prefill
#
# nsight-python (CUPTI) times every kernel of the eager prefill at 4096 tokens, and of the same pieces run
# eagerly with their copies; it cannot attribute the kernels of a graph replay, so only eager work is measured
# here. The kernel counts are checked against torch.profiler's (claim `kernel_counts_agree`).

# %%
for r in shown:
    table, kt = r.sidecar("kernels"), r.manifest.get("kernel_table") or {}
    if table is None:
        print(f"{r.label}: no per-kernel table in this run (it predates them).")
        continue
    print(f"{r.label}: measured with {kt.get('backend')} — {kt.get('reason')}")
    display(experiment.kernel_summary(table).round(3))

# %% [markdown]
# ## The installed SGLang
#
# Read as source (not imported): does `models/kimi_k25.py` of the installed SGLang carry the `model` property
# and the `__setattr__` guard? (SGLang has moved on since the PR: later versions resolve the language model
# without requiring `.model`, but the Kimi wrapper kept the alias.)

# %%
v = upstream.check(__import__("sglab.pcg_gate.sglang", fromlist=["FIX"]).FIX)
print(f"{v.status}: {v.detail}")

# %% [markdown]
# ## Verdict
#
# Every claim of `sglab.experiments.pcg_gate.claims`, checked on each run shown (`sglab verify pcg_gate` does
# the same from the command line).

# %%
nb.verdict(experiment.EXPERIMENT, shown)

# %% [markdown]
# ## Takeaways and review points
#
# - The gate is a duck-typing check (`hasattr(model, "model")`), and its failure is a warning at startup, not an
#   error: a wrapper that names its LLM differently loses PCG without anyone noticing except in TTFT.
# - Any alias that `nn.Module` sees as a `Module` value registers the LLM twice: `state_dict()` and
#   `named_parameters(remove_duplicate=False)` double, a strict load of an HF-named checkpoint reports the
#   alias keys missing, and a checkpoint saved after the gate no longer loads into a fresh instance. A class
#   property avoids it only until someone assigns the name — which the gate itself does.
# - The guard works because it sits in front of `nn.Module.__setattr__`; a property setter sits behind it and is
#   never reached for a `Module` value.
# - Review point: the guard silently drops every write to `model`, including a deliberate one. A narrower
#   alternative is to skip the write-back in the runner when `model.model is resolve_language_model(model)`
#   (later SGLang versions no longer require `.model` in the gate and only write it back when it exists).
# - The payoff is largest where prefill is launch-bound (small token counts) and falls as GEMMs take over. The
#   eager path here launches plain PyTorch ops (no fused RoPE / residual-RMSNorm kernels), so its kernel count
#   per layer is higher than SGLang's, which puts this measurement at the generous end for small prefills; the
#   small-prefill ratio also depends on the host CPU, since eager latency there is launch time.
# - Large prefills: this runner's copy hand-off costs a few percent from 2048 tokens (the profiler section and
#   the `copies_explain_slowdown` claim measure how much of the gap the copies are); it is not a cost of piecewise
#   graphs as such.
