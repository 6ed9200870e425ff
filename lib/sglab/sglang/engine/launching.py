"""Launching and stopping one engine. :func:`prepare` decides the whole launch before anything
starts; :func:`launch` starts it in its own process group, streams its log, and stops the whole
group (:mod:`sglab.core.procs`) at the timeout, on its exit, and however the harness itself ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from sglab.core import procs
from sglab.sglang.engine.driver import launch_server_argv
from sglab.sglang.engine.hooks import SITECUSTOMIZE, patch_params
from sglab.sglang.engine.model import prepare_model
from sglab.sglang.engine.release import (ReleaseEnv, check_flags, check_pins, found_versions,
                                         locate, release_flags, release_pins)
from sglab.sglang.engine.spec import (DEFAULT_ARGS, ENGINE_ONLY_ARGS, SERVE_ONLY_ARGS, MODEL_NEEDS,
                                      EngineError, EngineSpec, adjustment, flag_names, lib_dir,
                                      read_config)


KILL_GRACE_S = 10.0  # between SIGTERM and SIGKILL when an engine is stopped


@dataclass
class Prepared:
    """Everything a launch needs, decided before anything starts."""

    env: ReleaseEnv
    model_dir: Path
    argv: list[str]  # what is started
    # the release's own command line (bench), or "sglang.Engine" and its server arguments
    sglang_command: list[str]
    server_argv: list[str]
    environ: dict
    pins: dict
    found: dict
    marker: str


def server_argv(spec: EngineSpec, model_dir: Path, flags: Optional[set[str]] = None) -> list[str]:
    """``--model-path``, the harness defaults the reader did not give, then the reader's flags."""
    given = set(flag_names(spec.server_args))
    out = ["--model-path", str(model_dir)]
    # an image goes through the model's processor: the Engine then needs its tokenizer
    engine_only = spec.tool == "engine" and not spec.image_size
    defaults = DEFAULT_ARGS + (ENGINE_ONLY_ARGS if engine_only else ())
    defaults += SERVE_ONLY_ARGS if spec.tool == "serve" else ()
    for flag, value in defaults:
        if flag in given or (flags is not None and flag not in flags):
            continue
        out += [flag] if value is None else [flag, value]
    return out + list(spec.server_args)


def bench_argv(spec: EngineSpec, work: Path) -> list[str]:
    """``bench_one_batch``'s own arguments."""
    lens = [str(n) for _ in range(spec.warmup + spec.repeats) for n in spec.input_lens]
    out = [
        "--batch-size", *map(str, spec.batch_sizes), "--input-len", *lens, "--output-len",
        f"{spec.output_len}", "--run-name", spec.variant, "--result-filename",
        f"{work / 'result.jsonl'}"
    ]
    if spec.profile:
        out += [
            "--profile", "--profile-stage", spec.profile_stage, "--profile-steps",
            f"{spec.profile_steps}", "--profile-filename-prefix", "profile"
        ]
    return out


# the server's loopback port (free ones are tried), below Linux's ephemeral range (32768 on), where
# a client's own port can never be the one it connects to
SERVE_PORT = 20000 + os.getpid() % 10000


def serve_params(spec: EngineSpec, server: list[str], model_dir: Path, work: Path) -> dict:
    """What :func:`~sglab.sglang.engine.driver.serve` reads: server arguments and passes."""
    passes = [{"input_len": il, "concurrency": c, "prompts": c * spec.prompts, "repeat": r}
              for r in range(spec.repeats) for il in spec.input_lens for c in spec.requests]
    return dict(server_argv=server, port=SERVE_PORT, tokenizer=str(model_dir),
                output_len=spec.output_len, warmup=spec.warmup, passes=passes,
                results=str(work / "serving.jsonl"), timeout=spec.timeout)


