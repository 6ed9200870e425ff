"""The real hybrid-SWA pool and decode buffers beside the rebuild, release by release (#23552, #24743).

Real rows come from :mod:`sglab.sglang.probes.swa_loc` (``SWAKVPool`` + ``SWATokenToKVPoolAllocator`` of each
release, a 3-token write through 4 layers of which 2 SWA, and ``DecodeInputBuffers`` where the release has the
PR-era runner). The rebuild answers the same questions with :mod:`sglab.fixes.swa_loc` in the same shapes. Where the
rebuild has no variant for a release (the translation of 0.5.13 on), the number it must match is the claims
module's (:data:`~.claims.KERNELS_PER_TRANSLATION_TODAY`), so that claim is checked against the real code too.
"""

from __future__ import annotations

from sglab.swa_loc.sglang import FIX

import torch

from sglab.fixes import swa_loc as fx
from sglab.sglang.releases import parse_version

from sglab.experiments.swa_loc import claims

RELEASES, PROBE = FIX.probe.releases, FIX.probe.fn  # the record's probe (sglab.swa_loc.sglang)
BUFFER_VARIANT = {"0.5.10.post1": "before", "0.5.11": "pr23552", "0.5.12.post1": "pr24743"}
PRESET_CASE = {"set_swa_loc": "set_swa_loc() before the layers", "swa_loc_arg": "swa_loc= passed to each write",
               "write_loc": "KVWriteLoc carrying swa_loc"}
RECORDED = "swa_loc"                          # data/recorded/real_swa_loc/


def probe(releases=RELEASES) -> dict:
    from sglab.sglang import compare_old as report

    return report.run(releases, PROBE)


# -- the rebuild, in the probe's shapes -------------------------------------------------------------------------
def _rebuild_pool():
    pool = fx.SWAKVPool(16, 6, 2, 4, torch.float32, [0, 2], [1, 3], "cpu")
    return pool, fx.SWATokenToKVPoolAllocator(16, 6, pool)


def rebuild_write(preset: bool) -> dict:
    """The rebuild's pool through the probe's step: one 3-token write through 4 layers (SWA layers 0 and 2).
    ``translate_calls`` made by the layers, and whether SWA layer 0's K rows sit at the allocator's paired slots."""
    pool, alloc = _rebuild_pool()
    loc = alloc.alloc(3)
    swa_slots = alloc.full_to_swa_index_mapping[loc].to(torch.int64)
    if preset:
        pool.set_swa_loc(alloc.translate_loc_from_full_to_swa(loc))
    pool.translate_calls = 0
    k = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4) + 1
    for layer in range(4):
        pool.set_kv_buffer(layer, loc, k * (layer + 1), -k)
    return {"translate_calls": pool.translate_calls,
            "landed": bool(torch.equal(pool.buffers(0)[0][swa_slots], k))}


def rebuild_translations(preset: bool) -> int:
    return rebuild_write(preset)["translate_calls"]


def rebuild_translation_ops() -> list[str]:
    """The aten ops of one rebuilt translation (each a kernel node when captured on a GPU)."""
    from sglab.sglang.probes.swa_loc import dispatched_ops

    pool, alloc = _rebuild_pool()
    return dispatched_ops(pool.translate_loc_from_full_to_swa, alloc.alloc(3))


def rebuild_buffer(variant: str):
    """(dtype, padded tail) of the rebuild's decode buffer after a full then a padded populate; None for a
    variant without the buffer."""
    cfg = fx.runner_config(variant)
    if fx.SWA_LOC_BUFFER_DTYPE[variant] is None:
        return None
    buf = fx.DecodeInputBuffers.create(device="cpu", max_bs=4, is_hybrid_swa=True, swa_loc_dtype=cfg.swa_loc_dtype)
    for swa, raw_bs in (([11, 12, 13, 14], 4), ([21, 22], 2)):
        fb = fx.ForwardBatch(torch.zeros(raw_bs, dtype=torch.int64), torch.full((raw_bs,), 5, dtype=torch.int32),
                             torch.arange(1, raw_bs + 1), torch.tensor(swa, dtype=torch.int32))
        buf.populate_from_forward_batch(forward_batch=fb, raw_bs=raw_bs, bs=4, zero_swa_on_pad=cfg.zero_swa_on_pad)
    return str(buf.out_cache_loc_swa.dtype).replace("torch.", ""), buf.out_cache_loc_swa[2:4].tolist()


