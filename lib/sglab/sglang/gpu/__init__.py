"""Real SGLang on GPUs, recorded like every other run: ``python -m sglab.sglang.gpu record``.

- :mod:`~sglab.sglang.gpu.plan`     which fix runs which probe on which release, and the GPUs it needs
- :mod:`~sglab.sglang.gpu.record`   the CLI: one worker subprocess per (fix, release), one run per fix
- :mod:`~sglab.sglang.gpu.graphs`   kernel nodes, profiled kernels and replay times of captured graphs
- probes, each run inside a release's worker: :mod:`~sglab.sglang.gpu.swa_loc`,
  :mod:`~sglab.sglang.gpu.breakable_graph`, :mod:`~sglab.sglang.gpu.grid_thw`, :mod:`~sglab.sglang.gpu.workspace_floor`

Nothing here imports SGLang into the calling process.
"""

from sglab.sglang.gpu.plan import FIXES, GpuFix, Step, plan_for

__all__ = ["FIXES", "GpuFix", "Step", "plan_for"]