def with_model_needs(spec: EngineSpec, echo: Callable[[str], None] = print,
                     said: Optional[set] = None) -> EngineSpec:
    """``spec`` with the :data:`MODEL_NEEDS` it lacks, said once (``said``: named so far)."""
    need = MODEL_NEEDS.get(read_config(spec.model).architecture)
    if need is None or need[0] in {a.name for a in spec.adjustments}:
        return spec
    name, path, text = need
    source = locate(spec.release).package / path
    if source.is_file() and text in source.read_text():
        return spec
    a = adjustment(name)
    why = "; its reason above)" if said is not None and a.name in said else f"): {a.reason}"
    echo(f"[sglab] sglang {spec.variant}: harness adjustment {a.name} added (this model needs it "
         f"on this release with dummy weights{why}")
    if said is not None:
        said.add(a.name)
    return replace(spec, adjustments=spec.adjustments + (a,))


def prepare(spec: EngineSpec, work: Path, *, python: str = sys.executable,
            check: bool = True) -> Prepared:
    """Decide the whole launch (release, pins, flags, model, hooks, environment), start nothing."""
    read_config(spec.model)
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
    patches = [{"name": a.name, "patch": a.patch, "params": patch_params(a)}
               for a in spec.adjustments if a.patch]
    hooks.write_text(json.dumps({"patches": patches}, indent=1))
    if spec.tool == "bench":
        sglang_cmd = [python, "-m", "sglang.bench_one_batch", *server, *bench_argv(spec, work)]
        argv = list(sglang_cmd)
    else:
        serving = spec.tool == "serve"
        image = list(spec.image_size) if spec.image_size else None
        drive = dict(server_argv=server, requests=list(spec.requests),
                     input_lens=list(spec.input_lens), output_len=spec.output_len,
                     repeats=spec.repeats, warmup=spec.warmup, image_size=image, prompt=spec.prompt)
        p = serve_params(spec, server, model_dir, work) if serving else drive
        params = work / ("serve.json" if serving else "drive.json")
        params.write_text(json.dumps(p, indent=1))
        # the command the record names: the server's own, or the Engine the driver builds
        sglang_cmd = (launch_server_argv(python, server, p["port"])
                      if serving else ["sglang.Engine", *server])
        argv = [python, "-m", "sglab.sglang.engine.driver", params.stem, str(params)]
    argv = procs.pinned(argv, spec.cpus, python)
    marker = uuid.uuid4().hex
    environ = dict(os.environ)
    path = [hooks_dir, lib_dir(), *env.paths, *filter(None, [environ.get("PYTHONPATH")])]
    environ.update(PYTHONPATH=os.pathsep.join(map(str, path)), SGLAB_ENGINE_HOOKS=str(hooks),
                   SGLAB_ENGINE_RUN=marker, SGLANG_TORCH_PROFILER_DIR=str(work / "profile"),
                   PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1")
    environ.setdefault("NCCL_NVLS_ENABLE", "0")
    for a in spec.adjustments:
        environ.update({k: v.format(lib=lib_dir()) for k, v in a.env})
    return Prepared(env, model_dir, argv, sglang_cmd, server, environ, pins, found, marker)


@dataclass
class Exit:
    returncode: Optional[int]
    timed_out: bool
    seconds: float
    leftovers: list  # "pid name" of processes found after the exit
    survivors: list  # those still alive after SIGKILL
    pid: int  # the started process, leader of its group


def launch(argv: list[str], *, log: Path, timeout: float, env: Optional[dict] = None,
           cwd: Optional[Path] = None, marker: str = "",
           on_line: Optional[Callable[[str], None]] = None) -> Exit:
    """Start ``argv`` in its own session, its output to ``log``; stop its whole group at the end."""
    t0 = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with procs.Guard() as guard:
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True)
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
                said = stopped.line(f"engine group {proc.pid}") or "the engine had exited"
                print(f"[sglab] {type(cut).__name__}: {said}", file=sys.stderr, flush=True)
    leftovers = [p for p in stopped.found if not p.startswith(f"{proc.pid} ")]
    return Exit(None if timed_out else proc.returncode, timed_out,
                time.monotonic() - t0, leftovers, stopped.survivors, proc.pid)
