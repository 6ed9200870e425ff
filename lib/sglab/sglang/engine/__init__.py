"""A real release's whole engine on this machine's GPUs, measured with SGLang's own tools: what to
run (``spec``), the model folder (``model``), the release's environment (``release``), what runs
inside the engine's processes (``hooks``), launching and stopping (``launching``), reading its log
and traces (``log``, ``trace``), one run (``running``), its rows and record (``recording``), and the
``Engine`` driver (``driver``). Nothing here imports SGLang or torch into the calling process.

The names below are the package's face, imported on first use: the engine's own processes import
``hooks`` alone, and nothing else of the package comes with it.
"""

import importlib


FACE = {
    "hooks": ("SITECUSTOMIZE", "function_source", "patch_params", "remove_text", "revert_hunk",
              "reverted_source", "say"),
    "launching": ("KILL_GRACE_S", "bench_argv", "launch", "prepare", "with_model_needs"),
    "log": ("LOG_STRINGS", "bench_results", "first_error", "read_log"),
    "model": ("prepare_model",),
    "recording": ("record", "rows", "summary"),
    "release": ("check_pins", "locate", "release_flags"),
    "running": ("EngineResult", "run"),
    "spec": ("DEFAULT_TIMEOUT_S", "PCG_FLAGS", "VOCAB", "Adjustment", "Case", "EngineError",
             "EngineSpec", "ReleaseError", "Scenario", "adjustment", "flag_names", "load_config",
             "revert_adjustment", "text_config", "tp_size", "trace_adjustment"),
    "trace": ("decode_kernels",),
}
_HOME = {name: module for module, names in FACE.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
