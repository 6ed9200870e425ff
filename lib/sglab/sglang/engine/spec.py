"""What an engine run is, as data: a release, a model config, a tool (``bench``, ``engine`` or
``serve``) and server arguments (:class:`EngineSpec`), a notebook's scenarios of them
(:class:`Scenario`), and the harness adjustments, each named with its reason in every run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

from sglab.core import runs
from sglab.sglang import hf_config
from sglab.sglang.hf_config import text_config  # noqa: F401 (the engine's face)
from sglab.sglang.releases import parse_version


TOOLS = ("bench", "engine", "serve")

METHOD_VERSION = 1

VOCAB = 32000

# Defaults for flags the server arguments do not name: dummy weights, Triton attention (no FA3
# build carried), PyTorch sampling (no FlashInfer sampling JIT).
DEFAULT_ARGS = (("--load-format", "dummy"), ("--attention-backend", "triton"),
                ("--sampling-backend", "pytorch"))

# bench_one_batch loads a tokenizer whatever --skip-tokenizer-init says (load_model ->
# get_tokenizer); the Engine does not with it, and takes token ids.
ENGINE_ONLY_ARGS = (("--skip-tokenizer-init", None),)

# No grammar backend (xgrammar is not carried; random ids need none); the driver's untimed passes
# replace the server's warm-up (a VLM's is a chat completion the harness tokenizer cannot template).
SERVE_ONLY_ARGS = (("--grammar-backend", "none"), ("--skip-server-warmup", None))

DEFAULT_TIMEOUT_S = 900.0

AGAIN = "-again"  # the label suffix of a scenario's A/A control (Scenario.control)

# piecewise capture sizes every scenario that turns piecewise CUDA graphs on passes
PCG_FLAGS = ("--piecewise-cuda-graph-tokens", "128", "256", "512", "1024")


class EngineError(RuntimeError):
    """One line for the reader (``sglab engine: <message>``, exit status 2); ``log``: the log."""

    def __init__(self, message: str, log: Optional[Path] = None):
        super().__init__(message + (f" (log: {log})" if log else ""))
        self.log = log


class ReleaseError(EngineError):
    """The release cannot start here at all (not installed, or built for another torch)."""


@dataclass(frozen=True)
class Adjustment:
    """A change the harness makes to a release's run: ``env``, or a ``patch`` run on import."""

    name: str
    reason: str
    env: tuple = ()  # ((name, value), ...); a value may hold {lib} (this package's lib folder)
    patch: str = ""
    params: tuple = ()  # ((key, value), ...) handed to the patch as a dict

    def param_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.params}


def lib_dir() -> Path:
    return Path(__file__).resolve().parents[3]


repo = runs.repo_root

# the shared adjustments: what a model needs to run with dummy weights (a fix keeps its own)
ADJUSTMENTS = {
    "kimi-k25-post-load-weights": Adjustment(
        "kimi-k25-post-load-weights",
        "with dummy weights the KimiK25ForConditionalGeneration of releases before 0.5.13 never "
        "absorbs the MLA weights (it has no post_load_weights; the first decode dies on `w_kc` "
        "None): a subclass adding only 0.5.13's post_load_weights (no `model` property, so the "
        "released piecewise gate is kept) is registered through "
        "SGLANG_EXTERNAL_MODEL_PACKAGE=sglab.sglang.engine_models",
        env=(("SGLANG_EXTERNAL_MODEL_PACKAGE", "sglab.sglang.engine_models"),)),
    # the processor files are Hub remote code (offline: out of reach); 05's patch, every Kimi server
    "kimi-k25-processor-stand-in": Adjustment(
        "kimi-k25-processor-stand-in",
        "no network on the GPU box, so no Kimi-K2.5 processor files (Hub remote code): "
        "get_processor (srt/utils/hf_transformers/processor.py) returns a processor made by "
        "sglab.grid_thw.stand_in from the model folder: the harness's WordLevel tokenizer with "
        "Kimi's media tokens at ids 31996-31999 (<|media_pad|> = media_placeholder_token_id), a "
        "plain BaseImageProcessor, and Kimi-K2.5's media_proc_cfg (patch 14, merge 2, mean/std "
        "0.5); the release's own GPU preprocessing, grid and transport run unchanged",
        patch="sglab.grid_thw.stand_in:use_stand_in",
        params=(("module", "sglang.srt.utils.hf_transformers.processor"),))
}

# architecture -> (the adjustment dummy weights need, the release file and text making it moot)
MODEL_NEEDS = {
    "KimiK25ForConditionalGeneration": ("kimi-k25-post-load-weights", "srt/models/kimi_k25.py",
                                        "def post_load_weights")
}


def adjustment(name: str, known: Iterable[Adjustment] = ()) -> Adjustment:
    """The shared adjustment ``name`` (a model's), or one of ``known`` (the fixes' own)."""
    found = {**ADJUSTMENTS, **{a.name: a for a in known}}
    if name not in found:
        raise EngineError(f"unknown harness adjustment {name!r} (known: {', '.join(found)})")
    return found[name]


def revert_adjustment(name: str, reason: str, module: str, qualname: str, **hunk) -> Adjustment:
    """An adjustment redefining ``module.qualname`` without a PR's hunk (:func:`revert_hunk`)."""
    return Adjustment(name, reason, patch="sglab.sglang.engine.hooks:revert_hunk",
                      params=(("module", module), ("qualname", qualname), *hunk.items()))


