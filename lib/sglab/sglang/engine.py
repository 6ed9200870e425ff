"""A real release's whole engine on this machine's GPU, measured with SGLang's own tools.

One engine run (:class:`EngineSpec`) is a release, a model config (``config.json``), a tool and
server arguments:

- ``bench``: ``python -m sglang.bench_one_batch`` — the release's real ``ModelRunner`` without a
  scheduler; prefill and decode latency per batch size and input length (``--profile``:
  torch.profiler traces);
- ``engine``: ``sglang.Engine(...).generate(...)`` (the scheduler and its logs), for several
  requests sharing one prefill batch; driven by :func:`drive` inside the release's process.

The model folder holds the shipped ``config.json``, a 32,000-token WordLevel tokenizer written here,
and no weights (``--load-format dummy``). Each run starts in its own process group with the release
importable (its own folder and its dependency folder, or a GPU install folder,
``$SGLAB_ENGINE_HOME/<V>/site``); the log is streamed to a file; at the timeout the WHOLE group is
stopped (SIGTERM, then SIGKILL), and after any exit no process of the group, nor any process
carrying the run's marker variable, may be left: a scheduler left behind holds ~25 GiB of GPU
memory. What is left is killed and reported.

The engine's decisions are read from its log with the exact strings of the releases' sources
(:data:`LOG_STRINGS`): piecewise CUDA graph captured or disabled and why, its token list, the decode
graph's batch sizes, the breakable graph, the attention backend, ``bench_one_batch``'s latencies and
the scheduler's prefill batches; errors come back as the first line of SGLang's own message plus the
log's path.

Harness adjustments (:class:`Adjustment`) are named, each with its reason, and recorded with every
run: an environment variable, or a patch applied in every process of the engine (spawned children
included) through a ``sitecustomize`` written into the run's folder, which logs each application.

Nothing here imports SGLang (or torch) into the calling process; :func:`drive` and
:func:`install_hooks` run inside the release's processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from sglab.core import procs
from sglab.sglang.releases import dep_set, deps_dir, parse_version, release_dir

TOOLS = ("bench", "engine")
MARK = "[sglab-engine]"
METHOD_VERSION = 1
VOCAB = 32000
# The defaults every run gets unless the server arguments name the flag themselves (the facts of
# real engines on one GPU): dummy weights, Triton attention (no FA3 build carried), PyTorch sampling
# (no FlashInfer sampling JIT).
DEFAULT_ARGS = (
    ("--load-format", "dummy"),
    ("--attention-backend", "triton"),
    ("--sampling-backend", "pytorch"),
)
# bench_one_batch loads a tokenizer whatever --skip-tokenizer-init says (load_model ->
# get_tokenizer); the Engine does not with it, and takes token ids.
ENGINE_ONLY_ARGS = (("--skip-tokenizer-init", None),)
KILL_GRACE_S = 10.0
DEFAULT_TIMEOUT_S = 900.0


# piecewise capture sizes every scenario that turns piecewise CUDA graphs on passes
PCG_TOKENS = ("128", "256", "512", "1024")
PCG_FLAGS = ("--piecewise-cuda-graph-tokens", *PCG_TOKENS)


class EngineError(RuntimeError):
    """One line for the reader (``sglab engine: <message>``, exit status 2); ``log`` is the full
    log, if any."""

    def __init__(self, message: str, log: Optional[Path] = None):
        super().__init__(message + (f" (log: {log})" if log else ""))
        self.log = log


# -- harness adjustments ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Adjustment:
    """A change the harness makes to a release's run, named and justified in every manifest.

    ``env``: variables set for the engine's processes; ``patch``: ``module:function`` called as
    ``function(params)`` in every engine process once the release module ``params["module"]`` is
    imported."""

    name: str
    reason: str
    env: tuple = ()  # ((name, value), ...); a value may hold {lib} (this package's lib folder)
    patch: str = ""
    params: tuple = ()  # ((key, value), ...) handed to the patch as a dict

    @property
    def pair(self) -> tuple[str, str]:
        return (self.name, self.reason)

    def param_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.params}


def _lib() -> Path:
    return Path(__file__).resolve().parents[2]


def _repo() -> Path:
    from sglab.core.runs import repo_root

    return repo_root()


def hunk_added_lines(diff: Path, contains: str, symbol: str = "") -> str:
    """The ``+`` lines of the one hunk of ``diff`` that adds a line containing ``contains`` (in the
    section of ``symbol`` where the diff names its symbols), as text without the ``+``: what a
    revert removes.
    """
    hunks, cur, section = [], None, ""
    for line in diff.read_text().splitlines():
        if line.startswith("# ──") or line.startswith("--- ") or line.startswith("+++ "):
            section = line
            continue
        if line.startswith("@@"):
            cur = {"section": section, "lines": []}
            hunks.append(cur)
            continue
        if cur is not None:
            cur["lines"].append(line)
    picked = [
        h
        for h in hunks
        if (not symbol or symbol in h["section"])
        and any(ln.startswith("+") and contains in ln for ln in h["lines"])
    ]
    if len(picked) != 1:
        raise ValueError(
            f"{diff.name}: {len(picked)} hunks add a line with {contains!r} (expected one)"
        )
    lines = picked[0]["lines"]
    idx = [i for i, ln in enumerate(lines) if ln.startswith("+")]
    # the contiguous run of added lines around the one that matches
    hit = next(i for i in idx if contains in lines[i])
    lo = hi = hit
    while lo - 1 in idx:
        lo -= 1
    while hi + 1 in idx:
        hi += 1
    block = [ln[1:] for ln in lines[lo : hi + 1]]
    while block and not block[0].strip():
        block.pop(0)
    while block and not block[-1].strip():
        block.pop()
    return "\n".join(block) + "\n"


ADJUSTMENTS: dict[str, Callable[[], Adjustment]] = {
    "kimi-k25-post-load-weights": lambda: Adjustment(
        "kimi-k25-post-load-weights",
        "with dummy weights 0.5.12.post1's KimiK25ForConditionalGeneration never absorbs the MLA "
        "weights (it has no post_load_weights before 0.5.13; the first decode dies on `w_kc` "
        "None): a subclass adding only 0.5.13's post_load_weights (no `model` property, so the "
        "released piecewise gate is kept) is registered through "
        "SGLANG_EXTERNAL_MODEL_PACKAGE=sglab.sglang.engine_models",
        env=(("SGLANG_EXTERNAL_MODEL_PACKAGE", "sglab.sglang.engine_models"),),
    ),
}


def adjustment(name: str, known: Iterable[Adjustment] = ()) -> Adjustment:
    """The shared adjustment ``name`` (a model's, not a fix's), or one of ``known`` (each fix
    builds its own in its folder: ``sglab engine --adjust`` passes them all)."""
    found = {a.name: a for a in known}
    if name in found:
        return found[name]
    try:
        return ADJUSTMENTS[name]()
    except KeyError:
        raise EngineError(
            f"unknown harness adjustment {name!r} (known: {', '.join([*ADJUSTMENTS, *found])})"
        ) from None


def trace_adjustment(name: str, reason: str, module: str, qualname: str, event: str,
                     args: tuple[str, ...]) -> Adjustment:
    """An adjustment that prints one ``event`` line per call of ``module.qualname`` with the named
    arguments, the object it was called on and the call's time (:func:`trace_calls`)."""
    return Adjustment(name, reason, patch="sglab.sglang.engine:trace_calls",
                      params=(("module", module), ("qualname", qualname), ("event", event),
                              ("args", args)))


