"""The shared toy decoder: one model serves both prefill notebooks, and the two notebooks still
measure the model they measured before it was shared (the outputs below were computed by each
notebook's own model before the merge, same seeds, on the CPU)."""

from __future__ import annotations

import pytest
import torch

from sglab.breakable_graph import rebuild as bg
from sglab.core import toy_decoder as td


ROTARY = td.DecoderConfig(vocab_size=50, hidden_size=64, num_layers=3, num_heads=4,
                          intermediate_size=96, max_position=256, positions="rotary")


def test_breakable_graph_model_is_the_one_measured_before():
    model = bg.build_model(bg.TINY_CONFIG)
    out = bg.run_eager(model, bg.make_batch([5, 9, 3], vocab_size=128, seed=2))
    assert out.shape == (3, 128)
    assert out.sum().item() == pytest.approx(31.155790328979492, rel=1e-4)
    assert out.abs().sum().item() == pytest.approx(308.9445495605469, rel=1e-5)
    torch.testing.assert_close(
        out[:, :3].flatten(),
        torch.tensor([
            0.08325, 0.731706, 0.347535, 1.337636, 0.138698, 0.420355, -0.398387, 0.716425, 0.181491
        ]), atol=1e-5, rtol=1e-4)


def test_one_decoder_two_attention_ops_same_layers():
    """The breakable-graph model is the shared decoder's classes with its own attention op and
    learned positions (the gate's LLM, the same classes with causal attention and rotary positions:
    tests/pcg_gate/test_rebuild.py)."""
    a = bg.build_model(bg.TINY_CONFIG).model
    assert type(a) is td.DecoderStack and type(a.layers[0]) is td.DecoderLayer
    assert isinstance(a.layers[0].self_attn.attn, bg.VarlenAttention)
    assert hasattr(a, "embed_positions") and a.rotary is None


def test_halves_compose_to_the_layer():
    torch.manual_seed(0)
    stack = td.DecoderStack(ROTARY)
    h, pos = torch.randn(11, 64), torch.arange(11)
    layer = stack.layers[0]
    q, k, v = layer.pre_attn(h, pos, stack.rotary)
    assert q.shape == k.shape == v.shape == (11, 4, 16)
    torch.testing.assert_close(layer.post_attn(layer.self_attn.attn(q, k, v), h),
                               layer(h, pos, stack.rotary))


def test_causal_attention_is_causal():
    attn = td.CausalAttention(2, 8)
    q, k, v = (torch.randn(6, 2, 8) for _ in range(3))
    full = attn(q, k, v)
    # later tokens change nothing before them
    torch.testing.assert_close(attn(q[:3], k[:3], v[:3]), full[:3])


def test_bad_config():
    with pytest.raises(ValueError, match="positions"):
        td.DecoderConfig(positions="alibi")
    with pytest.raises(ValueError, match="learned"):
        bg.build_model(ROTARY)
    with pytest.raises(ValueError, match="draw_on"):
        bg.build_model(bg.TINY_CONFIG, draw_on="gpu")


def test_weights_drawn_on_the_device_have_the_cpu_distributions():
    cpu = bg.build_model(bg.TINY_CONFIG)
    # "device" is the CPU here: the path, not the place
    dev = bg.build_model(bg.TINY_CONFIG, draw_on="device")
    for (name, a), (_, b) in zip(cpu.named_parameters(), dev.named_parameters()):
        if a.dim() >= 2:
            assert b.float().std().item() == pytest.approx(a.float().std().item(), rel=0.2), name
        else:
            assert torch.equal(b, torch.ones_like(b)) if "norm" in name else True
