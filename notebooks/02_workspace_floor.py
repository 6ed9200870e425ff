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
# # 02 · The allreduce-fusion workspace floor: `max(x.shape[0], 2048)`
#
# Upstream: [sgl-project/sglang#26382](https://github.com/sgl-project/sglang/pull/26382) (part B). Rebuilt in
# `sglab.fixes.workspace_floor` (manager, call site, FlashInfer's IPC creation); measured by
# `sglab.experiments.workspace_floor` (trace replay on 2-4 GPUs, creation cost, profiler trace).

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of experiment.DEFAULT_PARAMS for a live run, e.g. {"world_size": 4}

# %%
import pandas as pd
from IPython.display import display

from sglab.core import notebook as nb
from sglab.experiments import workspace_floor as experiment
from sglab.experiments.workspace_floor import analysis, figures, real, text, traces
from sglab.fixes import workspace_floor as wf
from sglab.sglang import compare_old as report

pd.set_option("display.width", 160)
params = {**experiment.DEFAULT_PARAMS, **PARAMS}
wb = nb.Workbook(experiment.EXPERIMENT, gpus=int(params["world_size"]), mode=MODE)

# %% tags=["needs-gpu"]
if wb.live:
    wb.measure(lambda: experiment.run(params), params=params, method_version=experiment.METHOD_VERSION,
               gpu_count=int(params["world_size"]))

# %%
shown = wb.shown()
nb.slide(experiment.EXPERIMENT, shown, figures.mechanism(shown))

# %% [markdown]
# The picture follows one cold server warming up on short prompts. The grey line is `x.shape[0]` per forward
# step; each coloured staircase is the workspace size a policy holds, and each mark is one re-creation (its area
# is the workspace's MiB per rank, its label the size in tokens and, where a GPU run is shown, the ms it blocked
# every rank). With `x.shape[0]` the workspace is rebuilt at every new maximum; with the floor it is built once,
# at 2048 tokens, and never again on this trace.
#
# ## The problem
#
# `layernorm.py::_forward_with_allreduce_fusion` calls `flashinfer_allreduce_residual_rmsnorm`, which calls
# `ensure_workspace_initialized(max_token_num, token_num=x.shape[0])`. The workspace is (re)created when
#
# | condition | PR-era code |
# |---|---|
# | not initialised | `not workspace_manager.initialized` |
# | world size / rank / group changed | `workspace_manager.world_size != world_size or ...` |
# | too small for this batch | `not is_buffer_size_sufficient(token_num=x.shape[0], ...)` |
#
# and `initialize` then builds it for `max(max_token_num, _max_token_num_seen)` tokens. A creation is
# FlashInfer's `trtllm_create_ipc_workspace_for_all_reduce_fusion`: three buffers per rank (sizes below), each
# exported as a CUDA IPC handle, all-gathered, opened by every peer; a Lamport fill; a pointer table; barriers.
# It blocks the host on every rank and cannot run inside CUDA-graph capture.
#
# Before the PR the call passed no `max_token_num` (the callee's default, 2048, with
# `assert input_tensor.shape[0] <= max_token_num`); after it, `max(x.shape[0], 2048)`. Which released SGLang
# has the floor (read in the released wheels, `data/upstream/releases.csv`), and the released call site beside
# the rebuilt policy:

# %%
from sglab.sglang import wheels as upstream_figures, hunks

upstream_figures.timeline_row_figure(experiment.EXPERIMENT)

# %%
hunks.beside(experiment.EXPERIMENT, wf.Policy.max_token_num)

# %%
analysis.sizes_table(world_sizes=(2, 4), hidden_dim=params["hidden_dim"])

# %% [markdown]
# ## Rebuild: the re-create rule, before and after
#
# `sglab.fixes.workspace_floor` mirrors `FlashInferWorkspaceManager` / `ensure_workspace_initialized`
# (`flashinfer_comm_fusion.py`) and the call site (`layernorm.py`). The policies differ only in what the call
# site passes as `max_token_num` (and whether the manager keeps its high-water mark). A hand-made sequence of
# batch sizes, with a creator that allocates nothing:

