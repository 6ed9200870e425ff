"""What the host did while an engine start ran: the machine's stolen and busy CPU time, and the
CPU time and preemptions of the children waited for."""

from __future__ import annotations

import subprocess
import sys

from sglab.core import hoststate


def _stat(path, user, system, idle, steal):
    path.write_text(f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    return path


def test_stolen_and_busy_shares_come_from_the_machines_ticks_over_the_window(tmp_path):
    """Between the two reads: 300 user + 100 system ticks, 500 idle and 100 stolen, of 1000:
    10% stolen, 40% busy."""
    stat = _stat(tmp_path / "stat", 1000, 500, 9000, 50)
    assert hoststate.cpu_ticks(stat) == {
        "user": 1000, "nice": 0, "system": 500, "idle": 9000, "iowait": 0, "irq": 0, "softirq": 0,
        "steal": 50
    }
    window = hoststate.begin(stat)
    _stat(stat, 1300, 600, 9500, 150)
    got = hoststate.end(window, stat)
    assert (got["steal_pct"], got["busy_pct"]) == (10.0, 40.0)


def test_no_proc_stat_gives_the_childrens_figures_only(tmp_path):
    missing = tmp_path / "nope"
    assert hoststate.cpu_ticks(missing) is None
    got = hoststate.end(hoststate.begin(missing), missing)
    assert set(got) == {"engine_cpu_s", "preempted"}


def test_a_child_that_burns_cpu_is_counted_once_waited_for():
    window = hoststate.begin()
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    got = hoststate.end(window)
    assert got["engine_cpu_s"] >= 0.3 and got["preempted"] >= 0
    assert 0.0 <= got["steal_pct"] <= 100.0 and 0.0 <= got["busy_pct"] <= 100.0
