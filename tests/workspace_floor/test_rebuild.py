"""The PR-era re-create rules on the fake creator, FlashInfer's sizes, and the IPC creator's rank
logic over gloo (CPU)."""

import os
import pickle

import pytest
import torch.distributed as tdist

from sglab.core import dist
from sglab.workspace_floor import rebuild as wf


H = 7168
MiB = 2**20
FIXED = [1, 2, 1, 4, 3, 300, 2048, 2049, 100, 4096, 5000]


class CountingCreator(wf.FakeCreator):
    """The fake creator, counting creations, destructions and the bytes alive at once."""

    def __init__(self):
        self.created = self.destroyed = self.live_bytes = self.peak_live_bytes = 0

    def create(self, **kw):
        ws, nbytes = super().create(**kw), wf.workspace_bytes_per_rank(
            kw["world_size"], kw["max_token_num"], kw["hidden_dim"])
        self.created, self.live_bytes = self.created + 1, self.live_bytes + nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)

        def destroy():
            self.destroyed, self.live_bytes = self.destroyed + 1, self.live_bytes - nbytes

        ws.destroy = destroy
        return ws


class HostOps:
    """:class:`~sglab.workspace_floor.rebuild.CudartOps` on the CPU: live 'allocations' and open
    mappings by id, so the IPC creator's rank logic runs over gloo without a GPU."""

    def __init__(self, capacity: int = 1 << 50):
        self.pid, self.next, self.capacity = os.getpid(), 1, capacity
        self.live, self.opened, self.filled = {}, {}, []

    def _new(self, table: dict, value) -> int:
        self.next += 1
        table[self.next] = value
        return self.next

    def malloc(self, nbytes):
        return self._new(self.live, nbytes)

    def free(self, ptr):
        del self.live[ptr]

    def export(self, ptr):
        return pickle.dumps((self.pid, ptr)).ljust(64, b"\0")[:64]

    def open(self, handle):
        return self._new(self.opened, handle)

    def close(self, ptr):
        del self.opened[ptr]

    def fill_lamport(self, ptr, nbytes):
        self.filled.append(ptr)

    def flag_word(self, lamport_comm_size):
        return self.malloc(20)

    def pointer_table(self, pointers):
        return list(pointers)

    def synchronize(self):
        pass

    def free_bytes(self):
        return self.capacity - sum(self.live.values())


def gloo_rank(ctx, policy_name: str, trace: list[int], hidden_dim: int = H) -> dict:
    """One rank of the IPC creator over gloo: its sizes and what is left allocated and opened."""
    ops, pol = HostOps(), wf.POLICIES[policy_name]
    mgr = wf.WorkspaceManager(wf.IpcWorkspaceCreator(ops), high_water=pol.high_water,
                              before_create=lambda: tdist.barrier(group=ctx.cpu_group))
    wf.replay(mgr, pol, trace, world_size=ctx.world_size, rank=ctx.rank, hidden_dim=hidden_dim,
              group=ctx.cpu_group)
    out = {
        "rank": ctx.rank, "sizes": [e.max_token_num for e in mgr.events],
        "live_before_cleanup": len(ops.live), "opened_before_cleanup": len(ops.opened)
    }
    mgr.cleanup()
    return {
        **out, "live_after": len(ops.live), "opened_after": len(ops.opened),
        "fills": len(ops.filled)
    }


def test_flashinfer_sizes():
    s = wf.workspace_sizes(4, 2048, H)
    assert s["buffer_size"] == 4 * 2048 * H * 2 == 117_440_512
    assert s["flag_size"] == 4 * 256 * 4
    assert s["lamport_buffer_size"] == 3 * 4 * 2048 * H * 2
    assert s["aligned"] == [112 * MiB, 2 * MiB, 336 * MiB]
    assert wf.workspace_bytes_per_rank(4, 2048, H) == 450 * MiB
    assert wf.workspace_bytes_per_rank(2, 2048, H) == 226 * MiB
    assert wf.workspace_bytes_per_rank(2, 1, H) == 3 * 2 * MiB  # every buffer rounds up to 2 MiB
    big = wf.workspace_sizes(8, 65536, H)
    assert big["lamport_comm_size"] == wf.MAX_COMM_SIZE  # capped as upstream


