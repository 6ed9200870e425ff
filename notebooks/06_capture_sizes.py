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
# Upstream: [sgl-project/sglang#23972](https://github.com/sgl-project/sglang/pull/23972) (keep only
# the piecewise capture sizes divisible by the attention-TP size), rebuilt in
# `sglab.capture_sizes.rebuild`.

# %% tags=["parameters"]
MODE = "auto"  # "auto" | "live" | "recorded"
PARAMS = {}  # overrides of measure.DEFAULT_PARAMS, e.g. {"world_size": 4}
ATTN_TP = 8  # attention-TP size of the CPU tables and the picture (8: the crash report)
MAX_TOKENS = 2048  # piecewise_cuda_graph_max_tokens (2048 is the default for MLA models)
# "your own setup": False, static tables (what papermill, `jupyter execute` and `sglab run` save);
# True, sliders and drop-downs in JupyterLab
INTERACTIVE = False

# %%
import pandas as pd

from sglab.capture_sizes import claims, measure, rebuild, sglang, show
from sglab.core import engine_view, text
from sglab.core.notebook import Workbook, card, reveal, show_figure, show_table, verdict
from sglab.sglang import codepath


pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 110)
wb = Workbook(claims, mode=MODE)
run = wb.run(measure, PARAMS)  # live: measured now on these GPUs; recorded: the committed runs
engine = sglang.FIX.recorded_engine()  # SGLang's own engine, recorded on GPUs
card(sglang.FIX, claims, run, engine)

# %% [markdown]
# ## The mechanism
#
# The default capture sizes split over the attention-TP ranks by `tensor_split` (one column per
# size, one row per rank: the rows each rank would hold), computed from the rebuild. Red columns
# have unequal shards, which the reduce-scatter refuses; the two rows underneath show what the PR's
# filter keeps and what rounding up makes of each size.

# %%
show_figure(show.mechanism(ATTN_TP, MAX_TOKENS))

# %% [markdown]
# ## The problem
#
# With dense MLPs at TP size 1, `LayerCommunicator` moves tokens from "every attention-TP rank
# holds partial sums of all tokens" to "every rank holds the full sums of its own tokens":
#
# ```python
# # layers/communicator.py, _scatter_hidden_states_and_residual
# local = hidden_states.tensor_split(attn_tp_size)[attn_tp_rank]
# attn_tp_reduce_scatter_tensor(local, hidden_states)  # output must be input / attn_tp_size rows
# ```
#
# `tensor_split` never fails: it hands the first `n % attn_tp_size` ranks one row more. A
# reduce-scatter needs every rank's output to be exactly `n / attn_tp_size` rows. Eager prefill pads
# the token count and decode capture already filtered its batch sizes, but the piecewise runner
# captured dummy batches of the raw default sizes at start-up. Which released SGLang has the filter
# (read in the released wheels), then the released hunk beside the rebuilt filter:

# %%
sglang.released(rebuild.filter_piecewise_capture_sizes, symbol="PiecewiseCudaGraphRunner.__init__")

# %% [markdown]
# ## The lesson, on the CPU
#
# The crash report's arguments are `--tp 8 --moe-dense-tp-size 1`: the layer communicator scatters
# tokens over 8 attention-TP ranks. Each of the first default sizes, split as `tensor_split` splits
# it, and what the rebuilt shard check says:

# %%
crash = rebuild.ParallelArgs(tp_size=8, moe_dense_tp_size=1)
tp = rebuild.attention_tp_size(crash)
default = rebuild.default_piecewise_capture_sizes(MAX_TOKENS)
print(f"require_gathered_buffer = {rebuild.require_gathered_buffer(crash)}, attention TP = {tp}, "
      f"{len(default)} default sizes up to {MAX_TOKENS}")
rows = []
for n in default[:10]:
    try:
        rebuild.check_equal_shards(n, tp)
        said = "reduce-scatter accepts"
    except rebuild.UnequalShards as e:
        said = f"refused: {str(e).split(': ', 1)[1]}"
    rows.append({"size": n, "rows per rank": rebuild.shard_sizes(n, tp), "shard check": said})
with pd.option_context("display.max_colwidth", None):
    show_table(pd.DataFrame(rows).set_index("size"))

