"""How big an allreduce-fusion workspace is, and when it is big enough.

Mirrors FlashInfer ``flashinfer/comm/trtllm_ar.py``:

- ``trtllm_create_ipc_workspace_for_all_reduce_fusion``: three per-rank buffers of ``W*T*H*2`` bytes (data),
  ``W*256*4`` bytes (barrier flags) and ``3*W*T*H*2`` bytes (Lamport, the comm size capped at ``MAX_COMM_SIZE``),
  each rounded up to 2 MiB before it is allocated;
- ``check_trtllm_allreduce_fusion_workspace_metadata``: the size rule behind the manager's
  ``is_buffer_size_sufficient`` (same world size, ``token_num * hidden_dim`` within the workspace's).

W = world size, T = the workspace's ``max_token_num``, H = hidden size. Pure arithmetic: the simulation, the GPU
creator and the plots all read their byte counts from here, so the three cannot disagree.
"""

from __future__ import annotations

ALIGN = 1 << 21  # FlashInfer rounds every workspace buffer up to 2 MiB
BARRIER_FLAG_COUNT = 256  # flashinfer.comm.trtllm_ar.BarrierFlagCount
MAX_COMM_SIZE = 2147483647 & ~((1 << 21) - 1)  # INT32_MAX rounded down to 2 MiB
LAMPORT_NEG_ZERO_FP16 = 0x8000  # trtllm_lamport_initialize fills with -0.0
BUFFER_NAMES = ("data", "flags", "lamport")  # the order of the three buffers (and of the pointer table)


def round_up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


def workspace_sizes(world_size: int, max_token_num: int, hidden_dim: int, use_fp32_lamport: bool = False) -> dict:
    """The three buffers of ``trtllm_create_ipc_workspace_for_all_reduce_fusion``, logical and 2 MiB aligned."""
    elem = 4 if use_fp32_lamport else 2
    buffer_size = world_size * max_token_num * hidden_dim * 2
    flag_size = world_size * BARRIER_FLAG_COUNT * 4
    lamport_comm_size = min(world_size * max_token_num * hidden_dim * elem, MAX_COMM_SIZE)
    lamport_buffer_size = lamport_comm_size * 3
    aligned = [round_up(s) for s in (buffer_size, flag_size, lamport_buffer_size)]
    return {
        "buffer_size": buffer_size,
        "flag_size": flag_size,
        "lamport_comm_size": lamport_comm_size,
        "lamport_buffer_size": lamport_buffer_size,
        "aligned": aligned,
        "bytes_per_rank": sum(aligned),
    }


def workspace_bytes_per_rank(world_size: int, max_token_num: int, hidden_dim: int) -> int:
    return workspace_sizes(world_size, max_token_num, hidden_dim)["bytes_per_rank"]


def size_sufficient(metadata: dict, token_num: int, hidden_dim: int, world_size: int) -> bool:
    """``check_trtllm_allreduce_fusion_workspace_metadata`` as a boolean (bf16, no fp32 Lamport)."""
    return (world_size == metadata["tp_size"]
            and token_num * hidden_dim <= metadata["max_token_num"] * metadata["hidden_dim"])