# -- what to run -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineSpec:
    """One engine run. ``server_args``: the reader's flags (after ``--``); the defaults of
    :data:`DEFAULT_ARGS` are added for flags not given. ``bench``: ``batch_sizes`` x ``input_lens``,
    each repeated ``repeats`` times in one process after ``warmup`` untimed sweeps of every input
    length (bench_one_batch's own warm-up covers only its first shape, so the first timed run of
    each other length would hold its JIT builds); ``engine``: ``requests`` requests of
    ``input_lens`` tokens per generate call, after ``warmup`` untimed calls."""

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
    profile: bool = False
    profile_steps: int = 2
    image_size: Optional[tuple[int, int]] = None
    prompt: str = ""
    case: str = ""
    adjustments: tuple[Adjustment, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S

    def __post_init__(self):
        if self.tool not in TOOLS:
            raise EngineError(f"unknown tool {self.tool!r} (known: {', '.join(TOOLS)})")
        try:
            parse_version(self.release)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        if self.repeats < 1:
            raise EngineError(f"--repeats must be at least 1, got {self.repeats}")

    @property
    def variant(self) -> str:
        return f"{self.release}+{self.case}" if self.case else self.release

    @property
    def tp_size(self) -> int:
        got = _flag_value(self.server_args, ("--tp-size", "--tp", "--tensor-parallel-size"))
        return int(got) if got else 1


@dataclass(frozen=True)
class Case:
    """One arm of a scenario: a label, server arguments, harness adjustments (an
    :class:`Adjustment`, built in the fix's own folder, or the name of a shared one), and
    optionally the releases it applies to (default: the scenario's)."""

    label: str
    args: tuple[str, ...] = ()
    adjustments: tuple = ()  # Adjustment or name
    releases: tuple[str, ...] = ()

    @property
    def adjustment_names(self) -> tuple[str, ...]:
        return tuple(a.name if isinstance(a, Adjustment) else a for a in self.adjustments)


@dataclass(frozen=True)
class Scenario:
    """What a notebook runs on real engines, as data: the fix, a model folder under ``data/models``,
    a tool, releases, cases and the measurement's shape. :meth:`specs` gives the runs, one per
    release and case."""

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
    profile: bool = False
    image_size: Optional[tuple[int, int]] = None
    prompt: str = ""
    expect: str = ""
    timeout: float = DEFAULT_TIMEOUT_S

    @property
    def experiment(self) -> str:
        return f"engine_{self.fix}"

    def model_config(self) -> Path:
        return _repo() / "data" / "models" / self.model / "config.json"

    def specs(self, releases: Optional[Iterable[str]] = None) -> list[EngineSpec]:
        pick = list(releases) if releases else None
        out = []
        for v in self.releases:
            if pick is not None and v not in pick:
                continue
            for c in self.cases:
                if c.releases and v not in c.releases:
                    continue
                out.append(
                    EngineSpec(
                        release=v,
                        model=self.model_config(),
                        tool=self.tool,
                        server_args=c.args,
                        batch_sizes=self.batch_sizes,
                        input_lens=self.input_lens,
                        output_len=self.output_len,
                        repeats=self.repeats,
                        requests=self.requests,
                        profile=self.profile,
                        image_size=self.image_size,
                        prompt=self.prompt,
                        case=c.label,
                        adjustments=tuple(
                            a if isinstance(a, Adjustment) else adjustment(a)
                            for a in c.adjustments
                        ),
                        timeout=self.timeout,
                    )
                )
        return out


# -- the model folder ------------------------------------------------------------------------------
def load_config(path: Path) -> dict:
    """The model's ``config.json`` as a dict; one-line :class:`EngineError` when it is missing or
    not JSON."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise EngineError(f"{path}: no such model config") from None
    except ValueError as exc:
        raise EngineError(f"{path}: not JSON: {exc}") from None
    if not isinstance(cfg, dict) or not cfg.get("architectures"):
        raise EngineError(f"{path}: a model config needs an 'architectures' list")
    return cfg


def text_config(cfg: dict) -> dict:
    """The language model's part of a config (a multimodal one's ``text_config``, else itself)."""
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def tokenizer_json(vocab: int = VOCAB) -> dict:
    """A WordLevel tokenizer (``tokenizers``' JSON format) of ``vocab`` tokens: ``<unk> <s> </s>
    <pad>`` and ``t4 ... t{vocab-1}``, split on whitespace. Enough for SGLang to load a tokenizer
    offline."""
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    words = {tok: i for i, tok in enumerate(special)}
    words.update({f"t{i}": i for i in range(len(special), vocab)})
    added = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate(special)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"},
    }


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "model_max_length": 131072,
    "clean_up_tokenization_spaces": False,
}


def config_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def prepare_model(config: Path, dest: Path) -> Path:
    """``dest`` as a model folder SGLang loads offline with dummy weights: ``config.json`` (a copy),
    the tokenizer of :func:`tokenizer_json` and its ``tokenizer_config.json``. The tokenizer's size
    must not exceed the model's vocabulary."""
    cfg = load_config(config)
    vocab = int(text_config(cfg).get("vocab_size") or cfg.get("vocab_size") or VOCAB)
    if vocab < VOCAB:
        raise EngineError(
            f"{config}: vocab_size {vocab} is below the harness tokenizer's {VOCAB} tokens"
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_bytes(Path(config).read_bytes())
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (dest / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=1))
    return dest


def probe_model_config(prepared, params: dict) -> list[dict]:
    """Probe (``sglab.sglang.runner``, any installed release, CPU): the release's own
    ``ModelConfig`` of the model folder built from ``params["config"]``; rows of what it decided. A
    config the release cannot parse raises its own error."""
    from sglang.srt.configs.model_config import ModelConfig

    with tempfile.TemporaryDirectory(prefix="sglab-model-") as tmp:
        folder = prepare_model(Path(params["config"]), Path(tmp) / "model")
        mc = ModelConfig(model_path=str(folder), trust_remote_code=False)
        keys = (
            "is_multimodal",
            "is_hybrid_swa",
            "attention_arch",
            "num_hidden_layers",
            "context_len",
            "vocab_size",
            "hidden_size",
            "swa_attention_layer_ids",
            "full_attention_layer_ids",
            "sliding_window_size",
            "kv_lora_rank",
        )
        out = []
        for k in keys:
            v = getattr(mc, k, None)
            out.append(
                {
                    "metric": k,
                    "value": v
                    if isinstance(v, (int, float, bool, str, list, type(None)))
                    else str(v),
                }
            )
        out.append({"metric": "architecture", "value": mc.hf_config.architectures[0]})
        if params.get("tokenizer", True):
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            tok = get_tokenizer(str(folder))
            out.append({"metric": "tokenizer", "value": f"{type(tok).__name__} {len(tok)}"})
            out.append(
                {
                    "metric": "tokenizer_ids",
                    "value": tok.encode("t7 t31999 t4", add_special_tokens=False),
                }
            )
        return out


# -- the release's environment ---------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseEnv:
    """Where one release is importable from: ``paths`` go first on ``PYTHONPATH``."""

    release: str
    paths: tuple[Path, ...]
    source: str  # "gpu-install" | "releases"

    @property
    def package(self) -> Path:
        return self.paths[0] / "sglang"


def engine_home() -> Optional[Path]:
    env = os.environ.get("SGLAB_ENGINE_HOME")
    return Path(env) if env else None


def locate(release: str) -> ReleaseEnv:
    """The release's environment: ``$SGLAB_ENGINE_HOME/<V>/site`` (a GPU install from the engine
    bundles), else the side-by-side layout of :mod:`sglab.sglang.releases`."""
    home = engine_home()
    if home is not None and (home / release / "site" / "sglang" / "__init__.py").is_file():
        return ReleaseEnv(release, (home / release / "site",), "gpu-install")
    rdir = release_dir(release)
    if (rdir / "sglang" / "__init__.py").is_file():
        return ReleaseEnv(release, (rdir, deps_dir(dep_set(release))), "releases")
    where = f"{home}/{release}/site or {rdir}" if home else str(rdir)
    raise EngineError(
        f"sglang {release} is not installed ({where}; on a GPU box: scripts/engine_gpu.sh, here: "
        f"sglab real install --releases {release})"
    )


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release_pins(env: ReleaseEnv) -> dict[str, str]:
    """``{normalized name: version}`` of the ``==`` pins in the release's own dist-info
    (Requires-Dist)."""
    metas = sorted(env.paths[0].glob("sglang-*.dist-info/METADATA"))
    if not metas:
        return {}
    pins = {}
    for line in metas[0].read_text().splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        m = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^;\s]+)", line)
        if m:
            pins[_norm(m.group(1))] = m.group(3)
    return pins


def found_versions(
    env: ReleaseEnv,
    names=(
        "torch",
        "sglang-kernel",
        "flashinfer-python",
        "transformers",
        "triton",
        "apache-tvm-ffi",
        "tokenizers",
    ),
) -> dict[str, Optional[str]]:
    """Versions the engine's processes will import: the release's folders first, then this
    interpreter."""
    import importlib.metadata as md

    out: dict[str, Optional[str]] = {}
    want = {_norm(n): n for n in names}
    for dist in md.distributions(path=[str(p) for p in env.paths]):
        n = _norm(dist.metadata.get("Name") or "")
        if n in want and n not in out:
            out[n] = dist.version
    for n in want:
        if n not in out:
            try:
                out[n] = md.version(want[n])
            except md.PackageNotFoundError:
                out[n] = None
    return out


def _base(version: Optional[str]) -> str:
    return (version or "").split("+", 1)[0]


def check_pins(env: ReleaseEnv, found: Optional[dict] = None) -> dict[str, str]:
    """The release's pins; :class:`EngineError` (one line, nothing started) when its torch pin is
    not this interpreter's torch: its compiled kernels (sglang-kernel, FlashInfer's JIT) are built
    for that torch."""
    pins = release_pins(env)
    found = found if found is not None else found_versions(env)
    want, have = pins.get("torch"), found.get("torch")
    if want and _base(have) != want:
        kernel = pins.get("sglang-kernel")
        raise EngineError(
            f"sglang {env.release} pins torch=={want}"
            + (f" (sglang-kernel {kernel} is built for it)" if kernel else "")
            + f"; this machine has torch {have or 'none'}: nothing started"
        )
    return pins


