"""The ``engine`` and ``serve`` tools inside the release's environment. ``drive PARAMS.json``: the
release's own ``ServerArgs`` parser, ``sglang.Engine``, one line per generate call, each process's
GPU memory (NVML) after an image request. ``serve PARAMS.json``: the release's own server on the
loopback and its own ``bench_serving`` against it, one line per pass (TTFT, TPOT, E2E)."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import random
import runpy
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

from sglab.sglang.engine.hooks import say
from sglab.sglang.engine.spec import VOCAB


def drive(params_path: str) -> int:
    """The ``engine`` tool: ``sglang.Engine`` of the release's ``ServerArgs``, a line per call."""
    p = json.loads(Path(params_path).read_text())
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.Engine")
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(p["server_argv"]))
    engine = sglang.Engine(server_args=server_args)
    rng = random.Random(0)
    sampling = {"max_new_tokens": p["output_len"], "ignore_eos": True, "temperature": 0.0}
    image = None
    if p.get("image_size"):
        from PIL import Image

        image = Image.new("RGB", tuple(p["image_size"]), (120, 80, 40))
    calls = itertools.product(p["input_lens"], p["requests"], range(p["warmup"] + p["repeats"]))
    try:
        for k, (il, n, r) in enumerate(calls):
            warm = int(r < p["warmup"])
            say(f"call-begin id={k} requests={n} input_len={il} warmup={warm}")
            kwargs = {"sampling_params": sampling}
            if image is not None:  # text through the model's processor, with the image
                kwargs["prompt"] = [p["prompt"]] * n
                kwargs["image_data"] = [image] * n
            else:
                kwargs["input_ids"] = [
                    [rng.randrange(4, VOCAB) for _ in range(il)] for _ in range(n)
                ]
            t0 = time.perf_counter()
            engine.generate(**kwargs)
            dt = time.perf_counter() - t0
            say(f"call id={k} requests={n} input_len={il} output_len={p['output_len']} "
                f"warmup={warm} seconds={dt:.6f}")
        if image is not None:  # a line per (process, GPU) NVML reports: the memory it holds
            import psutil

            from sglab.core import memory

            try:
                rows = memory.all_processes()
            except Exception as exc:  # noqa: BLE001 - no NVML here: say so in the log
                say(f"gpu-memory-error {type(exc).__name__}: {exc}")
                rows = []
            for r in rows:
                try:
                    name = psutil.Process(r["pid"]).name()
                except psutil.Error:
                    name = "?"
                say(f"gpu-memory pid={r['pid']} gpu={r['gpu']} mib={r['used_mib']:.0f} "
                    f"name={name.replace(' ', '_')}")
    finally:
        engine.shutdown()
    return 0


# bench_serving's per-request lists (--output-details): read for the TTFT check, not kept
DETAILS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
SERVING_KEYS = ("completed", "duration", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "mean_itl_ms",
                "median_itl_ms", "total_input_tokens", "total_output_tokens")


def launch_server_argv(python: str, server_argv: list[str], port: int) -> list[str]:
    """The release's own server on the loopback at ``port``."""
    return [
        python, "-m", "sglang.launch_server", *server_argv, "--host", "127.0.0.1", "--port",
        f"{port}"
    ]


def _free_port(first: int) -> int:
    for port in range(first, first + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {first} on")


def _ready(url: str, server, deadline: float) -> None:
    """Wait until ``/health_generate`` answers 200 (any answer not HTTP: a loopback connect to
    itself); raise if the server exits or time runs out."""
    import http.client
    import urllib.error
    import urllib.request

    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode} before it "
                               "was ready")
        try:
            with urllib.request.urlopen(f"{url}/health_generate", timeout=30) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the server was not ready before the timeout")
        time.sleep(1.0)


def bench_serving_argv(p: dict, port: int, one: dict, seed: int, out: str) -> list[str]:
    """The release's own ``bench_serving`` for one pass of random ids."""
    opts = {
        "--backend": "sglang", "--host": "127.0.0.1", "--port": port, "--model": p["tokenizer"],
        "--tokenizer": p["tokenizer"], "--dataset-name": "random-ids",
        "--random-input-len": one["input_len"], "--random-output-len": p["output_len"],
        "--random-range-ratio": "1.0", "--num-prompts": one["prompts"],
        "--max-concurrency": one["concurrency"], "--request-rate": "inf", "--seed": seed,
        "--warmup-requests": 0, "--disable-tqdm": None, "--output-file": out,
        "--output-details": None
    }
    return [a for k, v in opts.items() for a in ([k] if v is None else [k, str(v)])]


