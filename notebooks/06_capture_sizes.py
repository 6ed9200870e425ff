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
# # 06 · Piecewise capture sizes vs the attention-TP reduce-scatter
#
# Upstream: [sgl-project/sglang#23972](https://github.com/sgl-project/sglang/pull/23972); rebuilt in
# `sglab.fixes.capture_sizes`, measured by `sglab.experiments.capture_sizes` on 2–4 GPUs with NCCL.

# %% tags=["parameters"]
MODE = "auto"          # "auto" | "live" | "recorded"
PARAMS = {}            # live run: overrides of experiment.DEFAULT_PARAMS, e.g. {"world_size": 4}
ATTN_TP = 8            # attention-TP size of the CPU tables and the picture (8: the crash report)
MAX_TOKENS = 2048      # piecewise_cuda_graph_max_tokens (2048 is the default for MLA models)

# %%
import pandas as pd

from sglab.sglang import upstream
from sglab.core import notebook as nb
from sglab.experiments import capture_sizes as experiment
from sglab.experiments.capture_sizes import analysis, figures
from sglab.fixes import capture_sizes as fx

pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 110)
wb = nb.Workbook(experiment.EXPERIMENT, gpus=experiment.GPUS, mode=MODE)

# %% tags=["needs-gpu"]
if wb.live:
    params = {**experiment.DEFAULT_PARAMS, **PARAMS}
    wb.measure(lambda: experiment.run(params), params=params, method_version=experiment.METHOD_VERSION,
               gpu_count=params["world_size"])

# %% [markdown]
# The picture: the default capture sizes split over the attention-TP ranks by `tensor_split` (one column per size,
# one row per rank, the rows each rank would hold). Red columns have unequal shards, which the reduce-scatter
# refuses; the two rows underneath show what the PR's filter keeps and what rounding up makes of each size.

# %%
shown = wb.shown()
nb.slide(experiment.EXPERIMENT, shown, figures.mechanism(ATTN_TP, MAX_TOKENS))

# %% [markdown]
# ## The problem
#
# With dense MLPs at TP size 1, `LayerCommunicator` moves tokens from "every attention-TP rank holds partial sums
# of all tokens" to "every rank holds the full sums of its own tokens":
#
# ```python
# # layers/communicator.py, _scatter_hidden_states_and_residual
# local = hidden_states.tensor_split(attn_tp_size)[attn_tp_rank]
# attn_tp_reduce_scatter_tensor(local, hidden_states)      # output must be input / attn_tp_size rows
# ```
#
# `tensor_split` never fails: it hands the first `n % attn_tp_size` ranks one row more. A reduce-scatter, though,
# needs every rank's output to be exactly `n / attn_tp_size` rows. Eager prefill pads the token count and decode
# capture already filtered its batch sizes, but the piecewise runner captured dummy batches of the raw default
# sizes. For the crash report's arguments (`--tp 8 --moe-dense-tp-size 1`):

# %%
crash = fx.ParallelArgs(tp_size=8, moe_dense_tp_size=1)
print(f"require_gathered_buffer = {fx.require_gathered_buffer(crash)}, "
      f"attention TP size = {fx.attention_tp_size(crash)}")
default = fx.default_piecewise_capture_sizes(MAX_TOKENS)
print(f"PR-era default piecewise capture sizes (max {MAX_TOKENS}): {len(default)} sizes\n{default}")
sizes = analysis.size_table(ATTN_TP, MAX_TOKENS)
print(f"unequal shards at attention TP {ATTN_TP}: {list(sizes.loc[~sizes.equal_shards, 'size'])}")
try:
    fx.check_equal_shards(12, 8)
except fx.UnequalShards as e:
    print("caught:", e)

# %% [markdown]
# Which released SGLang has the filter (read in the released wheels, `data/upstream/releases.csv`: it arrived in
# 0.5.11, was lost in 0.5.14's runner refactor, and 0.5.22 rounds up instead), and the released filter inside
# `PiecewiseCudaGraphRunner.__init__` beside the rebuilt one:

# %%
from sglab.sglang import wheels as upstream_figures, hunks

upstream_figures.timeline_row_figure(experiment.EXPERIMENT)

# %%
hunks.beside(experiment.EXPERIMENT, fx.filter_piecewise_capture_sizes)

# %% [markdown]
# ## Rebuild: before, the PR, the decode runner's rule, today
#
# * **before** — the piecewise runner captures `default` as is.
# * **PR #23972** — when `require_gathered_buffer(server_args)`:
#   `mul_base = attn_tp_size; if mul_base % attn_cp_size != 0: mul_base *= attn_cp_size`, keep sizes divisible
#   by `mul_base`, assert one is left.
# * **decode runner** (`get_batch_sizes_to_capture`, the rule the PR copies) — also doubles `mul_base` under
#   two-batch overlap.
# * **today** — unaligned sizes are rounded *up* to the alignment and de-duplicated instead of dropped.

# %%
analysis.rule_table(default)