# -- flags, read from the release's source ---------------------------------------------------------
def release_flags(package: Path, tool: str) -> set[str]:
    """Every ``--flag`` the release's parsers accept for ``tool``: ``add_argument`` strings of
    ``srt/server_args.py`` (and ``bench_one_batch.py`` for the bench), plus the flags that 0.5.14+
    derive from fields annotated ``A[T, "help"]`` / ``A[T, Arg(...)]`` (``cli_name``, ``aliases``)
    of ``ServerArgs`` and, from 0.5.2x, of the field groups under ``srt/arg_groups/``."""
    import ast

    name = package.parent.name
    files = [package / "srt" / "server_args.py"]
    if tool == "bench":
        files.append(package / "bench_one_batch.py")
    for f in files:
        if not f.is_file():
            raise EngineError(
                f"sglang {name}: {f.relative_to(package.parent)} not found"
                + (
                    " (this release has no bench_one_batch: use --tool engine)"
                    if f.name == "bench_one_batch.py"
                    else ""
                )
            )
    files += sorted((package / "srt" / "arg_groups").rglob("*.py"))
    flags: set[str] = set()
    for f in files:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and a.value.startswith("--")
                )
            if isinstance(node, ast.ClassDef):
                flags.update(_annotated_flags(node))
    return flags


def _annotated_flags(cls) -> set[str]:
    import ast

    out = set()
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = stmt.annotation
        if not (
            isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") in ("A", "Annotated")
        ):
            continue
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else []
        if len(elts) < 2:
            continue
        meta = elts[1]
        name = "--" + stmt.target.id.replace("_", "-")
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            out.add(name)
        elif isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
            kw = {k.arg: k.value for k in meta.keywords}
            if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value:
                continue
            cli = kw.get("cli_name")
            out.add(cli.value if isinstance(cli, ast.Constant) else name)
            if isinstance(kw.get("aliases"), (ast.List, ast.Tuple)):
                out.update(e.value for e in kw["aliases"].elts if isinstance(e, ast.Constant))
    return out