# %% [markdown]
# The rules side by side, from the one switch `rebuild.policy_lists` and the decode runner's rule:
# **before** the piecewise runner captures the list as is; **#23972** keeps sizes divisible by
# `mul_base = attn_tp_size` (times `attn_cp_size` when that does not divide it) and asserts one is
# left; the **decode runner** (`get_batch_sizes_to_capture`, the rule the PR copies) also doubles
# its base under two-batch overlap; **today** unaligned sizes are rounded up to the decode runner's
# alignment and de-duplicated.

# %%
rows = []
for attn_tp, attn_cp, tbo in ((8, 1, False), (8, 1, True), (4, 6, False)):
    lists = rebuild.policy_lists(default, attn_tp, attn_cp, tbo)
    decode = rebuild.filter_decode_batch_sizes(default, attn_tp, attn_cp, two_batch_overlap=tbo)
    dropped = [n for n in default if n not in lists["pr_filter"]]
    rows.append((attn_tp, attn_cp, tbo, rebuild.piecewise_mul_base(attn_tp, attn_cp),
                 len(lists["pr_filter"]), show.first_of(dropped),
                 rebuild.decode_mul_base(attn_tp, attn_cp, two_batch_overlap=tbo), len(decode),
                 len(lists["round_up"]), lists["round_up"][:6]))
pd.DataFrame(
    rows, columns=[
        "attn TP", "attn CP", "TBO", "PR mul_base", "PR keeps", "PR drops", "decode mul_base",
        "decode rule keeps", "rounded up", "first rounded"
    ])

# %% [markdown]
# **Predict, then run (1).** At attention TP 3 (a width that is not a power of two), how many of
# the default sizes does the PR's filter keep, how many does rounding up keep, and above which
# token count does a prefill run eagerly because no kept bucket is large enough?

# %%
three = rebuild.policy_lists(default, 3)
reveal(
    pd.DataFrame({
        rule: {"buckets": len(sizes), "largest": max(sizes), "smallest": sizes[:6]}
        for rule, sizes in three.items()
    }).T)

# %% [markdown]
# **Predict, then run (2).** Two `gloo` ranks run the measurement's own code here on the CPU (eager
# runs stand in for graph capture and replay). The size list, printed below, is the start of the
# default list (a smaller `max_tokens` than the GPU runs', to keep the CPU run short) scaled by
# `world_size / 8`, so that the sizes TP 8 refuses recur at 2 ranks. Which sizes will the
# collective refuse, and where will the unfiltered capture loop (a warm-up at the smallest size,
# then largest first) stop?

# %%
CPU = {"world_size": 2, "backend": "gloo", "hidden": 16, "max_tokens": 64, "profile": False}
start, gpu_list = (rebuild.default_piecewise_capture_sizes(m)
                   for m in (CPU["max_tokens"], measure.DEFAULT_PARAMS["max_tokens"]))
print(f"sizes {measure.raw_sizes(CPU['world_size'], 'scaled', CPU['max_tokens'])}: the default "
      f"list up to {CPU['max_tokens']} tokens (its first {len(start)} sizes; the GPU runs take all "
      f"{len(gpu_list)}, up to {gpu_list[-1]}), scaled by {CPU['world_size']}/8")
cpu = measure.run(CPU, progress=False)
reveal(show.summary_view(cpu.df).set_index("variant"))

# %% [markdown]
# ## Real SGLang, before and after
#
# The path the sizes take at start-up, in the release that has the filter (each box links to its
# line at the release's tag):

# %%
codepath.show(sglang.CODE_PATH_RELEASE, sglang.CODE_PATH,
              "capture sizes → piecewise runner → reduce-scatter")

# %% [markdown]
# Each release's own runner code decides the capture sizes for the settings below, one worker
# process per release (0.5.10.post1 and 0.5.11 run the real `PiecewiseCudaGraphRunner.__init__` up
# to its log line after the filter; 0.5.14 and 0.5.23 the unified runners). The configured lists are
# the default piecewise list for 2048 tokens and the decode list for 256 requests. Each column is
# checked against the rebuilt rule named in its header, decode lists too; recorded mode shows the
# answers recorded on the CPU box.

# %%
sglang.compare()

# %% [markdown]
# SGLang's whole engine at start-up: `--moe-dense-tp-size 1` on a 2-layer DeepSeek-V3-style model
# (dummy weights; `bash scripts/engine_gpu.sh --plan 06`), with piecewise capture sizes the
# attention-TP size does not divide: `3 4 5 8` at TP 2, and `2 4 6 8` at TP 4 (sizes TP 2 divides
# and TP 4 does not). The engine column is what it did, SGLang's own first error line where it
# stopped; the last column is what the rebuild's rule of that release keeps of the same list.

