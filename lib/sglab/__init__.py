"""sglab: rebuild SGLang fixes live on GPUs and measure each one before and after.

Layering (imports only go down):

1. ``hardware``, ``upstream``   what is here: GPUs, drivers, the installed SGLang source
2. ``measure``                  timing, kernel counts, NVML memory
3. ``dist``                     N ranks, one GPU each, with timeouts
4. ``fixes``                    the upstream mechanisms, PR-era, before/after switch, no measuring
5. ``experiments``              one module per notebook: ``run(params) -> tidy DataFrame``
6. ``runs``                     write a run + manifest, load recorded runs
7. ``plots``, ``notebook``      house style; what notebook cells call
8. ``cli``                      ``sglab env | run | record | sync``
"""

__version__ = "0.1.0"
