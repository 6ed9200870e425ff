"""The real Kimi-K2.5 class through the real piecewise-CUDA-graph gate, against
``sglab.pcg_gate.rebuild``; and the source check on synthetic trees.

One worker per release (module fixture): 0.5.10.post1 (plain alias), 0.5.12.post1 (no alias), 0.5.13
(property + guard, the PR), 0.5.23 (the gate moved to ``cuda_graph_setup.capture_prefill_graph``).
"""

import pytest

from sglab.pcg_gate import rebuild as gate
from sglab.pcg_gate import sglang
from sglab.sglang import compare, upstream
from sglab.sglang.testing import probe_all, require, value
from sglab.sglang.upstream import RELEASE_STATES, Verdict
from sglab.tools.fixes import get


RELEASES = sglang.PROBE_RELEASES
REAL_CALLS = ["pcg_gate"]  # the notebook's call (conftest)


@pytest.fixture(scope="module")
def real():
    return probe_all(RELEASES, sglang.FIX.probe.fn)


def rebuild(variant: str) -> dict:
    """The rebuild's wrapper through the rebuild's gate: the same facts the probe reports."""
    w = gate.build_wrapper(variant)
    before = sorted(w.state_dict())
    res = gate.init_piecewise_cuda_graphs(gate.ModelRunnerState(w, num_hidden_layers=2))
    return {
        "gate_enabled": res.enabled, "message": res.message, "keys_before_gate": before,
        "keys_after_gate": sorted(w.state_dict()), "model_in_modules_after_gate": "model"
        in w._modules, "layer_model_path": res.layer_model_path
    }


def facts(result, case="as_released") -> dict:
    df = result.rows[result.rows["case"] == case]
    return dict(zip(df["metric"], df["value"]))


def test_0512_no_alias_is_refused_like_the_rebuild_before(real):
    r, want = facts(require(real["0.5.12.post1"])), rebuild("no_alias")
    assert r["has_model_attr"] is False
    assert r["gate_enabled"] is want["gate_enabled"] is False
    assert r["messages"] == [want["message"]] == [gate.NOT_A_LANGUAGE_MODEL]
    assert r["keys_after_gate"] == want["keys_after_gate"] == r["keys_before_gate"]


@pytest.mark.parametrize(
    "release, first_log",
    [
        ("0.5.13", gate.ENABLED),  # the PR-era runner's words
        ("0.5.23", "Capture target prefill CUDA graph begin")
    ])
def test_property_and_guard_pass_without_duplicates_like_the_pr(real, release, first_log):
    r, want = facts(require(real[release])), rebuild("property_guard")
    assert r["alias_target"] == "language_model"
    assert r["gate_enabled"] is want["gate_enabled"] is True
    assert r["messages"][0].startswith(first_log)
    assert r["keys_after_gate"] == want["keys_after_gate"] == r["keys_before_gate"]
    assert not any(k.startswith("model.") for k in r["keys_after_gate"])
    assert r["model_in_modules_after_gate"] is want["model_in_modules_after_gate"] is False
    assert r["layer_model_path"] == want["layer_model_path"] == "language_model.model"
    assert r["num_attention_layers"] == 2


@pytest.mark.parametrize("release", ["0.5.13", "0.5.23"])
def test_real_property_without_the_guard_duplicates_like_property_only(real, release):
    """The real class with ``nn.Module.__setattr__`` restored: the runner's write-back registers
    the LLM under ``model.*``, the rebuild's ``property_only`` variant, key for key."""
    r, want = facts(require(real[release]), "property_without_guard"), rebuild("property_only")
    assert r["model_in_modules_before_gate"] is False
    assert r["gate_enabled"] is want["gate_enabled"] is True
    assert r["keys_after_gate"] == want["keys_after_gate"]
    llm_keys = [
        k for k in rebuild("no_alias")["keys_after_gate"] if k.startswith("language_model.")
    ]
    # model.* = the whole LLM
    assert len(r["keys_after_gate"]) - len(r["keys_before_gate"]) == len(llm_keys)


def test_0510_plain_alias_passes_with_duplicate_keys_like_the_rebuild(real):
    r, want = facts(require(real["0.5.10.post1"])), rebuild("plain_alias")
    assert r["gate_enabled"] is want["gate_enabled"] is True
    assert r["model_in_modules_before_gate"] is True  # registered in __init__, before any gate
    assert r["model_in_modules_after_gate"] is want["model_in_modules_after_gate"] is True
    assert any(k.startswith("model.") for k in r["keys_after_gate"])
    assert any(k.startswith("model.") for k in want["keys_after_gate"])
    assert r["layer_model_path"] == want["layer_model_path"] == "language_model.model"


def test_0510_alias_is_the_text_model_key_for_key_like_the_rebuild(real):
    """0.5.10.post1 assigns ``self.model = self.language_model.model`` (the text model; no
    ``lm_head``); the rebuild's ``plain_alias`` does the same, so the two key lists are equal."""
    r, want = facts(require(real["0.5.10.post1"])), rebuild("plain_alias")
    canonical = rebuild("no_alias")["keys_after_gate"]
    text_model_keys = {
        "model." + k[len("language_model.model."):]
        for k in canonical if k.startswith("language_model.model.")
    }
    assert r["alias_target"] == "language_model.model"
    assert set(r["keys_after_gate"]) == set(canonical) | text_model_keys
    assert (r["keys_before_gate"] == r["keys_after_gate"] == want["keys_before_gate"] ==
            want["keys_after_gate"])


