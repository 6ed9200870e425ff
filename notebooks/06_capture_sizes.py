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
# **Claim:** with `--moe-dense-tp-size 1` every layer boundary reduce-scatters the tokens over the attention-TP
# group, which needs the token count to split into equal shards; the PR-era piecewise CUDA graph captured dummy
# batches of *every* default size, so sizes not divisible by the group size (4, 12, 20, 28 at TP 8) crashed
# server start-up. Filtering those sizes out (the PR) or rounding them up (SGLang today) makes capture and
# padded replay work.
#
# Upstream: [sgl-project/sglang#23972](https://github.com/sgl-project/sglang/pull/23972) — crash report:
# `python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct --trust-remote-code
# --tp 8 --moe-dense-tp-size 1`.
#
# The rebuild lives in `sglab.fixes.capture_sizes` (default sizes, `require_gathered_buffer`, the PR's
# `mul_base` filter, the decode runner's variant, today's round-up, and the `tensor_split` + reduce-scatter
# boundary); `sglab.experiments.capture_sizes` runs it on 2–4 GPUs.

# %% tags=["parameters"]
MODE = "auto"          # "auto" | "live" | "recorded"
WORLD_SIZES = None     # live: ranks (= attention-TP size) to run; None = [min(4, GPUs here)]
MAX_TOKENS = 2048      # piecewise_cuda_graph_max_tokens (2048 is the default for MLA models)
HIDDEN = 1024          # hidden size of the boundary's activations in the GPU run

# %%
import matplotlib.ticker
import pandas as pd

from sglab import hardware, plots, upstream
from sglab import notebook as nb
from sglab.experiments import capture_sizes as experiment
from sglab.fixes import capture_sizes as fx

pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 110)
wb = nb.Workbook("capture_sizes", gpus=experiment.GPUS, mode=MODE)

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
# sizes. At attention TP 8:

# %%
crash = fx.ParallelArgs(tp_size=8, moe_dense_tp_size=1)
attn_tp = fx.attention_tp_size(crash)
print(f"--tp 8 --moe-dense-tp-size 1: require_gathered_buffer = {fx.require_gathered_buffer(crash)}, "
      f"attention TP size = {attn_tp}")
default = fx.default_piecewise_capture_sizes(MAX_TOKENS)
print(f"PR-era default piecewise capture sizes (max {MAX_TOKENS}): {len(default)} sizes\n{default}")
sizes8 = experiment.size_table(attn_tp, MAX_TOKENS)
sizes8.head(10)

# %%
bad = sizes8[~sizes8.equal_shards]
print(f"sizes with unequal shards at attention TP {attn_tp}: {list(bad['size'])}")
try:
    fx.check_equal_shards(12, attn_tp)
except fx.UnequalShards as e:
    print("caught:", e)

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
rows = []
for tp, cp, tbo in [(8, 1, False), (8, 1, True), (4, 6, False), (3, 1, False)]:
    pr = fx.filter_piecewise_capture_sizes(default, tp, cp)
    dec = fx.filter_decode_batch_sizes(default, tp, cp, two_batch_overlap=tbo)
    rounded = fx.round_up_capture_sizes(default, fx.piecewise_mul_base(tp, cp))
    rows.append({"attn_tp": tp, "attn_cp": cp, "two_batch_overlap": tbo,
                 "PR mul_base": fx.piecewise_mul_base(tp, cp), "PR keeps": len(pr),
                 "PR drops": [n for n in default if n not in pr][:6],
                 "decode mul_base": fx.decode_mul_base(tp, cp, two_batch_overlap=tbo), "decode rule keeps": len(dec),
                 "rounded up": len(rounded), "first rounded buckets": rounded[:6]})
pd.DataFrame(rows)

# %% [markdown]
# The boundary itself, on the CPU: two `gloo` ranks run the same code as the GPU experiment (eager runs stand in
# for graph capture and replay — no CUDA here). The size list is the default list scaled by 2/8, so that exactly
# the four sizes that break at TP 8 break on 2 ranks (1, 3, 5, 7). This is a logic check, not the measurement.

