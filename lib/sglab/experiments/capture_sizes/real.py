"""The capture sizes real SGLang releases keep, beside the rebuild's variants (#23972).

Real rows come from :mod:`sglab.sglang.probes.capture_sizes` (each release's own runner code decides, for the
notebook's attention TP / CP / dense-TP 1 / two-batch-overlap settings). Each release must match one rebuilt rule
(:data:`VARIANT`): 0.5.10.post1 captures the list as given; 0.5.11 has #23972's filter; 0.5.14 lost the filter in
the runner refactor; 0.5.23 rounds every size up to the decode runner's alignment (x2 under two-batch overlap).
Decode batch sizes follow the decode runner's older filter in every release.
"""

from __future__ import annotations

from sglab.capture_sizes.sglang import FIX

from sglab.fixes import capture_sizes as fx
from sglab.sglang.probes.capture_sizes import MAX_RUNNING_REQUESTS, SETTINGS

RELEASES, PROBE = FIX.probe.releases, FIX.probe.fn  # the record's probe (sglab.capture_sizes.sglang)
VARIANT = {"0.5.10.post1": "before", "0.5.11": "pr_filter", "0.5.14": "before", "0.5.23": "today"}
DECODE = [1, 2, 4, 8, 12] + list(range(16, 257, 8))   # ServerArgs' decode list for --cuda-graph-max-bs 256
UNALIGNED = {"tp8_dense_tp1_unaligned": dict(tp_size=8, moe_dense_tp_size=1, piecewise=[4, 12, 20])}
RECORDED = "capture_sizes"                     # data/recorded/real_capture_sizes/


def settings() -> dict:
    return {**SETTINGS, **UNALIGNED}


def params(max_tokens: int = fx.MLA_MAX_TOKENS) -> dict:
    return {"piecewise": fx.default_piecewise_capture_sizes(max_tokens), "decode": DECODE, "max_tokens": max_tokens,
            "settings": settings()}


def probe(releases=RELEASES, max_tokens: int = fx.MLA_MAX_TOKENS) -> dict:
    from sglab.sglang import compare_old as report

    return report.run(releases, PROBE, params(max_tokens))


def widths(setting: dict) -> tuple[int, int, bool, bool]:
    """(attention TP, attention CP, gathered, two-batch overlap) of a setting, by the rebuild."""
    a = fx.ParallelArgs(**{k: v for k, v in setting.items() if k != "piecewise"})
    return fx.attention_tp_size(a), a.attn_cp_size, fx.require_gathered_buffer(a), a.enable_two_batch_overlap


def rebuild_piecewise(variant: str, setting: dict, configured: list):
    """The rebuilt rule's piecewise list, or the PR's assertion as SGLang words it."""
    tp, cp, gathered, tbo = widths(setting)
    sizes = setting.get("piecewise", configured)
    if variant == "pr_filter":
        try:
            return fx.filter_piecewise_capture_sizes(sizes, tp, cp, gathered=gathered)
        except fx.NoCaptureSizes as exc:
            return f"AssertionError: {exc}"
    if variant == "today":
        return fx.today_capture_sizes(sizes, tp, cp, gathered=gathered, two_batch_overlap=tbo)
    return list(sizes)


def rebuild_decode(setting: dict) -> list:
    tp, cp, gathered, tbo = widths(setting)
    return fx.filter_decode_batch_sizes(DECODE, tp, cp, gathered=gathered, two_batch_overlap=tbo,
                                        num_max_requests=MAX_RUNNING_REQUESTS)


def describe(sizes, configured: list) -> str:
    """A list as what it changed: ``n sizes`` plus what it dropped and added against the configured list."""
    if isinstance(sizes, str):
        return sizes
    dropped = [n for n in configured if n not in sizes]
    added = [n for n in sizes if n not in configured]
    text = f"{len(sizes)} sizes"
    if dropped:
        text += f", drops {dropped[:6]}{'…' if len(dropped) > 6 else ''}"
    if added:
        text += f", adds {added[:6]}{'…' if len(added) > 6 else ''}"
    return text if dropped or added else text + ", as configured"


def _real(result, setting: str) -> dict:
    d = result.rows[result.rows.setting == setting]
    return dict(zip(d.metric, d.value))


def comparison(results: dict, max_tokens: int = fx.MLA_MAX_TOKENS):
    """One row per (release, setting): the real and rebuilt piecewise lists (described), ``agrees`` when the
    piecewise lists (or the assertion) and the decode lists are equal."""
    import pandas as pd

    configured, rows = fx.default_piecewise_capture_sizes(max_tokens), []
    for release, result in results.items():
        if not result.ok:
            continue
        for name, setting in settings().items():
            real = _real(result, name)
            got = real.get("piecewise", real.get("error"))
            want = rebuild_piecewise(VARIANT[release], setting, configured)
            decode_ok = "error" in real or real.get("decode") == rebuild_decode(setting)
            base = setting.get("piecewise", configured)
            rows.append({"release": release, "setting": name, "attn TP/CP": "{}/{}".format(*widths(setting)[:2]),
                         "real piecewise": describe(got, base), "rebuild variant": VARIANT[release],
                         "rebuild piecewise": describe(want, base), "decode lists equal": decode_ok,
                         "agrees": got == want and decode_ok})
    return pd.DataFrame(rows)


def defaults_line(results: dict, max_tokens: int = fx.MLA_MAX_TOKENS) -> str:
    """Does each release generate the rebuilt default piecewise list?"""
    want = fx.default_piecewise_capture_sizes(max_tokens)
    parts = []
    for v, r in results.items():
        if r.ok:
            got = _real(r, "defaults").get("generated_piecewise")
            parts.append(f"{v}: {'same' if got == want else 'DIFFERENT' if got is not None else 'not reachable'}")
    return f"default piecewise list for max {max_tokens} tokens vs the rebuilt one: " + "; ".join(parts)


def round_up_note(results: dict, max_tokens: int = fx.MLA_MAX_TOKENS) -> str:
    """Whether the notebook's "round up" policy (``analysis.policy_lists``) is 0.5.23's real list in every gathered
    setting, and where rounding to the PR's ``mul_base`` alone (two-batch overlap ignored) would not be."""
    from sglab.experiments.capture_sizes.analysis import policy_lists

    r = results.get("0.5.23")
    if r is None or not r.ok:
        return "sglang 0.5.23 did not run: the rebuild's round-up policy is not checked against it here"
    configured, lines = fx.default_piecewise_capture_sizes(max_tokens), []
    for name, setting in SETTINGS.items():
        tp, cp, gathered, tbo = widths(setting)
        if not gathered:
            continue
        real = _real(r, name).get("piecewise")
        ours = policy_lists(configured, tp, cp, tbo)["round_up"]
        pr_base = fx.round_up_capture_sizes(configured, fx.piecewise_mul_base(tp, cp))
        line = (f"{name}: 0.5.23 captures {real[:4]}…; the rebuild's round-up "
                + ("agrees" if real == ours else f"DIFFERS: {ours[:4]}…"))
        if pr_base != real:
            line += f"; rounding to the PR's mul_base {fx.piecewise_mul_base(tp, cp)} alone gives {pr_base[:4]}…"
        lines.append(line)
    return "\n".join(lines)
