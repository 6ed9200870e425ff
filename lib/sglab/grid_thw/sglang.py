"""The Kimi-K2.5 grid in real SGLang: the fix's record ``FIX``, its source check, the CPU probe (in
a release's worker: which key the model reads, what ``_gpu_call`` returns, what the wire does to the
grid), the engine scenarios (TP 2 to 8, released and with #22858's line reverted), the request's
code path and the comparison with the rebuild."""

from __future__ import annotations

import ast
import functools
import inspect
import pickle
import types
from array import array
from dataclasses import replace

from sglab.core import lazy
from sglab.grid_thw import stand_in
from sglab.sglang.engine import Case, Scenario, revert_adjustment
from sglab.sglang import bootstrap
from sglab.sglang.codepath import Node
from sglab.sglang import compare as real
from sglab.sglang import source as S
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import Stop, has_file
from sglab.sglang.upstream import Verdict


torch = lazy.Module("torch")  # for the probes and the comparison: reading FIX needs neither
rebuild = lazy.Module("sglab.grid_thw.rebuild")

KIMI_MODEL = "srt/models/kimi_k25.py"
KIMI_PROCESSOR = "srt/multimodal/processors/kimi_k25.py"
PROBE_RELEASES = ("0.5.10.post1", "0.5.11", "0.5.23")
# 0.5.10.post1 is matched with `before` on the key only: its grid came from the CPU HF processor
# (the GPU "before" never shipped in a release)
VARIANT_OF = {"0.5.10.post1": "before", "0.5.11": "after", "0.5.23": "after"}


