"""A real ``MultimodalDataItem`` (#22858) sent over SGLang's own msgpack wire to a process on GPU 1:
what the receiver holds on GPU 0, per process, from NVML.

Real code (0.5.23): ``managers/schedule_batch.py`` ``MultimodalDataItem`` with ``image_grid_thw`` in
its model-specific data, encoded and decoded by ``managers/io_struct.py`` ``msgpack_encode`` /
``msgpack_decode`` (the item's type added with ``hook_custom_types``), whose tensor hooks
(``utils/msgpack_utils.py``) record the tensor's device and restore it there. The sender (this
worker, GPU 0) writes the encoded bytes to a file; the receiver, a second worker of the same release
(its own shims, its own ``import sglang``), takes GPU 1 first, as a rank on GPU 1 would, then
decodes. With the grid on ``cuda:0`` the decode creates a context on GPU 0 in the receiver; with the
grid on the CPU it must not.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CASES = {"grid_on_cuda0": "cuda:0", "grid_on_cpu": "cpu"}


def wire(prepared):
    """(encode, decode, description) of the release's msgpack IPC for what carries the item to the
    scheduler: ``TokenizedGenerateReqInput.mm_inputs``, a ``MultimodalProcessorOutput`` holding
    ``mm_items``. Encoded by ``io_struct.msgpack_encode``; decoded with the hooks of
    ``io_struct._msgpack_decoder`` (``msgpack_utils`` ``dec_hook`` / ``ext_hook``) typed as that
    field (the request's other fields are not needed to move it)."""
    import msgspec

    from sglab.sglang import bootstrap

    io = bootstrap.import_release_module(prepared, "sglang.srt.managers.io_struct")
    sb = bootstrap.import_release_module(prepared, "sglang.srt.managers.schedule_batch")
    mu = bootstrap.import_release_module(prepared, "sglang.srt.utils.msgpack_utils")
    decoder = msgspec.msgpack.Decoder(sb.MultimodalProcessorOutput, dec_hook=mu.dec_hook,
                                      ext_hook=mu.ext_hook)
    return (lambda item: io.msgpack_encode(sb.MultimodalProcessorOutput(mm_items=[item])),
            lambda data: decoder.decode(data).mm_items[0],
            "io_struct.msgpack_encode of MultimodalProcessorOutput(mm_items=[item]); decoded with "
            "msgpack_utils " "dec_hook/ext_hook")


def make_item(prepared, grid_device: str):
    """One image item: CPU pixel features, ``image_grid_thw`` (1 image, 1 x 28 x 42 patches) on
    ``grid_device``."""
    import torch

    from sglab.sglang import bootstrap

    sb = bootstrap.import_release_module(prepared, "sglang.srt.managers.schedule_batch")
    modality = bootstrap.import_release_module(prepared, "sglang.srt.multimodal.modality").Modality
    item = sb.MultimodalDataItem(modality=modality.IMAGE, feature=torch.zeros(28 * 42, 16),
                                 offsets=[(0, 294)])
    item.set("image_grid_thw", torch.tensor([[1, 28, 42]], dtype=torch.int64, device=grid_device))
    return item


def _memory_rows(case: str, who: str, pid: int) -> list[dict]:
    """NVML memory of ``pid`` on every GPU (0 where it holds nothing), or one row saying why there
    is none."""
    from sglab.core.memory import all_processes, explain_no_match

    try:
        seen = all_processes()
    except RuntimeError as exc:
        return [{"variant": case, "process": who, "metric": "nvml", "value": str(exc), "unit": ""}]
    import torch

    mine = {r["gpu"]: r["used_mib"] for r in seen if r["pid"] == pid}
    rows = [{"variant": case, "process": who, "gpu": g, "metric": "gpu_memory",
             "value": round(mine.get(g, 0.0), 1),
             "unit": "MiB"} for g in range(torch.cuda.device_count())]
    if not mine:
        rows.append({"variant": case, "process": who, "metric": "nvml",
                     "value": explain_no_match([pid]), "unit": ""})
    return rows


def receive(prepared, params: dict) -> list[dict]:
    """The receiving worker: take ``params["gpu"]`` (None: no CUDA, a dry run), decode the payload
    file, report where the grid landed and this process's memory per GPU."""
    import torch

    _, decode, _ = wire(prepared)
    gpu, case = params.get("gpu"), params["case"]
    if gpu is not None:
        torch.cuda.set_device(int(gpu))
        torch.ones(1, device=f"cuda:{int(gpu)}")          # this rank's own context, on its own GPU
    item = decode(Path(params["payload"]).read_bytes())
    grid = item.image_grid_thw
    rows = [{"variant": case, "process": "receiver", "metric": "grid_device_after_decode",
             "value": str(grid.device), "unit": ""},
            {"variant": case, "process": "receiver", "metric": "grid_values",
             "value": grid.tolist(), "unit": ""}]
    if gpu is not None:
        torch.cuda.synchronize()
        rows += _memory_rows(case, "receiver", os.getpid())
    return rows


def _send(prepared, case: str, device: str, gpu, timeout: float) -> list[dict]:
    from sglab.sglang.runner import run_probe
    from sglab.sglang.gpu.record import records

    encode, _, how = wire(prepared)
    data = encode(make_item(prepared, device))
    rows = [{"variant": case, "process": "sender", "metric": "grid_device_sent", "value": device,
             "unit": ""},
            {"variant": case, "process": "sender", "metric": "payload_bytes", "value": len(data),
             "unit": "bytes"},
            {"variant": case, "process": "sender", "metric": "wire", "value": how, "unit": ""}]
    with tempfile.TemporaryDirectory(prefix="sglab-grid-") as tmp:
        payload = Path(tmp) / "item.msgpack"
        payload.write_bytes(data)
        r = run_probe(prepared.release, "sglab.sglang.gpu.grid_thw:receive",
                      {"payload": str(payload), "gpu": gpu, "case": case}, timeout=timeout)
    if not r.ok:
        return rows + [{"variant": case, "process": "receiver", "metric": "status",
                        "value": r.reason, "unit": ""}]
    return rows + records(r.rows, drop=("release", "probe"))


def run(prepared, params: dict) -> list[dict]:
    """Rows ``variant`` (case), ``process``, ``gpu``, ``metric``, ``value``, ``unit``; the sender's
    own memory too."""
    import torch

    from sglab.sglang.gpu import graphs
    from sglab.sglang import bootstrap

    receiver_gpu = params.get("receiver_gpu", 1)
    timeout = float(params.get("receiver_timeout", 240.0))
    # dry run: the wire and the receiver, no GPU
    if params.get("device") == "cpu":
        return _send(prepared, "grid_on_cpu", "cpu", None, timeout)
    graphs.require_cuda(prepared)
    if torch.cuda.device_count() <= receiver_gpu:
        raise bootstrap.NotRunnable(f"sglang {prepared.release}: needs {receiver_gpu + 1} GPUs, "
                                    f"have {torch.cuda.device_count()}")
    rows = graphs.device_rows()
    for case, device in CASES.items():
        rows += _send(prepared, case, device, receiver_gpu, timeout)
        rows += _memory_rows(case, "sender", os.getpid())
    return rows