# %%
engine_view.section(show.VIEW, engine, claims.ENGINE)

# %% [markdown]
# ## Your own setup
#
# Attention TP, CP, dense TP 1 and two-batch overlap → the default piecewise sizes each rule
# captures (rebuild) and which of them the reduce-scatter refuses. The releases' own start-up adds
# more: 0.5.10.post1 to 0.5.14 turn the piecewise runner off under DP attention and context
# parallelism, 0.5.23 turns its prefill graph off under two-batch overlap and attention CP.
#
# Your own server arguments, parsed and resolved by each installed release's own `ServerArgs`, on
# the command line: `sglab capture-sizes -- --tp 8 --moe-dense-tp-size 1`. From 0.5.14 a release
# resolves its configuration with a model's config (a shipped tiny DeepSeek-V3 config unless
# `--model CONFIG.json` names yours).

# %%
show.your_setup(interactive=INTERACTIVE)

# %% [markdown]
# ## Takeaways and review points
#
# Each review point computed on the default list:

# %%
kept = {base: len([n for n in default if n % base == 0]) for base in range(1, 25)}
findings = [("comment vs code, tp 4 cp 2: the comment's tp × cp", 4, 2, rebuild.comment_base(4, 2)),
            ("common multiple, not least, tp 4 cp 6: the lcm", 4, 6, rebuild.lcm_base(4, 6)),
            ("two-batch overlap not folded in, tp 8: the decode runner's base", 8, 1,
             rebuild.decode_mul_base(8, 1, two_batch_overlap=True))]
rows = [(f, rebuild.piecewise_mul_base(t, c), kept[rebuild.piecewise_mul_base(t, c)], other,
         kept[other]) for f, t, c, other in findings]
rows.append(("drop vs round up, tp 3: rounding up to 3", 3, kept[3], 3,
             len(rebuild.round_up_capture_sizes(default, 3))))
pd.DataFrame(
    rows,
    columns=["", "code's mul_base", "sizes it keeps", "other base",
             "sizes kept by the other"]).set_index("")

# %% [markdown]
# * The crash was purely arithmetic: a reduce-scatter over `attn_tp` ranks needs
#   `n % attn_tp == 0`, and the piecewise runner was the one path that fed it raw sizes. The
#   released engine shows it whole: the release without the filter fails at start-up, the release
#   with it captures exactly what the rebuild's filter keeps.
# * The filter was lost when the runners were unified (the releases line of the card says which);
#   a production team on those releases with `--moe-dense-tp-size 1` meets the start-up failure
#   again unless its capture sizes are multiples of the attention-TP size.
# * `mul_base` is a common multiple of attn TP and CP but not always the least (tp 4, cp 6), and the
#   code comment promises `attn_tp_size * attn_cp_size`, which the code does not enforce (tp 4,
#   cp 2).
# * The decode runner doubles `mul_base` under two-batch overlap; the piecewise filter does not.
# * Dropping sizes costs buckets (and, for non-power-of-two TP, coverage at the top: token counts
#   above the largest kept bucket run eagerly); rounding up never asserts and keeps more buckets for
#   the same alignment — the approach SGLang later took.

# %% [markdown]
# ## Appendix
#
# ### Which buckets survive, for attention TP 1–8 × CP 1–4
#
# Counts are over the default list. `n_pr`: the PR's filter (ignores two-batch overlap);
# `n_decode_style`: the decode runner's rule (×2 under TBO); `n_lcm`: filtering by the least common
# multiple; `n_round_up`: rounding up (sizes merge, so buckets are lost there too). Padding assumes
# every token count 1..MAX_TOKENS is equally likely (a stated model, not a trace); `eager_pr` counts
# the token counts above the largest kept bucket, which run eagerly.

# %%
table = show.alignment_table(MAX_TOKENS)
off = table[~table.two_batch_overlap]
show_figure(show.alignment_heatmaps(table, MAX_TOKENS, len(default)))
ok = off[~off.pr_asserts]
rounded = off.n_round_up
pd.Series(
    dict([("(attn TP, CP) pairs", len(off)),
          ("PR filter: buckets kept, median (min)", f"{ok.n_pr.median():.0f} ({ok.n_pr.min()})"),
          ("PR filter: pairs where it asserts", int(off.pr_asserts.sum())),
          ("PR filter: most token counts left eager", int(ok.eager_pr.max())),
          ("round-up: buckets kept, median (min)", f"{rounded.median():.0f} ({rounded.min()})"),
          ("round-up: most token counts left eager", int(off.eager_round_up.max())),
          ("padding, PR filter", f"{ok.pad_frac_pr.min():.1%}–{ok.pad_frac_pr.max():.1%}"),
          ("padding, round-up",
           f"{off.pad_frac_round_up.min():.1%}–{off.pad_frac_round_up.max():.1%}")])).to_frame("")