# %%
cpu_df = experiment.run({"world_size": 2, "backend": "gloo", "hidden": 16, "max_tokens": 256})
experiment.summary(cpu_df)

# %% [markdown]
# ## Which buckets survive, for attention TP 1–8 × CP 1–4 × two-batch overlap
#
# Counts are over the default list (max 2048). `n_pr`: the PR's filter (ignores two-batch overlap);
# `n_decode_style`: the decode runner's rule (×2 under TBO); `n_lcm`: filtering by the least common multiple;
# `n_round_up`: rounding up to `mul_base` (sizes merge, so buckets are lost there too). Padding assumes every
# token count 1..2048 is equally likely (a stated model, not a trace); `eager_pr` counts the token counts above
# the largest kept bucket, which run eagerly.

# %%
table = experiment.alignment_table(MAX_TOKENS)
cols = ["attn_tp", "attn_cp", "mul_base_pr", "lcm", "tp_x_cp", "n_pr", "n_lcm", "n_round_up", "lost_pr",
        "lost_round_up", "pad_frac_pr", "pad_frac_round_up", "eager_pr", "pr_asserts"]
print(table[~table.two_batch_overlap][cols].round(3).to_string(index=False))

# %%
tbo = table[table.two_batch_overlap & (table.pr_below_decode_base > 0)]
print("with two-batch overlap: sizes the PR keeps that the decode rule (x2) would drop")
print(tbo[["attn_tp", "attn_cp", "mul_base_pr", "mul_base_decode", "n_pr", "n_decode_style",
           "pr_below_decode_base"]].to_string(index=False))

# %%
import numpy as np

off = table[~table.two_batch_overlap]
fig, axes = plots.figure(ncols=3, width=13.5, height=3.6)
axes = np.ravel(axes)
for ax, col, title in [(axes[0], "n_pr", "buckets kept: PR filter"),
                       (axes[1], "n_round_up", "buckets kept: rounded up"),
                       (axes[2], "pad_frac_pr", "padding overhead: PR filter\n(token counts ≤ largest bucket)")]:
    grid = off.pivot(index="attn_cp", columns="attn_tp", values=col).astype(float)
    im = ax.imshow(grid.values, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(grid.shape[1]), grid.columns)
    ax.set_yticks(range(grid.shape[0]), grid.index)
    ax.set_xlabel("attention TP")
    ax.set_ylabel("attention CP")
    ax.set_title(title)
    ax.grid(False)
    for (i, j), v in np.ndenumerate(grid.values):
        txt = "assert" if np.isnan(v) else (f"{v:.0%}" if col.startswith("pad") else f"{v:.0f}")
        ax.text(j, i, txt, ha="center", va="center", fontsize=7, color="white" if not np.isnan(v) else "red")
_ = plots.caption(fig, None, f"default list of {len(default)} sizes up to {MAX_TOKENS}; two-batch overlap off; "
                             f"padding = padded / real tokens, token counts 1..{MAX_TOKENS} equally likely")

# %%
pr_ok = off[~off.pr_asserts]
print(f"over {len(off)} (attn_tp, attn_cp) pairs, TBO off, {len(default)} default buckets:")
print(f"  PR filter keeps median {pr_ok.n_pr.median():.0f} (min {pr_ok.n_pr.min()}), asserts in "
      f"{int(off.pr_asserts.sum())} pair(s); otherwise up to {pr_ok.eager_pr.max()} of {MAX_TOKENS} token counts "
      f"fall back to eager")
print(f"  rounding up keeps median {off.n_round_up.median():.0f} (min {off.n_round_up.min()}), never asserts, "
      f"eager fallback: {off.eager_round_up.max()}; padding {off.pad_frac_round_up.min():.1%}–"
      f"{off.pad_frac_round_up.max():.1%} vs {pr_ok.pad_frac_pr.min():.1%}–{pr_ok.pad_frac_pr.max():.1%} for the PR")

# %% [markdown]
# ## Review findings

# %%
experiment.review_table(MAX_TOKENS)

