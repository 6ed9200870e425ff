"""The profiler's traces of ``bench_one_batch --profile``: the kernels of each CUDA-graph
replay (by the ``cudaGraphLaunch`` they correlate with), per replay and per layer; and the host's
launches in one prefill step (kernel launches, graph launches, the kernels the graphs replayed)."""

from __future__ import annotations

import collections
import gzip
import json
import re
import statistics
from pathlib import Path


HOST_CATS = ("cuda_runtime", "cuda_driver", "runtime")  # the host's launch calls
KERNEL_LAUNCH = re.compile(r"^cu(da)?LaunchKernel(Ex)?(C)?$|^cudaLaunchCooperativeKernel")
GRAPH_LAUNCH = re.compile(r"^cu(da)?GraphLaunch")


def read_trace(path: Path) -> dict:
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def graph_replays(trace: dict) -> list[list[str]]:
    """The kernels of each ``cudaGraphLaunch`` in a chrome trace (by correlation), in order."""
    launches, kernels = [], {}
    for ev in trace.get("traceEvents", []):
        cat, name = str(ev.get("cat", "")).lower(), str(ev.get("name", ""))
        corr = (ev.get("args") or {}).get("correlation")
        if corr is None:
            continue
        if cat in HOST_CATS and GRAPH_LAUNCH.match(name):
            launches.append((float(ev.get("ts", 0)), corr))
        elif cat == "kernel":
            kernels.setdefault(corr, []).append((float(ev.get("ts", 0)), name))
    return [[n for _, n in sorted(kernels.get(corr, []))] for _, corr in sorted(launches)]


def decode_kernels(trace_path: Path, layers: int, steps: int) -> dict:
    """Kernels per decode-graph replay and per layer in a decode trace, and per kernel name."""
    replays = graph_replays(read_trace(trace_path))
    counts = [len(r) for r in replays]
    table = collections.Counter(name for r in replays for name in r)
    n = max(1, len(replays))
    per_replay = statistics.median(counts) if counts else 0
    per_replay = int(per_replay) if float(per_replay).is_integer() else per_replay  # a count
    table = sorted(((k, v / n) for k, v in table.items()), key=lambda kv: (-kv[1], kv[0]))
    return dict(replays=len(replays), replays_per_step=len(replays) / max(1, steps),
                kernels_per_replay=per_replay,
                kernels_per_layer=per_replay / layers if layers else None, table=table)


# kernel families whose GPU time a prefill step reports: the attention kernels (the release's
# Triton extend kernels ``_fwd_kernel*`` and any named for attention) and the MoE kernels
FAMILIES = dict(attention=re.compile(r"_fwd_kernel|attention|attn|mla", re.I),
                moe=re.compile(r"moe", re.I))


def step_launches(trace: dict) -> dict:
    """What the host launched in a traced step (exact counts), and its kernels' GPU time."""
    events = trace.get("traceEvents", [])
    host = [str(ev.get("name", "")) for ev in events if str(ev.get("cat", "")).lower() in HOST_CATS]
    kernels = [ev for ev in events if str(ev.get("cat", "")).lower() == "kernel"]
    ms = lambda evs: round(sum(float(ev.get("dur", 0)) for ev in evs) / 1e3, 4)  # noqa: E731
    out = dict(kernel_launches=sum(bool(KERNEL_LAUNCH.match(n)) for n in host),
               graph_launches=sum(bool(GRAPH_LAUNCH.match(n)) for n in host),
               kernels_in_graphs=sum(len(r) for r in graph_replays(trace)), gpu_ms=ms(kernels))
    for family, pattern in FAMILIES.items():
        out[f"{family}_ms"] = ms(ev for ev in kernels if pattern.search(str(ev.get("name", ""))))
    return out


def prefill_launches(folder: Path) -> dict:
    """``{input_len: step_launches}`` of the prefill traces in ``folder``."""
    out = {}
    for path in sorted(Path(folder).glob("*prefill*.trace.json*")):
        m = re.search(r"_input(\d+)_", path.name)
        if m:
            out[int(m.group(1))] = step_launches(read_trace(path))
    return out
