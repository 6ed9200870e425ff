"""Runs on disk: a tidy CSV (``experiment, variant, <parameters>, metric, value, unit``), a JSON
manifest and sidecars per run under ``data/runs/`` (live) or ``data/recorded/``, read back as a
:class:`Run`; what a notebook section shows is a :class:`RunSet` (:class:`NoRun` when empty)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable


REQUIRED = ("variant", "metric", "value", "unit")


def repo_root() -> Path:
    """The checkout this package lives in, else $SGLAB_ROOT or the working directory."""
    here = Path(__file__).resolve().parents[3]
    if (here / "pyproject.toml").exists():
        return here
    return Path(os.environ.get("SGLAB_ROOT", Path.cwd()))


def data_dir(kind: str) -> Path:
    """``data/<kind>`` of the checkout, or of ``$SGLAB_DATA`` where that is set."""
    base = os.environ.get("SGLAB_DATA")
    return (Path(base) if base else repo_root() / "data") / kind


def tidy(experiment: str, rows: list[dict]):
    """A run's tidy frame from row dicts; other keys become columns between variant and metric."""
    import pandas as pd

    if not rows:
        raise ValueError("a run needs at least one row")
    for i, r in enumerate(rows):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"row {i} lacks {missing}: {r}")
    params = dict.fromkeys(k for r in rows for k in r if k not in (*REQUIRED, "experiment"))
    df = pd.DataFrame(rows)
    df["experiment"] = experiment
    return df[["experiment", "variant", *params, "metric", "value", "unit"]]


def _git_sha(root: Path) -> str | None:
    """HEAD of the checkout (+dirty), or $SGLAB_GIT_SHA (a tree copied without its .git)."""
    if os.environ.get("SGLAB_GIT_SHA"):
        return os.environ["SGLAB_GIT_SHA"]

    def git(*args) -> str:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        sha = git("rev-parse", "HEAD")
        dirty = sha and git("status", "--porcelain", "--untracked-files=no")
    except Exception:
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


def machine_manifest(gpu_count: int | None = None) -> dict:
    """This machine's GPUs (``gpu_count``: those the run used, default all), driver, versions."""
    from sglab.core import hardware

    gpus = hardware.gpus() if hardware.has_cuda() else ()
    sw = hardware.software()
    names = sorted({g.name for g in gpus})
    return dict(gpu_name=" + ".join(names) or "cpu",
                gpu_count=len(gpus) if gpu_count is None else int(gpu_count),
                gpu_count_machine=len(gpus), gpu_memory_mib=gpus[0].memory_mib if gpus else None,
                driver=sw["driver"], cuda=sw["cuda"], torch=sw["torch"], python=sw["python"],
                platform=sys.platform)


def same_file(a, b) -> bool:
    """Whether runs ``a`` and ``b`` were read from one file, however spelt (no path: never)."""
    pa, pb = getattr(a, "path", None), getattr(b, "path", None)
    return bool(pa and pb) and Path(pa).resolve() == Path(pb).resolve()


def others(run, candidates: list) -> list:
    """``candidates`` less ``run`` itself (:func:`same_file`): a run is never its own reference."""
    return [c for c in candidates if not same_file(run, c)]


def run_stem(manifest: dict, when: datetime) -> str:
    """A recorded file's name: ``20261128T072311Z_nvidia-h100-80gb-hbm3-x1``."""
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", manifest["gpu_name"]).strip("-").lower() or "cpu"
    return f"{when.strftime('%Y%m%dT%H%M%SZ')}_{gpu}-x{manifest['gpu_count']}"


def _atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_run(df, *, experiment: str, method_version: int, params: dict, root: Path | None = None,
              gpu_count: int | None = None, extra: dict | None = None,
              sidecars: dict | None = None) -> Path:
    """Write ``df``, its ``sidecars`` and its manifest last, each renamed into place."""
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
        "experiment": experiment, "method_version": int(method_version),
        "created_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "git_sha": _git_sha(repo_root()),
        **machine_manifest(gpu_count), "params": params, "rows": int(len(df)), **(extra or {})
    }
    stem = run_stem(manifest, now)
    csv_path, json_path = folder / f"{stem}.csv", folder / f"{stem}.json"
    n = 1
    while csv_path.exists() or json_path.exists():
        n += 1
        csv_path, json_path = folder / f"{stem}-{n}.csv", folder / f"{stem}-{n}.json"
    for name, obj in (sidecars or {}).items():  # a DataFrame as gzipped CSV, a file copied
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise ValueError(f"sidecar names are lower-case words, got {name!r}")
        if hasattr(obj, "to_csv"):
            target = folder / f"{csv_path.stem}.{name}.csv.gz"
            data = gzip.compress(obj.to_csv(index=False).encode(), mtime=0)
        else:
            src = Path(obj)
            suffix = "".join(src.suffixes[-2:]) if src.suffix == ".gz" else src.suffix  # .json.gz
            target = folder / f"{csv_path.stem}.{name}{suffix}"
            data = src.read_bytes()
        _atomic(target, data)
        manifest.setdefault("sidecars", {})[name] = target.name
    _atomic(csv_path, df.to_csv(index=False).encode())
    _atomic(json_path, json.dumps(manifest, indent=2, sort_keys=True, default=str).encode())
    return csv_path