# -- real against rebuilt ---------------------------------------------------------------------------------------
def _get(result, part: str, case: str, metric: str):
    d = result.rows
    d = d[(d.part == part) & (d.case == case) & (d.metric == metric)]
    return d["value"].iloc[0] if len(d) else None


def _row(release, behaviour, real, expected_from, expected):
    return {"release": release, "behaviour": behaviour, "real": real, "must match": expected_from,
            "expected": expected, "agrees": real == expected}


def release_rows(release: str, result) -> list[dict]:
    """The comparable behaviours of one release."""
    pr_era = release in claims.PR_ERA_RELEASES
    rows = []
    if _get(result, "pool", "no_swa_loc", "error") is None:
        rows.append(_row(release, "translations in one write, location not preset (2 SWA layers)",
                         _get(result, "pool", "no_swa_loc", "translate_calls"), "rebuild: before",
                         rebuild_translations(False)))
    for case, how in PRESET_CASE.items():
        if _get(result, "pool", case, "translate_calls") is not None:
            rows.append(_row(release, f"translations in the layers, {how}",
                             _get(result, "pool", case, "translate_calls"), "rebuild: #23552 / #24743",
                             rebuild_translations(True)))
            rows.append(_row(release, f"SWA rows at the allocator's paired slots, {how}",
                             _get(result, "pool", case, "swa_rows_at_paired_slots"), "rebuild: #23552 / #24743",
                             rebuild_write(True)["landed"]))
    ops = _get(result, "translation", "pool", "ops") or []
    rows.append(_row(release, f"kernels per translation ({' + '.join(o.removeprefix('aten::') for o in ops)})",
                     len(ops), "rebuild's translation" if pr_era else "claims: today's translation",
                     len(rebuild_translation_ops()) if pr_era else claims.KERNELS_PER_TRANSLATION_TODAY))
    if release in BUFFER_VARIANT:
        has = _get(result, "buffers", "decode", "has_out_cache_loc_swa")
        real = ((_get(result, "buffers", "decode", "dtype"),
                 _get(result, "buffers", "decode", "padded_tail_after_padded_populate")) if has else None)
        want = rebuild_buffer(BUFFER_VARIANT[release])
        rows.append(_row(release, "decode buffer out_cache_loc_swa: (dtype, padded tail)",
                         tuple(real) if real else None, f"rebuild: {BUFFER_VARIANT[release]}",
                         tuple(want) if want else None))
    return rows


def comparison(results: dict):
    import pandas as pd

    rows = [r for v, res in results.items() if res.ok for r in release_rows(v, res)]
    return pd.DataFrame(rows, columns=["release", "behaviour", "real", "must match", "expected", "agrees"])


def kernels_statement(results: dict) -> str:
    """Which releases translate with a gather and a cast (2 kernels per SWA layer without the preset) and which
    with one gather, with each release's own ``return`` line: read off the real rows."""
    by_source: dict = {}
    for v, r in results.items():
        if r.ok:
            ops = _get(r, "translation", "pool", "ops") or []
            by_source.setdefault((_get(r, "translation", "pool", "source"), len(ops)), []).append(v)
    if not by_source:
        return "no release ran: the kernels per translation of the real code are not known here"
    lines = []
    for (source, n), versions in sorted(by_source.items(), key=lambda kv: parse_version(kv[1][0])):
        lines.append(f"{', '.join(versions)}: `{source}` -> {n} kernel{'s' if n != 1 else ''} per translation")
    return "\n".join(lines)
