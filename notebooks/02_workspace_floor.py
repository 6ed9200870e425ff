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
# Upstream: [sgl-project/sglang#26382](https://github.com/sgl-project/sglang/pull/26382) (part B).
# Rebuilt in `sglab.workspace_floor.rebuild` (manager, call site, FlashInfer's IPC creation);
# measured by `sglab.workspace_floor.measure` (trace replay on 2-4 GPUs, creation cost, profiler
# trace).

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
# overrides of measure.DEFAULT_PARAMS for a live run, e.g. {"world_size": 4}
PARAMS = {}
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import pandas as pd

from sglab.core.notebook import Workbook, slide, verdict
from sglab.workspace_floor import claims, measure, rebuild, sglang, show


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE, gpus=measure.gpus(PARAMS))
# live: measured now on these GPUs; recorded: the committed run of each world size
run = wb.run(measure, PARAMS)
slide(claims, run, show.mechanism(run))

# %% [markdown]
# The picture follows one cold server warming up on short prompts. The grey line is `x.shape[0]`
# per forward step; each coloured staircase is the workspace size a policy holds, and each mark is
# one re-creation (its area is the workspace's MiB per rank, its label the size in tokens and, where
# a GPU run is shown, the ms it blocked every rank). With `x.shape[0]` the workspace is rebuilt at
# every new maximum; with the floor it is built once, at 2048 tokens.
#
# ## The problem
#
# `layernorm.py::_forward_with_allreduce_fusion` calls `flashinfer_allreduce_residual_rmsnorm`,
# which calls `ensure_workspace_initialized(max_token_num, token_num=x.shape[0])`. The workspace is
# (re)created when it is not initialised, when the world size, rank or group changed, or when it is
# too small for this batch (`not is_buffer_size_sufficient(token_num=x.shape[0], ...)`); the
# manager then builds it for `max_token_num` tokens. A creation is FlashInfer's
# `trtllm_create_ipc_workspace_for_all_reduce_fusion`: three buffers per rank, each exported as a
# CUDA IPC handle, all-gathered, opened by every peer; a Lamport fill; a pointer table; barriers. It
# blocks the host on every rank and cannot run inside CUDA-graph capture.
#
# Before the PR the call passed no `max_token_num` (the callee's default, 2048, with `assert
# input_tensor.shape[0] <= max_token_num`); after it, `max(x.shape[0], 2048)`. Which released SGLang
# has the floor (read in the released wheels), and the released call site beside the rebuilt
# policy:

# %%
sglang.released(rebuild.Policy.max_token_num, symbol="_forward_with_allreduce_fusion")

# %% [markdown]
# ## The lesson, on the CPU: what one workspace holds
#
# FlashInfer's three per-rank buffers, each rounded up to 2 MiB (`rebuild.workspace_sizes`), for
# world size W and a workspace of T tokens at Kimi-K2.5's hidden size:

# %%
H = measure.DEFAULT_PARAMS["hidden_dim"]
rows = []
for W in (2, 4):
    for T in (1, 512, 2048, 4096):
        aligned = rebuild.workspace_sizes(W, T, H)["aligned"]
        rows.append({
            "W": W, "T": T, **{
                f"{name} MiB": b / rebuild.MiB
                for name, b in zip(rebuild.BUFFER_NAMES, aligned)
            }, "per rank MiB": sum(aligned) / rebuild.MiB
        })
pd.DataFrame(rows)

# %% [markdown]
# ## The re-create rule, call by call
#
# A manager with a creator that allocates nothing (`rebuild.FakeCreator`), fed a hand-made sequence
# of batch sizes through the call site of each policy. Each row is a creation: the step, why the
# manager created, and the size it created.

