"""Run a function on N ranks, one process and GPU each: ``launch(fn, world_size)`` (NCCL, or gloo
on the CPU, plus a gloo group for objects). It never hangs: the run has a deadline, every collective
a timeout, stragglers are killed with what they started, and a rank's exception comes back with its
traceback. Every GPU stays visible to every rank."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import shutil
import socket
import tempfile
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Callable, Sequence

from sglab.core import hardware, procs


class DistError(RuntimeError):
    """Base class of the errors :func:`launch` raises."""


class NotEnoughGPUs(DistError):
    pass


class RankError(DistError):
    """A rank raised; ``rank`` and ``rank_traceback`` say which and where."""

    def __init__(self, message: str, rank: int | None = None, rank_traceback: str = ""):
        super().__init__(message)
        self.rank, self.rank_traceback = rank, rank_traceback


class DistTimeout(DistError):
    """The run or one of its collectives exceeded its time limit; all ranks were killed."""


@dataclass
class RankContext:
    rank: int
    world_size: int
    backend: str
    device: Any  # torch.device
    group: Any  # the default process group (NCCL, or gloo on CPU)
    cpu_group: Any  # a gloo group, for CPU objects
    collective_timeout_s: float

    def barrier(self) -> None:
        """A barrier on the gloo group (bounded by the collective timeout)."""
        import torch.distributed as tdist

        tdist.monitored_barrier(group=self.cpu_group,
                                timeout=timedelta(seconds=self.collective_timeout_s))


# what a rank's traceback or log says when a collective or the rendezvous ran out of time
_TIMEOUT_MARKERS = ("Watchdog caught collective operation timeout", "timed out", "Timed out",
                    "TimeoutError", "DistStoreError", "DistNetworkError: Timed out")


def _worker(rank: int, world_size: int, payload: bytes, backend: str, port: int,
            coll_timeout: float, results, env: dict, log_path: str) -> None:
    with suppress(OSError):  # its own group: stopped with whatever it starts
        os.setpgid(0, 0)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)  # everything it prints goes to its log, whose tail a failure shows
    os.dup2(fd, 2)
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        import torch
        import torch.distributed as tdist

        fn, args = pickle.loads(payload)
        timeout = timedelta(seconds=coll_timeout)
        device, extra = torch.device("cpu"), {}
        if backend == "nccl":
            # with device_id the communicator is made here, by all ranks: a collective a rank
            # never joins is a timed-out operation, not an initialisation that blocks forever
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
            extra = {"device_id": device}
        tdist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                                 init_method=f"tcp://127.0.0.1:{port}", **extra)
        cpu_group = tdist.new_group(backend="gloo",
                                    timeout=timeout) if backend != "gloo" else tdist.group.WORLD
        ctx = RankContext(rank, world_size, backend, device, tdist.group.WORLD, cpu_group,
                          coll_timeout)
        out = fn(ctx, *args)
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - everything goes back to the caller
        results.put((rank, "error", traceback.format_exc()))
    finally:
        with suppress(Exception):  # tdist: unbound where its import failed
            if tdist.is_initialized():
                tdist.destroy_process_group()
        with suppress(Exception):
            results.close()
            results.join_thread()


def _tail(path: Path, n: int = 25) -> str:
    with suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return ""


class _Ranks:
    """The rank processes of one launch: their results, every failure as one error, clean-up."""

    def __init__(self, payload: bytes, world_size: int, backend: str, collective_timeout_s: float,
                 env: dict, start_method: str):
        self.world_size, self.collective_timeout_s = world_size, collective_timeout_s
        ctx = mp.get_context(start_method)
        self.results = ctx.Queue()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))  # a free port for the rendezvous
            port = s.getsockname()[1]
        self.logdir = Path(tempfile.mkdtemp(prefix="sglab-dist-"))
        self.logs = [self.logdir / f"rank{r}.log" for r in range(world_size)]
        self.procs = [
            ctx.Process(
                target=_worker, name=f"sglab-rank{r}",
                args=(r, world_size, payload, backend, port, collective_timeout_s, self.results,
                      env, str(self.logs[r])), daemon=False) for r in range(world_size)
        ]
        self.out: dict[int, Any] = {}
        self._gone_since: dict[int, float] = {}

    def receive(self) -> None:
        """Take one message from the ranks (waiting at most 0.2 s), raising a rank's exception."""
        try:
            rank, status, data = self.results.get(timeout=0.2)
        except queue_mod.Empty:
            return
        if status == "ok":
            self.out[rank] = pickle.loads(data)
            return
        timed_out = any(m in data for m in _TIMEOUT_MARKERS)
        last = next((ln for ln in reversed(data.strip().splitlines()) if ln.strip()), "")
        msg = (f"rank {rank} of {self.world_size} failed: {last.strip()}"
               + (f" (a collective timed out after {self.collective_timeout_s:g} s)"
                  if timed_out else "") + f"\n--- rank {rank} traceback:\n{data}")
        if timed_out:
            raise DistTimeout(msg)
        raise RankError(msg, rank=rank, rank_traceback=data)

    def check_exits(self) -> None:
        """Raise for a rank that exited without a result (after 2 s for one still in the queue)."""
        now = time.monotonic()
        for r, p in enumerate(self.procs):
            if r in self.out or p.exitcode is None:
                continue
            self._gone_since.setdefault(r, now)
            if now - self._gone_since[r] < 2.0:
                continue
            tail = _tail(self.logs[r])
            if any(m in tail for m in _TIMEOUT_MARKERS):
                raise DistTimeout(f"rank {r} of {self.world_size} died after a collective timed "
                                  f"out (limit {self.collective_timeout_s:g} s; did another rank "
                                  f"never join?). Its log ends:\n{tail}")
            if not tail:
                tail = ("(empty: the rank died before it started; a script that calls launch() "
                        "must guard its entry point with `if __name__ == '__main__':`)")
            raise RankError(
                f"rank {r} of {self.world_size} exited with code {p.exitcode} without a result. "
                f"Its log ends:\n{tail}", rank=r)

    def deadline_error(self, timeout_s: float) -> DistTimeout:
        waiting = [r for r in range(self.world_size) if r not in self.out]
        done = sorted(self.out)
        tails = "\n".join(f"--- rank {r} log:\n{_tail(self.logs[r], 8)}" for r in waiting)
        hint = (f" Ranks {done} had returned: a rank still waiting is likely blocked in a "
                f"collective that another rank never joined." if done else "")
        return DistTimeout(f"run exceeded {timeout_s:g} s; rank(s) {', '.join(map(str, waiting))} "
                           f"had not finished and were killed.{hint}\n{tails}")

    def __enter__(self) -> "_Ranks":
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:  # each rank and its process group (a finished rank's swept too)
            if p.pid is not None:
                procs.stop(p.pid, grace=3.0)
                p.join(timeout=3)
        self.results.close()
        self.results.cancel_join_thread()
        shutil.rmtree(self.logdir, ignore_errors=True)