# %% [markdown]
# The boundary itself runs here on the CPU too: two `gloo` ranks run the experiment's code (eager runs stand in for
# graph capture and replay; no CUDA). The size list is the default list scaled by 2/8, so exactly the four sizes
# that break at TP 8 break on 2 ranks (1, 3, 5, 7). A logic check, not the measurement; skipped in live mode.

# %%
if not wb.live:
    cpu = experiment.run({"world_size": 2, "backend": "gloo", "hidden": 16, "max_tokens": 64, "profile": False})
    print(experiment.summary(cpu.df).drop(columns=["error"]).to_string(index=False))

# %% [markdown]
# ## The real SGLang, before and after
#
# Each release's own runner code decides the capture sizes for the settings below, one subprocess per release
# (`sglab.sglang.probes.capture_sizes`): 0.5.10.post1 and 0.5.11 run the real `PiecewiseCudaGraphRunner.__init__`
# on a stand-in runner up to the log line after the filter, and `get_batch_sizes_to_capture`; 0.5.14 and 0.5.23
# the unified runners' functions (0.5.23 through its own published `ServerArgs`). The configured lists are the
# default piecewise list for 2048 tokens and the decode list for 256 requests. Each release must match one
# rebuilt rule: `before` (0.5.10.post1, and 0.5.14, which lost the filter), `pr_filter` (0.5.11) and `today`
# (0.5.23: every size rounded up to the decode runner's alignment, `fx.today_capture_sizes`); decode lists
# follow the decode runner's filter everywhere.
#
# Recorded mode shows the answers recorded on the CPU box (`data/recorded/real_cpu/`, written by `sglab real record`;
# the tests check that they still equal a live run); `SGLAB_REAL=live` runs the installed releases here instead,
# about 8 s a release.

# %%
from sglab.experiments.capture_sizes import real
from sglab.sglang import compare_old as report

real_results = real.probe()
print(report.status_lines(real_results))
print(real.defaults_line(real_results))
real_table = real.comparison(real_results)
report.check_table(real_table, what="(release, setting) rows")
real_table

# %% [markdown]
# The notebook's `round_up` policy (the tables above and below) against 0.5.23's real lists. SGLang rounds to the
# decode runner's alignment, which doubles under two-batch overlap; the rebuild first rounded to the PR's
# `mul_base` alone and was corrected to SGLang's rule (`fx.today_alignment`) after this check:

# %%
print(real.round_up_note(real_results))
from sglab.sglang import compare_old as compare  # noqa: E402

compare.show_recorded(real.RECORDED);

# %% [markdown]
# ## Which buckets survive, for attention TP 1–8 × CP 1–4 × two-batch overlap
#
# Counts are over the default list. `n_pr`: the PR's filter (ignores two-batch overlap); `n_decode_style`: the
# decode runner's rule (×2 under TBO); `n_lcm`: filtering by the least common multiple; `n_round_up`: rounding up
# to `mul_base` (sizes merge, so buckets are lost there too). Padding assumes every token count 1..MAX_TOKENS is
# equally likely (a stated model, not a trace); `eager_pr` counts the token counts above the largest kept bucket,
# which run eagerly.

# %%
table = analysis.alignment_table(MAX_TOKENS)
cols = ["attn_tp", "attn_cp", "mul_base_pr", "lcm", "tp_x_cp", "n_pr", "n_lcm", "n_round_up", "lost_pr",
        "lost_round_up", "pad_frac_pr", "pad_frac_round_up", "eager_pr", "pr_asserts"]
print(table[~table.two_batch_overlap][cols].round(3).to_string(index=False))

# %% [markdown]
# With two-batch overlap the decode runner doubles its base; the piecewise filter keeps sizes the decode rule
# would drop:

# %%
tbo = table[table.two_batch_overlap & (table.pr_below_decode_base > 0)]
tbo[["attn_tp", "attn_cp", "mul_base_pr", "mul_base_decode", "n_pr", "n_decode_style", "pr_below_decode_base"]]

# %% [markdown]
# The same table as heatmaps (two-batch overlap off), then in numbers: look at the buckets lost for
# non-power-of-two TP and at the padding the PR's filter costs there.

# %%
_ = figures.alignment_heatmaps(table, MAX_TOKENS, len(default))
print(analysis.alignment_summary(table, MAX_TOKENS))

# %% [markdown]
# ## Review findings

# %%
analysis.review_table(MAX_TOKENS)

# %% [markdown]
# ## Measured: capture-style runs on 2–4 GPUs with NCCL
#
# One rank per GPU; the ranks form the attention-TP group. Each variant runs the runner's loop — a warm-up at the
# smallest size, then largest first: two eager runs and a CUDA-graph capture of scatter → per-token op → gather.
# `before` stops at the first bad size (a shard check raises before any collective, so nothing can hang);
# `before_probe` calls the collective on each raw size *without* that check, to show what torch's NCCL backend
# does with unequal shards; `pr_filter` and `round_up` capture every bucket and replay each with real token counts
# padded to it, compared with an all-reduce reference. With fewer than 8 GPUs the size list is the default list
# scaled by `world_size / 8`, so the same four sizes break (at 4 ranks: 2, 6, 10, 14).
#
# Every run, one row each (`gpus_on_machine`: GPUs on the box it ran on); the runs below it in detail are the
# newest per GPU model and world size.

