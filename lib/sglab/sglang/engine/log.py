"""Reading an engine's log: the engine's decisions and SGLang's own numbers, found with the
exact strings of the releases' sources (:data:`LOG_STRINGS`, the file that writes each), and
SGLang's own error in one line (:func:`first_error`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from sglab.sglang.engine.hooks import MARK
from sglab.sglang.engine.spec import EngineSpec


# The exact strings, with the file of each release (0.5.11, 0.5.12.post1, 0.5.13) that writes them.
LOG_STRINGS = {
    "pcg_disabled": (
        "srt/model_executor/model_runner.py",
        r"Disable piecewise CUDA graph because (?P<reason>.+?)\s*$",
    ),
    "pcg_begin": (
        "srt/model_executor/model_runner.py",
        r"Capture piecewise CUDA graph begin\. avail mem=(?P<mem>[\d.]+) GB",
    ),
    "pcg_end": (
        "srt/model_executor/model_runner.py",
        r"Capture piecewise CUDA graph end\. Time elapsed: (?P<s>[\d.]+) s\. mem "
        r"usage=(?P<mem>[\d.]+) GB",
    ),
    "pcg_tokens": (
        "srt/model_executor/piecewise_cuda_graph_runner.py",
        r"Capture cuda graph num tokens \[(?P<tokens>[\d,\s]*)\]",
    ),
    "bcg_tokens": (
        "srt/model_executor/breakable_cuda_graph_runner.py",
        r"\[BCG\] Capture num tokens: \[(?P<tokens>[\d,\s]*)\]",
    ),
    "bcg_eager": (
        "srt/model_executor/breakable_cuda_graph_runner.py (0.5.12+)",
        r"\[BCG\] Could not resolve inner layer_model on (?P<cls>\S+)\. BCG is disabled for this "
        r"model; prefill will fall back to eager\.",
    ),
    "decode_bs": (
        "srt/model_executor/cuda_graph_runner.py",
        r"Capture cuda graph bs \[(?P<bs>[\d,\s]*)\]",
    ),
    "decode_begin": (
        "srt/model_executor/model_runner.py",
        r"Capture cuda graph begin\. This can take up to several minutes\.",
    ),
    "decode_end": (
        "srt/model_executor/model_runner.py",
        r"Capture cuda graph end\. Time elapsed: (?P<s>[\d.]+) s\. mem usage=(?P<mem>[\d.]+) GB",
    ),
    "attn_default": (
        "srt/server_args.py",
        r"Attention backend not specified\. Use (?P<backend>\S+) backend by default\.",
    ),
    "load_begin": (
        "srt/model_executor/model_runner.py",
        r"Load weight begin\. avail mem=(?P<mem>[\d.]+) GB",
    ),
    "max_tokens": ("bench_one_batch.py", r"max_total_num_tokens=(?P<n>\d+)"),
    "warmup": ("bench_one_batch.py", r"^Warmup \.\.\.$"),
    "benchmark": ("bench_one_batch.py", r"^Benchmark \.\.\.$"),
    "prefill": (
        "bench_one_batch.py",
        r"Prefill\. latency: (?P<s>[\d.]+) s, throughput: +(?P<tps>[\d.]+) token/s",
    ),
    "decode_step": (
        "bench_one_batch.py",
        r"Decode (?P<i>\d+)\. Batch size: (?P<bs>\d+), latency: (?P<s>[\d.]+) s",
    ),
    "decode_median": (
        "bench_one_batch.py",
        r"Decode\.  median latency: (?P<s>[\d.]+) s, median throughput: +(?P<tps>[\d.]+) token/s",
    ),
    "total": (
        "bench_one_batch.py",
        r"Total\. latency: +(?P<s>[\d.]+) s, throughput: +(?P<tps>[\d.]+) token/s",
    ),
    "skipping": (
        "bench_one_batch.py",
        r"skipping \((?P<bs>\d+), (?P<il>\d+), (?P<ol>\d+)\) due to max batch size limit",
    ),
    "trace_saved": (
        "bench_one_batch.py",
        r"torch profiler chrome trace (?:for (?P<stage>\w+) )?saved to (?P<path>\S+)",
    ),
    "prefill_batch": (
        "srt/observability/scheduler_metrics_mixin.py (0.5.11, 0.5.12.post1), "
        "srt/managers/scheduler_components/metrics_reporter.py (0.5.13)",
        r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<tokens>\d+), "
        r".*?(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False)",
    ),
    "decode_batch": (
        "same files as prefill_batch",
        r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), .*?(?:cuda|cpu|npu|musa) "
        r"graph: (?P<graph>True|False)",
    ),
    "argparse": (
        "argparse (bench_one_batch's and the Engine's parsers)",
        r"^\S+: error: (?P<msg>.+)$",
    ),
}


RX = {k: re.compile(v[1]) for k, v in LOG_STRINGS.items()}


# Ours, printed inside the engine's processes (install_hooks, drive)
OURS = re.compile(re.escape(MARK) + r" (?P<kind>\w[\w-]*) ?(?P<rest>.*)$")


# Messages SGLang raises to say "see above": the cause is an earlier traceback
WRAPPERS = (
    "Initialization failed. Please see the error messages above",
    "scheduler died during initialization",
    "is dead",
    "Child process unexpectedly failed",
)


_EXC = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))"
    r"(?::\s*(?P<msg>.*))?$"
)


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def key_values(rest: str) -> dict:
    out = {}
    for k, v in re.findall(r"(\w+)=(\S+)", rest):
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def first_error(text: str) -> Optional[str]:
    """SGLang's own message in one line: the first exception that ends a traceback (``Type:
    message``), skipping the wrappers that only point back at it; else an argparse error; else None.
    """
    lines = text.splitlines()
    finals, in_tb = [], False
    for i, line in enumerate(lines):
        s = line.strip()
        if "Traceback (most recent call last):" in s:
            in_tb = True
            continue
        if in_tb:
            m = _EXC.match(s)
            if m and not line.startswith((" ", "\t")):
                msg = (m.group("msg") or "").strip()
                # an assertion's message may continue on the next lines; keep the first
                finals.append(f"{m.group('type')}: {msg}" if msg else m.group("type"))
                in_tb = False
    real = [f for f in finals if not any(w in f for w in WRAPPERS)]
    if real:
        return real[0][:400]
    for line in lines:
        m = RX["argparse"].match(line.strip())
        if m:
            return f"error: {m.group('msg')}"[:400]
    return finals[0][:400] if finals else None


def read_log(text: str) -> dict:
    """The engine's decisions and measurements from its log (see :data:`LOG_STRINGS`)."""
    d: dict = {
        "pcg": "unknown",
        "pcg_reason": None,
        "pcg_tokens": None,
        "pcg_capture_s": None,
        "bcg_tokens": None,
        "bcg_eager": None,
        "decode_bs": None,
        "decode_capture_s": None,
        "attention_backend": None,
        "resolved": None,
        "max_total_num_tokens": None,
        "bench": [],
        "warmup": None,
        "prefill_batches": [],
        "decode_batches": [],
        "calls": [],
        "applied": [],
        "events": [],
        "hooks_failed": [],
        "gpu_memory": [],
        "excerpts": [],
        "traces": [],
    }
    phase, current, call = "start", None, None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = OURS.search(line)
        if m:
            kind, rest = m.group("kind"), m.group("rest")
            if kind == "resolved" and d["resolved"] is None:
                try:
                    d["resolved"] = json.loads(rest)
                except ValueError:
                    pass
            elif kind == "applied":
                d["applied"].append(rest)
                d["excerpts"].append(line)
            elif kind == "event":
                d["events"].append({"event": rest.split()[0], **key_values(rest)})
                if call is not None:
                    call.setdefault("events", 0)
                    call["events"] += 1
            elif kind == "hooks":
                d["hooks_failed"].append(rest)
            elif kind == "call-begin":
                call = {**key_values(rest), "prefill_batches": [], "events": 0}
            elif kind == "call":
                if call is None:
                    call = {"prefill_batches": [], "events": 0}
                call.update(key_values(rest))
                d["calls"].append(call)
                call = None
            elif kind == "gpu-memory":
                d["gpu_memory"].append(key_values(rest))
            continue
        for key in (
            "pcg_disabled",
            "pcg_begin",
            "pcg_end",
            "pcg_tokens",
            "bcg_tokens",
            "bcg_eager",
            "decode_bs",
            "decode_end",
            "attn_default",
            "max_tokens",
        ):
            m = RX[key].search(line)
            if not m:
                continue
            if key == "pcg_disabled":
                d["pcg"], d["pcg_reason"] = "disabled", m.group("reason")
            elif key == "pcg_begin":
                d["pcg"] = "capturing"
            elif key == "pcg_end":
                d["pcg"], d["pcg_capture_s"] = "captured", float(m.group("s"))
            elif key == "pcg_tokens":
                d["pcg_tokens"] = _ints(m.group("tokens"))
            elif key == "bcg_tokens":
                d["bcg_tokens"] = _ints(m.group("tokens"))
            elif key == "bcg_eager":
                d["bcg_eager"] = m.group("cls")
            elif key == "decode_bs":
                d["decode_bs"] = _ints(m.group("bs"))
            elif key == "decode_end":
                d["decode_capture_s"] = float(m.group("s"))
            elif key == "attn_default":
                d["attention_backend"] = m.group("backend")
            elif key == "max_tokens":
                d["max_total_num_tokens"] = int(m.group("n"))
            if key != "max_tokens":
                d["excerpts"].append(strip_prefix(line))
        if RX["warmup"].search(line.strip()):
            phase = "warmup"
        elif RX["benchmark"].search(line.strip()):
            phase = "benchmark"
        m = RX["skipping"].search(line)
        if m and phase == "benchmark":
            d["bench"].append(
                {
                    "skipped": True,
                    "batch_size": int(m.group("bs")),
                    "input_len": int(m.group("il")),
                    "output_len": int(m.group("ol")),
                }
            )
        m = RX["prefill"].search(line)
        if m:
            current = {
                "prefill_latency": float(m.group("s")),
                "prefill_throughput": float(m.group("tps")),
                "decode_latencies": [],
            }
            if phase == "benchmark":
                d["bench"].append(current)
            else:
                d["warmup"] = current
        m = RX["decode_step"].search(line)
        if m and current is not None:
            current["decode_latencies"].append(float(m.group("s")))
        m = RX["decode_median"].search(line)
        if m and current is not None:
            current["median_decode_latency"] = float(m.group("s"))
        m = RX["trace_saved"].search(line)
        if m:
            d["traces"].append(m.group("path"))
        m = RX["prefill_batch"].search(line)
        if m:
            batch = {
                "seqs": int(m.group("seqs")),
                "tokens": int(m.group("tokens")),
                "graph": m.group("graph") == "True",
            }
            d["prefill_batches"].append(batch)
            if call is not None:
                call["prefill_batches"].append(batch)
        m = RX["decode_batch"].search(line)
        if m:
            d["decode_batches"].append(
                {"running": int(m.group("running")), "graph": m.group("graph") == "True"}
            )
    if d["resolved"]:
        r = d["resolved"]
        d["attention_backend"] = d["attention_backend"] or r.get("attention_backend")
        if d["pcg"] == "unknown" and r.get("disable_piecewise_cuda_graph"):
            d["pcg"] = "disabled"
    if d["pcg"] == "disabled" and d["pcg_reason"] == "--disable-piecewise-cuda-graph is set":
        d["pcg_reason"] += " (by the flag or by ServerArgs' auto-disable rules)"
    d["bcg"] = (
        "eager fallback"
        if d["bcg_eager"]
        else "captured"
        if d["bcg_tokens"] is not None
        else "not used"
    )
    return d


