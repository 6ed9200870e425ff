"""``sglab run`` and ``sglab timings``: which notebooks a run names, where its report may go,
the run itself (:mod:`.report`) and the timings it saves."""

from __future__ import annotations

import time
from pathlib import Path

from sglab.tools.commands import Refused, parse_params


def _resolve_notebooks(names: list[str]) -> list[Path]:
    """The notebooks ``sglab run`` names (files, names or prefixes; none: all of them)."""
    from sglab.tools import nbtools

    all_nbs = nbtools.all_notebooks()
    picked = []
    for n in names:
        if Path(n).suffix == ".ipynb" and Path(n).is_file():
            picked.append(Path(n).resolve())
            continue
        match = [p for p in all_nbs if p.stem == Path(n).stem or p.name.startswith(n)]
        # a path (a folder in it, or a file name no workbook notebook has) is that file or nothing
        if len(Path(n).parts) > 1 or (not match and Path(n).suffix == ".ipynb"):
            raise ValueError(
                f"{n}: " + ("not a notebook (.ipynb) file" if Path(n).exists() else "no such file"))
        if not match:
            raise ValueError(f"no notebook matches {n!r}; have: "
                             f"{', '.join(p.stem for p in all_nbs)}")
        picked.extend(match)
    return list(dict.fromkeys(picked)) if names else all_nbs


def cmd_run(args) -> int:
    from sglab.tools.report import stopping

    # a stop signal from here to the last line ends the command with 128 + the signal
    with stopping() as signals:
        status = _run_command(args)
        return 128 + signals.received[0] if signals.received else status


def _run_command(args) -> int:
    from sglab.tools.report import default_jobs, run_notebooks
    from sglab.tools import nbtools, timings
    from sglab.core.runs import repo_root

    if args.record and not args.timings:
        raise Refused("--record saves the timings; it needs --timings")
    try:
        paths = _resolve_notebooks(args.notebooks)
        for path in paths:
            nbtools.readable(path)
        params = parse_params(args.param)
        for path in paths if params else ():
            names = nbtools.parameter_names(path)
            bad = [k for k in params if k not in names]
            if bad:
                raise ValueError(f"--param {', '.join(bad)}: not a parameter of {path.stem} (its "
                                 f"parameters: {', '.join(names) or 'none'})")
        if "MODE" in params:  # said here, not by every notebook's first cell
            from sglab.core.notebook import MODES

            if params["MODE"] not in MODES:
                raise ValueError(f"--param MODE={params['MODE']}: one of {', '.join(MODES)}")
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
        out = Path(args.out) if args.out else repo_root() / "reports"
        over = [p.name for p in paths if out.resolve() == p.parent.resolve()]
        if over:
            raise ValueError(f"--out {out}: the executed copy of {', '.join(over)} would replace "
                             "the notebook itself (name another folder)")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: a file, not a folder (name a folder)")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--out {out}: {e.strerror.lower()} (name a folder that can be made)")
    except ValueError as e:
        raise Refused(e) from None
    t0 = time.perf_counter()
    results = run_notebooks(paths, out, params=params, cell_timeout=args.cell_timeout,
                            jobs=args.jobs)
    failed = [r for r in results if r.status != "ok"]
    print(f"report: {out / 'index.html'} ({len(results) - len(failed)}/{len(results)} ok)")
    if args.timings:
        print(timings.summary(timings.frame(results)))
        jobs = min(args.jobs or default_jobs(), len(results))
        print(f"wall: {time.perf_counter() - t0:.1f} s ({jobs} at a time; pages and index "
              "included)")
        saved = {"notebooks": [p.stem for p in paths], "cell_timeout": args.cell_timeout, **params}
        _write_timings(results, args.record, not failed and len(results) == len(paths),
                       params=saved)
    # the signal that stopped the run, or one that reached a notebook alone: 128 + it, as a shell
    stopped = getattr(results, "signal", 0) or next(
        (r.stopped_by_signal for r in results if r.stopped_by_signal), 0)
    return 128 + stopped if stopped else (1 if failed else 0)


def cmd_timings(args) -> int:
    """Timings of notebooks run on another machine, saved as a workbook run with its fields."""
    from sglab.tools import timings

    try:
        results, machine = timings.from_reports(Path(args.reports), Path(args.runs))
    except ValueError as e:
        raise Refused(e) from None
    print(timings.summary(timings.frame(results, Path(args.runs))))
    failed = [r for r in results if r.status != "ok"]
    _write_timings(results, args.record, not failed, runs_root=Path(args.runs), machine=machine,
                   params={"notebooks": [r.path.stem for r in results], "from_reports": True})
    return 1 if failed else 0


def _write_timings(results, record: bool, clean: bool, **kw) -> None:
    """Save the timings (recorded where asked and every notebook ran cleanly) and say where."""
    from sglab.tools import timings

    if record and not clean:
        print("[sglab] not every notebook ran cleanly: timings saved under data/runs/, not "
              "recorded")
    print(f"timings: {timings.write(results, record=record and clean, **kw)}")
