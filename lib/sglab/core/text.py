"""One way to say a number (``1.21–3.50×``, ``140`` not ``140.0``, a blank for what does not apply),
the same in every table and sentence of the workbook."""

from __future__ import annotations

from typing import Iterable, Sequence


def signed(value: float, fmt: str = "{:+.0%}") -> str:
    """``value`` in ``fmt``, a figure that prints as zero without its sign (not ``-0%``)."""
    said = fmt.format(value)
    return said[1:] if said[:1] in "+-" and not said.strip("+-0.%×") else said


def span(values: Iterable[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """``lo–hi`` of ``values`` in ``fmt`` then ``unit`` (one figure where both ends print alike)."""
    got = [v for v in values if v == v]  # NaN left out
    if not got:
        return ""
    lo, hi = signed(min(got), fmt), signed(max(got), fmt)
    return f"{lo}{unit}" if lo == hi else f"{lo}–{hi}{unit}"


def count(values, *, exact: bool = False) -> str:
    """Counts as text: one figure where all agree, else ``lowest–highest`` (``exact``: decimals)."""
    if isinstance(values, (int, float, str)):
        values = [values]
    got = [v for v in map(float, values) if v == v]
    if not (exact and any(not v.is_integer() for v in got)):
        return span(got, "{:.0f}")
    lo, hi = (f"{v:.2f}".rstrip("0").rstrip(".") for v in (min(got), max(got)))
    return lo if lo == hi else f"{lo}–{hi}"


def whole(value) -> str:
    """A recorded value as text, a whole number without its ``.0`` (``148.0`` -> ``148``)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return value
    return str(int(f)) if f.is_integer() and "e" not in str(value).lower() else str(value)


def counts(df, cols: Sequence[str] | None = None, *, where_whole: bool = False):
    """A copy of ``df`` whose ``cols`` read as whole numbers (``where_whole``: where all are)."""
    import pandas as pd

    out = df.copy()
    for c in (out.columns if cols is None else [c for c in cols if c in out]):
        v = pd.to_numeric(out[c], errors="coerce")
        if where_whole and not (v.notna().all() and (v % 1 == 0).all()):
            continue
        out[c] = v.round().astype("Int64")
    return out


def blank(df, cols: Sequence[str] | None = None):
    """A copy of ``df`` for reading, its missing cells in ``cols`` (default all) blank."""
    out = df.copy()
    for c in (out.columns if cols is None else [c for c in cols if c in out]):
        out[c] = out[c].astype(object).where(out[c].notna(), "")
    return out


def pct(x: float, digits: int = 0) -> str:
    return f"{x:.{digits}%}"
