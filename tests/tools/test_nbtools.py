"""Headless execution: kernels on the IPC transport (no "running over TCP without encryption"
warning), and a timed-out, failing or stopped notebook reported as such (which cell, after how long,
where the partial output is) with no kernel process left behind."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from sglab.core import procs
from sglab.tools import nbtools
from tests.tools import outputs_text


pytestmark = pytest.mark.long(27)

LIB = Path(__file__).resolve().parents[2] / "lib"


def _notebook(folder: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny\n\n## Setup")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    path = folder / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def _sleeping_notebook(folder: Path, marker: Path, seconds: int) -> Path:
    """A notebook whose one cell writes its kernel's pid to ``marker``, then sleeps."""
    return _notebook(
        folder, f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        f"time.sleep({seconds})")


def _started(proc, *markers: Path, within: float = 120) -> list[int]:
    """Wait until every marker holds its kernel's pid (``proc`` still running); the pids."""
    deadline = time.time() + within
    while not all(m.exists() and m.read_text() for m in markers):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    return [int(m.read_text()) for m in markers]


def _python(code: str, **popen) -> subprocess.Popen:
    """``code`` in a fresh interpreter that imports sglab from this checkout."""
    prefix = f"import sys; sys.path.insert(0, {str(LIB)!r}); from pathlib import Path\n"
    return subprocess.Popen([sys.executable, "-c", prefix + code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _kernels_of(pid: int) -> list[int]:
    """ipykernel processes whose parent is ``pid`` (zombies count: nobody reaped them)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"ipykernel" in cmd:
            found.append(int(d.name))
    return found


def test_a_kernel_talks_over_ipc_and_its_temporary_files_go_with_it(tmp_path, capfd, monkeypatch,
                                                                    request):
    """The kernel's sockets are files, not TCP ports, and its temporary folder is its own: what it
    leaves there (multiprocessing's ``pymp-*``, a scratch folder, a file of eight characters like
    the standard library's probe) goes with it, and another program's file beside is kept."""
    shared = Path(tempfile.mkdtemp(prefix="tmp-"))  # short: the kernel's sockets are in it
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("TMPDIR", str(shared))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    (shared / "npc4yak5").write_bytes(b"blat")  # another program's
    path = _notebook(
        tmp_path, "import os, tempfile, multiprocessing.util as u\nprint('pid', os.getpid())\n"
        "open(os.path.join(tempfile.gettempdir(), 'q1w2e3r4'), 'w').write('blat')\n"
        "print(tempfile.mkdtemp(prefix='scratch-'), u.get_temp_dir())")
    r = nbtools.execute(path, cell_timeout=60, skip_gpu=True)
    out, err = capfd.readouterr()
    assert r.status == "ok", r.error
    assert "pid" in outputs_text(r.nb) and "pymp-" in outputs_text(r.nb)
    assert "without encryption" not in out + err and "over TCP" not in out + err, err
    assert not _kernels_of(os.getpid())
    assert [p.name for p in shared.iterdir()] == ["npc4yak5"]


def test_cell_timeout_is_reported_as_interrupted(tmp_path):
    path = _notebook(tmp_path, "print('before')", "import time\ntime.sleep(30)\nprint('never')",
                     "print('after')")
    t0 = time.perf_counter()
    r = nbtools.execute(path, cell_timeout=2, skip_gpu=True, partial_dir=tmp_path / "report")
    assert time.perf_counter() - t0 < 25, "the timeout did not stop the cell"
    assert r.status == "interrupted"
    m = re.fullmatch(
        r"interrupted: cell 2 \(import time…\) after (\d+\.\d) s \(cell timeout 2 "
        r"s\); "
        r"partial output in (.+)", r.error)
    assert m, r.error
    assert 2.0 <= float(m.group(1)) < 20
    partial = Path(m.group(2))
    assert partial == tmp_path / "report" / "tiny.ipynb" and partial.exists()
    assert "before" in outputs_text(nbformat.read(partial, as_version=4))
    assert "cleanup_resources" not in r.error and "AttributeError" not in r.error
    assert not _kernels_of(os.getpid()), "a kernel was left running"


def test_failing_cell_names_the_cell(tmp_path):
    path = _notebook(tmp_path, "x = 1", "raise ValueError('boom')")
    r = nbtools.execute(path, cell_timeout=60, skip_gpu=True, partial_dir=tmp_path,
                        params={"MODE": "live"})
    assert r.status == "failed" and r.mode == "live"  # the mode asked: the notebook never said
    # the cell's error in one line, not its source again (the partial notebook has the traceback)
    assert r.error == ("cell 3 (raise ValueError('boom')): ValueError: boom; partial output in "
                       f"{tmp_path / 'tiny.ipynb'}")
    assert not _kernels_of(os.getpid())


def test_a_dead_kernels_last_words_are_in_the_error_not_on_the_terminal(tmp_path, capfd):
    """What the kernel process itself writes (not a cell's output, which goes to the notebook)
    lands in a log beside its sockets: where the kernel dies, the error ends with it."""
    path = _notebook(
        tmp_path, "print('first')", "from ipykernel.kernelapp import IPKernelApp\n"
        "IPKernelApp.instance().log.error('the kernel goes now')\nimport os\nos._exit(3)")
    r = nbtools.execute(path, cell_timeout=60, skip_gpu=True, partial_dir=tmp_path / "out")
    out, err = capfd.readouterr()
    assert r.status == "interrupted" and not r.stopped_by_signal
    first = "from ipykernel.kernelapp import IPKernelApp"
    assert r.error.startswith(f"interrupted: cell 2 ({first}…) after "), r.error
    assert "(DeadKernelError: Kernel died)" in r.error
    assert r.error.endswith("the kernel process wrote:\n[IPKernelApp] ERROR | the kernel goes now")
    assert "the kernel goes now" not in out + err
    assert not _kernels_of(os.getpid())


def test_sigint_stops_the_notebook_and_its_kernel(tmp_path):
    marker = tmp_path / "kernel.pid"
    path = _sleeping_notebook(tmp_path, marker, 60)
    proc = _python("from sglab.tools import nbtools\n"
                   f"r = nbtools.execute(Path({str(path)!r}), cell_timeout=120, skip_gpu=True, "
                   f"partial_dir=Path({str(tmp_path / 'out')!r}))\n"
                   "print(r.status, r.stopped_by_signal); print(r.error)")
    _started(proc, marker, within=60)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert out.startswith("interrupted 2\ninterrupted: cell 1 (import os, time…) after "), \
        out + err  # 2: SIGINT
    assert "(stopped by a signal); partial output in" in out
    assert "Traceback" not in err + out, err  # the stopped kernel's own complaints stay in its log
    kernel = int(marker.read_text())
    for _ in range(50):
        if (not Path(f"/proc/{kernel}").exists()
                or "Z" in Path(f"/proc/{kernel}/stat").read_text().split()[2]):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"kernel {kernel} still running after the run was stopped")


def test_a_signal_stops_nbclients_kernel_poller_before_the_client_goes():
    """nbclient's signal callback lets go of the kernel client; its kernel poller, waking up to a
    second later, would then fail an assert with no one to read it ("Task exception was never
    retrieved" on the terminal: once in 80 stops of `sglab run` under load). The signal cancels the
    poller first, and nothing else."""
    import asyncio

    async def _async_poll_kernel_alive():  # named as nbclient's
        await asyncio.sleep(60)

    loop = nbtools._telling_signals(caught := [])
    poller, other = loop.create_task(_async_poll_kernel_alive()), loop.create_task(
        asyncio.sleep(60))
    seen = []
    loop.add_signal_handler(signal.SIGTERM, lambda: seen.append(
        (poller.cancelling(), other.cancelling())))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        loop.run_until_complete(asyncio.sleep(0.2))
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        for name in ("add_signal_handler", "remove_signal_handler"):
            vars(loop).pop(name, None)
        for task in (poller, other):
            task.cancel()
        loop.run_until_complete(asyncio.gather(poller, other, return_exceptions=True))
    assert caught == [signal.SIGTERM] and seen == [(1, 0)]  # the poller cancelled, not the other


@pytest.mark.parametrize("whom", ["group", "parent", "parent killed"])
def test_sigterm_stops_a_parallel_run_and_leaves_no_process(tmp_path, whom):
    """Two notebooks at a time, SIGTERM to the whole process group (an outer `timeout`) or to the
    parent alone: both notebooks report as interrupted, the index is written, and no worker,
    kernel or resource tracker is left behind (they used to hang on a result no one read). The
    parent killed outright: its workers stop their notebooks and kernels, and exit."""
    started = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        marker = tmp_path / f"{name}.pid"
        started.append(marker)
        _sleeping_notebook(tmp_path / name, marker, 120).rename(tmp_path / f"{name}.ipynb")
    # the run's own temporary folder, where nothing may be left (short: kernels' IPC sockets)
    tmp = Path(tempfile.mkdtemp(prefix="nb-"))
    proc = _python(
        f"from sglab.tools import report\nrs = "
        f"report.run_notebooks([Path({str(tmp_path / 'a.ipynb')!r}), "
        f"Path({str(tmp_path / 'b.ipynb')!r})], Path({str(tmp_path / 'out')!r}), jobs=2, "
        f"html_pages=False, env_rows=[])\nprint([(r.status, r.stopped_by_signal) for r in rs])",
        start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)})
    kernels: list[int] = []
    try:
        kernels = _started(proc, *started)  # each in a session of its own
        if whom == "group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGKILL if whom == "parent killed" else signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        if whom != "parent killed":
            # 15: SIGTERM reached each notebook (from the group, or from the parent after 5 s)
            assert "[('interrupted', 15), ('interrupted', 15)]" in out, out + err
            assert (tmp_path / "out" / "index.html").exists()
            assert "Traceback" not in err, err  # neither a kernel's nor nbclient's
        for _ in range(100):
            # the run's group (workers, resource tracker) and each kernel's own
            left = [x.pid for g in (proc.pid, *kernels) for x in procs.members(g)]
            if not left:
                break
            time.sleep(0.2)
        assert not left, left
        assert not list(tmp.glob("sglab-run-*"))  # the run's flag folder
    finally:  # a failing run must not leave its workers and kernels behind
        for group in (proc.pid, *kernels):
            procs.stop(group, grace=0)
        shutil.rmtree(tmp, ignore_errors=True)
