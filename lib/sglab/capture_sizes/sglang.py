"""The capture sizes real SGLang releases use: the fix's record ``FIX`` (PR, hunk, probe, engine
scenarios, code path), its source check, the real lists beside the rebuild's rules
(:func:`compare`), and :func:`ask`, your server arguments put to several releases."""

from __future__ import annotations

import ast
import dataclasses
import functools

import pandas as pd

from sglab.capture_sizes import release_probe as rp
from sglab.capture_sizes.release_probe import (ASSUMED, MAX_RUNNING_REQUESTS, PIECEWISE_RUNNER,
                                               SETTINGS)
from sglab.capture_sizes.release_probe import MODEL, PUBLISHED, model_config  # noqa: F401
from sglab.core import lazy
from sglab.sglang.codepath import Node
from sglab.sglang.engine import Case, Scenario
from sglab.sglang import compare as real
from sglab.sglang import source as S
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import has_file
from sglab.sglang.runner import run_probes
from sglab.sglang.upstream import Verdict

# the rebuild (torch) is imported by the functions that use it: reading FIX needs none of it
fx = lazy.Module("sglab.capture_sizes.rebuild")

PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
ROUND_UP_HOMES = ("srt/utils/common.py", "srt/model_executor/runner/base_cuda_graph_runner.py")
PROBE_RELEASES = ("0.5.10.post1", "0.5.11", "0.5.14", "0.5.23")
# the rebuilt rule each release must match
VARIANT = {"0.5.10.post1": "before", "0.5.11": "pr_filter", "0.5.14": "before", "0.5.23": "today"}
DECODE = [1, 2, 4, 8, 12] + list(range(16, 257, 8))  # ServerArgs' list for --cuda-graph-max-bs 256


# -- the source check (the release timeline, `sglab upstream`) -------------------------------------
def _mod_filter(node) -> bool:
    """A ``% mul_base == 0`` / ``% attn_tp_size == 0`` comprehension filter under ``node``."""
    for comp in (n for n in ast.walk(node) if isinstance(n, ast.comprehension)):
        for cond in comp.ifs:
            for b in ast.walk(cond):
                if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mod) and \
                        any(k in ast.unparse(b.right) for k in ("mul_base", "attn_tp_size")):
                    return True
    return False


def _rounds_up(read, tree, values) -> str | None:
    """The call chain rounding the prefill runner's sizes up to the alignment, or None."""
    names = {S.callee_name(c) for v in values for c in ast.walk(v) if isinstance(c, ast.Call)}
    chain = []
    for name in sorted(names):  # one level into this module's own helpers
        helper = S.find(tree, name)
        inner = ({S.callee_name(c)
                  for c in ast.walk(helper) if isinstance(c, ast.Call)} if helper else set())
        if "get_cuda_graph_max_batch_size" in inner or "ceil_align" in inner:
            chain.append(name)
    if not chain:
        return None
    for rel in ROUND_UP_HOMES:
        _, home = S.parsed(read, rel)
        fn = S.find(home, "get_cuda_graph_max_batch_size")
        if fn is not None and S.calls(fn, "ceil_align"):
            return (f"{chain[0]} → get_cuda_graph_max_batch_size → ceil_align "
                    f"({rel.split('/', 1)[1]})")
    if any(S.calls(S.find(tree, n), "ceil_align") for n in chain):
        return f"{chain[0]} → ceil_align"
    return None


