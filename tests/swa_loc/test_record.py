"""The fix's record: the engine counts the kernels of a decode replay (no real-code GPU probe), and
its code path names functions every release on the path has."""

import pytest

from sglab.sglang import codepath, releases
from sglab.swa_loc import sglang


def test_the_engine_scenario_is_the_one_gpu_instrument():
    assert getattr(sglang.FIX, "gpu", None) is None and sglang.FIX.engine
    assert not hasattr(sglang, "gpu_probe") and not hasattr(sglang, "gpu_recorded")


def test_each_node_of_the_code_path_is_a_function_of_the_release():
    version = sglang.CODE_PATH_RELEASE
    if not releases.package_dir(version).is_dir():
        pytest.skip(f"sglang {version} is not installed here (sglab real install)")
    lines = {n.symbol: codepath.line_of(version, n) for n in sglang.CODE_PATH}
    assert all(lines.values()), lines
    assert [n.symbol for n in sglang.CODE_PATH
            ][-2:] == ["SWAKVPool.set_kv_buffer", "SWAKVPool.translate_loc_from_full_to_swa"]
