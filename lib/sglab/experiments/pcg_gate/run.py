"""Notebook 01 on one GPU: eager prefill (gate off) vs piecewise-CUDA-graph prefill (gate on), per token count.

Phases of :func:`run` (each timed by :mod:`sglab.core.timing`):

1. ``build``: the bf16 LLM (``DEFAULT_PARAMS``: hidden 2048, 16 layers, Kimi-shaped wrappers around it).
2. ``gate``: every wrapper variant through the PR-era gate (rows: decision, key counts). ``no_alias`` fails, so its
   prefill is the plain eager forward; ``property_guard`` passes, so its prefill runs through
   :class:`sglab.fixes.pcg_gate.PiecewiseRunner`.
3. ``capture``: one graph per segment per bucket (50 buckets × 17 segments, one pool); a second runner whose pieces
   hand over their own tensors instead of copying (``direct_token_counts`` only): the diagnosis of the slowdown
   at large token counts.
4. ``correctness``: piecewise vs eager, and vs the same padded segments run eagerly.
5. ``timing``: eager, piecewise (and direct) in interleaved rounds (:func:`sglab.core.timing.interleaved`).
6. ``profile``: a separate traced pass and a per-kernel table (:mod:`.profile`); it never touches the timings.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from sglab.core import runs
from sglab.fixes import pcg_gate as gate
from sglab.core.toy_decoder import DecoderConfig
from sglab.core import timing as phases
from sglab.experiments.pcg_gate import profile
from sglab.experiments.pcg_gate.variants import gate_rows, quiet_gate

EXPERIMENT = "pcg_gate"
METHOD_VERSION = 2  # 2: interleaved timing loop, lean sweep, per-variant gate rows, direct hand-off, traced pass,
#                     per-kernel table

DEFAULT_PARAMS = {
    "hidden": 2048,
    "num_layers": 16,
    "num_heads": 16,           # head_dim = hidden / num_heads = 128
    "intermediate": 5632,
    "vocab": 32000,
    "max_tokens": 4096,        # --piecewise-cuda-graph-max-tokens: buckets of the upstream list up to this
    "token_counts": [16, 64, 100, 256, 1024, 2048, 4096],  # 100 is padded to 112
    "direct_token_counts": [2048, 4096],  # also timed with the pieces handing over their own tensors (no copies)
    "trace_token_counts": [64, 4096],     # the traced pass: one launch-bound and one GEMM-bound prefill
    "kernel_table_tokens": 4096,          # the per-kernel table of the eager prefill (nsight-python)
    "kernel_table_runs": 3,
    "warmup": 3,
    "repeat": 15,              # samples per variant and token count, taken in `rounds` alternating rounds
    "rounds": 3,
    "seed": 0,
}

TOL_ULPS = 8  # accepted max |piecewise - eager|: 8 bf16 units in the last place at the output's max magnitude


def bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers at magnitude ``x`` (8 significant bits)."""
    if x <= 0:
        return 2.0 ** -133
    return 2.0 ** (math.floor(math.log2(x)) - 7)


def bf16_tolerance(ref_max_abs: float) -> float:
    return TOL_ULPS * bf16_ulp(ref_max_abs)


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max abs difference, relative RMS difference, the reference's max magnitude and the bf16 verdict."""
    a, b = out.float(), ref.float()
    diff = (a - b).abs()
    ref_max = float(b.abs().max())
    max_diff = float(diff.max())
    rel_rms = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))
    tol = bf16_tolerance(ref_max)
    return {"max_abs_diff": max_diff, "rel_rms_diff": rel_rms, "ref_max_abs": ref_max, "tolerance": tol,
            "within_tol": bool(max_diff <= tol)}


def model_config(p: dict) -> DecoderConfig:
    return DecoderConfig(vocab_size=int(p["vocab"]), hidden_size=int(p["hidden"]), num_layers=int(p["num_layers"]),
                         num_heads=int(p["num_heads"]), intermediate_size=int(p["intermediate"]),
                         max_position=int(p["max_tokens"]), positions="rotary")


