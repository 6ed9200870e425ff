"""Rank functions for the dist tests (ranks are spawned, so these live in an importable module)."""

import os
import time

import torch
import torch.distributed as tdist


def all_reduce_sum(ctx):
    t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    tdist.all_reduce(t)
    return [{"rank": ctx.rank, "sum": t.item(), "pid": os.getpid(), "device": str(ctx.device)}]


def raise_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("bad shard on rank 1")
    tdist.barrier(group=ctx.cpu_group)
    return []


def rank_1_never_joins(ctx, stall_s):
    if ctx.rank == 1:
        time.sleep(stall_s)  # alive, but never enters the collective
        return []
    t = torch.ones(1, device=ctx.device)
    tdist.all_reduce(t)
    if t.is_cuda:
        torch.cuda.synchronize()
    return []


def sleep_forever(ctx):
    time.sleep(3600)


def spawn_grandchild_and_hang(ctx, pidfile):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(f"{pidfile}.{ctx.rank}", "w") as f:
        f.write(str(p.pid))
    time.sleep(3600)
