"""A run's tidy rows, its manifest (release, versions, flags, model config, every harness
adjustment with its reason, the log lines behind each decision) and what a reader sees."""

from __future__ import annotations

import gzip
import shlex
import shutil
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from sglab.sglang.releases import parse_version
from sglab.sglang.engine.running import TOOL_NAMES, EngineResult
from sglab.sglang.engine.spec import METHOD_VERSION, read_config, repo


def _grouped(items: list[dict], *keys: str, order=None) -> list[tuple[tuple, list[dict]]]:
    """``[(values of keys, items)]``, the groups sorted by their values (or ``order`` of them)."""
    groups: dict[tuple, list] = {}
    for x in items:
        groups.setdefault(tuple(x.get(k) for k in keys), []).append(x)
    return sorted(groups.items(), key=lambda kv: (order or (lambda k: k))(kv[0]))


def spread(xs: list[float]) -> dict:
    """Median, min, max, interquartile range and count of repeated measurements."""
    import pandas as pd  # here: the engine's own processes import this package, never pandas

    s = pd.Series(xs, dtype=float)
    q1, q3 = s.quantile([0.25, 0.75])
    return {"median": s.median(), "min": s.min(), "max": s.max(), "iqr": q3 - q1, "n": len(s)}


# the engine's start-up decisions: {metric: (the log's key, unit)}
DECISIONS = dict(pcg=("pcg", ""), pcg_reason=("pcg_reason", ""),
                 pcg_tokens=("pcg_tokens", "tokens"), pcg_capture=("pcg_capture_s", "s"),
                 bcg=("bcg", ""), bcg_tokens=("bcg_tokens", "tokens"),
                 decode_graph_bs=("decode_bs", "requests"), decode_capture=("decode_capture_s",
                                                                            "s"),
                 attention_backend=("attention_backend", ""), moe_config=("moe_config", ""))
# metric -> bench_serving's key: a pass's median (``ttft``) and mean (``ttft_mean``), over passes
SERVING_METRICS = dict(ttft="ttft_ms", tpot="tpot_ms", e2e="e2e_latency_ms", itl="itl_ms")


