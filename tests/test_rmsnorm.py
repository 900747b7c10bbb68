"""Chapter 2: rms_norm / RMSNorm against a float64 oracle and Hugging Face's DeepseekV3RMSNorm."""
import math

import pytest
import torch
import torch.nn.functional as F

from kimi_mlp.rmsnorm import RMSNorm, rms_norm

U_BF16, U_F32 = 2.0**-8, 2.0**-24  # unit roundoff: 8 and 24 significant bits
SHAPES = [(1, 1), (2, 5), (3, 7)]  # [B, T]
DTYPES = [torch.float32, torch.bfloat16]


def oracle(x, weight, eps):
    x64 = x.double()
    return weight.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)


def rel_bound(dtype, d):
    """Element-wise relative error bound: the float32 statistics contribute at most about
    (d + 8) u_f32 (d-term sum, square, mean, eps, rsqrt, products); a bf16 result is then rounded
    twice (cast back, gain), each at most u_bf16."""
    return (2 * U_BF16 if dtype == torch.bfloat16 else 0.0) + (d + 8) * U_F32


def draw(rng, shape, dtype, scale=2.0):
    return (scale * torch.randn(*shape, generator=rng)).to(dtype)


@pytest.fixture(scope="module")
def hf_norm():
    pytest.importorskip("transformers")
    from transformers.utils import logging
    logging.set_verbosity_error()
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    return DeepseekV3RMSNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d", [200, 256])
def test_float64_oracle(rng, dtype, shape, d):
    x = draw(rng, (*shape, d), dtype)
    w = (1 + 0.1 * torch.randn(d, generator=rng)).to(dtype)
    y = rms_norm(x, w)
    assert y.dtype == dtype and y.shape == x.shape
    o = oracle(x, w, 1e-6)
    err = ((y.double() - o).abs() / o.abs()).max().item()
    assert err <= rel_bound(dtype, d), f"max relative error {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_bitwise_equal_to_transformers(rng, hf_norm, dtype, shape, eps):
    "Same order of operations as DeepseekV3RMSNorm: the outputs must be identical, bit for bit."
    d = 256
    ours = RMSNorm(d, eps=eps, dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(1 + 0.1 * torch.randn(d, generator=rng))
    ref = hf_norm(d, eps=eps).to(dtype)
    ref.load_state_dict(ours.state_dict())
    x = draw(rng, (*shape, d), dtype)
    assert torch.equal(ours(x), ref(x))


def test_bitwise_equal_to_transformers_float32_gain_bf16_input(rng, hf_norm):
    "A float32 gain promotes a bf16 input's result to float32, in both implementations."
    d = 192
    ours, ref = RMSNorm(d), hf_norm(d)
    with torch.no_grad():
        ours.weight.copy_(1 + 0.1 * torch.randn(d, generator=rng))
    ref.load_state_dict(ours.state_dict())
    x = draw(rng, (2, 3, d), torch.bfloat16)
    y = ours(x)
    assert y.dtype == torch.float32 and torch.equal(y, ref(x))


def test_real_width(rng, hf_norm):
    d = 7168
    ours = RMSNorm(d, dtype=torch.bfloat16)
    with torch.no_grad():
        ours.weight.copy_(1 + 0.1 * torch.randn(d, generator=rng))
    ref = hf_norm(d).to(torch.bfloat16)
    ref.load_state_dict(ours.state_dict())
    x = draw(rng, (1, 3, d), torch.bfloat16, scale=3.0)
    y = ours(x)
    assert torch.equal(y, ref(x))
    o = oracle(x, ours.weight, 1e-6)
    assert ((y.double() - o).abs() / o.abs()).max().item() <= rel_bound(torch.bfloat16, d)


def test_order_of_casts(rng):
    """The gain multiplies the bf16-rounded normalised x; torch's built-in applies it before
    rounding. With a non-trivial gain the two must differ somewhere, by at most one bf16 step."""
    d = 1024
    x = draw(rng, (4, d), torch.bfloat16)
    w = (1 + 0.1 * torch.randn(d, generator=rng)).to(torch.bfloat16)
    y = rms_norm(x, w)
    xf = x.float()
    by_hand = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(y, by_hand)
    builtin = F.rms_norm(x, (d,), w, 1e-6)
    differ = (y != builtin).sum().item()
    assert 0 < differ < y.numel() // 2
    steps = (y.view(torch.int16).int() - builtin.view(torch.int16).int()).abs().max().item()
    assert steps == 1


def test_statistics_are_float32(rng):
    "A bf16 mean of squares would move the outputs: ours must equal the float32-statistics form."
    d = 7168
    x = draw(rng, (4, d), torch.bfloat16)
    ones = torch.ones(d, dtype=torch.bfloat16)
    bf16_stats = (x.float() * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).float() + 1e-6)).to(torch.bfloat16)
    y = rms_norm(x, ones)
    assert not torch.equal(y, bf16_stats)  # the check below can tell the two apart
    o = oracle(x, ones, 1e-6)
    assert ((y.double() - o).abs() / o.abs()).max().item() <= rel_bound(torch.bfloat16, d)


