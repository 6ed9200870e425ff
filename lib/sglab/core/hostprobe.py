"""Where a launch-bound process's speed comes from on this host: the per-launch cost
(:class:`sglab.core.timing.Burst`) in fresh processes, on each CPU, beside a busy loop on each
other CPU (shared physical cores) and again every few seconds (the host's doing). Recorded probes
live in ``data/recorded/host_probe/``; the methods notebook (07) draws them.

    python -m sglab.core.hostprobe --out probe.json [--fresh 10] [--home 2] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

import psutil

from sglab.core import procs, runs
from sglab.core.timing import Burst


SYS_CPU = Path("/sys/devices/system/cpu")


def topology(root: Path = SYS_CPU) -> dict:
    """Per CPU the guest sees: its hyperthread siblings, core and package ids (None: not said)."""

    def read(p: Path):
        with suppress(OSError):
            return p.read_text().strip()

    names = dict(siblings="thread_siblings_list", core="core_id", package="physical_package_id")
    cpus = sorted(root.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:]))
    return {int(d.name[3:]): {k: read(d / "topology" / f) for k, f in names.items()} for d in cpus}


def burst_us(burst: Burst, repeat: int = 20, warmup: int = 3) -> float:
    """The median µs per launch of ``repeat`` bursts after ``warmup`` more."""
    burst.host_ms.clear()
    for _ in range(warmup + repeat):
        burst()
    return burst.per_launch_us(warmup)["median"]


def this_cpu() -> int:
    """The CPU this process last ran on; -1 where the system does not say."""
    with suppress(AttributeError, psutil.Error):
        return psutil.Process().cpu_num()
    return -1


def per_cpu(burst: Burst, cpus: list[int]) -> dict:
    """µs per launch with this process pinned to each CPU in turn (the affinity restored after)."""
    home = os.sched_getaffinity(0)
    out = {}
    try:
        for c in cpus:
            os.sched_setaffinity(0, {c})
            out[c] = round(burst_us(burst), 3)
    finally:
        os.sched_setaffinity(0, home)
    return out


# spins while the process that started it (its pid the argument) lives, however that one ends
SPIN = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent: pass"


def spinner(cpu: int) -> subprocess.Popen:
    """A busy loop pinned to ``cpu``, in its own process, which ends with this one."""
    p = subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())])
    os.sched_setaffinity(p.pid, {cpu})
    return p


def beside(burst: Burst, home: int, others: list[int], settle_s: float = 0.2) -> dict:
    """µs per launch on ``home`` beside a busy loop on each of ``others``, and with none (-1)."""
    keep = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {home})
    out = {-1: [burst_us(burst)]}
    try:
        for c in others:
            p = spinner(c)
            try:
                time.sleep(settle_s)
                out[c] = round(burst_us(burst), 3)
            finally:
                p.kill()
                p.wait(timeout=10)
        out[-1].append(burst_us(burst))
    finally:
        os.sched_setaffinity(0, keep)
    out[-1] = round(statistics.median(out[-1]), 3)
    return out


FRESH = ("import json; from sglab.core.timing import launch_cost_us; "
         "from sglab.core.hostprobe import this_cpu; c = launch_cost_us({device!r}); "
         "print(json.dumps({{'us': c['median'], 'p90': c['p90'], 'cpu': this_cpu()}}))")


def fresh(k: int, device: str = "cuda:0", timeout: float = 120.0) -> list[dict]:
    """``k`` fresh unpinned processes in turn: each one's µs per launch (median, p90) and CPU."""
    out = []
    for _ in range(k):
        out.append(procs.in_own_process(FRESH.format(device=device), timeout))
        if "error" in out[-1]:
            raise RuntimeError(f"a fresh process could not time its launches: {out[-1]['error']}")
    return out


def rounds(burst: Burst, cpus: list[int], n: int, gap_s: float = 5.0) -> list[dict]:
    """:func:`per_cpu` ``n`` times, ``gap_s`` apart."""
    out = []
    for i in range(n):
        time.sleep(gap_s if i else 0)
        out.append(per_cpu(burst, cpus))
    return out


def siblings_seen(base: float, slowed: dict, factor: float = 1.3) -> list[int]:
    """The CPUs whose busy loop slowed the home CPU by more than ``factor``."""
    return sorted(c for c, us in slowed.items() if c >= 0 and us > factor * base)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglab.core.hostprobe", description=__doc__)
    ap.add_argument(
        "--out", required=True, help="the JSON file to write, or a folder: there, "
        "named as recorded runs are (<UTC>_<gpu>-x<count>.json)")
    ap.add_argument("--fresh", type=int, default=10, help="fresh processes to time (default 10)")
    ap.add_argument("--home", type=int, default=2, help="the CPU timed beside busy loops")
    ap.add_argument("--device", default="cuda:0", help="where the kernels go (default cuda:0)")
    ap.add_argument("--rounds", type=int, default=0, help="time every CPU this many times more, "
                    "5 s apart (default 0)")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if args.home not in cpus:
        ap.error(f"--home {args.home} is not one of this process's CPUs ({cpus[0]}–{cpus[-1]})")
    now = datetime.now(timezone.utc)
    machine = runs.machine_manifest()
    out = Path(args.out)
    if args.out.endswith("/") or out.is_dir():
        out.mkdir(parents=True, exist_ok=True)
        out = out / f"{runs.run_stem(machine, now)}.json"
    command = " ".join([ap.prog, *(sys.argv[1:] if argv is None else argv)])
    manifest = dict(machine, created_utc=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    git_sha=os.environ.get("SGLAB_GIT_SHA"), command=command)
    probe = {"manifest": manifest, "cpus": cpus, "topology": topology(), "home": args.home}
    print(f"hostprobe: {len(cpus)} CPUs; {args.fresh} fresh processes ...", flush=True)
    probe["fresh"] = fresh(args.fresh, args.device)
    burst = Burst(args.device, 1000)
    print("hostprobe: each CPU alone ...", flush=True)
    probe["per_cpu"] = per_cpu(burst, cpus)
    print(f"hostprobe: CPU {args.home} beside a busy loop on each other CPU ...", flush=True)
    probe["beside"] = beside(burst, args.home, [c for c in cpus if c != args.home])
    if args.rounds:
        print(f"hostprobe: every CPU {args.rounds} more times, 5 s apart ...", flush=True)
        probe["rounds"] = rounds(burst, cpus, args.rounds)
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(probe, indent=1))
    tmp.replace(out)
    print(f"hostprobe: wrote {out}")
    print(table([(out.name, load(out))]).T.to_string())
    return 0