def _flag_names(argv: Iterable[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def _flag_value(argv: Iterable[str], names: Iterable[str]) -> Optional[str]:
    argv, names = list(argv), set(names)
    for i, a in enumerate(argv):
        key, eq, val = a.partition("=")
        if key in names:
            return val if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def check_flags(argv: Iterable[str], flags: set[str], release: str, tool: str) -> None:
    """:class:`EngineError` naming the flags this release's parsers do not define (read from its
    source)."""
    unknown = [f for f in _flag_names(argv) if f not in flags]
    if unknown:
        where = "srt/server_args.py" + (" and bench_one_batch.py" if tool == "bench" else "")
        raise EngineError(
            f"sglang {release} does not accept {' '.join(unknown)} (not defined in its {where})"
        )


# -- commands --------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """Everything a launch needs, decided before anything starts."""

    spec: EngineSpec
    env: ReleaseEnv
    work: Path
    model_dir: Path
    argv: list[str]  # what is started
    # the release's own command line (bench), or "sglang.Engine" and its server arguments
    sglang_command: list[str]
    server_argv: list[str]
    hooks: Path
    environ: dict
    pins: dict = field(default_factory=dict)
    found: dict = field(default_factory=dict)
    marker: str = ""


def server_argv(spec: EngineSpec, model_dir: Path, flags: Optional[set[str]] = None) -> list[str]:
    """The server arguments: ``--model-path`` first, the harness defaults for flags the reader did
    not give (only those the release defines), then the reader's own."""
    given = set(_flag_names(spec.server_args))
    out = ["--model-path", str(model_dir)]
    # an image goes through the model's processor: the Engine then needs its tokenizer
    engine_only = spec.tool == "engine" and not spec.image_size
    defaults = DEFAULT_ARGS + (ENGINE_ONLY_ARGS if engine_only else ())
    for flag, value in defaults:
        if flag in given or (flags is not None and flag not in flags):
            continue
        out += [flag] if value is None else [flag, value]
    return out + list(spec.server_args)


def bench_argv(spec: EngineSpec, work: Path) -> list[str]:
    """``bench_one_batch``'s own arguments: the batch sizes, the input lengths repeated ``warmup +
    repeats`` times (one sweep after another, in one process), the output length, the jsonl result
    file, and the profile."""
    lens = [str(n) for _ in range(spec.warmup + spec.repeats) for n in spec.input_lens]
    out = [
        "--batch-size",
        *[str(b) for b in spec.batch_sizes],
        "--input-len",
        *lens,
        "--output-len",
        str(spec.output_len),
        "--run-name",
        spec.variant,
        "--result-filename",
        str(work / "result.jsonl"),
    ]
    if spec.profile:
        out += [
            "--profile",
            "--profile-stage",
            "decode",
            "--profile-steps",
            str(spec.profile_steps),
            "--profile-filename-prefix",
            "profile",
        ]
    return out


def driver_params(spec: EngineSpec, server: list[str]) -> dict:
    """What :func:`drive` reads (written as ``drive.json`` in the run's folder)."""
    return {
        "server_argv": server,
        "requests": list(spec.requests),
        "input_lens": list(spec.input_lens),
        "output_len": spec.output_len,
        "repeats": spec.repeats,
        "warmup": spec.warmup,
        "image_size": list(spec.image_size) if spec.image_size else None,
        "prompt": spec.prompt,
    }


SITECUSTOMIZE = """\
# Written by sglab.sglang.engine for one engine run: installs the run's hooks in every Python
# process of the engine (spawned children too), then hands over to the next sitecustomize on the
# path, if any.
import os, sys
def _next_sitecustomize():
    import importlib.machinery, importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
try:
    _next_sitecustomize()
except Exception:
    pass
if os.environ.get("SGLAB_ENGINE_HOOKS"):
    try:
        from sglab.sglang.engine import install_hooks
        install_hooks(os.environ["SGLAB_ENGINE_HOOKS"])
    except Exception as exc:
        msg = "[sglab-engine] hooks failed: %s: %s" % (type(exc).__name__, exc)
        print(msg, file=sys.stderr, flush=True)
"""


def patch_params(a: Adjustment) -> dict:
    """An adjustment's patch parameters as the engine's processes get them: a hunk named by its diff
    file is resolved here to the exact text the revert removes."""
    params = a.param_dict()
    if params.get("diff") and not params.get("text"):
        params["text"] = hunk_added_lines(_repo() / params["diff"], params["contains"])
    return params


def prepare(
    spec: EngineSpec, work: Path, *, python: str = sys.executable, check: bool = True
) -> Prepared:
    """Decide the whole launch without starting anything: locate the release, check its torch pin
    (``check``), check the flags against its source, lay out the model folder, the hooks and the
    environment."""
    load_config(spec.model)
    env = locate(spec.release)
    found = found_versions(env)
    pins = check_pins(env, found) if check else release_pins(env)
    flags = release_flags(env.package, spec.tool)
    check_flags(spec.server_args, flags, spec.release, spec.tool)
    if spec.tool == "bench" and spec.image_size:
        raise EngineError("an image needs the engine tool (--tool engine)")
    work.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(spec.model, work / "model")
    server = server_argv(spec, model_dir, flags)
    hooks_dir = work / "hooks"
    hooks_dir.mkdir(exist_ok=True)
    (hooks_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    hooks = work / "hooks.json"
    hooks.write_text(
        json.dumps(
            {
                "resolved": True,
                "patches": [
                    {"name": a.name, "patch": a.patch, "params": patch_params(a)}
                    for a in spec.adjustments
                    if a.patch
                ],
            },
            indent=1,
        )
    )
    if spec.tool == "bench":
        sglang_cmd = [python, "-m", "sglang.bench_one_batch", *server, *bench_argv(spec, work)]
        argv = list(sglang_cmd)
    else:
        (work / "drive.json").write_text(json.dumps(driver_params(spec, server), indent=1))
        sglang_cmd = ["sglang.Engine", *server]
        argv = [python, "-m", "sglab.sglang.engine", "drive", str(work / "drive.json")]
    marker = uuid.uuid4().hex
    environ = dict(os.environ)
    path = [str(hooks_dir), str(_lib()), *[str(p) for p in env.paths]]
    if environ.get("PYTHONPATH"):
        path.append(environ["PYTHONPATH"])
    environ.update(
        {
            "PYTHONPATH": os.pathsep.join(path),
            "SGLAB_ENGINE_HOOKS": str(hooks),
            "SGLAB_ENGINE_RUN": marker,
            "SGLANG_TORCH_PROFILER_DIR": str(work / "profile"),
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    environ.setdefault("NCCL_NVLS_ENABLE", "0")
    for a in spec.adjustments:
        environ.update({k: v.format(lib=_lib()) for k, v in a.env})
    return Prepared(
        spec, env, work, model_dir, argv, sglang_cmd, server, hooks, environ, pins, found, marker
    )


# -- hooks inside the engine's processes -----------------------------------------------------------
def say(text: str) -> None:
    print(f"{MARK} {text}", flush=True)


class _AfterImport:
    """A meta-path finder that runs callbacks right after the named modules finish executing."""

    def __init__(self):
        self.callbacks: dict[str, list[Callable]] = {}

    def add(self, module: str, fn: Callable) -> None:
        if module in sys.modules:
            fn(sys.modules[module])
        else:
            self.callbacks.setdefault(module, []).append(fn)

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, callbacks = spec.loader, self.callbacks.pop(name)
        original = loader.exec_module

        def exec_module(module):
            original(module)
            for fn in callbacks:
                fn(module)

        loader.exec_module = exec_module
        return spec


RESOLVED_KEYS = (
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "sampling_backend",
    "disable_piecewise_cuda_graph",
    "enforce_piecewise_cuda_graph",
    "piecewise_cuda_graph_tokens",
    "piecewise_cuda_graph_max_tokens",
    "enable_breakable_cuda_graph",
    "disable_cuda_graph",
    "cuda_graph_bs",
    "cuda_graph_max_bs",
    "tp_size",
    "moe_dense_tp_size",
    "enable_flashinfer_allreduce_fusion",
    "mem_fraction_static",
    "chunked_prefill_size",
    "max_total_tokens",
    "load_format",
    "dtype",
    "kv_cache_dtype",
    "enable_multimodal",
    "skip_tokenizer_init",
    "disable_radix_cache",
    "moe_runner_backend",
)


def _print_resolved(module) -> None:
    cls = getattr(module, "ServerArgs", None)
    if cls is None or getattr(cls.__post_init__, "_sglab", False):
        return
    original = cls.__post_init__

    def __post_init__(self, *a, **kw):
        original(self, *a, **kw)
        out = {}
        for k in RESOLVED_KEYS:
            v = getattr(self, k, "<absent>")
            if v == "<absent>":
                continue
            out[k] = v if isinstance(v, (str, int, float, bool, list, type(None))) else str(v)
        say("resolved " + json.dumps(out, default=str))

    __post_init__._sglab = True
    cls.__post_init__ = __post_init__


def install_hooks(path: str) -> None:
    """Inside an engine process (from the run's ``sitecustomize``): print the resolved server
    arguments once ``ServerArgs`` is built, and apply each patch once its module is imported."""
    import importlib

    spec = json.loads(Path(path).read_text())
    finder = _AfterImport()
    sys.meta_path.insert(0, finder)
    if spec.get("resolved"):
        finder.add("sglang.srt.server_args", _print_resolved)
    for p in spec.get("patches", []):
        mod, _, fn = p["patch"].partition(":")
        target = getattr(importlib.import_module(mod), fn)
        params = dict(p["params"], name=p["name"])
        finder.add(
            params["module"], lambda module, target=target, params=params: target(params, module)
        )


def _resolve(module, qualname: str):
    owner, obj = None, module
    for part in qualname.split("."):
        owner, obj = obj, getattr(obj, part)
    return owner, qualname.split(".")[-1], obj


def function_source(source: str, qualname: str) -> str:
    """The dedented source of ``qualname`` (``Class.method`` or ``function``) in a module's source
    text, decorators included (read with ``ast``, nothing imported)."""
    import ast
    import textwrap

    tree = ast.parse(source)
    nodes, found = tree.body, None
    for part in qualname.split("."):
        found = next(
            (
                n
                for n in nodes
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if found is None:
            raise ValueError(f"{qualname}: {part} not found")
        nodes = found.body
    lines = source.splitlines(keepends=True)
    start = min([found.lineno] + [d.lineno for d in found.decorator_list]) - 1
    return textwrap.dedent("".join(lines[start : found.end_lineno]))


def remove_text(source: str, text: str, what: str, replacement: str = "") -> str:
    """``source`` with the one occurrence of ``text`` removed (or replaced by ``replacement``);
    ValueError when it occurs zero or several times."""
    n = source.count(text)
    if n != 1:
        raise ValueError(f"{what}: the hunk occurs {n} times (expected exactly once)")
    return source.replace(text, replacement, 1)


def reverted_source(params: dict, source: str) -> str:
    """The function's source with the hunk of ``params`` removed (``text``, or the ``+`` lines of
    the hunk of ``diff`` that adds ``contains``). Refuses functions that a re-definition outside the
    class would change (zero-argument ``super()``, name-mangled attributes)."""
    text = params.get("text") or hunk_added_lines(_repo() / params["diff"], params["contains"])
    if "super()" in source or re.search(r"\bself\.__[a-z]\w*", source):
        raise ValueError(f"{params['qualname']}: cannot be redefined outside its class")
    return remove_text(source, text, params["qualname"], params.get("replacement", ""))


def revert_hunk(params: dict, module) -> None:
    """Patch: redefine ``params["qualname"]`` of ``module`` from its own source minus the PR's hunk,
    in the module's globals (same imports, same decorators)."""
    import __future__
    import inspect
    import textwrap

    owner, attr, fn = _resolve(module, params["qualname"])
    source = textwrap.dedent(inspect.getsource(fn))
    new = reverted_source(params, source)
    flags = (
        __future__.annotations.compiler_flag
        if getattr(module, "annotations", None) is __future__.annotations
        else 0
    )
    code = compile(
        new,
        f"<{params['name']}: {module.__name__}.{params['qualname']}>",
        "exec",
        flags=flags,
        dont_inherit=True,
    )
    namespace: dict = {}
    exec(code, module.__dict__, namespace)
    setattr(owner, attr, namespace[attr])
    say(
        f"applied {params['name']} pid={os.getpid()} ({module.__name__}.{params['qualname']}: "
        + (
            f"{params['text'].strip()!r} -> {params['replacement'].strip()!r})"
            if params.get("replacement")
            else f"{len(source.splitlines()) - len(new.splitlines())} lines removed)"
        )
    )


def trace_calls(params: dict, module) -> None:
    """Patch: one ``event`` line per call of ``params["qualname"]``, with the named arguments."""
    import functools
    import inspect

    owner, attr, fn = _resolve(module, params["qualname"])
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        bound = sig.bind_partial(*a, **kw)
        shown = " ".join(f"{k}={bound.arguments.get(k)}" for k in params.get("args", ()))
        if "self" in bound.arguments:  # which object (two managers per rank, say)
            shown += f" obj={id(bound.arguments['self']):x}"
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            say(f"event {params['event']} pid={os.getpid()} {shown} "
                 f"seconds={time.perf_counter() - t0:.6f}")

    setattr(owner, attr, wrapper)
    say(
        f"applied {params['name']} pid={os.getpid()} ({module.__name__}.{params['qualname']}: "
        f"traced)"
    )


# -- starting and stopping -------------------------------------------------------------------------
@dataclass
class Exit:
    returncode: Optional[int]
    timed_out: bool
    seconds: float
    leftovers: list = field(default_factory=list)  # "pid name" of processes found after the exit
    survivors: list = field(default_factory=list)  # those still alive after SIGKILL
    pid: int = 0  # the started process, leader of its group


def launch(
    argv: list[str],
    *,
    log: Path,
    timeout: float,
    env: Optional[dict] = None,
    cwd: Optional[Path] = None,
    marker: str = "",
    on_line: Optional[Callable[[str], None]] = None,
) -> Exit:
    """Start ``argv`` in its own session with stdout and stderr streamed to ``log``; stop its whole
    group at ``timeout``; after any exit, stop whatever of the group (or carrying ``marker``) is
    left. ``on_line`` sees each new log line (progress)."""
    t0 = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with procs.Guard() as guard:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        guard.watch(proc.pid, marker)
        timed_out, pending, cut = False, b"", None
        try:
            with open(log, "rb") as reader:
                while True:
                    code = proc.poll()
                    pending += reader.read()
                    *done, pending = pending.split(b"\n")
                    if on_line is not None:
                        for line in done:
                            on_line(line.decode(errors="replace"))
                    if code is not None:
                        if pending and on_line is not None:
                            on_line(pending.decode(errors="replace"))
                        break
                    if time.monotonic() - t0 > timeout:
                        timed_out = True
                        break
                    time.sleep(0.2)
        except BaseException as exc:  # interrupted, terminated, or a failing on_line
            cut = exc
            raise
        finally:
            stopped = procs.stop(proc.pid, marker=marker, grace=KILL_GRACE_S)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            if cut is not None:
                print(
                    f"[sglab] {type(cut).__name__}: "
                    + (stopped.line(f"engine group {proc.pid}") or "the engine had exited"),
                    file=sys.stderr,
                    flush=True,
                )
    leftovers = [p for p in stopped.found if not p.startswith(f"{proc.pid} ")]
    return Exit(
        None if timed_out else proc.returncode,
        timed_out,
        time.monotonic() - t0,
        leftovers,
        stopped.survivors,
        proc.pid,
    )


# -- reading the log -------------------------------------------------------------------------------
# The exact strings, with the file of each release (0.5.11, 0.5.12.post1, 0.5.13) that writes them.
LOG_STRINGS = {
    "pcg_disabled": (
        "srt/model_executor/model_runner.py",
        r"Disable piecewise CUDA graph because (?P<reason>.+?)\s*$",
    ),
    "pcg_begin": (
        "srt/model_executor/model_runner.py",
        r"Capture piecewise CUDA graph begin\. avail mem=(?P<mem>[\d.]+) GB",
    ),
    "pcg_end": (
        "srt/model_executor/model_runner.py",
        r"Capture piecewise CUDA graph end\. Time elapsed: (?P<s>[\d.]+) s\. mem "
        r"usage=(?P<mem>[\d.]+) GB",
    ),
    "pcg_tokens": (
        "srt/model_executor/piecewise_cuda_graph_runner.py",
        r"Capture cuda graph num tokens \[(?P<tokens>[\d,\s]*)\]",
    ),
    "bcg_tokens": (
        "srt/model_executor/breakable_cuda_graph_runner.py",
        r"\[BCG\] Capture num tokens: \[(?P<tokens>[\d,\s]*)\]",
    ),
    "bcg_eager": (
        "srt/model_executor/breakable_cuda_graph_runner.py (0.5.12+)",
        r"\[BCG\] Could not resolve inner layer_model on (?P<cls>\S+)\. BCG is disabled for this "
        r"model; prefill will fall back to eager\.",
    ),
    "decode_bs": (
        "srt/model_executor/cuda_graph_runner.py",
        r"Capture cuda graph bs \[(?P<bs>[\d,\s]*)\]",
    ),
    "decode_begin": (
        "srt/model_executor/model_runner.py",
        r"Capture cuda graph begin\. This can take up to several minutes\.",
    ),
    "decode_end": (
        "srt/model_executor/model_runner.py",
        r"Capture cuda graph end\. Time elapsed: (?P<s>[\d.]+) s\. mem usage=(?P<mem>[\d.]+) GB",
    ),
    "attn_default": (
        "srt/server_args.py",
        r"Attention backend not specified\. Use (?P<backend>\S+) backend by default\.",
    ),
    "load_begin": (
        "srt/model_executor/model_runner.py",
        r"Load weight begin\. avail mem=(?P<mem>[\d.]+) GB",
    ),
    "max_tokens": ("bench_one_batch.py", r"max_total_num_tokens=(?P<n>\d+)"),
    "warmup": ("bench_one_batch.py", r"^Warmup \.\.\.$"),
    "benchmark": ("bench_one_batch.py", r"^Benchmark \.\.\.$"),
    "prefill": (
        "bench_one_batch.py",
        r"Prefill\. latency: (?P<s>[\d.]+) s, throughput: +(?P<tps>[\d.]+) token/s",
    ),
    "decode_step": (
        "bench_one_batch.py",
        r"Decode (?P<i>\d+)\. Batch size: (?P<bs>\d+), latency: (?P<s>[\d.]+) s",
    ),
    "decode_median": (
        "bench_one_batch.py",
        r"Decode\.  median latency: (?P<s>[\d.]+) s, median throughput: +(?P<tps>[\d.]+) token/s",
    ),
    "total": (
        "bench_one_batch.py",
        r"Total\. latency: +(?P<s>[\d.]+) s, throughput: +(?P<tps>[\d.]+) token/s",
    ),
    "skipping": (
        "bench_one_batch.py",
        r"skipping \((?P<bs>\d+), (?P<il>\d+), (?P<ol>\d+)\) due to max batch size limit",
    ),
    "trace_saved": (
        "bench_one_batch.py",
        r"torch profiler chrome trace (?:for (?P<stage>\w+) )?saved to (?P<path>\S+)",
    ),
    "prefill_batch": (
        "srt/observability/scheduler_metrics_mixin.py (0.5.11, 0.5.12.post1), "
        "srt/managers/scheduler_components/metrics_reporter.py (0.5.13)",
        r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<tokens>\d+), "
        r".*?(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False)",
    ),
    "decode_batch": (
        "same files as prefill_batch",
        r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), .*?(?:cuda|cpu|npu|musa) "
        r"graph: (?P<graph>True|False)",
    ),
    "argparse": (
        "argparse (bench_one_batch's and the Engine's parsers)",
        r"^\S+: error: (?P<msg>.+)$",
    ),
}
_RX = {k: re.compile(v[1]) for k, v in LOG_STRINGS.items()}
# Ours, printed inside the engine's processes (install_hooks, drive)
_OURS = re.compile(re.escape(MARK) + r" (?P<kind>\w[\w-]*) ?(?P<rest>.*)$")
# Messages SGLang raises to say "see above": the cause is an earlier traceback
WRAPPERS = (
    "Initialization failed. Please see the error messages above",
    "scheduler died during initialization",
    "is dead",
    "Child process unexpectedly failed",
)
_EXC = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))"
    r"(?::\s*(?P<msg>.*))?$"
)


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _kv(rest: str) -> dict:
    out = {}
    for k, v in re.findall(r"(\w+)=(\S+)", rest):
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def first_error(text: str) -> Optional[str]:
    """SGLang's own message in one line: the first exception that ends a traceback (``Type:
    message``), skipping the wrappers that only point back at it; else an argparse error; else None.
    """
    lines = text.splitlines()
    finals, in_tb = [], False
    for i, line in enumerate(lines):
        s = line.strip()
        if "Traceback (most recent call last):" in s:
            in_tb = True
            continue
        if in_tb:
            m = _EXC.match(s)
            if m and not line.startswith((" ", "\t")):
                msg = (m.group("msg") or "").strip()
                # an assertion's message may continue on the next lines; keep the first
                finals.append(f"{m.group('type')}: {msg}" if msg else m.group("type"))
                in_tb = False
    real = [f for f in finals if not any(w in f for w in WRAPPERS)]
    if real:
        return real[0][:400]
    for line in lines:
        m = _RX["argparse"].match(line.strip())
        if m:
            return f"error: {m.group('msg')}"[:400]
    return finals[0][:400] if finals else None


def read_log(text: str) -> dict:
    """The engine's decisions and measurements from its log (see :data:`LOG_STRINGS`)."""
    d: dict = {
        "pcg": "unknown",
        "pcg_reason": None,
        "pcg_tokens": None,
        "pcg_capture_s": None,
        "bcg_tokens": None,
        "bcg_eager": None,
        "decode_bs": None,
        "decode_capture_s": None,
        "attention_backend": None,
        "resolved": None,
        "max_total_num_tokens": None,
        "bench": [],
        "warmup": None,
        "prefill_batches": [],
        "decode_batches": [],
        "calls": [],
        "applied": [],
        "events": [],
        "hooks_failed": [],
        "gpu_memory": [],
        "excerpts": [],
        "traces": [],
    }
    phase, current, call = "start", None, None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _OURS.search(line)
        if m:
            kind, rest = m.group("kind"), m.group("rest")
            if kind == "resolved" and d["resolved"] is None:
                try:
                    d["resolved"] = json.loads(rest)
                except ValueError:
                    pass
            elif kind == "applied":
                d["applied"].append(rest)
                d["excerpts"].append(line)
            elif kind == "event":
                d["events"].append({"event": rest.split()[0], **_kv(rest)})
                if call is not None:
                    call.setdefault("events", 0)
                    call["events"] += 1
            elif kind == "hooks":
                d["hooks_failed"].append(rest)
            elif kind == "call-begin":
                call = {**_kv(rest), "prefill_batches": [], "events": 0}
            elif kind == "call":
                if call is None:
                    call = {"prefill_batches": [], "events": 0}
                call.update(_kv(rest))
                d["calls"].append(call)
                call = None
            elif kind == "gpu-memory":
                d["gpu_memory"].append(_kv(rest))
            continue
        for key in (
            "pcg_disabled",
            "pcg_begin",
            "pcg_end",
            "pcg_tokens",
            "bcg_tokens",
            "bcg_eager",
            "decode_bs",
            "decode_end",
            "attn_default",
            "max_tokens",
        ):
            m = _RX[key].search(line)
            if not m:
                continue
            if key == "pcg_disabled":
                d["pcg"], d["pcg_reason"] = "disabled", m.group("reason")
            elif key == "pcg_begin":
                d["pcg"] = "capturing"
            elif key == "pcg_end":
                d["pcg"], d["pcg_capture_s"] = "captured", float(m.group("s"))
            elif key == "pcg_tokens":
                d["pcg_tokens"] = _ints(m.group("tokens"))
            elif key == "bcg_tokens":
                d["bcg_tokens"] = _ints(m.group("tokens"))
            elif key == "bcg_eager":
                d["bcg_eager"] = m.group("cls")
            elif key == "decode_bs":
                d["decode_bs"] = _ints(m.group("bs"))
            elif key == "decode_end":
                d["decode_capture_s"] = float(m.group("s"))
            elif key == "attn_default":
                d["attention_backend"] = m.group("backend")
            elif key == "max_tokens":
                d["max_total_num_tokens"] = int(m.group("n"))
            if key != "max_tokens":
                d["excerpts"].append(_strip_prefix(line))
        if _RX["warmup"].search(line.strip()):
            phase = "warmup"
        elif _RX["benchmark"].search(line.strip()):
            phase = "benchmark"
        m = _RX["skipping"].search(line)
        if m and phase == "benchmark":
            d["bench"].append(
                {
                    "skipped": True,
                    "batch_size": int(m.group("bs")),
                    "input_len": int(m.group("il")),
                    "output_len": int(m.group("ol")),
                }
            )
        m = _RX["prefill"].search(line)
        if m:
            current = {
                "prefill_latency": float(m.group("s")),
                "prefill_throughput": float(m.group("tps")),
                "decode_latencies": [],
            }
            if phase == "benchmark":
                d["bench"].append(current)
            else:
                d["warmup"] = current
        m = _RX["decode_step"].search(line)
        if m and current is not None:
            current["decode_latencies"].append(float(m.group("s")))
        m = _RX["decode_median"].search(line)
        if m and current is not None:
            current["median_decode_latency"] = float(m.group("s"))
        m = _RX["trace_saved"].search(line)
        if m:
            d["traces"].append(m.group("path"))
        m = _RX["prefill_batch"].search(line)
        if m:
            batch = {
                "seqs": int(m.group("seqs")),
                "tokens": int(m.group("tokens")),
                "graph": m.group("graph") == "True",
            }
            d["prefill_batches"].append(batch)
            if call is not None:
                call["prefill_batches"].append(batch)
        m = _RX["decode_batch"].search(line)
        if m:
            d["decode_batches"].append(
                {"running": int(m.group("running")), "graph": m.group("graph") == "True"}
            )
    if d["resolved"]:
        r = d["resolved"]
        d["attention_backend"] = d["attention_backend"] or r.get("attention_backend")
        if d["pcg"] == "unknown" and r.get("disable_piecewise_cuda_graph"):
            d["pcg"] = "disabled"
    if d["pcg"] == "disabled" and d["pcg_reason"] == "--disable-piecewise-cuda-graph is set":
        d["pcg_reason"] += " (by the flag or by ServerArgs' auto-disable rules)"
    d["bcg"] = (
        "eager fallback"
        if d["bcg_eager"]
        else "captured"
        if d["bcg_tokens"] is not None
        else "not used"
    )
    return d


def _strip_prefix(line: str) -> str:
    """A log line without SGLang's ``[time TP0] `` prefix."""
    return re.sub(r"^\[[^\]]*\]\s*", "", line)


def bench_results(d: dict, spec: EngineSpec, result_file: Optional[Path] = None) -> list[dict]:
    """One dict per benchmark run, in ``bench_one_batch``'s order (product of batch sizes, input
    lengths as passed, output length): its jsonl file where it wrote one, else the log's lines.
    The first ``spec.warmup`` runs of each shape are marked ``warmup`` (untimed sweeps)."""
    order = [
        (bs, il, spec.output_len)
        for bs in spec.batch_sizes
        for il in [n for _ in range(spec.warmup + spec.repeats) for n in spec.input_lens]
    ]
    if result_file is not None and result_file.is_file():
        rows = [json.loads(ln) for ln in result_file.read_text().splitlines() if ln.strip()]
        if rows:
            return _mark_warmup(rows, spec.warmup)
    out = []
    skipped = {
        (b["batch_size"], b["input_len"], b["output_len"]) for b in d["bench"] if b.get("skipped")
    }
    runs = [b for b in d["bench"] if not b.get("skipped")]
    printed = iter(runs)
    for bs, il, ol in order:
        if (bs, il, ol) in skipped:
            continue
        got = next(printed, None)
        if got is None:
            break
        out.append(
            {
                "batch_size": bs,
                "input_len": il,
                "output_len": ol,
                **{k: v for k, v in got.items() if k != "decode_latencies"},
            }
        )
    return _mark_warmup(out, spec.warmup)


def _mark_warmup(results: list[dict], warmup: int) -> list[dict]:
    seen: dict[tuple, int] = {}
    for r in results:
        shape = (r.get("batch_size"), r.get("input_len"), r.get("output_len"))
        seen[shape] = seen.get(shape, 0) + 1
        r["warmup"] = seen[shape] <= warmup
    return results


# -- the profiler's traces -------------------------------------------------------------------------
def read_trace(path: Path) -> dict:
    import gzip

    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def graph_replays(trace: dict) -> list[list[str]]:
    """Kernels of each CUDA-graph launch in a torch.profiler chrome trace: the kernel events whose
    ``correlation`` is that of a ``cudaGraphLaunch`` (runtime or driver) event, in launch order."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    launches, kernels = [], {}
    for ev in events:
        cat, name = str(ev.get("cat", "")).lower(), str(ev.get("name", ""))
        corr = (ev.get("args") or {}).get("correlation")
        if corr is None:
            continue
        if cat in ("cuda_runtime", "cuda_driver", "runtime") and re.match(
            r"cu(da)?GraphLaunch", name
        ):
            launches.append((float(ev.get("ts", 0)), corr))
        elif cat == "kernel":
            kernels.setdefault(corr, []).append((float(ev.get("ts", 0)), name))
    return [[n for _, n in sorted(kernels.get(corr, []))] for _, corr in sorted(launches)]


def decode_kernels(trace_path: Path, layers: int, steps: int) -> dict:
    """Kernels per decode-graph replay and per layer from ``bench_one_batch --profile``'s decode
    trace, and a table of kernel names with their count per replay. ``steps``: decode steps the
    trace covers."""
    replays = graph_replays(read_trace(trace_path))
    counts = [len(r) for r in replays]
    table: dict[str, float] = {}
    for r in replays:
        for name in r:
            table[name] = table.get(name, 0) + 1
    n = max(1, len(replays))
    per_replay = statistics.median(counts) if counts else 0
    return {
        "replays": len(replays),
        "replays_per_step": len(replays) / max(1, steps),
        "kernels_per_replay": per_replay,
        "kernels_per_replay_min": min(counts, default=0),
        "kernels_per_replay_max": max(counts, default=0),
        "kernels_per_layer": per_replay / layers if layers else None,
        "table": sorted(((k, v / n) for k, v in table.items()), key=lambda kv: (-kv[1], kv[0])),
    }


# -- one run ---------------------------------------------------------------------------------------
@dataclass
class EngineResult:
    spec: EngineSpec
    status: str  # ok | error | timeout | not-started
    error: str = ""
    log: Optional[Path] = None
    seconds: float = 0.0
    decisions: dict = field(default_factory=dict)
    bench: list = field(default_factory=list)
    kernels: Optional[dict] = None
    leftovers: list = field(default_factory=list)
    command: list = field(default_factory=list)
    sglang_command: list = field(default_factory=list)
    server_argv: list = field(default_factory=list)
    pins: dict = field(default_factory=dict)
    found: dict = field(default_factory=dict)
    tail: list = field(default_factory=list)
    marker: str = ""  # SGLAB_ENGINE_RUN of the engine's processes

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def line(self) -> str:
        head = f"sglang {self.spec.variant}"
        if self.ok:
            return f"{head}: ok in {self.seconds:.0f} s"
        return f"{head}: {self.error}"


PROGRESS = (
    ("load_begin", "loading dummy weights"),
    ("decode_begin", "capturing decode CUDA graphs"),
    ("pcg_begin", "capturing piecewise CUDA graphs"),
    ("warmup", "warm-up run"),
    ("benchmark", "benchmark runs"),
)


def _progress(echo: Callable[[str], None], spec: EngineSpec) -> Callable[[str], None]:
    seen: set[str] = set()
    t0 = time.monotonic()

    def on_line(line: str) -> None:
        for key, what in PROGRESS:
            if key not in seen and _RX[key].search(line.strip()):
                seen.add(key)
                echo(f"[sglab] sglang {spec.variant}: {what} ({time.monotonic() - t0:.0f} s)")
        m = _RX["prefill"].search(line)
        if m and "benchmark" in seen:
            echo(f"[sglab] sglang {spec.variant}: prefill {float(m.group('s')) * 1e3:.2f} ms")
        m = _OURS.search(line)
        if m and m.group("kind") == "call":
            kv = _kv(m.group("rest"))
            echo(
                f"[sglab] sglang {spec.variant}: {kv.get('requests')} requests x "
                f"{kv.get('input_len')} tokens: {float(kv.get('seconds', 0)) * 1e3:.1f} ms"
            )
        if m and m.group("kind") == "hooks":
            echo(f"[sglab] sglang {spec.variant}: {line.strip()}")

    return on_line


def _tail(text: str, n: int = 12) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()][-n:]


def run(
    spec: EngineSpec,
    *,
    work: Optional[Path] = None,
    echo: Callable[[str], None] = print,
    check: bool = True,
) -> EngineResult:
    """Run one engine (see the module docstring). Raises :class:`EngineError` for what stops it
    before it starts (release missing, pin mismatch, flags the release does not define, a bad
    config); everything after the start comes back as the result's status and one-line error."""
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix=f"sglab-engine-{spec.release}-"))
    prep = prepare(spec, work, check=check)
    log = work / "engine.log"
    echo(
        f"[sglab] sglang {spec.variant}: starting "
        f"{'bench_one_batch' if spec.tool == 'bench' else 'Engine'} (timeout {spec.timeout:.0f} s; "
        f"log {log})"
    )
    ex = launch(
        prep.argv,
        log=log,
        timeout=spec.timeout,
        env=prep.environ,
        cwd=work,
        marker=prep.marker,
        on_line=_progress(echo, spec),
    )
    text = log.read_text(errors="replace")
    d = read_log(text)
    res = EngineResult(
        spec,
        "ok",
        log=log,
        seconds=ex.seconds,
        decisions=d,
        command=prep.argv,
        sglang_command=prep.sglang_command,
        server_argv=prep.server_argv,
        pins=prep.pins,
        found=prep.found,
        leftovers=ex.leftovers + [f"{p} (survived SIGKILL)" for p in ex.survivors],
        tail=_tail(text),
        marker=prep.marker,
    )
    if spec.tool == "bench":
        res.bench = bench_results(d, spec, work / "result.jsonl")
    if ex.timed_out:
        res.status = "timeout"
        res.error = (
            f"no exit in {spec.timeout:.0f} s: stopped with its whole process group; last lines: "
            + " | ".join(res.tail[-3:])
        )
    elif ex.returncode != 0:
        res.status = "error"
        msg = first_error(text) or f"exited with status {ex.returncode}"
        res.error = f"{msg} (log: {log})"
    elif d["hooks_failed"]:
        res.status, res.error = (
            "error",
            f"harness hooks failed: {d['hooks_failed'][0]} (log: {log})",
        )
    else:
        missing = [
            a.name
            for a in spec.adjustments
            if a.patch and not any(a.name in x for x in d["applied"])
        ]
        if missing:
            res.status, res.error = (
                "error",
                f"adjustment {', '.join(missing)} was never applied (log: {log})",
            )
        elif spec.tool == "bench" and not res.bench:
            res.status, res.error = "error", f"bench_one_batch printed no result (log: {log})"
    if res.leftovers:
        echo(
            f"[sglab] sglang {spec.variant}: {len(res.leftovers)} process(es) of the engine were "
            f"left after it exited and were killed: {', '.join(res.leftovers)}"
        )
    if spec.profile and res.ok:
        traces = sorted((work / "profile").glob("*decode*.trace.json*"))
        if traces:
            layers = int(text_config(load_config(spec.model)).get("num_hidden_layers") or 0)
            res.kernels = decode_kernels(traces[-1], layers, spec.profile_steps)
            res.kernels["trace"] = str(traces[-1])
        else:
            res.status = "error"
            res.error = f"bench_one_batch wrote no decode trace in {work / 'profile'} (log: {log})"
    return res