def rows(res: EngineResult) -> list[dict]:
    """Tidy rows of one run: variant, tool and shape columns, metric, value, unit."""
    s, d = res.spec, res.decisions
    base = dict(variant=s.variant, release=s.release, case=s.case, tool=s.tool, start=s.start)
    status = res.status if res.ok else f"{res.status}: {res.error}"
    out = [{**base, "metric": "status", "value": status, "unit": ""}]
    if not d:
        return out

    def add(metric, value, unit="", **cols):
        if value is not None:
            out.append({**base, **cols, "metric": metric, "value": value, "unit": unit})

    def add_spread(name, values, stats=("median", "min", "max"), digits=4, **cols):
        sp = spread(values)
        for k in stats:
            add(name if k == "median" else f"{name}_{k}", round(sp[k], digits), "ms", **cols)
        return sp

    for metric, (key, unit) in DECISIONS.items():
        v = d.get(key)
        add(metric, (" ".join(map(str, v)) or None) if isinstance(v, list) else v, unit)
    # a launch pass ran under the profiler: its counts are exact, its timings are not kept
    counting = s.profile and s.profile_stage == "prefill"
    timed = [b for b in res.bench if not (counting or b.get("skipped") or b.get("warmup"))]
    for (bs, il, ol), runs_ in _grouped(timed, "batch_size", "input_len", "output_len"):
        cols = {"batch_size": bs, "input_len": il, "output_len": ol}
        pre = add_spread("prefill", [r["prefill_latency"] * 1e3 for r in runs_],
                         ("median", "min", "max", "iqr"), **cols)
        tps = statistics.median(r["prefill_throughput"] for r in runs_)
        add("prefill_throughput", round(tps, 1), "token/s", **cols)
        dec = [x * 1e3 for x in (r.get("median_decode_latency") for r in runs_) if x is not None]
        if dec:
            add_spread("decode", dec, **cols)
        add("repeats", pre["n"], "runs", **cols)
    served = [x for x in d.get("serving", []) if not x.get("warmup")]
    for (il, n, ol), xs in _grouped(served, "input_len", "concurrency", "output_len"):
        cols = {"requests": n, "input_len": il, "output_len": ol}
        for metric, key in SERVING_METRICS.items():
            for stat in ("median", "mean"):
                vals = [float(x[f"{stat}_{key}"]) for x in xs if x.get(f"{stat}_{key}") is not None]
                if vals:
                    add_spread(metric if stat == "median" else f"{metric}_mean", vals, **cols)
        add("serving_passes", len(xs), "passes", **cols)
        add("completed", sum(int(x.get("completed") or 0) for x in xs), "requests", **cols)
    if s.tool == "serve":  # the scheduler's own batch lines, warm-up passes included
        pre, dec = d.get("prefill_batches", []), d.get("decode_batches", [])
        for name, batches in (("serve_prefill_graph", pre), ("serve_decode_graph", dec)):
            if batches:
                add(name, round(sum(b["graph"] for b in batches) / len(batches), 3), "fraction")
        if pre:
            add("serve_prefill_batches", len(pre), "batches")
            add("serve_prefill_mixed", sum(b["seqs"] > 1 for b in pre), "batches")
    calls = [c for c in d.get("calls", []) if not c.get("warmup")]
    for (n, il, ol), cs in _grouped(calls, "requests", "input_len", "output_len",
                                    order=lambda k: tuple(x or 0 for x in k)):
        cols = {"requests": n, "input_len": il, "output_len": ol}
        add_spread("latency", [float(c["seconds"]) * 1e3 for c in cs],
                   ("median", "min", "max", "iqr"), **cols)
        batches = [b for c in cs for b in c["prefill_batches"]]
        add("prefill_batches", round(len(batches) / len(cs), 3), "per call", **cols)
        if batches:
            add("prefill_graph", round(sum(b["graph"] for b in batches) / len(batches), 3),
                "fraction", **cols)
            add("prefill_seqs", statistics.median(b["seqs"] for b in batches), "requests per batch",
                **cols)
        if any(c.get("events") for c in cs):
            add("events", round(statistics.mean(c.get("events", 0) for c in cs), 3), "per call",
                **cols)
        add("repeats", len(cs), "calls", **cols)
    events = [{"rank": e.get("pid"), **e} for e in d.get("events", [])]
    for (ev, rank), es in _grouped(events, "event", "rank", order=lambda k: (k[0], str(k[1]))):
        add(f"{ev}_count", len(es), "calls", rank=rank)
        add(f"{ev}_objects", len({e.get("obj") for e in es}), "objects", rank=rank)
        sizes = sorted({e["max_token_num"] for e in es if e.get("max_token_num") is not None})
        add(f"{ev}_max_token_num", " ".join(map(str, sizes)) or None, "tokens", rank=rank)
        secs = [float(e["seconds"]) * 1e3 for e in es if e.get("seconds") is not None]
        if secs:
            add_spread(f"{ev}_ms", secs, digits=3, rank=rank)
    for m in d.get("gpu_memory", []):
        add("gpu_memory", m.get("mib"), "MiB", gpu=m.get("gpu"), process=m.get("name"))
    units = dict(kernel_launches="launches", graph_launches="launches", kernels_in_graphs="kernels",
                 gpu_ms="ms", attention_ms="ms", moe_ms="ms")
    for n, got in sorted((res.launches or {}).items()):
        for key, unit in units.items():
            add(f"prefill_{key}", got.get(key), unit, batch_size=s.batch_sizes[0], input_len=n)
    units = dict(replays_per_step="replays", kernels_per_replay="kernels",
                 kernels_per_layer="kernels")
    for key, unit in units.items():
        add(f"decode_{key}", res.kernels[key] if res.kernels else None, unit)
    if res.leftovers:
        add("leftover_processes", len(res.leftovers), "processes")
    # the host over the whole start (load, capture and timed runs): was a slow start crowded?
    for metric, key, unit in (("host_steal", "steal_pct", "%"), ("host_busy", "busy_pct", "%"),
                              ("engine_cpu", "engine_cpu_s", "s"), ("engine_preempted", "preempted",
                                                                    "switches")):
        add(metric, res.host.get(key), unit)
    return out


def model_record(path: Path) -> dict:
    path, cfg = Path(path), read_config(path)
    full = path.resolve()
    shown = str(full.relative_to(repo()) if full.is_relative_to(repo()) else path)
    return {"path": shown, "name": path.parent.name, "sha256_16": cfg.digest, "config": cfg.data}


def manifest_extra(results: list[EngineResult]) -> dict:
    """The manifest's engine part: per run what ran, how, and the log lines behind it."""
    out = []
    for r in results:
        s, d = r.spec, r.decisions
        pinned = ("torch", "sglang-kernel", "flashinfer-python", "transformers")
        versions, pins = {"sglang": s.release, **r.found}, {k: r.pins.get(k) for k in pinned}
        told = [{"name": a.name, "reason": a.reason} for a in s.adjustments]
        said = dict(applied=d.get("applied", []), resolved=d.get("resolved"),
                    excerpts=d.get("excerpts", [])[:40])
        out.append(
            dict(variant=s.variant, release=s.release, case=s.case, tool=s.tool, start=s.start,
                 cpus=list(s.cpus), status=r.status, error=r.error, versions=versions, pins=pins,
                 server_args=list(s.server_args), server_argv=r.server_argv,
                 command=shlex.join(r.sglang_command), model=model_record(
                     s.model), adjustments=told, **said, leftovers=r.leftovers, seconds=round(
                         r.seconds, 1), host=r.host, log_tail=r.tail if not r.ok else []))
    releases = sorted({r.spec.release for r in results}, key=parse_version)
    return {"engine_runs": out, "releases": releases}