def measure(fn: Callable[[], Any], *, experiment: str, method_version: int, params: dict,
            root: Path | None = None, gpu_count: int | None = None) -> tuple[Path, int]:
    """Write what ``fn`` returns (:func:`write_run`) with its times: the CSV path and rows."""
    from sglab.core import timing

    timing.take()
    t0 = time.perf_counter()
    with _scratch():
        out = fn()
        out = out if isinstance(out, Measured) else Measured(out)
        took = round(time.perf_counter() - t0, 1)
        extra = {**out.extra, "duration_s": took, "phases_s": timing.take()}
        return write_run(out.df, experiment=experiment, method_version=method_version,
                         params=params, root=root, gpu_count=gpu_count, extra=extra,
                         sidecars=out.sidecars), len(out.df)


def shared_caches() -> dict:
    """What stays in the shared temporary folder when a run's own is elsewhere (torch's cache)."""
    import getpass

    folder = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder)}


@contextmanager
def _scratch():
    """A new temporary folder for this process and its children, removed at the end."""
    import multiprocessing.util

    multiprocessing.util.get_temp_dir()
    saved = {k: os.environ.get(k) for k in ("TMPDIR", *shared_caches())}
    before = tempfile.tempdir
    for k, v in shared_caches().items():
        os.environ.setdefault(k, v)
    folder = tempfile.mkdtemp(prefix="sglab-measure-")
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = before
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Measured:
    """What ``run`` may return instead of a bare frame: it, its sidecars, extra manifest fields."""

    df: Any
    sidecars: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


@dataclass
class Manifest:
    """A run's JSON manifest, typed (defaults where a run lacks a field; ``raw``: as recorded)."""

    experiment: str = ""
    method_version: int = 1
    created_utc: str = ""
    git_sha: str | None = None
    gpu_name: str = "?"
    gpu_count: int = 0
    gpu_count_machine: int = 0
    gpu_memory_mib: int | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    python: str | None = None
    platform: str | None = None
    params: dict = field(default_factory=dict)
    rows: int | None = None
    sidecars: dict = field(default_factory=dict)
    phases_s: dict = field(default_factory=dict)
    # real engines (``sglab engine``)
    engine_runs: list = field(default_factory=list)
    releases: list = field(default_factory=list)
    host_launch_us: dict = field(default_factory=dict)
    partial: dict | None = None
    merged_from: list = field(default_factory=list)
    merged_span: dict = field(default_factory=dict)  # a merged run's GPU counts and first/last day
    sglang: dict = field(default_factory=dict)
    sglang_home: str = ""
    # profiler tables and the workbook's own timings
    kernel_table: dict = field(default_factory=dict)
    eager_kernels: dict = field(default_factory=dict)
    notebooks: list = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, data: dict) -> "Manifest":
        known = {f.name for f in fields(cls)} - {"raw"}
        given = {k: v for k, v in data.items() if k in known and v is not None}
        if "method_version" in given:
            given["method_version"] = int(given["method_version"])
        # an engine entry's TP size, from its server arguments where an older run did not record it
        for e in [*given.get("engine_runs", []), *given.get("params", {}).get("specs", [])]:
            if isinstance(e, dict) and "tp" not in e:
                e["tp"] = tp_of(e.get("server_args") or ())
        return cls(**given, raw=dict(data))

    @property
    def gpu(self) -> str:
        """"H100", "H200", ... ("NVIDIA H100 80GB HBM3" -> "H100")."""
        return gpu_short(self.gpu_name)

    @property
    def date(self) -> str:
        return self.created_utc[:10]

    @property
    def label(self) -> str:
        """The GPU, how many, and the day: ``NVIDIA H200 ×1, 2026-11-29``."""
        return f"{self.gpu_name} ×{self.gpu_count}, {self.date}"

    @property
    def tp(self) -> int:
        """The TP size: ``tp_size`` or ``world_size``, else the engine's, else the GPU count."""
        if size := self.params.get("tp_size") or self.params.get("world_size"):
            return int(size)
        specs = [s["tp"] for s in self.params.get("specs") or []]
        return max(specs) if specs else int(self.gpu_count or 1)


def tp_of(argv) -> int:
    """The TP size SGLang server arguments ask for (``--tp-size 4``, ``--tp=4``; else 1)."""
    argv = list(argv)
    for i, a in enumerate(argv):
        key, eq, val = str(a).partition("=")
        if key in ("--tp-size", "--tp", "--tensor-parallel-size"):
            got = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            return int(got) if got else 1
    return 1


