"""Notebook 01 on one GPU: eager prefill (the wrapper the gate refuses) against piecewise-CUDA-graph
prefill (the one it lets through), per token count, and what the host pays per launch (``host``
rows). :func:`sweep` runs on the CPU."""

from __future__ import annotations

import math
from functools import partial
from typing import Optional

import pandas as pd
import torch
from torch import nn

from sglab.core import kernel_table, runs, timing, trace
from sglab.core.toy_decoder import CausalLM, DecoderConfig, build_on_device
from sglab.pcg_gate import rebuild


EXPERIMENT = "pcg_gate"
METHOD_VERSION = 3
GPUS = 1
# max_tokens: --piecewise-cuda-graph-max-tokens (100 tokens pad to 112); direct_token_counts: also
# timed with pieces that hand over their own tensors; launch_burst: tiny kernels per burst of the
# host's per-launch cost; repeat: samples per variant and count over `rounds` rounds
DEFAULT_PARAMS = dict(hidden=2048, num_layers=16, num_heads=16, intermediate=5632, vocab=32000,
                      max_tokens=4096, token_counts=[16, 64, 100, 256, 1024, 2048,
                                                     4096], direct_token_counts=[2048, 4096],
                      trace_token_counts=[64, 4096], kernel_table_tokens=4096, kernel_table_runs=3,
                      launch_burst=256, warmup=3, repeat=15, rounds=3, seed=0)
TOL_ULPS = 8  # accepted max |piecewise - eager|: 8 bf16 units in the last place at the output's max
HOST = "host"  # the variant of the per-launch cost rows


def bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers at magnitude ``x`` (8 significant bits)."""
    return 2.0**(math.floor(math.log2(x)) - 7) if x > 0 else 2.0**-133


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max abs difference, relative RMS difference, the reference's max magnitude, the verdict."""
    a, b = out.float(), ref.float()
    max_diff, ref_max = float((a - b).abs().max()), float(b.abs().max())
    rel_rms = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))
    tol = TOL_ULPS * bf16_ulp(ref_max)
    return dict(max_abs_diff=max_diff, rel_rms_diff=rel_rms, ref_max_abs=ref_max, tolerance=tol,
                within_tol=bool(max_diff <= tol))


def model_config(p: dict) -> DecoderConfig:
    return DecoderConfig(vocab_size=int(p["vocab"]), hidden_size=int(p["hidden"]), num_layers=int(
        p["num_layers"]), num_heads=int(p["num_heads"]), intermediate_size=int(p["intermediate"]),
                         max_position=int(p["max_tokens"]), positions="rotary")


def language_model(cfg: DecoderConfig, device, dtype=torch.bfloat16, *, seed: int = 0) -> CausalLM:
    """The measured LLM on ``device``, no lm_head (upstream's capture stops at the final norm)."""
    return build_on_device(lambda: CausalLM(cfg, lm_head=False), device, dtype, seed=seed,
                           num_layers=cfg.num_layers)


def _row(variant, metric, value, unit, n=None, bucket=None) -> dict:
    return dict(variant=variant, num_tokens=n, bucket=bucket, metric=metric, value=float(value),
                unit=unit)


# -- the gate on every wrapper variant around the measured LLM -------------------------------------
GATE_METRICS = dict(gate_enabled="bool", lm_keys="count", state_dict_keys_built="count",
                    state_dict_keys_after_gate="count", model_keys_after_gate="count",
                    named_parameters_dup="count")


def gate_facts(wrapper: nn.Module, num_hidden_layers: int, capture_tokens=None) -> dict:
    """Run the gate on ``wrapper`` and count what it left registered."""
    lm_keys, built = len(wrapper.language_model.state_dict()), list(wrapper.state_dict())
    kw = {} if capture_tokens is None else {"piecewise_cuda_graph_tokens": capture_tokens}
    state = rebuild.ModelRunnerState(wrapper, num_hidden_layers=num_hidden_layers, **kw)
    with rebuild.quiet_gate():
        res = rebuild.init_piecewise_cuda_graphs(state)
    after = list(wrapper.state_dict())
    return dict(result=res, state=state, gate_enabled=int(res.enabled), lm_keys=lm_keys,
                state_dict_keys_built=len(built), state_dict_keys_after_gate=len(after),
                model_keys_after_gate=sum(k.startswith("model.") for k in after),
                named_parameters_dup=len(list(wrapper.named_parameters(remove_duplicate=False))))