# %%
SEQ = [1, 2, 1, 4, 3, 300, 2048, 2049, 100, 4096, 5000]
rows = []
for name in ("floor_0", "floor_2048", "before_pr"):
    policy = rebuild.POLICIES[name]
    manager = rebuild.WorkspaceManager(rebuild.FakeCreator(), clock=lambda: 0.0)
    for step, tokens in enumerate(SEQ):
        manager.step = step
        ok = rebuild.fused_norm_call(manager, policy, tokens, world_size=4, rank=0, hidden_dim=H)
        created = manager.events[-1] if manager.events and manager.events[-1].step == step else None
        rows.append({
            "policy": name, "step": step, "x.shape[0]": tokens,
            "max_token_num": policy.max_token_num(tokens),
            "created": f"{created.max_token_num} ({created.reason})" if created else "",
            "refused (assert)": not ok
        })
pd.DataFrame(rows).pivot(index=["step", "x.shape[0]"], columns="policy",
                         values=["max_token_num", "created", "refused (assert)"])

# %% [markdown]
# Every policy over the same sequence, with its creations, the calls the callee refuses and the
# peak workspace:

# %%
rows = []
for policy in rebuild.POLICIES.values():
    manager, refused = rebuild.simulate(policy, SEQ, world_size=4, hidden_dim=H)
    rows.append({
        "policy": policy.label, "created at T": [e.max_token_num for e in manager.events],
        "creations": manager.recreations, "refused (assert)": refused,
        "peak MiB/rank": manager.peak_bytes_per_rank / rebuild.MiB
    })
pd.DataFrame(rows)

# %% [markdown]
# Because the sufficiency check already makes the workspace grow-only, a policy re-creates exactly
# at the *new records* of `max(x.shape[0], floor)`: the high-water mark changes nothing here (it
# matters only after a cleanup). A floor removes every record below it, at the price of a workspace
# that is never smaller than the floor.
#
# ## Two traces
#
# Token counts the call site sees per forward step of a small seeded serving simulation
# (`measure.generate_trace`: Poisson arrivals with bursts, chunked prefill, extend batches padded to
# piecewise-graph buckets, decode batches). `mixed`: a mixed serving load; `short_ramp`: a cold
# server warming up on short prompts. Both are stored in `data/traces/`; each is regenerated here
# from its stored parameters and compared byte for byte.

# %%
measure.summary()

# %% [markdown]
# ## Re-creations along the full traces (exact, on the CPU)
#
# Each trace through each policy, cold (the first call creates) and with SGLang's
# `pre_initialize_workspaces(max_token_num=2048)` ahead of CUDA-graph capture. `recreations` counts
# every creation a trace call triggers (the pre-initialisation itself is not counted).

# %%
rows = []
for trace in measure.TRACES:
    for pre in (0, 2048):
        for name in rebuild.POLICIES:
            manager, refused = measure.simulated(trace, name, 4, H, pre)
            rows.append({
                "trace": trace, "scenario": f"preinit_{pre}" if pre else "cold", "policy": name,
                "recreations": sum(e.step >= 0 for e in manager.events),
                "peak MiB/rank (W=4)": manager.peak_bytes_per_rank / rebuild.MiB, "refused": refused
            })
pd.DataFrame(rows).set_index(["trace", "scenario", "policy"]).unstack("scenario")

# %% [markdown]
# The steps at which a policy re-creates do not depend on the world size (only the bytes do); the
# step axis is symlog because every re-creation falls in the warm-up. Then memory against
# re-creations, per policy:

# %%
show.simulation()

# %% [markdown]
# ## The real SGLang, before and after
#
# The same traces through the released code, one worker process per release: each release's own
# call site, the real `flashinfer_allreduce_residual_rmsnorm` with its assert,
# `ensure_workspace_initialized`, `FlashInferWorkspaceManager` and `pre_initialize_workspaces`.
# Only FlashInfer's workspace creation is replaced, by a recorder that answers the size check with
# FlashInfer's rule, and the GPU preflight vote by "proceed". Besides its own call site, each
# release's callee also runs the floors 0 and 1024. The rebuild runs the same cells with the policy
# of that call site and a manager like the release's; a row agrees when the re-creation steps,
# sizes and refused calls are equal. Recorded mode shows the answers recorded on the CPU box
# (`SGLAB_REAL=live` runs the installed releases here instead).

# %%
sglang.compare()