def check(read) -> Verdict:
    """The state of #23972 in one SGLang: the PR-era piecewise runner or the prefill runner."""
    src, tree = S.parsed(read, PIECEWISE_RUNNER)
    if src is not None:
        init = S.find(tree, "PiecewiseCudaGraphRunner.__init__")
        if init is None:
            return Verdict(
                "unknown", "piecewise_cuda_graph_runner.py has no "
                "PiecewiseCudaGraphRunner.__init__")
        if _mod_filter(init):
            return Verdict(
                "pr-era", "PiecewiseCudaGraphRunner.__init__ keeps only capture sizes divisible by "
                "mul_base (attention TP, x CP) when the gathered buffer is required")
        return Verdict(
            "before", "PiecewiseCudaGraphRunner.__init__ captures every configured size: sizes not "
            "divisible by attention TP reach the dense-TP1 reduce-scatter")
    src, tree = S.parsed(read, PREFILL_RUNNER)
    if src is None:
        return Verdict("absent", "no piecewise or prefill CUDA-graph runner in this SGLang")
    values = S.assignments(S.find(tree, "PrefillCudaGraphRunner.__init__"),
                           "self.capture_num_tokens")
    if not values:
        return Verdict("unknown",
                       "PrefillCudaGraphRunner.__init__ does not set self.capture_num_tokens")
    chain = _rounds_up(read, tree, values)
    if chain:
        return Verdict(
            "changed", f"PrefillCudaGraphRunner rounds each capture size up to the "
            f"TP/CP alignment ({chain}) instead of dropping it")
    if any(_mod_filter(v) for v in values):
        return Verdict(
            "changed", "PrefillCudaGraphRunner filters capture sizes by the attention-TP alignment")
    return Verdict(
        "regressed", f"piecewise_cuda_graph_runner.py is gone; PrefillCudaGraphRunner captures "
        f"{ast.unparse(values[0])} with no TP/CP alignment (the PR's filter was lost)")


# -- the probe (its code in the release's worker process: release_probe.py) ------------------------
def probe(prepared, params: dict) -> list[dict]:
    """The release's rows (in its worker, :mod:`.release_probe`): per setting and per case."""
    if not (has_file(prepared, PIECEWISE_RUNNER) or has_file(prepared, PREFILL_RUNNER)):
        why = f"sglang {prepared.release} has no piecewise or prefill CUDA-graph runner"
        return [dict(case=c, metric="unsupported", value=why) for c in params.get("cases", {})]
    rows = rp.setting_rows(prepared, params) if "piecewise" in params else []
    return rows + (rp.case_rows(prepared, params) if params.get("cases") else [])


# -- the record ------------------------------------------------------------------------------------
def params() -> dict:
    """The notebook's probe call: the default piecewise list, the decode list, every setting."""
    return dict(piecewise=fx.default_piecewise_capture_sizes(fx.MLA_MAX_TOKENS), decode=DECODE,
                max_tokens=fx.MLA_MAX_TOKENS, settings=SETTINGS)


# -- the real engine (`sglab engine --scenario NAME`): data/recorded/engine_capture_sizes/
def _dense_args(tp: int, sizes: tuple, *, renamed: bool = False) -> tuple:
    """`--moe-dense-tp-size 1` at TP ``tp``, piecewise ``sizes``, decode graphs up to batch 8."""
    sizes_flag, max_bs = (("--cuda-graph-bs-prefill", "--cuda-graph-max-bs-decode") if renamed else
                          ("--piecewise-cuda-graph-tokens", "--cuda-graph-max-bs"))
    return ("--tp-size", str(tp), "--moe-dense-tp-size", "1", sizes_flag, *map(str, sizes), max_bs,
            "8", "--disable-radix-cache")


# its second case: 0.5.2x renamed the capture-size flags (read from its srt/arg_groups/fields/)
_TP2 = Scenario(
    fix="capture_sizes", name="06-dense-tp1", gpus=2, model="deepseek_v3_tiny", tool="engine",
    what="--moe-dense-tp-size 1 with attention TP 2 on piecewise capture sizes that TP 2 does not "
    "divide: 0.5.14 (filter lost) fails at start-up as in the PR, 0.5.11's filter starts, 0.5.23's "
    "round-up starts (needs an image with its torch)", releases=("0.5.14", "0.5.11", "0.5.23"),
    cases=(Case("odd-sizes", _dense_args(2, (3, 4, 5, 8)), releases=("0.5.14", "0.5.11")),
           Case("odd-sizes", _dense_args(2, (3, 4, 5, 8), renamed=True), releases=("0.5.23",))),
    requests=(1,), input_lens=(64,), output_len=4, repeats=1, timeout=900.0,
    expect="0.5.14: start-up fails in the reduce-scatter of an odd size; 0.5.11: captures the even "
    "sizes [4, 8]; 0.5.23: captures every size rounded up to a multiple of 2 (Engine tool: 0.5.23 "
    "has no bench_one_batch)")