# -- rows and the record ---------------------------------------------------------------------------
def _spread(xs: list[float]) -> dict:
    xs = sorted(xs)
    # inclusive quartiles: with 5 repeats the exclusive method extrapolates past the 4th value, so
    # one slow repeat alone would set the IQR
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [xs[0]] * 3
    return {
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "iqr": q[2] - q[0],
        "n": len(xs),
    }


def rows(res: EngineResult) -> list[dict]:
    """Tidy rows of one run: variant (release or release+case), tool and shape columns, metric,
    value, unit."""
    s, d = res.spec, res.decisions
    base = {"variant": s.variant, "release": s.release, "case": s.case, "tool": s.tool}
    out = [
        {
            **base,
            "metric": "status",
            "value": res.status if res.ok else f"{res.status}: {res.error}",
            "unit": "",
        }
    ]
    if not d:
        return out

    def add(metric, value, unit="", **cols):
        if value is not None:
            out.append({**base, **cols, "metric": metric, "value": value, "unit": unit})

    add("pcg", d.get("pcg"))
    add("pcg_reason", d.get("pcg_reason"))
    add(
        "pcg_tokens", " ".join(map(str, d["pcg_tokens"])) if d.get("pcg_tokens") else None, "tokens"
    )
    add("pcg_capture", d.get("pcg_capture_s"), "s")
    add("bcg", d.get("bcg"))
    add(
        "bcg_tokens", " ".join(map(str, d["bcg_tokens"])) if d.get("bcg_tokens") else None, "tokens"
    )
    add(
        "decode_graph_bs",
        " ".join(map(str, d["decode_bs"])) if d.get("decode_bs") else None,
        "requests",
    )
    add("decode_capture", d.get("decode_capture_s"), "s")
    add("attention_backend", d.get("attention_backend"))
    groups: dict[tuple, list] = {}
    for b in res.bench:
        if b.get("skipped") or b.get("warmup"):
            continue
        groups.setdefault((b["batch_size"], b["input_len"], b["output_len"]), []).append(b)
    for (bs, il, ol), runs_ in sorted(groups.items()):
        cols = {"batch_size": bs, "input_len": il, "output_len": ol}
        pre = _spread([r["prefill_latency"] * 1e3 for r in runs_])
        for k in ("median", "min", "max", "iqr"):
            add("prefill" if k == "median" else f"prefill_{k}", round(pre[k], 4), "ms", **cols)
        add(
            "prefill_throughput",
            round(statistics.median(r["prefill_throughput"] for r in runs_), 1),
            "token/s",
            **cols,
        )
        dec = [
            r["median_decode_latency"] * 1e3
            for r in runs_
            if r.get("median_decode_latency") is not None
        ]
        if dec:
            dsp = _spread(dec)
            for k in ("median", "min", "max"):
                add("decode" if k == "median" else f"decode_{k}", round(dsp[k], 4), "ms", **cols)
        add("repeats", pre["n"], "runs", **cols)
    calls: dict[tuple, list] = {}
    for c in d.get("calls", []):
        if c.get("warmup"):
            continue
        calls.setdefault((c.get("requests"), c.get("input_len"), c.get("output_len")), []).append(c)
    for (n, il, ol), cs in sorted(calls.items(), key=lambda kv: tuple(x or 0 for x in kv[0])):
        cols = {"requests": n, "input_len": il, "output_len": ol}
        lat = _spread([float(c["seconds"]) * 1e3 for c in cs])
        for k in ("median", "min", "max", "iqr"):
            add("latency" if k == "median" else f"latency_{k}", round(lat[k], 4), "ms", **cols)
        batches = [b for c in cs for b in c["prefill_batches"]]
        add("prefill_batches", round(len(batches) / len(cs), 3), "per call", **cols)
        if batches:
            add(
                "prefill_graph",
                round(sum(b["graph"] for b in batches) / len(batches), 3),
                "fraction",
                **cols,
            )
            add(
                "prefill_seqs",
                statistics.median(b["seqs"] for b in batches),
                "requests per batch",
                **cols,
            )
        if any(c.get("events") for c in cs):
            add(
                "events",
                round(statistics.mean(c.get("events", 0) for c in cs), 3),
                "per call",
                **cols,
            )
        add("repeats", len(cs), "calls", **cols)
    by_rank: dict[tuple, list] = {}
    for e in d.get("events", []):
        by_rank.setdefault((e["event"], e.get("rank", e.get("pid"))), []).append(e)
    for (ev, rank), es in sorted(by_rank.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        # every call of the traced function in this rank's processes, start-up included
        cols = {"rank": rank}
        add(f"{ev}_count", len(es), "calls", **cols)
        add(f"{ev}_objects", len({e.get("obj") for e in es}), "objects", **cols)
        sizes = sorted({e["max_token_num"] for e in es if e.get("max_token_num") is not None})
        add(f"{ev}_max_token_num", " ".join(map(str, sizes)) or None, "tokens", **cols)
        secs = [float(e["seconds"]) * 1e3 for e in es if e.get("seconds") is not None]
        if secs:
            sp = _spread(secs)
            for k in ("median", "min", "max"):
                add(f"{ev}_ms" if k == "median" else f"{ev}_ms_{k}", round(sp[k], 3), "ms",
                    **cols)
    for m in d.get("gpu_memory", []):
        add("gpu_memory", m.get("mib"), "MiB", gpu=m.get("gpu"), process=m.get("name"))
    if res.kernels:
        k = res.kernels
        add("decode_replays_per_step", k["replays_per_step"], "replays")
        add("decode_kernels_per_replay", k["kernels_per_replay"], "kernels")
        add("decode_kernels_per_layer", k["kernels_per_layer"], "kernels")
    if res.leftovers:
        add("leftover_processes", len(res.leftovers), "processes")
    return out


def model_record(path: Path) -> dict:
    path = Path(path)
    cfg = load_config(path)
    try:
        shown = str(path.resolve().relative_to(_repo()))
    except ValueError:
        shown = str(path)
    return {
        "path": shown,
        "name": path.parent.name,
        "sha256_16": config_digest(path),
        "config": cfg,
    }


def manifest_extra(results: list[EngineResult]) -> dict:
    """What the manifest carries besides the machine: per run the release, the versions found in its
    environment, the flags, the model config, every harness adjustment with its reason, and the log
    lines that carry the engine's decisions."""
    out = []
    for r in results:
        s = r.spec
        out.append(
            {
                "variant": s.variant,
                "release": s.release,
                "case": s.case,
                "tool": s.tool,
                "status": r.status,
                "error": r.error,
                "versions": {"sglang": s.release, **r.found},
                "pins": {
                    k: r.pins.get(k)
                    for k in ("torch", "sglang-kernel", "flashinfer-python", "transformers")
                },
                "server_args": list(s.server_args),
                "server_argv": r.server_argv,
                "command": shlex.join(r.sglang_command),
                "model": model_record(s.model),
                "adjustments": [{"name": a.name, "reason": a.reason} for a in s.adjustments],
                "applied": r.decisions.get("applied", []),
                "resolved": r.decisions.get("resolved"),
                "excerpts": r.decisions.get("excerpts", [])[:40],
                "leftovers": r.leftovers,
                "seconds": round(r.seconds, 1),
                "log_tail": r.tail if not r.ok else [],
            }
        )
    return {
        "engine_runs": out,
        "releases": sorted({r.spec.release for r in results}, key=parse_version),
    }


def record(
    results: list[EngineResult],
    fix: str,
    *,
    params: Optional[dict] = None,
    root: Optional[Path] = None,
    gpu_count: Optional[int] = None,
) -> Path:
    """One run ``engine_<fix>`` of these results (:func:`sglab.core.runs.write_run`, atomic: nothing
    half written). Sidecars: each run's log (gzipped) and, for profiled runs, the decode kernel
    table."""
    import gzip
    import shutil

    import pandas as pd

    from sglab.core.runs import tidy, write_run

    experiment = f"engine_{fix}"
    frame = tidy(experiment, [row for r in results for row in rows(r)])
    sidecars = {}
    with tempfile.TemporaryDirectory(prefix="sglab-engine-record-") as tmp:
        for i, r in enumerate(results):
            if r.log is not None and r.log.is_file():
                gz = Path(tmp) / f"log{i}.log.gz"
                with open(r.log, "rb") as src, gzip.GzipFile(gz, "wb", mtime=0) as dst:
                    shutil.copyfileobj(src, dst)
                sidecars[f"log_{i}"] = gz
            if r.kernels and r.kernels.get("table"):
                sidecars[f"kernels_{i}"] = pd.DataFrame(
                    [
                        {"variant": r.spec.variant, "kernel": k, "per_replay": v}
                        for k, v in r.kernels["table"]
                    ]
                )
        tp = max((r.spec.tp_size for r in results), default=1)
        return write_run(
            frame,
            experiment=experiment,
            method_version=METHOD_VERSION,
            params=params or {"specs": [_spec_params(r.spec) for r in results]},
            root=root,
            gpu_count=gpu_count if gpu_count is not None else tp,
            extra=manifest_extra(results),
            sidecars=sidecars,
        )


def _spec_params(s: EngineSpec) -> dict:
    d = asdict(s)
    d["model"] = Path(s.model).parent.name
    d["adjustments"] = [a.name for a in s.adjustments]
    if s.tool == "bench":
        d["warmup_sweeps"] = s.warmup  # untimed sweeps of every input length
    return d


# -- what a reader sees ----------------------------------------------------------------------------
def summary(res: EngineResult) -> list[str]:
    s, d = res.spec, res.decisions
    out = [
        f"sglang {s.variant} · {'bench_one_batch' if s.tool == 'bench' else 'Engine'} · "
        f"{Path(s.model).parent.name} · {res.status}" + (f" · {res.error}" if not res.ok else "")
    ]
    if not res.ok and res.tail:
        out += [f"  | {line}" for line in res.tail[-4:]]
    if not d or (d.get("pcg") == "unknown" and d.get("decode_bs") is None and not res.ok):
        return out
    pcg = d.get("pcg")
    if pcg == "captured":
        out.append(
            f"  piecewise CUDA graph: captured for tokens {d.get('pcg_tokens')} in "
            f"{d.get('pcg_capture_s')} s"
        )
    else:
        out.append(
            f"  piecewise CUDA graph: {pcg}"
            + (f" ({d['pcg_reason']})" if d.get("pcg_reason") else "")
        )
    if d.get("bcg") != "not used":
        out.append(
            f"  breakable CUDA graph: {d['bcg']}"
            + (f" for tokens {d['bcg_tokens']}" if d.get("bcg_tokens") else "")
        )
    out.append(f"  decode CUDA graph batch sizes: {d.get('decode_bs')}")
    out.append(f"  attention backend: {d.get('attention_backend')}")
    for a in s.adjustments:
        out.append(f"  harness adjustment {a.name}: {a.reason}")
    bench = [r for r in rows(res) if r["metric"] in ("prefill", "prefill_iqr", "decode")]
    by = {(x["metric"], x.get("batch_size"), x.get("input_len")): x["value"] for x in bench}
    for r in bench:
        if r["metric"] == "prefill":
            iqr = by.get(("prefill_iqr", r.get("batch_size"), r.get("input_len")))
            dec = by.get(("decode", r.get("batch_size"), r.get("input_len")))
            out.append(
                f"  batch {r['batch_size']} x {r['input_len']} tokens: prefill {r['value']:.2f} ms"
                + (f" (IQR {iqr:.2f})" if iqr is not None else "")
                + (f", decode {dec:.2f} ms/step" if dec is not None else "")
            )
    for r in rows(res):
        if r["metric"] == "latency":
            out.append(f"  {r['requests']} requests x {r['input_len']} tokens: {r['value']:.2f} ms")
        elif r["metric"] == "prefill_graph":
            out.append(f"    prefill batches on the graph: {r['value']:.0%}")
    if res.kernels:
        k = res.kernels
        out.append(
            f"  decode graph replay: {k['kernels_per_replay']} kernels "
            f"({k['kernels_per_layer']:.2f} per layer), {k['replays_per_step']:.1f} replays per "
            f"step"
        )
    if res.leftovers:
        out.append(f"  left behind and killed: {', '.join(res.leftovers)}")
    return out


# -- the Engine driver (inside the release's process) ----------------------------------------------
def _ids(rng, n: int) -> list[int]:
    return [rng.randrange(4, VOCAB) for _ in range(n)]


def _gpu_memory() -> None:
    """One line per (process, GPU) that NVML reports: the memory each process holds on each GPU,
    named by its process title (``sglang::scheduler_TP1``)."""
    import psutil

    from sglab.core import memory

    try:
        rows = memory.all_processes()
    except Exception as exc:  # noqa: BLE001 - no NVML here: say so in the log
        say(f"gpu-memory-error {type(exc).__name__}: {exc}")
        return
    for r in rows:
        try:
            name = psutil.Process(r["pid"]).name()
        except psutil.Error:
            name = "?"
        say(f"gpu-memory pid={r['pid']} gpu={r['gpu']} mib={r['used_mib']:.0f} "
            f"name={name.replace(' ', '_')}")


def drive(params_path: str) -> int:
    """The ``engine`` tool inside the release's process: parse the server arguments with the
    release's own ``ServerArgs`` parser, start ``sglang.Engine``, send each (requests x input
    length) ``repeats`` times as one ``generate`` call (distinct random token ids: no prefix-cache
    hits), print one line per call, shut down."""
    import argparse
    import random

    p = json.loads(Path(params_path).read_text())
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.Engine")
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(p["server_argv"]))
    engine = sglang.Engine(server_args=server_args)
    rng = random.Random(0)
    image = None
    if p.get("image_size"):
        from PIL import Image

        image = Image.new("RGB", tuple(p["image_size"]), (120, 80, 40))
    try:
        k = 0
        for il in p["input_lens"]:
            for n in p["requests"]:
                for r in range(p["warmup"] + p["repeats"]):
                    warm = int(r < p["warmup"])
                    say(f"call-begin id={k} requests={n} input_len={il} warmup={warm}")
                    kwargs = {
                        "sampling_params": {
                            "max_new_tokens": p["output_len"],
                            "ignore_eos": True,
                            "temperature": 0.0,
                        },
                    }
                    if image is not None:  # text through the model's processor, with the image
                        kwargs["prompt"] = [p["prompt"]] * n
                        kwargs["image_data"] = [image] * n
                    else:
                        kwargs["input_ids"] = [_ids(rng, il) for _ in range(n)]
                    t0 = time.perf_counter()
                    engine.generate(**kwargs)
                    dt = time.perf_counter() - t0
                    say(
                        f"call id={k} requests={n} input_len={il} output_len={p['output_len']} "
                        f"warmup={warm} seconds={dt:.6f}"
                    )
                    k += 1
        if image is not None:
            _gpu_memory()
    finally:
        engine.shutdown()
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "drive":
        return drive(argv[1])
    print(
        "usage: python -m sglab.sglang.engine drive PARAMS.json (the engine tool's driver)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
