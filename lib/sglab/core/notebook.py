"""What notebook cells call: the mode decision, the environment banner, measure-or-load, the first screen and the
verdict.

    wb = Workbook("swa_loc", gpus=1, mode=MODE)      # banner; wb.live tells whether to measure
    if wb.live:                                      # (in a cell tagged needs-gpu)
        wb.measure(lambda: experiment.run(PARAMS), params=PARAMS, method_version=experiment.METHOD_VERSION)
    shown = wb.shown()                               # this session's live runs, else the recorded runs a reader sees
    slide("swa_loc", shown, figures.mechanism())     # claim, headline, verdict line, mechanism picture
    ...
    verdict("swa_loc", shown)                        # the claims table of each run shown

Modes: ``auto`` measures live when the GPUs are here and otherwise shows the committed recorded run;
``live`` insists on measuring (and fails clearly without the GPUs); ``recorded`` always shows the recorded run.
"""

from __future__ import annotations

import json
from typing import Callable

from sglab.core import claims, hardware, runs

MODES = ("auto", "live", "recorded")
MODE_MIME = "application/vnd.sglab.mode+json"


def _display(data: dict | None, text: str, markdown: str | None = None) -> None:
    """Show ``markdown`` in a notebook (with the mode marker ``data`` when given), ``text`` elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            bundle = {"text/plain": text} if data is None else {MODE_MIME: data, "text/plain": text}
            if markdown:
                bundle["text/markdown"] = markdown
            display(bundle, raw=True)
            return
    except ImportError:
        pass
    print(text)


class Workbook:
    def __init__(self, experiment: str, *, gpus: int = 1, mode: str = "auto", show: bool = True):
        if mode not in MODES:
            raise ValueError(f"MODE must be one of {MODES}, got {mode!r}")
        if gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {gpus}")
        self.experiment = experiment
        self.gpus = gpus
        self.requested = mode
        ok, self.reason = hardware.meets(gpus)
        if mode == "live" and not ok:
            raise RuntimeError(f"MODE='live' for {experiment!r} but {self.reason}. Use MODE='auto' or 'recorded' to "
                               "show the committed recorded run instead.")
        self.live = ok if mode == "auto" else mode == "live"
        self.mode = "live" if self.live else "recorded"
        self._live: list[runs.Run] = []
        if show:
            self.banner()

    # -- reporting ---------------------------------------------------------------------------------------
    def banner(self) -> None:
        gpus = hardware.gpus() if hardware.has_cuda() else ()
        here = ", ".join(f"{g.index}: {g.name}" for g in gpus) or "none"
        recorded = runs.load_all_recorded(self.experiment)
        rec = "; ".join(r.label for r in recorded) or "none committed yet"
        if self.live:
            what = f"LIVE — measuring on this machine ({self.reason})."
        else:
            what = (f"RECORDED — {self.reason}: GPU results below come from the committed recorded run(s), "
                    "not from this machine. CPU parts still run live.")
        text = (f"[sglab] {self.experiment}: mode {self.mode} (MODE={self.requested!r})\n"
                f"  GPUs here: {here}\n  needs: {self.gpus} GPU(s)\n  {what}\n  recorded runs: {rec}")
        md = (f"**{self.experiment}** — mode **{self.mode}** (`MODE={self.requested!r}`)  \n"
              f"GPUs here: {here} · needs {self.gpus}  \n{what}  \nRecorded runs: {rec}")
        _display({"experiment": self.experiment, "mode": self.mode, "gpus_needed": self.gpus,
                  "gpus_here": len(gpus), "recorded": [r.label for r in recorded]}, text, md)

    # -- measuring and loading ---------------------------------------------------------------------------
    def measure(self, fn: Callable[[], object], *, params: dict, method_version: int,
                gpu_count: int | None = None) -> runs.Run:
        """Run ``fn`` (returning a tidy frame or a :class:`sglab.core.runs.Measured`), save it under data/runs/ with its
        sidecars and phase times, and keep it as this session's result."""
        if not self.live:
            raise RuntimeError(f"{self.experiment}: not in live mode ({self.reason}); nothing measured")
        import time

        from sglab.core import timing as phases

        phases.take()
        t0 = time.perf_counter()
        out = runs.Measured.of(fn())
        extra = {**out.extra, "duration_s": round(time.perf_counter() - t0, 1), "phases_s": phases.take()}
        path = runs.write_run(out.df, experiment=self.experiment, method_version=method_version, params=params,
                              gpu_count=gpu_count, extra=extra, sidecars=out.sidecars)
        run = runs.read_run(path, live=True)
        self._live.append(run)
        root = runs.repo_root()
        where = path.relative_to(root) if path.is_relative_to(root) else path  # $SGLAB_DATA may be elsewhere
        print(f"[sglab] measured live: {run.label} → {where}")
        return run

    def result(self, **where) -> runs.Run | None:
        """The newest live run of this session matching ``where``, else the newest matching recorded run."""
        for run in reversed(self._live):
            if runs._matches(run.manifest, where):
                return run
        run = runs.load_recorded(self.experiment, **where)
        if run is None:
            cond = f" matching {where}" if where else ""
            print(f"[sglab] no recorded run of {self.experiment!r}{cond} yet: GPU results cannot be shown here. "
                  f"Record one with `sglab record {self.experiment}` on a machine with {self.gpus} GPU(s).")
        else:
            print(f"[sglab] showing recorded run {run.path.name} ({run.provenance})")
        return run

    def shown(self) -> list[runs.Run]:
        """What this notebook shows: this session's live runs, else the recorded runs a reader sees (the newest
        per GPU model or per world size, as the experiment's claims module decides)."""
        if self._live:
            return list(self._live)
        return claims.shown(self.experiment, runs.load_all_recorded(self.experiment))

    def results(self) -> list[runs.Run]:
        """All live runs of this session if any, else every recorded run (e.g. one per world size)."""
        if self._live:
            return list(self._live)
        found = runs.load_all_recorded(self.experiment)
        if not found:
            print(f"[sglab] no recorded runs of {self.experiment!r} yet.")
        for r in found:
            print(f"[sglab] recorded run {r.path.name} ({r.provenance})")
        return found