# %%
analysis.demo_table([1, 2, 1, 4, 3, 300, 2048, 2049, 100, 4096, 5000], world_size=4,
                    hidden_dim=params["hidden_dim"])

# %% [markdown]
# Because the sufficiency check already makes the workspace grow-only, a policy re-creates exactly at the
# *new records* of `max(x.shape[0], floor)`: the high-water mark changes nothing here (it matters only after
# a cleanup). A floor removes every record below it, at the price of a workspace that is never smaller than
# the floor.
#
# ## Two traces
#
# Token counts the call site sees per forward step of a small seeded serving simulation (`generate_trace`:
# Poisson arrivals with bursts, chunked prefill of 4096, extend batches padded to piecewise-graph buckets up
# to 4096, decode batches of up to 256). `mixed`: prompts of ~1200 tokens; `short_ramp`: a cold server
# warming up on ~48-token prompts. Both are stored in `data/traces/`; the table below regenerates each from its
# stored parameters and compares it byte for byte.

# %%
traces.summary()

# %% [markdown]
# ## Re-creations along the full traces (exact, on the CPU)
#
# Cold start (the first call creates) and with SGLang's `pre_initialize_workspaces(max_token_num=2048)`
# ahead of CUDA-graph capture. `recreations` counts every creation a trace call triggers, the first one of a
# cold start included (the pre-initialisation itself is not counted).

# %%
sim = experiment.simulated_frame((2, 4))
analysis.counts_table(sim, world_size=4)

# %% [markdown]
# The steps at which a policy re-creates do not depend on the world size (only the bytes do); the step axis
# is symlog because every re-creation falls in the warm-up. Then memory against re-creations, per policy.

# %%
figures.simulated_events(sim, world_size=4)

# %%
figures.simulated_tradeoff(sim, world_sizes=(2, 4))

# %%
print("\n".join(text.floor_effect(sim, (2, 4))))

# %% [markdown]
# ## The real SGLang, before and after
#
# The same traces through the released code: each release's own call site
# (`layernorm.py::_forward_with_allreduce_fusion`), the real `flashinfer_allreduce_residual_rmsnorm` with its
# assert, `ensure_workspace_initialized`, `FlashInferWorkspaceManager` and `pre_initialize_workspaces`, one
# subprocess per release (`sglab.sglang.probes.workspace_floor`). Only FlashInfer's workspace creation is replaced,
# by a recorder that answers the size check with FlashInfer's rule, and the GPU preflight vote by "proceed".
# Besides its own call site, each release's callee also runs the floors 0 and 1024. The rebuild runs the same
# cells with the policy of that call site and a manager like the release's; `agrees` needs equal re-creation
# steps, sizes and refused calls.
#
# Recorded mode shows the answers recorded on the CPU box (`data/recorded/real_cpu/`, written by `sglab real record`;
# the tests check that they still equal a live run); `SGLAB_REAL=live` runs the installed releases here instead,
# about 8 s a release.

# %%
real_results = real.probe()
print(report.status_lines(real_results))
real_table = real.comparison(real_results)
report.check_table(real_table, what="(release, call site, trace, scenario) cells")
print(real.high_water_note(real_results))
real_table

# %% [markdown]
# The rebuild's manager keeps a high-water mark by default (`high_water=True`): the line above says whether
# these releases' managers have it, from which installed release on SGLang's manager keeps one, and whether it
# changes any count here.
#
# On GPUs, the real FlashInfer workspace created along the same trace (milliseconds and MiB per rank beside the
# rebuild's), where such a run is recorded:

# %%
from sglab.sglang import compare_old as compare  # noqa: E402

compare.show_recorded(real.RECORDED);

