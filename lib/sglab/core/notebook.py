"""What notebook cells call: the mode and its banner, measure-or-load, the review card, the verdict.

    wb = Workbook(claims, mode=MODE)        # auto: live where the GPUs are, else recorded
    run = wb.run(measure, PARAMS)           # a RunSet (measured now, or the committed runs)
    card(sglang.FIX, claims, run, engine)   # the answer first: sglab.core.card
    verdict(claims, run)                    # the claims table of each run shown
"""

from __future__ import annotations

import functools
import html
import json
from pathlib import Path
from typing import Callable, Sequence

from sglab.core import claims as C, hardware, runs


MODES = ("auto", "live", "recorded")
MODE_MIME = "application/vnd.sglab.mode+json"


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _ipy(*objs, **kwargs) -> None:
    from IPython.display import display as ipy_display

    ipy_display(*objs, **kwargs)


def display(data: dict | None, text: str, markdown: str | None = None, *,
            html: str | None = None) -> None:
    """``markdown`` or ``html`` (and mode marker ``data``) in a notebook, ``text`` elsewhere."""
    if not in_notebook():
        print(text)
        return
    bundle = {"text/plain": text} if data is None else {MODE_MIME: data, "text/plain": text}
    if markdown:
        bundle["text/markdown"] = markdown
    if html:
        bundle["text/html"] = html
    _ipy(bundle, raw=True)


def mode_line(data: dict, said: str) -> None:
    """The mode line (markdown ``said``) with its mode marker ``data``."""
    display(data, f"[sglab] {data['experiment']}: " + said.replace("**", "").replace("`", ""),
            f"<small>{said}</small>")


def show_figure(fig) -> None:
    """Display a matplotlib figure once and close it (an open figure is drawn again at the end)."""
    if fig is None:
        return
    import matplotlib.pyplot as plt

    if in_notebook():
        _ipy(fig)
    plt.close(fig)


def show_table(obj) -> None:
    """Display a table (or anything) in a notebook; print it (a table whole) elsewhere."""
    if in_notebook():
        _ipy(obj)
    else:
        print(obj.to_string() if hasattr(obj, "to_string") else obj)


def reveal(answer, prompt: str = "Show the answer") -> None:
    """The answer to a "predict, then run" question, folded until opened."""
    if not in_notebook():
        print(answer if isinstance(answer, str) else answer.to_string())
        return
    body = (f"<pre>{html.escape(answer)}</pre>" if isinstance(answer, str) else answer.to_html())
    display(None, str(answer), html=f"<details><summary>{html.escape(prompt)}</summary>{body}"
            "</details>")


def file_link(path, what: str = "file") -> None:
    """A link to a file of the checkout, relative to the notebooks."""
    path, root = Path(path).resolve(), runs.repo_root().resolve()
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
    link = f"../{rel}" if path.is_relative_to(root) else rel
    display(None, f"{what}: {rel}", f"{what}: [{html.escape(Path(rel).name)}]({link})")


def needs_run(fn):
    """For show functions that take a run first: given a NoRun, print its line and return None."""

    @functools.wraps(fn)
    def wrapper(run, *args, **kwargs):
        if not run:
            print(run.line)
            return None
        return fn(run, *args, **kwargs)

    return wrapper


def predates_traces(run, *sidecars: str, where: str = "") -> bool:
    """True, having said so, where ``run`` lacks one of its profiler ``sidecars`` (``events``)."""
    m, missing = run.manifest, any(run.sidecar(s) is None for s in sidecars or ("events",))
    if missing:
        print(f"{run.label}: this run predates profiler traces (method {m.method_version}); a new "
              f"recording (`sglab record {m.experiment}`{where}) adds them.")
    return missing


