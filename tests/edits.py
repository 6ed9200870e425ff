"""Damaged copies of recorded runs, for tests that check a claim fails by name when its run says
otherwise; every claim of a fix, folded checks included."""

from __future__ import annotations

import json
import shutil

import pandas as pd


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
