"""Reading an engine's log: one table of the lines SGLang writes (:data:`LINES`: the release file
that writes each, its exact pattern, what reading it does), our own lines from inside the engine's
processes (:data:`OURS_READ`), and SGLang's own error in one line (:func:`first_error`)."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Optional

from sglab.sglang.engine.hooks import MARK
from sglab.sglang.engine.spec import EngineSpec


OURS = re.compile(re.escape(MARK) + r" (?P<kind>\w[\w-]*) ?(?P<rest>.*)$")
# Messages SGLang raises to say "see above": the cause is an earlier traceback
WRAPPERS = ("Initialization failed. Please see the error messages above",
            "scheduler died during initialization", "is dead", "Child process unexpectedly failed")
_EXC = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))"
                  r"(?::\s*(?P<msg>.*))?$")


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def key_values(rest: str) -> dict:
    """``k=v`` pairs of one of our lines, each value read as JSON where it parses."""
    out = {}
    for k, v in re.findall(r"(\w+)=(\S+)", rest):
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


# the result's one-value facts (None until a line gives them) and its lists
_FACTS = ("pcg_reason", "pcg_tokens", "pcg_capture_s", "bcg_tokens", "bcg_eager", "decode_bs",
          "decode_capture_s", "attention_backend", "moe_config")
_LISTS = ("bench", "serving", "serve_errors", "prefill_batches", "decode_batches", "calls",
          "applied", "events", "hooks_failed", "gpu_memory", "excerpts")


class _Reading:
    """One pass over a log: the result ``d``, the bench phase, the current run and call."""

    def __init__(self):
        self.d: dict = {"pcg": "unknown", "resolved": None, "warmup": None, **dict.fromkeys(_FACTS)}
        self.d.update((k, []) for k in _LISTS)
        self.phase, self.current, self.call = "start", None, None


def _decision(**fields):
    """A handler setting result fields (constants or ``(group, convert)``), keeping an excerpt."""

    def handle(r: _Reading, m, line: str) -> None:
        for k, v in fields.items():
            r.d[k] = v[1](m.group(v[0])) if isinstance(v, tuple) else v
        r.d["excerpts"].append(re.sub(r"^\[[^\]]*\]\s*", "", line))  # no ``[time TP0]`` prefix

    return handle


def _phase(name: str):
    return lambda r, m, line: setattr(r, "phase", name)


def _prefill(r: _Reading, m, line: str) -> None:
    r.current = {"prefill_latency": float(m["s"]), "prefill_throughput": float(m["tps"])}
    if r.phase == "benchmark":
        r.d["bench"].append(r.current)
    else:
        r.d["warmup"] = r.current


def _decode_median(r: _Reading, m, line: str) -> None:
    if r.current is not None:
        r.current["median_decode_latency"] = float(m["s"])


def _skipping(r: _Reading, m, line: str) -> None:
    if r.phase == "benchmark":
        r.d["bench"].append(
            dict(skipped=True, batch_size=int(m["bs"]), input_len=int(m["il"]),
                 output_len=int(m["ol"])))


def _prefill_batch(r: _Reading, m, line: str) -> None:
    batch = {"seqs": int(m["seqs"]), "tokens": int(m["tokens"]), "graph": m["graph"] == "True"}
    r.d["prefill_batches"].append(batch)
    if r.call is not None:
        r.call["prefill_batches"].append(batch)


# key -> (the file that writes it in 0.5.11-0.5.13, its pattern, its handler or None: progress only)
MR, CGR, BOB = ("srt/model_executor/model_runner.py", "srt/model_executor/cuda_graph_runner.py",
                "bench_one_batch.py")
BCG = "srt/model_executor/breakable_cuda_graph_runner.py"
METRICS = ("srt/observability/scheduler_metrics_mixin.py (0.5.11, 0.5.12.post1), "
           "srt/managers/scheduler_components/metrics_reporter.py (0.5.13)")
GRAPH = r".*?(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False)"
LINES = {
    "pcg_disabled": (MR, r"Disable piecewise CUDA graph because (?P<reason>.+?)\s*$",
                     _decision(pcg="disabled", pcg_reason=("reason", str))),
    "pcg_begin": (MR, r"Capture piecewise CUDA graph begin\. avail mem=(?P<mem>[\d.]+) GB",
                  _decision(pcg="capturing")),
    "pcg_end": (MR, r"Capture piecewise CUDA graph end\. Time elapsed: (?P<s>[\d.]+) s\. mem "
                r"usage=(?P<mem>[\d.]+) GB", _decision(pcg="captured", pcg_capture_s=("s", float))),
    "pcg_tokens": ("srt/model_executor/piecewise_cuda_graph_runner.py",
                   r"Capture cuda graph num tokens \[(?P<tokens>[\d,\s]*)\]",
                   _decision(pcg_tokens=("tokens", _ints))),
    "bcg_tokens": (BCG, r"\[BCG\] Capture num tokens: \[(?P<tokens>[\d,\s]*)\]",
                   _decision(bcg_tokens=("tokens", _ints))),
    "bcg_eager": (f"{BCG} (0.5.12+)", r"\[BCG\] Could not resolve inner layer_model on (?P<cls>\S+)"
                  r"\. BCG is disabled for this model; prefill will fall back to eager\.",
                  _decision(bcg_eager=("cls", str))),
    "decode_bs": (CGR, r"Capture cuda graph bs \[(?P<bs>[\d,\s]*)\]",
                  _decision(decode_bs=("bs", _ints))),
    "decode_begin": (MR, r"Capture cuda graph begin\. This can take up to several minutes\.", None),
    "decode_end": (MR, r"Capture cuda graph end\. Time elapsed: (?P<s>[\d.]+) s\. mem "
                   r"usage=(?P<mem>[\d.]+) GB", _decision(decode_capture_s=("s", float))),
    "attn_default": ("srt/server_args.py", r"Attention backend not specified\. Use "
                     r"(?P<backend>\S+) backend by default\.",
                     _decision(attention_backend=("backend", str))),
    "load_begin": (MR, r"Load weight begin\. avail mem=(?P<mem>[\d.]+) GB", None),
    "warmup": (BOB, r"^Warmup \.\.\.$", _phase("warmup")),
    "benchmark": (BOB, r"^Benchmark \.\.\.$", _phase("benchmark")),
    "prefill": (BOB, r"Prefill\. latency: (?P<s>[\d.]+) s, throughput: +(?P<tps>[\d.]+) token/s",
                _prefill),
    "decode_median": (BOB, r"Decode\.  median latency: (?P<s>[\d.]+) s, median throughput: "
                      r"+(?P<tps>[\d.]+) token/s", _decode_median),
    "skipping": (BOB, r"skipping \((?P<bs>\d+), (?P<il>\d+), (?P<ol>\d+)\) due to max batch "
                 r"size limit", _skipping),
    "prefill_batch": (METRICS, r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: "
                      r"(?P<tokens>\d+), " + GRAPH, _prefill_batch),
    "decode_batch": ("same files as prefill_batch", r"Decode batch(?: \[\d+\])?, #running-req: "
                     r"(?P<running>\d+), " + GRAPH, lambda r, m, line: r.d["decode_batches"].append(
                         {"running": int(m["running"]), "graph": m["graph"] == "True"})),
    # fused MoE without a tuned config for this expert count, width and GPU (the file it looked for)
    "moe_default": ("srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py",
                    r"Using default MoE kernel config\. Performance might be sub-optimal! Config "
                    r"file not found at \S*?(?P<file>[^/\s]+\.json)",
                    _decision(moe_config=("file", lambda f: f"default (no {f})"))),
    "argparse": ("argparse (bench_one_batch's and the Engine's parsers)",
                 r"^\S+: error: (?P<msg>.+)$", None)
}
LOG_STRINGS = {k: (f, rx) for k, (f, rx, _) in LINES.items()}  # the file and pattern of each
RX = {k: re.compile(rx) for k, (_, rx) in LOG_STRINGS.items()}


def _resolved(r: _Reading, rest: str, line: str) -> None:
    if r.d["resolved"] is None:
        with contextlib.suppress(ValueError):
            r.d["resolved"] = json.loads(rest)


def _applied(r: _Reading, rest: str, line: str) -> None:
    r.d["applied"].append(rest)
    r.d["excerpts"].append(line)


def _event(r: _Reading, rest: str, line: str) -> None:
    r.d["events"].append({"event": rest.split()[0], **key_values(rest)})
    if r.call is not None:
        r.call["events"] += 1


def _call_begin(r: _Reading, rest: str, line: str) -> None:
    r.call = {**key_values(rest), "prefill_batches": [], "events": 0}


def _call(r: _Reading, rest: str, line: str) -> None:
    call = r.call if r.call is not None else {"prefill_batches": [], "events": 0}
    call.update(key_values(rest))
    r.d["calls"].append(call)
    r.call = None


OURS_READ = {
    "resolved": _resolved, "applied": _applied, "event": _event,
    "hooks": lambda r, rest, line: r.d["hooks_failed"].append(rest), "call-begin": _call_begin,
    "call": _call, "gpu-memory": lambda r, rest, line: r.d["gpu_memory"].append(key_values(rest)),
    "serve": lambda r, rest, line: r.d["serving"].append(key_values(rest)),
    "serve-error": lambda r, rest, line: r.d["serve_errors"].append(rest)
}

_JOINED = re.compile(r"(?<=\S)(?=" + re.escape(MARK) + r" )")


def read_log(text: str) -> dict:
    """The engine's decisions and measurements from its log (:data:`LINES`, :data:`OURS_READ`)."""
    r = _Reading()  # a line of ours joined to the end of another process's is split off
    for line in (part.rstrip() for raw in text.splitlines() for part in _JOINED.split(raw)):
        m = OURS.search(line)
        if m:
            handle = OURS_READ.get(m["kind"])
            if handle is not None:
                handle(r, m["rest"], line)
            continue
        for key, (_, _, handle) in LINES.items():
            m = RX[key].search(line.strip()) if handle is not None else None
            if m:
                handle(r, m, line)
    d = r.d
    if d["resolved"]:
        d["attention_backend"] = d["attention_backend"] or d["resolved"].get("attention_backend")
        if d["pcg"] == "unknown" and d["resolved"].get("disable_piecewise_cuda_graph"):
            d["pcg"] = "disabled"
    if d["pcg"] == "disabled" and d["pcg_reason"] == "--disable-piecewise-cuda-graph is set":
        d["pcg_reason"] += " (by the flag or by ServerArgs' auto-disable rules)"
    d["bcg"] = ("eager fallback"
                if d["bcg_eager"] else "captured" if d["bcg_tokens"] is not None else "not used")
    return d


