"""Notebook 01's "real SGLang, before and after": the released Kimi-K2.5 class through the released gate, beside
the rebuild's wrapper variants.

The probe (:mod:`sglab.sglang.probes.pcg_gate`) builds each release's ``KimiK25ForConditionalGeneration`` around
the rebuild's own tiny LLM and drives the release's gate on it; the rebuild's variant for that release goes
through the rebuild's gate around the same LLM. Compared name for name: the gate's decision, the ``state_dict``
keys before and after the gate, whether ``model`` sits in ``_modules``, and the layer stack the gate resolves.
"""

from __future__ import annotations

from sglab.pcg_gate.sglang import FIX

from sglab.fixes import pcg_gate as gate
from sglab.sglang import compare_old as compare
from sglab.experiments.pcg_gate.variants import quiet_gate

RELEASES, PROBE = FIX.probe.releases, FIX.probe.fn  # the record's probe (sglab.pcg_gate.sglang)
VARIANT_OF = {"0.5.10.post1": "plain_alias", "0.5.12.post1": "no_alias", "0.5.13": "property_guard",
              "0.5.23": "property_guard"}
# the real class with nn.Module.__setattr__ restored (where the release has the guard): the property alone
CASE_VARIANT = {"as_released": None, "property_without_guard": "property_only"}
CLAIM = "the rebuild's wrapper variants pass or fail the gate, and register their keys, as the releases do"
KEYS = ("gate_enabled", "keys_before_gate", "keys_after_gate", "model_in_modules_after_gate", "layer_model_path")


def rebuild_facts(variant: str) -> dict:
    """The rebuild's wrapper through the rebuild's gate: the facts the probe reports for a release."""
    w = gate.build_wrapper(variant)
    before = sorted(w.state_dict())
    with quiet_gate():
        res = gate.init_piecewise_cuda_graphs(gate.ModelRunnerState(w, num_hidden_layers=gate.TINY_LM.num_layers))
    return {"gate_enabled": res.enabled, "keys_before_gate": before, "keys_after_gate": sorted(w.state_dict()),
            "model_in_modules_after_gate": "model" in w._modules,
            "layer_model_path": res.layer_model_path if res.enabled else None}


def real_facts(result, case: str = "as_released") -> dict:
    f = compare.facts(result, case=case)
    out = {k: f.get(k) for k in KEYS}
    out["layer_model_path"] = f.get("layer_model_path") if f.get("gate_enabled") else None
    return out


def describe(f: dict) -> str:
    if not f.get("gate_enabled"):
        return f"gate refuses (not a language model); {len(f.get('keys_after_gate') or [])} keys"
    before, after = f.get("keys_before_gate") or [], f.get("keys_after_gate") or []
    dup = sum(k.startswith("model.") for k in after)
    return (f"gate passes; keys {len(before)} → {len(after)} after the gate, {dup} under model.*; "
            f"layer stack {f.get('layer_model_path')}")


def probe(releases=RELEASES) -> dict:
    """{release: ProbeResult}: recorded where the recording holds it, else run now (:func:`sglab.sglang.compare.run`)."""
    from sglab.sglang import compare_old as report

    return report.run(releases, PROBE)


def checks(results: dict | None = None, variant_of: dict | None = None) -> list[compare.Check]:
    """One :class:`~sglab.sglang.compare.Check` per release, plus one for the guard removed where it exists."""
    results = results if results is not None else probe()

    def one(release, r, variant):
        out = []
        for case in [c for c in CASE_VARIANT if c in set(r.rows["case"])]:
            v = CASE_VARIANT[case] or variant
            label = release if case == "as_released" else f"{release}, guard removed"
            out.append(compare.check(label, real_facts(r, case), v, rebuild_facts(v), KEYS, describe))
        return out

    return compare.per_release(results, VARIANT_OF if variant_of is None else variant_of, one)
