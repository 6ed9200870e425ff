"""What notebook cells call: the mode decision, the environment banner, measure-or-load.

    wb = Workbook("swa_loc", gpus=1, mode=MODE)      # banner; wb.live tells whether to measure
    if wb.live:                                      # (in a cell tagged needs-gpu)
        wb.measure(lambda: experiment.run(PARAMS), params=PARAMS, method_version=experiment.METHOD_VERSION)
    run = wb.result()                                # the live run, else the newest recorded one, else None

Modes: ``auto`` measures live when the GPUs are here and otherwise shows the committed recorded run;
``live`` insists on measuring (and fails clearly without the GPUs); ``recorded`` always shows the recorded run.
"""

from __future__ import annotations

import json
from typing import Callable

from . import hardware, runs

MODES = ("auto", "live", "recorded")
MODE_MIME = "application/vnd.sglab.mode+json"


def _display(data: dict, text: str, markdown: str | None = None) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            bundle = {MODE_MIME: data, "text/plain": text}
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
        """Run ``fn`` (returning a tidy frame), save it under data/runs/, and keep it as this session's result."""
        if not self.live:
            raise RuntimeError(f"{self.experiment}: not in live mode ({self.reason}); nothing measured")
        df = fn()
        path = runs.write_run(df, experiment=self.experiment, method_version=method_version, params=params,
                              gpu_count=gpu_count)
        run = runs.read_run(path, live=True)
        self._live.append(run)
        print(f"[sglab] measured live: {run.label} → {path.relative_to(runs.repo_root())}")
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


def read_mode(nb) -> dict | None:
    """The mode marker a :class:`Workbook` left in an executed notebook (nbformat node), if any."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if MODE_MIME in data:
                v = data[MODE_MIME]
                return v if isinstance(v, dict) else json.loads(v)
    return None
