"""Chapter 5: e4m3, block-scaled weights, per-group activations, the w8a16 / w8a8 references.

Oracles: an e4m3 decoder written here from the format's definition, float64 arithmetic, and
Hugging Face transformers (`integrations.finegrained_fp8`, `DeepseekV3MLP`) as a test-only
dependency. Every tolerance is derived in the test's comment or docstring.
"""
import math
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kimi_mlp.fp8 import (ACT_AMAX_EPS, FP8_MAX, Fp8DenseMLP, Fp8Linear, dequantize_weight_blockwise,
                          fp8_linear_w8a8, fp8_linear_w8a16, fp8_matmul_blockwise,
                          quantize_activation, quantize_weight_blockwise)
from kimi_mlp.swiglu import DenseMLP

E4M3 = torch.float8_e4m3fn
U = 2.0**-24          # float32 unit roundoff
U_BF16 = 2.0**-8      # bf16 unit roundoff: 8 significant bits, |fl(v) - v| <= 2^-8 |v|


# --------------------------------------------------------------------------- helpers (oracles)

def e4m3_from_definition(code: int) -> float:
    "The e4m3fn value of a byte, straight from the definition (float64, math.ldexp)."
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    mag = math.ldexp(m / 8, -6) if e == 0 else math.ldexp(1 + m / 8, e - 7)
    return -mag if s else mag


def expand(scale, shape, block):
    "Expand a [ceil(N/bn), ceil(K/bk)] scale grid to [N, K] (float64)."
    (n, k), (bn, bk) = shape, block
    return scale.double().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def half_ulp(t):
    "Half the e4m3 spacing at |t|: 2^(e-4) for |t| in [2^e, 2^(e+1)), e >= -6; 2^-10 below 2^-6."
    a = t.double().abs()
    e = torch.floor(torch.log2(a.clamp(min=2.0**-6)))
    return torch.where(a < 2.0**-6, torch.full_like(a, 2.0**-10), torch.exp2(e - 4))


def student_t(shape, gen, df=4.0, scale=1.0):
    "Heavy-tailed samples from a seeded generator: normal / sqrt(chi2_df / df)."
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    chi2 = torch.randn((int(df),) + tuple(shape), generator=gen, dtype=torch.float64).pow(2).sum(0)
    return (z / (chi2 / df).sqrt() * scale).float()


def block_amax(w, block):
    "amax(|w|) per block by explicit slicing (float64)."
    (n, k), (bn, bk) = w.shape, block
    return torch.tensor([[w[i:i + bn, j:j + bk].double().abs().max().item() for j in range(0, k, bk)]
                         for i in range(0, n, bn)], dtype=torch.float64)


RAGGED = [((576, 7168), (128, 128)), ((200, 330), (128, 128)), ((128, 128), (128, 128)),
          ((1, 5), (128, 128)), ((300, 129), (64, 32)), ((257, 640), (128, 128))]


# --------------------------------------------------------------------------- the e4m3 format

def test_every_e4m3_code_matches_torch():
    got = torch.arange(256, dtype=torch.uint8).view(E4M3).double()
    for code in range(256):
        want = e4m3_from_definition(code)
        g = got[code].item()
        if math.isnan(want):
            assert math.isnan(g), f"code 0x{code:02X}: expected NaN, got {g}"
        else:
            assert g == want and math.copysign(1, g) == math.copysign(1, want), \
                f"code 0x{code:02X}: expected {want!r}, got {g!r}"
    assert [c for c in range(256) if math.isnan(got[c].item())] == [0x7F, 0xFF]
    finite = got[~got.isnan()]
    assert finite.max().item() == FP8_MAX == 448.0 and finite.min().item() == -448.0
    assert sorted(set(finite.abs().tolist()))[1] == 2.0**-9   # smallest subnormal


