"""The ``engine`` tool inside the release's process (``python -m sglab.sglang.engine drive
PARAMS.json``): the release's own ``ServerArgs`` parser, ``sglang.Engine``, one line per generate
call, each process's GPU memory (NVML) after an image request.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sglab.sglang.engine.hooks import say
from sglab.sglang.engine.spec import VOCAB


def random_ids(rng, n: int) -> list[int]:
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
                            "max_new_tokens": p["output_len"], "ignore_eos": True,
                            "temperature": 0.0
                        }
                    }
                    if image is not None:  # text through the model's processor, with the image
                        kwargs["prompt"] = [p["prompt"]] * n
                        kwargs["image_data"] = [image] * n
                    else:
                        kwargs["input_ids"] = [random_ids(rng, il) for _ in range(n)]
                    t0 = time.perf_counter()
                    engine.generate(**kwargs)
                    dt = time.perf_counter() - t0
                    say(f"call id={k} requests={n} input_len={il} output_len={p['output_len']} "
                        f"warmup={warm} seconds={dt:.6f}")
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
        "usage: python -m sglab.sglang.engine.driver drive PARAMS.json (the engine tool's driver)",
        file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