# %% [markdown]
# ## Measured: the same replay with real workspaces on the GPUs
#
# Each rank runs the manager with `IpcWorkspaceCreator`: `cudaMalloc` of the three buffers,
# `cudaIpcGetMemHandle`, all-gather of the handles over the gloo group, `cudaIpcOpenMemHandle` of every peer,
# the Lamport fill (-0.0), the flag word and pointer table, barriers, a free-memory vote before and a CPU
# all-reduce after (as SGLang does); destroying closes the peers' mappings, frees and barriers. Times are host
# wall-clock per rank; tables show the slowest rank. The runs shown are the newest per world size.

# %%
runs_ = wb.results()
by_w = analysis.newest_per_world(shown)
for W, r in by_w.items():
    print(f"\nW={W}: {r.path.name} ({r.label}) - GPU replay per policy (ms and MiB: slowest rank)")
    display(analysis.policy_stats(r).round(1))
    print(text.consistency(r))

# %% [markdown]
# The GPU replay re-creates exactly where the simulation says, and the memory each rank holds after a creation
# (`cudaMemGetInfo` against its baseline) is FlashInfer's three aligned buffers plus one 2 MiB segment.
# Along the traces, each dot is one re-creation on the GPUs, its area the ms it blocked the ranks:

# %%
for name in experiment.TRACES:
    display(figures.gpu_events(by_w, name))

# %%
figures.gpu_tradeoff(by_w)

# %% [markdown]
# **What one creation costs.** A sweep over the workspace size T (sizes alternate in rounds, median and p10-p90
# of every rank's samples, slowest rank): flat up to a size, then a step, at the same Lamport buffer size for
# every world size.

# %%
display(figures.cost(runs_, by_w))
for W, r in by_w.items():
    print(f"\nW={W}: median ms per creation phase (slowest rank)")
    display(analysis.phase_table(r).round(2))
    print(text.cost_step(r))

# %% [markdown]
# **Repeatability.** A world size recorded more than once: the same cells side by side (ratio newest / oldest).

# %%
for W in sorted({analysis.run_world_size(r) for r in runs_}):
    if sum(analysis.run_world_size(r) == W for r in runs_) > 1:
        display(analysis.repeatability_table(runs_, W).round(2))
print("\n".join(line for r in by_w.values() for line in text.policies(r)))

# %% [markdown]
# **Leak check**, every run and rank: MiB above the baseline after the warm-up creation, after each policy's
# final destroy (max over policies) and at the end of the timed passes (`cudaMemGetInfo` and NVML, own GPU and
# any other GPU), then the rank processes and their GPU memory once the run had returned.

# %%
leak = analysis.leak_table(runs_)
display(leak)
print(text.leak(leak, len(runs_)))

# %% [markdown]
# ## See it in the profiler
#
# A separate pass after the timed ones replays the same cold-start short-prompt trace under `torch.profiler` on
# every rank, once with `x.shape[0]` and once with the floor. Every re-creation is one `recreate workspace`
# range; inside it, sub-ranges for each phase (`alloc`, `ipc get handle`, `exchange handles`, `ipc open`,
# `lamport fill`, `barrier`, `destroy old workspace`) and the CUDA calls they make. Below: rank 0's re-creations
# back to back (the replay between them cut), IPC handle opens highlighted.

# %%
traced = [r for r in shown if r.sidecar("events") is not None]
for r in shown:
    if r.sidecar("events") is None:
        print(f"{r.path.name}: " + text.NO_TRACE.format(mv=r.manifest.get("method_version")))
for r in traced:
    display(figures.profile_overview(r.sidecar("events"), run=r))
    display(analysis.trace_recreation_table(r.sidecar("events")).round(1))

# %% [markdown]
# The count of `recreate workspace` ranges per rank equals the simulation's count (a claim below), and the time
# inside them is the policy's cost read from the trace. Per rank, the CUDA calls inside the re-creations
# (calls per creation, median µs per call):

# %%
for r in traced:
    ev = r.sidecar("events")
    for rank in sorted(ev["rank"].unique()):
        print(f"{r.path.name}, rank {rank}")
        display(analysis.call_table(ev, rank=int(rank)).round(1))

