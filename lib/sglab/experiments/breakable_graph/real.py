"""Notebook 03's "real SGLang, before and after": the released breakable runner beside the rebuild's two boundaries.

The probe (:mod:`sglab.sglang.probes.breakable_graph`) runs ``BreakableCudaGraphRunner.__init__`` and ``can_run``
of each release on the rebuild's own tiny models; here the rebuild's :class:`~sglab.fixes.breakable_graph.
BreakableGraphRunner` (``capture=False``: routing only) answers the same questions on the same models, and the
two are compared fact for fact: which layer stack is resolved, the warning when none is, ``can_run`` for one,
three and eight requests and for too many tokens, and whether the capture batch reads a static per-request buffer.
0.5.11 is the last release before #24662 (``boundary="before"``), 0.5.12.post1 and 0.5.13 carry it (``"after"``).
"""

from __future__ import annotations

from sglab.breakable_graph.sglang import FIX

import logging

from sglab.fixes import breakable_graph as bg
from sglab.sglang import compare_old as compare
from sglab.sglang.probes import breakable_graph as released_probe

RELEASES, PROBE = FIX.probe.releases, FIX.probe.fn  # the record's probe (sglab.breakable_graph.sglang)
VARIANT_OF = {"0.5.11": bg.BEFORE, "0.5.12.post1": bg.AFTER, "0.5.13": bg.AFTER}
CLAIM = "the rebuild's `before` and `after` runners route prefill batches as 0.5.11 and 0.5.12 do"
MULTI = "3 requests (10+12+10)"


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def rebuild_facts(boundary: str, shape: str) -> dict:
    """What the rebuild's runner decides on one model shape, named as the probe names the release's facts."""
    model = bg.build_model(shape=shape)
    log, handler = logging.getLogger(bg.breakable_cuda_graph_runner.__name__), _Warnings()
    log.addHandler(handler)
    try:
        r = bg.BreakableGraphRunner(model, boundary=boundary, capture_num_tokens=released_probe.CAPTURE_TOKENS,
                                    max_bs=released_probe.MAX_BS, capture=False)
    finally:
        log.removeHandler(handler)
    path = next((n for n, m in model.named_modules() if m is r.layer_model), None) if r.layer_model else None
    out = {"layer_model": path, "warnings": handler.messages, "max_num_tokens": r.max_num_tokens}
    for label, lens in released_probe.BATCHES.items():
        out[f"can_run · {label}"] = bool(r.can_run(bg.BatchShape(tuple(lens))))
    if boundary == bg.BEFORE or r.layer_model is not None:
        fb = r._build_capture_forward_batch(released_probe.CAPTURE_TOKENS[0])
        static = getattr(r, "static_extend_seq_lens", None)
        out["capture_reads_static_bs_buffer"] = static is not None and (
            fb.extend_seq_lens.untyped_storage().data_ptr() == static.untyped_storage().data_ptr())
    return out


def real_facts(result, shape: str) -> dict:
    """The release's facts on one model shape, from the probe's rows."""
    f = compare.facts(result, model=shape, batch="")
    out = {k: f.get(k) for k in ("layer_model", "warnings", "max_num_tokens")}
    rows = result.rows[(result.rows["model"] == shape) & (result.rows["metric"] == "can_run")]
    out.update({f"can_run · {b}": v for b, v in zip(rows["batch"], rows["value"])})
    if "capture_reads_static_bs_buffer" in f:
        out["capture_reads_static_bs_buffer"] = f["capture_reads_static_bs_buffer"]
    return out


def _flat(per_shape: dict) -> dict:
    return {f"{shape} · {k}": v for shape, f in per_shape.items() for k, v in f.items()}


def describe(flat: dict) -> str:
    """The headline of one side in words: the multi-request decision and where the layer stack was found."""
    multi = flat.get(f"causal_lm · can_run · {MULTI}")
    one = flat.get("causal_lm · can_run · 1 request (30)")
    stacks = [flat.get(f"{s} · layer_model") for s in bg.MODEL_SHAPES]
    disabled = sum(bool(flat.get(f"{s} · warnings")) for s in bg.MODEL_SHAPES)
    text = (f"{MULTI}: {'served by the graph' if multi else 'rejected → eager'}; 1 request: "
            f"{'graph' if one else 'eager'}; layer stack: "
            + (", ".join(s for s in stacks if s) or "not resolved (captures model.forward)"))
    return text + (f"; disabled with a warning on {disabled} of {len(stacks)} model shapes" if disabled else "")


def probe(releases=RELEASES) -> dict:
    """{release: ProbeResult}: recorded where the recording holds it, else run now (:func:`sglab.sglang.compare.run`)."""
    from sglab.sglang import compare_old as report

    return report.run(releases, PROBE)


def checks(results: dict | None = None, variant_of: dict | None = None) -> list[compare.Check]:
    """One :class:`~sglab.sglang.compare.Check` per release (all four model shapes compared fact for fact) against
    the variant ``variant_of`` names for it (default :data:`VARIANT_OF`)."""
    results = results if results is not None else probe()

    def one(release, r, variant):
        if compare.facts(r).get("runner_file") is None:
            return compare.Check(release, "no breakable runner in this release (the feature came later)", "-", "-",
                                 None)
        real = _flat({s: real_facts(r, s) for s in bg.MODEL_SHAPES})
        rebuilt = _flat({s: rebuild_facts(variant, s) for s in bg.MODEL_SHAPES})
        return compare.check(release, real, variant, rebuilt, sorted(set(real) | set(rebuilt)), describe)

    return compare.per_release(results, VARIANT_OF if variant_of is None else variant_of, one)


def detail(results: dict):
    """Per release × model shape × fact: the release's value, the rebuild's, and whether they are equal."""
    import pandas as pd

    rows = []
    for release, r in results.items():
        if not r.ok or compare.facts(r).get("runner_file") is None or release not in VARIANT_OF:
            continue
        for shape in bg.MODEL_SHAPES:
            real, rebuilt = real_facts(r, shape), rebuild_facts(VARIANT_OF[release], shape)
            for k in sorted(set(real) | set(rebuilt)):
                rows.append({"release": release, "model": shape, "fact": k, "real": real.get(k),
                             "rebuild": rebuilt.get(k), "equal": real.get(k) == rebuilt.get(k)})
    return pd.DataFrame(rows)
