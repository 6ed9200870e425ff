"""02's harness adjustments for the real engine (``sglab.workspace_floor.sglang``): the traced
manager method exists with the arguments the trace prints, and the floor's replacement finds its
one line in 0.5.13's call site."""

from __future__ import annotations

import pytest

from sglab.sglang import engine as eng
from sglab.sglang import testing
from sglab.workspace_floor.sglang import FLOOR_TO_SHAPE, WORKSPACE_TRACE


def _source(release: str, params: dict) -> str:
    path = testing.package(release) / (
        params["module"].replace("sglang.", "", 1).replace(".", "/") + ".py")
    return testing.function_source(path.read_text(), params["qualname"])


@pytest.mark.parametrize("v", ["0.5.12.post1", "0.5.13"])
def test_the_traced_workspace_initialize_has_its_arguments(v):
    params = WORKSPACE_TRACE.param_dict()
    head = _source(v, params).split(")", 1)[0]
    assert all(a in head for a in params["args"])


def test_the_floor_is_replaced_by_x_shape_in_0_5_13_only():
    params = FLOOR_TO_SHAPE.param_dict()
    new = eng.reverted_source({**params, "name": FLOOR_TO_SHAPE.name}, _source("0.5.13", params))
    assert "max_token_num=x.shape[0]," in new and "2048" not in new
    compile(new, "replaced", "exec")
    with pytest.raises(ValueError, match="0 times"):  # 0.5.12.post1 passes no max_token_num
        eng.reverted_source(params, _source("0.5.12.post1", params))
