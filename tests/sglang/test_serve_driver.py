"""The serve tool's driver (sglab.sglang.engine.driver.serve) end to end on the CPU, against a
stand-in ``sglang`` package: a loopback server that answers ``/health_generate`` and a
``bench_serving`` that writes one result line, as the release's own do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


LIB = Path(__file__).resolve().parents[2] / "lib"

SERVER = textwrap.dedent("""
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health_generate" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")

# each run of the module's code leaves a line: "import" as a module, "main" as a program
BENCH = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["BENCH_LOG"], "a") as f:
        f.write(("main" if __name__ == "__main__" else "import") + "\\n")
    if __name__ == "__main__":
        args, a = sys.argv[1:], {}
        for i, x in enumerate(args):
            if x.startswith("--"):
                nxt = args[i + 1] if i + 1 < len(args) else "--"
                a[x] = None if nxt.startswith("--") else nxt
        n, il = int(a["--num-prompts"]), int(a["--random-input-len"])
        empty = il == int(os.environ.get("BENCH_NO_TEXT_AT", "0"))
        res = {"completed": n, "median_ttft_ms": 0.0 if empty else il / 100, "median_tpot_ms": 1.5,
               "ttfts": [0.0 if empty else il / 1e5] * n, "itls": [[0.0015] * 3] * n,
               "generated_texts": ["t5 t6"] * n, "errors": [""] * n}
        with open(a["--output-file"], "a") as f:
            f.write(json.dumps(res) + "\\n")
""")


def _serve(tmp_path: Path, port: int, **env) -> tuple[subprocess.CompletedProcess, Path]:
    """The driver on a stand-in ``sglang``; each test its own first port (two at once on one port
    would race between the free-port check and the bind)."""
    pkg = tmp_path / "stand_in" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(SERVER)
    (pkg / "bench_serving.py").write_text(BENCH)
    passes = [{"input_len": il, "concurrency": c, "prompts": 2 * c, "repeat": 0}
              for il in (128, 2048) for c in (1, 4)]
    params = {
        "server_argv": [], "port": port, "tokenizer": "m", "output_len": 4, "warmup": 1,
        "passes": passes, "results": str(tmp_path / "serving.jsonl"), "timeout": 60
    }
    (tmp_path / "serve.json").write_text(json.dumps(params))
    path = os.pathsep.join([str(tmp_path / "stand_in"), str(LIB)])
    p = subprocess.run(
        [sys.executable, "-m", "sglab.sglang.engine.driver", "serve",
         str(tmp_path / "serve.json")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": path, "BENCH_LOG": str(tmp_path / "log"), **env})
    return p, tmp_path / "serving.jsonl"


def test_one_line_per_pass_after_the_warm_up_and_bench_serving_imported_once_early(tmp_path):
    p, results = _serve(tmp_path, 31700)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    # an untimed pass per input length at the highest concurrency, then the four timed ones
    assert [(x["input_len"], x["concurrency"], x.get("warmup", 0)) for x in lines] == [(128, 4, 1),
                                                                                       (2048, 4, 1),
                                                                                       (128, 1, 0),
                                                                                       (128, 4, 0),
                                                                                       (2048, 1, 0),
                                                                                       (2048, 4, 0)]
    # the per-request lists are read, not kept
    assert all("ttfts" not in x and "itls" not in x for x in lines)
    assert lines[-1]["median_ttft_ms"] == 20.48 and lines[-1]["completed"] == 8
    # imported as a module while the server started, then run as a program once per pass
    assert (tmp_path / "log").read_text().split() == ["import"] + ["main"] * 6
    said = [x for x in p.stdout.splitlines() if x.startswith("[sglab-engine] serve ")]
    assert len(said) == 6 and "median_ttft_ms=20.48" in said[-1]


@pytest.mark.parametrize("at", [2048])
def test_a_pass_whose_requests_streamed_no_text_fails_the_start(tmp_path, at):
    p, results = _serve(tmp_path, 31760, BENCH_NO_TEXT_AT=str(at))
    assert p.returncode == 1
    assert ("serve-error RuntimeError: bench_serving: 4 of 4 requests have no TTFT (their "
            "generated tokens decoded to no text)") in p.stdout
    # the pass before it is kept; the server is stopped (the driver returned)
    assert [json.loads(x)["input_len"] for x in results.read_text().splitlines()] == [128]


def test_an_answer_that_is_not_http_is_not_ready_yet(monkeypatch):
    """A loopback connect to a port nobody listens on yet can connect to itself and read its own
    request back (``BadStatusLine: GET /health_generate``): the wait goes on, it does not fail
    the start."""
    import contextlib
    import http.client
    import types

    from sglab.sglang.engine import driver

    asked = []

    def urlopen(url, timeout):
        asked.append(url)
        if len(asked) == 1:
            raise http.client.BadStatusLine("GET /health_generate HTTP/1.1")
        return contextlib.nullcontext(types.SimpleNamespace(status=200))

    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    monkeypatch.setattr(driver.time, "sleep", lambda s: None)
    driver._ready("http://127.0.0.1:1", types.SimpleNamespace(poll=lambda: None),
                  driver.time.monotonic() + 5)
    assert len(asked) == 2


def test_the_server_port_is_below_the_ephemeral_range():
    from sglab.sglang.engine import launching

    assert 1024 < launching.SERVE_PORT < 32768 - 200  # the free ports tried stay below it too
