"""Notebook plumbing: pairing checks between ``NN_topic.py`` (jupytext percent, the reviewed source)
and ``NN_topic.ipynb`` (committed without outputs), and headless execution through nbclient."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglab.core import procs


GPU_TAG = "needs-gpu"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # IPython's colours: noise in a report or a log
PARAM_TAG = "parameters"


def notebooks_dir() -> Path:
    from sglab.core.runs import repo_root

    return repo_root() / "notebooks"


def all_notebooks() -> list[Path]:
    return sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(sorted(c.get("metadata", {}).get("tags", []))))
            for c in nb.cells]


def check_pair(ipynb: Path) -> list[str]:
    """Problems with one notebook: outputs or execution counts committed, a missing or other .py."""
    try:
        nb = _read(ipynb)
    except ValueError as e:
        return [str(e)]
    problems = [
        f"{ipynb.name}: cell {i} has outputs or an execution count (commit it clean)"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    py = ipynb.with_suffix(".py")
    if not py.exists():
        return problems + [f"{ipynb.name}: no paired {py.name}"]
    if _cells(_read(py)) != _cells(nb):
        problems.append(f"{ipynb.name} differs from {py.name}: run `sglab sync` to pair them")
    return problems


def _stable_ids(nb, previous) -> None:
    """The ids ``nb``'s cells had in ``previous`` (same type and source), else a content hash."""
    old = {}
    for c in (previous.cells if previous is not None else []):
        old.setdefault((c.cell_type, c.source), []).append(c.get("id"))
    used = set()
    for i, c in enumerate(nb.cells):
        ids = old.get((c.cell_type, c.source)) or []
        cid = ids.pop(0) if ids else None
        if not cid or cid in used:
            cid = hashlib.sha1(f"{i}\0{c.cell_type}\0{c.source}".encode()).hexdigest()[:8]
        c["id"] = cid
        used.add(cid)


# in the checkout's git folder (never committed): each notebook's cells when its two halves last
# agreed, written by every sync
PAIRED = "sglab-paired.json"


class PairConflict(ValueError):
    """Both halves of a notebook changed since they were last paired: no side can be taken."""


def _digest(cells) -> str:
    return hashlib.sha1(json.dumps(cells).encode()).hexdigest()