def test_cast_rounds_to_nearest_even():
    "torch's cast (which our quantizers end with) is round-to-nearest-even on the e4m3 grid."
    vals = sorted({e4m3_from_definition(c) for c in range(256) if c not in (0x7F, 0xFF)})
    grid = torch.tensor(vals, dtype=torch.float64)
    even = torch.tensor([next(c for c in range(128) if e4m3_from_definition(c) == abs(v)) % 2 == 0
                         for v in vals])
    mids = ((grid[1:] + grid[:-1]) / 2)
    got = mids.float().to(E4M3).double()                  # midpoints are exact in float32
    want = torch.where(even[1:], grid[1:], grid[:-1])      # a tie goes to the even code
    assert torch.equal(got, want)
    up = torch.nextafter(mids.float(), torch.tensor(math.inf)).to(E4M3).double()
    down = torch.nextafter(mids.float(), torch.tensor(-math.inf)).to(E4M3).double()
    assert torch.equal(up, grid[1:]) and torch.equal(down, grid[:-1])


# --------------------------------------------------------------------------- weights

@pytest.mark.parametrize("shape, block", RAGGED)
def test_quantize_weight_blockwise_definition(shape, block, rng):
    w = student_t(shape, rng, scale=0.02).bfloat16()
    w_fp8, s = quantize_weight_blockwise(w, block)
    nb, kb = math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])
    assert w_fp8.dtype == E4M3 and tuple(w_fp8.shape) == shape
    assert s.dtype == torch.float32 and tuple(s.shape) == (nb, kb)
    # scale = amax / 448 in float32; bf16 amax is exact in float32, so this is bitwise
    assert torch.equal(s, block_amax(w, block).float() / 448)
    # codes = cast(clamp(w / scale)), elementwise against the expanded scale grid
    s_el = expand(s, shape, block).float()
    assert torch.equal(w_fp8.view(torch.uint8), (w.float() / s_el).clamp(-448, 448).to(E4M3).view(torch.uint8))
    # each block's largest element lands on +-448
    assert torch.equal(block_amax(w_fp8.float(), block), torch.full((nb, kb), 448.0, dtype=torch.float64))


def test_ragged_kv_a_proj_scale_shape():
    w = torch.ones(576, 7168, dtype=torch.bfloat16)
    _, s = quantize_weight_blockwise(w)
    assert tuple(s.shape) == (5, 56)


def test_zero_and_tiny_blocks_give_finite_scales_and_zeros():
    w = torch.randn(300, 260)
    w[128:256, 128:256] = 0                     # an all-zero full block
    w[256:, 256:] = 0                           # an all-zero ragged corner block (44 x 4)
    w[:128, 256:] = 1e-44                       # amax / 448 underflows float32 to 0
    w_fp8, s = quantize_weight_blockwise(w)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert s[1, 1].item() == s[2, 2].item() == 1.0
    assert (w_fp8[128:256, 128:256].float() == 0).all() and (w_fp8[256:, 256:].float() == 0).all()
    assert not w_fp8.float().isnan().any()
    deq = dequantize_weight_blockwise(w_fp8, s, dtype=torch.float32)
    assert (deq[128:256, 128:256] == 0).all() and torch.isfinite(deq).all()


def test_quantize_does_not_modify_its_input():
    w = torch.randn(200, 300)
    before = w.clone()
    quantize_weight_blockwise(w)
    assert torch.equal(w, before)