@dataclass
class Run:
    """One run: its tidy frame, its manifest and where it lies."""

    df: Any
    manifest: Manifest
    path: Path
    live: bool = False
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if isinstance(self.manifest, dict):
            self.manifest = Manifest.of(self.manifest)

    def memo(self, key: str, make: Callable[[], Any], *, shared: bool = False):
        """``make()`` once per run and key, a deep copy to each caller (``shared``: the one)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key] if shared else copy.deepcopy(self._memo[key])

    @property
    def label(self) -> str:
        return self.manifest.label

    def sidecar(self, name: str):
        """A sidecar: a DataFrame for a ``.csv.gz`` (empty text ``""``), else its path; None."""
        fname = self.manifest.sidecars.get(name)
        if not fname or not (path := self.path.parent / fname).exists():
            return None
        if fname.endswith(".csv.gz"):
            import pandas as pd

            df = pd.read_csv(path)  # an empty text cell as NaN: groupby would drop its rows
            text = df.select_dtypes(include=["object", "string"]).columns
            df[text] = df[text].fillna("")
            return df
        return path


@dataclass
class RunSet:
    """The runs a notebook section shows and those recorded on other GPU models (``elsewhere``)."""

    shown: list = field(default_factory=list)
    elsewhere: list = field(default_factory=list)
    experiment: str = ""
    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.shown)

    def __iter__(self):
        return iter(self.shown)

    def __len__(self) -> int:
        return len(self.shown)

    @property
    def first(self) -> Run:
        return self.shown[0]

    @property
    def line(self) -> str:
        """The line a section shows where there is no run."""
        return f"no GPU run to show ({self.reason or 'none recorded'})"

    def every(self) -> list:
        """The shown runs and those elsewhere, by GPU model, then oldest first."""
        return sorted([*self.shown, *self.elsewhere], key=lambda r:
                      (r.manifest.gpu, r.manifest.created_utc))

    def __str__(self) -> str:
        return self.line if not self else "; ".join(r.label for r in self.shown)

    def _repr_markdown_(self) -> str:
        return f"*{self.line}*" if not self else str(self)


class NoRun(RunSet):
    """A section's runs where there are none: falsy, and it says why wherever it is shown."""

    def __init__(self, experiment: str, reason: str):
        super().__init__([], [], experiment, reason)


def gpu_short(source) -> str:
    """"H100", "H200", ... from a Run, a manifest or a GPU name ("NVIDIA H100 80GB HBM3")."""
    m = getattr(source, "manifest", source)
    name = m.get("gpu_name", "?") if isinstance(m, dict) else getattr(m, "gpu_name", m)
    words = str(name).replace("NVIDIA", "").split()
    return words[0] if words else "?"


def newest_by(runs_: list, key) -> dict:
    """``{key(run): newest run}`` ordered by key, e.g. one run per GPU model (``key=gpu_short``)."""
    by_key = {key(r): r for r in sorted(runs_, key=lambda r: r.manifest.created_utc)}
    return dict(sorted(by_key.items()))


def newest(runs_: list, key, *, reverse: bool = False) -> list:
    """The newest run per ``key(run)``, ordered by key (largest first with ``reverse``)."""
    return list(newest_by(runs_, key).values())[::-1 if reverse else 1]


def read_run(csv_path: Path | str, *, live: bool = False) -> Run:
    import pandas as pd

    csv_path = Path(csv_path)
    manifest = json.loads(csv_path.with_suffix(".json").read_text())
    return Run(pd.read_csv(csv_path), manifest, csv_path, live=live)


def list_runs(experiment: str, *, kind: str = "recorded", root: Path | None = None) -> list[Path]:
    """CSV paths of complete runs (a CSV with its manifest), oldest first."""
    folder = (root or data_dir(kind)) / experiment
    csvs = [p for p in folder.glob("*.csv") if not p.name.startswith(".")]
    found = [p for p in csvs if p.with_suffix(".json").exists()]

    def key(p: Path):
        created = ""
        with suppress(OSError, ValueError):
            created = str(json.loads(p.with_suffix(".json").read_text()).get("created_utc", ""))
        return created, p.stat().st_mtime_ns, p.name

    return sorted(found, key=key)


def load_all_recorded(experiment: str, *, root: Path | None = None) -> list[Run]:
    return [read_run(p) for p in list_runs(experiment, root=root)]


def promote(csv_path: Path | str, *, root: Path | None = None, force: bool = False) -> Path:
    """Copy a live run and its files into ``data/recorded/<experiment>/`` (replace: ``force``)."""
    run = read_run(csv_path)
    dest = (root or data_dir("recorded")) / run.manifest.experiment
    src = Path(csv_path)
    names = [src.name, src.with_suffix(".json").name, *run.manifest.sidecars.values()]
    if (dest / src.name).resolve() == src.resolve():
        raise ValueError(f"{src} is the record's own file: nothing to publish")
    taken = [dest / n for n in names if (dest / n).exists()]
    if taken and not force:
        raise FileExistsError(f"{taken[0]} is already recorded")
    dest.mkdir(parents=True, exist_ok=True)
    for fname in [*names[2:], *names[:2]]:  # the sidecars, the table, the manifest last
        if (src.parent / fname).exists():
            shutil.copy2(src.parent / fname, dest / fname)
    return dest / src.name
