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
# Upstream: [sgl-project/sglang#26382](https://github.com/sgl-project/sglang/pull/26382) (part B),
# the `max_token_num` that `layers/layernorm.py` passes to the fused all-reduce + RMSNorm; rebuilt
# in `sglab.workspace_floor.rebuild`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of measure.DEFAULT_PARAMS for a live run, e.g. {"world_size": 4}
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import pandas as pd

from sglab.core import engine_view
from sglab.core.notebook import Workbook, card, reveal, show_figure, verdict
from sglab.sglang import codepath
from sglab.workspace_floor import claims, measure, rebuild, sglang, show, traces


pd.set_option("display.width", 160)
wb = Workbook(claims, mode=MODE, gpus=measure.gpus(PARAMS))
run = wb.run(measure, PARAMS)  # live: measured now on these GPUs; recorded: each world size's
first = run.first if run else run  # the run a single-run picture reads (or the NoRun)
engine = sglang.FIX.recorded_engine()  # SGLang's own engine at TP 2 and 4, with and without
card(sglang.FIX, claims, run, engine)

# %% [markdown]
# ## The mechanism
#
# One cold server warming up on short prompts, no pre-initialisation. The grey line is
# `x.shape[0]` per forward step; each staircase is the workspace a call site holds, each mark one
# creation (its area the MiB per rank; its label the size in tokens and, from the GPU run, the ms it
# blocked every rank). The PR's first draft, `x.shape[0]`, re-creates at every new maximum; the
# released call before the PR and the merged floor create once, at 2048 tokens. The legend also
# counts the creations after SGLang's own `pre_initialize_workspaces(2048)`, which the engine runs
# before graph capture.

# %%
show_figure(show.mechanism(first))

# %% [markdown]
# ## The lesson
#
# `RMSNorm._forward_with_allreduce_fusion` calls `flashinfer_allreduce_residual_rmsnorm`, which
# asserts `input_tensor.shape[0] <= max_token_num` and calls `ensure_workspace_initialized`. That
# re-creates the workspace when it is missing, when the world size, rank or group changed, or when
# it is too small for `x.shape[0]` tokens, and then sizes it for `max_token_num`. A creation is
# FlashInfer's `trtllm_create_ipc_workspace_for_all_reduce_fusion`: three buffers per rank, each
# exported as a CUDA IPC handle, all-gathered and opened by every peer, a Lamport fill, barriers. It
# blocks every rank and cannot run inside CUDA-graph capture. Before the PR the call site passed no
# `max_token_num` (the callee's default, 2048); the PR's first draft passed `x.shape[0]`; the
# merged line passes `max(x.shape[0], 2048)`. The released line beside the rebuilt call site:

# %%
sglang.released(rebuild.Policy.max_token_num, symbol="_forward_with_allreduce_fusion")

# %% [markdown]
# What one workspace holds: FlashInfer's three per-rank buffers, each rounded up to 2 MiB
# (`rebuild.workspace_sizes`), for world size W and a workspace of T tokens at Kimi-K2.5's hidden
# size:

# %%
H = measure.DEFAULT_PARAMS["hidden_dim"]
rows = []
for W in (2, 4):
    for T in (512, 2048, 4096):
        aligned = rebuild.workspace_sizes(W, T, H)["aligned"]
        mib = {f"{name} MiB": b / rebuild.MiB for name, b in zip(rebuild.BUFFER_NAMES, aligned)}
        rows.append({"W": W, "T": T, **mib, "per rank MiB": sum(aligned) / rebuild.MiB})
pd.DataFrame(rows).set_index(["W", "T"])

# %% [markdown]
# ### Predict, then run: eleven calls through each call site
#
# A manager whose creator allocates nothing (`rebuild.FakeCreator`), fed eleven batch sizes through
# the call site of the released call, the draft and the merged floor. **Predict** at which calls
# each one creates a workspace (and at what size), and which calls the callee's assert refuses.

# %%
SEQ = [1, 2, 1, 4, 3, 300, 2048, 2049, 100, 4096, 5000]
rows = []
for name in show.STORY:
    policy = rebuild.POLICIES[name]
    manager = rebuild.WorkspaceManager(rebuild.FakeCreator(), clock=lambda: 0.0)
    for step, tokens in enumerate(SEQ):
        manager.step = step
        ok = rebuild.fused_norm_call(manager, policy, tokens, world_size=4, rank=0, hidden_dim=H)
        made = [e for e in manager.events if e.step == step]
        rows.append({
            "call site": policy.label, "step": step, "x.shape[0]": tokens,
            "creates": f"{made[0].max_token_num} ({made[0].reason})" if made else "",
            "refused": "refused" if not ok else ""
        })
