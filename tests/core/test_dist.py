"""sglab.core.dist on the CPU (gloo): results come back per rank, errors carry the rank's traceback,
nothing hangs, nothing is left running."""

import gc
import multiprocessing as mp
import os
import threading
import time
from multiprocessing import resource_tracker

import pytest

from sglab.core import dist

from tests.core import dist_fns


TRACKER = resource_tracker._resource_tracker
pytestmark = pytest.mark.long(35)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def _no_tracker() -> None:
    """None runs before the launches: queues of earlier tests (a failed launch's, kept by its
    traceback) finalized first, so the tracker has nothing to clean up when it stops."""
    gc.collect()
    TRACKER._stop()


def test_all_reduce_two_ranks_returns_rows_by_rank(capfd):
    """... and the resource tracker the ranks' queue started is stopped after them, the queue
    released first. The tracker ignores SIGTERM: a Jupyter kernel that still had one took 2.6 s to
    shut down, ended by SIGTERM (its exit handlers skipped, a /tmp/pymp-* folder left)."""
    _no_tracker()
    out = dist.launch(dist_fns.all_reduce_sum, 2, backend="gloo", timeout_s=120)
    assert [rows[0]["rank"] for rows in out] == [0, 1]
    assert [rows[0]["sum"] for rows in out] == [3.0, 3.0]
    assert all(not _alive(rows[0]["pid"]) for rows in out)
    assert mp.active_children() == []
    assert TRACKER._pid is None
    assert "leaked" not in capfd.readouterr().err  # the tracker found nothing left to clean up


def test_launches_at_once_leave_the_tracker_to_the_last_to_end(monkeypatch, capfd):
    """Threads run launches at once (05's groups): the tracker is stopped when the last of them
    ends, not by one that ends while another has set its queue up and not started its ranks (the
    tracker then unlinked that queue's semaphores, and its ranks could not open them)."""
    _no_tracker()
    a_set_up, b_set_up, a_done = threading.Event(), threading.Event(), threading.Event()
    real, got = dist._Ranks.__init__, {}

    def init(self, *args):  # a's queue first (so a finds no tracker), then b's; a ends, b starts
        real(self, *args)
        in_b = threading.current_thread().name == "b"
        mine, other = (b_set_up, a_done) if in_b else (a_set_up, b_set_up)
        mine.set()
        other.wait(60)

    def b():
        a_set_up.wait(60)
        try:
            got["b"] = dist.launch(dist_fns.all_reduce_sum, 1, backend="gloo", timeout_s=60)
        except Exception as e:  # noqa: BLE001 - asserted below
            got["b"] = e

    monkeypatch.setattr(dist._Ranks, "__init__", init)
    t = threading.Thread(target=b, name="b")
    t.start()
    try:
        a = dist.launch(dist_fns.all_reduce_sum, 1, backend="gloo", timeout_s=60)
        assert TRACKER._pid is not None  # b's queue still needs it
    finally:
        a_done.set()
        t.join(90)
    assert not isinstance(got["b"], Exception), got["b"]
    assert [rows[0]["sum"] for rows in (*a, *got["b"])] == [1.0, 1.0]
    assert TRACKER._pid is None and mp.active_children() == []
    assert "leaked" not in capfd.readouterr().err


def test_rank_exception_surfaces_with_traceback(forked):
    with pytest.raises(dist.RankError) as ei:
        dist.launch(dist_fns.raise_on_rank_1, 2, backend="gloo", timeout_s=120, start_method=forked)
    assert ei.value.rank == 1
    assert "bad shard on rank 1" in str(ei.value)
    assert "raise_on_rank_1" in ei.value.rank_traceback
    assert mp.active_children() == []


def test_rank_that_never_joins_times_out_clearly(forked):
    t0 = time.monotonic()
    with pytest.raises(dist.DistTimeout) as ei:
        dist.launch(dist_fns.rank_1_never_joins, 2, args=(120,), backend="gloo", timeout_s=90,
                    collective_timeout_s=4, start_method=forked)
    elapsed = time.monotonic() - t0
    assert "rank 0" in str(ei.value) and "timed out" in str(ei.value)
    assert elapsed < 60, elapsed  # the 4 s collective limit fired, not the 90 s run limit
    assert mp.active_children() == []


def test_run_deadline_kills_ranks_and_their_children(tmp_path, forked):
    pidfile = tmp_path / "child"
    with pytest.raises(dist.DistTimeout, match="exceeded 15 s"):
        dist.launch(dist_fns.spawn_grandchild_and_hang, 2, args=(str(pidfile),), backend="gloo",
                    timeout_s=15, start_method=forked)
    pids = [int((tmp_path / f"child.{r}").read_text()) for r in range(2)]
    for _ in range(50):  # a killed process leaves the table a moment after the signal
        if not any(_alive(p) for p in pids):
            break
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    assert mp.active_children() == []


def test_bad_arguments_fail_before_spawning():
    with pytest.raises(ValueError, match="world_size"):
        dist.launch(dist_fns.all_reduce_sum, 0, backend="gloo")
    with pytest.raises(ValueError, match="module-level"):
        dist.launch(lambda ctx: None, 2, backend="gloo")
    with pytest.raises(ValueError, match="backend"):
        dist.launch(dist_fns.all_reduce_sum, 2, backend="mpi")


def test_nccl_without_gpus_says_so():
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("machine has 64 GPUs")
    with pytest.raises(dist.NotEnoughGPUs, match="64 ranks with NCCL need 64 GPUs"):
        dist.launch(dist_fns.all_reduce_sum, 64)


def test_forkserver_ranks_and_no_server_left():
    resource_tracker.ensure_running()  # a tracker that was running before: it is kept
    tracker = TRACKER._pid
    dist.forkserver(["torch"])
    try:
        out = dist.launch(dist_fns.all_reduce_sum, 2, backend="gloo", timeout_s=120,
                          start_method="forkserver")
    finally:
        dist.stop_forkserver()
    assert [rows[0]["sum"] for rows in out] == [3.0, 3.0]
    assert all(not _alive(rows[0]["pid"]) for rows in out)
    from multiprocessing import forkserver

    assert forkserver._forkserver._forkserver_pid is None  # the server is gone too
    assert mp.active_children() == []
    assert tracker is not None and TRACKER._pid == tracker and _alive(tracker)
    _no_tracker()
    with pytest.raises(ValueError, match="start_method"):
        dist.launch(dist_fns.all_reduce_sum, 2, backend="gloo", start_method="fork")
