"""The source checks: given ``read(relpath)`` over an SGLang package folder, which state is each fix
in?

One function per upstream change (each fix's record names its own), each answering one of
:data:`sglab.sglang.upstream.STATES` with a one-line reason. They read syntax (functions and classes
found by name with :mod:`ast`), never import SGLang, and never look at a version number: the same
function classifies an installed package, an unpacked wheel, a wheel read through zipfile, or a
checkout. ``before`` and ``regressed`` differ by the code around the missing fix: ``before`` is the
PR-era code without it, ``regressed`` is code from after the PR (a refactor that replaced the fixed
file) that lost it.
"""

from __future__ import annotations

import ast

from sglab.sglang.upstream import Verdict
from sglab.sglang import source as S

KIMI_MODEL = "srt/models/kimi_k25.py"
PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
PIECEWISE_RUNNER = "srt/model_executor/piecewise_cuda_graph_runner.py"
ROUND_UP_HOMES = ("srt/utils/common.py", "srt/model_executor/runner/base_cuda_graph_runner.py")


def _parsed(read, rel):
    """(text, tree) of ``rel``; tree is None when the file is missing or does not parse."""
    text = read(rel)
    return text, (S.parse(text) if text is not None else None)




# -- #23972
# --------------------------------------------------------------------------------------------------
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
    """The call chain by which the prefill runner's capture sizes are rounded up to the alignment,
    or None."""
    names = {S.callee_name(c) for v in values for c in ast.walk(v) if isinstance(c, ast.Call)}
    chain = []
    for name in sorted(names):  # one level into this module's own helpers
        helper = S.find(tree, name)
        inner = {S.callee_name(c) for c in ast.walk(helper) if isinstance(c,
                ast.Call)} if helper else set()
        if "get_cuda_graph_max_batch_size" in inner or "ceil_align" in inner:
            chain.append(name)
    if not chain:
        return None
    for rel in ROUND_UP_HOMES:
        _, home = _parsed(read, rel)
        fn = S.find(home, "get_cuda_graph_max_batch_size")
        if fn is not None and S.calls(fn, "ceil_align"):
            return f"{chain[0]} → get_cuda_graph_max_batch_size → ceil_align ({rel.split('/', 1)[1]})"
    return f"{chain[0]} → ceil_align" if any(S.calls(S.find(tree, n),
                                                     "ceil_align") for n in chain) else None


def capture_sizes(read) -> Verdict:
    src, tree = _parsed(read, PIECEWISE_RUNNER)
    if src is not None:
        init = S.find(tree, "PiecewiseCudaGraphRunner.__init__")
        if init is None:
            return Verdict("unknown",
                           "piecewise_cuda_graph_runner.py has no PiecewiseCudaGraphRunner.__init__")
        if _mod_filter(init):
            return Verdict("pr-era",
                           "PiecewiseCudaGraphRunner.__init__ keeps only capture sizes divisible "
                           "by " "mul_base (attention TP, x CP) when the gathered buffer is "
                           "required")
        return Verdict("before",
                       "PiecewiseCudaGraphRunner.__init__ captures every configured size: sizes "
                       "not " "divisible by attention TP reach the dense-TP1 reduce-scatter")
    src, tree = _parsed(read, PREFILL_RUNNER)
    if src is not None:
        values = S.assignments(S.find(tree, "PrefillCudaGraphRunner.__init__"),
                               "self.capture_num_tokens")
        if not values:
            return Verdict("unknown",
                           "PrefillCudaGraphRunner.__init__ does not set self.capture_num_tokens")
        chain = _rounds_up(read, tree, values)
        if chain:
            return Verdict("changed",
                           f"PrefillCudaGraphRunner rounds each capture size up to the TP/CP "
                           "alignment " f"({chain}) instead of dropping it")
        if any(_mod_filter(v) for v in values):
            return Verdict("changed",
                           "PrefillCudaGraphRunner filters capture sizes by the attention-TP "
                           "alignment")
        return Verdict("regressed",
                       f"piecewise_cuda_graph_runner.py is gone; PrefillCudaGraphRunner captures "
                                    f"{ast.unparse(values[0])} with no TP/CP alignment (the PR's "
                       "filter was lost)")
    return Verdict("absent", "no piecewise or prefill CUDA-graph runner in this SGLang")
