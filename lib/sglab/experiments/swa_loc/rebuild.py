"""The rebuild on the CPU, live in the notebook on any machine: what each runner state records at capture, the
two eager paths, the padding scenario and which location dtype reaches the SWA pool.

Without a GPU a runner "captures" by running the step with the Python state it would be captured with and
"replays" by re-running it with that state, so the counts and pool contents here are what real graphs hold.
"""

from __future__ import annotations

from typing import Iterable

from sglab.fixes import swa_loc as fx
from sglab.experiments.swa_loc.run import pad_bug_scenario

SMALL = dict(size=64, size_swa=32, head_num=1, head_dim=8)


def variants_table():
    """The three runner states: preset before capture, buffer dtype, zeroing on a padded batch."""
    import pandas as pd

    rows = []
    for v in fx.VARIANTS:
        cfg = fx.runner_config(v)
        rows.append({"variant": v, "set_swa_loc before capture": cfg.preset_swa_loc,
                     "out_cache_loc_swa buffer": str(cfg.swa_loc_dtype).replace("torch.", "") if cfg.swa_loc_dtype
                     else "—", "zeroed on a padded batch": cfg.zero_swa_on_pad if cfg.preset_swa_loc else "n/a"})
    return pd.DataFrame(rows).set_index("variant")


def capture_calls(layer_counts: Iterable[int] = (6, 12, 24, 48), ratios: Iterable[int] = (5, 1), bs: int = 8):
    """``translate_loc_from_full_to_swa`` calls while each variant's graph is captured, per layout."""
    import pandas as pd

    rows = []
    for ratio in ratios:
        for L in layer_counts:
            row = {"swa_per_full": ratio, "layers": L, "SWA layers": len(fx.hybrid_layer_ids(L, ratio)[0])}
            for v in fx.VARIANTS:
                s = fx.build_setup(num_layers=L, swa_per_full=ratio, **SMALL)
                r = fx.DecodeGraphRunner.for_variant(s.model, [bs], v)
                r.capture()
                row[f"translate calls in capture ({v})"] = r.capture_translate_calls[bs]
            rows.append(row)
    return pd.DataFrame(rows).set_index(["swa_per_full", "layers"])


def eager_paths(num_layers: int = 12, swa_per_full: int = 5) -> dict:
    """The same decode batch eagerly with the per-layer translation and with the preset: translate calls of each,
    and whether the two pools end up identical (padding slot included)."""
    a, b = (fx.build_setup(num_layers=num_layers, swa_per_full=swa_per_full, **{**SMALL, "head_num": 2})
            for _ in range(2))
    ba, bb = fx.decode_batch(a, [3, 9, 27], [4, 5, 6]), fx.decode_batch(b, [3, 9, 27], [4, 5, 6])
    a.pool.translate_calls = b.pool.translate_calls = 0
    fx.forward_eager(a.model, ba, use_precomputed_swa_loc=False)
    fx.forward_eager(b.model, bb, use_precomputed_swa_loc=True)
    return {"translate calls, per-layer path": a.pool.translate_calls,
            "translate calls, preset path": b.pool.translate_calls,
            "pools identical": fx.pool_diff(a.pool, b.pool, skip_padding_slot=False) == {}}


def pad_scenarios(num_layers: int = 12):
    """The padding scenario of every variant, eagerly: stale tail slots, who owns them, what was corrupted."""
    import pandas as pd

    rows = []
    for v in fx.VARIANTS:
        r = pad_bug_scenario(v, num_layers=num_layers)
        hit = [lyr for lyr in r["swa_layer_ids"] if lyr in r["corrupted"]]
        rows.append({
            "variant": v, "stale tail slots (SWA)": r["stale_tail_swa_slots"],
            "their owners (still running)": r["owners_still_running"],
            "predicted corrupted slots": r["predicted_slots"],
            "SWA layers corrupted": f"{len(hit)} of {len(r['swa_layer_ids'])}",
            "slots corrupted per SWA layer": sorted({tuple(x) for x in r["corrupted"].values()}) or "none",
            "full layers corrupted": [lyr for lyr in r["full_layer_ids"] if lyr in r["corrupted"]] or "none",
            "exactly as predicted": r["matches_prediction"]})
    return pd.DataFrame(rows).set_index("variant")


def seen_dtypes(variant: str) -> dict:
    """Which location dtype reaches the SWA sub-pool's write on the eager path and on the graph path."""
    s = fx.build_setup(num_layers=6, swa_per_full=5, **SMALL)
    seen: list = []
    original = s.pool.swa_kv_pool.set_kv_buffer

    def spy(i, loc, k, v):
        seen.append(str(loc.dtype).replace("torch.", ""))
        original(i, loc, k, v)

    s.pool.swa_kv_pool.set_kv_buffer = spy
    fx.forward_eager(s.model, fx.decode_batch(s, [1, 2, 3], [4, 5, 6]))
    eager = sorted(set(seen))
    r = fx.DecodeGraphRunner.for_variant(s.model, [4], variant)
    s.pool.set_swa_loc(None)
    r.capture()
    seen.clear()
    r.replay(fx.decode_batch(s, [1, 2, 3], [4, 5, 6]))
    buf = r.buffers.out_cache_loc_swa
    return {"variant": variant, "eager path": eager, "graph path": sorted(set(seen)),
            "buffer bytes / token": buf.element_size() if buf is not None else 0}


def dtypes_table():
    import pandas as pd

    return pd.DataFrame([seen_dtypes(v) for v in fx.VARIANTS]).set_index("variant")
