"""Row dicts back from a worker's frame: what a probe wrote, without the holes pandas adds.

A worker's rows arrive as one DataFrame (:func:`sglab.sglang.runner.run_probe`); a column that only some rows use
(``kernel``, ``case``, ``gpu``, ``rank``...) is NaN in the others, and an integer column that has holes turns
float. Both are undone here, so a row written into a run, or passed on by a probe that ran a child worker, is
the row the probe made.
"""

from __future__ import annotations

INT_COLUMNS = ("gpu", "rank", "step", "tokens")


def _hole(v) -> bool:
    return isinstance(v, float) and v != v


def records(df, drop=("probe",)) -> list[dict]:
    """``df``'s rows as dicts without NaN holes, integer columns back to ``int``, ``drop`` columns left out."""
    out = []
    for row in df.drop(columns=list(drop), errors="ignore").to_dict("records"):
        row = {k: v for k, v in row.items() if not _hole(v)}
        for col in INT_COLUMNS:
            if isinstance(row.get(col), float) and row[col].is_integer():
                row[col] = int(row[col])
        out.append(row)
    return out
