"""sglab: rebuild SGLang fixes live on GPUs and measure each one before and after.

One folder per fix, a thin shared core; imports only go down (the map: docs/structure.md):
``tools/`` (the ``sglab`` command, the report, verify, the list of fixes), ``<fix>/`` (one
notebook's rebuild, measurement, tables, claims and real-SGLang record), ``sglang/`` (real
releases side by side, their probes, the whole engine) and ``core/`` (runs, claims, timing,
kernels, memory, ranks, processes, plots).
"""

__version__ = "0.1.0"
