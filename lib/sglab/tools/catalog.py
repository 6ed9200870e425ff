"""The notebooks of the workbook: number, file, experiment, GPUs needed, upstream change, claim."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    number: str
    stem: str  # notebooks/<stem>.ipynb
    experiment: str | None  # data/recorded/<experiment>/
    gpus: int  # GPUs the live part needs (0: runs anywhere)
    upstream: str  # upstream change
    fallback_claim: str  # used only until the experiment's claims module states CLAIM

    @property
    def claim(self) -> str:
        """The claim in one sentence: ``CLAIM`` of the experiment's claims module (one source for the README,
        the notebooks' first screens, 00 and the report)."""
        if self.experiment:
            try:
                import importlib

                return importlib.import_module(f"sglab.experiments.{self.experiment}.claims").CLAIM
            except (ModuleNotFoundError, AttributeError):
                pass
        return self.fallback_claim


NOTEBOOKS: tuple[Entry, ...] = (
    Entry("00", "00_start_here", None, 0, "-",
          "What the workbook is, what this machine can run live, and how recorded runs stand in for GPUs."),
    Entry("01", "01_pcg_gate", "pcg_gate", 1, "sgl-project/sglang#26382 (part A)",
          "A `.model` alias lets a VLM wrapper pass the piecewise-CUDA-graph gate; only the `__setattr__` guard keeps "
          "its weights from registering twice."),
    Entry("02", "02_workspace_floor", "workspace_floor", 2, "sgl-project/sglang#26382 (part B)",
          "A 2048-token floor removes the allreduce-fusion workspace's warm-up re-creations below 2048 tokens (the "
          "manager only grows, so fluctuating batches alone do not re-create), at the cost of a workspace of at "
          "least 2048 tokens from the first call."),
    Entry("03", "03_breakable_graph", "breakable_graph", 1, "sgl-project/sglang#24662",
          "Capturing only the layer stack lets one breakable CUDA graph serve prefill batches of any request count."),
    Entry("04", "04_swa_loc", "swa_loc", 1, "sgl-project/sglang#23552, #24743",
          "Presetting the SWA cache location before capture removes two kernels per SWA layer from every decode "
          "replay."),
    Entry("05", "05_grid_thw", "grid_thw", 2, "sgl-project/sglang#22858",
          "A `grid_thws` tensor left on cuda:0 makes every TP rank ≥1 open a CUDA context on GPU 0; `.cpu()` removes "
          "it, and the `image_grid_thw` rename lets the vision cache hit per image."),
    Entry("06", "06_capture_sizes", "capture_sizes", 2, "sgl-project/sglang#23972",
          "Piecewise capture sizes not divisible by the attention-TP size break the reduce-scatter; filtering or "
          "rounding them fixes capture."),
)


def by_stem(stem: str) -> Entry | None:
    return next((e for e in NOTEBOOKS if e.stem == stem), None)


def by_experiment(experiment: str) -> Entry | None:
    return next((e for e in NOTEBOOKS if e.experiment == experiment), None)