# -- the host's per-launch cost --------------------------------------------------------------------
class Burst(timing.Burst):
    """:class:`sglab.core.timing.Burst`, timed in the same interleaved rounds as the prefills."""

    def rows(self, events: timing.Timing, warmup: int, n=None, bucket=None) -> list:
        """µs per launch: median, p10, p90 by ``time.perf_counter``; the median by CUDA events."""
        us = self.per_launch_us(warmup)
        names = {"launch_us": "median", "launch_us_p10": "p10", "launch_us_p90": "p90"}
        rows = [_row(HOST, m, us[k], "us", n, bucket) for m, k in names.items()]
        if events.clock.startswith("cuda-events"):
            rows.append(
                _row(HOST, "launch_event_us", events.median_ms * 1e3 / self.n, "us", n, bucket))
        return rows


# -- the profiler passes: traced prefills, the counting pass, the per-kernel table -----------------
# the copies that hand activations between pieces: copy kernels (strided q, k, v), an eager DtoD
# memcpy (the attention output), a graph memcpy node shown as a "memcpy<bits>" kernel (the residual)
COPY = r"direct_copy_kernel|Memcpy DtoD|^memcpy\d+$"
# the host calls that start device work: kernel and graph launches, memcpy and memset calls
LAUNCH = r"LaunchKernel|GraphLaunch|Memcpy|Memset"
TRACE_METRICS = dict(trace_kernels="count", trace_device_us="us", trace_span_us="us",
                     trace_busy="fraction", trace_copy_us="us", trace_copy_ops="count",
                     trace_graph_launches="count", trace_kernel_launches="count",
                     trace_host_us="us")
COUNTED = {"launches": "count", "device_us": "us"}  # method 3's counting pass, per prefill phase


def phase_numbers(ev: pd.DataFrame) -> dict:
    """What one prefill's events say (``ev``: the events of one traced phase)."""
    on_dev = trace.on_device(ev.lane)
    dev = ev[on_dev & ev.category.isin(("kernel", "memcpy", "memset"))]
    span = float((dev.start_us + dev.dur_us).max() - dev.start_us.min()) if len(dev) else 0.0
    device_us, copies = float(dev.dur_us.sum()), dev[dev.name.str.contains(COPY, regex=True)]
    rt, host = ev[ev.category == "runtime"], ev[(ev.category == "range") & ~on_dev]

    def calls(pattern: str) -> int:
        return int(rt.name.str.contains(pattern, regex=True).sum())

    return dict(trace_kernels=int((dev.category == "kernel").sum()), trace_device_us=device_us,
                trace_span_us=span, trace_busy=device_us / span if span else 0.0,
                trace_copy_us=float(copies.dur_us.sum()), trace_copy_ops=len(copies),
                trace_graph_launches=calls("GraphLaunch"),
                trace_kernel_launches=calls("LaunchKernel"), trace_host_us=float(host.dur_us.max())
                if len(host) else 0.0, launches=calls(LAUNCH), device_us=device_us)


def trace_rows(events: pd.DataFrame, metrics: dict = TRACE_METRICS) -> list:
    """One row per prefill phase and metric of :func:`phase_numbers` (``{metric: unit}``)."""
    rows = []
    for (variant, n), ev in events.groupby(["variant", "num_tokens"], sort=False):
        nums = phase_numbers(ev)
        rows += [_row(variant, m, nums[m], u, int(n)) for m, u in metrics.items()]
    return rows


def profile_pass(p: dict, dev, fns_at, eager_fwd, ref_runner, inputs: dict) -> tuple:
    """The per-kernel table (first: CUPTI takes one subscriber), the traced and counting passes."""
    cuda = dev.type == "cuda"
    rows, sidecars, extra = [], {}, {}
    if cuda and p.get("kernel_table_tokens"):
        n = int(p["kernel_table_tokens"])
        ids, pos = inputs[n]
        fns = {
            f"eager {n}": partial(eager_fwd, ids, pos),
            f"pieces_eager {n}": partial(ref_runner.forward, ids)
        }
        table = kernel_table.kernel_table(fns, runs=int(p["kernel_table_runs"]), warmup=2)
        sidecars["kernels"] = table
        extra["kernel_table"] = {"backend": table.attrs["backend"], "reason": table.attrs["reason"]}
        rows += [
            _row(label.split(" ")[0], "kernel_table_calls", c, "count", n)
            for label, c in kernel_table.calls_per_run(table).items()
        ]
    traced = {f"{v} {n}": fn for n in p["trace_token_counts"] for v, fn in fns_at(int(n)).items()}
    events, perfetto = trace.trace_variants(traced, "num_tokens", cuda=cuda,
                                            perfetto_prefix="sglab-pcg-")
    rows += trace_rows(events)
    sidecars["events"] = events
    if perfetto is not None:
        sidecars["trace"] = perfetto
    counted = {
        f"{v} {n}": fns_at(int(n))[v]
        for n in p["token_counts"]
        for v in ("eager", "piecewise")
    }
    counts, _ = trace.trace_variants(counted, "num_tokens", cuda=cuda, warm=False)
    return rows + trace_rows(counts, COUNTED), sidecars, extra