# %% [markdown]
# ## Measure: capture-style runs on 2–4 GPUs with NCCL
#
# One rank per GPU; the ranks form the attention-TP group. Each variant runs the runner's loop — a warm-up at the
# smallest size, then largest first: two eager runs and a CUDA-graph capture of scatter → per-token op → gather.
# `before` stops at the first bad size (a shard check raises before any collective, so nothing can hang);
# `before_probe` calls the collective on each raw size *without* that check, to show what torch's NCCL backend
# does with unequal shards; `pr_filter` and `round_up` capture every bucket and replay each with real token counts
# padded to the bucket, compared with an all-reduce reference. With fewer than 8 GPUs the size list is the default
# list scaled by `world_size / 8`, so the same four sizes break (at 4 ranks: 2, 6, 10, 14).

# %% tags=["needs-gpu"]
if wb.live:
    sizes_to_run = WORLD_SIZES or [min(4, hardware.gpu_count())]
    for w in sizes_to_run:
        PARAMS = {**experiment.DEFAULT_PARAMS, "world_size": w, "max_tokens": MAX_TOKENS, "hidden": HIDDEN}
        wb.measure(lambda: experiment.run(PARAMS), params=PARAMS, method_version=experiment.METHOD_VERSION,
                   gpu_count=w)

# %%
runs_ = wb.results()
if not runs_:
    print("No GPU run to show: the tables above are computed live on the CPU; the capture/replay results need a "
          "run recorded on a machine with at least 2 GPUs (`sglab record capture_sizes --param world_size=4`).")

# %% [markdown]
# Every run shown, one row each (`gpus_on_machine`: GPUs on the box it ran on). `refused_sizes`: the raw sizes
# the reduce-scatter refused when called without the shard check; `before_stopped_at`: where the unfiltered
# capture loop stopped, and in which stage.

# %%
if runs_:
    allruns = experiment.runs_table(runs_)
    print(allruns[["run", "gpu", "gpus_on_machine", "world_size", "raw_sizes", "refused_sizes", "before_captured",
                   "before_stopped_at", "before_stage", "pr_filter_captured", "pr_filter_replayed_ok",
                   "pr_filter_buckets", "round_up_replayed_ok", "round_up_buckets", "pr_filter_max_abs_err",
                   "round_up_max_abs_err"]].T.to_string(header=False))
    shown = experiment.newest_per_world_size(runs_)
    print("\nin detail below: the newest run per GPU and world size —",
          "; ".join(f"{r.path.name} ({r.label}, world size {r.manifest['params']['world_size']})" for r in shown))
else:
    shown = []

# %%
for run in shown:
    print(f"— {run.label} (world size {run.manifest['params']['world_size']}) —")
    print(experiment.summary(run.df).drop(columns=["error"]).to_string(index=False))

# %%
STATUS_COLORS = {"captured + replayed": plots.PALETTE["after"], "captured": plots.PALETTE["graph"],
                 "ok (eager)": plots.PALETTE["eager"], "failed": plots.PALETTE["before"],
                 "not reached": "#d5d8dc"}


def size_status(df):
    """One status per (variant, size)."""
    out = []
    for (v, n), g in df.groupby(["variant", "size"]):
        m = dict(zip(g.metric, g.value))
        if m.get("failed"):
            s = "failed"
        elif m.get("not_reached"):
            s = "not reached"
        elif m.get("replay_ok"):
            s = "captured + replayed"
        elif m.get("captured"):
            s = "captured"
        else:
            s = "ok (eager)" if m.get("ok") else "?"
        out.append({"variant": v, "size": n, "status": s})
    return pd.DataFrame(out)