def trace_adjustment(name: str, reason: str, module: str, qualname: str, event: str,
                     args: tuple[str, ...]) -> Adjustment:
    """An adjustment that prints an ``event`` line per call of ``module.qualname``."""
    return Adjustment(
        name, reason, patch="sglab.sglang.engine.hooks:trace_calls",
        params=(("module", module), ("qualname", qualname), ("event", event), ("args", args)))


@dataclass(frozen=True)
class EngineSpec:
    """One engine run: ``server_args`` (:data:`DEFAULT_ARGS` fill the rest) and the shape."""

    release: str
    model: Path
    tool: str = "bench"
    server_args: tuple[str, ...] = ()
    batch_sizes: tuple[int, ...] = (1,)
    input_lens: tuple[int, ...] = (1024,)
    output_len: int = 16
    repeats: int = 1
    requests: tuple[int, ...] = (1,)
    warmup: int = 1
    prompts: int = 4  # serve: prompts per pass and concurrent request
    profile: bool = False
    profile_steps: int = 2
    # "decode": kernels per decode-graph replay; "prefill": launches per prefill step (counts only)
    profile_stage: str = "decode"
    image_size: Optional[tuple[int, int]] = None
    prompt: str = ""
    case: str = ""
    adjustments: tuple[Adjustment, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S
    start: int = 0  # which engine start of this variant (a scenario's starts are interleaved)
    cpus: tuple[int, ...] = ()  # the CPUs its processes may run on; () wherever the OS puts them

    def __post_init__(self):
        if self.tool not in TOOLS:
            raise EngineError(f"unknown tool {self.tool!r} (known: {', '.join(TOOLS)})")
        try:
            parse_version(self.release)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        for name, n in (("repeats", self.repeats), ("prompts", self.prompts)):
            if n < 1:
                raise EngineError(f"--{name} must be at least 1, got {n}")

    @property
    def variant(self) -> str:
        return f"{self.release}+{self.case}" if self.case else self.release

    @property
    def tp_size(self) -> int:
        return runs.tp_of(self.server_args)


@dataclass(frozen=True)
class Case:
    """One arm of a scenario: a label, server arguments, adjustments and releases (default all)."""

    label: str
    args: tuple[str, ...] = ()
    adjustments: tuple = ()  # Adjustment or name
    releases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    """What a notebook runs on real engines; :meth:`specs` gives the runs."""

    fix: str
    name: str
    what: str
    model: str
    tool: str
    releases: tuple[str, ...]
    cases: tuple[Case, ...]
    gpus: int = 1
    batch_sizes: tuple[int, ...] = (1,)
    input_lens: tuple[int, ...] = (1024,)
    output_len: int = 16
    repeats: int = 1
    requests: tuple[int, ...] = (1,)
    prompts: int = 4
    profile: bool = False
    image_size: Optional[tuple[int, int]] = None
    prompt: str = ""
    expect: str = ""
    timeout: float = DEFAULT_TIMEOUT_S
    # engine starts per variant, interleaved (A B, B A, A B): the spread between starts is measured
    starts: int = 1
    # the A/A control: this case started again as "<case>-again" (the noise a timing must exceed)
    control: str = ""
    # one more start per variant under the profiler: exact launches per prefill step (bench tool)
    launch_pass: bool = False

    @property
    def experiment(self) -> str:
        return f"engine_{self.fix}"

    def model_config(self) -> Path:
        return repo() / "data" / "models" / self.model / "config.json"

    def all_cases(self) -> tuple[Case, ...]:
        """The cases, and the A/A control's copy of :attr:`control` right after it."""
        if self.control and self.control not in {c.label for c in self.cases}:
            raise EngineError(f"scenario {self.name}: control {self.control!r} is not a case")
        out = []
        for c in self.cases:
            copy = self.control and c.label == self.control
            out += [c, replace(c, label=f"{c.label}{AGAIN}")] if copy else [c]
        return tuple(out)

    def specs(self, releases: Optional[Iterable[str]] = None) -> list[EngineSpec]:
        """One spec per start, release and case; round ``i`` rotates the variants (A B, B A)."""
        # the fields a scenario hands each of its specs as they are
        names = ("tool", "batch_sizes", "input_lens", "output_len", "repeats", "requests",
                 "prompts", "profile", "image_size", "prompt", "timeout")
        shared = {f: getattr(self, f) for f in names}
        made = [
            EngineSpec(
                release=v, model=self.model_config(), server_args=c.args, case=c.label,
                adjustments=tuple(a if isinstance(a, Adjustment) else adjustment(a)
                                  for a in c.adjustments), **shared)
            for v in self.releases if not releases or v in releases
            for c in self.all_cases() if not c.releases or v in c.releases
        ]
        per_release: dict[str, list[EngineSpec]] = {}
        for sp in made:
            per_release.setdefault(sp.release, []).append(sp)
        timed = [
            replace(sp, start=i) for i in range(self.starts) for group in per_release.values()
            for sp in group[i % len(group):] + group[:i % len(group)]
        ]
        counted = [
            replace(sp, start=self.starts, profile=True, profile_stage="prefill", repeats=1)
            for sp in made
            if self.launch_pass and sp.tool == "bench" and not sp.case.endswith(AGAIN)
        ]
        return timed + counted


def read_config(path: Path) -> hf_config.HFConfig:
    """The model's ``config.json``; a one-line :class:`EngineError` where it cannot be read."""
    try:
        return hf_config.read(path, architectures=True)
    except hf_config.ConfigError as exc:
        raise EngineError(str(exc)) from None


def load_config(path: Path) -> dict:
    """The model's ``config.json`` as a dict (:func:`read_config`)."""
    return read_config(path).data


def flag_names(argv: Iterable[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]
