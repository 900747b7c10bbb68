"""Chapter 3: ResidualBlock and GeluMLP; the block with DenseMLP against Hugging Face's modules."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kimi_mlp.block import GeluMLP, ResidualBlock
from kimi_mlp.config import KimiK2Config, gelu_mlp_parameters
from kimi_mlp.rmsnorm import RMSNorm
from kimi_mlp.swiglu import DenseMLP
from numerics import rel_rms, rel_rms_bound

SHAPES = [(1, 1), (2, 3), (4, 5)]  # [B, T]
DTYPES = [torch.float32, torch.bfloat16]


def fill(module, rng):
    "Gains near 1, weights of std 1/sqrt(fan-in): activations of order 1, as in a trained model."
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("layernorm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=rng))
            else:
                p.copy_(torch.randn(p.shape, generator=rng) / p.shape[1] ** 0.5)
    return module


def oracle(block, h):
    "The block in float64: h + mlp(rmsnorm(h)), for a GeluMLP or a DenseMLP."
    norm, mlp = block.post_attention_layernorm, block.mlp
    h64 = h.double()
    x = norm.weight.double() * h64 / torch.sqrt(h64.pow(2).mean(-1, keepdim=True) + norm.eps)
    if isinstance(mlp, GeluMLP):
        a = F.gelu(x @ mlp.up_proj.weight.double().T)
    else:
        g = x @ mlp.gate_proj.weight.double().T
        a = g * torch.sigmoid(g) * (x @ mlp.up_proj.weight.double().T)
    return h64 + a @ mlp.down_proj.weight.double().T


def make_block(rng, mlp_cls, d, f, dtype):
    return fill(ResidualBlock(RMSNorm(d, dtype=dtype), mlp_cls(d, f, dtype=dtype)), rng)


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from transformers.utils import logging
    logging.set_verbosity_error()
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP, DeepseekV3RMSNorm
    return DeepseekV3Config, DeepseekV3MLP, DeepseekV3RMSNorm


@pytest.mark.parametrize("mlp_cls", [GeluMLP, DenseMLP])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_block_float64_oracle(rng, mlp_cls, dtype, shape):
    d, f = 256, 640
    block = make_block(rng, mlp_cls, d, f, dtype)
    h = torch.randn(*shape, d, generator=rng).to(dtype)
    out = block(h)
    assert out.dtype == dtype and out.shape == h.shape
    assert rel_rms(out, oracle(block, h)) <= rel_rms_bound(dtype, f)


def test_oracle_bound_can_fail(rng):
    "The criterion rejects a block without its residual and, in float32, a tanh-approximated GELU."
    block = make_block(rng, GeluMLP, 256, 640, torch.float32)
    h = torch.randn(2, 3, 256, generator=rng)
    o = oracle(block, h)
    x = block.post_attention_layernorm(h)
    no_residual = block.mlp(x)
    tanh_gelu = h + block.mlp.down_proj(F.gelu(block.mlp.up_proj(x), approximate="tanh"))
    assert rel_rms(no_residual, o) > rel_rms_bound(torch.float32, 640)
    assert rel_rms(tanh_gelu, o) > rel_rms_bound(torch.float32, 640)


@pytest.mark.parametrize("mlp_cls", [GeluMLP, DenseMLP])
def test_block_is_h_plus_mlp_of_norm_bitwise(rng, mlp_cls):
    block = make_block(rng, mlp_cls, 256, 640, torch.bfloat16)
    h = torch.randn(3, 4, 256, generator=rng).to(torch.bfloat16)
    assert torch.equal(block(h), h + block.mlp(block.post_attention_layernorm(h)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d, f", [(256, 640), (200, 330)])
def test_ffn_half_bitwise_equal_to_transformers(rng, hf, dtype, shape, d, f):
    """The FFN half of DeepseekV3DecoderLayer, built from transformers' own modules with the same
    weights: residual + mlp(post_attention_layernorm(residual)). Same order: identical bits."""
    config_cls, mlp_cls, norm_cls = hf
    ours = make_block(rng, DenseMLP, d, f, dtype)
    config = config_cls(hidden_size=d, intermediate_size=f, hidden_act="silu", rms_norm_eps=1e-6)
    ref_norm = norm_cls(d, eps=config.rms_norm_eps).to(dtype)
    ref_mlp = mlp_cls(config).to(dtype)
    ref_norm.load_state_dict({"weight": ours.post_attention_layernorm.weight})
    ref_mlp.load_state_dict(ours.mlp.state_dict())
    h = torch.randn(*shape, d, generator=rng).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(h), h + ref_mlp(ref_norm(h)))


def test_checkpoint_keys_load_with_prefix_stripped(rng):
    d, f = 256, 640
    block = ResidualBlock(RMSNorm(d, dtype=torch.bfloat16), DenseMLP(d, f, dtype=torch.bfloat16))
    prefix = "model.layers.0."
    shapes = {"post_attention_layernorm.weight": (d,), "mlp.gate_proj.weight": (f, d),
              "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f)}
    assert {k: tuple(v.shape) for k, v in block.state_dict().items()} == shapes
    checkpoint = {prefix + k: torch.randn(s, generator=rng).to(torch.bfloat16) for k, s in shapes.items()}
    block.load_state_dict({k.removeprefix(prefix): v for k, v in checkpoint.items()}, strict=True)
    for k, v in checkpoint.items():
        assert torch.equal(block.state_dict()[k.removeprefix(prefix)], v)


def test_gelu_mlp_structure_and_kimi_count():
    m = GeluMLP(256, 640)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "up_proj.weight": (640, 256), "down_proj.weight": (256, 640)}
    assert m.up_proj.bias is None and m.down_proj.bias is None
    assert sum(p.numel() for p in m.parameters()) == 2 * 256 * 640
    cfg = KimiK2Config()  # Kimi width as arithmetic: allocating it would cost a gigabyte
    assert 2 * cfg.hidden_size * cfg.intermediate_size == gelu_mlp_parameters(cfg) == 264_241_152


def test_mlp_is_pluggable(rng):
    "Any module with the right shapes plugs in; the block adds its output to h."
    block = ResidualBlock(nn.Identity(), nn.Identity())
    h = torch.randn(2, 3, 8, generator=rng)
    assert torch.equal(block(h), h + h)


def test_bad_construction_and_inputs():
    with pytest.raises(TypeError, match="post_attention_layernorm: expected an nn.Module, got function"):
        ResidualBlock(lambda h: h, GeluMLP(8, 16))
    with pytest.raises(TypeError, match="mlp: expected an nn.Module, got NoneType"):
        ResidualBlock(RMSNorm(8), None)
    with pytest.raises(ValueError, match="intermediate_size: expected a positive int, got -1"):
        GeluMLP(8, -1)
    block = ResidualBlock(RMSNorm(8), GeluMLP(8, 16))
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., 8\] \(the size of weight\), got shape \[2, 9\]"):
        block(torch.randn(2, 9))
    with pytest.raises(ValueError, match="x: expected a floating tensor, got torch.int64"):
        block(torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., 8\] \(hidden_size\), got shape \[2, 9\]"):
        GeluMLP(8, 16)(torch.randn(2, 9))


def test_float32_gain_in_bf16_block_is_caught(rng):
    "A float32 gain promotes the norm's output to float32; the bf16 MLP says so instead of failing deep in a matmul."
    block = ResidualBlock(RMSNorm(8), GeluMLP(8, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"x: expected torch.bfloat16 \(the dtype of the weights\), got torch.float32"):
        block(torch.randn(2, 8, generator=rng).to(torch.bfloat16))