def test_gate_code_path_per_release(real):
    got = {v: value(require(real[v]), case="as_released", metric="gate") for v in RELEASES}
    assert got == {
        "0.5.10.post1": "ModelRunner.init_piecewise_cuda_graphs",
        "0.5.12.post1": "ModelRunner.init_piecewise_cuda_graphs",
        "0.5.13": "ModelRunner.init_piecewise_cuda_graphs",
        "0.5.23": "cuda_graph_setup.capture_prefill_graph"
    }


def test_notebook_comparison_agrees_and_a_wrong_variant_fails(real, capsys):
    results = {v: require(real[v]) for v in RELEASES}
    table = sglang.comparison(results)
    assert compare.check_table(table)
    assert list(table.release) == [
        "0.5.10.post1", "0.5.12.post1", "0.5.13", "0.5.13", "0.5.23", "0.5.23"
    ]
    assert list(table["must match"]) == [
        f"rebuild: {v}" for v in ("plain_alias", "no_alias", "property_guard", "property_only",
                                  "property_guard", "property_only")
    ]
    # a release matched with the wrong variant must be caught, fact by fact
    bad = sglang.comparison({"0.5.12.post1": results["0.5.12.post1"]},
                            variant_of={"0.5.12.post1": "property_guard"})
    assert not compare.check_table(bad)
    assert compare.MISMATCH in capsys.readouterr().out
    assert any(d.startswith("gate_enabled") for d in bad["differences"].iloc[0])


def test_a_missing_release_runs_nowhere():
    from sglab.sglang.runner import run_probe

    result = run_probe("0.5.9", sglang.FIX.probe.fn)
    assert not result.ok and "not installed" in result.reason
    assert len(sglang.comparison({"0.5.9": result})) == 0


def test_recorded_answers_equal_the_live_ones(real):
    """The notebook's recorded mode shows data/recorded/real_cpu/: it must say what the releases
    say now."""
    from sglab.sglang.testing import assert_recording_matches

    assert assert_recording_matches(real, sglang.FIX.probe.fn) == len(RELEASES)


# --------------------------------------------------------------------------------------------------
# the source check (#26382 A), on synthetic models/kimi_k25.py files
# --------------------------------------------------------------------------------------------------
KIMI_HEAD = """
class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = DeepseekV3ForCausalLM(config.text_config)
"""
KIMI = {
    "no_alias": KIMI_HEAD,
    "plain_alias": KIMI_HEAD + "        self.model = self.language_model.model\n",
    "property": KIMI_HEAD
    + "\n    @property\n    def model(self):\n        return self.language_model\n"
}
KIMI["guard"] = KIMI["property"] + ("\n    def __setattr__(self, name, value):\n"
                                    "        if name == \"model\":\n            return\n"
                                    "        super().__setattr__(name, value)\n")


def state(files: dict) -> Verdict:
    v = sglang.check(files.get)
    assert v.status in RELEASE_STATES and v.detail and "\n" not in v.detail
    return v


@pytest.mark.parametrize("shape,status,words",
                         [("no_alias", "before", "not a language model"),
                          ("plain_alias", "before", "self.language_model.model"),
                          ("property", "before", "without the __setattr__ guard"),
                          ("guard", "pr-era", "registered once")])
def test_check_states(shape, status, words):
    v = state({sglang.KIMI_MODEL: KIMI[shape]})
    assert v.status == status and words in v.detail


def test_check_absent_and_unknown():
    assert state({}).status == "absent"
    assert state({sglang.KIMI_MODEL: "class Other:\n    pass\n"}).status == "unknown"


@pytest.mark.parametrize("shape,status", [("guard", "pr-era"), ("property", "before"),
                                          ("plain_alias", "before"), ("no_alias", "before")])
def test_upstream_check_reads_the_wrapper_from_a_folder(tmp_path, shape, status):
    (tmp_path / "srt" / "models").mkdir(parents=True)
    (tmp_path / "srt" / "models" / "kimi_k25.py").write_text(KIMI[shape])
    assert upstream.check(get("pcg_gate"), root=tmp_path).status == status
    assert upstream.check(get("pcg_gate"), root=tmp_path / "srt" / "models").status == "unknown"


def test_the_record():
    assert get("pcg_gate") is sglang.FIX
    assert sglang.FIX.probe.fn == "sglab.pcg_gate.sglang:probe"
    assert sglang.FIX.hunks[0].symbols == (
        "srt/models/kimi_k25.py::KimiK25ForConditionalGeneration.model",
        "srt/models/kimi_k25.py::KimiK25ForConditionalGeneration.__setattr__")


def test_each_node_of_the_code_path_is_a_symbol_of_the_fixed_release():
    from sglab.sglang import codepath, releases

    version = sglang.CODE_PATH_RELEASE
    if not releases.package_dir(version).is_dir():
        pytest.skip(f"sglang {version} is not installed here (sglab real install)")
    lines = {n.symbol: codepath.line_of(version, n) for n in sglang.CODE_PATH}
    assert all(lines.values()), lines
    # the gate, then the alias it asks for, then the guard that drops its write-back
    assert [n.symbol.split(".")[-1] for n in sglang.CODE_PATH[1:4]
            ] == ["init_piecewise_cuda_graphs", "model", "__setattr__"]
