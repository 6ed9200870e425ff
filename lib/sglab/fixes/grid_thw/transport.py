"""How the processor output travels from the tokenizer manager to every scheduler TP rank.

Upstream:

- tokenizer manager -> scheduler rank 0: ZMQ ``send_pyobj`` / ``recv_pyobj`` (``pickle.dumps`` / ``pickle.loads``);
- rank 0 -> the other TP ranks: ``broadcast_pyobj`` in ``python/sglang/srt/utils/common.py`` (pickle, two
  ``dist.broadcast`` of size and bytes over the CPU (gloo) group, ``pickle.loads``);
- the alternative a ``torch.multiprocessing`` queue takes: ``ForkingPickler`` with torch's reducers, i.e. a CUDA IPC
  handle instead of the bytes.

Plain pickle writes a CUDA tensor by value together with its device (the storage goes through ``torch.save``'s
location tag), so ``pickle.loads`` re-creates it on ``cuda:0`` in whichever process unpickles it: a whole CUDA
context on GPU 0 for a 32-byte grid. A CUDA IPC handle is opened on the tensor's device too, so that path lands on
``cuda:0`` as well.

A *wire* is one serialisation of the hop (``dumps`` in the sender, ``loads`` in the receiver); :data:`WIRES` names
them so that an experiment picks a wire per variant and another wire (SGLang's own message encoding, say) can be
added beside these without touching the callers.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch


def send_pyobj(obj: Any) -> bytes:
    """ZMQ ``send_pyobj``: ``pickle.dumps`` (a CUDA tensor goes by value, with its device)."""
    return pickle.dumps(obj)


def recv_pyobj(data: bytes) -> Any:
    """ZMQ ``recv_pyobj``: ``pickle.loads`` (a CUDA tensor comes back on the device it was saved from)."""
    return pickle.loads(data)


def ipc_dumps(obj: Any) -> bytes:
    """What a ``torch.multiprocessing`` queue sends: ``ForkingPickler`` with torch's reducers.

    A CUDA tensor becomes a CUDA IPC handle; ``pickle.loads`` on the receiver opens it on its device.
    The sender must keep the tensor alive until the receiver is done with it. CPU tensors are shared through
    named shared memory (the ``file_system`` strategy), so the bytes can travel over any socket.
    """
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as tmp  # registers the tensor reducers

    tmp.set_sharing_strategy("file_system")

    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


@dataclass(frozen=True)
class Wire:
    """One serialisation of the tokenizer -> scheduler hop."""

    name: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]
    cuda_tensor: str  # what happens to a CUDA tensor on this wire, in words
    per_receiver: bool = False  # one dump per receiver (each IPC dump counts one reference on the sender's side)


WIRES: dict[str, Wire] = {
    "pickle": Wire("pickle", send_pyobj, recv_pyobj, "sent by value with its device; re-created there"),
    "cuda_ipc": Wire("cuda_ipc", ipc_dumps, recv_pyobj, "sent as an IPC handle; opened on its device",
                     per_receiver=True),
}


def wire(name: str) -> Wire:
    try:
        return WIRES[name]
    except KeyError:
        raise ValueError(f"unknown wire {name!r}; known: {', '.join(WIRES)}") from None


def broadcast_pyobj(data: list[Any], rank: int, dist_group, src: int = 0) -> list[Any]:
    """``srt/utils/common.py`` ``broadcast_pyobj`` with ``force_cpu_device=True`` (the gloo CPU group).

    ``rank`` is the global rank of the caller; ``src`` the global rank that holds ``data``.
    """
    import torch.distributed as dist

    if rank == src:
        if len(data) == 0:
            dist.broadcast(torch.tensor([0], dtype=torch.long), src=src, group=dist_group)
            return data
        serialized = pickle.dumps(data)
        tensor_data = torch.ByteTensor(np.frombuffer(serialized, dtype=np.uint8))
        dist.broadcast(torch.tensor([len(serialized)], dtype=torch.long), src=src, group=dist_group)
        dist.broadcast(tensor_data, src=src, group=dist_group)
        return data
    tensor_size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(tensor_size, src=src, group=dist_group)
    size = int(tensor_size.item())
    if size == 0:
        return []
    tensor_data = torch.empty(size, dtype=torch.uint8)
    dist.broadcast(tensor_data, src=src, group=dist_group)
    return pickle.loads(tensor_data.numpy().tobytes())


def tensor_devices(obj: dict) -> dict[str, str]:
    """Device string of every tensor value in a processor output, e.g. ``{"grid_thws": "cuda:0"}``."""
    return {k: str(v.device) for k, v in obj.items() if isinstance(v, torch.Tensor)}


def grid_key(obj: dict) -> str | None:
    """Which grid key a processor output carries: ``"grid_thws"`` (before) or ``"image_grid_thw"``."""
    for key in ("image_grid_thw", "grid_thws"):
        if key in obj:
            return key
    return None