def test_eps_for_tiny_and_zero_inputs():
    d = 512
    ones = torch.ones(d)
    zero = torch.zeros(3, d, dtype=torch.bfloat16)
    assert torch.equal(rms_norm(zero, ones.bfloat16()), zero)
    assert rms_norm(zero, ones.bfloat16(), eps=0.0).isnan().all()
    v = torch.randn(1, d, generator=torch.Generator().manual_seed(0))
    v = v / v.pow(2).mean().sqrt()
    for r in (1e-5, 1e-3, 1.0):  # output rms is r / sqrt(r^2 + eps)
        out = rms_norm(r * v, ones).pow(2).mean().sqrt().item()
        assert math.isclose(out, r / math.sqrt(r * r + 1e-6), rel_tol=1e-5)


def test_module_defaults_and_state_dict():
    m = RMSNorm(64)
    assert list(m.state_dict()) == ["weight"] and torch.equal(m.weight, torch.ones(64))
    assert m.weight.dtype == torch.float32 and m.eps == 1e-6
    assert RMSNorm(64, eps=1e-5, dtype=torch.bfloat16).weight.dtype == torch.bfloat16
    assert "64, eps=1e-05" in repr(RMSNorm(64, eps=1e-5))


def test_gradients_match_float64_oracle():
    """Backward works and agrees with the float64 formula's gradient. (Like the reference, the
    statistics are float32 even for float64 input, so gradcheck's 1e-6 tolerances do not apply.)
    Bound: the forward's float32 part is within (d + 8) u_f32 (see rel_bound); the backward
    adds one more d-term float32 reduction (the sum of dy * g * x_hat over the token, or of
    dy * x_hat over the tokens for the gain), so we allow 2 (d + 8) u_f32 of the largest gradient
    (measured: about 3e-7 at most over 200 seeds, against 4.8e-6)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 32, generator=g, requires_grad=True)
    w = torch.randn(32, generator=g, requires_grad=True)
    dy = torch.randn(2, 3, 32, generator=g)
    gx, gw = torch.autograd.grad((rms_norm(x, w) * dy).sum(), (x, w))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ox, ow = torch.autograd.grad((oracle(x64, w64, 1e-6) * dy.double()).sum(), (x64, w64))
    bound = 2 * (32 + 8) * U_F32
    for got, want in ((gx, ox), (gw, ow)):
        assert ((got.double() - want).abs().max() / want.abs().max()).item() <= bound


@pytest.mark.parametrize("x, weight, match", [
    (torch.randn(2, 3, 200), torch.ones(256), r"x: expected \[\.\.\., 256\] \(the size of weight\), got shape \[2, 3, 200\]"),
    (torch.ones(2, 256, dtype=torch.int64), torch.ones(256), r"x: expected a floating tensor, got torch.int64"),
    (torch.randn(2, 256), torch.ones(16, 16), r"weight: expected a 1-d gain \[d\], got shape \[16, 16\]"),
    (torch.randn(2, 256), torch.ones(256, dtype=torch.int32), r"weight: expected a floating tensor, got torch.int32"),
    (torch.tensor(1.0), torch.ones(1), r"x: expected \[\.\.\., 1\]"),
])
def test_bad_inputs_name_argument_expected_and_got(x, weight, match):
    with pytest.raises(ValueError, match=match):
        rms_norm(x, weight)


def test_bad_arguments():
    with pytest.raises(TypeError, match="x: expected a torch.Tensor, got list"):
        rms_norm([1.0, 2.0], torch.ones(2))
    with pytest.raises(TypeError, match="weight: expected a torch.Tensor, got NoneType"):
        rms_norm(torch.ones(2), None)
    with pytest.raises(ValueError, match="eps: expected a number >= 0, got -1"):
        rms_norm(torch.ones(2), torch.ones(2), eps=-1)
    with pytest.raises(ValueError, match="hidden_size: expected a positive int, got 0"):
        RMSNorm(0)
    with pytest.raises(ValueError, match="hidden_size: expected a positive int, got 7168.0"):
        RMSNorm(7168.0)
    with pytest.raises(ValueError, match="eps: expected a number >= 0"):
        RMSNorm(8, eps="1e-6")
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., 8\]"):
        RMSNorm(8)(torch.randn(2, 9))
