"""Your own model for notebook 04: its sliding-window layout -> what #23552's location preset
saves per decode step (``sglab swa-cost``), priced with the recorded runs' per-SWA-layer costs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from sglab.core import notebook, runs, text
from sglab.sglang import hf_config


KEYS_LOOKED_FOR = ("layer_types", "sliding_window_pattern",
                   "use_sliding_window + max_window_layers")
# the layer types transformers accepts in ``layer_types`` (its ALLOWED_LAYER_TYPES, 4.5x to 5.x,
# and the older names it still reads)
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "window_attention",
               "indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
               "minimax_m3_sparse", "linear_attention", "conv", "mamba", "attention", "sparse",
               "dense", "hybrid", "hybrid_sliding", "moe")

# the layout the notebook's card prices, and the first row of "your own setup"
LAYOUT = {"layers": 62, "swa_per_full": 5, "batch_size": 32}

ConfigError = hf_config.ConfigError  # also: no hybrid sliding-window layout (names the keys)


@dataclass
class Layout:
    num_layers: int
    swa_layers: list
    sliding_window: Optional[int]
    found_by: str

    @property
    def n_swa(self) -> int:
        return len(self.swa_layers)


def layout(cfg: dict, source: str = "config") -> Layout:
    """The sliding-window layout of a config dict (:class:`ConfigError` where it is not hybrid)."""
    c = {**cfg, **cfg["text_config"]} if isinstance(cfg.get("text_config"), dict) else cfg
    n = c.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"{source}: no positive integer num_hidden_layers")
    window = c.get("sliding_window")
    for key in ("sliding_window", "hidden_size"):
        v = c.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{source}: {key} {json.dumps(v)}: must be a positive integer")
    types = c.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n:
            raise ConfigError(f"{source}: layer_types has {len(types)} entries for {n} layers")
        unknown = next(((i, t) for i, t in enumerate(types) if t not in LAYER_TYPES), None)
        if unknown:
            raise ConfigError(f"{source}: layer_types[{unknown[0]}] is {json.dumps(unknown[1])}, "
                              f"not a layer type transformers knows (sliding_attention, "
                              f"full_attention, …)")
        swa, how = [i for i, t in enumerate(types) if "sliding" in str(t)], "layer_types"
    elif isinstance(c.get("sliding_window_pattern"), int) and c["sliding_window_pattern"] > 0:
        p = c["sliding_window_pattern"]
        swa, how = [i for i in range(n) if (i + 1) % p != 0], f"sliding_window_pattern={p}"
    elif c.get("use_sliding_window") and isinstance(c.get("max_window_layers"), int):
        if not 0 <= c["max_window_layers"] <= n:
            raise ConfigError(f"{source}: max_window_layers {c['max_window_layers']}: must be "
                              f"between 0 and num_hidden_layers ({n})")
        swa = list(range(c["max_window_layers"], n))
        how = f"use_sliding_window, max_window_layers={c['max_window_layers']}"
    else:
        extra = (f"; it has sliding_window={window} for every layer, which is not a hybrid layout "
                 "(SGLang's SWA "
                 "pool serves models that mix sliding-window and full layers)") if window else ""
        raise ConfigError(f"{source}: no sliding-window layout found (looked for "
                          f"{', '.join(KEYS_LOOKED_FOR)}){extra}")
    if not swa or len(swa) == n:
        kind = "no sliding-window layer" if not swa else "only sliding-window layers"
        raise ConfigError(f"{source}: {how} gives {kind} out of {n}: not a hybrid SWA model, the "
                          f"preset does not apply")
    return Layout(n, swa, window if isinstance(window, int) else None, how)


def read_config(path) -> Layout:
    """The layout of a ``config.json``, or of ``DIR/config.json`` when given a model folder."""
    return layout(hf_config.read(path).data, str(hf_config.path_of(path)))


@dataclass
class LayerCost:
    gpu: str
    run: str
    extra_kernels_per_swa_layer: float
    us_per_swa_layer: dict  # batch size -> µs saved per SWA layer per replay (median over layouts)


def layer_cost(run) -> LayerCost:
    """Before − #24743 per SWA layer in one run: kernel nodes, and µs per batch size."""
    d = run.df[run.df.n_swa_layers > 0]
    idx = ["num_layers", "swa_per_full", "n_swa_layers", "batch_size"]

    def per_swa_layer(metric):
        t = d[d.metric == metric].pivot_table(index=idx, columns="variant", values="value")
        return (t["before"] - t["pr24743"]) / t.index.get_level_values("n_swa_layers")

    by_bs = (per_swa_layer("time_median") * 1e3).groupby(level="batch_size").median()
    return LayerCost(runs.gpu_short(run.manifest), run.path.name,
                     float(per_swa_layer("graph_kernel_nodes").median()),
                     {int(b): float(v)
                      for b, v in by_bs.items()})