def _source(runs_: list) -> str:
    if not runs_:
        return "no run to show"
    kind = "measured live here" if any(r.live for r in runs_) else "recorded"
    return f"{kind}: " + "; ".join(r.label for r in runs_)


def slide_markdown(experiment: str, runs_: list) -> str:
    """The text of a notebook's first screen: the claim, the headline of the runs shown and their verdict lines."""
    from sglab.tools.catalog import by_experiment

    entry = by_experiment(experiment)
    lines = [f"**Claim.** {entry.claim if entry else experiment}", ""]
    if runs_:
        lines += [f"**Measured** ({_source(runs_)}). {claims.headline(experiment, runs_)}", ""]
        verdicts = [claims.verdict_line(claims.evaluate(experiment, r), r) for r in runs_]
        lines += ["**Verdict.** " + "; ".join(verdicts) + ".", ""]
    else:
        lines += ["**Measured.** No run to show yet: record one with `sglab record "
                  f"{experiment}` on a GPU machine.", ""]
    return "\n".join(lines)


def slide(experiment: str, runs_: list, picture=None) -> None:
    """A notebook's first screen: claim, headline, verdict line, then the mechanism picture (a matplotlib figure,
    shown and closed so that it is not drawn twice)."""
    md = slide_markdown(experiment, runs_)
    _display(None, md.replace("**", ""), md)
    if picture is not None:
        _show_figure(picture)


def _show_figure(fig) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            import matplotlib.pyplot as plt

            display(fig)
            plt.close(fig)
            return
    except ImportError:
        pass


_STATUS_STYLE = {claims.PASS: "color:#1e8449;font-weight:600", claims.FAIL: "color:#c0392b;font-weight:600",
                 claims.NA: "color:#7f8c8d"}


def verdict_html(experiment: str, run) -> str:
    """One run's claims as an HTML table (status coloured), headed by its verdict line."""
    import html

    results = claims.evaluate(experiment, run)
    rows = []
    for r in results:
        detail = r.outcome.measured if r.status != claims.NA else ""
        why = r.outcome.reason if r.status != claims.PASS else ""
        rows.append(f"<tr><td><code>{html.escape(r.claim.id)}</code></td><td>{html.escape(r.claim.statement)}</td>"
                    f"<td style='{_STATUS_STYLE[r.status]}'>{r.status}</td><td>{html.escape(str(detail))}</td>"
                    f"<td>{html.escape(r.claim.expected)}</td><td>{html.escape(why)}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("claim", "statement", "status", "measured", "expected", "why"))
    return (f"<p><b>{html.escape(claims.verdict_line(results, run))}</b> · <small>{html.escape(run.path.name)}"
            f"</small></p><div style='overflow-x:auto'><table><tr>{head}</tr>{''.join(rows)}</table></div>")


def verdict(experiment: str, runs_: list) -> None:
    """The Verdict section: each shown run's claims table (live or recorded)."""
    if not runs_:
        print(f"[sglab] no run of {experiment!r} to verify yet.")
        return
    for run in runs_:
        results = claims.evaluate(experiment, run)
        text = claims.verdict_line(results, run) + "\n" + claims.table(results).to_string(index=False)
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display

            if get_ipython() is not None:
                display(HTML(verdict_html(experiment, run)))
                continue
        except ImportError:
            pass
        print(text)


def read_mode(nb) -> dict | None:
    """The mode marker a :class:`Workbook` left in an executed notebook (nbformat node), if any."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if MODE_MIME in data:
                v = data[MODE_MIME]
                return v if isinstance(v, dict) else json.loads(v)
    return None


def overview():
    """00's reading-order table: per notebook its claim, the GPUs it needs, whether this machine runs it live, its
    live time (newest committed ``sglab run --timings`` record per GPU model) and the recorded runs it can show.
    One source with the README index and the report: :mod:`sglab.tools.catalog`."""
    import pandas as pd

    from sglab.tools import catalog
    from sglab.tools import timings

    live_times = timings.live_times()
    rows = []
    for e in catalog.NOTEBOOKS:
        ok, _ = hardware.meets(e.gpus)
        recorded = runs.load_all_recorded(e.experiment) if e.experiment else []
        rows.append({"notebook": e.stem, "upstream": e.upstream, "claim": e.claim, "GPUs": e.gpus,
                     "live here": "yes" if ok else "no",
                     "live time": live_times.get(e.stem, timings.NOT_RECORDED),
                     "recorded runs": "; ".join(r.label for r in recorded) or
                                      ("—" if e.experiment is None else "none yet")})
    return pd.DataFrame(rows)
