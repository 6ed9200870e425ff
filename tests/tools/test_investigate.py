"""The notebook widgets' static path."""

import pytest

from sglab.investigate import widgets


def test_widgets_fall_back_to_a_static_table(monkeypatch, capsys):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    import pandas as pd

    def fn(a, b):
        return pd.DataFrame({"sum": [a + b]})

    table = widgets.explore(fn, {"a": [1, 2], "b": [10, 20]},
                            static=[{"a": 1, "b": 10}, {"a": 2, "b": 20}], title="demo")
    assert list(table.columns) == ["a", "b", "sum"] and list(table["sum"]) == [11, 22]
    assert "static table" in capsys.readouterr().out


def test_notebook_widgets_are_static_tables_headless(monkeypatch, capsys, name):
    monkeypatch.setenv("SGLAB_HEADLESS", "1")
    table = getattr(widgets, name)()
    assert len(table) > 0 and "index" not in table.columns
    assert "static table" in capsys.readouterr().out
