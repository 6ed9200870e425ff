"""Runs on disk: a tidy CSV plus a JSON manifest per run.

Live runs go to ``data/runs/<experiment>/`` (git-ignored); reference runs that readers without GPUs
see live in ``data/recorded/<experiment>/`` (committed). File names are ``<UTC time>_<gpu>.csv`` and
``.json``.

Tidy means one measurement per row: ``experiment, variant, <parameter columns>, metric, value,
unit``.

A run may carry *sidecars*: tables that are not measurements per row (a profiler event table, a
memory time series) or files (a Perfetto trace), stored next to it as ``<stem>.<name>.csv.gz`` or
``<stem>.<name><suffix>`` and listed in the manifest's ``sidecars``; :meth:`Run.sidecar` reads them
back.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable


REQUIRED = ("variant", "metric", "value", "unit")
MANIFEST_KEYS = ("experiment", "method_version", "created_utc", "git_sha", "gpu_name", "gpu_count",
                 "driver", "cuda", "torch", "python", "params")


def repo_root() -> Path:
    """The checkout this package lives in (lib/sglab/ → repo), or the working directory as a
    fallback."""
    here = Path(__file__).resolve().parents[3]
    if (here / "pyproject.toml").exists():
        return here
    return Path(os.environ.get("SGLAB_ROOT", Path.cwd()))


def data_dir(kind: str) -> Path:
    """``data/<kind>`` of the checkout, or ``$SGLAB_DATA/<kind>`` when that is set (tests, other
    layouts)."""
    if kind not in ("runs", "recorded", "traces"):
        raise ValueError(f"unknown data folder {kind!r}")
    base = os.environ.get("SGLAB_DATA")
    return (Path(base) if base else repo_root() / "data") / kind


def tidy(experiment: str, rows: list[dict]):
    """Build the tidy frame of a run from row dicts, checking the required keys.

    Parameter columns (any other keys) come between ``variant`` and ``metric``, in first-seen order.
    """
    import pandas as pd

    if not rows:
        raise ValueError("a run needs at least one row")
    params: list[str] = []
    for i, r in enumerate(rows):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"row {i} lacks {missing}: {r}")
        for k in r:
            if k not in REQUIRED and k != "experiment" and k not in params:
                params.append(k)
    df = pd.DataFrame(rows)
    df["experiment"] = experiment
    return df[["experiment", "variant", *params, "metric", "value", "unit"]]


def _git_sha(root: Path) -> str | None:
    """HEAD of the checkout (+dirty), or $SGLAB_GIT_SHA when the tree was copied without its
    .git."""
    if os.environ.get("SGLAB_GIT_SHA"):
        return os.environ["SGLAB_GIT_SHA"]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except Exception:
        return None
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=10).stdout.strip()
    return sha + ("+dirty" if dirty else "")


def machine_manifest(gpu_count: int | None = None) -> dict:
    """GPU model and count, driver, CUDA, torch and Python of this machine.

    ``gpu_count`` is how many GPUs the run used (default: all visible); the machine's total goes to
    ``gpu_count_machine``.
    """
    from sglab.core import hardware

    gpus = hardware.gpus() if hardware.has_cuda() else ()
    sw = hardware.software()
    names = sorted({g.name for g in gpus})
    return {
        "gpu_name": names[0] if len(names) == 1 else (" + ".join(names) if names else "cpu"),
        "gpu_count": len(gpus) if gpu_count is None else int(gpu_count),
        "gpu_count_machine": len(gpus),
        "gpu_memory_mib": gpus[0].memory_mib if gpus else None,
        "driver": sw["driver"],
        "cuda": sw["cuda"],
        "torch": sw["torch"],
        "python": sw["python"],
        "platform": sys.platform,
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "cpu"


def same_file(a, b) -> bool:
    """Whether runs ``a`` and ``b`` were read from one file, however either path is spelt (relative
    or absolute); a run without a path is the same as none."""
    pa, pb = getattr(a, "path", None), getattr(b, "path", None)
    return bool(pa and pb) and Path(pa).resolve() == Path(pb).resolve()


def others(run, candidates: list) -> list:
    """``candidates`` less ``run`` itself (:func:`same_file`): a run is never its own reference."""
    return [c for c in candidates if not same_file(run, c)]


def run_stem(manifest: dict, when: datetime) -> str:
    """A recorded file's name without suffix: ``20261128T072311Z_nvidia-h100-80gb-hbm3-x1``."""
    return (f"{when.strftime('%Y%m%dT%H%M%SZ')}_{_slug(manifest['gpu_name'])}"
            f"-x{manifest['gpu_count']}")