def load(path: Path) -> dict:
    """A probe written by :func:`main`, CPU numbers as ints."""
    return json.loads(
        Path(path).read_text(),
        object_hook=lambda d: {int(k) if k.lstrip("-").isdigit() else k: v
                               for k, v in d.items()})


def recorded(root: Path | None = None) -> list[tuple[str, dict]]:
    """``[(file name, probe)]`` of ``data/recorded/host_probe/``, oldest first."""
    folder = (root or runs.repo_root()) / "data" / "recorded" / "host_probe"
    return [(f.name, load(f)) for f in sorted(folder.glob("*.json"))]


def moved(rounds: list[dict], factor: float = 1.3) -> list[int]:
    """The CPUs that ran over ``factor`` slower in one round than in another."""
    return [c for c in rounds[0] if max(r[c] for r in rounds) > factor * min(r[c] for r in rounds)]


def label(name: str, probe: dict) -> str:
    """A probe as one short label: GPU model, then date and time (UTC)."""
    m = probe.get("manifest", {})
    when = m.get("created_utc", "")[5:16].replace("T", " ") or name
    return f"{runs.gpu_short(m)} {when}"


def table(probes: list[tuple[str, dict]]):
    """One row per probe: fresh processes, each CPU alone, between rounds, beside a busy loop."""
    import pandas as pd

    rows = []
    for name, p in probes:
        f = [r["us"] for r in p.get("fresh", [])]
        pc = list(p.get("per_cpu", {}).values())
        rs = p.get("rounds", [])
        b = dict(p.get("beside", {}))
        base = b.pop(-1, None)
        near = siblings_seen(base, b) if base else []
        rows.append({
            "probe (GPU, UTC)": label(name, p),
            "fresh processes, µs per launch": (f"{statistics.median(f):.2f} [{min(f):.2f}–"
                                               f"{max(f):.2f}] of {len(f)}" if f else ""),
            "each CPU alone, µs": f"{min(pc):.2f}–{max(pc):.2f}" if pc else "",
            "CPUs > 1.3× apart between rounds": (f"{len(moved(rs))} of {len(rs[0])} over "
                                                 f"{len(rs)} rounds" if rs else ""),
            "home CPU alone / beside a busy loop, µs": (
                "" if base is None or not b else f"{base:.2f} / {min(b.values()):.2f}–"
                f"{max(b.values()):.2f}" + (f" (slowed by CPU {near})" if near else ""))
        })
    return pd.DataFrame(rows).set_index("probe (GPU, UTC)")


def figure(probes: list[tuple[str, dict]]):
    """A row per probe: each vCPU fastest to slowest round, orange where over 1.3× apart."""
    import matplotlib.pyplot as plt

    grids = [(n, p) for n, p in probes if p.get("rounds")]
    fig, ax = plt.subplots(figsize=(9.0, 1.0 + 0.42 * len(grids)))
    for row, (name, p) in enumerate(grids):
        rs = p["rounds"]
        cpus = sorted(rs[0])
        slow = set(moved(rs))
        for k, c in enumerate(cpus):
            y = row + (k + 0.5) / len(cpus) * 0.7 - 0.35  # the CPUs spread over the row
            v = [r[c] for r in rs]
            colour = "tab:orange" if c in slow else "0.55"
            ax.plot([min(v), max(v)], [y, y], color=colour, lw=1.6, solid_capstyle="butt")
            ax.plot(v, [y] * len(v), "|", color=colour, ms=3.5)
        ax.text(1.005, row, f"{len(slow)}/{len(cpus)}", transform=ax.get_yaxis_transform(),
                va="center", fontsize=8, color="tab:orange" if slow else "0.4")
    ax.set_yticks(range(len(grids)), [label(n, p) for n, p in grids], fontsize=8)
    ax.set_ylim(len(grids) - 0.5, -0.5)
    ax.set_xlabel("µs per kernel launch (each line: one vCPU, fastest to slowest of its rounds, "
                  "5 s apart)")
    ax.set_title(
        "Host probes: each vCPU's bare launch cost across rounds; orange: over 1.3× apart "
        "(count at right)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
