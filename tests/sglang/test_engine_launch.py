"""An engine's process group never outlives its run (a scheduler left behind holds ~25 GiB of GPU
memory), and recording an engine run writes nothing partial when interrupted. CPU only: stand-in
process trees."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglab.core import runs
from sglab.sglang import engine as eng


pytestmark = pytest.mark.long(20)

psutil = pytest.importorskip("psutil")

TREE = textwrap.dedent("""
    import os, subprocess, sys, time
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    kids = [subprocess.Popen(sleep) for _ in range(2)]
    print("pids", os.getpid(), *[k.pid for k in kids], flush=True)
    if sys.argv[1] == "escape":   # a grandchild in a new session, found by the run's marker
        subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)"])
        time.sleep(1)
    if sys.argv[1] in ("exit", "escape"):
        sys.exit(0)                # the leader exits, its children stay in the group
    if sys.argv[1] == "crash":
        raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    time.sleep(300)                # a hang
""")


def _gone(pgid: int, timeout: float = 10.0) -> bool:
    """No process of the group remains (zombies awaiting their reaper hold nothing and are not
    counted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        alive = [
            p for p in psutil.process_iter(["status"])
            if _pgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _pgid(pid: int):
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _pids(log: Path) -> list[int]:
    for line in log.read_text().splitlines():
        if line.startswith("pids "):
            return [int(x) for x in line.split()[1:]]
    return []


def _launch(tmp_path, mode: str, timeout: float, marker: str = ""):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    env = dict(os.environ, SGLAB_ENGINE_RUN=marker) if marker else None
    lines = []
    ex = eng.launch(
        [sys.executable, str(script), mode],
        log=tmp_path / "engine.log",
        timeout=timeout,
        env=env,
        marker=marker,
        on_line=lines.append,
    )
    return ex, lines


def test_timeout_stops_the_whole_group(tmp_path):
    t0 = time.monotonic()
    ex, lines = _launch(tmp_path, "hang", timeout=3)
    assert ex.timed_out and ex.returncode is None
    assert time.monotonic() - t0 < 30
    assert _gone(ex.pid), "a process of the engine's group is still alive"
    for pid in _pids(tmp_path / "engine.log"):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert any(line.startswith("pids ") for line in lines)  # progress saw the streamed log
    assert len(ex.leftovers) == 2  # the two grandchildren, named


def test_children_left_after_a_normal_exit_are_reported_and_killed(tmp_path):
    ex, _ = _launch(tmp_path, "exit", timeout=60)
    assert ex.returncode == 0 and not ex.timed_out
    assert len(ex.leftovers) == 2 and not ex.survivors
    assert _gone(ex.pid)


def test_a_process_that_left_the_group_is_found_by_the_run_marker(tmp_path):
    marker = "test-" + os.urandom(6).hex()
    ex, _ = _launch(tmp_path, "escape", timeout=60, marker=marker)
    assert len(ex.leftovers) == 3
    time.sleep(0.5)
    assert not [
        p for p in psutil.process_iter()
        if _environ(p).get("SGLAB_ENGINE_RUN") == marker and p.status() != psutil.STATUS_ZOMBIE
    ]


def _environ(p) -> dict:
    try:
        return p.environ()
    except psutil.Error:
        return {}


def test_crash_gives_sglangs_line_and_nothing_left(tmp_path):
    ex, _ = _launch(tmp_path, "crash", timeout=60)
    assert ex.returncode == 1
    assert eng.first_error((tmp_path / "engine.log").read_text()) == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    assert _gone(ex.pid)


def _result(tmp_path) -> eng.EngineResult:
    cfg = Path(__file__).resolve().parents[2] / "data" / "models" / "llama_32x512" / "config.json"
    spec = eng.EngineSpec(
        "0.5.13",
        cfg,
        input_lens=(128,),
        repeats=2,
        case="pcg",
        adjustments=(eng.adjustment("kimi-k25-post-load-weights"),),
    )
    log = tmp_path / "engine.log"
    log.write_text("Benchmark ...\nPrefill. latency: 0.01320 s, throughput:   9696.97 token/s\n"
                   "Prefill. latency: 0.01400 s, throughput:   9142.86 token/s\n")
    d = eng.read_log(log.read_text())
    return eng.EngineResult(
        spec,
        "ok",
        log=log,
        decisions=d,
        bench=eng.bench_results(d, spec),
        found={"torch": "2.11.0+cu130", "sglang-kernel": "0.4.3"},
        pins={"torch": "2.11.0"},
        server_argv=["--model-path", "m"],
        sglang_command=["python", "-m", "sglang.bench_one_batch"],
    )


def test_record_is_one_run_with_its_manifest(tmp_path):
    path = eng.record([_result(tmp_path)], "pcg_gate", root=tmp_path / "runs")
    run = runs.read_run(path)
    assert run.manifest.experiment == "engine_pcg_gate"
    er = run.manifest.engine_runs[0]
    assert er["release"] == "0.5.13" and er["versions"]["sglang-kernel"] == "0.4.3"
    assert (er["adjustments"][0]["name"] == "kimi-k25-post-load-weights"
            and er["adjustments"][0]["reason"])
    assert (er["model"]["name"] == "llama_32x512"
            and er["model"]["config"]["num_hidden_layers"] == 32)
    assert er["command"].startswith("python -m sglang.bench_one_batch")
    assert er["cpus"] == []  # not pinned
    assert set(run.df["variant"]) == {"0.5.13+pcg"}
    assert run.sidecar("log_0").is_file()


@pytest.mark.parametrize("at", [1, 2, 3])
def test_interrupted_record_leaves_no_run_and_no_temporary_file(tmp_path, monkeypatch, at):
    """Ctrl-C while the sidecar, the CSV or the manifest is being moved into place: no run appears
    and no temporary file stays; the files already in place are whole (each one renamed atomically).
    """
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(runs.os, "replace", replace)
    root = tmp_path / "runs"
    with pytest.raises(KeyboardInterrupt):
        eng.record([_result(tmp_path)], "pcg_gate", root=root)
    folder = root / "engine_pcg_gate"
    assert runs.list_runs("engine_pcg_gate", root=root) == []
    assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]


def test_a_real_release_that_cannot_start_here_gives_one_line(tmp_path):
    """The whole path with a real release on this CPU box (pin check skipped): it starts, fails
    at its first import of a GPU package, and the result is SGLang's own line plus the log; nothing
    is left."""
    import importlib.util

    from sglab.sglang.releases import release_installed

    if not release_installed("0.5.13"):
        pytest.skip("sglang 0.5.13 is not installed")
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("triton is importable here: the release would get further than its imports")
    cfg = Path(__file__).resolve().parents[2] / "data" / "models" / "llama_32x512" / "config.json"
    spec = eng.EngineSpec("0.5.13", cfg, input_lens=(128,), timeout=300)
    lines = []
    res = eng.run(spec, work=tmp_path, check=False, echo=lines.append)
    assert res.status == "error" and not res.leftovers
    assert res.host["engine_cpu_s"] > 0 and "steal_pct" in res.host  # the host over the start
    log = tmp_path / "engine.log"
    assert res.error == f"ModuleNotFoundError: No module named 'triton' (log: {log})"
    assert lines[0].startswith("[sglab] sglang 0.5.13: starting bench_one_batch")
    text = "\n".join(eng.summary(res))
    assert "No module named 'triton'" in text and "piecewise" not in text


@pytest.mark.parametrize("whole_group", [False, True], ids=["script", "group"])
def test_the_gpu_script_stopped_by_a_signal_stops_its_sglab_and_packs_what_ran(
        tmp_path, whole_group):
    """`scripts/engine_gpu.sh` under an outer timeout: its running `sglab engine` is stopped and
    waited for, what it says while stopping reaches the command's log (GNU `timeout` signals the
    whole group, the log's echo included, and the signal may come as soon as `sglab` starts),
    engine.tgz holds the summary so far, and with PACK_JIT=1
    the JIT caches come back too (the next fresh machine skips its first builds even when this
    call was cut)."""
    import signal
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "bundles.json").write_text("{}")
    pidfile = tmp_path / "sglab.pid"
    fake = tmp_path / "python"
    # `python -m sglab.tools.cli engine ...` stands in for a long engine run (its pid written once
    # it has said "started" and its sleep runs, so that the signal finds both); the rest is Python
    fake.write_text("#!/usr/bin/env bash\n"
                    'if [ "$1 $2 $3" = "-m sglab.tools.cli engine" ]; then\n'
                    "  trap 'kill $!; sleep 0.5; echo recorded what finished; exit 143' TERM\n"
                    f"  echo started; sleep 300 & echo $$ > {pidfile}; wait; exit 0\nfi\n"
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    home = tmp_path / "home"
    (home / ".triton" / "cache").mkdir(parents=True)
    (home / ".triton" / "cache" / "kernel.cubin").write_bytes(b"\0" * 64)
    env = {
        **os.environ, "PYTHON": str(fake), "BUNDLES": str(tmp_path), "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"), "HOME": str(home), "PACK_JIT": "1"
    }
    p = subprocess.Popen(
        ["bash", str(root / "scripts" / "engine_gpu.sh"), "--scenario", "04-swa-kernels"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # the signal comes as soon as the engine has started, as an outer timeout's may: the log is
    # `sglab`'s own file, not a reader that might not have started yet
    log = tmp_path / "out" / "logs" / "04-swa-kernels.log"
    deadline = time.monotonic() + 60

    def written() -> bool:  # the shell makes the file before it writes the pid in it
        return pidfile.exists() and pidfile.read_text().endswith("\n")

    while not written() and time.monotonic() < deadline:
        time.sleep(0.01)
    child = int(pidfile.read_text())
    if whole_group:  # as GNU timeout sends it
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)  # the script alone, not its group
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 143 and "SIGTERM: stopping the running engine" in out
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    with tarfile.open(tmp_path / "out" / "engine.tgz") as tar:
        summary = tar.extractfile("summary.txt").read().decode()
    assert "stopped by SIGTERM" in summary
    said = log.read_text()
    assert "started" in said and "recorded what finished" in said
    with tarfile.open(tmp_path / "out" / "jit-cache.tar.xz") as tar:
        assert ".triton/cache/kernel.cubin" in tar.getnames()


# `sglab engine` with a stand-in for each engine: the third one, or the pause after the second,
# is ended by a SIGTERM sent to this process alone (as `timeout` or engine_gpu.sh would send it),
# or by both at once (twice)
STOPPED_SCENARIO = textwrap.dedent("""
    import os, signal, sys, time
    from sglab.core import procs
    from sglab.sglang import engine as eng
    from sglab.tools import cli, engine_cmd

    where, ran = sys.argv[1], []

    def run(spec, work=None, said=None):
        if where == "during" and len(ran) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        if where == "twice" and len(ran) == 2:
            # as a real engine's launch: a watchdog held; the outer timeout's group signal, then
            # engine_gpu.sh's forwarded copy while the engine is being stopped
            with procs.Guard():
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(30)
                finally:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)
        work.mkdir(parents=True, exist_ok=True)
        log = work / "engine.log"
        log.write_text("Prefill. latency: 0.01320 s, throughput:   9696.97 token/s\\n")
        d = eng.read_log(log.read_text())
        ran.append(spec)
        return eng.EngineResult(spec, "ok", log=log, decisions=d, bench=eng.bench_results(d, spec))

    def summary(res):
        if where == "between" and len(ran) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        return ["done " + res.spec.variant]

    eng.run, eng.summary = run, summary
    engine_cmd.host_launch_cost = lambda timeout=120.0, cpus=(): {"median": 5.0}
    engine_cmd.hardware.has_cuda = lambda: True
    sys.exit(cli.main(sys.argv[2:]))
""")


@pytest.mark.parametrize("where", ["during", "between", "twice"])
def test_a_scenario_stopped_by_a_signal_records_the_engines_that_finished_as_partial(
        tmp_path, capsys, where):
    """An outer timeout that ends the third of 15 engines (or the pause after the second) keeps
    the two that finished: a run under partial/ that says what ran, what did not and why;
    `sglab verify` fails it and `sglab publish` refuses it, so it never stands as a record."""
    import subprocess

    from sglab.tools import cli

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_SCENARIO)
    out = tmp_path / "runs"
    p = subprocess.run([
        sys.executable,
        str(script), where, "engine", "--scenario", "01-kimi-pcg", "--release", "0.5.13",
        "--record", "--out",
        str(out), "--work",
        str(tmp_path / "work")
    ], capture_output=True, text=True, timeout=120, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root / "lib")})
    assert p.returncode == 143, p.stderr
    assert not (out / "engine_pcg_gate").exists()  # no whole run was written
    (path,) = runs.list_runs("engine_pcg_gate", root=out / "partial")
    assert f"recorded (partial: 2 of 15 engines, stopped by SIGTERM): {path}" in p.stdout
    run = runs.read_run(path)
    part = run.manifest.partial
    assert (part["ran"], part["planned"], part["stopped_by"]) == (2, 15, "SIGTERM")
    assert len(part["missing"]) == 13 and part["missing"][-1] == "0.5.13+pcg-off start 3"
    assert len(run.manifest.engine_runs) == 2 and run.sidecar("log_1").is_file()
    assert run.manifest.host_launch_us == {"before": {"median": 5.0}}
    assert cli.main(["verify", str(path)]) == 1
    said = capsys.readouterr().out
    assert ("partial: 2 of 15 engines, stopped by SIGTERM; not run: 0.5.13+pcg-off ×4, "
            "0.5.13+pcg-off-again ×3, 0.5.13+enforce ×3, 0.5.13+default ×3") in said
    assert cli.main(["publish", str(path)]) == 2
