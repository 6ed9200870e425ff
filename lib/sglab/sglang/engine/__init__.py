"""A real release's whole engine on this machine's GPUs, measured with SGLang's own tools: what to
run (``spec``), the model folder (``model``), the release's environment (``release``), what runs
inside the engine's processes (``hooks``), launching and stopping (``launching``), reading its log
and traces (``log``, ``trace``), one run (``running``), its rows and record (``recording``), and the
``Engine`` driver (``driver``). Nothing here imports SGLang or torch into the calling process.

The names below are the package's face, for callers that need several of its parts.
"""

from sglab.sglang.engine.hooks import (SITECUSTOMIZE, function_source, patch_params, remove_text,
                                       revert_hunk, reverted_source, say)
from sglab.sglang.engine.launching import (KILL_GRACE_S, bench_argv, launch, prepare,
                                           with_model_needs)
from sglab.sglang.engine.log import LOG_STRINGS, bench_results, first_error, read_log
from sglab.sglang.engine.model import prepare_model
from sglab.sglang.engine.recording import record, rows, summary
from sglab.sglang.engine.release import check_pins, locate, release_flags
from sglab.sglang.engine.running import EngineResult, run
from sglab.sglang.engine.spec import (DEFAULT_TIMEOUT_S, PCG_FLAGS, VOCAB, Adjustment, Case,
                                      EngineError, EngineSpec, Scenario, adjustment, flag_names,
                                      text_config, trace_adjustment)
from sglab.sglang.engine.trace import decode_kernels

__all__ = ["SITECUSTOMIZE", "function_source", "patch_params", "remove_text", "revert_hunk",
           "reverted_source", "say", "KILL_GRACE_S", "bench_argv", "launch", "prepare",
           "with_model_needs",
           "LOG_STRINGS", "bench_results", "first_error", "read_log", "prepare_model", "record",
           "rows", "summary", "check_pins", "locate", "release_flags", "EngineResult", "run",
           "DEFAULT_TIMEOUT_S", "PCG_FLAGS", "VOCAB", "Adjustment", "Case", "EngineError",
           "EngineSpec", "Scenario", "adjustment", "flag_names", "text_config", "trace_adjustment",
           "decode_kernels"]