# -- "your own setup": a static table, or controls where the notebook asks for them (INTERACTIVE) --
def explore(fn: Callable, controls: dict, *, static: Sequence[dict], title: str = "",
            interactive: bool = False):
    """``fn(**settings)`` over the ``static`` settings as one table, or controls calling it."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        interactive = False
    if not interactive or type(get_ipython()).__name__ != "ZMQInteractiveShell":
        import pandas as pd

        if title:
            why = ("no widgets here: ipywidgets in a Jupyter kernel draws the controls"
                   if interactive else
                   "INTERACTIVE = True in the parameters cell gives sliders and drop-downs in "
                   "JupyterLab")
            print(f"{title} — static table ({why}):")
        parts = []
        for s in static:
            df = fn(**s)
            df = df.reset_index(drop=not any(df.index.names))  # a named index: leading columns
            for i, (k, v) in enumerate(s.items()):
                df.insert(i, k, v)
            parts.append(df)
        return pd.concat(parts, ignore_index=True)
    import ipywidgets as w

    widgets = {}
    for name, spec in controls.items():
        slider = isinstance(spec, (list, tuple)) and len(spec) > 3 and all(
            isinstance(x, (int, float)) for x in spec)
        kind = w.SelectionSlider if slider else w.Dropdown
        extra = {"continuous_update": False} if slider else {}
        widgets[name] = kind(options=list(spec), value=static[0].get(name, next(iter(spec))),
                             description=name, style={"description_width": "initial"}, **extra)
    out = w.interactive_output(lambda **kw: _ipy(fn(**kw)), widgets)
    if title:
        _ipy(w.HTML(f"<b>{title}</b>"))
    _ipy(w.VBox([w.HBox(list(widgets.values())[i:i + 3]) for i in range(0, len(widgets), 3)]), out)
    return None


class Workbook:
    """One notebook's fix: whether it measures here, and the run it shows."""

    def __init__(self, claims=None, *, mode: str = "auto", gpus: int | None = None,
                 show: bool = True, experiment: str | None = None):
        if mode not in MODES:
            raise ValueError(f"MODE must be one of {MODES}, got {mode!r}")
        self.claims, self.requested = claims, mode
        self.experiment = experiment or claims.EXPERIMENT
        self.gpus = int(gpus if gpus is not None else getattr(self.claims, "GPUS", 1))
        ok, self.reason = hardware.meets(self.gpus)
        if mode == "live" and not ok:
            raise RuntimeError(f"MODE='live' for {self.experiment!r} but {self.reason}. Use "
                               f"MODE='auto' or 'recorded' to show the committed recorded run "
                               f"instead.")
        self.live = ok if mode == "auto" else mode == "live"
        self.mode = "live" if self.live else "recorded"
        self._live: list[runs.Run] = []
        if show:
            self.banner()

    def banner(self) -> None:
        gpus = hardware.gpus() if hardware.has_cuda() else ()
        recorded = runs.load_all_recorded(self.experiment)
        if self.live:
            what = f"**live**: measured on this machine ({self.reason})"
        elif not self.gpus:
            what = f"**recorded**: {self.reason}; every cell runs on this machine"
        else:  # each table names its runs: a count here would mix runs no table shows
            what = (f"**recorded**: {self.reason}, so the GPU results come from committed runs, "
                    f"each named under the table it fills; CPU parts run live")
        data = dict(experiment=self.experiment, mode=self.mode, gpus_needed=self.gpus,
                    gpus_here=len(gpus), recorded=[r.label for r in recorded])
        mode_line(data, f"Mode {what} (`MODE={self.requested!r}`).")

    def run(self, measure=None, params: dict | None = None, *, progress: bool = False):
        """A RunSet: measured now with ``measure.run`` (live), else the committed runs."""
        if self.live and measure is not None:
            p = {**getattr(measure, "DEFAULT_PARAMS", {}), **(params or {})}
            gpus = measure.gpus(p) if hasattr(measure, "gpus") else self.gpus
            self.measure(lambda: measure.run(p, progress=progress), params=p,
                         method_version=measure.METHOD_VERSION, gpu_count=gpus)
        shown = list(self._live) or C.shown(self.claims, runs.load_all_recorded(self.experiment))
        if not shown:
            return runs.NoRun(
                self.experiment, f"no recorded {self.experiment} run yet: `sglab record "
                f"{self.experiment}` on a machine with {self.gpus} GPU(s) makes one")
        return runs.RunSet(shown, experiment=self.experiment)

    def measure(self, fn, *, params: dict, method_version: int,
                gpu_count: int | None = None) -> runs.Run:
        """Measure ``fn`` now (:func:`runs.measure`, under data/runs/) as this session's run."""
        if not self.live:
            raise RuntimeError(f"{self.experiment}: not in live mode ({self.reason}); nothing "
                               "measured")
        path, _ = runs.measure(fn, experiment=self.experiment, method_version=method_version,
                               params=params, gpu_count=gpu_count)
        run = runs.read_run(path, live=True)
        self._live.append(run)
        root = runs.repo_root()  # $SGLAB_DATA may be elsewhere
        where = path.relative_to(root) if path.is_relative_to(root) else path
        print(f"[sglab] measured live: {run.label} → {where}")
        return run


