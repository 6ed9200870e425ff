"""CPU tests of the piecewise-CUDA-graph gate and the four Kimi-K2.5 wrapper variants (#26382 part A)."""

from __future__ import annotations

import pytest
import torch

from sglab.fixes import pcg_gate as g

LM_KEYS = [  # the shared toy decoder at the tiny CPU size: 2 layers, rotary (its tables are not persistent)
    "model.embed_tokens.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.1.input_layernorm.weight",
    "model.layers.1.self_attn.qkv_proj.weight",
    "model.layers.1.self_attn.o_proj.weight",
    "model.layers.1.post_attention_layernorm.weight",
    "model.layers.1.mlp.gate_up_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
]
BASE_KEYS = {"vision_tower.weight", "vision_tower.bias", "mm_projector.weight", "mm_projector.bias"} | {
    "language_model." + k for k in LM_KEYS}
ALIAS_KEYS = {"model." + k for k in LM_KEYS}
# 0.5.10.x's plain alias is the text model (``self.language_model.model``): its keys, without lm_head
TEXT_ALIAS_KEYS = {"model." + k[len("model."):] for k in LM_KEYS if k.startswith("model.")}


def gated(variant: str):
    w = g.build_wrapper(variant)
    keys_before = set(w.state_dict())
    res = g.init_piecewise_cuda_graphs(g.ModelRunnerState(w, num_hidden_layers=2))
    return w, res, keys_before


@pytest.mark.parametrize("variant,enabled,before,after,dup", [
    ("no_alias", False, BASE_KEYS, BASE_KEYS, False),
    ("plain_alias", True, BASE_KEYS | TEXT_ALIAS_KEYS, BASE_KEYS | TEXT_ALIAS_KEYS, True),
    ("property_only", True, BASE_KEYS, BASE_KEYS | ALIAS_KEYS, True),
    ("property_guard", True, BASE_KEYS, BASE_KEYS, False),
    ("property_setter", True, BASE_KEYS, BASE_KEYS | ALIAS_KEYS, True),
])
def test_variants_gate_and_keys(variant, enabled, before, after, dup):
    w, res, keys_before = gated(variant)
    assert res.enabled is enabled
    assert keys_before == before
    assert set(w.state_dict()) == after
    assert len(w.state_dict()) == len(after)
    assert len(list(w.named_parameters(remove_duplicate=False))) == len(after)
    assert len(list(w.named_parameters())) == len(BASE_KEYS)  # default de-duplication hides the alias
    assert g.has_duplicate_registration(w) is dup


def test_gate_messages_and_layer_stack():
    _, res, _ = gated("no_alias")
    assert res.message == "Disable piecewise CUDA graph because the model is not a language model"
    assert res.wrote_model is False and res.layer_model is None
    for v in ("plain_alias", "property_only", "property_guard"):
        w, res, _ = gated(v)
        assert res.message == g.ENABLED and res.wrote_model
        assert res.layer_model is w.language_model.model
        assert res.layer_model_path == "language_model.model"
        assert res.num_attention_layers == 2


def test_counts_exact():
    assert len(BASE_KEYS) == 19 and len(ALIAS_KEYS) == 15
    w, _, _ = gated("property_only")
    assert len(w.state_dict()) == 34


def test_round_trips():
    canonical = g.build_wrapper("no_alias").state_dict()
    expect = {  # save after the gate -> strict load into a fresh instance; canonical checkpoint -> gated instance
        "no_alias": (True, True),
        "plain_alias": (True, False),
        "property_only": (False, False),
        "property_guard": (True, True),
    }
    for v, (rt_ok, canon_ok) in expect.items():
        w, _, _ = gated(v)
        rt = g.strict_load(g.build_wrapper(v, seed=1), w.state_dict())
        assert rt.ok is rt_ok, v
        cn = g.strict_load(w, canonical)
        assert cn.ok is canon_ok, v
        if v == "property_only":
            assert set(rt.unexpected) == ALIAS_KEYS and not rt.missing
        if v in ("plain_alias", "property_only"):
            assert set(cn.missing) == (TEXT_ALIAS_KEYS if v == "plain_alias" else ALIAS_KEYS) and not cn.unexpected