reveal(
    pd.DataFrame(rows).pivot(index=["step", "x.shape[0]"], columns="call site",
                             values=["creates", "refused"]))

# %% [markdown]
# The manager only grows (it re-creates when a batch does not fit), so a call site re-creates at
# the *new maxima* of `max(x.shape[0], floor)`, not at every fluctuation. A floor removes every
# maximum below it, at the price of a workspace never smaller than the floor; without any
# `max_token_num` the workspace never grows, and a larger batch trips the assert.
#
# ### Predict, then run: after SGLang's pre-initialisation
#
# Two traces of the token count the call site sees per forward step (`traces.generate_trace`, a
# seeded serving simulation stored in `data/traces/`): `short_ramp`, a cold server warming up on
# short prompts, and `mixed`, a serving load whose prefill chunks reach 4096 tokens. SGLang's
# engine calls `pre_initialize_workspaces(max_token_num=2048)` before graph capture. **Predict**
# how many creations each call site makes along each trace after that, against a cold start.

# %%
rows = []
for trace in traces.TRACES:
    for name in show.STORY:
        for pre in (0, rebuild.FUSE_ALLREDUCE_MAX_BATCH_SIZE):
            manager, refused = rebuild.simulate(rebuild.POLICIES[name], traces.trace_tokens(trace),
                                                world_size=4, hidden_dim=H, pre_initialize=pre)
            rows.append({
                "trace": trace, "call site": rebuild.POLICIES[name].label,
                "start": "pre-initialised" if pre else "cold",
                "creations": traces.in_trace(manager), "refused": refused
            })
reveal(
    pd.DataFrame(rows).pivot(index=["trace", "call site"], columns="start",
                             values=["creations", "refused"]))

# %% [markdown]
# The pre-initialisation leaves nothing below 2048 tokens to create, whatever the call site: what
# remains are the steps above 2048 of `mixed`, and in SGLang those never reach the call site (the
# next section). The floor's price is memory: every call site's creations against its peak
# workspace per rank, cold, on both traces:

# %%
show.simulation()

# %% [markdown]
# ## Real SGLang
#
# The path of the fused norm in 0.5.13, the first release with the floor, start-up first and then
# every forward step (each box links to its line at the release's tag):

# %%
codepath.show(sglang.RELEASE, sglang.CODE_PATH, "Where SGLang creates the workspace")

# %% [markdown]
# ### The releases' own code, on the CPU
#
# The two traces through each release's own call site, callee, `ensure_workspace_initialized`,
# `FlashInferWorkspaceManager` and `pre_initialize_workspaces`, one worker process per release;
# only FlashInfer's creation is replaced, by a recorder that answers the size check with
# FlashInfer's rule. Besides its own call site each release's callee also runs the draft and a
# floor of 1024. The probe calls the call site at every step, the communicator's gate left out, so
# the steps above 2048 of `mixed` reach it here. The rebuild runs the same cells and must agree
# on every creation's step and size (recorded mode shows the answers recorded on the CPU box).

# %%
sglang.compare()

# %% [markdown]
# ### The real engine, before and after
#
# SGLang's whole engine with `--enable-flashinfer-allreduce-fusion` on a 2-layer DeepSeek-V3-style
# model (dummy weights; `bash scripts/engine_gpu.sh --plan 02`), fed prompts of 4 to 3000 tokens
# one request at a time: 0.5.12.post1 (the released call before the PR), 0.5.13 (the merged
# floor), and 0.5.13 with the floor replaced by `x.shape[0]` (the draft, a named harness
# adjustment). A second adjustment prints one line per `FlashInferWorkspaceManager.initialize`
# call. The table counts the creations per rank beside the rebuild's simulation of the same trace
# with the pre-initialisation, and times a creation apart from the first one of each rank, which
# also builds or loads FlashInfer's kernels.

# %%
engine_view.section(show.VIEW, engine, claims.ENGINE)