def strip_prefix(line: str) -> str:
    """A log line without SGLang's ``[time TP0] `` prefix."""
    return re.sub(r"^\[[^\]]*\]\s*", "", line)


def bench_results(d: dict, spec: EngineSpec, result_file: Optional[Path] = None) -> list[dict]:
    """One dict per benchmark run, in ``bench_one_batch``'s order (product of batch sizes, input
    lengths as passed, output length): its jsonl file where it wrote one, else the log's lines.
    The first ``spec.warmup`` runs of each shape are marked ``warmup`` (untimed sweeps)."""
    order = [
        (bs, il, spec.output_len)
        for bs in spec.batch_sizes
        for il in [n for _ in range(spec.warmup + spec.repeats) for n in spec.input_lens]
    ]
    if result_file is not None and result_file.is_file():
        rows = [json.loads(ln) for ln in result_file.read_text().splitlines() if ln.strip()]
        if rows:
            return _mark_warmup(rows, spec.warmup)
    out = []
    skipped = {
        (b["batch_size"], b["input_len"], b["output_len"]) for b in d["bench"] if b.get("skipped")
    }
    runs = [b for b in d["bench"] if not b.get("skipped")]
    printed = iter(runs)
    for bs, il, ol in order:
        if (bs, il, ol) in skipped:
            continue
        got = next(printed, None)
        if got is None:
            break
        out.append(
            {
                "batch_size": bs,
                "input_len": il,
                "output_len": ol,
                **{k: v for k, v in got.items() if k != "decode_latencies"},
            }
        )
    return _mark_warmup(out, spec.warmup)


def _mark_warmup(results: list[dict], warmup: int) -> list[dict]:
    seen: dict[tuple, int] = {}
    for r in results:
        shape = (r.get("batch_size"), r.get("input_len"), r.get("output_len"))
        seen[shape] = seen.get(shape, 0) + 1
        r["warmup"] = seen[shape] <= warmup
    return results
