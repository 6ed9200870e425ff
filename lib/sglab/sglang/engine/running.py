"""One engine run from start to result: prepare, launch with progress lines, read the log, and
turn what happened into a status and SGLang's own one-line error."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from sglab.core import hoststate
from sglab.sglang.engine.launching import launch, prepare, with_model_needs
from sglab.sglang.engine.log import OURS, RX, bench_results, first_error, key_values, read_log
from sglab.sglang.engine.spec import EngineSpec, read_config
from sglab.sglang.engine.trace import decode_kernels, prefill_launches


@dataclass
class EngineResult:
    spec: EngineSpec
    status: str  # ok | error | timeout | not-started
    error: str = ""
    log: Optional[Path] = None
    seconds: float = 0.0
    decisions: dict = field(default_factory=dict)
    bench: list = field(default_factory=list)
    kernels: Optional[dict] = None
    launches: Optional[dict] = None  # {input_len: step_launches} of a launch pass
    leftovers: list = field(default_factory=list)
    sglang_command: list = field(default_factory=list)
    server_argv: list = field(default_factory=list)
    pins: dict = field(default_factory=dict)
    found: dict = field(default_factory=dict)
    tail: list = field(default_factory=list)
    marker: str = ""  # SGLAB_ENGINE_RUN of the engine's processes
    host: dict = field(default_factory=dict)  # what the host did meanwhile (core.hoststate)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


PROGRESS = dict(load_begin="loading dummy weights", decode_begin="capturing decode CUDA graphs",
                pcg_begin="capturing piecewise CUDA graphs", warmup="warm-up run",
                benchmark="benchmark runs")


def _progress(echo: Callable[[str], None], spec: EngineSpec) -> Callable[[str], None]:
    seen: set[str] = set()
    t0 = time.monotonic()
    say = lambda text: echo(f"[sglab] sglang {spec.variant}: {text}")  # noqa: E731

    def on_line(line: str) -> None:
        for key, what in PROGRESS.items():
            if key not in seen and RX[key].search(line.strip()):
                seen.add(key)
                say(f"{what} ({time.monotonic() - t0:.0f} s)")
        m = RX["prefill"].search(line)
        if m and "benchmark" in seen:
            say(f"prefill {float(m.group('s')) * 1e3:.2f} ms")
        m = OURS.search(line)
        kind, kv = (m["kind"], key_values(m["rest"])) if m else ("", {})
        if kind == "call":
            say(f"{kv.get('requests')} requests x {kv.get('input_len')} tokens: "
                f"{float(kv.get('seconds', 0)) * 1e3:.1f} ms")
        elif kind == "serve":
            say(f"{kv.get('input_len')} tokens x {kv.get('prompts')} prompts, "
                f"{kv.get('concurrency')} at a time: TTFT "
                f"{float(kv.get('median_ttft_ms') or 0):.1f} ms, TPOT "
                f"{float(kv.get('median_tpot_ms') or 0):.2f} ms (medians)" +
                (" (warm-up)" if kv.get("warmup") else ""))
        elif kind in ("serve-ready", "serve-error", "hooks"):
            say(line.strip())

    return on_line


TOOL_NAMES = dict(bench="bench_one_batch", engine="Engine", serve="launch_server + bench_serving")


def run(spec: EngineSpec, *, work: Optional[Path] = None, echo: Callable[[str], None] = print,
        check: bool = True, said: Optional[set] = None) -> EngineResult:
    """Run one engine: :class:`EngineError` for what stops it before it starts, else a result."""
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix=f"sglab-engine-{spec.release}-"))
    spec = with_model_needs(spec, echo, said)
    prep = prepare(spec, work, check=check)
    log = work / "engine.log"
    echo(f"[sglab] sglang {spec.variant}: starting {TOOL_NAMES[spec.tool]} (timeout "
         f"{spec.timeout:.0f} s; log {log})")
    window = hoststate.begin()
    ex = launch(prep.argv, log=log, timeout=spec.timeout, env=prep.environ, cwd=work,
                marker=prep.marker, on_line=_progress(echo, spec))
    host = hoststate.end(window)
    text = log.read_text(errors="replace")
    tail = [ln for ln in text.splitlines() if ln.strip()]
    d = read_log(text)
    res = EngineResult(spec, "ok", log=log, seconds=ex.seconds, decisions=d,
                       sglang_command=prep.sglang_command, server_argv=prep.server_argv,
                       pins=prep.pins, found=prep.found,
                       leftovers=ex.leftovers + [f"{p} (survived SIGKILL)" for p in ex.survivors],
                       tail=tail[-12:], marker=prep.marker, host=host)
    if spec.tool == "bench":
        res.bench = bench_results(d, spec, work / "result.jsonl")

    def fail(why: str) -> None:
        res.status, res.error = "error", f"{why} (log: {log})"

    if ex.timed_out:
        res.status = "timeout"
        res.error = (
            f"no exit in {spec.timeout:.0f} s: stopped with its whole process group; last lines: "
            + " | ".join(res.tail[-3:]))
    elif ex.returncode != 0:
        fail(first_error(text) or f"exited with status {ex.returncode}")
    elif d["hooks_failed"]:
        fail(f"harness hooks failed: {d['hooks_failed'][0]}")
    else:
        missing = [
            a.name
            for a in spec.adjustments if a.patch and not any(a.name in x for x in d["applied"])
        ]
        if missing:
            fail(f"adjustment {', '.join(missing)} was never applied")
        elif spec.tool == "bench" and not res.bench:
            fail("bench_one_batch printed no result")
        elif spec.tool == "serve" and (d["serve_errors"] or not d["serving"]):
            fail(d["serve_errors"][0] if d["serve_errors"] else "bench_serving printed no result")
    if res.leftovers:
        echo(f"[sglab] sglang {spec.variant}: {len(res.leftovers)} process(es) of the engine were "
             f"left after it exited and were killed: {', '.join(res.leftovers)}")
    if spec.profile and spec.profile_stage == "prefill" and res.ok:
        res.launches = prefill_launches(work / "profile")
        if not res.launches:
            fail(f"bench_one_batch wrote no prefill trace in {work / 'profile'}")
    elif spec.profile and res.ok:
        traces = sorted((work / "profile").glob("*decode*.trace.json*"))
        if traces:
            layers = int(read_config(spec.model).text.get("num_hidden_layers") or 0)
            res.kernels = decode_kernels(traces[-1], layers, spec.profile_steps)
        else:
            fail(f"bench_one_batch wrote no decode trace in {work / 'profile'}")
    return res
