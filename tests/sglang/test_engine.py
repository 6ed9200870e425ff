"""sglab.sglang.engine on the CPU: arguments per tool and release, log reading, one-line errors,
model configs, the #23552 revert, scenarios. The log lines are built from the format strings of the
releases' sources (the file is named at each); real GPU logs join them later."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sglab.sglang import engine as eng
from sglab.tools import fixes
from sglab.sglang.releases import release_installed
from tests.sglang_answers import function_source, package


pytestmark = pytest.mark.long(23)

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "data" / "models"
LLAMA = MODELS / "llama_32x512" / "config.json"


def _pkg(v: str) -> Path:
    return package(v)


# -- arguments -------------------------------------------------------------------------------------
@pytest.mark.parametrize("v", ["0.5.11", "0.5.12.post1", "0.5.13"])
def test_bench_command_per_release(tmp_path, v):
    _pkg(v)
    spec = eng.EngineSpec(
        v,
        LLAMA,
        "bench",
        ("--disable-piecewise-cuda-graph",),
        batch_sizes=(1, 4),
        input_lens=(128, 256),
        repeats=2,
        output_len=8,
    )
    prep = eng.prepare(spec, tmp_path, check=False)
    cmd = prep.argv
    assert cmd[1:3] == ["-m", "sglang.bench_one_batch"] and cmd == prep.sglang_command
    i = cmd.index("--input-len")
    # one untimed sweep (warmup=1), then the repeats: one sweep after another
    assert cmd[i + 1:i + 7] == ["128", "256"] * 3 and cmd[i + 7] == "--output-len"
    assert cmd[cmd.index("--batch-size") + 1:cmd.index("--batch-size") + 3] == ["1", "4"]
    for flag, value in (
        ("--load-format", "dummy"),
        ("--attention-backend", "triton"),
        ("--sampling-backend", "pytorch"),
        ("--output-len", "8"),
        ("--result-filename", str(tmp_path / "result.jsonl")),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--skip-tokenizer-init" not in cmd  # bench_one_batch loads a tokenizer anyway
    assert "--disable-piecewise-cuda-graph" in cmd
    # every flag of the command is one the release's own source defines
    flags = eng.release_flags(prep.env.package, "bench")
    assert all(f in flags for f in eng.flag_names(cmd[3:]))
    model = Path(cmd[cmd.index("--model-path") + 1])
    assert json.loads((model / "config.json").read_text()) == json.loads(LLAMA.read_text())
    assert len(json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]) == eng.VOCAB


def test_the_tokenizer_has_a_word_for_every_id_the_model_can_generate(tmp_path):
    """Kimi-K2.5's 163,840 ids: an id beyond the tokenizer decodes to no text, and bench_serving's
    TTFT (the first streamed chunk with text) is then never set."""
    full = MODELS / "kimi_k25_full" / "config.json"
    vocab = json.loads((eng.prepare_model(full, tmp_path / "m") / "tokenizer.json").read_text())
    assert len(vocab["model"]["vocab"]) == 163840 and vocab["model"]["vocab"]["t163839"] == 163839


def test_the_driver_module_runs_as_a_program():
    """The engine tool starts ``python -m sglab.sglang.engine.driver drive PARAMS.json``: the module
    must act when run (here: its usage, exit 2, without arguments)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sglab.sglang.engine.driver"], capture_output=True,
                         text=True, timeout=60,
                         env={"PYTHONPATH": str(REPO / "lib"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "usage: python -m sglab.sglang.engine.driver drive" in out.stderr


@pytest.mark.parametrize("v", ["0.5.11", "0.5.12.post1", "0.5.13"])
def test_engine_tool_runs_the_driver_with_server_args(tmp_path, v):
    _pkg(v)
    spec = eng.EngineSpec(
        v,
        LLAMA,
        "engine",
        ("--enable-breakable-cuda-graph", "--attention-backend", "flashinfer"),
        requests=(1, 8),
        input_lens=(128,),
        repeats=3,
        output_len=1,
    )
    prep = eng.prepare(spec, tmp_path, check=False)
    assert prep.argv[1:4] == ["-m", "sglab.sglang.engine.driver", "drive"]
    drive = json.loads((tmp_path / "drive.json").read_text())
    assert drive["requests"] == [1, 8] and drive["repeats"] == 3
    argv = drive["server_argv"]
    assert "--skip-tokenizer-init" in argv
    assert (argv.count("--attention-backend") == 1
            and argv[argv.index("--attention-backend") + 1] == "flashinfer")
    env = prep.environ
    paths = env["PYTHONPATH"].split(":")
    assert (paths[0] == str(tmp_path / "hooks")
            and (tmp_path / "hooks" / "sitecustomize.py").is_file())
    assert str(prep.env.paths[0]) in paths
    assert env["SGLAB_ENGINE_RUN"] and env["SGLANG_TORCH_PROFILER_DIR"] == str(tmp_path / "profile")


def test_the_server_skips_its_own_warm_up_and_grammar_backend(tmp_path):
    from sglab.sglang.engine.launching import server_argv

    serve = eng.EngineSpec("0.5.13", LLAMA, "serve", ("--cuda-graph-max-bs", "8"))
    argv = server_argv(serve, tmp_path)
    assert "--skip-server-warmup" in argv and argv[argv.index("--grammar-backend") + 1] == "none"
    # a reader's own flag wins, and the bench tool gets neither
    assert server_argv(eng.EngineSpec("0.5.13", LLAMA, "serve", ("--grammar-backend", "xgrammar")),
                       tmp_path).count("--grammar-backend") == 1
    bench = server_argv(eng.EngineSpec("0.5.13", LLAMA, "bench"), tmp_path)
    assert "--skip-server-warmup" not in bench and "--grammar-backend" not in bench


def test_profile_arguments(tmp_path):
    spec = eng.EngineSpec("0.5.11", LLAMA, profile=True, profile_steps=3)
    argv = eng.bench_argv(spec, tmp_path)
    assert argv[argv.index("--profile-stage") + 1] == "decode"
    assert argv[argv.index("--profile-steps") + 1] == "3"


def test_flags_differ_between_releases_and_are_read_from_the_source():
    f11, f13 = (
        eng.release_flags(_pkg("0.5.11"), "bench"),
        eng.release_flags(_pkg("0.5.13"), "bench"),
    )
    for f in (
            "--enable-breakable-cuda-graph",
            "--disable-piecewise-cuda-graph",
            "--enforce-piecewise-cuda-graph",
            "--moe-dense-tp-size",
            "--result-filename",
            "--profile-stage",
            "--skip-tokenizer-init",
    ):
        assert f in f11 and f in f13
    # 0.5.14 derives most flags from annotated ServerArgs fields, 0.5.23 from srt/arg_groups/fields
    f14 = eng.release_flags(_pkg("0.5.14"), "engine")
    assert {
        "--moe-dense-tp-size",
        "--tp-size",
        "--model-path",
        "--piecewise-cuda-graph-tokens",
    } <= f14
    f23 = eng.release_flags(_pkg("0.5.23"), "engine")
    assert "--cuda-graph-bs-prefill" in f23 and "--piecewise-cuda-graph-tokens" not in f23
    with pytest.raises(eng.EngineError, match="no bench_one_batch"):
        eng.release_flags(_pkg("0.5.23"), "bench")


def test_flags_are_read_again_once_the_source_changes(tmp_path):
    """A release's parsers are read once per file version: an edited ``server_args.py`` (a patched
    checkout) is read again."""
    package = tmp_path / "9.9.9" / "sglang"
    (package / "srt").mkdir(parents=True)
    args = package / "srt" / "server_args.py"
    args.write_text("p.add_argument('--one')\n")
    assert eng.release_flags(package, "engine") == {"--one"}
    assert eng.release_flags(package, "engine") == {"--one"}
    args.write_text("p.add_argument('--one')\np.add_argument('--two', type=int)\n")
    assert eng.release_flags(package, "engine") == {"--one", "--two"}


def test_unknown_flag_is_one_line_naming_the_release(tmp_path):
    _pkg("0.5.13")
    spec = eng.EngineSpec("0.5.13", LLAMA, server_args=("--no-such-flag", "1"))
    with pytest.raises(eng.EngineError) as e:
        eng.prepare(spec, tmp_path, check=False)
    assert "\n" not in str(e.value) and "sglang 0.5.13 does not accept --no-such-flag" in str(
        e.value)


def test_pin_mismatch_is_one_line_and_starts_nothing(tmp_path, monkeypatch):
    _pkg("0.5.13")
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: started.append(a))
    env = eng.locate("0.5.13")
    with pytest.raises(eng.ReleaseError) as e:  # (an EngineError of the whole release)
        eng.check_pins(env, {"torch": "2.13.0+cpu"})
    assert str(e.value) == (
        "sglang 0.5.13 pins torch==2.11.0 (sglang-kernel 0.4.3 is built for it); this machine has "
        "torch 2.13.0+cpu: nothing started")
    assert eng.check_pins(env, {"torch": "2.11.0+cu130"})["sglang-kernel"] == "0.4.3"
    with pytest.raises(eng.EngineError, match=r"pins torch==2\.9\.1"):
        eng.check_pins(eng.locate(_pkg("0.5.10.post1").parent.name), {"torch": "2.11.0+cu130"})
    with pytest.raises(eng.EngineError, match="nothing started"):
        eng.run(eng.EngineSpec("0.5.13", LLAMA), work=tmp_path / "w", echo=lambda s: None)
    assert not started


def test_a_release_that_cannot_start_here_is_said_once_per_scenario(monkeypatch, capsys):
    """A scenario of 15 engines on a machine whose torch the release was not built for: the
    release's line once and a count of the engines it spared, not 15 alike; no host launch cost
    is measured without CUDA; an engine error of one case (its flags) is still said per case."""
    from sglab.core import hardware
    from sglab.sglang import engine as engine_pkg
    from sglab.tools import engine_cmd
    from sglab.tools.cli import main

    tried = []

    def run(spec, work=None, said=None):
        tried.append(spec)
        if spec.release == "0.5.13":
            raise engine_pkg.ReleaseError("sglang 0.5.13 pins torch==2.11.0: nothing started")
        raise engine_pkg.EngineError(f"sglang {spec.release} does not accept a flag of {spec.case}")

    monkeypatch.setattr(engine_pkg, "run", run)
    monkeypatch.setattr(hardware, "has_cuda", lambda: False)  # a GPU this torch cannot use
    monkeypatch.setattr(hardware, "gpu_count", lambda: 1)
    monkeypatch.setattr(engine_cmd, "host_launch_cost", lambda **k: pytest.fail("measured"))
    assert main(["engine", "--scenario", "01-kimi-pcg"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [s.release for s in tried].count("0.5.13") == 1
    assert err.count("sglab engine: sglang 0.5.13 pins torch==2.11.0: nothing started") == 1
    assert "sglab engine: 14 more engine(s) of sglang 0.5.13 not started (the same reason)" in err
    others = [s for s in tried if s.release != "0.5.13"]
    assert len(others) > 1 and sum("does not accept" in line for line in err) == len(others)


def test_a_failure_every_variant_shares_on_its_first_start_starts_no_more(monkeypatch, capsys):
    """Every variant of the release failed its first start with the same error (a module the
    server imports is missing): the later starts are not tried; a failure of one variant alone
    does not stop the others."""
    from sglab.core import hardware
    from sglab.sglang import engine as engine_pkg
    from sglab.tools import engine_cmd
    from sglab.tools.cli import main

    tried = []

    def run(spec, work=None, said=None):
        tried.append(spec)
        return engine_pkg.EngineResult(
            spec, "error", error="ModuleNotFoundError: No module named "
            f"'x' (log: /tmp/{spec.variant}/engine.log)")

    monkeypatch.setattr(engine_pkg, "run", run)
    monkeypatch.setattr(hardware, "has_cuda", lambda: False)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 1)
    monkeypatch.setattr(engine_cmd, "host_launch_cost", lambda **k: {})
    assert main(["engine", "--scenario", "01-kimi-full-serve", "--release", "0.5.13"]) == 1
    err = capsys.readouterr().err
    assert len(tried) == 3 and {s.case for s in tried} == {"enforce", "pcg-off", "pcg-off-again"}
    assert "6 more engine(s) of sglang 0.5.13 not started" in err

    tried.clear()
    monkeypatch.setattr(
        engine_pkg, "run",
        lambda spec, work=None, said=None: tried.append(spec) or engine_pkg.EngineResult(
            spec, "error" if spec.case == "enforce" else "ok", error="boom"))
    main(["engine", "--scenario", "01-kimi-full-serve", "--release", "0.5.13"])
    assert len(tried) == 9


def test_cli_errors_are_one_line_with_status_2(tmp_path, capsys):
    from sglab.tools.cli import main

    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert main(["engine", "--release", "0.5.13", "--model", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sglab engine: ") and "\n" not in err and "not JSON" in err, err
    assert main(["engine", "--release", "0.5.13"]) == 2
    assert main(["engine", "--release", "0.5.13x", "--model", str(LLAMA)]) == 2
    assert "not a release version" in capsys.readouterr().err
    assert main(["engine", "--scenario", "01-kimi-pcg", "--release", "0.4.0"]) == 2
    assert capsys.readouterr().err == ("sglab engine: scenario 01-kimi-pcg: no run for releases "
                                       "0.4.0 (its releases: 0.5.12.post1 0.5.13)\n")


def test_a_pinned_engine_and_every_process_it_starts_run_on_the_cpus_given(tmp_path):
    """--cpus: the engine's command is wrapped so that it, and what it spawns, run on those CPUs;
    the command recorded stays SGLang's own."""
    import os
    import subprocess
    import sys

    from sglab.core import procs

    _pkg("0.5.13")
    one = min(os.sched_getaffinity(0))
    spec = eng.EngineSpec("0.5.13", LLAMA, "bench", cpus=(one,))
    prep = eng.prepare(spec, tmp_path, check=False)
    assert prep.argv[-len(prep.sglang_command):] == prep.sglang_command
    assert prep.argv[:2] == [sys.executable, "-c"] and prep.argv[3] == str(one)
    free = eng.prepare(eng.EngineSpec("0.5.13", LLAMA, "bench"), tmp_path / "free", check=False)
    assert free.argv == free.sglang_command
    code = (
        "import multiprocessing as mp, os\ndef child(q):\n    q.put(sorted(os.sched_getaffinity("
        "0)))\nif __name__ == '__main__':\n    ctx = mp.get_context('spawn'); q = ctx.Queue()\n"
        "    p = ctx.Process(target=child, args=(q,)); p.start(); print(q.get()); p.join()\n")
    (tmp_path / "spawn.py").write_text(code)
    out = subprocess.run(procs.pinned([sys.executable, str(tmp_path / "spawn.py")], (one,)),
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"[{one}]", out.stderr


def test_cpu_lists_read_and_print_alike_and_a_bad_one_is_one_line(capsys):
    from sglab.core import hardware
    from sglab.tools.cli import main

    assert hardware.parse_cpus("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert hardware.cpu_text((11, 0, 1, 2, 3, 8, 10)) == "0-3,8,10-11"
    assert hardware.cpu_text((5,)) == "5"
    for bad, says in (("7-3", "not a CPU list: '7-3'"), ("0-99999", "is not allowed to this")):
        assert main(["engine", "--release", "0.5.13", "--model", str(LLAMA), "--cpus", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("sglab engine: --cpus: ") and says in err and "\n" not in err, err


def test_bad_config_is_one_line(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(eng.EngineError, match="architectures"):
        eng.prepare_model(tmp_path / "a" / "config.json", tmp_path / "m")
    small = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000}
    (tmp_path / "a" / "config.json").write_text(json.dumps(small))
    with pytest.raises(eng.EngineError, match="vocab_size 1000"):
        eng.prepare_model(tmp_path / "a" / "config.json", tmp_path / "m")


# -- log reading -----------------------------------------------------------------------------------
def _prefix(msg: str) -> str:
    # SGLang's configure_logger format: "[%(asctime)s TP0] %(message)s"
    return f"[2026-11-25 10:00:00 TP0] {msg}"


def _bench_log(pcg: bool) -> str:
    lines = [
        # srt/model_executor/model_runner.py (load_model, init_device_graphs)
        _prefix(f"Load weight begin. avail mem={78.5:.2f} GB"),
        _prefix(
            f"Capture cuda graph begin. This can take up to several minutes. avail mem={70.0:.2f} "
            f"GB"),
        # srt/model_executor/cuda_graph_runner.py: f"Capture cuda graph bs {self.capture_bs}"
        _prefix(f"Capture cuda graph bs {[1, 2, 4]}"),
        _prefix(
            f"Capture cuda graph end. Time elapsed: {5.123:.2f} s. mem usage={0.3:.2f} GB. avail "
            f"mem={69.7:.2f} GB."),
    ]
    if pcg:
        lines += [
            # srt/model_executor/model_runner.py (init_piecewise_cuda_graphs)
            _prefix(f"Capture piecewise CUDA graph begin. avail mem={69.7:.2f} GB"),
            # srt/model_executor/piecewise_cuda_graph_runner.py
            _prefix(f"Capture cuda graph num tokens {[128, 256, 512, 1024]}"),
            _prefix(
                f"Capture piecewise CUDA graph end. Time elapsed: {6.5:.2f} s. mem usage={0.2:.2f} "
                f"GB. avail mem={69.5:.2f} GB."),
        ]
    else:
        lines.append(
            _prefix("Disable piecewise CUDA graph because the model is not a language model"))
    # bench_one_batch.py (load_model, latency_test, latency_test_run_once)
    lines += ["max_total_num_tokens=123456", "Warmup ..."]
    # bench_one_batch's own warm-up (its first shape only), an untimed sweep whose 256-token run
    # holds a JIT build, then two timed sweeps
    runs = [(0.0200, 8), (0.0135, 128), (2.5, 256)]
    runs += [(0.0132, 128), (0.0143, 256), (0.0140, 128), (0.0150, 256)]
    for i, (lat, il) in enumerate(runs):
        if i == 1:
            lines.append("Benchmark ...")
        lines.append(f"Prefill. latency: {lat:6.5f} s, throughput: {il / lat:9.2f} token/s")
        for j, dl in enumerate((0.003, 0.0029, 0.0031)):
            lines.append(
                f"Decode {j}. Batch size: {1}, latency: {dl:6.5f} s, throughput: {1 / dl:9.2f} "
                f"token/s")
        med = 0.003
        lines.append(
            f"Decode.  median latency: {med:6.5f} s, median throughput: {1 / med:9.2f} token/s")
        lines.append(f"Total. latency: {lat + 0.009:6.3f} s, throughput: {il / lat:9.2f} token/s")
    return "\n".join(lines) + "\n"


def test_read_bench_log_with_piecewise_graph():
    d = eng.read_log(_bench_log(pcg=True))
    assert (d["pcg"] == "captured" and d["pcg_tokens"] == [128, 256, 512, 1024]
            and d["pcg_capture_s"] == 6.5)
    assert d["decode_bs"] == [1, 2, 4] and d["decode_capture_s"] == 5.12
    assert d["warmup"]["prefill_latency"] == 0.02
    assert [b["prefill_latency"] for b in d["bench"]] == [0.0135, 2.5, 0.0132, 0.0143, 0.014, 0.015]
    assert all(b["median_decode_latency"] == 0.003 for b in d["bench"])
    assert any("Capture piecewise CUDA graph end" in x for x in d["excerpts"])


def test_read_bench_log_pcg_disabled_and_rows():
    spec = eng.EngineSpec("0.5.12.post1", LLAMA, input_lens=(128, 256), repeats=2, output_len=4,
                          case="enforce")
    d = eng.read_log(_bench_log(pcg=False))
    assert d["pcg"] == "disabled" and d["pcg_reason"] == "the model is not a language model"
    res = eng.EngineResult(spec, "ok", decisions=d, bench=eng.bench_results(d, spec))
    assert [(b["input_len"], b["prefill_latency"], b["warmup"]) for b in res.bench] == [
        (128, 0.0135, True),
        (256, 2.5, True),
        (128, 0.0132, False),
        (256, 0.0143, False),
        (128, 0.014, False),
        (256, 0.015, False),
    ]
    assert [(b["input_len"], b["prefill_latency"]) for b in res.bench][2:] == [
        (128, 0.0132),
        (256, 0.0143),
        (128, 0.014),
        (256, 0.015),
    ]
    rows = {(r["metric"], r.get("input_len")): r for r in eng.rows(res)}
    assert (rows[("prefill", 128)]["value"] == pytest.approx(13.6)
            and rows[("prefill", 128)]["unit"] == "ms")
    assert rows[("prefill_min", 128)]["value"] == pytest.approx(13.2)
    assert rows[("prefill_max", 256)]["value"] == pytest.approx(15.0)
    assert rows[("repeats", 256)]["value"] == 2  # the untimed sweep's 2.5 s is in no row
    assert rows[("prefill_iqr", 256)]["value"] == pytest.approx(0.35)  # inclusive quartiles
    assert rows[("pcg", None)]["value"] == "disabled"
    assert rows[("status", None)]["variant"] == "0.5.12.post1+enforce"
    assert ("host_steal", None) not in rows  # a result without the host's figures
    res.host = {"steal_pct": 12.5, "busy_pct": 30.0, "engine_cpu_s": 41.2, "preempted": 900}
    rows = {(r["metric"], r.get("input_len")): r for r in eng.rows(res)}
    assert {
        m: (rows[(m, None)]["value"], rows[(m, None)]["unit"])
        for m in ("host_steal", "host_busy", "engine_cpu", "engine_preempted")
    } == {
        "host_steal": (12.5, "%"), "host_busy": (30.0, "%"), "engine_cpu": (41.2, "s"),
        "engine_preempted": (900, "switches")
    }
    assert "piecewise CUDA graph: disabled (the model is not a language model)" in "\n".join(
        eng.summary(res))


def test_bench_results_prefer_the_jsonl_file(tmp_path):
    spec = eng.EngineSpec("0.5.13", LLAMA, input_lens=(128,))
    f = tmp_path / "result.jsonl"
    # bench_one_batch.py writes json.dumps(measurement_results) per run
    f.write_text(
        json.dumps({
            "run_name": "x",
            "batch_size": 1,
            "input_len": 128,
            "output_len": 16,
            "prefill_latency": 0.01,
            "prefill_throughput": 12800.0,
            "median_decode_latency": 0.002,
            "median_decode_throughput": 500.0,
            "total_latency": 0.04,
            "overall_throughput": 3600.0,
        }) + "\n")
    assert eng.bench_results(eng.read_log(""), spec, f)[0]["prefill_latency"] == 0.01


def test_skipped_runs_keep_the_order():
    spec = eng.EngineSpec("0.5.13", LLAMA, batch_sizes=(1, 64), input_lens=(128,), output_len=4)
    text = "\n".join([
        "Benchmark ...",
        "Prefill. latency: 0.01000 s, throughput:  12800.00 token/s",
        # bench_one_batch.py: f"skipping ({batch_size}, {input_len}, {output_len}) due to ..."
        "skipping (64, 128, 4) due to max batch size limit",
    ])
    out = eng.bench_results(eng.read_log(text), spec)
    assert [(b["batch_size"], b["prefill_latency"]) for b in out] == [(1, 0.01)]


def _prefill_batch(seqs: int, tokens: int, graph: bool) -> str:
    # srt/observability/scheduler_metrics_mixin.py (0.5.11, 0.5.12.post1) and
    # srt/managers/scheduler_components/metrics_reporter.py (0.5.13): report_prefill_stats
    msg = (f"Prefill batch, #new-seq: {seqs}, #new-token: {tokens}, #cached-token: {0}, full token "
           f"usage: 0.00, #running-req: {0}, #queue-req: {0}, #pending-token: {0}, ")
    msg += f"cuda graph: {graph}, input throughput (token/s): {1234.5:.2f}"
    return _prefix(msg)


def test_read_engine_log_prefill_batches_per_call():
    lines = [
        # srt/model_executor/breakable_cuda_graph_runner.py: f"[BCG] Capture num tokens:
        # {self.capture_num_tokens}"
        _prefix(f"[BCG] Capture num tokens: {[128, 256, 512, 1024]}"),
        "[sglab-engine] call-begin id=0 requests=1 input_len=128 warmup=1",
        _prefill_batch(1, 128, True),
        "[sglab-engine] call id=0 requests=1 input_len=128 output_len=1 warmup=1 seconds=0.020000",
    ]
    k = 1
    for n, graph in ((1, True), (4, False), (4, False)):
        lines += [
            f"[sglab-engine] call-begin id={k} requests={n} input_len=128 warmup=0",
            _prefill_batch(n, 128 * n, graph),
            # srt/.../scheduler_metrics_mixin.py report_decode_stats
            _prefix(
                f"Decode batch, #running-req: {n}, full token usage: 0.00, cuda graph: True, gen "
                f"throughput (token/s): 1.00, #queue-req: 0"),
            f"[sglab-engine] call id={k} requests={n} input_len=128 output_len=1 warmup=0 "
            f"seconds={0.01 * n:.6f}",
        ]
        k += 1
    d = eng.read_log("\n".join(lines))
    assert d["bcg"] == "captured" and d["bcg_tokens"] == [128, 256, 512, 1024]
    assert [c["requests"] for c in d["calls"]] == [1, 1, 4, 4]
    assert d["calls"][2]["prefill_batches"] == [{"seqs": 4, "tokens": 512, "graph": False}]
    assert d["decode_batches"][0] == {"running": 1, "graph": True}
    spec = eng.EngineSpec("0.5.11", LLAMA, "engine", requests=(1, 4), input_lens=(128,))
    rows = {(r["metric"], r.get("requests")): r["value"]
            for r in eng.rows(eng.EngineResult(spec, "ok", decisions=d))}
    assert rows[("prefill_graph", 1)] == 1.0 and rows[("prefill_graph", 4)] == 0.0
    assert rows[("prefill_seqs", 4)] == 4 and rows[("latency", 4)] == pytest.approx(40.0)
    assert rows[("repeats", 1)] == 1  # the warm-up call is not counted


def _served(il: int, c: int, ttft: float, tpot: float, warmup: int = 0) -> str:
    """One of the serve driver's lines (sglab.sglang.engine.driver.serve)."""
    return (f"[sglab-engine] serve input_len={il} concurrency={c} prompts={4 * c} repeat=0 "
            f"warmup={warmup} output_len=64 wall_s=1.0 completed={4 * c} duration=1.0 "
            f"mean_ttft_ms={ttft + 1} median_ttft_ms={ttft} mean_tpot_ms={tpot + 0.1} "
            f"median_tpot_ms={tpot} mean_e2e_latency_ms={ttft + 63 * tpot} "
            f"median_e2e_latency_ms={ttft + 63 * tpot} mean_itl_ms={tpot} median_itl_ms={tpot} "
            "total_input_tokens=512 total_output_tokens=256")


def test_a_served_run_reads_ttft_tpot_and_e2e_per_length_and_concurrency():
    """The serve tool's rows: the warm-up pass is not counted; each (input length, concurrency)
    gets TTFT, TPOT and E2E (bench_serving's medians and means over its requests, then the median
    over passes); the scheduler's own batch lines say how many prefills ran on the graph."""
    lines = [
        _served(128, 4, 99.0, 9.0, warmup=1),
        _prefill_batch(1, 128, True),
        _prefill_batch(2, 256, False),
        _prefix("Decode batch, #running-req: 2, full token usage: 0.00, cuda graph: True, gen "
                "throughput (token/s): 1.00, #queue-req: 0"),
        _served(128, 1, 20.0, 2.0),
        _served(128, 4, 30.0, 3.0),
        _served(128, 4, 34.0, 3.4)
    ]
    d = eng.read_log("\n".join(lines))
    spec = eng.EngineSpec("0.5.13", LLAMA, "serve", requests=(1, 4), input_lens=(128,))
    rows = {(r["metric"], r.get("requests")): r["value"]
            for r in eng.rows(eng.EngineResult(spec, "ok", decisions=d))}
    assert rows[("ttft", 1)] == 20.0 and rows[("tpot", 1)] == 2.0
    assert rows[("ttft", 4)] == 32.0 and rows[("ttft_min", 4)] == 30.0  # 2 passes, not the warm-up
    assert rows[("ttft_mean", 4)] == 33.0 and rows[("e2e", 1)] == pytest.approx(20 + 63 * 2)
    assert rows[("serving_passes", 4)] == 2 and rows[("completed", 4)] == 32
    assert rows[("serve_prefill_graph", None)] == 0.5 and rows[("serve_prefill_mixed", None)] == 1
    assert rows[("serve_decode_graph", None)] == 1.0


def test_the_serve_tool_starts_the_releases_server_and_its_bench_serving(tmp_path):
    """One ``bench_serving`` pass per (repeat, input length, concurrency), random token ids (no
    dataset download on a machine without a network), exact lengths, no warm-up request of its
    own (a repeated prompt would hit the prefix cache), a seed of its own per pass."""
    from sglab.sglang.engine import driver, launching

    spec = eng.EngineSpec("0.5.13", LLAMA, "serve", requests=(1, 4), input_lens=(128, 2048),
                          repeats=2, prompts=3)
    p = launching.serve_params(spec, ["--model-path", "m"], tmp_path / "model", tmp_path)
    assert [(x["repeat"], x["input_len"], x["concurrency"], x["prompts"]) for x in p["passes"]
            ][:4] == [(0, 128, 1, 3), (0, 128, 4, 12), (0, 2048, 1, 3), (0, 2048, 4, 12)]
    assert len(p["passes"]) == 8
    argv = driver.bench_serving_argv(p, 31000, p["passes"][1], 7, "out.jsonl")
    opts = dict(zip(argv[::2], argv[1::2]))
    assert opts["--dataset-name"] == "random-ids" and opts["--random-range-ratio"] == "1.0"
    assert opts["--max-concurrency"] == "4" and opts["--num-prompts"] == "12"
    assert opts["--warmup-requests"] == "0" and opts["--seed"] == "7" and opts["--port"] == "31000"
    # per-request TTFTs, read to refuse a pass where one was never set (no text streamed)
    assert argv[-1] == "--output-details"
    assert driver.untimed({"ttfts": [0.02, 0.03]}) == ""
    assert driver.untimed({"ttfts": [0.02, 0.0, 0.0]}).startswith("2 of 3 requests have no TTFT")
    with pytest.raises(eng.EngineError, match="--prompts must be at least 1"):
        eng.EngineSpec("0.5.13", LLAMA, "serve", prompts=0)


def test_read_log_breakable_eager_fallback_and_resolved_args():
    lines = [
        # srt/model_executor/breakable_cuda_graph_runner.py (0.5.12+), logger.warning with %s
        _prefix("[BCG] Could not resolve inner layer_model on %s. BCG is disabled for this model; "
                "prefill will fall back to eager." % "KimiK25ForConditionalGeneration"),
        "[sglab-engine] resolved " + json.dumps(
            {"attention_backend": "triton", "disable_piecewise_cuda_graph": True}),
        _prefix("Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set"),
    ]
    d = eng.read_log("\n".join(lines))
    assert d["bcg"] == "eager fallback" and d["bcg_eager"] == "KimiK25ForConditionalGeneration"
    assert d["attention_backend"] == "triton"
    assert d["pcg"] == "disabled" and "auto-disable" in d["pcg_reason"]


def test_a_default_moe_kernel_config_is_read_as_the_file_the_release_lacked():
    """The fused-MoE warning (logger.warning with %s) names the tuned config file it looked for:
    the run records that the generic config ran, and for which expert count, width and GPU."""
    path = ("/x/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/"
            "E=384,N=2048,device_name=NVIDIA_H200.json")
    said = ("Using default MoE kernel config. Performance might be sub-optimal! Config file not "
            "found at %s, you can create them with https://github.com/sgl-project/sglang/tree/"
            "main/benchmark/kernels/fused_moe_triton")
    d = eng.read_log(_prefix(said % path))
    assert d["moe_config"] == "default (no E=384,N=2048,device_name=NVIDIA_H200.json)"
    spec = eng.EngineSpec("0.5.13", LLAMA, "bench")
    row = [
        r
        for r in eng.rows(eng.EngineResult(spec, "ok", decisions=d)) if r["metric"] == "moe_config"
    ]
    assert [r["value"] for r in row] == [d["moe_config"]]  # a row of the recorded run
    assert eng.read_log(_prefix("Capture cuda graph bs [1, 2, 4]"))["moe_config"] is None


def test_log_strings_are_the_releases_own():
    """Each parsed string's fixed text occurs in the file LOG_STRINGS names, in every release that
    runs here."""
    fixed = {
        "pcg_disabled": "Disable piecewise CUDA graph because ",
        "pcg_begin": "Capture piecewise CUDA graph begin. avail mem=",
        "pcg_end": "Capture piecewise CUDA graph end. Time elapsed: ",
        "pcg_tokens": 'f"Capture cuda graph num tokens {self.capture_num_tokens}"',
        "bcg_tokens": 'f"[BCG] Capture num tokens: {self.capture_num_tokens}"',
        "decode_bs": 'f"Capture cuda graph bs {self.capture_bs}"',
        "prefill": 'f"Prefill. latency: {prefill_latency:6.5f} s, throughput: '
        '{throughput:9.2f} token/s"',
        "decode_median": 'f"Decode.  median latency: {med_decode_latency:6.5f} s, '
        "median throughput: ",
        "skipping": 'f"skipping ({batch_size}, {input_len}, {output_len}) due to max batch '
        'size limit"',
        "moe_default": '"Using default MoE kernel config. Performance might be sub-optimal! "\n'
        '                "Config file not found at %s, you can create them with ',
    }
    for v in ("0.5.11", "0.5.12.post1", "0.5.13"):
        pkg = _pkg(v)
        for key, text in fixed.items():
            where = eng.LOG_STRINGS[key][0].split(" ")[0]
            assert text in (pkg / where).read_text(), (v, key, where)
        metrics = ((pkg / "srt/observability/scheduler_metrics_mixin.py") if v != "0.5.13" else
                   (pkg / "srt/managers/scheduler_components/metrics_reporter.py"))
        src = metrics.read_text()
        assert 'f"#new-seq: {prefill_stats.num_new_seqs}, "' in src
        assert 'msg += f"{self._graph_backend_label}: {can_run_cuda_graph}, "' in src


def test_first_error_is_sglangs_own_line():
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    raise x\n'
    oom = (_prefix("Scheduler hit an exception: " + tb)
           + "\nRuntimeError: Not enough memory. Please try to "
           "increase --mem-fraction-static. Current value: mem_fraction_static=0.1\n")
    wrapper = tb + "RuntimeError: Initialization failed. Please see the error messages above.\n"
    assert eng.first_error(oom + wrapper) == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
        "value: mem_fraction_static=0.1")
    gptoss = tb + (
        "AssertionError: GptOssForCausalLM requires one of ['triton'] attention backend, but got "
        "the following backends\n- Prefill: fa3\n")
    assert eng.first_error(gptoss).startswith("AssertionError: GptOssForCausalLM requires one of")
    assert (eng.first_error(
        "usage: bench_one_batch.py [-h]\nbench_one_batch.py: error: unrecognized arguments: "
        "--foo\n") == "error: unrecognized arguments: --foo")
    assert (eng.first_error(
        tb + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n") ==
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert eng.first_error("all fine\n") is None


# -- the profiler trace ----------------------------------------------------------------------------
def test_decode_kernels_per_replay_and_layer(tmp_path):
    import gzip

    events, corr = [], 100
    for step in range(2):
        corr += 1
        events.append({
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "ts": step * 1000,
            "args": {"correlation": corr},
        })
        for i in range(10):
            events.append({
                "ph": "X",
                "cat": "kernel",
                "name": "gather" if i < 4 else f"k{i}",
                "ts": step * 1000 + 10 + i,
                "args": {"correlation": corr},
            })
        events.append({
            "ph": "X",
            "cat": "kernel",
            "name": "sampling",
            "ts": step * 1000 + 500,
            "args": {"correlation": corr + 50},
        })
    path = tmp_path / "profile_batch32_input256_output16_decode.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    k = eng.decode_kernels(path, layers=8, steps=2)
    assert k["replays"] == 2 and k["replays_per_step"] == 1.0
    assert k["kernels_per_replay"] == 10 and k["kernels_per_layer"] == 1.25
    assert k["table"][0] == ("gather", 4.0)


def test_revert_hunk_applies_in_a_process(tmp_path, monkeypatch):
    """The patch machinery on a stand-in module: redefined from its own source minus the hunk, same
    globals."""
    import importlib
    import sys

    mod = tmp_path / "standin_mod.py"
    mod.write_text(
        "from __future__ import annotations\nK = 3\n\nclass R:\n    def f(self, x: Missing) -> "
        "int:\n        y = x + K\n        # preset\n        y += 100\n        return y\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = importlib.import_module("standin_mod")
    assert m.R().f(1) == 104
    eng.revert_hunk({"name": "t", "qualname": "R.f", "text": "    # preset\n    y += 100\n"}, m)
    assert m.R().f(1) == 4
    del sys.modules["standin_mod"]


def test_hooks_run_in_spawned_children(tmp_path):
    """sitecustomize installs the hooks in every process: a patch on a module imported in a spawned
    child."""
    import subprocess
    import sys

    (tmp_path / "target_mod.py").write_text("def value():\n    # hunk\n    return 1 + 1\n")
    hooks = {
        "patches": [{
            "name": "t",
            "patch": "sglab.sglang.engine.hooks:revert_hunk",
            "params": {
                "module": "target_mod",
                "qualname": "value",
                "text": "    # hunk\n    return 1 + 1\n",
            },
        }],
    }
    # the stand-in hunk leaves an empty body: give the function a fallback line after it
    (tmp_path
     / "target_mod.py").write_text("def value():\n    # hunk\n    return 1 + 1\n    return 0\n")
    (tmp_path / "hooks.json").write_text(json.dumps(hooks))
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(eng.SITECUSTOMIZE)
    code = (
        "import multiprocessing as mp\ndef child(q):\n    import target_mod\n    "
        "q.put(target_mod.value())\nif __name__ == '__main__':\n    ctx = mp.get_context('spawn'); "
        "q = ctx.Queue()\n    p = ctx.Process(target=child, args=(q,)); p.start(); print('child', "
        "q.get()); p.join()\n")
    (tmp_path / "main.py").write_text(code)
    env = {
        "PYTHONPATH": f"{tmp_path / 'hooks'}:{REPO / 'lib'}:{tmp_path}",
        "SGLAB_ENGINE_HOOKS": str(tmp_path / "hooks.json"),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, str(tmp_path / "main.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert "child 0" in out.stdout, out.stdout + out.stderr
    assert "[sglab-engine] applied t pid=" in out.stdout


# -- model configs ---------------------------------------------------------------------------------
FRAMEWORK = {
    "__class__",
    "dtype",
    "rope_parameters",
    "quantization_config",
    "original_max_position_embeddings",
    "target_hidden_size",
    "encoder_only",
    "language_only",
    "json",
    "text_config",
    "vision_config",
    "architectures",
    "rope_scaling",
    "get_name",
    "torch_dtype",
}
READS = {  # model folder -> (source under srt/models of 0.5.13, the part of the config it reads)
    "llama_32x512": [("llama.py", None)],
    "gpt_oss_swa": [("gpt_oss.py", None)],
    "deepseek_v3_tiny": [("deepseek_v2.py", None)],
    "kimi_k25_tiny": [("deepseek_v2.py", "text_config"), ("kimi_k25.py", "vision_config")],
    "kimi_k25_tiny_tp8": [("deepseek_v2.py", "text_config"), ("kimi_k25.py", "vision_config")],
    "kimi_k25_full": [("deepseek_v2.py", "text_config"), ("kimi_k25.py", "vision_config")],
    "kimi_k25_tp4rank": [("deepseek_v2.py", "text_config"), ("kimi_k25.py", "vision_config")],
}


@pytest.mark.parametrize("name", sorted(READS))
def test_model_config_has_the_fields_the_model_class_reads(name):
    cfg = json.loads((MODELS / name / "config.json").read_text())
    assert cfg["architectures"]
    models = _pkg("0.5.13") / "srt" / "models"
    for source, part in READS[name]:
        text = (models / source).read_text()
        reads = set(re.findall(r"\bconfig\.([a-z_][a-z_0-9]*)", text)) - FRAMEWORK
        have = cfg[part] if part else cfg
        missing = sorted(reads - set(have))
        assert not missing, f"{name}: {source} reads {missing}"


def test_model_configs_shape():
    llama = json.loads(LLAMA.read_text())
    assert llama["num_hidden_layers"] == 32 and llama["hidden_size"] == 512
    oss = json.loads((MODELS / "gpt_oss_swa" / "config.json").read_text())
    assert "sliding_attention" in oss["layer_types"] and "full_attention" in oss["layer_types"]
    assert len(oss["layer_types"]) == oss["num_hidden_layers"] and oss["sliding_window"]
    kimi = json.loads((MODELS / "kimi_k25_tiny" / "config.json").read_text())
    t, vis = kimi["text_config"], kimi["vision_config"]
    assert t["num_hidden_layers"] == 2 and t["n_routed_experts"] == 8 and t["kv_lora_rank"]
    assert vis["vt_num_hidden_layers"] == vis["num_hidden_layers"] == 1
    assert (vis["text_hidden_size"] == t["hidden_size"]
            and kimi["media_placeholder_token_id"] < t["vocab_size"])


def test_the_full_width_kimi_config_has_kimi_k25s_text_widths():
    """Every width of Kimi-K2.5's text model, with as many layers as one 80-GB GPU holds at dummy
    weights (the first one dense, then one MoE layer); the tiny vision tower, projecting to the
    full hidden size."""
    kimi = json.loads((MODELS / "kimi_k25_full" / "config.json").read_text())
    t, vis = kimi["text_config"], kimi["vision_config"]
    assert {k: t[k] for k in KIMI_K25_WIDTHS} == KIMI_K25_WIDTHS
    assert t["first_k_dense_replace"] == 1 and t["num_hidden_layers"] == 2
    assert vis["text_hidden_size"] == t["hidden_size"] and vis["vt_num_hidden_layers"] == 1
    moe_layer_gb = 3 * t["n_routed_experts"] * t["hidden_size"] * t["moe_intermediate_size"] * 2e-9
    dense_gb = 3 * t["hidden_size"] * t["intermediate_size"] * 2e-9
    embeddings_gb = 2 * t["vocab_size"] * t["hidden_size"] * 2e-9  # embed_tokens and lm_head
    assert 33 < moe_layer_gb < 34  # bf16: why only a few layers fit one GPU
    # one MoE layer leaves an 80-GB GPU room for the KV cache and activations; a second would not
    weights_gb = moe_layer_gb + dense_gb + embeddings_gb
    assert 38 < weights_gb < 41 and weights_gb + moe_layer_gb > 72


def test_the_tp4_rank_config_is_the_full_one_with_a_quarter_of_each_sharded_width():
    """What one rank of TP 4 holds (SGLang shards attention by heads, the dense and each expert's
    MLP by their intermediate width; the LoRA down-projections, the hidden size and the experts'
    count stay): the full config with those four widths divided by 4, nothing else changed."""
    full = json.loads((MODELS / "kimi_k25_full" / "config.json").read_text())
    rank = json.loads((MODELS / "kimi_k25_tp4rank" / "config.json").read_text())
    sharded = ("num_attention_heads", "num_key_value_heads", "intermediate_size",
               "moe_intermediate_size")
    t, r = full["text_config"], rank["text_config"]
    assert {k: r[k] * 4 for k in sharded} == {k: t[k] for k in sharded}
    assert {k: v
            for k, v in r.items() if k not in sharded
            } == {k: v
                  for k, v in t.items() if k not in sharded}
    assert {k: v
            for k, v in rank.items() if k != "text_config"
            } == {k: v
                  for k, v in full.items() if k != "text_config"}


KIMI_K25_WIDTHS = {
    "hidden_size": 7168, "num_attention_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 384, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "vocab_size": 163840
}


def test_every_scenarios_model_splits_evenly_at_its_tp_size():
    """Attention heads (the text model's and the vision tower's, which SGLang shards over the same
    TP group) and MoE widths divide by each case's TP size: Kimi's 2 vision heads would not at
    TP 4."""
    for sc in fixes.scenarios():
        cfg = json.loads(sc.model_config().read_text())
        text, vis = cfg.get("text_config", cfg), cfg.get("vision_config") or {}
        for spec in sc.specs():
            tp = spec.tp_size
            widths = {
                "heads": text["num_attention_heads"],
                "vision heads": vis.get("num_attention_heads",
                                        tp), "moe width": text.get("moe_intermediate_size", tp)
            }
            bad = {k: w for k, w in widths.items() if w % tp}
            assert not bad, (sc.name, spec.variant, tp, bad)
    assert any(s.gpus == 4 for s in fixes.scenarios())


# each shipped model config: (multimodal, hybrid SWA) as the engine's releases read it
CONFIGS = {
    "llama_32x512": (False, False),
    "gpt_oss_swa": (False, True),
    "kimi_k25_tiny": (True, False),
    "kimi_k25_tiny_tp8": (True, False),
    "kimi_k25_full": (True, False),
    "kimi_k25_tp4rank": (True, False),
    "deepseek_v3_tiny": (False, False),
}
CONFIG_RELEASES = ("0.5.12.post1", "0.5.13")
MODEL_PROBE = "tests.sglang.model_probe:probe_model_config"
# answered once per test session (conftest), with the other calls of each release's worker
REAL_CALLS = [(MODEL_PROBE, {"config": str(MODELS / name / "config.json")}, CONFIG_RELEASES)
              for name in CONFIGS]


@pytest.mark.parametrize("v", CONFIG_RELEASES)
def test_configs_parse_with_the_releases_own_model_config(v):
    """Each config through the release's ModelConfig and get_tokenizer (a worker process, CPU
    shims)."""
    from sglab.sglang import runner

    _pkg(v)
    for name, (mm, swa) in CONFIGS.items():
        params = {"config": str(MODELS / name / "config.json")}
        r = runner.run_probes([v], MODEL_PROBE, params, timeout=600)[v]
        assert r.ok, (name, r.reason, r.traceback[-800:])
        got = dict(zip(r.rows.metric, r.rows.value))
        assert (got["is_multimodal"], got["is_hybrid_swa"]) == (mm, swa), name
        # the tokenizer has the model's vocabulary (Kimi-K2.5 at full width: 163,840 ids)
        assert got["tokenizer"].endswith(f" {max(eng.VOCAB, got['vocab_size'])}"), name
        if swa:
            assert got["swa_attention_layer_ids"] == [0, 2, 4, 6]


# -- scenarios -------------------------------------------------------------------------------------
def test_scenarios_build_their_specs():
    names = {s.name for s in fixes.scenarios()}
    assert {
        "01-kimi-pcg",
        "01-llama-pcg",
        "03-bcg-requests",
        "04-swa-kernels",
        "02-ar-fusion",
        "05-grid-thw",
        "06-dense-tp1",
    } <= names
    for f in fixes.FIXES:  # each fix's record holds its own scenarios, named by its notebook
        assert all(s.fix == f.name and s.name.startswith(f.number + "-") for s in f.engine or ())
    with pytest.raises(KeyError, match="unknown scenario 'nope'"):
        fixes.scenario("nope")
    kimi = fixes.scenario("01-kimi-pcg").specs()
    by = {s.variant: s for s in kimi if not s.profile}  # the timed starts
    assert set(by) == {  # pcg-off-again: the A/A control
        f"{v}+{c}"
        for v in ("0.5.12.post1", "0.5.13")
        for c in ("default", "enforce", "pcg-off", "pcg-off-again")
    }
    timed = [s for s in kimi if not s.profile]
    assert len(timed) == 3 * len(by)  # three engine starts of each
    assert len(kimi) - len(timed) == len(by) - 2  # one launch pass per variant but the A/A copy
    # the scenario names no adjustment: sglab engine adds the model's where the release needs it
    assert not by["0.5.12.post1+enforce"].adjustments and not by["0.5.13+enforce"].adjustments
    if release_installed("0.5.12.post1") and release_installed("0.5.13"):
        need = {
            v: [a.name for a in eng.with_model_needs(s, lambda _: None).adjustments]
            for v, s in by.items() if v.endswith("+enforce")
        }
        assert need == {
            "0.5.12.post1+enforce": ["kimi-k25-post-load-weights"], "0.5.13+enforce": []
        }
    assert "--enforce-piecewise-cuda-graph" in by["0.5.13+enforce"].server_args
    assert (by["0.5.13+default"].input_lens == (128, 256, 512, 1024)
            and by["0.5.13+default"].repeats > 1)
    swa = {s.variant: s for s in fixes.scenario("04-swa-kernels").specs()}
    assert set(swa) == {
        "0.5.11+released",
        "0.5.11+before",
        "0.5.12.post1+released",
        "0.5.13+released",
    }
    assert swa["0.5.11+before"].profile and swa["0.5.11+before"].adjustments[0].patch
    # three interleaved starts of each variant, every one profiled (its decode kernels counted)
    assert [(s.release, s.start) for s in fixes.scenario("04-swa-kernels").specs(["0.5.13"])
            ] == [("0.5.13", 0), ("0.5.13", 1), ("0.5.13", 2)]
    for s in fixes.scenarios():
        assert s.model_config().is_file() and s.experiment == f"engine_{s.fix}"
        assert s.specs(), s.name


@pytest.mark.parametrize("name", ["02-ar-fusion", "05-grid-thw", "06-dense-tp1", "03-bcg-requests"])
def test_multi_gpu_scenarios_build_arguments_each_release_accepts(tmp_path, name):
    sc = fixes.scenario(name)
    for spec in sc.specs():
        if not release_installed(spec.release):
            continue
        prep = eng.prepare(spec, tmp_path / spec.variant, check=False)
        if sc.gpus > 1:
            assert spec.tp_size == sc.gpus
        argv = prep.server_argv
        assert argv[:2] == ["--model-path", str(prep.model_dir)]
        flags = eng.release_flags(prep.env.package, spec.tool)
        assert all(f in flags for f in eng.flag_names(argv)), spec.variant


def test_model_package_for_the_kimi_adjustment_is_importable_by_name():
    adj = eng.adjustment("kimi-k25-post-load-weights")
    pkg = dict(adj.env)["SGLANG_EXTERNAL_MODEL_PACKAGE"]
    folder = REPO / "lib" / Path(*pkg.split("."))
    assert (folder / "__init__.py").is_file()
    src = (folder / "kimi_k25.py").read_text()
    assert "class KimiK25ForConditionalGeneration(_Released)" in src and "EntryClass" in src
    import ast

    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef))
    assert [n.name for n in cls.body if isinstance(n, ast.FunctionDef)] == ["post_load_weights"
                                                                            ]  # gate kept
    # the method equals 0.5.13's own
    released = function_source(
        (_pkg("0.5.13") / "srt/models/kimi_k25.py").read_text(),
        "KimiK25ForConditionalGeneration.post_load_weights",
    )
    ours = function_source(src, "KimiK25ForConditionalGeneration.post_load_weights")
    assert ours == released


@pytest.mark.parametrize(
    "release, model, added",
    [
        ("0.5.12.post1", "kimi_k25_tiny", True),  # no post_load_weights before 0.5.13
        ("0.5.11", "kimi_k25_tiny", True),
        ("0.5.13", "kimi_k25_tiny", False),
        ("0.5.12.post1", "llama_32x512", False),
    ])
def test_a_model_that_needs_an_adjustment_gets_it_by_itself_and_says_so(release, model, added):
    _pkg(release)
    cfg = REPO / "data" / "models" / model / "config.json"
    spec = eng.EngineSpec(release, cfg, server_args=("--enforce-piecewise-cuda-graph",))
    said = []
    got = eng.with_model_needs(spec, said.append)
    names = [a.name for a in got.adjustments]
    assert names == (["kimi-k25-post-load-weights"] if added else [])
    assert len(said) == int(added) and all("added (this model needs it" in s for s in said)
    # carried already: not twice
    again = eng.with_model_needs(got, said.append)
    assert [a.name for a in again.adjustments] == names and len(said) == int(added)
    # the scenario's later starts of the variant: added again, its reason not said again
    named: set = set()
    lines = []
    for _ in range(2):
        eng.with_model_needs(spec, lines.append, named)
    assert named == set(names)
    assert [ln.endswith("its reason above)") for ln in lines] == ([False, True] if added else [])


def test_too_few_gpus_skips_a_plans_scenario_and_stops_a_named_one(monkeypatch, capsys):
    """On a 2-GPU machine a TP-4 scenario is skipped by its plan with one line, and named alone it
    stops with one line and status 2; nothing starts either way."""
    from sglab.core import hardware
    from sglab.sglang import engine as engine_pkg
    from sglab.tools import fixes
    from sglab.tools.cli import main

    tp4 = [s for s in fixes.scenarios() if s.gpus == 4]
    assert tp4, "no TP-4 scenario"
    monkeypatch.setattr(hardware, "has_cuda", lambda: True)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 2)
    monkeypatch.setattr(hardware, "gpus", lambda: ())
    started = []
    monkeypatch.setattr(engine_pkg, "run", lambda spec, work=None, said=None: started.append(spec))
    plan = tp4[0].name.split("-")[0]
    only_tp4 = all(s.gpus == 4 for s in fixes.plan(plan))
    status = main(["engine", "--plan", plan, "--scenario", tp4[0].name])
    assert status == 2 and not started
    assert capsys.readouterr().err.strip() == (
        f"sglab engine: {tp4[0].name} needs 4 GPUs, this machine has 2")
    monkeypatch.setattr(
        engine_pkg, "run", lambda spec, work=None, said=None:
        (_ for _ in ()).throw(engine_pkg.EngineError("stand-in: not started")))
    main(["engine", "--plan", plan])
    out = capsys.readouterr()
    assert f"sglab engine: skipped {tp4[0].name} needs 4 GPUs, this machine has 2" in out.out
    assert only_tp4 or "stand-in: not started" in out.err


def test_a_machine_without_gpus_says_so_in_one_line_and_starts_nothing(monkeypatch, capsys):
    """No GPU for torch nor for the driver: a named scenario, a free run and a plan each stop with
    one line saying so and status 2, not with each release's torch pin."""
    from sglab.core import hardware
    from sglab.sglang import engine as engine_pkg
    from sglab.tools.cli import main

    monkeypatch.setattr(hardware, "has_cuda", lambda: False)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 0)
    started = []
    monkeypatch.setattr(engine_pkg, "run", lambda spec, work=None, said=None: started.append(spec))
    assert main(["engine", "--scenario", "01-kimi-pcg"]) == 2
    assert capsys.readouterr().err.strip() == (
        "sglab engine: 01-kimi-pcg: no CUDA GPU here; needs 1")
    argv = ["engine", "--release", "0.5.13", "--model", str(LLAMA), "--", "--tp-size", "2"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "sglab engine: this engine: no CUDA GPU here; needs 2")
    assert main(["engine", "--plan", "01"]) == 2
    out = capsys.readouterr()
    assert "sglab engine: skipped 01-llama-pcg: no CUDA GPU here; needs 1" in out.out
    assert out.err.strip() == "sglab engine: plan 01: nothing this machine can start"
    assert not started


def test_event_lines_joined_by_two_ranks_are_both_read():
    """Four ranks share one engine log: a line of ours another rank's write joined to the end of a
    line is read as its own line (a TP-4 run's log had two such pairs: ranks 2 and 3 each seemed
    to create one workspace, not two), and `say` writes a line in one write."""
    import subprocess
    import sys

    def line(pid, rank, obj):
        return (f"[sglab-engine] event workspace pid={pid} max_token_num=2048 world_size=4 "
                f"rank={rank} obj={obj} seconds=0.04")

    text = "\n".join([
        line(1, 0, "a"),
        line(2, 1, "b") + line(3, 2, "c"),
        line(1, 0, "d"), "[2026-11-27 16:13:20 TP2] Load weight end."
    ]) + "\n"
    events = eng.read_log(text)["events"]
    assert [(e["rank"], e["obj"]) for e in events] == [(0, "a"), (1, "b"), (2, "c"), (0, "d")]
    # say(): the whole line in one write() of the process's stdout
    code = ("import os, sys\nfrom sglab.sglang.engine.hooks import say\n"
            "sys.stdout.write('partial')\nsay('event x pid=1')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO / "lib")},
                         timeout=60).stdout
    assert out == "partial[sglab-engine] event x pid=1\n"


def _ev(cat: str, name: str, corr: int, ts: float, dur: float = 0.0) -> dict:
    return {
        "ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}
    }


def test_a_prefill_steps_launches_are_counted_exactly(tmp_path):
    """Eager: every kernel is a host launch. Piecewise: graph launches run most kernels, and the
    pieces between the graphs (attention, say) are launched one by one."""
    import gzip

    from sglab.sglang.engine.trace import prefill_launches, step_launches

    eager = [_ev("cuda_runtime", "cudaLaunchKernel", c, c) for c in range(12)]
    eager += [_ev("kernel", f"k{c}", c, c + 0.5) for c in range(12)]
    eager += [_ev("cuda_runtime", "cudaMemcpyAsync", 99, 99)]  # a copy is not a kernel launch
    counts = ("kernel_launches", "graph_launches", "kernels_in_graphs")
    assert [step_launches({"traceEvents": eager})[k] for k in counts] == [12, 0, 0]
    pw = []
    for g, corr in enumerate((200, 201)):  # two pieces, five kernels each
        pw.append(_ev("cuda_runtime", "cudaGraphLaunch", corr, g * 100))
        pw += [_ev("kernel", f"g{g}k{i}", corr, g * 100 + i + 1) for i in range(5)]
    pw += [_ev("cuda_driver", "cuLaunchKernelEx", 300, 50), _ev("kernel", "attn", 300, 51)]
    assert [step_launches({"traceEvents": pw})[k] for k in counts] == [1, 2, 10]
    for n, evs in ((128, eager), (256, pw)):
        (tmp_path / f"profile_batch1_input{n}_output8_prefill.trace.json.gz").write_bytes(
            gzip.compress(json.dumps({"traceEvents": evs}).encode()))
    (tmp_path / "profile_batch1_input128_output8_decode.trace.json.gz").write_bytes(b"")
    got = prefill_launches(tmp_path)
    assert sorted(got) == [128, 256] and got[256]["graph_launches"] == 2


def test_a_prefill_step_reports_its_kernels_gpu_time_by_family():
    """Kernel durations (µs in the trace) summed in ms, inside graphs or not: all of them, the
    attention kernels (the Triton extend ``_fwd_kernel``) and the MoE kernels."""
    from sglab.sglang.engine.trace import step_launches

    evs = [_ev("cuda_runtime", "cudaGraphLaunch", 1, 0)]
    evs += [
        _ev("kernel", "_fwd_kernel", 1, 1, 1500.0),
        _ev("kernel", "fused_moe_kernel", 1, 2, 700.0),
        _ev("kernel", "nvjet_tst_128x256", 1, 3, 250.0)
    ]
    evs += [_ev("cuda_runtime", "cudaLaunchKernel", 2, 4, 5.0)]  # host time is not GPU time
    got = step_launches({"traceEvents": evs})
    assert (got["gpu_ms"], got["attention_ms"], got["moe_ms"]) == (2.45, 1.5, 0.7)


def test_a_launch_pass_follows_the_timed_starts_and_records_counts_not_times(tmp_path):
    from sglab.sglang.engine.recording import rows
    from sglab.sglang.engine.running import EngineResult

    sc = fixes.scenario("01-llama-pcg")
    specs = sc.specs()
    counted = [sp for sp in specs if sp.profile]
    assert [(sp.start, sp.case) for sp in counted] == [(3, "pcg"), (3, "pcg-off")]  # no A/A copy
    assert all(sp.profile_stage == "prefill" and sp.repeats == 1 for sp in counted)
    assert all(not sp.profile for sp in specs[:len(specs) - len(counted)])
    argv = eng.bench_argv(counted[0], tmp_path)
    assert argv[argv.index("--profile-stage") + 1] == "prefill"
    bench = [{
        "batch_size": 1, "input_len": 128, "output_len": 8, "prefill_latency": 0.05,
        "prefill_throughput": 1.0
    }]
    res = EngineResult(
        counted[0], "ok", decisions={"pcg": "captured", "bcg": "not used"}, bench=bench, launches={
            128: {
                "kernel_launches": 3, "graph_launches": 2, "kernels_in_graphs": 300, "gpu_ms": 4.5,
                "attention_ms": 1.0, "moe_ms": 2.0
            }
        })
    got = {r["metric"]: r["value"] for r in rows(res)}
    assert got["prefill_graph_launches"] == 2 and got["prefill_kernels_in_graphs"] == 300
    assert "prefill" not in got  # timed under the profiler: not a timing
    assert (got["prefill_gpu_ms"], got["prefill_attention_ms"]) == (4.5, 1.0)  # kernel time
    assert any("2 graph launches running 300 kernels" in ln for ln in eng.summary(res))


def test_the_engine_package_names_its_face_by_plain_imports():
    """Every name of ``sglab.sglang.engine`` is imported where it is defined (an editor follows it);
    no name is resolved on first use, and the engine's own processes, which import ``hooks``
    through the package, get no pandas with it."""
    import ast
    import subprocess
    import sys

    init = Path(eng.__file__)
    tree = ast.parse(init.read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    imported = {
        a.asname or a.name
        for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names
    }
    for name in (n for n in imported if not n.isupper()):
        assert getattr(eng, name).__module__.startswith("sglab.sglang."), name
    code = "import sys, sglab.sglang.engine.hooks; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_a_model_config_is_read_once_per_engine_run(tmp_path, monkeypatch):
    """The launch (its check, the model's needs, the model folder) and the record (the config and
    its digest in the manifest) read the config file once, whatever asks for it."""
    import hashlib

    from sglab.sglang.engine import recording

    _pkg("0.5.13")
    config = tmp_path / "llama" / "config.json"
    config.parent.mkdir()
    config.write_bytes(LLAMA.read_bytes())
    reads = []
    for method in ("read_bytes", "read_text"):
        real = getattr(Path, method)

        def counted(self, *a, _real=real, **k):
            if self.name == "config.json" and self.resolve() == config.resolve():
                reads.append(self)
            return _real(self, *a, **k)

        monkeypatch.setattr(Path, method, counted)
    spec = eng.with_model_needs(eng.EngineSpec("0.5.13", config, "bench", ()), echo=lambda _: None)
    prep = eng.prepare(spec, tmp_path / "work", check=False)
    model = recording.model_record(config)
    assert len(reads) == 1, reads
    assert (prep.model_dir / "config.json").read_bytes() == LLAMA.read_bytes()
    assert model["sha256_16"] == hashlib.sha256(LLAMA.read_bytes()).hexdigest()[:16]
    assert model["config"]["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize("text, says", [
    (None, "no such model config"),
    ("{", "not JSON: "),
    ("[1]", "a model config is a JSON object, not a list"),
    ('{"vocab_size": 32000}', "a model config needs an 'architectures' list"),
])
def test_a_bad_model_config_is_one_line_naming_the_file(tmp_path, text, says):
    path = tmp_path / "config.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(eng.EngineError) as got:
        eng.load_config(tmp_path)
    assert str(got.value).startswith(f"{path}: {says}") and "\n" not in str(got.value)
