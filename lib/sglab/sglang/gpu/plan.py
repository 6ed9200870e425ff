"""What ``python -m sglab.sglang.gpu record`` runs: per fix, the GPUs it needs and one probe step per release.

Each step is one worker subprocess (:func:`sglab.sglang.runner.run_probe`): one release, its shims, one probe
function of this package, a timeout. Steps of one fix run one after the other, never side by side, so that a
neighbour process never disturbs a timing. The releases are the ones straddling each fix (see
``../shared/real-sglang.md`` and :data:`sglab.sglang.releases.GPU_RELEASES`):

- ``swa_loc`` (#23552, #24743): the pool on 0.5.12.post1 (``set_swa_loc``, ``.to(torch.int32)`` translation)
  and 0.5.23 (``KVWriteLoc``); the decode buffers on 0.5.11 (int64, tail kept) and 0.5.12.post1.
- ``breakable_graph`` (#24662): the real ``BreakableCUDAGraph`` on 0.5.12.post1 and 0.5.23.
- ``grid_thw`` (#22858): a ``MultimodalDataItem`` over 0.5.23's msgpack wire, sender on GPU 0, receiver on GPU 1.
- ``workspace_floor`` (#26382): FlashInfer's workspace on 2 GPUs, when FlashInfer is importable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglab.sglang.releases import GPU_RELEASES

PKG = "sglab.sglang.gpu"


@dataclass(frozen=True)
class Step:
    """One release, one probe (``module:function``), its parameters and a timeout in seconds."""

    release: str
    probe: str
    params: dict = field(default_factory=dict)
    timeout: float = 420.0


@dataclass(frozen=True)
class GpuFix:
    name: str
    gpus: int
    method_version: int
    steps: tuple
    what: str

    @property
    def experiment(self) -> str:
        return f"real_{self.name}"

    @property
    def releases(self) -> list[str]:
        return list(dict.fromkeys(s.release for s in self.steps))


FIXES: dict[str, GpuFix] = {f.name: f for f in (
    GpuFix("swa_loc", 1, 1, (
        Step("0.5.11", f"{PKG}.swa_loc:run", {"pool": False, "buffers": True}),
        Step("0.5.12.post1", f"{PKG}.swa_loc:run", {"pool": True, "buffers": True}),
        Step("0.5.23", f"{PKG}.swa_loc:run", {"pool": True, "buffers": False}),
    ), "real SWAKVPool.set_kv_buffer in a CUDA graph: kernel nodes per SWA layer, replay time; decode buffers"),
    GpuFix("breakable_graph", 1, 1, (
        Step("0.5.12.post1", f"{PKG}.breakable_graph:run"),
        Step("0.5.23", f"{PKG}.breakable_graph:run"),
    ), "real BreakableCUDAGraph capturing the toy layer stack: segments, breaks, replay vs eager"),
    GpuFix("grid_thw", 2, 1, (
        Step("0.5.23", f"{PKG}.grid_thw:run", {"receiver_gpu": 1}, timeout=540.0),
    ), "real MultimodalDataItem over SGLang's msgpack wire to a process on GPU 1: its memory on GPU 0"),
    GpuFix("workspace_floor", 2, 1, (
        Step("0.5.23", f"{PKG}.workspace_floor:run"),
    ), "real FlashInfer workspace on 2 GPUs (only where FlashInfer is importable)"),
)}


def check_releases() -> None:
    """Every step's release is one the GPU carry holds (a typo here would only show on the GPU box)."""
    for fix in FIXES.values():
        for s in fix.steps:
            if s.release not in GPU_RELEASES:
                raise ValueError(f"{fix.name}: release {s.release} is not in GPU_RELEASES {GPU_RELEASES}")


def plan_for(names: list[str], gpu_count: int) -> tuple[list[GpuFix], list[str]]:
    """(fixes to run, one skip line per fix that needs more GPUs than ``gpu_count``). Unknown names raise
    ``ValueError`` with the known ones."""
    unknown = [n for n in names if n not in FIXES]
    if unknown:
        raise ValueError(f"unknown fix {', '.join(unknown)} (known: {', '.join(FIXES)})")
    run, skipped = [], []
    for name in dict.fromkeys(names):
        fix = FIXES[name]
        if fix.gpus > gpu_count:
            skipped.append(f"{name}: skipped, needs {fix.gpus} GPU{'s' if fix.gpus > 1 else ''}, have {gpu_count}")
        else:
            run.append(fix)
    return run, skipped


def describe(fixes: list[GpuFix]) -> list[str]:
    """One line per step, for ``--dry-run``."""
    lines = []
    for fix in fixes:
        lines.append(f"{fix.name} -> {fix.experiment} (method {fix.method_version}, {fix.gpus} GPU): {fix.what}")
        for s in fix.steps:
            extra = f" {s.params}" if s.params else ""
            lines.append(f"  sglang {s.release}: {s.probe}{extra} (timeout {s.timeout:.0f} s)")
    return lines