@pytest.mark.parametrize(
    "name,sizes,refused",
    [
        ("floor_0", [1, 2, 4, 300, 2048, 2049, 4096, 5000], 0),
        ("shape_no_hwm", [1, 2, 4, 300, 2048, 2049, 4096, 5000], 0),
        ("floor_512", [512, 2048, 2049, 4096, 5000], 0),
        ("floor_1024", [1024, 2048, 2049, 4096, 5000], 0),
        ("floor_2048", [2048, 2049, 4096, 5000], 0),
        ("floor_4096", [4096, 5000], 0),
        ("before_pr", [2048], 3),  # 2049, 4096, 5000 trip the callee's assert
    ])
def test_recreations_per_policy_on_fixed_trace(name, sizes, refused, monkeypatch):
    monkeypatch.setattr(wf, "FakeCreator", CountingCreator)
    mgr, n_refused = wf.simulate(wf.POLICIES[name], FIXED, world_size=2, hidden_dim=H)
    assert [e.max_token_num for e in mgr.events] == sizes
    assert mgr.recreations == len(sizes) == mgr.creator.created
    assert n_refused == refused
    # the previous workspace is destroyed before the next is created: one alive at a time
    assert mgr.creator.destroyed == len(sizes) - 1
    assert mgr.creator.peak_live_bytes == wf.workspace_bytes_per_rank(2, sizes[-1], H)
    assert mgr.peak_bytes_per_rank == wf.workspace_bytes_per_rank(2, max(sizes), H)


def test_pre_initialize_absorbs_small_records():
    mgr, _ = wf.simulate(wf.POLICIES["floor_0"], FIXED, world_size=2, hidden_dim=H,
                         pre_initialize=2048)
    assert [(e.step, e.max_token_num) for e in mgr.events] == [(-1, 2048), (7, 2049), (9, 4096),
                                                               (10, 5000)]


def test_reasons_and_before_create_agree():
    pol, hooked = wf.POLICIES["floor_0"], []
    mgr = wf.WorkspaceManager(wf.FakeCreator(), clock=lambda: 0.0,
                              before_create=lambda: hooked.append(mgr.step))
    wf.replay(mgr, pol, FIXED, world_size=2, rank=0, hidden_dim=H)
    assert hooked == [e.step for e in mgr.events]
    assert [e.reason for e in mgr.events] == ["uninitialised"] + ["too small"] * 7


def test_world_rank_group_rules():
    pol = wf.POLICIES["floor_2048"]
    mgr = wf.WorkspaceManager(wf.FakeCreator(), clock=lambda: 0.0)
    g1, g2 = object(), object()
    wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H, group=g1)
    assert mgr.recreations == 1
    wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H, group=g1)
    assert mgr.recreations == 1
    # a new group with a big enough buffer: initialize() reuses it (upstream early return)
    wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H, group=g2)
    assert mgr.recreations == 1
    # a different world size always re-creates
    wf.fused_norm_call(mgr, pol, 10, world_size=4, rank=0, hidden_dim=H, group=g2)
    assert mgr.recreations == 2 and mgr.events[-1].reason == "world/rank changed"
    assert mgr.world_size == 4 and mgr.max_token_num == 2048
    # world size 1: no fusion, no workspace
    assert wf.fused_norm_call(mgr, pol, 10, world_size=1, rank=0, hidden_dim=H) is False


def test_high_water_mark_only_matters_after_a_cleanup():
    for hwm, expected in ((True, 4096), (False, 10)):
        mgr = wf.WorkspaceManager(wf.FakeCreator(), high_water=hwm, clock=lambda: 0.0)
        pol = wf.Policy("p", 0, high_water=hwm)
        wf.fused_norm_call(mgr, pol, 4096, world_size=2, rank=0, hidden_dim=H)
        mgr.cleanup()
        wf.fused_norm_call(mgr, pol, 10, world_size=2, rank=0, hidden_dim=H)
        assert mgr.max_token_num == expected


def test_ipc_creator_rank_logic_over_gloo():
    out = dist.launch(gloo_rank, 2, args=("floor_0", FIXED, H), backend="gloo", timeout_s=120,
                      collective_timeout_s=30)
    for r in out:
        assert r["sizes"] == [1, 2, 4, 300, 2048, 2049, 4096, 5000]
        assert r["live_before_cleanup"] == 4  # three buffers + the flag word of the current one
        assert r["opened_before_cleanup"] == 3  # the peer's three buffers
        assert r["live_after"] == 0 and r["opened_after"] == 0
        assert r["fills"] == 8  # one Lamport fill per creation