def _atomic(folder: Path, path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_sidecars(folder: Path, stem: str, sidecars: dict) -> dict:
    """Write each sidecar (a DataFrame -> gzipped CSV, or an existing file -> copied); return name
    -> file name."""
    import gzip
    import shutil

    names = {}
    for name, obj in (sidecars or {}).items():
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise ValueError(f"sidecar names are lower-case words, got {name!r}")
        if hasattr(obj, "to_csv"):
            target = folder / f"{stem}.{name}.csv.gz"

            def write(f, obj=obj):
                with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
                    gz.write(obj.to_csv(index=False).encode())
        else:
            src = Path(obj)
            # x.json.gz keeps .json.gz
            suffix = "".join(src.suffixes[-2:]) if src.suffix == ".gz" else src.suffix
            target = folder / f"{stem}.{name}{suffix}"

            def write(f, src=src):
                with open(src, "rb") as s:
                    shutil.copyfileobj(s, f)

        _atomic(folder, target, write)
        names[name] = target.name
    return names


def write_run(df, *, experiment: str, method_version: int, params: dict, root: Path | None = None,
              gpu_count: int | None = None, extra: dict | None = None,
              sidecars: dict | None = None) -> Path:
    """Write ``df`` and its manifest atomically; return the CSV path.

    Every file is written to a temporary name in the target folder and renamed into place, sidecars
    first and the manifest last, so a reader never sees half a run. ``sidecars``: ``{name: DataFrame
    or file path}``.
    """
    missing = [c for c in ("experiment", *REQUIRED) if c not in df.columns]
    if missing:
        raise ValueError(f"not a tidy run frame: missing columns {missing}")
    if set(df["experiment"]) != {experiment}:
        raise ValueError(f"frame holds experiments {sorted(set(df['experiment']))}, expected "
                         f"{experiment!r}")
    folder = (root or data_dir("runs")) / experiment
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc)
    manifest = {
        "experiment": experiment,
        "method_version": int(method_version),
        "created_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_sha": _git_sha(repo_root()),
        **machine_manifest(gpu_count),
        "params": params,
        "rows": int(len(df)),
        **(extra or {}),
    }
    stem = run_stem(manifest, now)
    csv_path, json_path = folder / f"{stem}.csv", folder / f"{stem}.json"
    n = 1
    while csv_path.exists() or json_path.exists():
        n += 1
        csv_path, json_path = folder / f"{stem}-{n}.csv", folder / f"{stem}-{n}.json"
    if sidecars:
        manifest["sidecars"] = _write_sidecars(folder, csv_path.stem, sidecars)
    _atomic(folder, csv_path, lambda f: f.write(df.to_csv(index=False).encode()))
    _atomic(folder, json_path,
            lambda f: f.write(json.dumps(manifest, indent=2, sort_keys=True, default=str).encode()))
    return csv_path


@dataclass
class Measured:
    """What an experiment's ``run`` may return instead of a bare frame: the tidy frame, its sidecars
    (tables or files stored next to the run) and extra manifest fields (e.g. the SGLang releases and
    shims used)."""

    df: Any
    sidecars: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, result) -> "Measured":
        return result if isinstance(result, cls) else cls(result)