# -- the source check (the release timeline, `sglab upstream`) -------------------------------------
def check(read) -> Verdict:
    """The state of #22858 in one SGLang, read from ``multimodal/processors/kimi_k25.py``."""
    src = read(KIMI_PROCESSOR)
    if src is None:
        return Verdict("absent",
                       "no multimodal/processors/kimi_k25.py: no Kimi-K2.5 image processor")
    tree = S.parse(src)
    gpu_call = S.find(tree, "KimiGPUProcessorWrapper._gpu_call")
    if gpu_call is None:
        return Verdict(
            "absent", "no KimiGPUProcessorWrapper._gpu_call: Kimi-K2.5 images are not "
            "preprocessed on a GPU here, so no grid is built on cuda:0")
    keys = [k for n in ast.walk(gpu_call) if isinstance(n, ast.Dict) for k in n.keys]
    keys = {k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    moved = S.mentions(gpu_call, "grid_thws.cpu()")
    on_cpu = any(  # _gpu_preprocess_images makes grid_thws with torch.tensor(...), no device=
        isinstance(v, ast.Call) and S.callee_name(v) == "tensor" and S.keyword(v, "device") is None
        for v in S.assignments(S.find(tree, "_gpu_preprocess_images"), "grid_thws"))
    if "image_grid_thw" in keys and moved:
        return Verdict(
            "pr-era", "_gpu_call moves grid_thws to the CPU (.cpu()) and returns it as "
            "image_grid_thw")
    if "image_grid_thw" in keys and on_cpu:
        return Verdict(
            "changed", "_gpu_preprocess_images builds grid_thws on the CPU (torch.tensor, no "
            "device) and _gpu_call returns it as image_grid_thw; no .cpu() needed")
    if "image_grid_thw" in keys:
        return Verdict(
            "regressed", "_gpu_call returns image_grid_thw built on the GPU without .cpu(): a "
            "cuda:0 tensor reaches every TP rank again")
    if "grid_thws" in keys and not (moved or on_cpu):
        return Verdict(
            "before", "_gpu_call returns grid_thws as built on the preprocessing GPU (not a "
            "FEATURE_NAMES key, so it reaches every TP rank as a cuda:0 tensor)")
    return Verdict("unknown",
                   f"_gpu_call returns keys {sorted(keys)}: not a shape this check recognises")


# -- the CPU probe (inside one release's worker process) -------------------------------------------
KEYS = ("grid_thws", "image_grid_thw")
IMAGE_TOKEN = "<|media_pad|>"
N_IMAGES = 3


def _images() -> list:
    return [rebuild.synthetic_image(i) for i in range(N_IMAGES)]


def _rebuilt(variant: str = "after") -> dict:
    return rebuild.gpu_call(rebuild.prompt_for(N_IMAGES), _images(), fixed=variant == "after",
                            device="cpu")


def make_item(sb, key: str, grid, pixels):
    """A real ``MultimodalDataItem`` (image) with the grid under ``key``."""
    return sb.MultimodalDataItem(modality=sb.Modality.IMAGE, feature=pixels,
                                 model_specific_data={key: grid})


class _Tower:
    """Stand-in vision tower: what ``get_image_feature`` reads; a call stops with the grid."""

    def __init__(self):
        self.dtype, self.device = torch.float32, torch.device("cpu")
        self.patch_embed = types.SimpleNamespace(proj=types.SimpleNamespace(weight=torch.zeros(1)))

    def __call__(self, pixel_values, grid_thws, *a, **k):
        raise Stop(grid_thws)


def model_rows(prepared, sb, grid, pixels) -> list[dict]:
    """Which key ``KimiK25ForConditionalGeneration.get_image_feature`` reads the grid from."""
    kimi = bootstrap.import_release_module(prepared, "sglang.srt.models.kimi_k25")
    cls = kimi.KimiK25ForConditionalGeneration
    rows = []
    for key in KEYS:
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        object.__setattr__(m, "vision_tower", _Tower())
        object.__setattr__(m, "mm_projector", lambda x: x)
        object.__setattr__(m, "use_data_parallel", False)
        seen, error = None, None
        try:
            cls.get_image_feature(m, [make_item(sb, key, grid, pixels)])
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
    ids, parts = [], text.split(IMAGE_TOKEN)
    for i, part in enumerate(parts):
        ids += [ord(c) for c in part] + ([rebuild.IMAGE_TOKEN_ID] if i < len(parts) - 1 else [])
    return {"input_ids": torch.tensor([ids], dtype=torch.int64)}


def processor_rows(prepared) -> list[dict]:
    """``KimiGPUProcessorWrapper._gpu_call`` on the CPU (none where the release lacks the file)."""
    if not has_file(prepared, KIMI_PROCESSOR):
        return []
    proc = bootstrap.import_release_module(prepared, "sglang.srt.multimodal.processors.kimi_k25")
    W = getattr(proc, "KimiGPUProcessorWrapper", None)

    def rows(**facts):
        return [{"part": "processor", "case": "_gpu_call", "metric": k, "value": v}
                for k, v in facts.items()]

    if W is None:
        return rows(exists=False)
    hf = types.SimpleNamespace(image_processor=None, tokenizer=_tokenizer, media_processor=None)
    values = dict(hf_processor=hf, image_token=IMAGE_TOKEN, image_token_id=rebuild.IMAGE_TOKEN_ID,
                  **stand_in.media_proc_cfg())
    params = inspect.signature(W.__init__).parameters
    w = W(**{k: v for k, v in values.items() if k in params})
    w._get_gpu_norm_tensors(device="cpu")
    try:
        out = w._gpu_call("abc" + (IMAGE_TOKEN + "d") * N_IMAGES + "e", _images())
    except Exception as exc:  # noqa: BLE001 - 0.5.2x moves the image to CUDA itself
        text = str(exc).strip()
        cause = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        return rows(exists=True, not_driven=cause[:160])
    want = _rebuilt()
    key = next((k for k in KEYS if k in out), None)
    grid = out.get(key) if key else None
    return rows(
        exists=True, keys=sorted(out), grid_key=key,
        grid_device=str(grid.device) if grid is not None else None,
        grid_dtype=str(grid.dtype).replace("torch.", "") if grid is not None else None,
        grid=grid.tolist() if grid is not None else None, pixel_values_match_rebuild=bool(
            torch.allclose(out["pixel_values"], want["pixel_values"], atol=1e-5)), image_tokens=int(
                (out["input_ids"] == rebuild.IMAGE_TOKEN_ID).sum()))


def wire_rows(prepared, sb, key, grid, pixels) -> list[dict]:
    """The item through the release's transport: msgpack (0.5.2x) or pickle (0.5.1x)."""
    msgpack = has_file(prepared, "srt/utils/msgpack_utils.py")
    item = make_item(sb, key, grid, pixels)
    how = "msgpack (io_struct.msgpack_encode)" if msgpack else "pickle (zmq send_pyobj)"
    if msgpack:  # TokenizedGenerateReqInput through io_struct.msgpack_encode / msgpack_decode
        io = bootstrap.import_release_module(prepared, "sglang.srt.managers.io_struct")
        from sglang.srt.sampling.sampling_params import SamplingParams  # the release's own
        from sglang.srt.utils import msgpack_utils as mu

        mm_inputs, ids = sb.MultimodalProcessorOutput(mm_items=[item]), array("i", [1, 2, 3])
        req = io.TokenizedGenerateReqInput(
            input_text="x", input_ids=ids, input_embeds=None, mm_inputs=mm_inputs,
            token_type_ids=None, sampling_params=SamplingParams(), return_logprob=False,
            logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False)
        data = io.msgpack_encode(req)
        back = io.msgpack_decode(data).mm_inputs.mm_items[0]
        meta, _ = mu._unpack_buffer_ext(memoryview(mu.enc_hook(grid).data))
        recorded = str(meta[2])  # the device string the wire stores with the tensor
    else:  # what ZMQ send_pyobj / recv_pyobj do with the processor output: pickle
        data = pickle.dumps({"mm_items": [item]}, protocol=pickle.HIGHEST_PROTOCOL)
        back, blob = pickle.loads(data)["mm_items"][0], pickle.dumps(grid)
        recorded = next((t for t in ("cuda:0", "cuda:1", "cpu") if t.encode() in blob), None)
    g = back.model_specific_data.get(key)
    kept = g is not None
    facts = dict(wire=how, bytes=len(data), item_class=type(back).__name__, key_kept=kept,
                 device_sent=str(grid.device), device_received=str(g.device) if kept else None,
                 device_recorded_on_wire=recorded, dtype_kept=kept and g.dtype == grid.dtype,
                 shape_kept=kept and tuple(g.shape) == tuple(grid.shape), values_kept=kept
                 and g.cpu().tolist() == grid.cpu().tolist())
    return [{"part": "wire", "case": key, "metric": k, "value": v} for k, v in facts.items()]


def probe(prepared, params: dict) -> list[dict]:
    """Rows ``part, case, metric, value``."""
    sb = bootstrap.import_release_module(prepared, "sglang.srt.managers.schedule_batch")
    out = _rebuilt()
    grid, pixels = out["image_grid_thw"].to(params.get("device") or "cpu"), out["pixel_values"]
    item = dict(part="item", case="class", metric="module", value=sb.MultimodalDataItem.__module__)
    rows = [item] + model_rows(prepared, sb, grid, pixels) + processor_rows(prepared)
    for key in KEYS:
        rows += wire_rows(prepared, sb, key, grid, pixels)
    return rows


# -- the real engine (`sglab engine --scenario NAME`: data/recorded/engine_grid_thw/) and the record
GRID_ON_CUDA0 = revert_adjustment(
    "revert-pr22858-grid-thw-cpu",
    "the 'before' of #22858 never shipped in a release: on 0.5.11 the PR's line `grid_thws = "
    "grid_thws.cpu()` in KimiGPUProcessorWrapper._gpu_call is removed, so the grid travels to the "
    "scheduler ranks on cuda:0 as it did before the PR; nothing else changes",
    "sglang.srt.multimodal.processors.kimi_k25", "KimiGPUProcessorWrapper._gpu_call",
    text="    grid_thws = grid_thws.cpu()\n")
# decode graphs up to batch size 4 (each rank's on its own GPU); no FlashInfer all-reduce fusion
# (on at TP > 1 on Hopper, its kernels built on the first capture: minutes, and it touches no grid);
# no grammar backend (each scheduler would import xgrammar, which the engine bundles do not carry)
KIMI_ARGS = ("--mm-attention-backend", "triton_attn", "--cuda-graph-max-bs", "4",
             "--enforce-disable-flashinfer-allreduce-fusion", "--grammar-backend", "none")


def _kimi_cases(tp: int) -> tuple:
    """Released and reverted at TP ``tp``, each with the processor made offline."""
    args = ("--tp-size", str(tp), *KIMI_ARGS)
    return (Case("released", args, (stand_in.PROCESSOR,)),
            Case("before", args, (stand_in.PROCESSOR, GRID_ON_CUDA0)))


# the prompt: Kimi-K2.5's chat template for one image (its processor expands the pad token)
_TP2 = Scenario(
    fix="grid_thw", name="05-grid-thw", gpus=2,
    what="Kimi-K2.5 tiny fed one image at TP 2: each process's memory on each GPU (NVML) "
    "with the grid on the CPU (0.5.11 as released) and with #22858's line reverted",
    model="kimi_k25_tiny", tool="engine", releases=("0.5.11",), cases=_kimi_cases(2), requests=(1,),
    input_lens=(16,), output_len=1, repeats=1, image_size=(448, 448),
    prompt="<|media_start|>image<|media_content|><|media_pad|><|media_end|> Describe it.",
    expect="before: every rank >= 1 holds memory on GPU 0; released: none")
ENGINE = (
    _TP2,
    # the same at TP 4: three ranks >= 1, so GPU 0's total grows with the rank count
    replace(
        _TP2, name="05-grid-thw-tp4", gpus=4, cases=_kimi_cases(4),
        what="Kimi-K2.5 tiny fed one image at TP 4: each process's memory on each GPU "
        "(NVML), released and with #22858's line reverted",
        expect="before: each of ranks 1-3 holds memory on GPU 0; released: none"),
    # at TP 8, seven ranks beyond rank 0. The vision tower's heads are sharded over the same TP
    # group (VisionAttention divides them by the attention TP size), and the tiny model's 4 do not
    # divide by 8: the same model with 8 vision heads of the same width (hidden 128)
    replace(
        _TP2, name="05-grid-thw-tp8", gpus=8, model="kimi_k25_tiny_tp8", cases=_kimi_cases(8),
        what="Kimi-K2.5 tiny (8 vision heads) fed one image at TP 8: each process's memory on "
        "each GPU (NVML), released and with #22858's line reverted",
        expect="before: each of ranks 1-7 holds memory on GPU 0; released: none"))

FIX = Fix(
    name="grid_thw", number="05", prs=(22858,), gpus=2,
    title="Kimi-K2.5 grid on the CPU under image_grid_thw (#22858)", check=check, hunks=(Spec(
        22858,
        symbols_in(KIMI_PROCESSOR, "KimiGPUProcessorWrapper._gpu_call",
                   "KimiGPUProcessorWrapper._cpu_call") + symbols_in(
                       KIMI_MODEL, "KimiK25ForConditionalGeneration.get_image_feature")),),
    probe=Probe("sglab.grid_thw.sglang:probe", PROBE_RELEASES), engine=ENGINE)


# -- the real answers beside the rebuild's (the notebook's real-SGLang section) --------------------
def rebuild_facts(variant: str, with_processor: bool) -> dict:
    """The rebuild's key, pickle round trip and (``with_processor``) processor output."""
    out = _rebuilt(variant)
    key = rebuild.grid_key(out)
    grid = out[key]
    item = rebuild.MMItem(modality="image", feature=out["pixel_values"],
                          model_specific_data={key: grid})
    back = rebuild.recv_pyobj(rebuild.send_pyobj(item)).model_specific_data[key]
    facts = {
        "grid key": key, "model reads it": True, "device_kept": back.device == grid.device,
        "dtype_kept": back.dtype == grid.dtype, "shape_kept": back.shape == grid.shape,
        "values_kept": back.tolist() == grid.tolist()
    }
    if with_processor:
        dtype = str(grid.dtype).replace("torch.", "")
        facts.update({
            "processor key": key, "processor grid": grid.tolist(), "processor grid dtype": dtype,
            "pixel_values equal": True
        })
    text = ("gpu_call returns grid_thws, left on the device it was built on (cuda:0 on a GPU)" if
            variant == "before" else "gpu_call returns image_grid_thw, moved to the CPU (.cpu())")
    return {**facts, "text": text + "; send_pyobj/recv_pyobj keep device, dtype, shape"}


def real_facts(result, key: str) -> dict:
    """The release's answers for the grid under ``key`` (its rebuild variant's), in words too."""
    model = real.facts(result, part="model", case=key)
    wire = real.facts(result, part="wire", case=key)
    proc = real.facts(result, part="processor")
    facts = {
        "grid key": key, "model reads it": model.get("reads_grid"),
        "device_kept": wire.get("device_received") == wire.get("device_sent"),
        **{k: wire.get(k)
           for k in ("dtype_kept", "shape_kept", "values_kept")}
    }
    if proc.get("grid_key") is not None:
        facts.update({
            "processor key": proc["grid_key"], "processor grid": proc["grid"],
            "processor grid dtype": proc["grid_dtype"],
            "pixel_values equal": proc["pixel_values_match_rebuild"]
        })
    reads = " and ".join(
        k for k in KEYS
        if real.facts(result, part="model", case=k).get("reads_grid")) or "neither key"
    text = (f"model reads {reads}; {wire.get('wire')}: grid sent on {wire.get('device_sent')}, "
            f"arrives on {wire.get('device_received')} (wire records "
            f"{wire.get('device_recorded_on_wire')!r})")
    if not proc.get("exists"):
        text += "; no GPU preprocessor (CPU HF processor)"
    elif proc.get("not_driven"):  # "AssertionError: Torch not compiled with CUDA enabled"
        why = str(proc["not_driven"]).split(": ", 1)[-1]
        text += f"; GPU preprocessor present, not run by this CPU probe ({why})"
    else:
        text += f"; GPU preprocessor returns {proc['grid_key']} on {proc['grid_device']}"
    return {**facts, "text": text}


def comparison(results: dict, variant_of: dict = VARIANT_OF):
    """Per release that ran: its grid key, model, processor and wire beside the rebuild's."""
    rows = []
    for release, result in real.ran(results).items():
        if (variant := variant_of.get(release)) is None:
            continue
        got = real_facts(result, "image_grid_thw" if variant == "after" else "grid_thws")
        want = rebuild_facts(variant, with_processor="processor key" in got)
        keys = sorted((set(got) | set(want)) - {"text"})
        rows.append(
            real.facts_row(release, "grid key, model, processor and wire", got, variant, want, keys,
                           lambda f: f["text"]))
    return real.table(rows)


# the notebook's real-SGLang section; the fix across releases, a released symbol beside the rebuild
compare = functools.partial(real.section, FIX, comparison, what="releases")
released = functools.partial(real.released, FIX)

# the request's path through the first release with the fix (0.5.11): where the grid is built, what
# moves to the CPU, the two hops that pickle it, where it is split and read
CODE_PATH_RELEASE = "0.5.11"
CODE_PATH = (Node(
    KIMI_PROCESSOR, "KimiGPUProcessorWrapper._gpu_call",
    "pixel_values and the grid built on cuda:0; #22858: grid_thws.cpu(), key image_grid_thw"),
             Node("srt/multimodal/processors/base_processor.py",
                  "BaseMultimodalProcessor.process_mm_data",
                  "moves the FEATURE_NAMES tensors (pixel_values) to the CPU; the grid is not one"),
             Node("srt/managers/mm_utils.py", "get_new_expanded_mm_items",
                  "one item per image, where it finds image_grid_thw"),
             Node("srt/managers/tokenizer_manager.py", "TokenizerManager._send_one_request",
                  "send_pyobj: the request pickled to scheduler rank 0"),
             Node("srt/managers/scheduler.py", "Scheduler.recv_requests",
                  "broadcast_pyobj to ranks ≥ 1: pickle.loads re-creates a tensor on its device"),
             Node(KIMI_MODEL, "KimiK25ForConditionalGeneration.get_image_feature",
                  "reads the grid under image_grid_thw"))