def untimed(res: dict) -> str:
    """Why a ``bench_serving`` result has no TTFT for some request, in words; '' if none."""
    ttfts = res.get("ttfts") or []
    n = sum(1 for t in ttfts if not t)
    return (f"{n} of {len(ttfts)} requests have no TTFT (their generated tokens decoded to no "
            "text)") if n else ""


def _bench_serving(argv: list[str]) -> int:
    """``python -m sglang.bench_serving ARGV`` in this process; its exit status."""
    saved = sys.argv
    sys.argv = ["bench_serving", *argv]
    try:
        runpy.run_module("sglang.bench_serving", run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def serve(params_path: str) -> int:
    """The ``serve`` tool: the release's server, then ``bench_serving``, a line per pass."""
    p = json.loads(Path(params_path).read_text())
    port = _free_port(int(p["port"]))
    deadline = time.monotonic() + float(p["timeout"])
    say(f"serve-begin port={port}")
    if importlib.util.find_spec("datasets") is None:  # a stand-in for Hugging Face datasets

        def load_dataset(*args, **kwargs):
            raise RuntimeError("Hugging Face datasets is not installed (sglab's stand-in)")

        sys.modules["datasets"] = types.SimpleNamespace(load_dataset=load_dataset,
                                                        __name__="datasets", __spec__=None)
        say("applied datasets-stand-in: Hugging Face datasets is not installed; bench_serving "
            "imports it at module level and never calls it for random-ids prompts")
    server = subprocess.Popen(launch_server_argv(sys.executable, p["server_argv"], port),
                              stdin=subprocess.DEVNULL)
    out = Path(p["results"])
    try:
        # bench_serving's own imports while the server starts (about 7 s a start on an H200)
        importlib.import_module("sglang.bench_serving")
        sys.modules.pop("sglang.bench_serving")  # runpy runs it afresh, its imports cached
        _ready(f"http://127.0.0.1:{port}", server, deadline)
        say("serve-ready")
        top = max(x["concurrency"] for x in p["passes"])
        warm = [{"input_len": il, "concurrency": top, "prompts": top, "repeat": -1, "warmup": 1}
                for il in dict.fromkeys(x["input_len"] for x in p["passes"])]
        for k, one in enumerate(warm * int(p["warmup"]) + p["passes"]):
            tmp = out.with_suffix(f".{k}.jsonl")
            t0 = time.perf_counter()
            code = _bench_serving(bench_serving_argv(p, port, one, 1 + k, str(tmp)))
            if code != 0 or not tmp.is_file():
                raise RuntimeError(f"bench_serving exited with status {code}")
            if time.monotonic() > deadline:
                raise RuntimeError("the passes did not end before the timeout")
            res = json.loads(tmp.read_text().splitlines()[-1])
            if untimed(res):
                raise RuntimeError(f"bench_serving: {untimed(res)}")
            res = {k: v for k, v in res.items() if k not in DETAILS}
            with open(out, "a") as f:
                f.write(json.dumps({**one, **res}) + "\n")
            kv = " ".join(f"{key}={res.get(key)}" for key in SERVING_KEYS)
            say(f"serve input_len={one['input_len']} concurrency={one['concurrency']} "
                f"prompts={one['prompts']} repeat={one['repeat']} warmup={one.get('warmup', 0)} "
                f"output_len={p['output_len']} wall_s={time.perf_counter() - t0:.3f} {kv}")
    except Exception as exc:  # noqa: BLE001 - said in the log, the status says it failed
        say(f"serve-error {type(exc).__name__}: {exc}")
        return 1
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        # the harness stops the rest of the process group (scheduler, detokenizer) after the exit
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] in ("drive", "serve"):
        return (drive if argv[0] == "drive" else serve)(argv[1])
    print(
        "usage: python -m sglab.sglang.engine.driver drive|serve PARAMS.json (the engine and "
        "serve tools' driver)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