# the same at TP 4 on 2 and 6, which TP 2 divides and TP 4 does not; no FlashInfer all-reduce fusion
# (on by default at TP > 1 on Hopper): its kernels take minutes to build, and it is not the failure
_TP4_ARGS = (*_dense_args(4, (2, 4, 6, 8)), "--enforce-disable-flashinfer-allreduce-fusion")
ENGINE = (
    _TP2,
    dataclasses.replace(
        _TP2, name="06-dense-tp4", gpus=4, releases=("0.5.14", "0.5.11"), cases=(Case(
            "tp4-sizes", _TP4_ARGS),),
        what="--moe-dense-tp-size 1 with attention TP 4 on sizes 2 4 6 8: 0.5.14 fails at "
        "start-up, 0.5.11's filter keeps the multiples of 4",
        expect="0.5.14: start-up fails in the reduce-scatter of size 2 or 6; 0.5.11: captures "
        "[4, 8]"),
    # the PR's own scale: TP 8 with the release's default piecewise sizes (no size flag), whose
    # 4, 12, 20 and 28 TP 8 does not divide
    dataclasses.replace(
        _TP2, name="06-dense-tp8", gpus=8, releases=("0.5.14", "0.5.11"),
        cases=(Case("tp8-default",
                    ("--tp-size", "8", "--moe-dense-tp-size", "1", "--cuda-graph-max-bs", "8",
                     "--disable-radix-cache", "--enforce-disable-flashinfer-allreduce-fusion")),),
        what="--tp-size 8 --moe-dense-tp-size 1 with the release's default piecewise capture "
        "sizes, as in #23972: 0.5.14 fails at start-up, 0.5.11's filter keeps the multiples of 8",
        expect="0.5.14: start-up fails in the reduce-scatter of size 4; 0.5.11: captures the "
        "default list less 4, 12, 20 and 28"),
)

# the bug's path at start-up, in the release that has the fix (notebook 06's code-path picture)
CODE_PATH_RELEASE = "0.5.11"
CODE_PATH = (Node("srt/server_args.py", "ServerArgs._generate_piecewise_cuda_graph_tokens",
                  "the default capture sizes, up to the maximum"),
             Node("srt/utils/common.py", "require_gathered_buffer",
                  "tokens scattered over attention TP? (--moe-dense-tp-size 1)"),
             Node(PIECEWISE_RUNNER, "PiecewiseCudaGraphRunner.__init__",
                  "#23972: keep the multiples of mul_base; then a dummy batch per size"),
             Node("srt/layers/communicator.py",
                  "CommunicateWithAllReduceAndLayerNormFn._scatter_hidden_states_and_residual",
                  "tensor_split: the first n % TP ranks get one row more"),
             Node("srt/layers/dp_attention.py", "attn_tp_reduce_scatter_tensor",
                  "needs equal shards: unequal ones fail start-up"))
FIX = Fix(name="capture_sizes", number="06", prs=(23972,), gpus=2,
          title="Piecewise capture sizes aligned to the attention-TP group (#23972)", check=check,
          hunks=(Spec(23972, symbols_in(PIECEWISE_RUNNER, "PiecewiseCudaGraphRunner.__init__")),),
          probe=Probe("sglab.capture_sizes.sglang:probe", PROBE_RELEASES, params), engine=ENGINE)


# -- the real lists beside the rebuild's (the notebook's real-SGLang section) ----------------------
def widths(setting: dict) -> tuple[int, int, bool, bool]:
    """(attention TP, attention CP, gathered, two-batch overlap) of a setting, by the rebuild."""
    a = fx.ParallelArgs(**{k: v for k, v in setting.items() if k != "piecewise"})
    return (fx.attention_tp_size(a), a.attn_cp_size, fx.require_gathered_buffer(a),
            a.enable_two_batch_overlap)


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
    """A list as what it changed against ``configured``: ``n sizes``, what it drops and adds."""
    if isinstance(sizes, str):
        return sizes
    changed = dict(drops=[n for n in configured if n not in sizes],
                   adds=[n for n in sizes if n not in configured])
    said = [f", {w} {ns[:6]}{'…' if len(ns) > 6 else ''}" for w, ns in changed.items() if ns]
    return f"{len(sizes)} sizes" + ("".join(said) or ", as configured")