# %%
text.blank(off[[
    "attn_tp", "attn_cp", "mul_base_pr", "lcm", "tp_x_cp", "n_pr", "n_lcm", "n_round_up", "lost_pr",
    "lost_round_up", "pad_frac_pr", "pad_frac_round_up", "eager_pr", "pr_asserts"
]].round(3))  # blank: the PR's filter asserts, nothing to pad

# %% [markdown]
# With two-batch overlap the decode runner doubles its base; the piecewise filter keeps sizes the
# decode rule would drop:

# %%
table[table.two_batch_overlap & (table.pr_below_decode_base > 0)][[
    "attn_tp", "attn_cp", "mul_base_pr", "mul_base_decode", "n_pr", "n_decode_style",
    "pr_below_decode_base"
]]

# %% [markdown]
# ### Measured: capture-style runs on 2–4 GPUs with NCCL
#
# One rank per GPU; the ranks form the attention-TP group. Each variant runs the runner's loop — a
# warm-up at the smallest size, then largest first: two eager runs and a CUDA-graph capture of
# scatter → per-token op → gather. `before` stops at the first bad size (a shard check raises before
# any collective, so nothing can hang); `before_probe` calls the collective on each raw size
# *without* that check, to show what torch's NCCL backend does with unequal shards; `pr_filter` and
# `round_up` capture every bucket and replay each with real token counts padded to it, compared with
# an all-reduce reference. With fewer than 8 GPUs the size list is the default list scaled by
# `world_size / 8`, so the same four sizes break (at 4 ranks: 2, 6, 10, 14). Per run shown: each
# size of each variant (red where it failed, blue where it was captured and replayed), and before
# vs after in words.

# %%
show.measured(run)

# %% [markdown]
# The rebuild's NCCL runs find which sizes the reduce-scatter refuses; the engine shows the same
# refusal as the start-up failure of the release without the filter, in the same words torch's NCCL
# group uses, and the release with the filter capturing exactly what the rebuild's filter keeps.

# %%
engine_view.beside(show.beside_rows(run, engine))

# %% [markdown]
# **What NCCL itself would do.** torch's NCCL process group checks `input.numel() ==
# output.numel() * world_size` on each rank *before* calling NCCL and raises `ValueError: input
# tensor must be the same size as output size times world size` — the error seen in SGLang's
# reports of the same boundary (e.g. the warm-up crash with `--max-running-requests 97` at attention
# TP 8 fixed in sgl-project/sglang#19918). With unequal `tensor_split` shards that check fails on
# **every** rank (each shard is ⌊n/w⌋ or ⌈n/w⌉ rows, and neither times w is n), so `before_probe`
# is safe to run. What NCCL does when ranks pass *different* counts to `ncclReduceScatter`
# (possible through a communicator that skips this check) is not shown: that is undefined
# behaviour — typically every rank waits for data that never comes, until a watchdog kills the job
# — and a collective hung inside a CUDA graph replay is not covered by the collective timeout at
# all. The measurement detects the bad size before the collective instead.
#
# ### See it in the profiler
#
# After the measured passes, each rank runs the capture loop once more under torch.profiler:
# `before` on the raw list, `after` on the PR's list, one range per size. Unlike the server, the
# traced `before` loop goes on after a refusal so that every refused size shows: the red ✗ is where
# `UnequalShards` was caught — no collective call on the host and no kernel on the GPU for that
# size. An accepted size issues the reduce-scatter and all-gather for its two eager runs and for the
# call under capture, but the GPU runs only the eager runs' NCCL kernels: the captured call is
# recorded into the graph.

# %%
show.profiler(run)

# %% [markdown]
# ### The claims, run by run
#
# Every claim, checked on each run shown, the checks it rests on folded under it (`sglab verify
# capture_sizes` does the same on the command line; `sglab verify engine_capture_sizes` for the
# engine's).

# %%
verdict(claims, run)