# %% [markdown]
# Every rank creates its two workspaces (attention TP and MoE TP) in `pre_initialize_workspaces`,
# before graph capture, and never again, whatever the call site passes: a step that passes the gate
# fits that workspace, and a larger one is sent to the unfused all-reduce by
# `communicator.apply_flashinfer_allreduce_fusion`. In the shipped engine the floor therefore
# guarantees again what the pre-initialisation already gives; the cold-start churn of the mechanism
# is what a path without that pre-initialisation would see.
#
# ## Your own setup
#
# The simulator on a generated cold start (the stored short-prompt scenario, with the median prompt
# length you pick): re-creations, estimated host-blocking time (from the recorded creation cost)
# and peak MiB per rank for your floor next to the draft, the merged floor and the released call,
# at your world size. Your own traffic (token counts per forward step as CSV, or an SGLang server
# log) on the command line: `sglab workspace --trace FILE --world-size W --hidden H`.

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Takeaways and review points
#
# - In SGLang as shipped the floor changes nothing: `pre_initialize_workspaces` creates every
#   workspace at `FUSE_ALLREDUCE_MAX_BATCH_SIZE` tokens before graph capture, and the communicator
#   keeps every larger step off the fused path, with the released call, the merged floor and the
#   draft alike. The floor protects paths that skip the pre-initialisation.
# - What the floor prevents is the draft's churn: the manager only grows, so `x.shape[0]`
#   re-creates at every new maximum of a cold server's warm-up (`short_ramp`), each creation
#   blocking every rank for milliseconds; once a chunked prefill reaches the chunk size (`mixed`),
#   no floor below it changes anything.
# - The price is memory from the first call: a 2048-token workspace per manager (SGLang keeps two).
# - Review: the floor's 2048 is a literal equal to `FUSE_ALLREDUCE_MAX_BATCH_SIZE`; naming the
#   constant would keep the two together. Without the gate, the released call's assert would refuse
#   a batch above 2048 tokens where the merged call grows the workspace instead.
# - Review: FlashInfer releases after the legacy `cudaIpc` path create the workspace through other
#   transports; what one creation costs there is not measured here.
#
# How the engine's numbers are made to repeat (starts, hosts, reruns):
# [07 · how we measure](07_how_we_measure.ipynb).

# %% [markdown]
# ## Appendix
#
# ### The rebuild on the GPUs: the replay
#
# Each rank runs the manager with `IpcWorkspaceCreator`: `cudaMalloc` of the three buffers,
# `cudaIpcGetMemHandle`, all-gather of the handles over the gloo group, `cudaIpcOpenMemHandle` of
# every peer, the Lamport fill (-0.0), the flag word and pointer table, barriers, a free-memory vote
# before and a CPU all-reduce after (as SGLang does); destroying closes the peers' mappings, frees
# and barriers. Times are host wall-clock per rank; tables show the slowest rank; the runs shown are
# the newest per world size. Every trace through every policy, cold:

# %%
show.replay(run)

# %% [markdown]
# ### The rebuild beside the engine
#
# The rebuild counts creations on a cold start, the engine after its own pre-initialisation; each
# row says which. The rebuild's simulation of the engine's trace with the pre-initialisation gives
# the engine's count.

# %%
engine_view.beside(show.beside_rows(first, engine))

# %% [markdown]
# ### What one creation costs
#
# A sweep over the workspace size T (sizes alternate in rounds; median and p10-p90 of every rank's
# samples, slowest rank): flat up to a size, then a step at the same Lamport buffer size for every
# world size.

# %%
show.cost(run)

# %% [markdown]
# ### The profiler
#
# A pass after the timed ones replays the cold-start short-prompt trace under `torch.profiler` on
# every rank, with the draft and with the merged floor. Every creation is one `recreate workspace`
# range with a sub-range per phase (`alloc`, `ipc get handle`, `exchange handles`, `ipc open`,
# `lamport fill`, `barrier`, `destroy old workspace`) and the CUDA calls inside. Rank 0's creations
# back to back (the replay between them cut), the ranges per rank, the CUDA calls inside them; then,
# from one traced creation per size of the cost sweep, where each creation's time goes and one IPC
# open per buffer against that buffer's size. The lines under them name the phase that carries the
# step, the one CUDA call inside it, and whether its cost follows the bytes mapped or the size of
# the one allocation it opens.

# %%
show.profiler(run)

# %% [markdown]
# ### The traces
#
# Each stored trace regenerated from its stored parameters and compared byte for byte:

# %%
traces.summary()

# %% [markdown]
# ### Every cell of the releases' own code
#
# Each (release, call site, trace, scenario) cell beside the rebuild's, with the manager the release
# has (no high-water mark in either release):

# %%
sglang.compare(full=True)

# %% [markdown]
# ### Claims
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# workspace_floor` does the same on the command line).

# %%
verdict(claims, run)
