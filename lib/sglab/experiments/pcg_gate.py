"""Notebook 01: what the piecewise-CUDA-graph gate buys a VLM wrapper that passes it (#26382 part A).

Two parts:

- :func:`variant_table` and :func:`guard_table` (CPU): the four Kimi-shaped wrappers through the PR-era gate:
  gate outcome, resolved layer stack, ``state_dict()`` keys, ``named_parameters(remove_duplicate=False)``,
  round trips; and what a ``__setattr__`` guard still lets through and what it swallows.
- :func:`run` (one GPU): a bf16 decoder (``DEFAULT_PARAMS``: hidden 2048, 16 layers) wrapped the Kimi way.
  The ``no_alias`` wrapper fails the gate, so its prefill runs eagerly; the ``property_guard`` wrapper passes,
  and its prefill runs through :class:`PiecewiseRunner`: one CUDA graph per segment between two attention
  calls (attention stays eager, on the real token count), one set of graphs per token-count bucket of
  ``ServerArgs._generate_piecewise_cuda_graph_tokens``, the batch padded up to its bucket, every capture in
  one shared graph memory pool. Reports latency per token count (median, p10, p90) and the difference of the
  piecewise output from the eager one.

The runner mirrors what SGLang's ``PiecewiseCudaGraphRunner`` does at run time (split at the attention op,
pad to the smallest captured size, replay) without torch.compile: the model's layers expose their two
halves (``pre_attn`` / ``post_attn``) and the runner captures them directly.
"""

from __future__ import annotations

import math
import time
from typing import Optional

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from sglab import runs as _runs
from sglab.fixes import pcg_gate as gate

EXPERIMENT = "pcg_gate"
METHOD_VERSION = 1
GPUS = 1