# %%
all_runs = wb.results()
if all_runs:
    print(analysis.runs_table(all_runs).drop(columns=["refused_error"]).T.to_string(header=False))
for run in shown:
    print(f"\n— {run.label} (world size {run.manifest['params']['world_size']}) —")
    print(experiment.summary(run.df).drop(columns=["error"]).to_string(index=False))

# %% [markdown]
# Each size of each variant: red where it failed (the unfiltered loop at its first size; the probe at every odd
# size), blue where it was captured and replayed.

# %%
for run in shown:
    _ = figures.size_status_plot(run)

# %% [markdown]
# ### Before vs after, from the data

# %%
for run in shown:
    print(analysis.describe_run(run))

# %% [markdown]
# ### What NCCL itself would do
#
# torch's NCCL process group checks `input.numel() == output.numel() * world_size` on each rank *before* calling
# NCCL and raises `ValueError: input tensor must be the same size as output size times world size` — the error
# seen in SGLang's reports of the same boundary (e.g. the warm-up crash with `--max-running-requests 97` at
# attention TP 8 fixed in sgl-project/sglang#19918). With unequal `tensor_split` shards that check fails on
# **every** rank (each shard is ⌊n/w⌋ or ⌈n/w⌉ rows, and neither times w is n), so `before_probe` is safe to run.
# What NCCL does when ranks pass *different* counts to `ncclReduceScatter` (possible through a communicator that
# skips this check) is not shown: that is undefined behaviour — typically every rank waits forever for data that
# never comes, until a watchdog kills the job — and a collective hung inside a CUDA graph replay is not covered by
# the collective timeout at all. The experiment detects the bad size before the collective instead.

# %%
print("installed SGLang:", upstream.check(__import__("sglab.capture_sizes.sglang", fromlist=["FIX"]).FIX))

# %% [markdown]
# ## See it in the profiler
#
# After the measured passes, each rank runs the capture loop once more under torch.profiler: `before` on the raw
# list, `after` on the PR's list, one range per size. Unlike the server, the traced `before` loop goes on after a
# refusal so that every refused size shows: the red ✗ is where `UnequalShards` was caught — no collective call on
# the host and no kernel on the GPU for that size. An accepted size issues the reduce-scatter and all-gather for
# its two eager runs and for the call under capture, but the GPU runs only the eager runs' NCCL kernels: the
# captured call is recorded into the graph.

# %%
for run in shown:
    events = run.sidecar("events")
    if events is None:
        print(f"{run.label}: this run predates profiler traces; a new recording adds them.")
        continue
    _ = figures.capture_timeline(events, rank=0, run=run)
    print(analysis.trace_summary(events).to_string(index=False))
    if run.sidecar("trace") is not None:
        print(f"Perfetto trace of rank 0 (open in https://ui.perfetto.dev): {run.sidecar('trace')}")

# %% [markdown]
# ## Your own setup
#
# Attention TP, CP, dense TP 1 and two-batch overlap → the default piecewise sizes each rule captures (rebuild)
# and which of them the reduce-scatter refuses. The releases' own start-up adds one more fact: 0.5.10.post1 to
# 0.5.13 turn the piecewise runner off under DP attention and under context parallelism.
#
# Your own server arguments, parsed by each installed release's own `ServerArgs`, on the command line:
# `sglab capture-sizes -- --tp 8 --moe-dense-tp-size 1`

# %%
from sglab.investigate import widgets

widgets.capture_rules()

# %% [markdown]
# ## Verdict

# %%
nb.verdict(experiment.EXPERIMENT, shown)

# %% [markdown]
# ## Takeaways and review points
#
# * The crash was purely arithmetic: a reduce-scatter over `attn_tp` ranks needs `n % attn_tp == 0`, and the
#   piecewise runner was the one path that fed it raw sizes. The CPU tables show which configurations lose which
#   buckets; the GPU run shows the failure and that every filtered or rounded bucket captures and replays exactly
#   when real token counts are padded to it.
# * `mul_base` is a common multiple of attn TP and CP but not always the least (tp 4, cp 6 → 24 vs 12), and the
#   code comment promises `attn_tp_size * attn_cp_size`, which the code does not enforce (tp 4, cp 2 → 4, not 8).
# * The decode runner doubles `mul_base` under two-batch overlap; the piecewise filter does not.
# * Dropping sizes costs buckets (and, for non-power-of-two TP, coverage at the top: token counts above the
#   largest kept bucket run eagerly); rounding up never asserts and keeps more buckets for the same alignment —
#   the approach SGLang later took.
# * The GPU runs use a list scaled to the GPUs available, so the failing residues match TP 8; there the filtered
#   and rounded-up lists coincide, so the GPU part shows that both work, not which is better.
