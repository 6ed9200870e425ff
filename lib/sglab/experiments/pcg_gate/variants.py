"""The Kimi-shaped wrappers through the PR-era gate: the CPU tables of notebook 01 and the gate rows of a run.

For each variant: does the gate enable piecewise CUDA graphs, which layer stack it resolves, the ``state_dict()``
keys before and after the gate's write-back (how many under ``model.*``: the duplicate), and whether a save -> load
round trip is clean. The same facts, computed on the measured LLM inside :func:`sglab.experiments.pcg_gate.run`,
become rows of the run so that its claims can check them.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pandas as pd
from torch import nn

from sglab.fixes import pcg_gate as gate

ALL_VARIANTS = gate.VARIANTS + gate.EXTRA_VARIANTS


@contextmanager
def quiet_gate():
    """Keep the gate's "Disable piecewise CUDA graph ..." warning off the console while tables are built (the
    tables carry the message)."""
    log = logging.getLogger(gate.model_runner.__name__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def gate_facts(wrapper: nn.Module, num_hidden_layers: int, capture_tokens=None) -> dict:
    """Run the gate on ``wrapper`` and count what it left registered."""
    lm_keys = len(wrapper.language_model.state_dict())
    built = list(wrapper.state_dict())
    kw = {} if capture_tokens is None else {"piecewise_cuda_graph_tokens": capture_tokens}
    state = gate.ModelRunnerState(wrapper, num_hidden_layers=num_hidden_layers, **kw)
    with quiet_gate():
        res = gate.init_piecewise_cuda_graphs(state)
    after = list(wrapper.state_dict())
    return {"result": res, "state": state, "lm_keys": lm_keys, "keys_built": len(built),
            "model_keys_built": sum(k.startswith("model.") for k in built), "keys_after": len(after),
            "model_keys_after": sum(k.startswith("model.") for k in after),
            "named_parameters_dup": len(list(wrapper.named_parameters(remove_duplicate=False))),
            "duplicate": gate.has_duplicate_registration(wrapper)}


GATE_METRICS = (("gate_enabled", "bool"), ("lm_keys", "count"), ("state_dict_keys_built", "count"),
                ("state_dict_keys_after_gate", "count"), ("model_keys_after_gate", "count"),
                ("named_parameters_dup", "count"))


def gate_rows(language_model: nn.Module, num_hidden_layers: int, capture_tokens, variants=ALL_VARIANTS) -> list:
    """Tidy rows (variant = wrapper variant) of :func:`gate_facts` for each variant wrapped around
    ``language_model`` (the measured LLM; wrappers hold references, no weight is copied)."""
    rows = []
    for v in variants:
        f = gate_facts(gate.build_wrapper(v, language_model=language_model), num_hidden_layers, capture_tokens)
        values = {"gate_enabled": float(f["result"].enabled), "lm_keys": f["lm_keys"],
                  "state_dict_keys_built": f["keys_built"], "state_dict_keys_after_gate": f["keys_after"],
                  "model_keys_after_gate": f["model_keys_after"], "named_parameters_dup": f["named_parameters_dup"]}
        rows += [{"variant": v, "num_tokens": None, "bucket": None, "metric": m, "value": float(values[m]),
                  "unit": u} for m, u in GATE_METRICS]
    return rows


def variant_table(variants=ALL_VARIANTS) -> pd.DataFrame:
    """One row per wrapper variant after the PR-era gate ran on it (the tiny CPU LLM)."""
    canonical = gate.build_wrapper("no_alias").state_dict()
    rows = []
    for v in variants:
        w = gate.build_wrapper(v)
        f = gate_facts(w, gate.TINY_LM.num_layers)
        res = f["result"]
        rt = gate.strict_load(gate.build_wrapper(v, seed=1), w.state_dict())
        cn = gate.strict_load(w, canonical)
        rows.append({
            "variant": v,
            "gate": "PCG on" if res.enabled else "PCG off",
            "gate message": res.message,
            "layer stack": res.layer_model_path or "-",
            "state_dict keys (built)": f["keys_built"],
            "state_dict keys (after gate)": f["keys_after"],
            "of which model.*": f["model_keys_after"],
            "named_parameters(remove_duplicate=False)": f["named_parameters_dup"],
            "'model' in _modules": f["duplicate"],
            "save -> fresh load (strict)": rt.summary,
            "HF-named checkpoint -> load (strict)": cn.summary,
        })
    return pd.DataFrame(rows).set_index("variant")


def state_dict_keys(variant: str, after_gate: bool = True) -> list[str]:
    """The full key list of one variant (before or after the gate wrote ``.model``)."""
    w = gate.build_wrapper(variant)
    if after_gate:
        with quiet_gate():
            gate.init_piecewise_cuda_graphs(gate.ModelRunnerState(w, num_hidden_layers=gate.TINY_LM.num_layers))
    return list(w.state_dict())


def guard_table() -> pd.DataFrame:
    return pd.DataFrame(gate.guard_side_effects()).set_index("action")