# %% [markdown]
# The rebuild's manager keeps a high-water mark by default: the line above says whether these
# releases' managers have it, from which installed release on SGLang's manager keeps one, and
# whether it changes any count here.
#
# ### The real engine at TP 2 and TP 4
#
# SGLang's whole engine with `--enable-flashinfer-allreduce-fusion` on a 2-layer DeepSeek-V3-style
# model (dummy weights, `bash scripts/engine_gpu.sh --plan 02` on a 2- or 4-GPU box), fed the
# short-prompt trace one request at a time: 0.5.12.post1 (no `max_token_num`: the callee's
# default), 0.5.13 (the floor), and 0.5.13 with the floor replaced by `x.shape[0]` (the rebuild's
# policy without a floor; a named harness adjustment). A second adjustment prints one line per
# `FlashInferWorkspaceManager.initialize` call with its size, rank and time. The first table counts
# the creations per rank beside the rebuild's simulation of the same trace with SGLang's
# pre-initialisation; the second sets each prompt length's first call beside its timed one; the
# lines under them read the numbers out.

# %%
engine = sglang.FIX.recorded_engine()
show.engine(engine)
verdict(claims.ENGINE, engine)

# %% [markdown]
# **What the engine says about the floor.** Every rank creates its two workspaces (attention TP
# and MoE TP) in `pre_initialize_workspaces`, before graph capture, at
# `FUSE_ALLREDUCE_MAX_BATCH_SIZE` tokens, and never again: with the floor, without it, and with
# `x.shape[0]`. A step that fits the gate fits that workspace whatever `max_token_num` says (the
# size check asks for `x.shape[0]` tokens), and a larger step never reaches the call site:
# `communicator.apply_flashinfer_allreduce_fusion` sends it to the unfused all-reduce, so the two
# prompts above the gate print no creation. Their first call is slow because that eager path
# builds its kernels on first use (the x-shape engine, started with those caches warm, pays far
# less); it is not a workspace creation, and the floor could not remove it. Likewise the first
# creation on a fresh machine holds FlashInfer's kernel build, and the second is the creation
# itself. In the shipped engine the floor therefore guarantees again what the pre-initialisation
# already gives; the cold-start churn above is what a path without that pre-initialisation sees.

# %% [markdown]
# ## Measured: the same replay with real workspaces on the GPUs
#
# Each rank runs the manager with `IpcWorkspaceCreator`: `cudaMalloc` of the three buffers,
# `cudaIpcGetMemHandle`, all-gather of the handles over the gloo group, `cudaIpcOpenMemHandle` of
# every peer, the Lamport fill (-0.0), the flag word and pointer table, barriers, a free-memory vote
# before and a CPU all-reduce after (as SGLang does); destroying closes the peers' mappings, frees
# and barriers. Times are host wall-clock per rank; tables show the slowest rank. The runs shown are
# the newest per world size. Along the traces, each dot is one re-creation on the GPUs, its area the
# ms it blocked the ranks (destroying the old workspace and creating the new one).

# %%
show.replay(run)

# %% [markdown]
# ### The rebuild beside the real engine
#
# The rebuild counts creations on a cold start (no pre-initialisation), the engine after its own
# pre-initialisation; each row says which. They agree where they measure the same thing: the
# rebuild's simulation of the engine's trace with the pre-initialisation gives the engine's count.

# %%
show.beside(run, engine)

# %% [markdown]
# **What one creation costs.** A sweep over the workspace size T (sizes alternate in rounds, median
# and p10-p90 of every rank's samples, slowest rank): flat up to a size, then a step, at the same
# Lamport buffer size for every world size. A world size recorded more than once is shown side by
# side (a blank cell is one that run did not measure; its note says which).

# %%
show.cost(run)

# %% [markdown]
# **Leak check**, every run and rank: MiB above the baseline after the warm-up creation, after each
# policy's final destroy (max over policies) and at the end of the timed passes (`cudaMemGetInfo`
# and NVML, own GPU and any other GPU), then the rank processes and their GPU memory once the run
# had returned.

# %%
show.leaks(run)