def comparison(results: dict):
    """Per (release, setting): the real piecewise (or assertion) and decode lists, the rule's."""
    configured, rows = fx.default_piecewise_capture_sizes(fx.MLA_MAX_TOKENS), []
    for release, result in real.ran(results).items():
        for name, setting in SETTINGS.items():
            got = real.facts(result, setting=name)
            base = setting.get("piecewise", configured)
            want = dict(piecewise=rebuild_piecewise(VARIANT[release], setting, configured),
                        decode=rebuild_decode(setting))
            have = dict(piecewise=got.get("piecewise", got.get("error")),
                        decode=want["decode"] if "error" in got else got.get("decode"))
            tp, cp = widths(setting)[:2]
            rows.append(
                real.facts_row(release, f"{name} (attention TP/CP {tp}/{cp})", have,
                               VARIANT[release], want, ("piecewise", "decode"),
                               lambda f, b=base: describe(f["piecewise"], b)))
    return real.table(rows)


def defaults_line(results: dict) -> str:
    """Does each release generate the rebuilt default piecewise list?"""
    want, parts = fx.default_piecewise_capture_sizes(fx.MLA_MAX_TOKENS), []
    for v, r in real.ran(results).items():
        got = real.facts(r, setting="defaults").get("generated_piecewise")
        parts.append(f"{v}: " + (
            "same" if got == want else "DIFFERENT" if got is not None else "not reachable"))
    return (f"default piecewise list for max {fx.MLA_MAX_TOKENS} tokens vs the rebuilt one: "
            + ("; ".join(parts) or "no release ran"))


def compare() -> None:
    """The notebook's real-SGLang section: each release's lists against its rule, its defaults."""
    from sglab.core.notebook import show_table

    results = real.answers(FIX)
    print(real.status_lines(results))
    table = comparison(results)
    if len(table):
        wide = table.assign(release=[f"{v} ({VARIANT[v]})" for v in table.release])
        show_table(
            wide.pivot(index="behaviour", columns="release",
                       values="real").reindex(table.behaviour.unique()).rename_axis(None))
    real.check_table(table, what="(release, setting) rows")
    print(defaults_line(results))


# the fix across the releases, then a released symbol beside the rebuilt one
released = functools.partial(real.released, FIX)

# -- your server arguments on several releases (`sglab capture-sizes`) -----------------------------
MODEL_PLACEHOLDER = "model-not-loaded"  # --model-path is required by the parser, never loaded


def probe_call(cases: dict[str, list[str]], releases, **assumed) -> tuple[str, dict, list[str]]:
    """``(probe, params, releases)`` of :func:`ask`, ``--model-path`` first (a later one wins)."""
    cases = {k: ["--model-path", MODEL_PLACEHOLDER, *argv] for k, argv in cases.items()}
    return FIX.probe.fn, {"cases": cases, **ASSUMED, **assumed}, list(releases)


def ask(cases: dict[str, list[str]], releases, *, timeout: float = 300.0, progress=None, **assumed):
    """Rows ``release, case, metric, value`` per release (or ``not-run`` / ``probe-error``)."""
    probe_fn, p, releases = probe_call(cases, releases, **assumed)
    frames = []
    for v, r in run_probes(releases, probe_fn, p, timeout=timeout, progress=progress).items():
        if r.ok:
            frames.append(r.rows.drop(columns=["probe"]))
        else:
            status = "not-run" if r.status == "not-run" else "probe-error"
            frames.append(
                pd.DataFrame(dict(release=v, case=list(cases), metric=status, value=r.reason)))
    return pd.concat(frames, ignore_index=True)