def _git(folder: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _read(path: Path, text: str | None = None):
    """A .py or .ipynb (``text``: its content) as a notebook; a ValueError naming it where not."""
    import jupytext

    try:
        text = path.read_text(encoding="utf-8") if text is None else text
        return jupytext.reads(text, fmt="py:percent" if path.suffix == ".py" else "ipynb",
                              as_version=4)
    except Exception as e:  # noqa: BLE001 - not JSON, not UTF-8, a cell without its fields...
        other = path.with_suffix(".py" if path.suffix == ".ipynb" else ".ipynb")
        raise ValueError(f"{path}: not a readable notebook ({str(e).split(':')[0]}); restore it, "
                         f"or rewrite it from {other.name} with `sglab sync --from "
                         f"{other.suffix[1:]}`") from None


def _committed_cells(path: Path):
    """The cells of ``path`` as committed at the checkout's HEAD; None outside git or untracked."""
    text = _git(path.parent, "show", f"HEAD:./{path.name}")
    try:
        return _cells(_read(path, text)) if text is not None else None
    except Exception:  # noqa: BLE001 - a committed file that does not parse pairs with nothing
        return None


def _paired_record(folder: Path) -> tuple[Path | None, dict]:
    """Where :data:`PAIRED` lies (None outside git) and what it holds."""
    where = _git(folder, "rev-parse", "--git-path", PAIRED)
    path = (folder / where.strip()) if where and where.strip() else None
    try:
        return path, json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return path, {}


def pair_side(py: Path, prefer: str | None = None) -> str | None:
    """The half of ``py``'s pair the other is written from ("py", "ipynb"; None: they agree)."""
    ipynb = py.with_suffix(".ipynb")
    if prefer is not None:  # "py" or "ipynb" (sglab sync --from)
        if not (py if prefer == "py" else ipynb).exists():
            raise ValueError(f"{py.stem}: no {(py if prefer == 'py' else ipynb).name} to pair from")
        _read(py if prefer == "py" else ipynb)  # one that does not read is refused here
        return prefer
    if not ipynb.exists():
        return "py"
    if not py.exists():
        return "ipynb"
    p, n = _cells(_read(py)), _cells(_read(ipynb))
    if p == n:
        return None
    head_p, head_n = _committed_cells(py), _committed_cells(ipynb)
    if head_p is not None and (p, n) == (head_p, head_n):
        return "py"
    paired = {_digest(c) for c in (head_p, head_n) if c is not None}
    recorded = _paired_record(py.parent)[1].get(str(py.resolve().with_suffix("")))
    paired |= {recorded} if recorded else set()
    if not paired:
        return "ipynb" if ipynb.stat().st_mtime > py.stat().st_mtime else "py"
    p_kept, n_kept = _digest(p) in paired, _digest(n) in paired
    if p_kept != n_kept:
        return "ipynb" if p_kept else "py"
    why = "cannot tell which is newer" if p_kept else "both were edited since they were last paired"
    raise PairConflict(f"{py.stem}: {py.name} and {ipynb.name} differ and {why}: keep one with "
                       "`sglab sync --from py` or `sglab sync --from ipynb` (the other's edits are "
                       "lost)")


def _write_ipynb(py: Path) -> bool:
    """Write ``py``'s .ipynb from it, cell ids kept; False where it was so already."""
    import jupytext

    nb = jupytext.read(py)  # (a .py holds no outputs)
    target = py.with_suffix(".ipynb")
    try:
        _stable_ids(nb, _read(target) if target.exists() else None)
    except ValueError:  # an .ipynb that does not read: rewritten whole
        _stable_ids(nb, None)
    text = jupytext.writes(nb, fmt="ipynb").rstrip("\n") + "\n"  # as jupytext.write ends the file
    return _write(target, text)


def _write(path: Path, text: str) -> bool:
    """Write ``text`` into ``path`` unless it holds it already; whether it was written."""
    if path.exists() and path.read_text(encoding="utf-8", errors="replace") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def _write_py(ipynb: Path) -> bool:
    """Write the .py of ``ipynb`` under the .py's header; False where it was so already."""
    import jupytext

    py = ipynb.with_suffix(".py")
    nb = _read(ipynb)
    if py.exists():
        meta = dict(jupytext.read(py).metadata)
    else:
        meta = {"jupytext": {"formats": "ipynb,py:percent"}}
        if "kernelspec" in nb.metadata:
            meta["kernelspec"] = dict(nb.metadata["kernelspec"])
    kept = ("tags", "lines_to_next_cell")  # (the latter: a .py's blank lines other than pep8's)
    for c in nb.cells:
        old = c.get("metadata", {})
        c.metadata = {k: old[k] for k in kept if old.get(k) not in (None, [])}
    nb.metadata = meta
    return _write(py, py_source(nb))


def sync(py: Path, side: str | None = "py") -> tuple[Path, Path] | None:
    """Pair ``py``'s two halves from ``side``: (from, to), None where nothing was written."""
    ipynb = py.with_suffix(".ipynb")
    wrote = _write_py(ipynb) if side == "ipynb" else False
    wrote = _write_ipynb(py) or wrote
    path, record = _paired_record(py.parent)
    if path is not None:
        record[str(py.resolve().with_suffix(""))] = _digest(_cells(_read(py)))
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(tmp, path)
    return ((ipynb, py) if side == "ipynb" else (py, ipynb)) if wrote else None


def pairs() -> list[Path]:
    """The .py of every workbook notebook (whichever half exists)."""
    folder = notebooks_dir()
    stems = {p.stem for p in folder.glob("[0-9][0-9]_*.py")} | {p.stem for p in all_notebooks()}
    return [folder / f"{s}.py" for s in sorted(stems)]


def py_source(nb) -> str:
    """A notebook's ``.py`` as committed: jupytext percent, no ``text_representation`` block."""
    import jupytext

    text = jupytext.writes(nb, fmt="py:percent")
    return re.sub(r"^(# +)text_representation:\n(?:\1  .*\n)*", "", text, count=1, flags=re.M)


def parameter_names(path: Path) -> list[str]:
    """The names the notebook's ``parameters`` cell assigns (what ``--param`` may set)."""
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]  # (the JSON is enough)
    cell = next((c for c in cells if PARAM_TAG in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        return []
    src = cell["source"]
    tree = ast.parse(src if isinstance(src, str) else "".join(src))
    return [
        t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    ]


def readable(path: Path) -> None:
    """Nothing where ``path`` reads as a notebook; else a ValueError of one line saying why."""
    import nbformat

    try:
        nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 (nbformat's errors: JSON, schema, OS)
        why = str(e).splitlines()[0][:80] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a notebook that reads ({why})") from None


@dataclass
class Result:
    path: Path
    status: str  # "ok" | "failed" (a cell raised) | "interrupted" (timed out, or a signal came)
    mode: str  # "live" | "recorded" | "cpu" | "?"
    seconds: float
    error: str = ""
    skipped_gpu_cells: int = 0
    nb: object = field(default=None, repr=False)
    started: float | None = None  # time.time() when it began (the report finds its live runs)
    # the signal that stopped it (2, 15; 0: none): the caller stops too, no next notebook
    stopped_by_signal: int = 0


class _Progress:
    """Which cell is running since when (nbclient hooks), so that an interruption can name it."""

    def __init__(self):
        self.index, self.cell, self.t0 = None, None, 0.0

    def start(self, cell, cell_index, **_):
        self.index, self.cell, self.t0 = cell_index, cell, time.perf_counter()

    def where(self) -> str:
        """The cell executing now (or the last one executed), e.g. "cell 4 (import time…)"."""
        if self.index is None:
            return "before the first cell (kernel start)"
        first = next((ln.strip() for ln in self.cell.source.splitlines() if ln.strip()), "")
        more = "…" if len(first) > 50 or len(self.cell.source.strip().splitlines()) > 1 else ""
        return f"cell {self.index} ({first[:50]}{more})"


KERNEL_LOG = "kernel.log"  # in the kernel's folder: what the kernel process itself writes


def _stop_kernel(client, km, folder: str, loop) -> str:
    """Stop the kernel and what it started, remove its files; the tail of its :data:`KERNEL_LOG`."""
    from jupyter_core.utils import run_sync

    # a cell cut short leaves nbclient's pollers pending on this thread's ``loop``: cancelled here,
    # they end quietly (a loop that runs is the caller's: nbclient then ran on a loop of its own)
    if not loop.is_running() and (pending := asyncio.all_tasks(loop)):
        for t in pending:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    pid = getattr(getattr(km, "provisioner", None), "pid", None)
    started = procs.descendants(pid) if pid else []  # what the kernel started: it goes too
    try:
        if getattr(client, "kc", None) is not None:
            client.kc.stop_channels()
            client.kc = None
        if km.has_kernel:
            try:
                run_sync(km.shutdown_kernel)(now=True)
            except (asyncio.InvalidStateError, RuntimeError):
                # nbclient's own signal handler was shutting the same kernel down: end it here
                if pid:
                    procs.stop_tree(pid, grace=2.0)
        procs.stop_seen(started, grace=2.0)
    finally:
        km.cleanup_connection_file()
        km.cleanup_ipc_files()
        try:
            tail = (Path(folder) / KERNEL_LOG).read_text(errors="replace").splitlines()[-15:]
        except OSError:
            tail = []
        shutil.rmtree(folder, ignore_errors=True)
    return "\n".join(tail)


# in a process that called :func:`stop_on_signals` (a worker of `sglab run`): the signals that asked
# it to stop, in order
_STOPS: list[int] = []
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, `kill`, a closed tty


def _note_stop(signum, _frame) -> None:
    _STOPS.append(int(signum))


def stop_on_signals(before: tuple = ()) -> None:
    """From now on the stop signals only ask this process to stop (``before``: noted already)."""
    _STOPS.extend(int(s) for s in before)
    for s in STOP_SIGNALS:
        signal.signal(s, _note_stop)


def stop_requested() -> int:
    """The first signal that asked this process to stop (:func:`stop_on_signals`), or 0."""
    return _STOPS[0] if _STOPS else 0


def _telling_signals(caught: list):
    """This thread's event loop, nbclient's signal handlers noting in ``caught`` what came."""
    from jupyter_core.utils import ensure_event_loop

    loop = ensure_event_loop()
    add, remove = loop.add_signal_handler, loop.remove_signal_handler
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    noting = signal.getsignal(signal.SIGTERM) is _note_stop

    def on_signal(sig, callback, args):
        caught.append(int(sig))
        if noting:
            _STOPS.append(int(sig))
        if len(caught) == 1:  # nbclient's kernel poller would assert the client this lets go
            for t in asyncio.all_tasks(loop):
                if getattr(t.get_coro(), "__name__", "") == "_async_poll_kernel_alive":
                    t.cancel()
            callback(*args)

    def adding(sig, callback, *args):
        if noting and _STOPS:
            caught.append(_STOPS[0])
            raise KeyboardInterrupt  # before the kernel starts: execute reports it stopped
        return add(sig, on_signal, sig, callback, args)

    def removing(sig):
        done = remove(sig)
        if before.get(sig) not in (None, signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, before[sig])
        return done

    loop.add_signal_handler, loop.remove_signal_handler = adding, removing
    return loop


def execute(ipynb: Path, *, cell_timeout: int = 900, skip_gpu: bool | None = None,
            params: dict | None = None, partial_dir: Path | None = None,
            kernel_dir: str | None = None) -> Result:
    """Execute a notebook headless (``needs-gpu`` cells skipped without CUDA); why it stopped in
    the result's error, the partial notebook in ``partial_dir``."""
    import nbclient
    import nbformat
    from jupyter_client.manager import AsyncKernelManager
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    from sglab.core import hardware
    from sglab.core.notebook import read_mode
    from sglab.core.runs import shared_caches

    if skip_gpu is None:
        skip_gpu = not hardware.has_cuda()
    nb = nbformat.read(ipynb, as_version=4)
    tags = [c.get("metadata", {}).get("tags", []) for c in nb.cells]
    n_gpu = sum(GPU_TAG in t for t in tags)
    if params:  # a cell assigning them after the ``parameters`` cell (papermill's convention)
        src = "# injected parameters\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
        cell = nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})
        nb.cells.insert(next((i for i, t in enumerate(tags) if PARAM_TAG in t), -1) + 1, cell)
    progress = _Progress()
    # the IPC transport: the kernel's sockets are files in a private folder, not TCP ports
    folder = tempfile.mkdtemp(prefix="sglab-kernel-", dir=kernel_dir)
    os.mkdir(Path(folder) / "tmp")
    km = AsyncKernelManager(kernel_name="python3", transport="ipc",
                            connection_file=str(Path(folder) / "kernel.json"))
    client = nbclient.NotebookClient(nb, km=km, timeout=cell_timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(ipynb.parent)}},
                                     skip_cells_with_tag=GPU_TAG if skip_gpu else "skip-execution",
                                     on_cell_execute=progress.start,
                                     shutdown_kernel="immediate")  # a signal: the kernel goes now
    started, t0 = time.time(), time.perf_counter()
    status, error, by_signal = "ok", "", False
    # the kernel process's own output (not the cells') goes to a file: one that dies says why there
    log = open(Path(folder) / KERNEL_LOG, "wb")
    caught: list[int] = []
    loop = _telling_signals(caught)
    try:
        # headless (widgets become static tables), the temporary files in the kernel's folder
        env = {**shared_caches(), **os.environ, "SGLAB_HEADLESS": "1", "TMPDIR": f"{folder}/tmp"}
        client.execute(env=env, stdout=log, stderr=log)
    except (Exception, KeyboardInterrupt, asyncio.CancelledError) as e:  # noqa: BLE001
        # nbclient's SIGINT/SIGTERM handler starts the kernel's shutdown (its future set at once)
        # and lets go of it (km None); a signal during the kernel's start cancels the start
        by_signal = (client.km is None or not isinstance(e, Exception)
                     or getattr(client, "_async_cleanup_kernel_future", None) is not None)
        if isinstance(e, CellExecutionError) and not by_signal:  # the cell's error, not its source
            said = f"{e.ename}: {e.evalue}".rstrip(". ") if e.ename else f"{type(e).__name__}: {e}"
            status, error = "failed", f"{progress.where()}: {said}"
        else:
            why = (f"cell timeout {cell_timeout} s" if isinstance(e, CellTimeoutError) else
                   "stopped by a signal" if by_signal else f"{type(e).__name__}: {e}".strip(": "))
            took = time.perf_counter() - progress.t0
            after = "" if progress.index is None else f" after {took:.1f} s"
            status, error = "interrupted", f"interrupted: {progress.where()}{after} ({why})"
    finally:
        vars(loop).pop("add_signal_handler", None)
        vars(loop).pop("remove_signal_handler", None)
        kernel_said = _stop_kernel(client, km, folder, loop)
        log.close()
    seconds = time.perf_counter() - t0
    if status != "ok":
        partial = Path(partial_dir or Path(tempfile.gettempdir()) / "sglab-partial") / ipynb.name
        partial.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, partial)
        said = "" if by_signal or not kernel_said else f"\nthe kernel process wrote:\n{kernel_said}"
        error = _ANSI.sub("", error).rstrip() + f"; partial output in {partial}{said}"
    marker = read_mode(nb)
    # no marker: a notebook without GPU parts, or one stopped before it said (the mode asked)
    mode = marker["mode"] if marker else str((params or {}).get("MODE", "cpu"))
    signum = (caught or [signal.SIGINT])[0] if by_signal else 0  # KeyboardInterrupt: SIGINT
    return Result(ipynb, status, mode, seconds, error, n_gpu if skip_gpu else 0, nb, started,
                  int(signum))
