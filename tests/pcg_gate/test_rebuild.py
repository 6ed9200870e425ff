"""The piecewise-CUDA-graph gate, the Kimi-K2.5 wrapper variants (#26382 part A) and the piecewise
runner, on the CPU."""

from __future__ import annotations

import pytest
import torch

from sglab.core import toy_decoder as td
from sglab.pcg_gate import measure
from sglab.pcg_gate import rebuild as g

# the shared toy decoder at the tiny CPU size: 2 layers, rotary (its tables are not persistent)
LM_KEYS = [
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
BASE_KEYS = {
    "vision_tower.weight", "vision_tower.bias", "mm_projector.weight", "mm_projector.bias"
} | {"language_model." + k
     for k in LM_KEYS}
ALIAS_KEYS = {"model." + k for k in LM_KEYS}
# 0.5.10.x's plain alias is the text model (``self.language_model.model``): its keys, without
# lm_head
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
    # default de-duplication hides the alias
    assert len(list(w.named_parameters())) == len(BASE_KEYS)
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
    # save after the gate -> strict load into a fresh instance; canonical checkpoint -> gated
    # instance
    expect = {
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
            assert set(cn.missing) == (TEXT_ALIAS_KEYS
                                       if v == "plain_alias" else ALIAS_KEYS) and not cn.unexpected


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


def test_the_guard_drops_only_writes_to_model():
    """Parameters, buffers, submodules and the LLM itself still register on a guarded wrapper; a
    deliberate ``w.model = x`` is dropped without an error."""
    w = g.build_wrapper("property_guard")
    w.logit_scale = torch.nn.Parameter(torch.ones(1))
    w.register_buffer("pos_table", torch.zeros(3))
    w.pos_table = torch.arange(3.0)
    w.adapter = torch.nn.Linear(4, 4)
    w.num_image_tokens = 7
    new_lm, other = g.tiny_language_model(), g.tiny_language_model()
    w.language_model = new_lm
    w.model = other
    assert "logit_scale" in dict(w.named_parameters()) and "adapter.weight" in w.state_dict()
    assert torch.equal(w._buffers["pos_table"], torch.arange(3.0)) and w.num_image_tokens == 7
    assert w.language_model is new_lm and w.model is new_lm and not g.has_duplicate_registration(w)


def test_other_gate_exits():
    w = g.build_wrapper("property_guard")
    assert not g.init_piecewise_cuda_graphs(
        g.ModelRunnerState(w, num_hidden_layers=2, piecewise_cuda_graph_tokens=[])).enabled
    res = g.init_piecewise_cuda_graphs(g.ModelRunnerState(w, num_hidden_layers=3))
    assert not res.enabled and res.message == g.NON_STANDARD_GQA


def test_the_gates_llm_is_the_shared_decoder():
    """The wrapper's LLM is the shared toy decoder, with the causal attention op and rotary
    positions (notebook 03 plugs another attention op into the same classes)."""
    b = g.tiny_language_model().model
    assert type(b) is td.DecoderStack and type(b.layers[0]) is td.DecoderLayer
    assert isinstance(b.layers[0].self_attn.attn, td.CausalAttention) and b.rotary is not None


TINY = {
    **measure.DEFAULT_PARAMS, "hidden": 64, "num_layers": 3, "num_heads": 4, "intermediate": 96,
    "vocab": 50, "max_tokens": 256
}


def _tiny_runner(dtype):
    lm = measure.language_model(measure.model_config(TINY), torch.device("cpu"), dtype=dtype)
    st = g.ModelRunnerState(g.build_wrapper("property_guard",
                                            language_model=lm), num_hidden_layers=3,
                            piecewise_cuda_graph_tokens=g.piecewise_cuda_graph_tokens(256))
    res = g.init_piecewise_cuda_graphs(st)
    assert res.enabled and res.layer_model is lm.model and len(st.attention_layers) == 3
    return lm, g.PiecewiseRunner(res.layer_model, st.attention_layers,
                                 st.piecewise_cuda_graph_tokens, use_graphs=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_pieces_match_eager_forward(dtype):
    lm, runner = _tiny_runner(dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in (4, 5, 17, 100, 256):  # exact buckets and padded ones; stale rows from before
            ids = torch.randint(0, 50, (n,), generator=gen)
            out = runner.forward(ids).clone()
            ref = lm.model(ids, torch.arange(n))
            assert out.shape == ref.shape == (n, 64)
            c = measure.compare(out, ref)
            assert c["within_tol"] and c["max_abs_diff"] <= 1e-5, (n, c)


def test_runner_rejects_oversize_and_direct_without_graphs():
    lm, runner = _tiny_runner(torch.float32)
    with pytest.raises(ValueError):
        runner.forward(torch.zeros(257, dtype=torch.long))
    with pytest.raises(ValueError, match="needs use_graphs=True"):
        g.PiecewiseRunner(runner.m, runner.attention_layers, [16], use_graphs=False,
                          handoff="direct")
