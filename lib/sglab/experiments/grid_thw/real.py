"""Notebook 05's "real SGLang, before and after": a real ``MultimodalDataItem`` beside the rebuild's request path.

The probe (:mod:`sglab.sglang.probes.grid_thw`) asks each release which key its Kimi model reads the grid from,
what its GPU preprocessor returns on the rebuild's images, and what its own wire (pickle in 0.5.1x, msgpack in
0.5.2x) does to the grid. The rebuild answers the same questions: the key its ``gpu_call`` emits before / after
the fix, its ``gpu_call(fixed=True)`` output, and its ``send_pyobj`` / ``recv_pyobj`` round trip. 0.5.10.post1 is
matched with ``before`` on the key only: its grid came from the CPU HF processor (the GPU "before" never shipped).
"""

from __future__ import annotations

from sglab.grid_thw.sglang import FIX

from sglab.fixes import grid_thw as fx
from sglab.sglang import compare_old as compare
from sglab.sglang.probes import grid_thw as released_probe

RELEASES, PROBE = FIX.probe.releases, FIX.probe.fn  # the record's probe (sglab.grid_thw.sglang)
VARIANT_OF = {"0.5.10.post1": "before", "0.5.11": "after", "0.5.23": "after"}
CLAIM = "the rebuild's grid key, processor output and wire behave as the released code does"
WIRE_FACTS = ("device_kept", "dtype_kept", "shape_kept", "values_kept")


def _images():
    return [fx.synthetic_image(i) for i in range(released_probe.N_IMAGES)]


def rebuild_facts(variant: str, with_processor: bool) -> dict:
    """The rebuild's answers for ``variant`` (``before`` / ``after``), named as :func:`real_facts` names them."""
    out = fx.gpu_call(fx.prompt_for(released_probe.N_IMAGES), _images(), fixed=variant == "after", device="cpu")
    key = fx.grid_key(out)
    grid = out[key]
    item = fx.MMItem(modality="image", feature=out["pixel_values"], model_specific_data={key: grid})
    back = fx.recv_pyobj(fx.send_pyobj(item)).model_specific_data[key]
    facts = {"grid key": key, "model reads it": True,
             "device_kept": back.device == grid.device, "dtype_kept": back.dtype == grid.dtype,
             "shape_kept": tuple(back.shape) == tuple(grid.shape), "values_kept": back.tolist() == grid.tolist()}
    if with_processor:
        facts.update({"processor key": key, "processor grid": grid.tolist(),
                      "processor grid dtype": str(grid.dtype).replace("torch.", ""), "pixel_values equal": True})
    return facts


def real_facts(result, key: str) -> dict:
    """The release's answers for the grid under ``key`` (the key of the variant it is matched with)."""
    model = compare.facts(result, part="model", case=key)
    wire = compare.facts(result, part="wire", case=key)
    facts = {"grid key": key, "model reads it": model.get("reads_grid"),
             "device_kept": wire.get("device_received") == wire.get("device_sent"),
             **{k: wire.get(k) for k in WIRE_FACTS[1:]}}
    proc = compare.facts(result, part="processor")
    if proc.get("grid_key") is not None:
        facts.update({"processor key": proc["grid_key"], "processor grid": proc["grid"],
                      "processor grid dtype": proc["grid_dtype"],
                      "pixel_values equal": proc["pixel_values_match_rebuild"]})
    return facts


def describe_real(result, key: str) -> str:
    model = {k: compare.facts(result, part="model", case=k).get("reads_grid") for k in released_probe.KEYS}
    wire, proc = compare.facts(result, part="wire", case=key), compare.facts(result, part="processor")
    reads = " and ".join(k for k, ok in model.items() if ok) or "neither key"
    text = (f"model reads {reads}; {wire.get('wire')}: grid sent on {wire.get('device_sent')}, arrives on "
            f"{wire.get('device_received')} (wire records {wire.get('device_recorded_on_wire')!r})")
    if not proc.get("exists"):
        return text + "; no GPU preprocessor (CPU HF processor)"
    if proc.get("not_driven"):
        return text + f"; GPU preprocessor not driven here ({proc['not_driven']})"
    return text + f"; GPU preprocessor returns {proc['grid_key']} on {proc['grid_device']}"


def describe_rebuild(variant: str) -> str:
    return {"before": "gpu_call returns grid_thws, left on the device it was built on (cuda:0 on a GPU)",
            "after": "gpu_call returns image_grid_thw, moved to the CPU (.cpu())"}[variant] + \
        "; send_pyobj/recv_pyobj keep device, dtype, shape"


def probe(releases=RELEASES) -> dict:
    """{release: ProbeResult}: recorded where the recording holds it, else run now (:func:`sglab.sglang.compare.run`)."""
    from sglab.sglang import compare_old as report

    return report.run(releases, PROBE)


def checks(results: dict | None = None, variant_of: dict | None = None) -> list[compare.Check]:
    """One :class:`~sglab.sglang.compare.Check` per release."""
    results = results if results is not None else probe()

    def one(release, r, variant):
        if variant == "-":
            return compare.Check(release, "no rebuild variant to match", "-", "-", None)
        key = "image_grid_thw" if variant == "after" else "grid_thws"
        real = real_facts(r, key)
        rebuilt = rebuild_facts(variant, with_processor="processor key" in real)
        diffs = compare.compare(real, rebuilt, sorted(set(real) | set(rebuilt)))
        return compare.Check(release, describe_real(r, key), variant, describe_rebuild(variant), not diffs, diffs)

    return compare.per_release(results, VARIANT_OF if variant_of is None else variant_of, one)