def measured_costs() -> list:
    """:func:`layer_cost` of the newest recorded swa_loc run of each GPU model."""
    return [layer_cost(r) for r in runs.newest(runs.load_all_recorded("swa_loc"), runs.gpu_short)]


def predict(lay: Layout, *, batch_size: int = 32, max_bs: int = 256, costs: Optional[list] = None):
    """Per recorded GPU model: extra kernels and µs per decode step without the preset."""
    import pandas as pd

    costs = measured_costs() if costs is None else costs
    rows, n_full = [], lay.num_layers - lay.n_swa
    for c in costs:
        bs = min(c.us_per_swa_layer, key=lambda b: (abs(b - batch_size), b))
        kernels_ = round(c.extra_kernels_per_swa_layer * lay.n_swa, 1)
        us = round(c.us_per_swa_layer[bs] * lay.n_swa, 1)
        rows.append({
            "GPU": c.gpu, "SWA layers": lay.n_swa, "full layers": n_full,
            "extra kernels per decode step": kernels_, f"extra µs per decode step (bs {bs})": us,
            "int64 buffer bytes wasted": 4 * max_bs, "measured in": c.run
        })
    df = text.counts(pd.DataFrame(rows), ["extra kernels per decode step"], where_whole=True)
    df.attrs["layout"] = (f"{lay.num_layers} layers, {lay.n_swa} sliding-window ({lay.found_by}"
                          + (f", window {lay.sliding_window}" if lay.sliding_window else "") + ")")
    return df


def pattern_table(layers: int, swa_per_full: int, batch_size: int, max_bs: int = 256,
                  costs: Optional[list] = None):
    """:func:`predict` for ``layers`` layers, ``swa_per_full`` SWA layers per full one."""
    import pandas as pd

    cfg = {"num_hidden_layers": int(layers), "sliding_window_pattern": int(swa_per_full) + 1}
    try:
        lay = layout(cfg, f"{layers} layers, {swa_per_full} SWA per full")
    except ConfigError as e:
        return pd.DataFrame([{"note": str(e)}])
    df = predict(lay, batch_size=int(batch_size), max_bs=int(max_bs), costs=costs)
    us = next(c for c in df.columns if c.startswith("extra µs per decode step"))
    df.insert(
        df.columns.get_loc(us) + 1, "µs measured at bs", int(us.rsplit("bs ", 1)[1].rstrip(")")))
    return df.rename(columns={us: "extra µs per decode step"})


def step_cost(run, layers: int, swa_per_full: int, batch_size: int) -> dict:
    """What a decode step pays without the preset, at ``run``'s costs."""
    row = pattern_table(layers, swa_per_full, batch_size, costs=[layer_cost(run)]).iloc[0]
    return dict(swa_layers=int(row["SWA layers"]),
                kernels=float(row["extra kernels per decode step"]),
                us=float(row["extra µs per decode step"]))


def your_setup(interactive: bool = False):
    """Layers, SWA layers per full one, batch size, slots -> what a decode step pays."""
    static = [{**LAYOUT, "max_bs": 256},
              dict(layers=48, swa_per_full=3, batch_size=32, max_bs=256),
              dict(layers=24, swa_per_full=1, batch_size=1, max_bs=256)]
    choices = dict(layers=[8, 16, 24, 32, 48, 62, 80], swa_per_full=[1, 2, 3, 5, 7],
                   batch_size=[1, 8, 32, 128, 256], max_bs=[64, 128, 256, 512])
    return notebook.explore(pattern_table, choices, static=static, interactive=interactive,
                            title="Your model: what the SWA location preset saves per decode step")