def first_error(text: str) -> Optional[str]:
    """SGLang's own error in one line (a traceback's, else argparse's), or None."""
    lines = text.splitlines()
    finals, in_tb = [], False
    for line in lines:
        if "Traceback (most recent call last):" in line:
            in_tb = True
        elif in_tb and not line.startswith((" ", "\t")) and (m := _EXC.match(line.strip())):
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


def bench_results(d: dict, spec: EngineSpec, result_file: Optional[Path] = None) -> list[dict]:
    """One dict per benchmark run in ``bench_one_batch``'s order, warm-up runs marked."""
    order = [(bs, il, spec.output_len) for bs in spec.batch_sizes
             for il in [n for _ in range(spec.warmup + spec.repeats) for n in spec.input_lens]]
    if result_file is not None and result_file.is_file():
        rows = [json.loads(ln) for ln in result_file.read_text().splitlines() if ln.strip()]
        if rows:
            return _mark_warmup(rows, spec.warmup)
    out = []
    skipped = {(b["batch_size"], b["input_len"], b["output_len"])
               for b in d["bench"] if b.get("skipped")}
    printed = iter([b for b in d["bench"] if not b.get("skipped")])
    for bs, il, ol in order:
        if (bs, il, ol) in skipped:
            continue
        got = next(printed, None)
        if got is None:
            break
        out.append({"batch_size": bs, "input_len": il, "output_len": ol, **got})
    return _mark_warmup(out, spec.warmup)


def _mark_warmup(results: list[dict], warmup: int) -> list[dict]:
    seen: dict[tuple, int] = {}
    for r in results:
        shape = (r.get("batch_size"), r.get("input_len"), r.get("output_len"))
        seen[shape] = seen.get(shape, 0) + 1
        r["warmup"] = seen[shape] <= warmup
    return results