for run in shown:
    st = size_status(run.df)
    order = ["before", "before_probe", "pr_filter", "round_up"]
    fig, ax = plots.figure(width=10, height=2.8)
    for y, v in enumerate(order):
        sub = st[st.variant == v]
        for status, color in STATUS_COLORS.items():
            pts = sub[sub.status == status]
            if len(pts):
                ax.scatter(pts["size"], [y] * len(pts), color=color, s=28, label=status)
        for n in sub[sub.status == "failed"]["size"]:
            ax.annotate(str(n), (n, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                        color=STATUS_COLORS["failed"])
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yticks(range(len(order)), order)
    ax.set_ylim(-0.5, len(order) - 0.3)
    ax.set_xlabel("capture size (tokens, log scale)")
    w = run.manifest["params"]["world_size"]
    ax.set_title(f"capture sizes at attention TP {w}")
    _ = plots.caption(fig, run, f"world size {w}")

# %% [markdown]
# ### Before vs after, from the data

# %%
for run in shown:
    s = experiment.summary(run.df).set_index("variant")
    w = run.manifest["params"]["world_size"]
    n_raw = int(s.loc["before", "sizes"])
    print(f"world size {w} ({run.label}):")
    print(f"  before: {int(s.loc['before', 'captured_or_ok'])} of {n_raw} sizes captured; the loop stopped at size "
          f"{int(s.loc['before', 'first_failure'])} in its {s.loc['before', 'failed_at']} stage "
          f"({s.loc['before', 'error'][:90]}...)")
    print(f"  without the shard check, the collective refused {int(s.loc['before_probe', 'failed'])} of {n_raw} "
          f"sizes {s.loc['before_probe', 'failed_sizes']}: {s.loc['before_probe', 'error'][:110]}")
    for v in ("pr_filter", "round_up"):
        print(f"  {v}: {int(s.loc[v, 'captured_or_ok'])} of {int(s.loc[v, 'sizes'])} buckets captured, "
              f"{int(s.loc[v, 'replayed_ok'])} replayed correctly over {int(s.loc[v, 'replay_checks'])} padded "
              f"replays (worst |error| {s.loc[v, 'worst_replay_err']:.2e})")
    lists = experiment.size_lists(w, run.manifest["params"]["sizes"], run.manifest["params"]["max_tokens"])
    same = lists["pr_filter"] == lists["round_up"]
    print(f"  the PR's list and the rounded-up list are {'identical' if same else 'different'} here"
          + (" (every dropped size rounds onto a bucket already in the list), so this run cannot tell the two apart;"
             " the tables above show where they differ" if same else ""))

# %% [markdown]
# ### What NCCL itself would do
#
# torch's NCCL process group checks `input.numel() == output.numel() * world_size` on each rank *before* calling
# NCCL and raises `ValueError: input tensor must be the same size as output size times world size` — the error
# seen in SGLang's reports of the same boundary (e.g. the warm-up crash with
# `--max-running-requests 97` at attention TP 8 fixed in sgl-project/sglang#19918). With unequal `tensor_split` shards that check fails on **every** rank (each shard is
# ⌊n/w⌋ or ⌈n/w⌉ rows, and neither times w is n), so `before_probe` is safe to run. What NCCL does when ranks
# pass *different* counts to `ncclReduceScatter` (possible through a communicator that skips this check) is not
# shown: that is undefined behaviour — typically every rank waits forever for data that never comes, until a
# watchdog kills the job — and a collective hung inside a CUDA graph replay is not covered by the collective
# timeout at all. The experiment detects the bad size before the collective instead.

# %%
print("installed SGLang:", upstream.check("capture_sizes"))

# %% [markdown]
# ## Takeaways and review points
#
# * The crash was purely arithmetic: a reduce-scatter over `attn_tp` ranks needs `n % attn_tp == 0`, and the
#   piecewise runner was the one path that fed it raw sizes. The CPU tables show which configurations lose which
#   buckets; the GPU run shows the failure and that every filtered or rounded bucket captures and replays correctly
#   when real token counts are padded to it.
# * `mul_base` is a common multiple of attn TP and CP but not always the least (tp 4, cp 6 → 24 vs 12), and the
#   code comment promises `attn_tp_size * attn_cp_size`, which the code does not enforce (tp 4, cp 2 → 4, not 8).
# * The decode runner doubles `mul_base` under two-batch overlap; the piecewise filter does not.
# * Dropping sizes costs buckets (and, for non-power-of-two TP, coverage at the top: token counts above the
#   largest kept bucket run eagerly); rounding up never asserts and keeps more buckets for the same alignment
#   (counts printed under the heatmaps) — the approach SGLang later took.
# * The GPU runs use a list scaled to the GPUs available, so the failing residues match TP 8; there the filtered
#   and rounded-up lists coincide, so the GPU part shows that both work, not which is better.
