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


# -- #26382 part A
# ----------------------------------------------------------------------------------------------
def inspect_kimi_wrapper(source: str, class_name: str = "KimiK25ForConditionalGeneration") -> dict:
    """Static reading of ``models/kimi_k25.py``: property ``model``, a ``__setattr__`` that tests
    ``name == "model"``, or a plain ``self.model = ...`` assignment in ``__init__`` (with what it
    aliases)."""
    cls = S.find(S.parse(source), class_name)
    found = {"class": isinstance(cls, ast.ClassDef), "property": False, "guard": False,
             "plain_alias": None}
    if not found["class"]:
        return found
    prop = S.find(cls, "model")
    found["property"] = prop is not None and "property" in {ast.unparse(d)
                                                            for d in prop.decorator_list}
    setattr_fn = S.find(cls, "__setattr__")
    found["guard"] = "model" in S.string_constants(setattr_fn)
    alias = S.assignments(S.find(cls, "__init__"), "self.model")
    found["plain_alias"] = ast.unparse(alias[0]) if alias else None
    return found


def pcg_gate(read) -> Verdict:
    src = read(KIMI_MODEL)
    if src is None:
        return Verdict("absent", "no models/kimi_k25.py: Kimi-K2.5 is not in this SGLang")
    f = inspect_kimi_wrapper(src)
    if not f["class"]:
        return Verdict("unknown", "models/kimi_k25.py has no KimiK25ForConditionalGeneration class")
    if f["property"] and f["guard"]:
        return Verdict("pr-era",
                       "`model` property returns language_model and __setattr__ drops writes to "
                                 "`model`: the PCG gate passes, the LLM is registered once")
    if f["property"]:
        return Verdict("before",
                       "`model` property without the __setattr__ guard: the gate passes, but the "
                                 "runner's write to `.model` registers the LLM a second time")
    if f["plain_alias"]:
        return Verdict("before",
                       f"plain `self.model = {f['plain_alias']}` in __init__: the gate passes, but "
                                 "nn.Module registers it twice (duplicate model.* keys)")
    return Verdict("before",
                   "no `.model` on KimiK25ForConditionalGeneration: the piecewise-CUDA-graph gate "
                             "(hasattr(model, 'model')) refuses it as 'not a language model'")




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
