"""Your model: what the SWA location preset (SGLang #23552 / #24743) is worth for a given sliding-window layout.

``sglab swa-cost CONFIG.json`` reads a Hugging Face ``config.json`` and finds which decoder layers use a sliding
window. Without the preset, every SWA layer translates the full-pool location to the SWA pool inside the captured
decode graph, every step; the prediction multiplies the number of SWA layers by what one SWA layer costs, as
measured on GPUs in the newest recorded ``swa_loc`` run of each GPU model (extra kernel nodes per SWA layer, µs
saved per SWA layer per replay at the nearest batch size). #23552's int64 ``out_cache_loc_swa`` buffer holds 8 bytes
per captured token slot where the translation yields int32: 4 bytes wasted per slot, and a converting copy per
replay.

Layouts recognised, in this order (a nested ``text_config`` is read first when present):
``layer_types`` (``"sliding_attention"`` / ``"full_attention"``, transformers >= 4.5x), ``sliding_window_pattern`` N
(every N-th layer full, Gemma 3's older configs), ``use_sliding_window`` + ``max_window_layers`` (Qwen2 style).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

KEYS_LOOKED_FOR = ("layer_types", "sliding_window_pattern", "use_sliding_window + max_window_layers")


class ConfigError(ValueError):
    """A config that cannot be read, or has no hybrid sliding-window layout (the message says which keys were
    looked for)."""


@dataclass
class Layout:
    num_layers: int
    swa_layers: list[int]
    sliding_window: int | None
    found_by: str
    model_type: str = ""

    @property
    def n_swa(self) -> int:
        return len(self.swa_layers)

    @property
    def n_full(self) -> int:
        return self.num_layers - self.n_swa


def _text(cfg: dict) -> dict:
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else cfg


def layout(cfg: dict, source: str = "config") -> Layout:
    """The sliding-window layout of a config dict; :class:`ConfigError` when it has none or only one kind."""
    c = _text(cfg)
    n = c.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"{source}: no positive integer num_hidden_layers")
    window, mtype = c.get("sliding_window"), str(c.get("model_type", ""))
    types = c.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n:
            raise ConfigError(f"{source}: layer_types has {len(types)} entries for {n} layers")
        swa = [i for i, t in enumerate(types) if "sliding" in str(t)]
        how = "layer_types"
    elif isinstance(c.get("sliding_window_pattern"), int) and c["sliding_window_pattern"] > 0:
        p = c["sliding_window_pattern"]
        swa = [i for i in range(n) if (i + 1) % p != 0]
        how = f"sliding_window_pattern={p}"
    elif c.get("use_sliding_window") and isinstance(c.get("max_window_layers"), int):
        swa = [i for i in range(c["max_window_layers"], n)]
        how = f"use_sliding_window, max_window_layers={c['max_window_layers']}"
    else:
        extra = (f"; it has sliding_window={window} for every layer, which is not a hybrid layout (SGLang's SWA pool "
                 "serves models that mix sliding-window and full layers)") if window else ""
        raise ConfigError(f"{source}: no sliding-window layout found (looked for {', '.join(KEYS_LOOKED_FOR)})"
                          f"{extra}")
    if not swa or len(swa) == n:
        kind = "no sliding-window layer" if not swa else "only sliding-window layers"
        raise ConfigError(f"{source}: {how} gives {kind} out of {n}: not a hybrid SWA model, the preset does not apply")
    return Layout(n, swa, window if isinstance(window, int) else None, how, mtype)


def read_config(path: str | Path) -> Layout:
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: a config.json holds a JSON object")
    return layout(cfg, str(path))


# --------------------------------------------------------------------------------------------------------------
# per-SWA-layer costs, measured
# --------------------------------------------------------------------------------------------------------------
@dataclass
class LayerCost:
    gpu: str
    run: str
    extra_kernels_per_swa_layer: float
    us_per_swa_layer: dict  # batch size -> µs saved per SWA layer per replay (median over layouts)


def measured_costs() -> list[LayerCost]:
    """From the newest recorded swa_loc run of each GPU model: before − #24743 per SWA layer."""
    from sglab.core import runs

    out = []
    for gpu, run in runs.newest_by(runs.load_all_recorded("swa_loc"), runs.gpu_short).items():
        d = run.df
        d = d[d.n_swa_layers > 0]
        nodes = d[d.metric == "graph_kernel_nodes"].pivot_table(
            index=["num_layers", "swa_per_full", "n_swa_layers", "batch_size"], columns="variant", values="value")
        per = ((nodes["before"] - nodes["pr24743"]) / nodes.index.get_level_values("n_swa_layers")).median()
        t = d[d.metric == "time_median"].pivot_table(
            index=["num_layers", "swa_per_full", "n_swa_layers", "batch_size"], columns="variant", values="value")
        saved = (t["before"] - t["pr24743"]) * 1e3 / t.index.get_level_values("n_swa_layers")
        by_bs = saved.groupby(level="batch_size").median()
        out.append(LayerCost(gpu, run.path.name, float(per), {int(b): float(v) for b, v in by_bs.items()}))
    return out


def _nearest(d: dict, key: int) -> tuple[int, float]:
    k = min(d, key=lambda b: (abs(b - key), b))
    return k, d[k]


def predict(lay: Layout, *, batch_size: int = 32, max_bs: int = 256, costs: list[LayerCost] | None = None):
    """One row per GPU model with a recorded run: extra kernels and µs per decode step without the preset, and the
    int64 buffer's waste (bytes, for ``max_bs`` captured slots)."""
    import pandas as pd

    costs = measured_costs() if costs is None else costs
    rows = []
    for c in costs:
        bs, us = _nearest(c.us_per_swa_layer, batch_size)
        rows.append({"GPU": c.gpu, "SWA layers": lay.n_swa, "full layers": lay.n_full,
                     "extra kernels per decode step": round(c.extra_kernels_per_swa_layer * lay.n_swa, 1),
                     f"extra µs per decode step (bs {bs})": round(us * lay.n_swa, 1),
                     "int64 buffer bytes wasted": 4 * max_bs,
                     "measured in": c.run})
    df = pd.DataFrame(rows)
    df.attrs["layout"] = (f"{lay.num_layers} layers, {lay.n_swa} sliding-window ({lay.found_by}"
                          + (f", window {lay.sliding_window}" if lay.sliding_window else "") + ")")
    return df


def pattern_table(layers: int, swa_per_full: int, batch_size: int, max_bs: int = 256):
    """The notebook's question as a table: a model of ``layers`` decoder layers with ``swa_per_full`` sliding-window
    layers per full layer (Gemma 3: 5) -> :func:`predict`. The layout is built as a ``sliding_window_pattern``
    config (every ``swa_per_full + 1``-th layer full), the same path a real config takes."""
    import pandas as pd

    cfg = {"num_hidden_layers": int(layers), "sliding_window_pattern": int(swa_per_full) + 1}
    try:
        lay = layout(cfg, f"{layers} layers, {swa_per_full} SWA per full")
    except ConfigError as e:
        return pd.DataFrame([{"note": str(e)}])
    df = predict(lay, batch_size=int(batch_size), max_bs=int(max_bs))
    us = next(c for c in df.columns if c.startswith("extra µs per decode step"))
    df.insert(df.columns.get_loc(us) + 1, "µs measured at bs", int(us.rsplit("bs ", 1)[1].rstrip(")")))
    return df.rename(columns={us: "extra µs per decode step"})
