"""Chapter 4: silu, swiglu, DenseMLP against a float64 oracle and Hugging Face's DeepseekV3MLP."""

import pytest
import torch
import torch.nn.functional as F

from kimi_mlp.config import KimiK2Config, dense_mlp_parameters, gelu_mlp_parameters
from kimi_mlp.swiglu import DenseMLP, silu, swiglu
from numerics import U_BF16, U_F32, rel_rms, rel_rms_bound

SHAPES = [(1, 1), (2, 3), (3, 5)]  # [B, T]
DTYPES = [torch.float32, torch.bfloat16]
SIZES = [(256, 640), (200, 330)]  # (hidden, intermediate): multiples of 128 and not


def oracle(mlp, x):
    x64 = x.double()
    g = x64 @ mlp.gate_proj.weight.double().T
    u = x64 @ mlp.up_proj.weight.double().T
    return (g * torch.sigmoid(g) * u) @ mlp.down_proj.weight.double().T


def make_mlp(rng, d, f, dtype):
    "A DenseMLP with weights of std 1/sqrt(fan-in), so activations stay of order 1."
    mlp = DenseMLP(d, f, dtype=dtype)
    with torch.no_grad():
        for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=rng) / lin.weight.shape[1] ** 0.5)
    return mlp


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from transformers.utils import logging
    logging.set_verbosity_error()
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP

    def build(d, f):
        return DeepseekV3MLP(DeepseekV3Config(hidden_size=d, intermediate_size=f, hidden_act="silu"))
    return build


# ---- silu and swiglu ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_is_torch_silu_and_within_one_rounding(rng, dtype):
    x = (4 * torch.randn(3, 5, 640, generator=rng)).to(dtype)
    y = silu(x)
    assert y.dtype == dtype and torch.equal(y, F.silu(x))
    exact = x.double() * torch.sigmoid(x.double())
    u = U_BF16 if dtype == torch.bfloat16 else 4 * U_F32  # one rounding (float32: sigmoid's few ulps)
    assert ((y.double() - exact).abs() <= u * exact.abs() + 1e-30).all()


def test_silu_in_bf16_is_not_x_times_sigmoid(rng):
    "Two bf16 roundings (sigmoid, product) against F.silu's one: they disagree somewhere."
    x = torch.randn(4, 18432, generator=rng).to(torch.bfloat16)
    assert not torch.equal(silu(x), x * torch.sigmoid(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(rng, dtype):
    g = torch.randn(2, 3, 640, generator=rng).to(dtype)
    u = torch.randn(2, 3, 640, generator=rng).to(dtype)
    h = swiglu(g, u)
    assert h.shape == g.shape and h.dtype == dtype
    assert torch.equal(h, F.silu(g) * u)
    assert (swiglu(torch.full((4,), -30.0), torch.full((4,), 5.0)).abs() < 1e-10).all()  # gate closed


def test_silu_swiglu_bad_inputs():
    with pytest.raises(ValueError, match="x: expected a floating tensor, got torch.int64"):
        silu(torch.arange(4))
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got float"):
        silu(1.0)
    with pytest.raises(ValueError, match=r"up: expected shape \[2, 640\] \(the shape of gate\), got \[2, 641\]"):
        swiglu(torch.randn(2, 640), torch.randn(2, 641))
    with pytest.raises(ValueError, match="x: expected a floating tensor, got torch.int32"):
        swiglu(torch.ones(2, 3, dtype=torch.int32), torch.ones(2, 3))


# ---- DenseMLP ----

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d, f", SIZES)
def test_dense_mlp_float64_oracle(rng, dtype, shape, d, f):
    mlp = make_mlp(rng, d, f, dtype)
    x = torch.randn(*shape, d, generator=rng).to(dtype)
    y = mlp(x)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_rms(y, oracle(mlp, x)) <= rel_rms_bound(dtype, max(d, f))


def test_oracle_bound_can_fail(rng):
    "The float64 criterion rejects a swapped gate and up (same shapes, different function)."
    mlp = make_mlp(rng, 256, 640, torch.bfloat16)
    x = torch.randn(2, 3, 256, generator=rng).to(torch.bfloat16)
    swapped = mlp.down_proj(F.silu(mlp.up_proj(x)) * mlp.gate_proj(x))
    assert rel_rms(swapped, oracle(mlp, x)) > rel_rms_bound(torch.bfloat16, 640)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d, f", SIZES)
def test_dense_mlp_bitwise_equal_to_transformers(rng, hf, dtype, shape, d, f):
    "Same order of operations as DeepseekV3MLP: identical outputs, bit for bit."
    ours = make_mlp(rng, d, f, dtype)
    ref = hf(d, f).to(dtype)
    ref.load_state_dict(ours.state_dict())  # strict: the key sets are the same
    x = torch.randn(*shape, d, generator=rng).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))


def test_state_dict_keys_and_shapes():
    mlp = DenseMLP(256, 640, dtype=torch.bfloat16)
    assert {k: tuple(v.shape) for k, v in mlp.state_dict().items()} == {
        "gate_proj.weight": (640, 256), "up_proj.weight": (640, 256), "down_proj.weight": (256, 640)}
    assert all(v.dtype == torch.bfloat16 for v in mlp.state_dict().values())
    assert all(lin.bias is None for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    assert sum(p.numel() for p in mlp.parameters()) == 3 * 256 * 640


def test_kimi_width_arithmetic():
    "Parameters and FLOP per token at Kimi K2's width, as arithmetic (nothing is allocated)."
    cfg = KimiK2Config()
    swiglu_params = 3 * cfg.hidden_size * cfg.intermediate_size
    gelu_params = 2 * cfg.hidden_size * cfg.intermediate_size
    assert swiglu_params == dense_mlp_parameters(cfg)["total"] == 396_361_728
    assert gelu_params == gelu_mlp_parameters(cfg) == 264_241_152
    assert 2 * swiglu_params == 792_723_456 and 2 * gelu_params == 528_482_304


@pytest.mark.parametrize("bad, match", [
    (torch.randn(2, 3, 200), r"x: expected \[\.\.\., 256\] \(hidden_size\), got shape \[2, 3, 200\]"),
    (torch.ones(2, 256, dtype=torch.int64), r"x: expected a floating tensor, got torch.int64"),
    (torch.randn(2, 256), r"x: expected torch.bfloat16 \(the dtype of the weights\), got torch.float32"),
])
def test_dense_mlp_bad_inputs(bad, match):
    mlp = DenseMLP(256, 640, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        mlp(bad)


@pytest.mark.parametrize("args, match", [
    ((0, 640), "hidden_size: expected a positive int, got 0"),
    ((256, 640.0), "intermediate_size: expected a positive int, got 640.0"),
    ((True, 640), "hidden_size: expected a positive int, got True"),
])
def test_dense_mlp_bad_sizes(args, match):
    with pytest.raises(ValueError, match=match):
        DenseMLP(*args)