def card(fix, claims, run, engine) -> None:
    """A notebook's review card (:mod:`sglab.core.card`)."""
    from sglab.core import card as K

    md = K.markdown(K.parts(claims.CARD, fix, claims, run, engine))
    display(None, md.replace("**", "").replace("> ", ""), md)


# JupyterLab right-aligns table cells (for numbers); a claims table is sentences
_CELL = "text-align:left;vertical-align:top"
_STATUS_STYLE = {
    C.PASS: "color:#1e8449;font-weight:600", C.FAIL: "color:#c0392b;font-weight:600",
    C.NA: "color:#7f8c8d"
}


def verdict_html(claims, run) -> str:
    """One run's claims as an HTML table under its verdict line, folded checks under each."""
    results, rows = C.evaluated(claims, run), []
    for r in C.reader_facing(results):
        detail = r.outcome.measured if r.status != C.NA else ""
        why = r.outcome.reason if r.status != C.PASS else ""
        escaped = [html.escape(t) for t in (r.claim.statement, str(detail), r.claim.expected, why)]
        texts = [f"<code>{html.escape(r.claim.id)}</code>", escaped[0], r.status, *escaped[1:]]
        styles = [_CELL] * 2 + [f"{_CELL};{_STATUS_STYLE[r.status]}"] + [_CELL] * 3
        cells = "".join(f"<td style='{s}'>{t}</td>" for s, t in zip(styles, texts))
        rows.append(f"<tr>{cells}</tr>")
        folded = [f for f in results if f.parent == r.claim.id]
        if folded:  # a check that does not apply is neither held nor failed
            ok, na = C.counts(folded)[C.PASS], C.counts(folded)[C.NA]
            items = "".join(f"<li><code>{html.escape(f.claim.id)}</code> <span "
                            f"style='{_STATUS_STYLE[f.status]}'>"
                            f"{f.status}</span> — {html.escape(f.claim.statement)}: "
                            f"{html.escape(f.outcome.measured or f.outcome.reason)}</li>"
                            for f in folded)
            held = f"{ok}/{len(folded) - na} hold" + (f", {na} n/a" if na else "")
            rows.append(f"<tr><td></td><td colspan='5' style='{_CELL}'><details><summary>checks "
                        f"under it: {held}</summary><ul>{items}</ul></details></td></tr>")
    head = "".join(f"<th style='{_CELL}'>{h}</th>"
                   for h in ("claim", "statement", "status", "measured", "expected", "why"))
    return (f"<p><b>{html.escape(C.verdict_line(results, run))}</b> · "
            f"<small>{html.escape(run.path.name)}</small></p><div "
            f"style='overflow-x:auto'><table><tr>{head}</tr>{''.join(rows)}</table></div>")


def verdict(claims, run) -> None:
    """The Verdict section: each shown run's claims table (live or recorded), or the NoRun line."""
    if not run:
        print(run.line)
        return
    for r in run.shown:
        if in_notebook():
            display(None, "", html=verdict_html(claims, r))
            continue
        results = C.evaluated(claims, r)
        print(C.verdict_line(results, r) + "\n" + C.table(results).to_string(index=False))


def read_mode(nb) -> dict | None:
    """The mode marker a :class:`Workbook` left in an executed notebook (nbformat node), if any."""
    v = next((out["data"][MODE_MIME] for cell in nb.cells
              for out in cell.get("outputs", []) if MODE_MIME in out.get("data", {})), None)
    return v if v is None or isinstance(v, dict) else json.loads(v)