@pytest.mark.parametrize("shape, block", RAGGED)
def test_dequantize_matches_transformers(shape, block, rng):
    """transformers' `_dequantize_fp8_weight` (a private helper of integrations.finegrained_fp8: the
    public `Fp8Dequantize` needs N, K divisible by the block) multiplies code by scale per block,
    ragged edges included. In float32 it must agree bitwise; our bf16 output is the float32 product
    rounded once; the float32 product is within one rounding (2^-24 relative) of the exact float64."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    w_fp8, s = quantize_weight_blockwise(student_t(shape, rng, scale=0.05), block)
    s = s * torch.exp2(torch.randint(-3, 4, s.shape, generator=rng).float())   # varied scales
    hf = _dequantize_fp8_weight(w_fp8, s, list(block), torch.float32)
    ours32 = dequantize_weight_blockwise(w_fp8, s, block, dtype=torch.float32)
    assert torch.equal(ours32, hf)
    assert torch.equal(dequantize_weight_blockwise(w_fp8, s, block), hf.bfloat16())
    assert torch.equal(dequantize_weight_blockwise(w_fp8, s, block, dtype=torch.float16), hf.half())
    exact = w_fp8.double() * expand(s, shape, block)
    assert ((ours32.double() - exact).abs() <= U * exact.abs()).all()


@pytest.mark.parametrize("shape, block", RAGGED)
def test_dequantize_to_float64_is_exact(shape, block, rng):
    """Asked for float64, the product code x scale (4 + 24 significant bits) is formed in float64,
    where it is exact: bitwise the float64 product of the expanded scales (the float64 oracles of
    chapter 6 rely on it). float32 output stays the float32 product."""
    w_fp8, s = quantize_weight_blockwise(student_t(shape, rng, scale=0.05), block)
    s = s * torch.exp2(torch.randint(-3, 4, s.shape, generator=rng).float())
    exact = w_fp8.double() * expand(s, shape, block)
    assert torch.equal(dequantize_weight_blockwise(w_fp8, s, block, dtype=torch.float64), exact)
    assert torch.equal(dequantize_weight_blockwise(w_fp8, s, block, dtype=torch.float32),
                       w_fp8.float() * expand(s, shape, block).float())


@pytest.mark.parametrize("shape, block", [((576, 1100), (128, 128))] + RAGGED[1:])
@pytest.mark.parametrize("wide_range", [False, True])
def test_round_trip_error_is_at_most_half_an_ulp_at_the_block_scale(shape, block, wide_range, rng):
    """|dequant(quant(w)) - w| <= s * ulp(|t|)/2 + 2^-23 |w|, t = w / s in grid units.

    For |t| in the e4m3 binade [2^e, 2^(e+1)), e >= -6, the spacing is 2^(e-3), so rounding to
    nearest moves t by at most 2^(e-4); below 2^-6 the subnormal spacing 2^-9 gives 2^-10. Times s
    this is the error in w. The float32 division w / s and the product q * s each add at most one
    rounding, 2^-24 relative, hence 2^-23 |w| (to first order). `wide_range` multiplies columns by
    gains over 2^-16..2^0 so that many elements are subnormal in grid units."""
    w = student_t(shape, rng, scale=0.02)
    if wide_range:
        w = w * torch.exp2(-16 * torch.rand(shape[1], generator=rng))
    w_fp8, s = quantize_weight_blockwise(w, block)
    deq = dequantize_weight_blockwise(w_fp8, s, block, dtype=torch.float32).double()
    s_el = expand(s, shape, block)
    t = (w / s_el.float()).clamp(-448, 448)
    bound = s_el * half_ulp(t) + 2.0**-23 * w.double().abs()
    ratio = (deq - w.double()).abs() / bound
    assert ratio.max() <= 1
    if w.numel() > 10_000:
        assert ratio.max() > 0.9      # the bound is tight: some element uses nearly all of it
    # in bf16 the output adds one bf16 rounding
    deq16 = dequantize_weight_blockwise(w_fp8, s, block).double()
    assert ((deq16 - w.double()).abs() <= bound + U_BF16 * deq.abs()).all()


def test_dequantize_peak_memory_is_output_plus_one_block_row():
    """Dequantizing [4096, 8192] to bf16: the output is 64 MiB and one float32 block row 4 MiB. A
    route through a full float32 copy (codes widened, scales expanded) would need >= 128 MiB more.
    Measured as the growth of the process's peak RSS in a fresh interpreter."""
    code = textwrap.dedent("""
        import resource, torch
        from kimi_mlp.fp8 import dequantize_weight_blockwise
        torch.set_num_threads(1)
        n, k = 4096, 8192
        w = torch.randint(0, 0x7E, (n, k), dtype=torch.uint8).view(torch.float8_e4m3fn)
        s = torch.rand(n // 128, k // 128) + 0.5
        small = dequantize_weight_blockwise(w[:256], s[:2])       # warm up allocator and kernels
        del small
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = dequantize_weight_blockwise(w, s)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) / 1024)                            # ru_maxrss is in KiB on Linux
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    grown_mib = float(res.stdout.strip().splitlines()[-1])
    out_mib, block_row_mib = 64, 4
    assert grown_mib <= out_mib + 2 * block_row_mib + 8, f"peak RSS grew by {grown_mib:.0f} MiB"


# --------------------------------------------------------------------------- activations

@pytest.mark.parametrize("shape, group", [((3, 5, 320), 128), ((7, 128), 128), ((4, 100), 128),
                                          ((2, 1), 128), ((6, 384), 64)])
def test_quantize_activation_definition(shape, group, rng):
    x = (student_t(shape, rng, df=3.0) * 3).bfloat16()
    x[0, ..., :group] = 0                                      # an all-zero group
    x_fp8, scale = quantize_activation(x, group)
    k = shape[-1]
    g = math.ceil(k / group)
    assert x_fp8.dtype == E4M3 and x_fp8.shape == x.shape
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (*shape[:-1], g)
    amax = torch.stack([x[..., j * group:(j + 1) * group].float().abs().amax(-1) for j in range(g)], -1)
    # scale is max(amax, eps) / 448 as one IEEE float32 division: bitwise
    assert torch.equal(scale, torch.clamp(amax, min=ACT_AMAX_EPS) / torch.tensor(448.0))
    s_el = scale.repeat_interleave(group, -1)[..., :k]
    assert torch.equal(x_fp8.view(torch.uint8),
                       (x.float() / s_el).clamp(-448, 448).to(E4M3).view(torch.uint8))
    codes = x_fp8.float()
    assert not codes.isnan().any() and codes.abs().max() <= 448
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert (scale[0, ..., 0] == torch.tensor(ACT_AMAX_EPS, dtype=torch.float32) / 448).all()
    assert (codes[0, ..., :group] == 0).all()
    # round trip: half an ulp at the group's scale (see the weight test)
    t = (x.float() / s_el).clamp(-448, 448)
    err = (codes.double() * s_el.double() - x.double()).abs()
    assert (err <= s_el.double() * half_ulp(t) + 2.0**-23 * x.double().abs()).all()


def test_quantize_activation_extremes_never_nan():
    x = torch.tensor([[3e38, -3e38, 1.0, 0.0] + [0.0] * 124,
                      [1e-30, -1e-30] + [0.0] * 126,
                      [5e-45] + [0.0] * 127])              # a float32 subnormal
    x_fp8, scale = quantize_activation(x)
    codes = x_fp8.float()
    assert not codes.isnan().any() and codes.abs().max().item() == 448.0
    assert codes[0, 0].item() == 448.0 and codes[0, 1].item() == -448.0
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert scale[2, 0] == torch.tensor(ACT_AMAX_EPS, dtype=torch.float32) / 448   # the floor
    assert codes[2].abs().max() == 0       # 5e-45 / 2.2e-13 is far below the smallest subnormal


# --------------------------------------------------------------------------- linear layers

def w8a8_oracle(x2, w_fp8, s, bn=128):
    "Float64 value and absolute sum of the blocked FP8 product, from the same quantized tensors."
    n, k = w_fp8.shape
    xq, xs = quantize_activation(x2)
    ws = s.double().repeat_interleave(bn, 0)[:n]
    y = y_abs = 0
    for j in range(s.shape[1]):
        a, b = xq[:, j * 128:(j + 1) * 128].double(), w_fp8[:, j * 128:(j + 1) * 128].double()
        sc = xs[:, j, None].double() * ws[None, :, j]
        y, y_abs = y + (a @ b.T) * sc, y_abs + (a.abs() @ b.abs().T) * sc
    return y, y_abs


@pytest.mark.parametrize("n, k, lead", [(640, 384, (5,)), (576, 320, (2, 3)), (256, 640, (1,)),
                                        (100, 200, (4,)), (384, 128, (2, 1, 3))])
def test_w8a8_against_float64_oracle(n, k, lead, rng):
    """Each 128-term dot of e4m3 products is exact in float64 (multiples of 2^-18 below 2^25), so
    the reference's only roundings are that dot rounded once to float32 (u of the absolute sum),
    two scale multiplications (2u) and n_K accumulations (n_K u):
    |y - y64| <= (3 + n_K) u sum|terms|. A bf16 output adds 2^-8 |y| (bf16 unit roundoff)."""
    w = (student_t((n, k), rng) * k**-0.5).bfloat16()
    x = (student_t((*lead, k), rng, df=3.0)).bfloat16()
    w_fp8, s = quantize_weight_blockwise(w)
    y64, y_abs = w8a8_oracle(x.reshape(-1, k), w_fp8, s)
    bound = (3 + s.shape[1]) * U * y_abs
    y32 = fp8_linear_w8a8(x, w_fp8, s, out_dtype=torch.float32)
    assert y32.dtype == torch.float32 and y32.shape == (*lead, n)
    assert ((y32.reshape(-1, n).double() - y64).abs() <= bound).all()
    y16 = fp8_linear_w8a8(x, w_fp8, s)
    assert y16.dtype == torch.bfloat16
    assert torch.equal(y16, y32.bfloat16())
    assert ((y16.reshape(-1, n).double() - y64).abs() <= bound + U_BF16 * (y64.abs() + bound)).all()


def test_w8a8_step_sums_do_not_depend_on_the_order(rng):
    """The reference's result is fixed by the input bits: summing each 128-term step in another
    order (reversed within each step, or one product at a time) gives the same float32 output,
    bit for bit."""
    n, k = 192, 384
    w_fp8, s = quantize_weight_blockwise(student_t((n, k), rng) * k**-0.5)
    xq, xs = quantize_activation(student_t((6, k), rng, df=3.0).bfloat16())
    y = fp8_matmul_blockwise(xq, xs, w_fp8, s)
    rev = torch.arange(k).view(-1, 128).flip(-1).reshape(-1)         # each step's terms reversed
    assert torch.equal(y, fp8_matmul_blockwise(xq[:, rev], xs, w_fp8[:, rev], s))
    acc = torch.zeros(6, n)
    for j in range(s.shape[1]):
        cols = slice(128 * j, 128 * (j + 1))
        terms = xq[:, None, cols].double() * w_fp8[None, :, cols].double()   # exact products
        dot = torch.zeros(6, n, dtype=torch.float64)
        for t in range(128):                                        # one product at a time
            dot += terms[..., t]
        acc += dot.float() * xs[:, j, None] * s[:, j].repeat_interleave(128)[None, :n]
    assert torch.equal(y, acc)
    with pytest.raises(ValueError, match="x_scale: expected \\[6, 3\\]"):
        fp8_matmul_blockwise(xq, xs[:, :2], w_fp8, s)


def test_w8a8_uses_both_scales_per_k_block(rng):
    "Doubling one weight block's scale must change exactly the outputs of that block row."
    w_fp8, s = quantize_weight_blockwise(student_t((256, 384), rng))
    x = student_t((3, 384), rng).bfloat16()
    base = fp8_linear_w8a8(x, w_fp8, s, out_dtype=torch.float32)
    s2 = s.clone()
    s2[1, 2] *= 2
    changed = fp8_linear_w8a8(x, w_fp8, s2, out_dtype=torch.float32) != base
    assert changed[:, 128:].any() and not changed[:, :128].any()


@pytest.mark.parametrize("n, k", [(640, 384), (320, 256), (130, 300)])
def test_w8a16_against_bf16_linear(n, k, rng):
    """w8a16 = F.linear(x, dequantized weight) exactly. Against the bf16 Linear on the original
    weight it differs by the weights' quantization error weighted by |x| (per element: the
    half-ulp bound, plus 2^-8 |w_hat| for the bf16 rounding of the dequantized weight), plus each
    matmul's float32 accumulation (K u of the absolute sum) and bf16 output rounding (2^-8 |y|)."""
    w = (student_t((n, k), rng) * k**-0.5).bfloat16()
    x = student_t((2, 3, k), rng, df=3.0).bfloat16()
    w_fp8, s = quantize_weight_blockwise(w)
    y = fp8_linear_w8a16(x, w_fp8, s)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, n)
    assert torch.equal(y, F.linear(x, dequantize_weight_blockwise(w_fp8, s)))
    ref = F.linear(x, w)
    s_el = expand(s, (n, k), (128, 128))
    w_hat = dequantize_weight_blockwise(w_fp8, s, dtype=torch.float32).double()
    dw = s_el * half_ulp((w.float() / s_el.float()).clamp(-448, 448)) + 2.0**-23 * w.double().abs() \
        + U_BF16 * w_hat.abs()
    xa = x.double().abs()
    bound = xa @ dw.T + 2 * k * U * (xa @ w.double().abs().T) + U_BF16 * (y.double().abs() + ref.double().abs())
    assert ((y.double() - ref.double()).abs() <= bound).all()
    # and the bound is not vacuous: FP8 does move the result by a visible fraction of it
    assert ((y.double() - ref.double()).abs() / bound).max() > 0.05