@dataclass
class Run:
    """One run: its tidy frame, its manifest and where it lies. ``shown`` is the set of runs a
    notebook shows with it (e.g. the newest of each GPU model), this one first."""

    df: Any
    manifest: dict
    path: Path
    live: bool = False
    shown: list = field(default_factory=list, repr=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if not self.shown:
            self.shown = [self]

    def memo(self, key: str, make: Callable[[], Any]):
        """``make()``, computed once per run and key: a notebook's claims, tables and figures derive
        the same table from one run many times. Each caller gets a deep copy, so that what one
        changes stays its own."""
        if key not in self._memo:
            self._memo[key] = make()
        return copy.deepcopy(self._memo[key])

    @property
    def label(self) -> str:
        m = self.manifest
        date = str(m.get("created_utc", ""))[:10]
        return f"{m.get('gpu_name', '?')} ×{m.get('gpu_count', '?')}, {date}"

    def sidecar(self, name: str):
        """A sidecar of this run: a DataFrame for a ``.csv.gz`` table, the path for a file, None if
        absent."""
        fname = (self.manifest.get("sidecars") or {}).get(name)
        if not fname:
            return None
        path = self.path.parent / fname
        if not path.exists():
            return None
        if fname.endswith(".csv.gz"):
            import pandas as pd

            df = pd.read_csv(path)
            # an empty label reads back as NaN (object dtype in pandas 2, the string dtype in pandas
            # 3): keep it "", or groupby drops its rows
            for col, dtype in df.dtypes.items():
                if dtype == object or pd.api.types.is_string_dtype(dtype):
                    df[col] = df[col].fillna("")
            return df
        return path


@dataclass(frozen=True)
class NoRun:
    """What a notebook holds where it has no GPU run to show: falsy, and it says why wherever it is
    shown."""

    experiment: str
    reason: str

    def __bool__(self) -> bool:
        return False

    @property
    def shown(self) -> list:
        return []

    @property
    def line(self) -> str:
        return f"no GPU run to show ({self.reason})"

    def __str__(self) -> str:
        return self.line

    def _repr_markdown_(self) -> str:
        return f"*{self.line}*"


def gpu_short(source) -> str:
    """"H100", "H200", ... from a Run, a manifest or a GPU name ("NVIDIA H100 80GB HBM3" ->
    "H100")."""
    m = getattr(source, "manifest", source)
    name = m.get("gpu_name", "?") if isinstance(m, dict) else str(m)
    words = str(name).replace("NVIDIA", "").split()
    return words[0] if words else "?"


def newest_by(runs_: list, key) -> dict:
    """``{key(run): newest run}`` (newest by ``created_utc``), ordered by key: e.g. one run per GPU
    model with ``key=gpu_short``, or one per world size with ``key=lambda r:
    r.manifest["params"]["world_size"]``."""
    best: dict = {}
    for r in sorted(runs_, key=lambda r: str(r.manifest.get("created_utc", ""))):
        best[key(r)] = r
    return dict(sorted(best.items()))


def read_run(csv_path: Path | str, *, live: bool = False) -> Run:
    import pandas as pd

    csv_path = Path(csv_path)
    manifest = json.loads(csv_path.with_suffix(".json").read_text())
    return Run(pd.read_csv(csv_path), manifest, csv_path, live=live)


def _matches(manifest: dict, where: dict) -> bool:
    for key, want in where.items():
        node: Any = manifest
        for part in key.split("__"):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        if node != want:
            return False
    return True


def list_runs(experiment: str, *, kind: str = "recorded", root: Path | None = None) -> list[Path]:
    """CSV paths of complete runs (a CSV with its manifest), oldest first."""
    folder = (root or data_dir(kind)) / experiment
    if not folder.is_dir():
        return []
    found = [
        p for p in folder.glob("*.csv")
        if not p.name.startswith(".") and p.with_suffix(".json").exists()
    ]

    def key(p: Path):
        try:
            created = json.loads(p.with_suffix(".json").read_text()).get("created_utc", "")
        except (OSError, ValueError):
            created = ""
        return (str(created), p.stat().st_mtime_ns, p.name)

    return sorted(found, key=key)


def load_recorded(experiment: str, *, root: Path | None = None, **where) -> Run | None:
    """The newest recorded run of ``experiment`` whose manifest matches ``where`` (``params__x=1``
    looks inside ``params``), or None."""
    for path in reversed(list_runs(experiment, root=root)):
        run = read_run(path)
        if _matches(run.manifest, where):
            return run
    return None


def load_all_recorded(experiment: str, *, root: Path | None = None) -> list[Run]:
    return [read_run(p) for p in list_runs(experiment, root=root)]


def promote(csv_path: Path | str, *, root: Path | None = None, force: bool = False) -> Path:
    """Copy a live run (CSV + manifest) into ``data/recorded/<experiment>/``; return the new CSV
    path. A file of the record is never replaced unless ``force`` (FileExistsError names it);
    ValueError for a run that is already the record's own file."""
    import shutil

    run = read_run(csv_path)
    dest = (root or data_dir("recorded")) / run.manifest["experiment"]
    src = Path(csv_path)
    sidecars = list((run.manifest.get("sidecars") or {}).values())
    names = [src.name, src.with_suffix(".json").name, *sidecars]
    if (dest / src.name).resolve() == src.resolve():
        raise ValueError(f"{src} is the record's own file: nothing to publish")
    taken = [dest / n for n in names if (dest / n).exists()]
    if taken and not force:
        raise FileExistsError(f"{taken[0]} is already recorded")
    dest.mkdir(parents=True, exist_ok=True)
    for fname in sidecars:
        if (src.parent / fname).exists():
            shutil.copy2(src.parent / fname, dest / fname)
    shutil.copy2(src, dest / src.name)
    shutil.copy2(src.with_suffix(".json"), dest / src.with_suffix(".json").name)
    return dest / src.name
