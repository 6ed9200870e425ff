"""One real SGLang release in one process: ``python -m sglab.sglang.worker --release V --probe M:F --params JSON
--out FILE``.

Prepares the release (:mod:`sglab.sglang.bootstrap`), calls the probe function ``F(params) -> list[dict]`` of
module ``M`` (a bare name means ``sglab.sglang.probes.M``), and writes one JSON object to ``FILE``:
``{"release", "probe", "rows", "shims", "seconds": {"prepare", "probe"}, "error", "not_run"}``. ``not_run`` is
the one-line reason when the release could not be imported; ``error`` a probe that raised (its last line and
the traceback tail). The exit code is 0 whenever the file was written, so a caller reads every outcome from it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
import traceback
import warnings
from pathlib import Path


def _resolve(probe: str):
    module, _, func = probe.partition(":")
    if not func:
        raise ValueError(f"probe must be MODULE:FUNCTION, got {probe!r}")
    if "." not in module:
        module = f"sglab.sglang.probes.{module}"
    return getattr(importlib.import_module(module), func)


def _jsonable(value):
    """Probe values are plain Python; tensors' dtypes and the like are written as their text."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def run(release: str, probe: str, params: dict) -> dict:
    from sglab.sglang import bootstrap

    out = {"release": release, "probe": probe, "rows": [], "shims": [], "seconds": {}, "error": None,
           "not_run": None}
    t0 = time.perf_counter()
    try:
        prepared = bootstrap.prepare(release)
    except bootstrap.NotRunnable as exc:
        out["not_run"] = str(exc)
        return out
    out["shims"] = [s.as_dict() for s in prepared.shims]
    out["seconds"]["prepare"] = round(time.perf_counter() - t0, 3)
    t1 = time.perf_counter()
    try:
        fn = _resolve(probe)
        rows = fn(prepared, params)
        out["rows"] = [{k: _jsonable(v) for k, v in row.items()} for row in rows]
    except bootstrap.NotRunnable as exc:
        out["not_run"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which decides
        tb = traceback.format_exc().strip().splitlines()
        out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        out["traceback"] = "\n".join(tb[-25:])
    out["seconds"]["probe"] = round(time.perf_counter() - t1, 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglab.sglang.worker")
    ap.add_argument("--release", required=True)
    ap.add_argument("--probe", required=True, help="MODULE:FUNCTION (bare MODULE: sglab.sglang.probes.MODULE)")
    ap.add_argument("--params", default="{}", help="JSON object passed to the probe")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    # SGLang and transformers warn loudly about the GPU-less machine; the caller only sees our JSON
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    result = run(args.release, args.probe, json.loads(args.params))
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
