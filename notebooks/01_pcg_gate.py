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
# **Claim.** SGLang enables piecewise CUDA graphs (PCG) for prefill only for a model with a `.model`
# attribute. Kimi-K2.5's vision-language wrapper keeps its LLM under `language_model`, so PCG was silently off
# and every prefill ran eagerly. A read-only `model` property lets the wrapper pass; only a `__setattr__` guard
# keeps the runner's write-back `wrapper.model = ...` from registering the whole LLM a second time.
#
# Upstream: [sgl-project/sglang#26382](https://github.com/sgl-project/sglang/pull/26382) (part A: the `.model`
# alias; part B, the allreduce-fusion workspace floor, is notebook 02). The PR reports, on 4×B200 with
# Kimi-K2.5, mean TTFT 0.479 s → 0.147 s. Rebuilt in `sglab.fixes.pcg_gate`, measured by
# `sglab.experiments.pcg_gate`.

# %% tags=["parameters"]
MODE = "auto"   # "auto" | "live" | "recorded"
PARAMS = {}     # overrides of sglab.experiments.pcg_gate.DEFAULT_PARAMS for a live run

# %%
import inspect

import pandas as pd
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
from torch import nn

from sglab import notebook as nb
from sglab import plots, upstream
from sglab.experiments import pcg_gate as experiment
from sglab.fixes import pcg_gate as fx

pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 80)
wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% [markdown]
# ## The problem
#
# At startup `ModelRunner.init_piecewise_cuda_graphs` decides whether prefill gets piecewise CUDA graphs. The
# PR-era gate, rebuilt line by line (the attention-layer scan is shortened to the shapes used here):

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
class WithSetter(nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.language_model = nn.Linear(2, 2)

    @property
    def model(self):
        return self.language_model

    @model.setter
    def model(self, value):
        WithSetter.calls += 1


w = WithSetter()
print("before:", list(w.state_dict()))
w.model = w.language_model                  # what the runner's write-back does
print("after: ", list(w.state_dict()))
print("setter calls:", WithSetter.calls, "| '_modules' now holds:", list(w._modules))

# %% [markdown]
# ## Rebuild: four wrappers through the gate (CPU, live)
#
# A Kimi-shaped wrapper (`vision_tower`, `mm_projector`, and a small CausalLM under `language_model` with
# `.model.layers[i].self_attn.attn`) in the variants of `sglab.fixes.pcg_gate`:
#
# - `no_alias` — upstream before the PR;
# - `plain_alias` — `self.model = self.language_model` in `__init__` (the pattern of InternVL and of the
#   earlier Kimi attempt #20747);
# - `property_only` — `@property model`;
# - `property_guard` — the PR: the property plus `__setattr__` returning early for `name == "model"`;
# - `property_setter` — extra row: a property with a setter, which the PR author reports did not help either.
#
# Each runs through the gate; then its `state_dict()` is saved and loaded strictly into a fresh instance
# (built, not yet gated: the state at weight-loading time), and a checkpoint with the HF naming
# (`language_model.*` only) is loaded strictly into the gated instance.

# %%
table = experiment.variant_table()
table.T

# %% [markdown]
# What the duplicate looks like: the key list of `property_only` after the gate (the LLM's nine tensors appear
# under `language_model.*` and again under `model.*`; `named_parameters()` with its default de-duplication hides
# it, `state_dict()` and `named_parameters(remove_duplicate=False)` do not):

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
# ## The payoff: eager prefill vs piecewise CUDA graphs (GPU)
#
# What the gate switches on, on one GPU: a bf16 decoder (hidden 2048, 16 layers, 16 heads, MLP 5632 — see
# `experiment.DEFAULT_PARAMS`) wrapped the Kimi way. The `no_alias` wrapper fails the gate → prefill runs the
# plain forward, every op launched from Python. The `property_guard` wrapper passes → prefill runs through
# `PiecewiseRunner`:
#
# - one CUDA graph per segment between two attention calls (17 segments for 16 layers); attention runs eagerly
#   on the real token count;
# - one set of graphs per token-count bucket of the upstream list (`--piecewise-cuda-graph-max-tokens 4096`:
#   50 buckets from 4 to 4096), a prefill padded to the smallest bucket that holds it;
# - every capture in one shared graph memory pool (segments exchange data through fixed buffers, so nothing
#   allocated inside a capture has to outlive it).
#
# Token counts 16…4096, including three that need padding (100 → 112, 1000 → 1024, 3000 → 3072). Latency is
# the device time of one prefill (CUDA events; warm-up, then 30 samples per point in three rounds that
# alternate eager and piecewise). Correctness: the piecewise output against the eager one, for every token count.

# %%
bucket_list = fx.piecewise_cuda_graph_tokens(experiment.DEFAULT_PARAMS["max_tokens"])
print(f"{len(bucket_list)} buckets: {bucket_list}")
print({n: fx.bucket_for(n, bucket_list) for n in experiment.DEFAULT_PARAMS["token_counts"]})

# %% tags=["needs-gpu"]
if wb.live:
    wb.measure(lambda: experiment.run(PARAMS), params={**experiment.DEFAULT_PARAMS, **PARAMS},
               method_version=experiment.METHOD_VERSION)

# %%
runs_ = wb.results()
shown = experiment.newest_per_gpu(runs_)  # one run per GPU model: the newest
lats = {experiment.gpu_short(r): experiment.latency_table(r.df) for r in shown}
if shown:
    print("shown below: the newest run of each GPU —", "; ".join(r.label for r in shown))
    for r in shown:
        gpu, lat, facts = experiment.gpu_short(r), lats[experiment.gpu_short(r)], experiment.run_facts(r.df)
        on_off = {1.0: "PCG on", 0.0: "PCG off"}
        print(f"\n{r.label}: gate for no_alias → {on_off[facts[('eager', 'gate_enabled')]]} (eager prefill), "
              f"for property_guard → {on_off[facts[('piecewise', 'gate_enabled')]]} (piecewise prefill)")
        print(f"  capture: {facts[('piecewise', 'graphs')]:.0f} graphs ({facts[('piecewise', 'buckets')]:.0f} buckets) "
              f"in {facts[('piecewise', 'capture_time')]:.1f} s; graph pool {facts[('piecewise', 'graph_pool')]:.0f} MiB, "
              f"fixed buffers {facts[('piecewise', 'static_buffers')]:.0f} MiB, weights "
              f"{facts[('eager', 'weights')]:.0f} MiB"
              + (f", peak allocated {facts[('process', 'peak_allocated')]:.0f} MiB"
                 if ("process", "peak_allocated") in facts else ""))
        if ("eager", "kernels_per_forward") in facts:
            ke, kp = facts[("eager", "kernels_per_forward")], facts[("piecewise", "kernels_per_forward")]
            launches = facts[("piecewise", "graph_launches_per_forward")]
            print(f"  kernels per forward at {lat.index.min()} tokens: eager {ke:.0f}, each launched from Python; "
                  f"piecewise {kp:.0f} ({kp - ke:+.0f} net: copies into and out of the fixed buffers), launched as "
                  f"{launches:.0f} graph replays + {launches - 1:.0f} eager attention calls")
        display(lat[[c for c in lat.columns if c.endswith(" ms") or c in ("bucket", "speedup")]].round(3))
else:
    print("No run to show: the latency comparison needs a GPU run (`sglab record pcg_gate`).")

# %%
if shown:
    fig, axes = plots.figure(ncols=2, width=11.5)
    ax, ax2 = axes.flat
    for (gpu, lat), color in zip(lats.items(), plots.CYCLE):
        x = lat.index.values
        for mode, style in (("eager", "s--"), ("piecewise", "o-")):
            ax.plot(x, lat[f"{mode} median ms"], style, color=color, label=f"{gpu} {mode}",
                    mfc="white" if mode == "eager" else color)
            ax.fill_between(x, lat[f"{mode} p10 ms"], lat[f"{mode} p90 ms"], color=color, alpha=0.12)
        ax2.plot(x, lat["speedup"], "o-", color=color, label=gpu)
    top = pd.concat([lat["speedup"] for lat in lats.values()], axis=1).max(axis=1)
    for n, b in next(iter(lats.values()))["bucket"].items():
        if b != n:  # padded token counts
            ax2.annotate(f"pad→{b}", (n, top[n]), textcoords="offset points", xytext=(0, 6), ha="center",
                         fontsize=7, color="#555555")
    ax.set(xscale="log", yscale="log", xlabel="prefill tokens (one sequence)", ylabel="prefill latency (ms)",
           title="Prefill latency: eager (dashed) vs piecewise CUDA graphs")
    ax.legend(ncol=2)
    ax2.axhline(1.0, color="#999999", lw=1)
    ax2.set(xscale="log", xlabel="prefill tokens (one sequence)", ylabel="eager / piecewise (median latency)",
            title="Speed-up from passing the gate")
    ax2.legend()
    for a in (ax, ax2):
        a.xaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_major_formatter(ScalarFormatter())
        a.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    plots.caption(fig, shown[0], extra="; ".join([plots.provenance_text(r) for r in shown[1:]]
                                                 + ["bands: p10–p90"]))

# %% [markdown]
# Reading the curves:
#
# - **Small prefills are launch-bound.** The eager median barely moves from 16 to 1024 tokens: the GPU waits for
#   Python to launch the next kernel, so eager latency here measures the host, and the speed-up at small token
#   counts is mostly host launch time removed. The piecewise path still launches one graph and one eager
#   attention call per layer, so it too is flat at small counts.
# - **Large prefills are GEMM-bound**, and graphs have nothing left to remove. Above the crossover the piecewise
#   path is slightly *slower*; the gap grows with the token count, as a copy would. The runner copies the
#   residual and q, k, v into its fixed buffers and the attention output once more (`buffer_copy_bytes`);
#   the cell below converts that traffic and the gap into the bandwidth the copies would need to explain it all.
#   A figure near the GPU's HBM bandwidth makes the copies the likely cause, which would make the slowdown a cost
#   of this rebuild's runner (it hands activations between graphs through fixed buffers), not of piecewise
#   graphs as such; a run without the copies would settle it.

# %%
if shown:
    for r in shown:
        gpu, lat = experiment.gpu_short(r), lats[experiment.gpu_short(r)]
        sp, small = lat["speedup"], lat[lat.index <= 1024]
        start = experiment.slowdown_start(sp)
        print(f"{gpu}: eager/piecewise {sp.min():.2f}x to {sp.max():.2f}x (max at {sp.idxmax()} tokens); eager median "
              f"{small['eager median ms'].min():.2f}-{small['eager median ms'].max():.2f} ms over "
              f"{small.index.min()}-{small.index.max()} tokens, piecewise "
              f"{small['piecewise median ms'].min():.2f}-{small['piecewise median ms'].max():.2f} ms")
        if start is not None:
            for n in lat.index[lat.index >= start]:
                gap_ms = lat.loc[n, "piecewise median ms"] - lat.loc[n, "eager median ms"]
                moved = experiment.buffer_copy_bytes(r.manifest["params"], lat.loc[n, "bucket"])
                print(f"    {n:5d} tokens: piecewise {gap_ms:+.2f} ms ({sp[n]:.2f}x); buffer copies move "
                      f"{moved / 1e9:.2f} GB = {moved / 1e12 / (gap_ms / 1e3):.1f} TB/s if they were the whole gap")

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
    cols = ["max_abs_diff", "rel_rms_diff", "max_abs_diff_same_shape", "tolerance", "within_tol"]
    check = pd.concat({c: experiment.by_gpu(shown, c) for c in cols}, axis=1)
    check.insert(0, ("bucket", ""), next(iter(lats.values()))["bucket"])
    display(check)
    for gpu, lat in lats.items():
        nonzero = lat.index[lat["max_abs_diff"] > 0].tolist()
        verdict = "within" if lat["within_tol"].all() else "NOT within"
        print(f"{gpu}: piecewise vs eager {verdict} bf16 tolerance at all {len(lat)} token counts; "
              f"largest difference {lat['max_abs_diff'].max():.3g} (tolerance {lat['tolerance'].min():.3g}); "
              + (f"bit-identical except at {nonzero} tokens; " if nonzero else "bit-identical at every count; ")
              + f"vs the same padded shape: largest {lat['max_abs_diff_same_shape'].max():.3g}")

# %% [markdown]
# ## The installed SGLang
#
# Read as source (not imported): does `models/kimi_k25.py` of the installed SGLang carry the `model` property
# and the `__setattr__` guard? (SGLang has moved on since the PR: later versions resolve the language model
# without requiring `.model`, but the Kimi wrapper kept the alias.)

# %%
v = upstream.check(experiment.EXPERIMENT)
print(f"{v.status}: {v.detail}")

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
# - The payoff is largest where prefill is launch-bound (small token counts), falls as GEMMs take over, and
#   crosses below 1 at the largest counts, where this runner's buffer copies likely cost more than the launches
#   it saves (ranges and crossover per GPU in the cells above). The eager path here launches from plain PyTorch
#   ops (no fused RoPE / residual-RMSNorm kernels), so its kernel count per layer is higher than SGLang's, which
#   puts this measurement at the generous end for small prefills; the small-prefill ratio also depends on the
#   host CPU, since eager latency there is launch time.
# - Doubtful points in the data: on both GPUs eager is slower at 16–100 tokens than at 128. The kernel count
#   was recorded only at the smallest token count, so this run cannot say whether small GEMMs launch extra
#   kernels (e.g. split-K) or the host was slower early in the sweep (the counts run in ascending order). Where
#   a p10–p90 band is wide (see the tables), that point's ratio rests on a noisy median.