# -- the run ---------------------------------------------------------------------------------------
def run(params: Optional[dict] = None, *, progress: bool = True) -> runs.Measured:
    """Eager prefill (gate off) against piecewise-graph prefill (gate on) on one GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("the pcg_gate measurement captures CUDA graphs: it needs a CUDA GPU")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda", torch.cuda.current_device())
    # flash / memory-efficient attention only (never the O(n^2)-memory math fallback)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        return sweep({**DEFAULT_PARAMS, **(params or {})}, dev, use_graphs=True,
                     timer=timing.cuda_time, progress=progress)


def _mib_reserved(dev) -> float:
    if dev.type != "cuda":
        return 0.0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 2**20


def check_params(p: dict, capture_tokens: list) -> list:
    """The timed token counts; one-line errors for counts the run cannot use."""
    counts = [int(n) for n in p["token_counts"]]
    too_big = [
        n for n in counts + [int(x) for x in p["trace_token_counts"]] if n > capture_tokens[-1]
    ]
    if too_big:
        raise ValueError(f"token count(s) {too_big} above the largest bucket {capture_tokens[-1]}")
    if not {int(n) for n in p["direct_token_counts"]} <= set(counts):
        raise ValueError("direct_token_counts must be a subset of token_counts (timed together)")
    return counts


def sweep(p: dict, dev: torch.device, *, use_graphs: bool, timer,
          progress: bool = False) -> runs.Measured:
    """The measurement on ``dev``; on the CPU: no graphs, kernel table or CUDA events."""
    p = {**DEFAULT_PARAMS, **p}
    torch.manual_seed(int(p["seed"]))
    capture_tokens = rebuild.piecewise_cuda_graph_tokens(int(p["max_tokens"]))
    counts = check_params(p, capture_tokens)
    say = (lambda text: print(f"[pcg_gate] {text}", flush=True)) if progress else (lambda _: None)
    cuda = dev.type == "cuda"
    with torch.no_grad():
        with timing.phase("build"):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            mem0 = torch.cuda.memory_allocated() if cuda else 0
            lm = language_model(model_config(p), dev, seed=int(p["seed"]),
                                dtype=torch.bfloat16 if cuda else torch.float32)
            weights = ((torch.cuda.memory_allocated() if cuda else 0) - mem0) / 2**20
        say(f"model: {p['num_layers']} layers, hidden {p['hidden']}, {weights:.0f} MiB of weights")
        with timing.phase("gate"):  # every wrapper variant around the measured LLM
            decided = {
                v: gate_facts(rebuild.build_wrapper(v, language_model=lm), int(p["num_layers"]),
                              capture_tokens)
                for v in rebuild.ALL_VARIANTS
            }
            rows = [
                _row(v, m, f[m], u) for v, f in decided.items() for m, u in GATE_METRICS.items()
            ]
            off, on = decided["no_alias"]["result"], decided["property_guard"]["result"]
            say(f"gate: no_alias → {off.message}; property_guard → {on.message}")
            if off.enabled or not on.enabled:
                raise RuntimeError(
                    "gate outcome not as expected: no_alias must be off, property_guard on")
            rows += [
                _row("eager", "gate_enabled", off.enabled, "bool"),
                _row("piecewise", "gate_enabled", on.enabled, "bool")
            ]
            make = partial(rebuild.PiecewiseRunner, on.layer_model,
                           decided["property_guard"]["state"].attention_layers)
            runner = make(capture_tokens, use_graphs=use_graphs)  # the passing wrapper's runners
            ref_runner, direct = make(capture_tokens, use_graphs=False), None
            direct_at = p["direct_token_counts"]
            if use_graphs and direct_at:
                buckets = sorted({rebuild.bucket_for(int(n), capture_tokens) for n in direct_at})
                direct = make(buckets, handoff="direct")
        rows.append(_row("eager", "weights", weights, "MiB"))
        with timing.phase("capture"):
            reserved0 = _mib_reserved(dev)
            runner.capture()
            pool = _mib_reserved(dev) - reserved0
            if direct is not None:
                direct.capture()
        say(f"captured {runner.num_graphs} graphs in {runner.capture_s:.1f} s, pool {pool:.0f} MiB")
        captured = (("capture_time", runner.capture_s, "s"), ("graphs", runner.num_graphs, "count"),
                    ("buckets", len(capture_tokens), "count"), ("graph_pool", pool, "MiB"),
                    ("static_buffers", runner.static_bytes / 2**20, "MiB"))
        rows += [_row("piecewise", m, v, u) for m, v, u in captured]
        direct_counts = {int(n) for n in p["direct_token_counts"]} if direct is not None else set()
        eager_fwd = lm.model.forward  # gate off: the plain forward, launched op by op
        gen, inputs = torch.Generator().manual_seed(int(p["seed"])), {}
        traced = [int(x) for x in p["trace_token_counts"]]
        for n in sorted({*counts, *traced, int(p["kernel_table_tokens"] or counts[0])}):
            inputs[n] = (torch.randint(0, int(p["vocab"]), (n,), generator=gen).to(dev),
                         torch.arange(n, device=dev))

        def fns_at(n: int) -> dict:
            ids, pos = inputs[n]
            fns = {"eager": partial(eager_fwd, ids, pos), "piecewise": partial(runner.forward, ids)}
            if n in direct_counts:
                fns["piecewise_direct"] = partial(direct.forward, ids)
            return fns

        burst = Burst(dev, int(p["launch_burst"]))
        checks = (("max_abs_diff", "abs"), ("rel_rms_diff", "ratio"), ("ref_max_abs", "abs"),
                  ("tolerance", "abs"), ("within_tol", "bool"))
        for n in counts:
            N, (ids, pos) = runner.bucket(n), inputs[n]
            with timing.phase("correctness"):  # against eager and the same pieces run eagerly
                ref, pcg = eager_fwd(ids, pos).clone(), runner.forward(ids).clone()
                c, same = compare(pcg, ref), compare(pcg, ref_runner.forward(ids).clone())
                rows += [_row("piecewise", m, c[m], u, n, N) for m, u in checks]
                rows.append(
                    _row("piecewise", "max_abs_diff_same_shape", same["max_abs_diff"], "abs", n, N))
                if n in direct_counts:
                    diff = compare(direct.forward(ids).clone(), ref)["max_abs_diff"]
                    rows.append(_row("piecewise_direct", "max_abs_diff", diff, "abs", n, N))
            with timing.phase("timing"):  # the prefills and the launch burst in interleaved rounds
                burst.host_ms.clear()
                times = timing.interleaved({**fns_at(n), HOST: burst},
                                           rounds=max(1, int(p["rounds"])), warmup=int(p["warmup"]),
                                           repeat=int(p["repeat"]), timer=timer)
                timed = [
                    r for v, t in times.items() if v != HOST
                    for r in t.rows(variant=v, num_tokens=n, bucket=N)
                ] + burst.rows(times[HOST], int(p["warmup"]), n, N)
            rows += timed
            med = {(r["variant"], r["metric"]): r["value"] for r in timed}
            say(f"{n} tokens: eager {med[('eager', 'time_median')]:.2f} ms, piecewise "
                f"{med[('piecewise', 'time_median')]:.2f} ms; host "
                f"{med[(HOST, 'launch_us')]:.1f} µs per launch")
        with timing.phase("profile"):
            prof_rows, sidecars, extra = profile_pass(p, dev, fns_at, eager_fwd, ref_runner, inputs)
        say("profiled: traced pass, launch counts" + (", kernel table" if cuda else ""))
        rows += prof_rows
        if cuda:
            peak = torch.cuda.max_memory_allocated() / 2**20
            rows.append(_row("process", "peak_allocated", peak, "MiB"))
        del runner, ref_runner, direct, lm, eager_fwd, inputs
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=sidecars, extra=extra)
