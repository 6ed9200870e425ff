"""``run(params)``: every variant × repeat as its own group of fresh processes, all groups at once.

Why at once: a CUDA context cannot be given back without its process exiting, so a process that touched GPU 0 cannot
measure a later variant — each variant × repeat needs fresh processes (a tokenizer and ``tp_size`` ranks). Started
one after the other, their start-up (Python, torch, CUDA, NCCL) dominated the run (170 s for 4 GPUs). NVML attributes
memory to each process on each GPU separately (``usedGpuMemory`` per pid), so groups that run side by side cannot mix
their numbers; each group's rank 0 also counts the other processes it sees on each GPU, so a run shows that its
``init`` baselines were read while other groups' contexts sat on the same GPUs.

One NVML :class:`sglab.core.memory.Sampler` follows every process of every group (100 Hz by default); the
processes' marks put the moments on the same clock (:mod:`.series` turns both into sidecars). The per-image cache point
runs on the CPU of the calling process meanwhile. After each group, its processes must be gone and no longer listed
by NVML.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from sglab.core import dist, runs
from sglab.fixes import grid_thw as fx
from sglab.core import memory, timing as phases
from sglab.experiments.grid_thw import series
from sglab.experiments.grid_thw.ranks import VARIANTS, _row, rank_main, tokenizer_main

EXPERIMENT = "grid_thw"
FORKSERVER_PRELOAD = ("torch", "sglab.experiments.grid_thw.ranks")


def _device_index(dev: str) -> int:
    """-1 for the CPU, k for cuda:k."""
    return -1 if dev == "cpu" else int(dev.split(":")[1]) if ":" in dev else 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _stop(proc, wait_s: float = 60.0):
    """Join ``proc`` within ``wait_s``, then terminate, then kill; return its exit code (None if it never ended)."""
    proc.join(timeout=wait_s)
    for end in (proc.terminate, proc.kill):
        if not proc.is_alive():
            break
        end()
        proc.join(timeout=5)
    return proc.exitcode


def _read_marks(path: str) -> list:
    """The tokenizer's marks (none when it died before writing them: the group's other checks say why)."""
    try:
        with open(path) as f:
            return json.load(f)["marks"]
    except (OSError, ValueError, KeyError):
        return []


def _exit_rows(variant: str, pids: list[int], nccl: bool, common: dict) -> list[dict]:
    """Every process of the group must be gone, and NVML must no longer list any of them (within 10 s)."""
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = sum(_alive(p) for p in pids)
    listed = -1
    if nccl:
        while True:
            listed = len(memory.process_gpu_memory(pids))
            if listed == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    kw = dict(common, process="all", phase="exited")
    return [_row(variant, "processes_alive", alive, "count", **kw),
            _row(variant, "nvml_processes_listed", listed, "count (-1 = not checked)", **kw)]


def _landing_rows(variant: str, results: list[dict], common: dict) -> list[dict]:
    rows = []
    for r in results:
        for m in r["memory_rows"]:
            rows.append({**m, **common})
        land = r["landed"]
        base = dict(common, process=f"rank {land['rank']}", rank=land["rank"], phase="received")
        rows.append(_row(variant, "grid_device", _device_index(land["grid_device"]), "device index (-1 = cpu)",
                         **base))
        rows.append(_row(variant, "pixel_values_device", _device_index(land["pixel_values_device"]),
                         "device index (-1 = cpu)", **base))
        rows.append(_row(variant, "grid_key_is_image_grid_thw", land["grid_key"] == "image_grid_thw", "bool",
                         **base))
        gpu = _device_index(land["grid_device"])
        for step, value in (land.get("stack") or {}).items():
            if value >= 0:  # the grid's device is a GPU: its context's per-thread stack after each step
                rows.append(_row(variant, "stack_limit_bytes", value, "bytes per thread",
                                 **dict(base, gpu=gpu, phase=step)))
        if "resident_threads" in land:
            rows.append(_row(variant, "resident_threads", land["resident_threads"], "threads (SMs × per SM)",
                             **dict(base, gpu=gpu)))
    return rows


def run_group(variant: str, tp_size: int, *, repeat: int = 0, n_images: int = 4, settle_s: float = 0.3,
              step_pause_s: float = 0.1, backend: str = "nccl", timeout_s: float = 120.0,
              start_method: str = "spawn") -> dict:
    """One group: a tokenizer and ``tp_size`` ranks, measured and torn down. Returns ``rows`` (tidy dicts) and what
    the time series needs (``t_start``, ``t_end``, ``procs`` pid -> (process, rank), ``marks``, rank ``phases``).
    ``start_method``: how the processes start (:func:`sglab.core.dist.launch`; ``forkserver`` needs
    :func:`sglab.core.dist.forkserver` first)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    v = VARIANTS[variant]
    tmp = tempfile.mkdtemp(prefix="sglab-grid-")
    address, marks_path = os.path.join(tmp, "tokenizer.sock"), os.path.join(tmp, "tokenizer.json")
    t_start = time.monotonic()
    tok = mp.get_context(start_method).Process(
        target=tokenizer_main, name=f"sglab-tokenizer-{variant}-{repeat}",
        args=(variant, tp_size if v.fanout == "tokenizer" else 1, address, n_images,
              "cuda:0" if backend == "nccl" else "cpu", marks_path))
    tok.start()
    try:
        spec = {"variant": variant, "address": address, "tokenizer_pid": tok.pid, "settle_s": settle_s,
                "step_pause_s": step_pause_s}
        results = dist.launch(rank_main, tp_size, args=(spec,), backend=backend, timeout_s=timeout_s,
                              collective_timeout_s=min(120.0, timeout_s), env=dict(v.rank_env),
                              start_method=start_method)
        tok_exit = _stop(tok)
        tok_marks = _read_marks(marks_path)
    finally:
        _stop(tok, wait_s=0)
        shutil.rmtree(tmp, ignore_errors=True)
    common = {"tp_size": tp_size, "repeat": repeat}
    pids = [r["landed"]["pid"] for r in results] + [tok.pid]
    rows = _landing_rows(variant, results, common)
    rows += _exit_rows(variant, pids, backend == "nccl", common)
    rows.append(_row(variant, "tokenizer_exitcode", -99 if tok_exit is None else tok_exit, "code",
                     **dict(common, process="all", phase="exited")))
    procs = {tok.pid: ("tokenizer", -1), **{r["landed"]["pid"]: (f"rank {r['landed']['rank']}", r["landed"]["rank"])
                                            for r in results}}
    marks = [("tokenizer", -1, *m) for m in tok_marks]
    marks += [(f"rank {r['landed']['rank']}", r["landed"]["rank"], *m) for r in results for m in r["marks"]]
    return {"variant": variant, "repeat": repeat, "rows": rows, "t_start": t_start, "t_end": time.monotonic(),
            "procs": procs, "marks": marks, "phases": [r["phases"] for r in results],
            "t_entry": [r["t_entry"] - t_start for r in results]}


