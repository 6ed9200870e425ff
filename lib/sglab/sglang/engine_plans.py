"""The real-engine scenarios the notebooks need, as plain data
(:class:`sglab.sglang.engine.Scenario`).

Each scenario names its fix, a model folder under ``data/models/``, the tool, the releases and the
cases (server arguments and harness adjustments). ``sglab engine --scenario NAME`` runs one (one
engine per release and case, one after the other), ``--plan NN`` all of a notebook's;
``scripts/engine_gpu.sh`` does so on a GPU box. These will move into each fix's record
(``Fix.engine``); nothing here imports a fix.

Releases: only those pinning the GPU image's torch (2.11.0) start there: 0.5.11, 0.5.12.post1,
0.5.13, 0.5.14. A scenario naming another release (06's round-up, 0.5.23) stops at the pin check
with one line until an image with its torch is at hand.
"""

from __future__ import annotations

from sglab.sglang.engine import Case, Scenario

PCG_TOKENS = ("128", "256", "512", "1024")
_PCG = ("--piecewise-cuda-graph-tokens", *PCG_TOKENS)

SCENARIOS: tuple[Scenario, ...] = (
    # 01 pcg_gate (#26382): Kimi-K2.5's wrapper and the piecewise gate
    Scenario(
        fix="pcg_gate",
        name="01-kimi-pcg",
        what="Kimi-K2.5 tiny (2 DeepSeek-V3 layers, MLA, 8 experts; 1-layer vision tower): "
        "piecewise CUDA graph decided by the release, and prefill latency per token count "
        "with it on and off",
        model="kimi_k25_tiny",
        tool="bench",
        releases=("0.5.12.post1", "0.5.13"),
        cases=(
            Case("default", _PCG, releases=("0.5.13",)),
            Case("default", _PCG, ("kimi-k25-post-load-weights",), releases=("0.5.12.post1",)),
            Case("enforce", ("--enforce-piecewise-cuda-graph", *_PCG), releases=("0.5.13",)),
            Case(
                "enforce",
                ("--enforce-piecewise-cuda-graph", *_PCG),
                ("kimi-k25-post-load-weights",),
                releases=("0.5.12.post1",),
            ),
            Case("pcg-off", ("--disable-piecewise-cuda-graph",), releases=("0.5.13",)),
            Case(
                "pcg-off",
                ("--disable-piecewise-cuda-graph",),
                ("kimi-k25-post-load-weights",),
                releases=("0.5.12.post1",),
            ),
        ),
        input_lens=(128, 256, 512, 1024),
        repeats=5,
        output_len=8,
        expect="default: disabled by ServerArgs (multimodal) on both; enforce: 0.5.12.post1 'the "
        "model is not a language model', 0.5.13 captured for [128, 256, 512, 1024]; "
        "pcg-off: the eager baseline",
    ),
    Scenario(
        fix="pcg_gate",
        name="01-llama-pcg",
        what="Llama-style 32 layers x hidden 512 (launch-bound prefill): prefill with and without "
        "piecewise CUDA graphs",
        model="llama_32x512",
        tool="bench",
        releases=("0.5.13",),
        cases=(Case("pcg", _PCG), Case("pcg-off", ("--disable-piecewise-cuda-graph",))),
        input_lens=(128, 256, 512, 1024),
        repeats=5,
        output_len=8,
        expect="pcg faster at every size (facts: 13.2/14.3/17.6 ms vs 16.1/21.5/19.6 ms, single "
        "shots)",
    ),
    # 03 breakable_graph (#24662): several requests in one prefill
    Scenario(
        fix="breakable_graph",
        name="03-bcg-requests",
        what="--enable-breakable-cuda-graph with 1 to 8 requests per prefill (Engine API, one "
        "generate call per batch): graph used or eager fallback per prefill batch (the "
        "scheduler's 'Prefill batch' line), and latency",
        model="llama_32x512",
        tool="engine",
        releases=("0.5.11", "0.5.12.post1"),
        cases=(
            Case("bcg", ("--enable-breakable-cuda-graph", *_PCG, "--disable-radix-cache")),
            Case("eager", ("--disable-piecewise-cuda-graph", "--disable-radix-cache")),
        ),
        requests=(1, 2, 4, 8),
        input_lens=(128,),
        output_len=1,
        repeats=5,
        expect="0.5.11: graph only with one request (can_run rejects batch_size > 1); "
        "0.5.12.post1: graph at every batch",
    ),
    # 04 swa_loc (#23552): kernels per decode-graph replay
    Scenario(
        fix="swa_loc",
        name="04-swa-kernels",
        what="GPT-OSS-style model (8 layers, 4 sliding-window): kernels per decode-graph replay "
        "and per layer from bench_one_batch's own decode trace; 'before' = 0.5.11 with "
        "#23552's preset reverted",
        model="gpt_oss_swa",
        tool="bench",
        releases=("0.5.11", "0.5.12.post1", "0.5.13"),
        cases=(
            Case("released"),
            Case("before", (), ("revert-pr23552-swa-loc-preset",), releases=("0.5.11",)),
        ),
        batch_sizes=(32,),
        input_lens=(256,),
        output_len=16,
        profile=True,
        expect="before: one translation gather per SWA layer more per replay than 0.5.11 released",
    ),
    # 02 workspace_floor (#26382 part B): TP 2
    Scenario(
        fix="workspace_floor",
        name="02-ar-fusion",
        gpus=2,
        what="--enable-flashinfer-allreduce-fusion at TP 2 over a short-prompt trace: FlashInfer "
        "workspace creations per forward step (needs the whole FlashInfer package: "
        "FLASHINFER_FULL=1 bundles)",
        model="deepseek_v3_tiny",
        tool="engine",
        releases=("0.5.12.post1", "0.5.13"),
        cases=(
            Case(
                "fusion",
                ("--tp-size", "2", "--enable-flashinfer-allreduce-fusion", "--disable-radix-cache"),
                ("trace-flashinfer-workspace",),
            ),
        ),
        requests=(1,),
        input_lens=(4, 16, 64, 200, 700, 1500, 2100, 3000),
        output_len=4,
        repeats=1,
        timeout=1500.0,
        expect="0.5.12.post1 re-creates the workspace as prompts grow; 0.5.13 creates it once "
        "(max(x, 2048))",
    ),
    # 05 grid_thw (#22858): TP 2, an image
    Scenario(
        fix="grid_thw",
        name="05-grid-thw",
        gpus=2,
        what="Kimi-K2.5 tiny fed one image at TP 2: each process's memory on GPU 0 (nvidia-smi) "
        "with the grid on the CPU (0.5.11) and with #22858's line reverted",
        model="kimi_k25_tiny",
        tool="engine",
        releases=("0.5.11",),
        cases=(
            Case("released", ("--tp-size", "2", "--mm-attention-backend", "triton_attn")),
            Case(
                "before",
                ("--tp-size", "2", "--mm-attention-backend", "triton_attn"),
                ("revert-pr22858-grid-thw-cpu",),
            ),
        ),
        requests=(1,),
        input_lens=(16,),
        output_len=1,
        repeats=1,
        image_size=(448, 448),
        # Kimi-K2.5's chat template for one image (its processor expands the pad token)
        prompt="<|media_start|>image<|media_content|><|media_pad|><|media_end|> Describe it.",
        expect="before: rank 1 holds memory on GPU 0; released: none",
    ),
    # 06 capture_sizes (#23972): TP 2, dense TP 1
    Scenario(
        fix="capture_sizes",
        name="06-dense-tp1",
        gpus=2,
        what="--moe-dense-tp-size 1 with attention TP 2 on piecewise capture sizes that TP 2 does "
        "not divide: 0.5.14 (filter lost) fails at start-up as in the PR, 0.5.11's filter "
        "starts, 0.5.23's round-up starts (needs an image with its torch)",
        model="deepseek_v3_tiny",
        tool="engine",
        releases=("0.5.14", "0.5.11", "0.5.23"),
        cases=(
            Case(
                "odd-sizes",
                (
                    "--tp-size",
                    "2",
                    "--moe-dense-tp-size",
                    "1",
                    "--piecewise-cuda-graph-tokens",
                    "3",
                    "4",
                    "5",
                    "8",
                    "--cuda-graph-max-bs",
                    "8",
                    "--disable-radix-cache",
                ),
                releases=("0.5.14", "0.5.11"),
            ),
            # 0.5.2x renamed the capture-size flags (read from its srt/arg_groups/fields/)
            Case(
                "odd-sizes",
                (
                    "--tp-size",
                    "2",
                    "--moe-dense-tp-size",
                    "1",
                    "--cuda-graph-bs-prefill",
                    "3",
                    "4",
                    "5",
                    "8",
                    "--cuda-graph-max-bs-decode",
                    "8",
                    "--disable-radix-cache",
                ),
                releases=("0.5.23",),
            ),
        ),
        requests=(1,),
        input_lens=(64,),
        output_len=4,
        repeats=1,
        timeout=900.0,
        expect="0.5.14: start-up fails in the reduce-scatter of an odd size; 0.5.11: captures the "
        "even sizes [4, 8]; 0.5.23: captures every size rounded up to a multiple of 2 "
        "(Engine tool: 0.5.23 has no bench_one_batch)",
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}


def scenario(name: str) -> Scenario:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r} (known: {', '.join(BY_NAME)})") from None


def plan(number: str) -> list[Scenario]:
    """The scenarios of one notebook (``"01"``)."""
    return [s for s in SCENARIOS if s.name.startswith(f"{number}-")]
