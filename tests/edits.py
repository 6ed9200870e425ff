"""Damaged copies of recorded runs, for tests that check a claim fails by name when its run says
otherwise; every claim of a fix, folded checks included; the committed engine run of a variant,
edited in memory, and a synthetic one of 01's bench cases."""

from __future__ import annotations

import copy
import json
import shutil

import pandas as pd
import pytest

from sglab.core import claims as C
from sglab.core import runs


def all_claims(mod) -> list:
    """Every claim of a claims module, each reader-facing one followed by its folded checks."""
    return [x for c in mod.CLAIMS for x in (c, *c.folded)]


def copy_run(src, tmp_path, edit):
    """A copy of a recorded run (CSV, manifest, sidecars) in ``tmp_path`` with its rows edited by
    ``edit(df) -> df``; the manifest's row count kept."""
    dst = tmp_path / src.name
    for f in src.parent.glob(src.stem + ".*"):
        shutil.copy2(f, tmp_path / f.name)
    df = edit(pd.read_csv(dst))
    df.to_csv(dst, index=False)
    m = json.loads(dst.with_suffix(".json").read_text())
    m["rows"] = len(df)
    dst.with_suffix(".json").write_text(json.dumps(m))
    return dst


def set_value(df, value, **where):
    """``df`` with ``value`` written into the rows where every ``column == value`` of ``where``
    holds (at least one must)."""
    sel = pd.Series(True, index=df.index)
    for k, v in where.items():
        sel &= df[k] == v
    assert sel.any(), where
    df.loc[sel, "value"] = value
    return df


def engine_run(exp: str, contains: str):
    """The committed engine run of ``exp`` in which variant ``contains`` started (else a skip)."""
    for r in runs.load_all_recorded(exp):
        st = r.df[(r.df.metric == "status") & (r.df.variant == contains)]
        if (st.value == "ok").any():
            return r
    pytest.skip(f"no committed {exp} run with {contains}")


def edited(run, variant: str, metric: str, value, requests=None):
    """A copy of ``run`` in memory whose ``metric`` of ``variant`` (at ``requests``, where given)
    reads ``value``."""
    df = run.df.copy()
    sel = (df.variant == variant) & (df.metric == metric)
    if requests is not None:
        sel &= df.requests == requests
    assert sel.any(), (variant, metric)
    df.loc[sel, "value"] = value
    return runs.Run(df, copy.deepcopy(run.manifest), run.path)


def statuses(mod, run) -> dict:
    """``{claim id: pass/fail/n/a}`` of ``mod``'s claims on ``run``."""
    return {r.claim.id: r.status for r in C.evaluate(mod, run)}


def starts_run(times: dict, status: dict | None = None, model: str = "llama_32x512",
               created: str = "2026-11-28T00:00:00Z"):
    """A bench run of 01's Llama cases (or of ``model``): ``times[(case, start)] = {input_len:
    ms}``, ``ms`` the start's median repeat, or ``(median, fastest)`` repeat (else the same)."""
    rows, entries = [], []
    for (case, start), per in times.items():
        variant = f"0.5.13+{case}"
        base = {
            "experiment": "engine_pcg_gate", "variant": variant, "release": "0.5.13", "case": case,
            "tool": "bench", "start": start
        }
        st = (status or {}).get((case, start), "ok")
        rows.append({**base, "metric": "status", "value": st, "unit": ""})
        rows.append({
            **base, "metric": "pcg", "value": "captured" if case == "pcg" else "disabled",
            "unit": ""
        })
        for n, ms in per.items():
            med, low = ms if isinstance(ms, tuple) else (ms, ms)
            rows += [
                {**base, "batch_size": 1, "input_len": n, "metric": m, "value": v, "unit": "ms"}
                for m, v in (("prefill", med), ("prefill_min", low))
            ]
        entries.append({
            "variant": variant, "release": "0.5.13", "case": case, "model": {"name": model}
        })
    df = runs.tidy("engine_pcg_gate", rows)
    manifest = {
        "experiment": "engine_pcg_gate", "created_utc": created,
        "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "engine_runs": entries,
        "method_version": 1
    }
    return runs.Run(df, manifest, runs.repo_root() / f"{model}-{created[:10]}.csv")


def ratio_run(model: str, off: float, again: float, created: str = "2026-11-27T00:00:00Z"):
    """Three interleaved starts: pcg 10 ms, pcg-off ``off`` ms, its A/A copy ``again`` ms."""
    t = {}
    for s in range(3):
        t[("pcg", s)], t[("pcg-off", s)] = {128: 10.0}, {128: off}
        t[("pcg-off-again", s)] = {128: again}
    return starts_run(t, model=model, created=created)
