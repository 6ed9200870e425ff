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


def _parsed(read, rel):
    """(text, tree) of ``rel``; tree is None when the file is missing or does not parse."""
    text = read(rel)
    return text, (S.parse(text) if text is not None else None)


