"""sglab: rebuild SGLang fixes live on GPUs and measure each one before and after.

One folder per fix, a thin shared core; imports only go down (the map: docs/structure.md):

- ``tools/``                the ``sglab`` command, notebooks headless, the report, verify, the
                            one list of fixes
- ``<fix>/``                one notebook's rebuild, measurement, tables, claims and real-SGLang
                            record (``pcg_gate``, ``workspace_floor``, ``breakable_graph``,
                            ``swa_loc``, ``grid_thw``, ``capture_sizes``)
- ``sglang/``               real SGLang releases side by side, their probes, the whole engine
- ``core/``                 runs, claims, timing, kernels, memory, ranks, processes, plots
"""

__version__ = "0.1.0"