def record(results: list[EngineResult], fix: str, *, root: Optional[Path] = None,
           extra: Optional[dict] = None) -> Path:
    """One run ``engine_<fix>`` of these results, with logs and kernel tables as sidecars."""
    import pandas as pd

    from sglab.core.runs import tidy, write_run

    experiment = f"engine_{fix}"
    frame = tidy(experiment, [row for r in results for row in rows(r)])
    sidecars = {}
    with tempfile.TemporaryDirectory(prefix="sglab-engine-record-") as tmp:
        for i, r in enumerate(results):
            if r.log is not None and r.log.is_file():
                gz = Path(tmp) / f"log{i}.log.gz"
                with open(r.log, "rb") as src, gzip.GzipFile(gz, "wb", mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
                sidecars[f"log_{i}"] = gz
            if r.kernels and r.kernels.get("table"):
                sidecars[f"kernels_{i}"] = pd.DataFrame([{
                    "variant": r.spec.variant, "kernel": k, "per_replay": v
                } for k, v in r.kernels["table"]])
        specs = []
        for s in (r.spec for r in results):
            d = dict(asdict(s), model=Path(s.model).parent.name,
                     adjustments=[a.name for a in s.adjustments])
            if s.tool == "bench":
                d["warmup_sweeps"] = s.warmup  # untimed sweeps of every input length
            specs.append(d)
        params = {"specs": specs}
        return write_run(frame, experiment=experiment, method_version=METHOD_VERSION, params=params,
                         root=root, gpu_count=max((r.spec.tp_size for r in results), default=1),
                         extra={**manifest_extra(results), **(extra or {})}, sidecars=sidecars)


def summary(res: EngineResult) -> list[str]:
    s, d = res.spec, res.decisions
    head = f"sglang {s.variant} · {TOOL_NAMES[s.tool]} · {Path(s.model).parent.name} · {res.status}"
    out = [head + (f" · {res.error}" if not res.ok else "")]
    if not res.ok and res.tail:
        out += [f"  | {line}" for line in res.tail[-4:]]
    if not d or (d.get("pcg") == "unknown" and d.get("decode_bs") is None and not res.ok):
        return out
    pcg = d.get("pcg")
    if pcg == "captured":
        out.append(f"  piecewise CUDA graph: captured for tokens {d.get('pcg_tokens')} in "
                   f"{d.get('pcg_capture_s')} s")
    else:
        out.append(f"  piecewise CUDA graph: {pcg}" +
                   (f" ({d['pcg_reason']})" if d.get("pcg_reason") else ""))
    if d.get("bcg") != "not used":
        out.append(f"  breakable CUDA graph: {d['bcg']}" +
                   (f" for tokens {d['bcg_tokens']}" if d.get("bcg_tokens") else ""))
    out.append(f"  decode CUDA graph batch sizes: {d.get('decode_bs')}")
    out.append(f"  attention backend: {d.get('attention_backend')}")
    out += [f"  harness adjustment {a.name}: {a.reason}" for a in s.adjustments]
    got = rows(res)  # bench rows first, then serving, then the engine's calls
    by = {(x["metric"], x.get("batch_size"), x.get("input_len"), x.get("requests")): x["value"]
          for x in got}
    for r in got:
        shape = (r.get("batch_size"), r.get("input_len"), r.get("requests"))
        if r["metric"] == "prefill":
            iqr, dec = by.get(("prefill_iqr", *shape)), by.get(("decode", *shape))
            out.append(
                f"  batch {r['batch_size']} x {r['input_len']} tokens: prefill {r['value']:.2f} ms"
                + (f" (IQR {iqr:.2f})" if iqr is not None else "") +
                (f", decode {dec:.2f} ms/step" if dec is not None else ""))
        elif r["metric"] == "ttft":
            out.append(f"  serving {r['input_len']} tokens, {r['requests']} at a time: TTFT "
                       f"{r['value']:.1f} ms, TPOT {by.get(('tpot', *shape), float('nan')):.2f} ms,"
                       f" E2E {by.get(('e2e', *shape), float('nan')):.1f} ms (medians)")
        elif r["metric"] == "latency":
            out.append(f"  {r['requests']} requests x {r['input_len']} tokens: {r['value']:.2f} ms")
        elif r["metric"] == "prefill_graph":
            out.append(f"    prefill batches on the graph: {r['value']:.0%}")
    if k := res.kernels:
        out.append(
            f"  decode graph replay: {k['kernels_per_replay']} kernels "
            f"({k['kernels_per_layer']:.2f} per layer), {k['replays_per_step']:.1f} replays per "
            f"step")
    for n, got in sorted((res.launches or {}).items()):
        out.append(f"  prefill of {n} tokens: {got['kernel_launches']} kernel launches, "
                   f"{got['graph_launches']} graph launches running {got['kernels_in_graphs']} "
                   f"kernels; kernel time {got.get('gpu_ms', 0):.2f} ms, attention "
                   f"{got.get('attention_ms', 0):.2f}, MoE {got.get('moe_ms', 0):.2f} (launch "
                   "pass, under the profiler)")
    h = res.host
    if "steal_pct" in h:
        out.append(f"  host meanwhile: {h['steal_pct']:.1f}% of CPU time stolen, "
                   f"{h['busy_pct']:.0f}% busy; the engine used {h['engine_cpu_s']:.0f} CPU s, "
                   f"preempted {h['preempted']} times")
    if res.leftovers:
        out.append(f"  left behind and killed: {', '.join(res.leftovers)}")
    return out