DEFAULT_PARAMS = {
    "hidden": 2048,
    "num_layers": 16,
    "num_heads": 16,           # head_dim = hidden / num_heads = 128
    "intermediate": 5632,
    "vocab": 32000,
    "max_tokens": 4096,        # --piecewise-cuda-graph-max-tokens: buckets of the upstream list up to this
    "token_counts": [16, 32, 64, 100, 128, 256, 512, 1000, 1024, 2048, 3000, 4096],
    "warmup": 5,
    "repeat": 30,              # samples per mode and token count, taken in 3 alternating rounds
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


# ---------------------------------------------------------------------------------------------------------------
# CPU part: the variants through the gate
# ---------------------------------------------------------------------------------------------------------------
def variant_table(variants=gate.VARIANTS + gate.EXTRA_VARIANTS) -> pd.DataFrame:
    """One row per wrapper variant after the PR-era gate ran on it."""
    canonical = gate.build_wrapper("no_alias").state_dict()
    rows = []
    for v in variants:
        w = gate.build_wrapper(v)
        keys_before = len(w.state_dict())
        res = gate.init_piecewise_cuda_graphs(gate.ModelRunnerState(w, num_hidden_layers=2))
        sd = w.state_dict()
        rt = gate.strict_load(gate.build_wrapper(v, seed=1), sd)
        cn = gate.strict_load(w, canonical)
        rows.append({
            "variant": v,
            "gate": "PCG on" if res.enabled else "PCG off",
            "gate message": res.message,
            "layer stack": res.layer_model_path or "-",
            "state_dict keys (built)": keys_before,
            "state_dict keys (after gate)": len(sd),
            "named_parameters(remove_duplicate=False)": len(list(w.named_parameters(remove_duplicate=False))),
            "'model' in _modules": gate.has_duplicate_registration(w),
            "save -> fresh load (strict)": rt.summary,
            "HF-named checkpoint -> load (strict)": cn.summary,
        })
    return pd.DataFrame(rows).set_index("variant")


def state_dict_keys(variant: str, after_gate: bool = True) -> list[str]:
    """The full key list of one variant (before or after the gate wrote ``.model``)."""
    w = gate.build_wrapper(variant)
    if after_gate:
        gate.init_piecewise_cuda_graphs(gate.ModelRunnerState(w, num_hidden_layers=2))
    return list(w.state_dict())


def guard_table() -> pd.DataFrame:
    return pd.DataFrame(gate.guard_side_effects()).set_index("action")


# ---------------------------------------------------------------------------------------------------------------
# The GPU model: a bf16 decoder with the DeepseekV3ForCausalLM attribute shape (.model.layers[i].self_attn.attn)
# ---------------------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary(nn.Module):
    """cos/sin tables indexed by position (non-persistent buffers, in the model dtype)."""

    def __init__(self, head_dim: int, max_pos: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.max_pos, self.base = head_dim, max_pos, base
        self.reset()

    def reset(self, device=None, dtype=torch.float32) -> None:
        """(Re)compute the tables in fp32 on ``device``, stored as ``dtype``."""
        d = self.head_dim
        inv = 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        ang = torch.outer(torch.arange(self.max_pos, dtype=torch.float32, device=device), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().to(dtype), persistent=False)
        self.register_buffer("sin", ang.sin().to(dtype), persistent=False)

    def forward(self, x, positions):  # x: (n, ..., d), q and k rotated together
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        cos = self.cos[positions].view(shape)
        sin = self.sin[positions].view(shape)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """The split point (``RadixAttention``'s place): causal attention over one sequence of the real length."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim

    def forward(self, q, k, v):  # (n, heads, d) each -> (n, heads * d)
        n = q.shape[0]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            is_causal=True)
        return o.squeeze(0).transpose(0, 1).reshape(n, self.num_heads * self.head_dim)


class SelfAttn(nn.Module):
    def __init__(self, hidden: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden // num_heads
        self.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.attn = Attention(num_heads, self.head_dim)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        g, u = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(g) * u)


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, num_heads: int, intermediate: int):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = SelfAttn(hidden, num_heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def pre_attn(self, h, positions, rotary):
        """Everything of this layer before attention: norm, qkv projection, rotary -> q, k, v."""
        n, sa = h.shape[0], self.self_attn
        qkv = sa.qkv_proj(self.input_layernorm(h)).view(n, 3, sa.num_heads, sa.head_dim)
        q, k = rotary(qkv[:, :2], positions).unbind(1)
        return q, k, qkv[:, 2]

    def post_attn(self, attn_out, residual):
        """Everything after attention: output projection, residual, norm, MLP, residual."""
        h = residual + self.self_attn.o_proj(attn_out)
        return h + self.mlp(self.post_attention_layernorm(h))


class TextModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, num_layers: int, num_heads: int, intermediate: int,
                 max_pos: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, num_heads, intermediate) for _ in range(num_layers))
        self.norm = RMSNorm(hidden)
        self.rotary = Rotary(hidden // num_heads, max_pos)

    def forward(self, input_ids, positions):
        """The eager prefill: one sequence, every op launched from Python."""
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            q, k, v = layer.pre_attn(h, positions, self.rotary)
            h = layer.post_attn(layer.self_attn.attn(q, k, v), h)
        return self.norm(h)


class DecoderLM(nn.Module):
    """``language_model``: holds the text model as ``.model`` (no lm_head: prefill latency stops at the final
    norm, logits of the last token are outside the captured region upstream as well)."""

    def __init__(self, **cfg):
        super().__init__()
        self.model = TextModel(**cfg)


def build_language_model(params: dict, device, dtype=torch.bfloat16) -> DecoderLM:
    """Seeded weights with a residual-friendly init (unit-variance projections, output projections scaled by
    1/sqrt(2 * layers)), so the bf16 residual stream stays O(1) over the whole stack."""
    p = {**DEFAULT_PARAMS, **params}
    with torch.device("meta"):
        lm = DecoderLM(vocab=p["vocab"], hidden=p["hidden"], num_layers=p["num_layers"],
                       num_heads=p["num_heads"], intermediate=p["intermediate"], max_pos=p["max_tokens"])
    lm = lm.to_empty(device=device).to(dtype=dtype)  # no default init: every tensor is set below
    gen = torch.Generator(device=device).manual_seed(int(p["seed"]))
    out_scale = 1.0 / math.sqrt(2 * p["num_layers"])
    with torch.no_grad():
        for name, prm in lm.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
            elif "embed_tokens" in name:
                prm.normal_(0.0, 1.0, generator=gen)
            else:
                std = 1.0 / math.sqrt(prm.shape[1])
                if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                    std *= out_scale
                prm.normal_(0.0, std, generator=gen)
    lm.model.rotary.reset(device, dtype)
    lm.requires_grad_(False)
    return lm.eval()


# ---------------------------------------------------------------------------------------------------------------
# The piecewise runner
# ---------------------------------------------------------------------------------------------------------------
class PiecewiseRunner:
    """Piecewise prefill over a text model whose layers have ``pre_attn`` / ``post_attn`` halves.

    Segment ``i`` (0..L) is: ``post_attn`` of layer i-1 (or the embedding for i=0), then ``pre_attn`` of layer
    i (or the final norm for i=L). Segments read and write fixed buffers sized for the largest bucket (input
    ids, positions, residual, q/k/v, attention output, final output) so nothing allocated inside a capture
    has to outlive it: all captures can share one memory pool. Attention runs eagerly between segment
    replays on the first ``n`` rows only (the real tokens); padded rows never mix with real ones, because
    every other op works row by row.

    ``use_graphs=False`` runs the same segments eagerly on the same padded buffers (the same-shape reference,
    and what the CPU tests exercise).
    """

    def __init__(self, text_model: TextModel, attention_layers: list, capture_tokens: list[int], *,
                 use_graphs: bool = True):
        self.m = text_model
        self.layers = list(text_model.layers)
        self.attention_layers = list(attention_layers)
        if len(self.attention_layers) != len(self.layers):
            raise ValueError("one attention layer per decoder layer expected")
        self.sizes = sorted(capture_tokens)
        self.use_graphs = use_graphs
        w = text_model.embed_tokens.weight
        dev, dt = w.device, w.dtype
        n_max, hidden = self.sizes[-1], w.shape[1]
        sa = self.layers[0].self_attn
        self.ids = torch.zeros(n_max, dtype=torch.long, device=dev)
        self.pos = torch.arange(n_max, dtype=torch.long, device=dev)
        self.res = torch.zeros(n_max, hidden, dtype=dt, device=dev)
        self.q = torch.zeros(n_max, sa.num_heads, sa.head_dim, dtype=dt, device=dev)
        self.k = torch.zeros_like(self.q)
        self.v = torch.zeros_like(self.q)
        self.attn_out = torch.zeros(n_max, sa.num_heads * sa.head_dim, dtype=dt, device=dev)
        self.out = torch.zeros(n_max, hidden, dtype=dt, device=dev)
        self.graphs: dict[int, list] = {}
        self.capture_s = 0.0

    @property
    def static_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in
                   (self.ids, self.pos, self.res, self.q, self.k, self.v, self.attn_out, self.out))

    @property
    def num_graphs(self) -> int:
        return sum(len(g) for g in self.graphs.values())

    def _segment(self, i: int, N: int) -> None:
        L = len(self.layers)
        if i == 0:
            h = self.m.embed_tokens(self.ids[:N])
        else:
            h = self.layers[i - 1].post_attn(self.attn_out[:N], self.res[:N])
        if i < L:
            self.res[:N].copy_(h)
            q, k, v = self.layers[i].pre_attn(h, self.pos[:N], self.m.rotary)
            self.q[:N].copy_(q)
            self.k[:N].copy_(k)
            self.v[:N].copy_(v)
        else:
            self.out[:N].copy_(self.m.norm(h))

    def _attention(self, i: int, n: int) -> None:
        self.attn_out[:n].copy_(self.attention_layers[i](self.q[:n], self.k[:n], self.v[:n]))

    def _eager_pass(self, N: int, n: int) -> None:
        for i in range(len(self.layers)):
            self._segment(i, N)
            self._attention(i, n)
        self._segment(len(self.layers), N)

    def capture(self, progress: bool = False) -> None:
        """One graph per segment per bucket, largest bucket first, all in one memory pool."""
        from tqdm.auto import tqdm

        if not self.use_graphs:
            return
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        torch.cuda.synchronize()
        for N in tqdm(sorted(self.sizes, reverse=True), desc="capture buckets", disable=not progress,
                      leave=False):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._eager_pass(N, N)  # warm-up at this shape on the capture stream (cuBLAS workspaces)
            stream.synchronize()
            graphs = []
            with torch.cuda.stream(stream):
                for i in range(len(self.layers) + 1):
                    g = torch.cuda.CUDAGraph()
                    g.capture_begin(pool=pool)
                    try:
                        self._segment(i, N)
                    finally:
                        g.capture_end()
                    graphs.append(g)
            self.graphs[N] = graphs
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0

    def bucket(self, n: int) -> Optional[int]:
        return gate.bucket_for(n, self.sizes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Prefill one sequence; returns a view of the static output (clone it to keep it)."""
        n = input_ids.shape[0]
        N = self.bucket(n)
        if N is None:
            raise ValueError(f"{n} tokens exceed the largest capture ({self.sizes[-1]})")
        self.ids[:n].copy_(input_ids)
        if not self.use_graphs:
            self._eager_pass(N, n)
            return self.out[:n]
        graphs = self.graphs[N]
        for i in range(len(self.layers)):
            graphs[i].replay()
            self._attention(i, n)
        graphs[-1].replay()
        return self.out[:n]


# ---------------------------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------------------------
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


def _sdpa_backends():
    """Flash / memory-efficient attention only (never the O(n^2)-memory math fallback) on CUDA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def run(params: dict | None = None, *, progress: bool = True) -> pd.DataFrame:
    """Eager prefill (gate off) vs piecewise-graph prefill (gate on) per token count, on one GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("pcg_gate.run needs a CUDA GPU")
    from sglab.measure.timing import cuda_time

    dev = torch.device("cuda", torch.cuda.current_device())
    with _sdpa_backends():
        return _run({**DEFAULT_PARAMS, **(params or {})}, dev, use_graphs=True, timer=cuda_time,
                    progress=progress)


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


def _run(p: dict, dev: torch.device, *, use_graphs: bool, timer, progress: bool) -> pd.DataFrame:
    from tqdm.auto import tqdm

    from sglab import runs
    from sglab.measure.timing import Timing

    torch.manual_seed(int(p["seed"]))
    capture_tokens = gate.piecewise_cuda_graph_tokens(int(p["max_tokens"]))
    counts = [int(n) for n in p["token_counts"]]
    if max(counts) > capture_tokens[-1]:
        raise ValueError(f"token count {max(counts)} above the largest bucket {capture_tokens[-1]}")
    say = print if progress else (lambda *a, **k: None)
    mem = _Mem(dev)
    rows: list[dict] = []

    with torch.no_grad():
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        mem0 = mem.allocated()
        lm = build_language_model(p, dev)
        weights_mib = (mem.allocated() - mem0) / 2**20
        say(f"model: {p['num_layers']} layers, hidden {p['hidden']}, bf16, {weights_mib:.0f} MiB of weights")

        # The gate decides which path each wrapper's prefill takes.
        decisions = {}
        for variant in ("no_alias", "property_guard"):
            wrapper = gate.build_wrapper(variant, language_model=lm)
            state = gate.ModelRunnerState(wrapper, num_hidden_layers=int(p["num_layers"]),
                                          piecewise_cuda_graph_tokens=capture_tokens)
            decisions[variant] = (gate.init_piecewise_cuda_graphs(state), state)
            say(f"gate[{variant}]: {decisions[variant][0].message}")
        res_off, _ = decisions["no_alias"]
        res_on, state_on = decisions["property_guard"]
        if res_off.enabled or not res_on.enabled:
            raise RuntimeError("gate outcome not as expected: no_alias must be off, property_guard on")

        eager_fwd = lm.model.forward  # gate off: the plain forward, launched op by op
        runner = PiecewiseRunner(res_on.layer_model, state_on.attention_layers, capture_tokens,
                                 use_graphs=use_graphs)
        ref_runner = PiecewiseRunner(res_on.layer_model, state_on.attention_layers, capture_tokens,
                                     use_graphs=False)  # same padded shapes, no graphs

        reserved0 = mem.reserved()
        say(f"capturing {len(capture_tokens)} buckets x {len(runner.layers) + 1} segments ...")
        runner.capture(progress=progress)
        pool_mib = (mem.reserved() - reserved0) / 2**20
        say(f"captured {runner.num_graphs} graphs in {runner.capture_s:.1f} s, pool {pool_mib:.0f} MiB")

        run_level = [
            ("eager", "gate_enabled", float(res_off.enabled), "bool"),
            ("piecewise", "gate_enabled", float(res_on.enabled), "bool"),
            ("piecewise", "capture_time", runner.capture_s, "s"),
            ("piecewise", "graphs", float(runner.num_graphs), "count"),
            ("piecewise", "buckets", float(len(capture_tokens)), "count"),
            ("piecewise", "graph_pool", pool_mib, "MiB"),
            ("piecewise", "static_buffers", runner.static_bytes / 2**20, "MiB"),
            ("eager", "weights", weights_mib, "MiB"),
        ]
        if dev.type == "cuda":  # kernels launched by one forward (torch.profiler sees inside graph replays)
            try:
                from sglab.measure.kernels import profiled_kernels

                n0 = min(counts)
                ids0 = torch.randint(0, int(p["vocab"]), (n0,), device=dev)
                pos0 = torch.arange(n0, device=dev)
                runner.forward(ids0)
                run_level += [
                    ("eager", "kernels_per_forward", float(len(profiled_kernels(lambda: eager_fwd(ids0, pos0)))),
                     "count"),
                    ("piecewise", "kernels_per_forward", float(len(profiled_kernels(lambda: runner.forward(ids0)))),
                     "count"),
                    ("piecewise", "graph_launches_per_forward", float(len(runner.layers) + 1), "count"),
                ]
            except Exception as exc:  # noqa: BLE001 - the counts are context, not the measurement
                say(f"kernel count skipped: {type(exc).__name__}: {exc}")
        rows += [{"variant": v, "num_tokens": None, "bucket": None, "metric": m, "value": x, "unit": u}
                 for v, m, x, u in run_level]

        gen = torch.Generator().manual_seed(int(p["seed"]))
        rounds = max(1, int(p["rounds"]))
        per_round = max(1, int(p["repeat"]) // rounds)
        for n in tqdm(counts, desc="token counts", disable=not progress):
            ids = torch.randint(0, int(p["vocab"]), (n,), generator=gen).to(dev)
            pos = torch.arange(n, device=dev)
            N = runner.bucket(n)
            labels = {"num_tokens": n, "bucket": N}

            # correctness first: piecewise vs the eager forward, and vs the same padded segments run eagerly
            ref = eager_fwd(ids, pos).clone()
            pcg = runner.forward(ids).clone()
            same_shape = ref_runner.forward(ids).clone()
            c = compare(pcg, ref)
            c_same = compare(pcg, same_shape)
            for metric, unit in (("max_abs_diff", "abs"), ("rel_rms_diff", "ratio"), ("ref_max_abs", "abs"),
                                 ("tolerance", "abs"), ("within_tol", "bool")):
                rows.append({"variant": "piecewise", **labels, "metric": metric, "value": float(c[metric]),
                             "unit": unit})
            rows.append({"variant": "piecewise", **labels, "metric": "max_abs_diff_same_shape",
                         "value": c_same["max_abs_diff"], "unit": "abs"})
            del ref, pcg, same_shape

            # latency: eager and piecewise alternate in rounds
            samples: dict[str, list[float]] = {"eager": [], "piecewise": []}
            fns = {"eager": lambda: eager_fwd(ids, pos), "piecewise": lambda: runner.forward(ids)}
            for r in range(rounds):
                for mode in ("eager", "piecewise"):
                    t = timer(fns[mode], warmup=int(p["warmup"]) if r == 0 else 2, repeat=per_round)
                    samples[mode] += t.samples_ms
            te, tp = Timing(samples["eager"]), Timing(samples["piecewise"])
            rows += te.rows(variant="eager", **labels) + tp.rows(variant="piecewise", **labels)
            say(f"  n={n:5d} (bucket {N}): eager {te.median_ms:.3f} ms, piecewise {tp.median_ms:.3f} ms "
                f"({te.median_ms / tp.median_ms:.2f}x), max|diff| {c['max_abs_diff']:.4g} "
                f"(tol {c['tolerance']:.3g})")

        if dev.type == "cuda":
            rows.append({"variant": "process", "num_tokens": None, "bucket": None, "metric": "peak_allocated",
                         "value": torch.cuda.max_memory_allocated() / 2**20, "unit": "MiB"})
        del runner, ref_runner, decisions, state_on, res_on, lm, eager_fwd
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    return runs.tidy(EXPERIMENT, rows)


# ---------------------------------------------------------------------------------------------------------------
# Analysis helpers (used by the notebook on a live or recorded run)
# ---------------------------------------------------------------------------------------------------------------
def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per token count: eager and piecewise median/p10/p90 (ms), speedup (eager / piecewise median), and the
    correctness columns."""
    t = df[df["metric"].isin(["time_median", "time_p10", "time_p90"])].copy()
    t["num_tokens"] = t["num_tokens"].astype(int)
    wide = t.pivot_table(index="num_tokens", columns=["variant", "metric"], values="value")
    out = pd.DataFrame(index=wide.index)
    for mode in ("eager", "piecewise"):
        for m, lab in (("time_median", "median"), ("time_p10", "p10"), ("time_p90", "p90")):
            out[f"{mode} {lab} ms"] = wide[(mode, m)]
    out["speedup"] = out["eager median ms"] / out["piecewise median ms"]
    c = df[df["metric"].isin(["max_abs_diff", "rel_rms_diff", "tolerance", "within_tol",
                              "max_abs_diff_same_shape"])]
    c = c.dropna(subset=["num_tokens"]).copy()
    c["num_tokens"] = c["num_tokens"].astype(int)
    cw = c.pivot_table(index="num_tokens", columns="metric", values="value")
    buckets = df.dropna(subset=["num_tokens"]).groupby("num_tokens")["bucket"].first()
    buckets.index = buckets.index.astype(int)
    out.insert(0, "bucket", buckets.reindex(out.index).astype(int))
    for col in ("max_abs_diff", "rel_rms_diff", "tolerance", "max_abs_diff_same_shape"):
        out[col] = cw[col]
    out["within_tol"] = cw["within_tol"].astype(bool)
    return out


def run_facts(df: pd.DataFrame) -> dict:
    """The run-level numbers (capture time, graph count, pool size, weights) as a dict metric -> value."""
    g = df[df["num_tokens"].isna()]
    return {(r.variant, r.metric): r.value for r in g.itertuples()}


gpu_short = _runs.gpu_short


def newest_per_gpu(all_runs: list) -> list:
    """The newest run of each GPU model, ordered by GPU name (several recorded runs of one GPU: newest wins)."""
    return list(_runs.newest_by(all_runs, _runs.gpu_short).values())


def by_gpu(all_runs: list, column: str) -> pd.DataFrame:
    """One column of :func:`latency_table` side by side: token counts x GPU (newest run per GPU)."""
    return pd.DataFrame({gpu_short(r): latency_table(r.df)[column] for r in newest_per_gpu(all_runs)})


def slowdown_start(speedup: pd.Series) -> Optional[int]:
    """The smallest token count from which every measured ratio is below 1 (None if the last one is not)."""
    start = None
    for n, s in speedup.sort_index(ascending=False).items():
        if s >= 1.0:
            break
        start = int(n)
    return start


def buffer_copy_bytes(params: dict, num_tokens: int) -> int:
    """Bytes the piecewise runner moves on top of the eager forward, per prefill: per layer it copies the
    residual and q, k, v into its fixed buffers and the attention output once more (5 tensors of
    ``tokens x hidden`` bf16, each written and read back), plus the final output once."""
    p = {**DEFAULT_PARAMS, **params}
    per_tensor = int(num_tokens) * int(p["hidden"]) * 2
    return 2 * per_tensor * (5 * int(p["num_layers"]) + 1)


def _ratio_span(values) -> str:
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{lo}×" if lo == hi else f"{lo}–{hi}×"


def headline(all_runs: list) -> str:
    """README index line: the claim and, per GPU (newest run each), the eager/piecewise prefill ratio."""
    parts, diffs, points, ok = [], [], 0, 0
    counts: set = set()
    for r in newest_per_gpu(all_runs):
        lat = latency_table(r.df)
        sp = lat["speedup"]
        counts |= set(int(n) for n in lat.index)
        text = f"{gpu_short(r)} {_ratio_span(sp)} (max at {int(sp.idxmax())} tok"
        start = slowdown_start(sp)
        text += f"; <1 from {start} tok)" if start is not None else ")"
        parts.append(text)
        diffs.append(float(lat["max_abs_diff"].max()))
        points += len(lat)
        ok += int(lat["within_tol"].sum())
    return ("A `model` property + `__setattr__` guard lets the Kimi-shaped wrapper pass the PCG gate with no "
            f"duplicate `model.*` weights. Prefill eager/piecewise (median, {min(counts)}–{max(counts)} tok): "
            + "; ".join(parts)
            + f"; piecewise = eager within bf16 tolerance at {ok}/{points} points (max abs diff {max(diffs):.3f}).")