# %% [markdown]
# **Why the creation cost steps up between 336 and 672 MiB Lamport buffers.** The traced pass also creates one
# workspace per size of the cost sweep. Left: where each creation's time goes; right: one IPC open per buffer
# against the size of that buffer.

# %%
for r in traced:
    ev, W, H = r.sidecar("events"), analysis.run_world_size(r), analysis.run_hidden(r)
    display(figures.profile_step(ev, world_size=W, hidden_dim=H, run=r))
    print("\n".join(text.trace_step(ev, world_size=W, hidden_dim=H) + [text.first_open(ev)]))
if not traced:
    print("no shown run has a trace; from the phase timings alone: " + "; ".join(text.cost_step(r) for r in shown))

# %% [markdown]
# Read the lines above as a diagnosis: the phase that carries the step, the one CUDA call inside it, and whether
# that call's cost follows the total bytes mapped or the size of the one allocation it opens (compare the data
# buffer at its largest with the Lamport buffer on either side of the step). Phases that grew by less than a
# tenth of the step are ruled out as its cause. The per-rank lists of long calls show whether the ranks' slow
# opens run side by side or one rank waits in an unrelated call (a 20-byte `cudaMalloc`, say) while the other's
# open finishes. The last line separates a per-creation cost (the first open of a peer's memory after the
# previous destroy closed every mapping) from a per-buffer one.

# %% [markdown]
# ## Your own setup
#
# The simulator on a generated cold start (the stored short-prompt scenario, with the median prompt length you
# pick): re-creations, estimated host-blocking time (from the recorded creation cost) and peak MiB per rank for
# your floor next to no floor, the PR's 2048 and the call before the PR, at your world size.
#
# Your own traffic (token counts per forward step as CSV, or an SGLang server log) on the command line:
# `sglab workspace --trace FILE --world-size W --hidden H`

# %%
from sglab.investigate import widgets

widgets.workspace_floor()

# %% [markdown]
# ## Verdict

# %%
nb.verdict(experiment.EXPERIMENT, shown)

# %% [markdown]
# ## Takeaways and review points
#
# - The PR-era manager is grow-only (it re-creates only when a batch does not fit, and sizes to the largest
#   request), so `x.shape[0]` alone re-creates once per *new maximum*, not per fluctuation. Churn is a
#   warm-up phenomenon: it shows on a cold server whose batches grow slowly (`short_ramp`) and not beyond the
#   first steps once a chunked prefill has hit the chunk size (`mixed`).
# - The 2048 floor removes every re-creation below 2048 tokens and costs a workspace of the 2048 size from the
#   first call (the sizes table; SGLang keeps two, attention-TP and MoE-TP). On `mixed`, whose first batch is
#   already above 2048, it removes none.
# - With `pre_initialize_workspaces(2048)` before graph capture, the floor changes nothing on these traces:
#   the pre-initialisation already holds that memory. The floor protects paths that skip the
#   pre-initialisation, and batches above 2048 still re-create under every policy.
# - One creation costs milliseconds per rank, host-blocking on all ranks at once, and grows with the world size.
#   It steps up once the Lamport buffer passes a size between 336 and 672 MiB (the IPC open of that one
#   allocation); a floor that lands a workspace above it (4096 at W=4) pays the step on every creation.
# - Review: before the PR, calls above 2048 tokens trip the callee's assert in this replay (the `refused`
#   column); whether such calls reach the fused path in SGLang depends on the caller's own batch-size gate, which
#   this notebook does not model. Whether the 2048 figure should follow `FUSE_ALLREDUCE_MAX_BATCH_SIZE` / the
#   largest piecewise bucket instead of being a literal. FlashInfer releases after the legacy `cudaIpc` path
#   create the workspace through other transports (symmetric memory); the creator interface lets FlashInfer's
#   own creation run along the same trace beside this rebuild.
