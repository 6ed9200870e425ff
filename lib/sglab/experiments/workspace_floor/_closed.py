"""Figures come back closed: a notebook shows each once (as the cell's value or through ``display``), and the
inline backend does not draw it a second time at the end of the cell."""

from __future__ import annotations

import functools


def closed(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        import matplotlib.pyplot as plt

        fig = fn(*a, **kw)
        plt.close(fig)
        return fig

    return wrapper