def test_round_trip_restores_values():
    w, _, _ = gated("property_guard")
    fresh = g.build_wrapper("property_guard", seed=123)
    assert g.strict_load(fresh, w.state_dict()).ok
    for (k, a), (_, b) in zip(w.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k


def test_setter_never_called_for_a_module():
    g.KimiPropertySetter.setter_calls = 0
    gated("property_setter")
    assert g.KimiPropertySetter.setter_calls == 0


def test_plain_alias_identity_and_property_reads():
    w, _, _ = gated("property_only")
    assert w.model is w.language_model and w._modules["model"] is w.language_model
    w2, _, _ = gated("plain_alias")
    assert w2.model is w2.language_model.model and w2._modules["model"] is w2.language_model.model


def test_guard_side_effects():
    rows = {r["action"]: r["observed"] for r in g.guard_side_effects()}
    assert rows["w.logit_scale = nn.Parameter(...)"] is True
    assert rows["w.pos_table = tensor (existing buffer)"] is True
    assert rows["w.adapter = nn.Linear(...)"] is True
    assert rows["w.num_image_tokens = 7"] is True
    assert rows["w.language_model = new_lm"] is True
    assert rows["w.model = other_lm (a legitimate swap)"] is False
    assert rows["  ... silently ignored?"] is True


def test_capture_sizes_and_buckets():
    sizes = g.piecewise_cuda_graph_tokens(4096)
    assert sizes[:8] == [4, 8, 12, 16, 20, 24, 28, 32]
    assert sizes[-1] == 4096 and len(sizes) == 50
    assert g.bucket_for(16, sizes) == 16
    assert g.bucket_for(100, sizes) == 112
    assert g.bucket_for(1000, sizes) == 1024
    assert g.bucket_for(3000, sizes) == 3072
    assert g.bucket_for(4097, sizes) is None
    assert g.piecewise_cuda_graph_tokens(8192)[-1] == 8192


def test_other_gate_exits():
    w = g.build_wrapper("property_guard")
    assert not g.init_piecewise_cuda_graphs(
        g.ModelRunnerState(w, num_hidden_layers=2, piecewise_cuda_graph_tokens=[])).enabled
    res = g.init_piecewise_cuda_graphs(g.ModelRunnerState(w, num_hidden_layers=3))
    assert not res.enabled and res.message == g.NON_STANDARD_GQA


# ---------------------------------------------------------------------------------------------------------------
# experiment module: the piecewise runner's padded segments, the row layout, the upstream check (CPU)
# ---------------------------------------------------------------------------------------------------------------
from sglab.experiments import pcg_gate as exp  # noqa: E402

TINY = {**exp.DEFAULT_PARAMS, "hidden": 64, "num_layers": 3, "num_heads": 4, "intermediate": 96, "vocab": 50,
        "max_tokens": 256, "token_counts": [16, 100, 256], "repeat": 2, "rounds": 1, "warmup": 0,
        "trace_token_counts": [16, 256], "direct_token_counts": [256]}


def _tiny_runner(dtype):
    lm = g.language_model(exp.model_config(TINY), torch.device("cpu"), dtype=dtype)
    st = g.ModelRunnerState(g.build_wrapper("property_guard", language_model=lm), num_hidden_layers=3,
                            piecewise_cuda_graph_tokens=g.piecewise_cuda_graph_tokens(256))
    res = g.init_piecewise_cuda_graphs(st)
    assert res.enabled and res.layer_model is lm.model and len(st.attention_layers) == 3
    return lm, g.PiecewiseRunner(res.layer_model, st.attention_layers, st.piecewise_cuda_graph_tokens,
                                   use_graphs=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_segments_match_eager_forward(dtype):
    lm, runner = _tiny_runner(dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in (4, 5, 17, 100, 256):  # exact buckets and padded ones; stale rows from earlier calls
            ids = torch.randint(0, 50, (n,), generator=gen)
            out = runner.forward(ids).clone()
            ref = lm.model(ids, torch.arange(n))
            assert out.shape == ref.shape == (n, 64)
            c = exp.compare(out, ref)
            assert c["within_tol"] and c["max_abs_diff"] <= 1e-5, (n, c)


def test_runner_rejects_oversize():
    _, runner = _tiny_runner(torch.float32)
    with pytest.raises(ValueError):
        runner.forward(torch.zeros(257, dtype=torch.long))


def test_bf16_tolerance():
    assert exp.bf16_ulp(1.0) == 2 ** -7
    assert exp.bf16_ulp(5.3) == 2 ** -5
    assert exp.bf16_tolerance(5.3) == 0.25


def test_run_rows_on_cpu():
    from sglab.core.timing import host_time

    out = exp._run(TINY, torch.device("cpu"), use_graphs=False, progress=False,
                   timer=lambda f, warmup, repeat: host_time(f, warmup=warmup, repeat=repeat))
    df = out.df
    assert list(df.columns) == ["experiment", "variant", "num_tokens", "bucket", "metric", "value", "unit"]
    facts = exp.run_facts(df)
    assert facts[("eager", "gate_enabled")] == 0.0 and facts[("piecewise", "gate_enabled")] == 1.0
    assert facts[("piecewise", "buckets")] == len(g.piecewise_cuda_graph_tokens(256))
    t = exp.latency_table(df)
    assert list(t.index) == [16, 100, 256] and list(t["bucket"]) == [16, 112, 256]
    assert t["within_tol"].all() and (t["max_abs_diff_same_shape"] == 0).all()
    assert (t["speedup"] > 0).all()


KIMI_FIXED = '''
class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = None

    @property
    def model(self):
        return self.language_model

    def __setattr__(self, name, value):
        if name == "model":
            return
        super().__setattr__(name, value)
'''
KIMI_PROPERTY_ONLY = '''
class KimiK25ForConditionalGeneration(nn.Module):
    @property
    def model(self):
        return self.language_model
'''
KIMI_ALIAS = '''
class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = object()
        self.model = self.language_model.model
'''
KIMI_BEFORE = '''
class KimiK25ForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.language_model = None
'''


@pytest.mark.parametrize("src,status", [(KIMI_FIXED, "pr-era"), (KIMI_PROPERTY_ONLY, "before"),
                                        (KIMI_ALIAS, "before"), (KIMI_BEFORE, "before"),
                                        ("class Other: pass\n", "unknown")])
def test_upstream_check_reads_the_wrapper(tmp_path, src, status):
    from sglab.sglang import upstream
    from sglab.tools.fixes import NAMES, get

    (tmp_path / "srt" / "models").mkdir(parents=True)
    (tmp_path / "srt" / "models" / "kimi_k25.py").write_text(src)
    v = upstream.check(get("pcg_gate"), root=tmp_path)
    assert v.status == status, v


def test_upstream_check_missing_file(tmp_path):
    from sglab.sglang import upstream
    from sglab.tools.fixes import NAMES, get

    assert upstream.check(get("pcg_gate"), root=tmp_path).status == "unknown"


def test_cpu_tables():
    t = exp.variant_table()
    assert list(t.index) == ["no_alias", "plain_alias", "property_only", "property_guard", "property_setter"]
    assert list(t["state_dict keys (after gate)"]) == [19, 33, 34, 19, 34]   # plain alias: the text model (no lm_head)
    assert list(t["of which model.*"]) == [0, 14, 15, 0, 15]
    assert list(t["gate"]) == ["PCG off", "PCG on", "PCG on", "PCG on", "PCG on"]
    assert t.loc["property_guard", "save -> fresh load (strict)"] == "clean"
    assert t.loc["property_only", "save -> fresh load (strict)"].startswith("15 unexpected")
    assert len(exp.guard_table()) == 7
    assert exp.state_dict_keys("property_only")[-15:] == ["model." + k for k in LM_KEYS]


# ---------------------------------------------------------------------------------------------------------------
# README headline: numbers recomputed here straight from the committed CSVs
# ---------------------------------------------------------------------------------------------------------------
def _recorded_csvs():
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "data" / "recorded" / "pcg_gate"
    newest = {}
    for csv in sorted(folder.glob("*.csv")):
        m = json.loads(csv.with_suffix(".json").read_text())
        gpu = m["gpu_name"].replace("NVIDIA ", "").split()[0]
        if gpu not in newest or m["created_utc"] > newest[gpu][0]:
            newest[gpu] = (m["created_utc"], csv)
    return {gpu: csv for gpu, (_, csv) in newest.items()}


def test_headline_numbers_from_committed_csvs():
    import pandas as pd

    from sglab.core import runs

    csvs = _recorded_csvs()
    if not csvs:
        pytest.skip("no recorded pcg_gate run committed")
    from sglab.core import claims
    from sglab.tools import fixes

    text = claims.headline(fixes.claims("pcg_gate"), claims.shown(fixes.claims("pcg_gate"), runs.load_all_recorded("pcg_gate")))
    assert "|" not in text and len(text) < 400
    worst, points = 0.0, 0
    for gpu, csv in csvs.items():
        df = pd.read_csv(csv)
        med = df[df["metric"] == "time_median"].pivot_table(index="num_tokens", columns="variant", values="value")
        ratio = (med["eager"] / med["piecewise"]).sort_index()
        below = [int(n) for n, r in ratio.items() if r < 1]
        start = below[0]
        assert all(r < 1 for r in ratio[ratio.index >= start])  # a clean crossover, not a dip
        peak_n = int(ratio.idxmax())
        assert f"{gpu} {ratio.min():.2f}–{ratio.max():.2f}× (max at {peak_n} tok; <1 from {start} tok)" in text
        d = df[(df["metric"] == "max_abs_diff") & (df["variant"] == "piecewise")]  # not the direct hand-off's
        tol = df[df["metric"] == "tolerance"].set_index("num_tokens")["value"]
        assert (d.set_index("num_tokens")["value"] <= tol).all()
        worst = max(worst, float(d["value"].max()))
        points += len(d)
    assert f"at {points}/{points} points (max abs diff {worst:.3f})" in text
    assert "16–4096 tok" in text


def test_slowdown_start_and_copy_bytes():
    import pandas as pd

    assert exp.slowdown_start(pd.Series({16: 3.0, 2048: 0.9, 4096: 0.95})) == 2048
    assert exp.slowdown_start(pd.Series({16: 3.0, 2048: 0.9, 4096: 1.1})) is None
    assert exp.slowdown_start(pd.Series({16: 0.9, 2048: 1.2, 4096: 0.95})) == 4096
    # 16 layers x 5 tensors + the output, 4096 x 2048 bf16, written and read
    assert exp.buffer_copy_bytes({}, 4096) == 2 * 4096 * 2048 * 2 * 81
