"""The real-release probes the notebooks show, in one list, and ``sglab real record``, which records
their answers (each release asked once for all the calls that name it)."""

from __future__ import annotations

import argparse
import time
from typing import Optional

from sglab.sglang import runner, store


def calls() -> list[tuple[str, Optional[dict], tuple]]:
    """``(probe, params, releases)`` of every notebook's real section, in notebook order."""
    from sglab.tools.fixes import FIXES

    return [(f.probe.fn, f.probe.resolved_params(), f.probe.releases)
            for f in FIXES if f.probe is not None]


def record(*, jobs: int = 2, progress=print):
    """Run every call live, one worker per release, and write the recording (its CSV path)."""
    t0 = time.perf_counter()
    asked = calls()

    def finished(release: str, results: dict) -> None:
        n = len(results)
        progress(f"sglang {release}: {n} call{'' if n == 1 else 's'} answered, "
                 f"{time.perf_counter() - t0:.1f} s into the recording")

    answers = runner.run_batch(asked, jobs=jobs, progress=finished)
    done = []
    for probe, params, releases in asked:
        key = runner.call_key(probe, params)
        results = {v: answers[v][key] for v in releases}
        bad = [r.summary() for r in results.values() if not r.ok]
        if bad:
            raise RuntimeError(f"{probe}: not every release ran, nothing recorded:\n  " +
                               "\n  ".join(bad))
        done.append((probe, params, results))
    return store.write(done)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="sglab real record", description="record what the notebooks' real-release probes "
        "answer here (data/recorded/real_cpu/)")
    ap.add_argument("--jobs", type=int, default=2, help="releases run at a time")
    args = ap.parse_args(argv)
    try:
        path = record(jobs=args.jobs)
    except RuntimeError as e:
        print(f"sglab real record: {e}")
        return 1
    print(f"recorded: {path}")
    return 0