def test_fp8_linear_module(rng):
    lin = nn.Linear(300, 200, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(student_t((200, 300), rng, scale=0.05))
    m = Fp8Linear.from_linear(lin)
    assert dict(m.named_buffers()).keys() == {"weight", "weight_scale_inv"}
    assert not list(m.parameters())
    assert m.weight.dtype == E4M3 and tuple(m.weight.shape) == (200, 300)
    assert m.weight_scale_inv.dtype == torch.float32 and tuple(m.weight_scale_inv.shape) == (2, 3)
    w_fp8, s = quantize_weight_blockwise(lin.weight.detach())
    assert torch.equal(m.weight.view(torch.uint8), w_fp8.view(torch.uint8)) and torch.equal(m.weight_scale_inv, s)
    same = Fp8Linear.from_linear(lin.weight.detach())
    assert torch.equal(same.weight_scale_inv, s)
    x = student_t((4, 300), rng).bfloat16()
    assert torch.equal(m(x), fp8_linear_w8a16(x, w_fp8, s))
    m.mode = "w8a8"
    assert torch.equal(m(x), fp8_linear_w8a8(x, w_fp8, s))
    assert torch.equal(m(x, mode="w8a16"), fp8_linear_w8a16(x, w_fp8, s)) and m.mode == "w8a8"
    # a state dict with the checkpoint's names loads into a fresh module
    fresh = Fp8Linear(300, 200)
    fresh.load_state_dict(m.state_dict())
    assert torch.equal(fresh.dequantized_weight(), m.dequantized_weight())


def _random_dense(hidden, inter, rng):
    dense = DenseMLP(hidden, inter, dtype=torch.bfloat16)
    with torch.no_grad():
        for lin in (dense.gate_proj, dense.up_proj, dense.down_proj):
            lin.weight.copy_(student_t(lin.weight.shape, rng) * (2 * lin.in_features) ** -0.5)
    return dense


@pytest.mark.parametrize("hidden, inter", [(256, 640), (384, 320)])
def test_fp8_dense_mlp_w8a16_matches_hf_deepseek_mlp(hidden, inter, rng):
    "w8a16 equals, bit for bit, transformers' DeepseekV3MLP holding the dequantized bf16 weights."
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP
    fmlp = Fp8DenseMLP.from_dense(_random_dense(hidden, inter, rng))
    hf = DeepseekV3MLP(DeepseekV3Config(hidden_size=hidden, intermediate_size=inter, hidden_act="silu"))
    hf = hf.to(torch.bfloat16)
    with torch.no_grad():
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(hf, name).weight.copy_(getattr(fmlp, name).dequantized_weight(torch.bfloat16))
    x = student_t((2, 5, hidden), rng, df=3.0).bfloat16()
    with torch.no_grad():
        assert torch.equal(fmlp(x), hf(x))


def test_fp8_dense_mlp_w8a8(rng):
    dense = _random_dense(384, 320, rng)
    fmlp = Fp8DenseMLP.from_dense(dense, mode="w8a8")
    assert list(fmlp.state_dict()) == ["gate_proj.weight", "gate_proj.weight_scale_inv",
                                       "up_proj.weight", "up_proj.weight_scale_inv",
                                       "down_proj.weight", "down_proj.weight_scale_inv"]
    x = student_t((3, 7, 384), rng, df=3.0).bfloat16()
    y = fmlp(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    # the contract the fused kernels are written against: float32 g, u and h, one bf16 rounding
    p = {n: (getattr(fmlp, n).weight, getattr(fmlp, n).weight_scale_inv) for n in ("gate_proj", "up_proj", "down_proj")}
    g = fp8_linear_w8a8(x, *p["gate_proj"], out_dtype=torch.float32)
    u = fp8_linear_w8a8(x, *p["up_proj"], out_dtype=torch.float32)
    want = fp8_linear_w8a8(F.silu(g) * u, *p["down_proj"], out_dtype=torch.bfloat16)
    assert torch.equal(y, want)
    # accuracy against the exact MLP on the dequantized weights. w8a8 rounds two activations to
    # e4m3 (x, and h before down_proj), each element by at most 2^-4 relative (half an ulp in the
    # normal range): a token's error is at most 2 * 2^-4 = 2^-3 (to first order). A rounding error
    # spread evenly over +-2^-4 has rms 2^-4/sqrt(3); two independent ones add in quadrature, so a
    # typical (median) token stays below sqrt(2/3) * 2^-4 = 5.1%. (The chapter measures ~2.8%; a
    # lost scale or a dropped block gives errors of order 1.)
    wd = [getattr(fmlp, n).dequantized_weight(torch.float32).double() for n in ("gate_proj", "up_proj", "down_proj")]
    xd = x.double()
    exact = (F.silu(xd @ wd[0].T) * (xd @ wd[1].T)) @ wd[2].T
    rel = ((y.double() - exact).norm(dim=-1) / exact.norm(dim=-1))
    assert rel.median() <= math.sqrt(2 / 3) * 2.0**-4 and rel.max() <= 2.0**-3


def test_mode_setter_and_override(rng):
    fmlp = Fp8DenseMLP.from_dense(_random_dense(256, 320, rng))
    x = student_t((4, 256), rng).bfloat16()
    y16 = fmlp(x)
    fmlp.mode = "w8a8"
    assert [m.mode for m in (fmlp.gate_proj, fmlp.up_proj, fmlp.down_proj)] == ["w8a8"] * 3
    y8 = fmlp(x)
    assert not torch.equal(y8, y16)
    assert torch.equal(fmlp(x, mode="w8a16"), y16) and fmlp.mode == "w8a8"
    with pytest.raises(ValueError, match=r"mode: expected one of .*got 'fp16'"):
        fmlp.mode = "fp16"
    with pytest.raises(ValueError, match=r"mode: expected one of .*got 'bf16'"):
        fmlp(x, mode="bf16")


# --------------------------------------------------------------------------- errors

W8 = torch.zeros(200, 300, dtype=E4M3)
S8 = torch.ones(2, 3)


@pytest.mark.parametrize("call, pattern", [
    (lambda: quantize_weight_blockwise(torch.ones(4, 4, dtype=torch.int64)),
     r"w: expected a floating tensor .*got torch.int64"),
    (lambda: quantize_weight_blockwise(torch.ones(4)), r"w: expected a 2-d tensor, got shape \(4,\)"),
    (lambda: quantize_weight_blockwise(torch.ones(2, 4, 4)), r"w: expected a 2-d tensor, got shape \(2, 4, 4\)"),
    (lambda: quantize_weight_blockwise(torch.ones(4, 4), (0, 128)),
     r"block_size: expected a pair of positive ints .*got \(0, 128\)"),
    (lambda: quantize_weight_blockwise(torch.ones(4, 4), (-1, 128)), r"block_size: expected .*got \(-1, 128\)"),
    (lambda: quantize_weight_blockwise(torch.ones(4, 4), (128,)), r"block_size: expected .*got \(128,\)"),
    (lambda: quantize_weight_blockwise(torch.ones(4, 4), (128.0, 128)), r"block_size: expected .*got \(128.0, 128\)"),
    (lambda: quantize_weight_blockwise(torch.tensor([[1.0, math.inf]])), r"w: expected finite values, got inf or NaN"),
    (lambda: quantize_weight_blockwise(torch.tensor([[1.0, math.nan]])), r"w: expected finite values"),
    (lambda: dequantize_weight_blockwise(W8.float(), S8),
     r"weight: expected dtype torch.float8_e4m3fn, got torch.float32"),
    (lambda: dequantize_weight_blockwise(W8[None], S8), r"weight: expected a 2-d tensor \[N, K\], got shape \(1, 200, 300\)"),
    (lambda: dequantize_weight_blockwise(W8, S8.bfloat16()),
     r"weight_scale_inv: expected dtype torch.float32, got torch.bfloat16"),
    (lambda: dequantize_weight_blockwise(W8, torch.ones(2, 2)),
     r"weight_scale_inv: expected shape \[2, 3\] .*got \[2, 2\]"),
    (lambda: dequantize_weight_blockwise(W8, S8, (0, 128)), r"block_size: expected .*got \(0, 128\)"),
    (lambda: dequantize_weight_blockwise(W8, S8, dtype=torch.int32), r"dtype: expected a floating dtype .*got torch.int32"),
    (lambda: quantize_activation(torch.ones(2, 4, dtype=torch.int32)), r"x: expected a floating tensor .*got torch.int32"),
    (lambda: quantize_activation(torch.ones(2, 4), 0), r"group_size: expected a positive int .*got 0"),
    (lambda: quantize_activation(torch.ones(2, 0)), r"x: expected a non-empty last dimension, got shape \(2, 0\)"),
    (lambda: fp8_linear_w8a16(torch.ones(3, 299), W8, S8), r"x: expected last dimension 300 .*got shape \(3, 299\)"),
    (lambda: fp8_linear_w8a8(torch.ones(3, 299), W8, S8), r"x: expected last dimension 300 .*got shape \(3, 299\)"),
    (lambda: fp8_linear_w8a8(torch.ones(3, 300), W8, torch.ones(2, 5), (128, 64)),
     r"block_size: expected block_size\[1\] == 128 .*got \(128, 64\)"),
    (lambda: fp8_linear_w8a8(torch.ones(3, 300), W8, torch.ones(3, 3)), r"weight_scale_inv: expected shape \[2, 3\]"),
    (lambda: fp8_linear_w8a8(torch.ones(3, 300), W8, S8, out_dtype=torch.int32),
     r"out_dtype: expected a floating torch dtype, got torch.int32"),
    (lambda: Fp8Linear(0, 5), r"in_features: expected a positive int, got 0"),
    (lambda: Fp8Linear(5, 5, mode="fp16"), r"mode: expected one of \('w8a16', 'w8a8'\), got 'fp16'"),
    (lambda: Fp8Linear.from_linear(nn.Linear(4, 4)), r"linear_or_weight: expected a Linear without bias"),
    (lambda: Fp8DenseMLP(256, -1), r"intermediate_size: expected a positive int, got -1"),
    (lambda: Fp8DenseMLP.from_dense(nn.Module()), r"dense: expected a module with nn.Linear gate_proj"),
])
def test_errors_name_argument_expected_and_got(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()
