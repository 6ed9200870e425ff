"""Every SGLang release from 0.5.10 on, read from its released wheel: which state is each fix in? A
wheel is downloaded once (never installed) into ``.sglang/wheels/``; the result is committed as
``data/upstream/releases.csv``, which the notebooks and their timeline figures read."""

from __future__ import annotations

import functools
import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from sglab.sglang.releases import parse_version
from sglab.sglang.upstream import RELEASE_STATES, classify, data_dir


PACKAGE = "sglang"
FIRST = "0.5.10"
META = ("version", "wheel", "sha256", "build_date")
PIP_TAGS = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64")


class NoNetwork(RuntimeError):
    """pip could not reach the package index (or is missing), in one line."""


class NoSuchRelease(ValueError):
    """The package index has no such SGLang release."""


def cache_dir() -> Path:
    from sglab.core import runs

    return runs.repo_root() / ".sglang" / "wheels"


def table_path() -> Path:
    return data_dir() / "releases.csv"


def columns(fixes) -> list[str]:
    """The CSV's columns: the wheel's facts, then ``<fix>`` and ``<fix>_reason`` per fix."""
    names = [f if isinstance(f, str) else f.name for f in fixes]
    return [*META, *(c for fix in names for c in (fix, f"{fix}_reason"))]


def fix_names(frame) -> list[str]:
    """The fixes a release table has columns for, in its order."""
    return [c for c in frame.columns if f"{c}_reason" in frame.columns]


def select(versions) -> list[str]:
    """Final releases from :data:`FIRST` on, sorted; pre-releases (rc, a, b, dev) are skipped."""
    out = set()
    for v in versions:
        with suppress(ValueError):
            if parse_version(v) >= parse_version(FIRST):
                out.add(v)
    return sorted(out, key=parse_version)


def _pip(args: list[str], timeout: float) -> str:
    try:
        out = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NoNetwork(f"pip {args[0]}: {type(e).__name__}: {e}".splitlines()[0]) from None
    if out.returncode != 0:
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("ERROR")
                 ] or out.stderr.splitlines() or ["?"]
        if "No matching distribution found" in out.stderr:
            raise NoSuchRelease(lines[-1].removeprefix("ERROR: ").strip())
        raise NoNetwork(f"pip {args[0]} failed: {lines[-1].strip()}")
    return out.stdout


def list_versions() -> list[str]:
    """The package index's releases of SGLang (``pip index versions``), from :data:`FIRST` on."""
    text = _pip(["index", "versions", PACKAGE], timeout=120)
    m = re.search(r"Available versions:\s*(.+)", text)
    if not m:
        raise NoNetwork("pip index versions printed no 'Available versions' line")
    return select(v.strip() for v in m.group(1).split(","))


def download(version: str, dest: Path) -> Path:
    """Fetch the release's wheel (nothing installed) into ``dest``; its path."""
    dest.mkdir(parents=True, exist_ok=True)
    _pip(["download", "--no-deps", *PIP_TAGS, "-d",
          str(dest), "-q", f"{PACKAGE}=={version}"], timeout=600)
    path = cached(version, dest)
    if path is None:
        raise NoNetwork(f"pip download {PACKAGE}=={version} left no wheel in {dest}")
    return path


def cached(version: str, dest: Path) -> Path | None:
    """The cached wheel of exactly ``version`` (the universal one first, then cp312), or None."""
    found = Path(dest).glob(f"{PACKAGE}-{version}-*.whl")
    return min(
        found, default=None, key=lambda p: (0 if "-py3-none-any" in p.name else 1
                                            if "-cp312-" in p.name else 2, p.name))


@functools.lru_cache(maxsize=None)
def _opened(path: Path, mtime_ns: int) -> tuple[zipfile.ZipFile, frozenset]:
    """A wheel's zip and its names, read once per process (a wheel's directory takes ~70 ms)."""
    z = zipfile.ZipFile(path)
    return z, frozenset(z.namelist())


def opened(path: Path) -> tuple[zipfile.ZipFile, frozenset]:
    path = Path(path).resolve()
    return _opened(path, path.stat().st_mtime_ns)


def reader(path: Path):
    """``read(relpath)`` inside a wheel: the text of ``sglang/<relpath>``, or None."""
    z, names = opened(path)

    def read(relpath: str) -> str | None:
        name = f"{PACKAGE}/{relpath}"
        return z.read(name).decode("utf-8", errors="replace") if name in names else None

    return read


