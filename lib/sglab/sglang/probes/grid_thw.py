"""A real ``MultimodalDataItem`` with Kimi-K2.5's image grid, over SGLang's own wire (#22858), on the CPU.

Three parts, each the release's own code:

- ``model``: which key ``KimiK25ForConditionalGeneration.get_image_feature`` (``models/kimi_k25.py``) reads the
  grid from. The class is built without its heavy ``__init__``; its vision tower is a stand-in that stops the call
  (:class:`~._support.Stop`) with the grid it was handed. An item carries the grid under one key at a time:
  ``grid_thws`` (Kimi's own name) or ``image_grid_thw`` (SGLang's standard name).
- ``processor``: ``KimiGPUProcessorWrapper._gpu_call`` (``multimodal/processors/kimi_k25.py``, 0.5.11 on) on the
  rebuild's synthetic images as CPU tensors, with the normalisation tensors the release builds put on the CPU
  and a stand-in tokenizer: the keys it returns and the grid (values, dtype, device).
- ``wire``: the item inside what the tokenizer manager sends the scheduler, through the release's transport:
  0.5.2x ``io_struct.msgpack_encode`` / ``msgpack_decode`` of a ``TokenizedGenerateReqInput`` (the tensor goes as a
  msgpack extension whose metadata records its device); 0.5.1x ZMQ ``send_pyobj`` / ``recv_pyobj`` (pickle, the
  tensor's storage carries a location tag). Device, dtype, shape and values of the grid after the trip, and the
  device string the wire recorded.

``params["device"]`` puts the grid on that device first (``cuda:0`` on a GPU box: it comes back on ``cuda:0``).
"""

from __future__ import annotations

import inspect
import pickle
import types

from sglab.sglang.probing import Stop, has_file, patched

KEYS = ("grid_thws", "image_grid_thw")
IMAGE_TOKEN = "<|media_pad|>"
N_IMAGES = 3


def _grid_and_pixels(device: str):
    from sglab.fixes import grid_thw as fx

    out = fx.gpu_call(fx.prompt_for(N_IMAGES), [fx.synthetic_image(i) for i in range(N_IMAGES)], fixed=True,
                      device="cpu")
    return out["image_grid_thw"].to(device), out["pixel_values"]


def make_item(sb, key: str, grid, pixels):
    """A real ``MultimodalDataItem`` (image) with the grid under ``key``, as the processor path builds it."""
    return sb.MultimodalDataItem(modality=sb.Modality.IMAGE, feature=pixels, model_specific_data={key: grid})


class _Tower:
    """Stand-in vision tower: the attributes ``get_image_feature`` reads; calling it stops with the grid."""

    def __init__(self):
        import torch

        self.dtype, self.device = torch.float32, torch.device("cpu")
        self.patch_embed = types.SimpleNamespace(proj=types.SimpleNamespace(weight=torch.zeros(1)))

    def __call__(self, pixel_values, grid_thws, *a, **k):
        raise Stop(grid_thws)


def model_rows(prepared, sb, grid, pixels) -> list[dict]:
    from torch import nn

    from sglab.sglang import bootstrap

    kimi = bootstrap.import_release_module(prepared, "sglang.srt.models.kimi_k25")
    cls = kimi.KimiK25ForConditionalGeneration
    rows = []
    for key in KEYS:
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        object.__setattr__(m, "vision_tower", _Tower())
        object.__setattr__(m, "mm_projector", lambda x: x)
        object.__setattr__(m, "use_data_parallel", False)
        item, seen, error = make_item(sb, key, grid, pixels), None, None
        try:
            cls.get_image_feature(m, [item])
        except Stop as stop:
            seen = stop.payload
        except Exception as exc:  # noqa: BLE001 - which key the release cannot read is the finding
            error = f"{type(exc).__name__}: {exc}"[:160]
        reads = seen is not None and seen.tolist() == grid.tolist()
        rows += [{"part": "model", "case": key, "metric": "reads_grid", "value": reads},
                 {"part": "model", "case": key, "metric": "error", "value": error}]
    return rows


def _tokenizer(text, return_tensors="pt"):
    """Stand-in tokenizer: the image token -> Kimi's id, every other character -> its code point."""
    import torch

    from sglab.fixes.grid_thw import IMAGE_TOKEN_ID

    ids, parts = [], text.split(IMAGE_TOKEN)
    for i, part in enumerate(parts):
        ids += [ord(c) for c in part] + ([IMAGE_TOKEN_ID] if i < len(parts) - 1 else [])
    return {"input_ids": torch.tensor([ids], dtype=torch.int64)}


