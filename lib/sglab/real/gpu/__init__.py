"""Real SGLang on GPUs, recorded like every other run: ``python -m sglab.real.gpu record``.

- :mod:`~sglab.real.gpu.plan`     which fix runs which probe on which release, and the GPUs it needs
- :mod:`~sglab.real.gpu.record`   the CLI: one worker subprocess per (fix, release), one run per fix
- :mod:`~sglab.real.gpu.graphs`   kernel nodes, profiled kernels and replay times of captured graphs
- probes, each run inside a release's worker: :mod:`~sglab.real.gpu.swa_loc`,
  :mod:`~sglab.real.gpu.breakable_graph`, :mod:`~sglab.real.gpu.grid_thw`, :mod:`~sglab.real.gpu.workspace_floor`

Nothing here imports SGLang into the calling process.
"""

from sglab.real.gpu.plan import FIXES, GpuFix, Step, plan_for

__all__ = ["FIXES", "GpuFix", "Step", "plan_for"]