def wheel_facts(path: Path) -> dict:
    """File name, sha256, and build date (the newest zip timestamp; wheels carry no commit id)."""
    path = Path(path)
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256")
    newest = max(i.date_time for i in opened(path)[0].infolist())
    return dict(wheel=path.name, sha256=digest.hexdigest(),
                build_date=datetime(*newest).isoformat())


def classify_wheel(version: str, path: Path, fixes) -> dict:
    """One row of the release table: the wheel's facts, then each fix's state and reason."""
    row = {"version": version, **wheel_facts(path)}
    for fix, v in classify(fixes, reader(path)).items():
        row[fix], row[f"{fix}_reason"] = v.status, v.detail
    return row


def load_table(path: Path | None = None, fixes=None):
    """The committed release table (strings), oldest first, with a column per fix of ``fixes``."""
    import pandas as pd

    path = Path(path or table_path())
    if not path.exists():
        raise FileNotFoundError(f"no release table at {path} (sglab upstream --releases writes it)")
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in columns(fixes or []) if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    return df.sort_values("version", key=lambda s: s.map(parse_version)).reset_index(drop=True)


def write_table(frame, path: Path | None = None) -> Path:
    """Write the table atomically (temporary file, then rename), in :func:`columns` order."""
    order = columns(fix_names(frame))
    path = Path(path or table_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    frame[order].to_csv(tmp, index=False, lineterminator="\n")
    tmp.replace(path)
    return path


@dataclass
class Timeline:
    """Rows (plus ``source``: "wheel" or "table"), notes, and whether it is committable."""

    frame: object
    notes: list[str]
    complete: bool
    wheels: dict  # version -> cached wheel path, for the hunks
    unknown: list  # asked for, but the package index has no such release


def timeline(fixes, versions=None, *, offline: bool = False, cache: Path | None = None,
             table: Path | None = None, lister=list_versions, fetch=download,
             progress: bool = True) -> Timeline:
    """Classify ``versions`` (None: all from :data:`FIRST`), each from its wheel, else the table."""
    import pandas as pd
    from tqdm.auto import tqdm

    cache = Path(cache or cache_dir())
    notes: list[str] = []
    try:
        committed = {r["version"]: dict(r) for r in load_table(table, fixes).to_dict("records")}
    except (FileNotFoundError, ValueError) as e:
        notes.append(f"committed table not usable: {e}")
        committed = {}
    # the releases, whether the package index listed them, whether the network may be tried
    wanted, from_index, network = sorted(set(versions or ()), key=parse_version), False, not offline
    if offline:
        notes.append("offline: nothing downloaded")
    elif not versions:
        try:
            wanted, from_index = lister(), True
            notes.append(f"release list: the package index ({len(wanted)} releases from {FIRST})")
        except NoNetwork as e:
            network = False
            notes.append(f"no network ({e})")
    if not wanted:
        have = {p.name.split("-")[1] for p in cache.glob(f"{PACKAGE}-*.whl")}
        wanted = select(set(committed) | have)
        notes.append(f"release list: committed table + cached wheels ({len(wanted)} releases; "
                     f"newer releases on the index are not seen without network)")
    rows, wheels = [], {}
    fetched, from_table, missing, unknown = [], [], [], []
    for v in tqdm(wanted, desc="SGLang wheels", unit="release", disable=not progress, leave=False):
        path = cached(v, cache)
        if path is None and network:
            try:
                path = fetch(v, cache)
                fetched.append(v)
            except NoSuchRelease:
                unknown.append(v)
                continue
            except NoNetwork as e:
                network = False
                notes.append(f"no network ({e})")
        if path is not None:
            wheels[v] = path
            rows.append({**classify_wheel(v, path, fixes), "source": "wheel"})
        elif v in committed:
            rows.append({**committed[v], "source": "table"})
            from_table.append(v)
        else:
            missing.append(v)
    n_wheel = len(rows) - len(from_table)
    notes.append(f"classified from wheels: {n_wheel} ({len(fetched)} downloaded now, "
                 f"{n_wheel - len(fetched)} from the cache {cache})")
    for said, vs in (("taken from the committed table (no wheel here)",
                      from_table), ("not shown (no wheel and not in the committed table)", missing),
                     ("no such SGLang release on the package index", unknown)):
        notes += [f"{said}: {', '.join(vs)}"] if vs else []
    frame = pd.DataFrame(rows, columns=[*columns(fixes), "source"])
    complete = versions is None and from_index and not from_table and not missing
    return Timeline(frame, notes, complete, wheels, unknown)


def summary(frame) -> "object":
    """The table as a person reads it: one row per release, one state per fix."""
    return frame[["version", "build_date",
                  *fix_names(frame)]].assign(build_date=frame["build_date"].str[:10])


def changes(frame) -> list[tuple[str, str, str, str]]:
    """``(fix, version, state, reason)`` wherever a fix's state or reason changes."""
    out = []
    for fix in fix_names(frame):
        cols = ["version", fix, f"{fix}_reason"]
        moved = (frame[cols[1:]] != frame[cols[1:]].shift()).any(axis=1)
        out += [(fix, *r) for r in frame.loc[moved, cols].itertuples(index=False)]
    return out


def timeline_row(fix: str, frame=None):
    """One fix across the releases: ``version, build_date, state, reason``."""
    frame = load_table() if frame is None else frame
    if fix not in fix_names(frame):
        raise KeyError(f"no fix {fix!r} in the release table; known: {fix_names(frame)}")
    cols = {
        "version": "version", "build_date": "build_date", fix: "state", f"{fix}_reason": "reason"
    }
    return frame[list(cols)].rename(columns=cols).reset_index(drop=True)


STATE_COLOURS = {
    "absent": "#d5d8dc", "before": "#c0392b", "pr-era": "#2471a3", "changed": "#229954",
    "regressed": "#d68910", "unknown": "#ffffff"
}
assert set(STATE_COLOURS) == set(RELEASE_STATES)


def _finish(ax, frame, **tick):
    """The releases as ticks, a bare frame, the caption; the figure."""
    ax.set_xticks([x + 0.47 for x in range(len(frame))], frame["version"], rotation=60, ha="right",
                  **tick)
    ax.grid(False)
    ax.tick_params(length=0)
    ax.spines[["left", "bottom"]].set_visible(False)
    first, last = frame["build_date"].iloc[0][:10], frame["build_date"].iloc[-1][:10]
    text = (f"read from the released SGLang wheels {frame['version'].iloc[0]} (built {first}) to "
            f"{frame['version'].iloc[-1]} (built {last}) by sglab.sglang.upstream")
    ax.figure.text(0.01, -0.02, text, ha="left", va="top", fontsize=8, color="#555555")
    return ax.figure


def timeline_figure(frame=None):
    """Releases left to right, one row per fix, each cell coloured by its state."""
    from matplotlib.patches import Patch, Rectangle

    from sglab.core import plots

    frame = (load_table() if frame is None else frame).reset_index(drop=True)
    fixes = fix_names(frame)
    _, ax = plots.figure(width=max(7.0, 0.48 * len(frame) + 2.5), height=0.42 * len(fixes) + 1.9)
    for y, fix in enumerate(fixes):
        for x, state in enumerate(frame[fix]):
            ax.add_patch(
                Rectangle((x, y), 0.94, 0.86, facecolor=STATE_COLOURS.get(state, "#ffffff"),
                          edgecolor="#7f8c8d" if state == "unknown" else "none",
                          hatch="//" if state == "unknown" else None))
    ax.set_xlim(-0.1, len(frame))
    ax.set_ylim(len(fixes), -0.15)
    ax.set_yticks([y + 0.43 for y in range(len(fixes))], fixes)
    ax.set_title("Which SGLang release has which fix")
    present = [s for s in STATE_COLOURS if s in set(frame[fixes].to_numpy().ravel())]
    ax.legend(
        handles=[Patch(facecolor=STATE_COLOURS[s], edgecolor="#7f8c8d", label=s) for s in present],
        loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=len(present), frameon=False)
    return _finish(ax, frame)


def timeline_row_figure(fix, frame=None):
    """One fix's record across the releases: a coloured strip, each run of equal states labelled."""
    from sglab.core import plots

    frame = (load_table() if frame is None else frame).reset_index(drop=True)
    title, fix = fix.title, fix.name
    if fix not in frame.columns:
        raise KeyError(f"no column {fix!r} in the release table; fixes: {fix_names(frame)}")
    _, ax = plots.figure(width=max(7.0, 0.45 * len(frame) + 1.5), height=1.9)
    states = list(frame[fix])
    ax.bar(range(len(states)), [1] * len(states), width=0.94, align="edge",
           color=[STATE_COLOURS.get(s, "#ffffff") for s in states], edgecolor="none")
    start = 0
    for i in range(1, len(states) + 1):
        if i == len(states) or states[i] != states[start]:
            ax.text((start + i) / 2, 0.5, states[start], ha="center", va="center", fontsize=9,
                    color="black" if states[start] in ("absent", "unknown") else "white",
                    fontweight="bold")
            start = i
    ax.set_xlim(0, len(states))
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_title(f"{fix}: {title}" if title else fix, fontsize=10)
    return _finish(ax, frame, fontsize=8)