def processor_rows(prepared) -> list[dict]:
    """``KimiGPUProcessorWrapper._gpu_call`` on the CPU; empty where the release has no GPU preprocessor."""
    import torch

    from sglab.fixes import grid_thw as fx

    from sglab.sglang import bootstrap

    if not has_file(prepared, "srt/multimodal/processors/kimi_k25.py"):
        return []
    proc = bootstrap.import_release_module(prepared, "sglang.srt.multimodal.processors.kimi_k25")
    W = getattr(proc, "KimiGPUProcessorWrapper", None)
    if W is None:
        return [{"part": "processor", "case": "_gpu_call", "metric": "exists", "value": False}]
    hf = types.SimpleNamespace(image_processor=None, tokenizer=_tokenizer, media_processor=None)
    values = dict(hf_processor=hf, image_token=IMAGE_TOKEN, image_token_id=fx.IMAGE_TOKEN_ID,
                  patch_size=fx.PATCH_SIZE, merge_kernel_size=fx.MERGE_KERNEL_SIZE, in_patch_limit=fx.IN_PATCH_LIMIT,
                  patch_limit_on_one_side=fx.PATCH_LIMIT_ON_ONE_SIDE, fixed_output_tokens=None,
                  image_mean=list(fx.IMAGE_MEAN), image_std=list(fx.IMAGE_STD))
    w = W(**{k: v for k, v in values.items() if k in inspect.signature(W.__init__).parameters})
    w._get_gpu_norm_tensors(device="cpu")
    text = "abc" + (IMAGE_TOKEN + "d") * N_IMAGES + "e"
    try:
        out = w._gpu_call(text, [fx.synthetic_image(i) for i in range(N_IMAGES)])
    except Exception as exc:  # noqa: BLE001 - 0.5.2x moves the image to CUDA itself: not drivable on a CPU
        cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return [{"part": "processor", "case": "_gpu_call", "metric": "exists", "value": True},
                {"part": "processor", "case": "_gpu_call", "metric": "not_driven", "value": cause[:160]}]
    want = fx.gpu_call(fx.prompt_for(N_IMAGES), [fx.synthetic_image(i) for i in range(N_IMAGES)], fixed=True,
                       device="cpu")
    key = next((k for k in KEYS if k in out), None)
    grid = out.get(key) if key else None
    facts = {"exists": True, "keys": sorted(out), "grid_key": key,
             "grid_device": str(grid.device) if grid is not None else None,
             "grid_dtype": str(grid.dtype).replace("torch.", "") if grid is not None else None,
             "grid": grid.tolist() if grid is not None else None,
             "pixel_values_match_rebuild": bool(torch.allclose(out["pixel_values"], want["pixel_values"], atol=1e-5)),
             "image_tokens": int((out["input_ids"] == fx.IMAGE_TOKEN_ID).sum())}
    return [{"part": "processor", "case": "_gpu_call", "metric": k, "value": v} for k, v in facts.items()]


def _send_0523(prepared, item):
    """``TokenizedGenerateReqInput`` through ``io_struct.msgpack_encode`` / ``msgpack_decode``."""
    from array import array

    from sglab.sglang import bootstrap

    io = bootstrap.import_release_module(prepared, "sglang.srt.managers.io_struct")
    sb = bootstrap.import_release_module(prepared, "sglang.srt.managers.schedule_batch")
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = io.TokenizedGenerateReqInput(
        input_text="x", input_ids=array("i", [1, 2, 3]), input_embeds=None,
        mm_inputs=sb.MultimodalProcessorOutput(mm_items=[item]), token_type_ids=None,
        sampling_params=SamplingParams(), return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
        token_ids_logprob=None, stream=False)
    data = io.msgpack_encode(req)
    return io.msgpack_decode(data).mm_inputs.mm_items[0], "msgpack (io_struct.msgpack_encode)", len(data)


def _send_pickle(item):
    """What ZMQ ``send_pyobj`` / ``recv_pyobj`` do with the processor output (``mm_inputs``): pickle."""
    data = pickle.dumps({"mm_items": [item]}, protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.loads(data)["mm_items"][0], "pickle (zmq send_pyobj)", len(data)


def _recorded_device(prepared, grid, msgpack: bool) -> str | None:
    """The device string the wire stores with the tensor."""
    if msgpack:
        from sglang.srt.utils import msgpack_utils as mu

        meta, _ = mu._unpack_buffer_ext(memoryview(mu.enc_hook(grid).data))
        return str(meta[2])
    blob = pickle.dumps(grid)
    return next((t for t in ("cuda:0", "cuda:1", "cpu") if t.encode() in blob), None)


def wire_rows(prepared, sb, key, grid, pixels) -> list[dict]:
    msgpack = has_file(prepared, "srt/utils/msgpack_utils.py")
    item = make_item(sb, key, grid, pixels)
    back, wire, nbytes = _send_0523(prepared, item) if msgpack else _send_pickle(item)
    g = back.model_specific_data.get(key)
    facts = {"wire": wire, "bytes": nbytes, "item_class": type(back).__name__, "key_kept": g is not None,
             "device_sent": str(grid.device), "device_received": str(g.device) if g is not None else None,
             "device_recorded_on_wire": _recorded_device(prepared, grid, msgpack),
             "dtype_kept": g is not None and g.dtype == grid.dtype,
             "shape_kept": g is not None and tuple(g.shape) == tuple(grid.shape),
             "values_kept": g is not None and g.cpu().tolist() == grid.cpu().tolist()}
    return [{"part": "wire", "case": key, "metric": k, "value": v} for k, v in facts.items()]


def run(prepared, params: dict) -> list[dict]:
    """Rows ``part, case, metric, value``."""
    from sglab.sglang import bootstrap

    sb = bootstrap.import_release_module(prepared, "sglang.srt.managers.schedule_batch")
    grid, pixels = _grid_and_pixels(params.get("device") or "cpu")
    rows = [{"part": "item", "case": "class", "metric": "module", "value": sb.MultimodalDataItem.__module__}]
    rows += model_rows(prepared, sb, grid, pixels)
    rows += processor_rows(prepared)
    for key in KEYS:
        rows += wire_rows(prepared, sb, key, grid, pixels)
    return rows
