"""A real release's whole engine on this machine's GPUs, measured with SGLang's own tools (one
concern per module, in the order a run goes). Nothing here imports SGLang or torch into the calling
process, nor pandas into the engine's own processes (they import ``hooks`` through this package)."""

from sglab.sglang.engine.hooks import (SITECUSTOMIZE, patch_params, remove_text, revert_hunk,
                                       reverted_source)
from sglab.sglang.engine.launching import bench_argv, launch, prepare, with_model_needs
from sglab.sglang.engine.log import LOG_STRINGS, bench_results, first_error, read_log
from sglab.sglang.engine.model import prepare_model
from sglab.sglang.engine.recording import record, rows, summary
from sglab.sglang.engine.release import check_pins, locate, release_flags
from sglab.sglang.engine.running import EngineResult, run
from sglab.sglang.engine.spec import (
    DEFAULT_TIMEOUT_S, PCG_FLAGS, VOCAB, Adjustment, Case, EngineError, EngineSpec, ReleaseError,
    Scenario, adjustment, flag_names, load_config, revert_adjustment, text_config, trace_adjustment)
from sglab.sglang.engine.trace import decode_kernels
