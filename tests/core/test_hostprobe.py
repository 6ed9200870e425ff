"""The host probe: where a launch-bound process's speed comes from (sglab.core.hostprobe)."""

import json
import os
from pathlib import Path

import matplotlib
import pytest

from sglab.core import hostprobe as H
from sglab.core.timing import Burst


matplotlib.use("Agg")


def test_topology_reads_each_cpus_siblings_and_ids(tmp_path):
    for cpu, sib in ((0, "0,8"), (1, "1,9"), (10, "2,10"), (2, "2,10")):
        t = tmp_path / f"cpu{cpu}" / "topology"
        t.mkdir(parents=True)
        (t / "thread_siblings_list").write_text(sib + "\n")
        (t / "core_id").write_text(f"{cpu % 8}\n")
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    got = H.topology(tmp_path)
    assert list(got) == [0, 1, 2, 10]  # by number: as text, cpu10 would come before cpu2
    assert got[10] == {"siblings": "2,10", "core": "2", "package": None}


def test_pinned_timings_cover_every_cpu_asked_and_give_the_affinity_back():
    cpus = sorted(os.sched_getaffinity(0))
    burst = Burst("cpu", 50)
    got = H.per_cpu(burst, cpus)
    assert sorted(got) == cpus and all(v > 0 for v in got.values())
    assert sorted(os.sched_getaffinity(0)) == cpus
    home, others = cpus[-1], cpus[:-1]
    near = H.beside(burst, home, others, settle_s=0.0)
    assert sorted(near) == [-1, *others] and near[-1] > 0
    assert sorted(os.sched_getaffinity(0)) == cpus
    assert len(H.rounds(burst, cpus, 2, gap_s=0.0)) == 2


def test_a_busy_loop_is_stopped_before_the_next_one_starts():
    p = H.spinner(sorted(os.sched_getaffinity(0))[0])
    assert p.poll() is None
    p.kill()
    p.wait(timeout=10)
    assert p.poll() is not None


def test_a_cpu_whose_busy_loop_slows_the_home_cpu_is_named_as_its_sibling():
    assert H.siblings_seen(7.0, {0: 7.2, 6: 9.4, 9: 8.9}) == [6]
    assert H.siblings_seen(7.0, {0: 7.2}) == []


def _probe(rounds):
    return {
        "manifest": {"gpu_name": "NVIDIA H100 80GB HBM3", "created_utc": "2026-11-28T05:15:37Z"},
        "home": 0, "fresh": [{"us": 6.7, "cpu": 3}, {"us": 9.7, "cpu": 3}], "rounds": rounds
    }


def test_the_figure_draws_a_line_per_cpu_orange_where_the_host_moved_it():
    """CPU 1 runs 6.9 µs in one round and 10.3 in the next (over 1.3× apart): its line is orange
    and spans both rounds; CPUs 0 and 2 hold their speed and are grey. A probe without rounds gets
    no row."""
    from matplotlib.colors import to_hex

    fig = H.figure([("a.json", _probe([{0: 6.9, 1: 6.9, 2: 8.0}, {0: 7.0, 1: 10.3, 2: 7.1}])),
                    ("b.json", {"fresh": []})])
    (ax,) = fig.axes
    spans = [line for line in ax.lines if line.get_linestyle() == "-"]
    assert len(spans) == 3  # one per CPU
    got = {tuple(s.get_xdata()): to_hex(s.get_color()) for s in spans}
    assert got[(6.9, 10.3)] == to_hex("tab:orange")
    assert got[(6.9, 7.0)] == got[(7.1, 8.0)] == to_hex("0.55")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["H100 11-28 05:15"]
    assert [t.get_text() for t in ax.texts] == ["1/3"]


def test_the_table_has_a_row_per_probe_with_the_cpus_the_host_moved():
    probes = [
        ("a.json", _probe([{0: 6.9, 1: 6.9}, {0: 7.0, 1: 10.3}])),
        ("b.json",
         {"manifest": {"gpu_name": "NVIDIA H200"}, "home": 0, "beside": {-1: 7.0, 1: 9.8, 2: 7.1}})
    ]
    t = H.table(probes)
    assert list(t.index) == ["H100 11-28 05:15", "H200 b.json"]
    a, b = t.to_dict("records")
    assert a["fresh processes, µs per launch"] == "8.20 [6.70–9.70] of 2"
    assert a["CPUs > 1.3× apart between rounds"] == "1 of 2 over 2 rounds"
    assert b["home CPU alone / beside a busy loop, µs"] == "7.00 / 7.10–9.80 (slowed by CPU [1])"
    assert b["fresh processes, µs per launch"] == ""


def test_the_recorded_probes_load_with_numbered_cpus():
    probes = H.recorded()
    assert probes, "data/recorded/host_probe holds the probes the notebook draws"
    for name, p in probes:
        assert p["manifest"]["gpu_name"] and name.endswith(".json")
        for r in p.get("rounds", []):
            assert all(isinstance(c, int) for c in r)
    assert any(p.get("rounds") for _, p in probes)


def test_the_probe_writes_its_file_whole_with_a_manifest(tmp_path, capsys):
    out = tmp_path / "probe.json"
    cpus = sorted(os.sched_getaffinity(0))
    assert H.main([
        "--out",
        str(out), "--fresh", "1", "--home",
        str(cpus[0]), "--device", "cpu", "--rounds", "1"
    ]) == 0
    p = json.loads(out.read_text())
    assert p["manifest"]["gpu_name"] and p["manifest"]["created_utc"]
    assert p["manifest"]["command"].startswith("python -m sglab.core.hostprobe --out ")
    assert len(p["fresh"]) == 1 and len(p["rounds"]) == 1 and not list(tmp_path.glob("*.part"))
    assert "over 1 rounds" in capsys.readouterr().out  # the row 07's table shows
    with pytest.raises(SystemExit):
        H.main(["--out", str(out), "--home", "999"])


def test_a_folder_out_names_the_probe_as_recorded_runs_are_named(tmp_path):
    """``--out folder/``: the file is named like a recorded run, so it can be copied in as is."""
    import re

    cpus = sorted(os.sched_getaffinity(0))
    folder = tmp_path / "host_probe"
    assert H.main([
        "--out", f"{folder}/", "--fresh", "1", "--home",
        str(cpus[0]), "--device", "cpu"
    ]) == 0
    (f,) = folder.glob("*.json")
    p = json.loads(f.read_text())
    stamp = p["manifest"]["created_utc"].replace("-", "").replace(":", "")
    assert re.fullmatch(rf"{stamp}_[a-z0-9-]+-x\d+\.json", f.name)
    assert H.load(f)["cpus"] == cpus


def test_the_probe_runs_as_a_module(tmp_path):
    """``python -m sglab.core.hostprobe`` is how a GPU box runs it: the module must start main."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "sglab.core.hostprobe", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--rounds" in r.stdout


def test_a_busy_loop_ends_when_the_probe_is_killed_outright():
    """SIGKILL gives the probe no chance to stop its busy loop: the loop sees its parent go."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import os, sys; from sglab.core import hostprobe as H; "
            "p = H.spinner(sorted(os.sched_getaffinity(0))[0]); print(p.pid, flush=True); "
            "import time; time.sleep(60)")
    probe = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(probe.stdout.readline())
    probe.send_signal(signal.SIGKILL)
    probe.wait(timeout=10)
    for _ in range(100):
        try:  # gone, or ended and waiting to be reaped by whoever adopted it
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.1)
    state = Path(f"/proc/{pid}/stat").read_text()[:60]
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the busy loop outlived the probe: {state}")
