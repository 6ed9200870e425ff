"""The trace reduction (torch.profiler runs on the CPU) and the timeline plot drawn from an event
table."""

import pandas as pd
import torch

from sglab.core import trace
from sglab.core import plots as tl


def work():
    x = torch.ones(256, 256)
    with trace.phase("populate"):
        y = x + 1
    with trace.phase("replay"):
        for _ in range(3):
            y = y @ x
        with trace.phase("inner"):
            y.sum()
    return y


def test_event_table_has_phases_and_categories(tmp_path):
    with trace.Recorder(perfetto=tmp_path / "t.json.gz", keep_ops=True, cuda=False) as rec:
        work()
    ev = rec.events
    assert list(ev.columns) == trace.COLUMNS
    assert set(ev.category) <= {"kernel", "memcpy", "memset", "runtime", "range", "op"}
    assert ev.start_us.min() == 0.0 and (ev.dur_us >= 0).all()
    ops = ev[ev.category == "op"]
    # the innermost phase wins: the matmuls are in "replay", the sum in "inner", the add in
    # "populate"
    assert set(ops[ops.name == "aten::mm"].phase) == {"replay"}
    assert (ops[ops.name == "aten::mm"].shape[0]) == 3
    assert set(ops[ops.name == "aten::sum"].phase) == {"inner"}
    assert set(ops[ops.name == "aten::add"].phase) == {"populate"}
    assert list(ev[ev.category == "range"].name) == [
        "phase::populate", "phase::replay", "phase::inner"
    ]
    assert (tmp_path / "t.json.gz").stat().st_size > 100


def test_ops_dropped_by_default():
    with trace.Recorder(cuda=False) as rec:
        work()
    assert "op" not in set(rec.events.category)
    assert set(rec.events[rec.events.category == "range"].phase) == {"populate", "replay", "inner"}


def _table(kernels):
    rows = [{
        "lane": "host", "name": "phase::replay", "category": "range", "start_us": 0.0,
        "dur_us": 50.0, "phase": "replay"
    }]
    t = 1.0
    for name in kernels:
        rows.append({
            "lane": "stream 7", "name": name, "category": "kernel", "start_us": t, "dur_us": 2.0,
            "phase": "replay"
        })
        t += 3.0
    return pd.DataFrame(rows, columns=trace.COLUMNS)


def test_timeline_totals_and_plot():
    before = _table(["gather", "cast", "store", "gather", "cast", "store"])
    after = _table(["store", "store"])
    fig = tl.timeline({"before": before, "after": after}, highlight="gather|cast",
                      highlight_label="translate")
    ax = fig.axes[0]
    labels = [x.get_text() for x in ax.get_yticklabels()]
    assert labels == ["after · stream 7", "after · host", "before · stream 7", "before · host"]
    notes = [c.get_text() for c in ax.texts if "kernels" in c.get_text()]
    assert any("6 kernels · translate: 4 (8 µs)" in n for n in notes) and any(
        "2 kernels · translate: 0" in n for n in notes)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_window_rezeroes():
    w = tl.window(_table(["a", "b", "c"]).iloc[2:])
    assert list(w.name) == ["b", "c"] and w.start_us.min() == 0.0


def test_trace_variants():
    ev, perfetto = trace.trace_variants(
        {"eager 16": work, "graph 16": work, "eager 256": lambda: None}, "num_tokens", cuda=False)
    assert set(zip(ev.variant, ev.num_tokens)) == {("eager", 16), ("graph", 16), ("eager", 256)}
    assert ev.num_tokens.map(type).eq(int).all() and perfetto is None
    # nested phases of work() do not match
    assert not ev.phase.isin(["replay", "populate", "inner"]).any()
