"""Notebook plumbing: pairing checks between ``NN_topic.py`` (jupytext percent, the reviewed source) and
``NN_topic.ipynb`` (committed without outputs), and headless execution through nbclient."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

GPU_TAG = "needs-gpu"
PARAM_TAG = "parameters"


def notebooks_dir() -> Path:
    from .runs import repo_root

    return repo_root() / "notebooks"


def all_notebooks() -> list[Path]:
    return sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for c in nb.cells:
        tags = tuple(sorted(c.get("metadata", {}).get("tags", [])))
        out.append((c.cell_type, c.source.strip(), tags))
    return out


def check_pair(ipynb: Path) -> list[str]:
    """Problems with one notebook: outputs committed, execution counts, missing or out-of-sync .py."""
    import jupytext
    import nbformat

    problems = []
    nb = nbformat.read(ipynb, as_version=4)
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None):
            problems.append(f"{ipynb.name}: cell {i} has outputs or an execution count (commit it clean)")
    py = ipynb.with_suffix(".py")
    if not py.exists():
        return problems + [f"{ipynb.name}: no paired {py.name}"]
    if _cells(jupytext.read(py)) != _cells(nb):
        problems.append(f"{ipynb.name} differs from {py.name}: run `sglab sync` (the .py is the source)")
    return problems


def sync(py: Path) -> Path:
    """Write ``py``'s paired .ipynb (no outputs) from the .py source."""
    import jupytext

    nb = jupytext.read(py)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
    target = py.with_suffix(".ipynb")
    jupytext.write(nb, target, fmt="ipynb")
    return target


def inject_parameters(nb, params: dict) -> None:
    """Insert a cell assigning ``params`` right after the cell tagged ``parameters`` (papermill's convention)."""
    import nbformat

    if not params:
        return
    src = "# injected parameters\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})
    idx = next((i for i, c in enumerate(nb.cells) if PARAM_TAG in c.get("metadata", {}).get("tags", [])), -1)
    nb.cells.insert(idx + 1, cell)


@dataclass
class Result:
    path: Path
    status: str  # "ok" | "failed"
    mode: str  # "live" | "recorded" | "cpu" | "?"
    seconds: float
    error: str = ""
    skipped_gpu_cells: int = 0
    nb: object = field(default=None, repr=False)
    started: float | None = None  # time.time() when execution began (the report finds the live runs it wrote)


def execute(ipynb: Path, *, cell_timeout: int = 900, skip_gpu: bool | None = None, params: dict | None = None,
            kernel_name: str = "python3") -> Result:
    """Execute a notebook headless in its own folder. Cells tagged ``needs-gpu`` are skipped when there is no
    CUDA (or when ``skip_gpu`` says so). Never raises for a failing cell: the result carries the error and the
    partially executed notebook."""
    import nbclient
    import nbformat

    from . import hardware
    from .notebook import read_mode

    if skip_gpu is None:
        skip_gpu = not hardware.has_cuda()
    nb = nbformat.read(ipynb, as_version=4)
    inject_parameters(nb, params or {})
    n_gpu = sum(1 for c in nb.cells if GPU_TAG in c.get("metadata", {}).get("tags", []))
    client = nbclient.NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(ipynb.parent)}},
                                     skip_cells_with_tag=GPU_TAG if skip_gpu else "skip-execution")
    started, t0 = time.time(), time.perf_counter()
    status, error = "ok", ""
    try:
        client.execute()
    except Exception as e:  # CellExecutionError, timeouts, dead kernels
        status, error = "failed", f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    marker = read_mode(nb)
    mode = marker["mode"] if marker else "cpu"
    return Result(ipynb, status, mode, seconds, error, n_gpu if skip_gpu else 0, nb, started)


def outputs_text(nb) -> str:
    """All text outputs of an executed notebook, cell by cell (for failure messages)."""
    parts = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        for out in c.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(f"[cell {i} {out.get('name')}] {out.get('text', '')}")
            elif out.get("output_type") == "error":
                parts.append(f"[cell {i} error] {out.get('ename')}: {out.get('evalue')}\n" +
                             "\n".join(out.get("traceback", [])))
            elif "text/plain" in out.get("data", {}):
                parts.append(f"[cell {i} result] {out['data']['text/plain']}")
    return "\n".join(parts)