def run_variant(variant: str, tp_size: int, **kw) -> list[dict]:
    """One group's tidy rows (the method-1 entry point; tests and quick checks)."""
    return run_group(variant, tp_size, **kw)["rows"]


# ------------------------------------------------------------------------------------------------------------------
# the cache point (CPU)
# ------------------------------------------------------------------------------------------------------------------
def cache_rows(*, n_requests: int = 200, pool: int = 24, max_images: int = 4, seed: int = 0) -> list[dict]:
    """Embedding-cache hits for the same seeded stream, bundled (before) vs split per image (after)."""
    stream = fx.request_stream(n_requests, pool, max_images, seed)
    rows = []
    for variant, fixed in (("before", False), ("after", True)):
        s = fx.simulate_cache(stream, fixed=fixed)
        kw = {"process": "cache", "phase": "cache"}
        rows += [_row(variant, "cache_item_hit_rate", s.hit_rate, "fraction", **kw),
                 _row(variant, "cache_image_hit_rate", s.image_hit_rate, "fraction", **kw),
                 _row(variant, "cache_lookups", s.lookups, "count", **kw),
                 _row(variant, "images_encoded", s.images_encoded, "count", **kw),
                 _row(variant, "images_requested", s.images, "count", **kw)]
    return rows


# ------------------------------------------------------------------------------------------------------------------
# run()
# ------------------------------------------------------------------------------------------------------------------
def check_params(p: dict) -> None:
    unknown = [v for v in p["variants"] if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if int(p["tp_size"]) < 2:
        raise ValueError(f"tp_size must be >= 2 (the effect is on ranks >= 1), got {p['tp_size']}")
    if p["start_method"] not in ("spawn", "forkserver"):
        raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {p['start_method']!r}")
    if int(p["repeats"]) < 1:
        raise ValueError(f"repeats must be >= 1, got {p['repeats']}")


def _run_groups(plan: list[tuple[str, int]], p: dict, backend: str, progress: bool, cache_job) -> tuple:
    """All groups (and the CPU cache point) at once, in threads that each wait on their own processes; every
    group is bounded by its own timeouts, and a failed group is re-raised once all have ended."""
    from tqdm.auto import tqdm

    kw = dict(n_images=int(p["n_images"]), settle_s=float(p["settle_s"]), step_pause_s=float(p["step_pause_s"]),
              backend=backend, timeout_s=float(p["timeout_s"]), start_method=p["start_method"])
    groups, errors = [], []
    with ThreadPoolExecutor(max_workers=len(plan) + 1, thread_name_prefix="sglab-group") as pool:
        cache = pool.submit(cache_job)
        futures = {pool.submit(run_group, v, int(p["tp_size"]), repeat=rep, **kw): (v, rep) for v, rep in plan}
        bar = tqdm(total=len(futures), desc=f"grid_thw tp={p['tp_size']}: {len(futures)} groups at once",
                   disable=not progress)
        for fut in as_completed(futures):
            try:
                groups.append(fut.result())
            except Exception as e:  # noqa: BLE001 - collected, re-raised below
                errors.append((futures[fut], e))
            bar.update(1)
        bar.close()
        cache_rows_ = cache.result()
    if errors:
        (v, rep), e = errors[0]
        raise RuntimeError(f"grid_thw group {v} (repeat {rep}) failed: {e}") from e
    return sorted(groups, key=lambda g: (plan.index((g["variant"], g["repeat"])))), cache_rows_


def _merge_rank_phases(groups: list[dict]) -> None:
    """Rank phases as the mean over the groups (they ran side by side: a sum would not be wall time)."""
    per: dict[str, list[float]] = {}
    for g in groups:
        for r, (d, t_entry) in enumerate(zip(g["phases"], g["t_entry"])):
            for k, val in {**d, "start (process, CUDA, NCCL init)": t_entry}.items():
                per.setdefault(f"rank{r}/{k}", []).append(val)
    phases.merge({k: sum(v) / len(v) for k, v in per.items()})


def run(params: dict | None = None, *, progress: bool = True, backend: str = "nccl") -> runs.Measured:
    """Every variant × repeat at one TP size, as concurrent groups of fresh processes, plus the cache point.

    Returns the tidy rows with sidecars ``memory`` (per-process MiB per GPU over time, change points), ``marks``
    (the moments each process marked) and ``trace`` (both as a Perfetto file) when NVML is available (``nccl``).
    """
    from sglab.experiments.grid_thw import DEFAULT_PARAMS

    p = {**DEFAULT_PARAMS, **(params or {})}
    check_params(p)
    tp = int(p["tp_size"])
    plan = [(v, rep) for rep in range(int(p["repeats"])) for v in p["variants"]]

    def cache_job():
        with phases.phase("cache point (CPU)"):
            return cache_rows(n_requests=int(p["cache_requests"]), pool=int(p["cache_pool"]),
                              max_images=int(p["cache_max_images"]), seed=int(p["seed"]))

    if p["start_method"] == "forkserver":
        with phases.phase("fork server"):  # torch imported once, in the server, not in every process
            dist.forkserver(FORKSERVER_PRELOAD)
    sampler = memory.Sampler(float(p["sample_hz"])).start() if backend == "nccl" else None
    try:
        with phases.phase("groups (all at once)"):
            groups, cache = _run_groups(plan, p, backend, progress, cache_job)
    finally:
        if sampler is not None:
            sampler.stop()
        if p["start_method"] == "forkserver":
            dist.stop_forkserver()
    _merge_rank_phases(groups)
    rows = [r for g in groups for r in g["rows"]] + [dict(r, tp_size=tp) for r in cache]
    sidecars = {}
    if sampler is not None:
        with phases.phase("time series"):
            rows += series.sampler_rows(sampler, tp)
            sidecars = series.sidecars(groups, sampler.samples(), sampler.ticks)
    return runs.Measured(runs.tidy(EXPERIMENT, rows), sidecars=sidecars,
                         extra={"concurrent_groups": len(plan)})