def launch(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
           backend: str = "nccl", timeout_s: float = 300, collective_timeout_s: float = 60,
           env: dict | None = None, start_method: str = "spawn") -> list:
    """``fn(ctx, *args)`` on ``world_size`` ranks: their results, no rank process left behind."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if timeout_s <= 0 or collective_timeout_s <= 0:
        raise ValueError("timeouts must be positive")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(
            fn, "__qualname__", ""):
        raise ValueError(f"{getattr(fn, '__qualname__', fn)!r} must be a module-level function of "
                         f"an importable module (ranks are spawned and import it); move it into "
                         f"lib/sglab")
    if backend == "nccl":
        ok, why = hardware.meets(world_size)
        if not ok:
            raise NotEnoughGPUs(f"{world_size} ranks with NCCL need {world_size} GPUs: {why}")
    with _Tracker():
        ranks = _Ranks(pickle.dumps((fn, tuple(args))), world_size, backend, collective_timeout_s,
                       env or {}, start_method)
        deadline = time.monotonic() + timeout_s
        # SIGTERM/SIGHUP become an exception here, so the clean-up below runs for them too
        with procs.Guard(watchdog=False), ranks:
            for p in ranks.procs:
                p.start()
            while len(ranks.out) < world_size:
                ranks.receive()
                ranks.check_exits()
                if time.monotonic() > deadline:
                    raise ranks.deadline_error(timeout_s)
            for p in ranks.procs:
                p.join(timeout=max(1.0, min(30.0, deadline - time.monotonic())))
            out = [ranks.out[r] for r in range(world_size)]
        del ranks, p  # the queue's semaphores released (and untracked) before the tracker ends
    return out


class _Tracker:
    """Around each launch: the resource tracker that the ranks' queues start is stopped when the
    last launch of this process ends well (threads run several at once; a failed one's queue may
    outlive it in its traceback). It ignores SIGTERM: a Jupyter kernel keeping one was killed."""
    lock, running, ours = threading.Lock(), 0, False

    def __enter__(self) -> None:
        with (cls := type(self)).lock:
            cls.ours = cls.ours if cls.running else resource_tracker._resource_tracker._pid is None
            cls.running += 1

    def __exit__(self, failed, *_) -> None:
        with (cls := type(self)).lock:
            cls.running, cls.ours = cls.running - 1, cls.ours and failed is None
            if cls.running == 0 and cls.ours and mp.active_children() == []:
                resource_tracker._resource_tracker._stop()


def forkserver(preload: Sequence[str] = ("torch",)):
    """The ``forkserver`` context, ``preload`` imported in the server (a rank forks in ms)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    return ctx


def stop_forkserver() -> None:
    """End this process's fork server if one runs (the next use starts a new one)."""
    from multiprocessing import forkserver as fs

    # CPython's own shutdown (used by its test suite); absent elsewhere
    stop = getattr(getattr(fs, "_forkserver", None), "_stop", None)
    if stop is not None:
        stop()
