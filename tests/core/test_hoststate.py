"""What the host did while an engine start ran: the machine's stolen and busy CPU time, and the
CPU time and preemptions of the children waited for."""

from __future__ import annotations

import subprocess
import sys

from sglab.core import hoststate


def _times(user, system, idle, steal):
    return dict(zip(hoststate.KINDS, (user, 0, system, idle, 0, 0, 0, steal)))


def test_stolen_and_busy_shares_come_from_the_machines_cpu_times_over_the_window():
    """Between the two reads: 300 user + 100 system seconds, 500 idle and 100 stolen, of 1000:
    10% stolen, 40% busy."""
    window = hoststate.begin(lambda: _times(1000, 500, 9000, 50))
    got = hoststate.end(window, lambda: _times(1300, 600, 9500, 150))
    assert (got["steal_pct"], got["busy_pct"]) == (10.0, 40.0)


def test_without_cpu_times_only_the_childrens_figures_are_given():
    got = hoststate.end(hoststate.begin(lambda: None), lambda: None)
    assert set(got) == {"engine_cpu_s", "preempted"}


def test_the_machines_cpu_times_are_read_by_kind():
    t = hoststate.cpu_times()
    assert set(t) == set(hoststate.KINDS) and t["idle"] > 0


def test_a_child_that_burns_cpu_is_counted_once_waited_for():
    window = hoststate.begin()
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    got = hoststate.end(window)
    assert got["engine_cpu_s"] >= 0.3 and got["preempted"] >= 0
    assert 0.0 <= got["steal_pct"] <= 100.0 and 0.0 <= got["busy_pct"] <= 100.0