def _sdpa_backends():
    """Flash / memory-efficient attention only (never the O(n^2)-memory math fallback) on CUDA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def run(params: dict | None = None, *, progress: bool = True) -> runs.Measured:
    """Eager prefill (gate off) vs piecewise-graph prefill (gate on) per token count, on one GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("pcg_gate.run needs a CUDA GPU")
    from sglab.core.timing import cuda_time

    dev = torch.device("cuda", torch.cuda.current_device())
    with _sdpa_backends():
        return _run({**DEFAULT_PARAMS, **(params or {})}, dev, use_graphs=True, timer=cuda_time, progress=progress)


class _Mem:
    """CUDA allocator readings; zeros on the CPU (where only the row layout is exercised)."""

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"

    def allocated(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else 0

    def reserved(self) -> int:
        if not self.cuda:
            return 0
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved()


def _row(variant, metric, value, unit, n=None, bucket=None) -> dict:
    return {"variant": variant, "num_tokens": n, "bucket": bucket, "metric": metric, "value": float(value),
            "unit": unit}


def _runners(lm, p: dict, capture_tokens: list, use_graphs: bool, say) -> tuple:
    """The gate on every wrapper variant (rows), and the runners the passing wrapper gets."""
    with phases.phase("gate"):
        rows = gate_rows(lm, int(p["num_layers"]), capture_tokens)
        decisions = {}
        for variant in ("no_alias", "property_guard"):
            state = gate.ModelRunnerState(gate.build_wrapper(variant, language_model=lm),
                                          num_hidden_layers=int(p["num_layers"]),
                                          piecewise_cuda_graph_tokens=capture_tokens)
            with quiet_gate():
                decisions[variant] = (gate.init_piecewise_cuda_graphs(state), state)
            say(f"gate[{variant}]: {decisions[variant][0].message}")
        (res_off, _), (res_on, state_on) = decisions["no_alias"], decisions["property_guard"]
        if res_off.enabled or not res_on.enabled:
            raise RuntimeError("gate outcome not as expected: no_alias must be off, property_guard on")
    rows += [_row("eager", "gate_enabled", res_off.enabled, "bool"),
             _row("piecewise", "gate_enabled", res_on.enabled, "bool")]
    make = partial(gate.PiecewiseRunner, res_on.layer_model, state_on.attention_layers)
    runner = make(capture_tokens, use_graphs=use_graphs)
    ref_runner = make(capture_tokens, use_graphs=False)  # same padded shapes, no graphs
    direct = None
    if use_graphs and p["direct_token_counts"]:
        direct = make(sorted({gate.bucket_for(int(n), capture_tokens) for n in p["direct_token_counts"]}),
                      handoff="direct")
    return rows, runner, ref_runner, direct


def _capture(runner, direct, mem: _Mem, n_buckets: int, progress: bool, say) -> list:
    with phases.phase("capture"):
        reserved0 = mem.reserved()
        runner.capture(progress=progress)
        pool_mib = (mem.reserved() - reserved0) / 2**20
        if direct is not None:
            direct.capture()
    say(f"captured {runner.num_graphs} graphs in {runner.capture_s:.1f} s, pool {pool_mib:.0f} MiB"
        + (f"; direct hand-off: {direct.num_graphs} graphs for buckets {direct.sizes}" if direct else ""))
    return [_row("piecewise", "capture_time", runner.capture_s, "s"),
            _row("piecewise", "graphs", runner.num_graphs, "count"),
            _row("piecewise", "buckets", n_buckets, "count"),
            _row("piecewise", "graph_pool", pool_mib, "MiB"),
            _row("piecewise", "static_buffers", runner.static_bytes / 2**20, "MiB")]


def _correctness_rows(n, N, eager_fwd, ids, pos, runner, ref_runner, direct) -> list:
    """Piecewise vs the eager forward, and vs the same padded segments run eagerly (and direct vs eager when
    ``direct`` runs this token count)."""
    ref = eager_fwd(ids, pos).clone()
    pcg = runner.forward(ids).clone()
    c, c_same = compare(pcg, ref), compare(pcg, ref_runner.forward(ids).clone())
    rows = [_row("piecewise", m, c[m], u, n, N) for m, u in (("max_abs_diff", "abs"), ("rel_rms_diff", "ratio"),
                                                             ("ref_max_abs", "abs"), ("tolerance", "abs"),
                                                             ("within_tol", "bool"))]
    rows.append(_row("piecewise", "max_abs_diff_same_shape", c_same["max_abs_diff"], "abs", n, N))
    if direct is not None:
        rows.append(_row("piecewise_direct", "max_abs_diff", compare(direct.forward(ids).clone(), ref)
                         ["max_abs_diff"], "abs", n, N))
    return rows


def _timing_rows(n, N, fns: dict, p: dict, timer) -> list:
    from sglab.core.timing import interleaved

    timed = interleaved(fns, rounds=max(1, int(p["rounds"])), warmup=int(p["warmup"]), repeat=int(p["repeat"]),
                        timer=timer)
    return [r for variant, t in timed.items() for r in t.rows(variant=variant, num_tokens=n, bucket=N)]


def _run(p: dict, dev: torch.device, *, use_graphs: bool, timer, progress: bool) -> runs.Measured:
    """The measurement on ``dev``. On the CPU (tests of the row plumbing) there are no graphs, no direct runner and
    no kernel table; the traced pass records host events only."""
    from tqdm.auto import tqdm

    p = {**DEFAULT_PARAMS, **p}
    torch.manual_seed(int(p["seed"]))
    capture_tokens = gate.piecewise_cuda_graph_tokens(int(p["max_tokens"]))
    counts = [int(n) for n in p["token_counts"]]
    too_big = [n for n in counts + [int(x) for x in p["trace_token_counts"]] if n > capture_tokens[-1]]
    if too_big:
        raise ValueError(f"token count(s) {too_big} above the largest bucket {capture_tokens[-1]}")
    if not {int(n) for n in p["direct_token_counts"]} <= set(counts):
        raise ValueError("direct_token_counts must be a subset of token_counts (they are timed together)")
    say = print if progress else (lambda *a, **k: None)
    mem = _Mem(dev)
    with torch.no_grad():
        with phases.phase("build"):
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            mem0 = mem.allocated()
            lm = gate.language_model(model_config(p), dev, seed=int(p["seed"]),
                                     dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
            weights_mib = (mem.allocated() - mem0) / 2**20
        say(f"model: {p['num_layers']} layers, hidden {p['hidden']}, {weights_mib:.0f} MiB of weights")
        rows, runner, ref_runner, direct = _runners(lm, p, capture_tokens, use_graphs, say)
        rows.append(_row("eager", "weights", weights_mib, "MiB"))
        rows += _capture(runner, direct, mem, len(capture_tokens), progress, say)
        direct_counts = {int(n) for n in p["direct_token_counts"]} if direct is not None else set()
        eager_fwd = lm.model.forward  # gate off: the plain forward, launched op by op
        gen = torch.Generator().manual_seed(int(p["seed"]))
        inputs = {}
        for n in tqdm(counts, desc="token counts", disable=not progress):
            ids = torch.randint(0, int(p["vocab"]), (n,), generator=gen).to(dev)
            pos = torch.arange(n, device=dev)
            N = runner.bucket(n)
            inputs[n] = (ids, pos)
            with phases.phase("correctness"):
                rows += _correctness_rows(n, N, eager_fwd, ids, pos, runner, ref_runner,
                                          direct if n in direct_counts else None)
            fns = {"eager": partial(eager_fwd, ids, pos), "piecewise": partial(runner.forward, ids)}
            if n in direct_counts:
                fns["piecewise_direct"] = partial(direct.forward, ids)
            with phases.phase("timing"):
                rows += _timing_rows(n, N, fns, p, timer)
        with phases.phase("profile"):
            prof = profile.profile_pass(p, dev, eager_fwd, runner, ref_runner, direct, inputs,
                                        vocab=int(p["vocab"]))
        rows += prof.rows
        if dev.type == "cuda":
            rows.append(_row("process", "peak_allocated", torch.cuda.max_memory_allocated() / 2**20, "MiB"))
        del runner, ref_runner, direct, lm, eager_fwd, inputs
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=prof.sidecars, extra=prof.extra)