# %% [markdown]
# ## See it in the profiler
#
# A separate pass after the timed ones replays the cold-start short-prompt trace under
# `torch.profiler` on every rank, once with `x.shape[0]` and once with the floor. Every re-creation
# is one `recreate workspace` range; inside it, sub-ranges for each phase (`alloc`, `ipc get
# handle`, `exchange handles`, `ipc open`, `lamport fill`, `barrier`, `destroy old workspace`) and
# the CUDA calls they make. First rank 0's re-creations back to back (the replay between them cut,
# IPC handle opens highlighted), the ranges per rank, the CUDA calls inside them; then, from one
# traced creation per size of the cost sweep, where each creation's time goes and one IPC open per
# buffer against the size of that buffer.

# %%
show.profiler(run)

# %% [markdown]
# Read the lines above as a diagnosis: the phase that carries the step, the one CUDA call inside
# it, and whether that call's cost follows the total bytes mapped or the size of the one allocation
# it opens (compare the data buffer at its largest with the Lamport buffer on either side of the
# step). Phases that grew by less than a tenth of the step are ruled out as its cause. The per-rank
# lists of long calls show whether the ranks' slow opens run side by side or one rank waits in an
# unrelated call while the other's open finishes. The last line separates a per-creation cost (the
# first open of a peer's memory after the previous destroy closed every mapping) from a per-buffer
# one.
#
# ## Your own setup
#
# The simulator on a generated cold start (the stored short-prompt scenario, with the median prompt
# length you pick): re-creations, estimated host-blocking time (from the recorded creation cost) and
# peak MiB per rank for your floor next to no floor, the PR's 2048 and the call before the PR, at
# your world size. Your own traffic (token counts per forward step as CSV, or an SGLang server log)
# on the command line: `sglab workspace --trace FILE --world-size W --hidden H`.

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Verdict
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# workspace_floor` does the same on the command line).

# %%
verdict(claims, run)

# %% [markdown]
# ## Takeaways and review points
#
# - The PR-era manager is grow-only (it re-creates only when a batch does not fit, and sizes to the
#   largest request), so `x.shape[0]` alone re-creates once per *new maximum*, not per fluctuation.
#   Churn is a warm-up phenomenon: it shows on a cold server whose batches grow slowly
#   (`short_ramp`) and not beyond the first steps once a chunked prefill has hit the chunk size
#   (`mixed`).
# - The 2048 floor removes every re-creation below 2048 tokens and costs a workspace of the 2048
#   size from the first call (the sizes table; SGLang keeps two, attention-TP and MoE-TP). On
#   `mixed`, whose first batch is already above 2048, it removes none.
# - With `pre_initialize_workspaces(2048)` before graph capture, the floor changes nothing on these
#   traces: the pre-initialisation already holds that memory. The real engine agrees: two
#   creations per rank at start-up, none per forward step, at TP 2 and TP 4 (0.5.12.post1, 0.5.13
#   and 0.5.13 with `x.shape[0]`). The floor protects paths that skip the pre-initialisation.
# - One creation costs milliseconds per rank, host-blocking on all ranks at once, and grows with
#   the world size. It steps up once the Lamport buffer passes a size between the two the profiler
#   section names (the IPC open of that one allocation); a floor that lands a workspace above it
#   pays the step on every creation.
# - Review: before the PR, calls above 2048 tokens trip the callee's assert in this replay (the
#   `refused` column); in SGLang they never reach the fused path: the communicator's gate
#   (`FUSE_ALLREDUCE_MAX_BATCH_SIZE`) sends them to the unfused all-reduce, as the engine shows.
#   The replay keeps them to show what the call site alone would do. Whether the floor's 2048
#   should be `FUSE_ALLREDUCE_MAX_BATCH_SIZE` itself instead of a literal that equals it.
#   FlashInfer releases after the legacy `cudaIpc` path create the workspace through other
#   transports (symmetric memory); the creator interface (`measure.DEFAULT_PARAMS["creator"]`)
#   lets FlashInfer's own creation run along the same trace beside this rebuild.
