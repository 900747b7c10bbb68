"""Triton kernels (kimi_mlp.kernels) against the torch references of chapters 2 and 5.

Without CUDA these run through Triton's interpreter (conftest.py and kernels.py set
TRITON_INTERPRET=1), so shapes are small: hidden 256 / 384 and the non-multiples 200 / 320,
intermediate 640 / 320. With CUDA the kernels run on the GPU (inputs are drawn on the CPU and
moved there; the references run on the CPU). Every output buffer is poisoned with NaN before the
launch, so an element the kernel forgets to write fails the comparison.

Tolerances:
- bit for bit where the kernel and the reference do the same IEEE operations (dequantization,
  the e4m3 and bf16 roundings, the activation quantizer applied to the same input);
- bit for bit against the w8a8 reference for a GEMM with one K slice under the interpreter: each
  step's 128-term dot is exact in float64 in both (EXACT_DOT, chapters 5 and 8), rounded once,
  then scaled and accumulated in the same order, so no summation order is left to differ;
- relative error ||out - ref|| / ||ref|| <= 1e-2 against the w8a8 reference otherwise (split-K
  adds the slices' partial sums in another association; a GPU's tensor cores sum in their own
  order and precision), seen through the bf16 output rounding (unit roundoff 2^-8);
- DeepGEMM's 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 against the bf16 (w8a16) reference for ONE
  GEMM, which quantizes one activation: the measure is about (relative rms error)^2 / 2, and an
  e4m3 rounding (unit roundoff u = 2^-4, rms at most u / sqrt(3)) gives at most u^2 / 6 = 6.5e-4.
  The three-GEMM chain quantizes twice and has its own derived bound (CHAIN_DEEPGEMM_BOUND).
"""
import math
import os
import zlib

import pytest
import torch

from kimi_mlp import kernels as K  # first: sets TRITON_INTERPRET=1 when there is no CUDA device
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kimi_mlp.fp8 import (ACT_AMAX_EPS, FP8_MAX, dequantize_weight_blockwise, fp8_linear_w8a8,
                          fp8_linear_w8a16, fp8_matmul_blockwise, quantize_activation,
                          quantize_weight_blockwise)
from kimi_mlp.rmsnorm import rms_norm

E4M3 = torch.float8_e4m3fn
BF16_EPS = 2.0 ** -7   # spacing of bf16 numbers in [1, 2): one ulp
DEV = torch.device("cpu" if K.INTERPRETED else "cuda")
# Kernel h vs the reference h. Under the interpreter g and u are the reference's bit for bit
# (exact step sums) and only SiLU's exp differs (NumPy's against PyTorch's, a couple of ulps each;
# silu's relative error is below exp's): 16 float32 ulps, 2^-20. A float32-output GEMM with
# split-K: the slices' sums in another association, k_steps float32 roundings of the absolute sum.
# On a GPU the tensor cores' fp8 accumulation and the hardware exp add more: a looser,
# unmeasured bound there.
H_TOL = 2.0 ** -20 if K.INTERPRETED else 2e-3
FP32_SUM_TOL = 1e-4 if K.INTERPRETED else 2e-3
# DeepGEMM's measure ~ (relative rms error)^2 / 2. The MLP chain against w8a16 carries three
# independent e4m3 roundings, each adding at most (u / sqrt(3))^2 = u^2 / 3 to the squared
# relative error (u = 2^-4): x through gate_proj, x through up_proj (different weights, so
# uncorrelated errors in g and u), and h before down_proj. Sum u^2, measure u^2 / 2 = 2^-9
# (1.95e-3); measured 7e-4 to 1e-3. DeepGEMM's 1e-3 is for one GEMM and does not transfer.
CHAIN_DEEPGEMM_BOUND = 2.0 ** -9


# ----------------------------------------------------------------------------------- helpers
def gen(*case):
    "A generator seeded from the test case, so every case draws its own (reproducible) inputs."
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


def randn(g, *shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def deepgemm_diff(x, y):
    x, y = x.double(), y.double()
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def nan_like(shape, dtype):
    "An output buffer on DEV full of NaN (0x7F for e4m3, whose only NaN codes are 0x7F / 0xFF)."
    if dtype == E4M3:
        return torch.full(shape, 0x7F, dtype=torch.uint8, device=DEV).view(E4M3)
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def dev(*tensors):
    "Move kernel inputs to the device the kernels run on (the CPU under the interpreter)."
    return tuple(t.to(DEV) for t in tensors)


def cpu(t):
    return t.cpu()


def bits(t):
    t = t.cpu()
    return t.view(torch.uint8) if t.dtype == E4M3 else t


def weight(g, n, k, scale=0.05):
    return quantize_weight_blockwise(randn(g, n, k, scale=scale))


def poisoned_quant_outputs(m, k):
    return nan_like((m, k), E4M3), nan_like((m, math.ceil(k / 128)), torch.float32)


# ------------------------------------------------------------------ interpreter and roundings
def test_interpreter_flag_matches_the_environment():
    assert K.INTERPRETED == (os.environ.get("TRITON_INTERPRET") == "1")
    if not torch.cuda.is_available():
        assert K.INTERPRETED


@triton.jit
def _roundings_kernel(x_ptr, e4m3_ptr, bf16_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    q = tl.minimum(tl.maximum(x, -448.0), 448.0)
    tl.store(e4m3_ptr + offs, K.numerics._e4m3_code(q), mask=mask)
    tl.store(bf16_ptr + offs, K.numerics._round_to_bf16(x), mask=mask)


def rounding_probe_values():
    "Every e4m3 value, every midpoint between neighbours (the ties), their fp32 neighbours, randoms."
    codes = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    grid = codes[torch.isfinite(codes)].unique()                       # 253 values, -448..448
    mids = (grid[1:] + grid[:-1]) / 2                                   # exact in fp32
    near = torch.cat([torch.nextafter(mids, torch.tensor(-1e30)), torch.nextafter(mids, torch.tensor(1e30))])
    g = torch.Generator().manual_seed(7)
    rand = torch.exp(torch.empty(200_000).uniform_(-14, 6.1, generator=g))
    rand = rand * torch.where(torch.rand(200_000, generator=g) < 0.5, -1.0, 1.0)
    return torch.cat([grid, mids, near, rand, torch.tensor([0.0, -0.0, 2.0**-10, -2.0**-10, 1e-30])])


def test_e4m3_and_bf16_roundings_are_exact():
    x = rounding_probe_values()
    n = x.numel()
    e4m3 = nan_like((n,), E4M3).view(torch.uint8)           # 0x7F: a code torch never gives here
    bf = nan_like((n,), torch.float32)
    _roundings_kernel[(triton.cdiv(n, 8192),)](x.to(DEV), e4m3, bf, n, BLOCK=8192)
    e4m3, bf = e4m3.cpu(), bf.cpu()
    ref = x.clamp(-FP8_MAX, FP8_MAX).to(E4M3).view(torch.uint8)
    assert torch.equal(e4m3, ref), f"{(e4m3 != ref).sum().item()} of {n} e4m3 codes differ"
    assert torch.equal(bf, x.to(torch.bfloat16).float())


# ------------------------------------------------------------------------- 1. dequantization
@pytest.mark.parametrize("shape, block_size", [((256, 384), (128, 128)), ((200, 320), (128, 128)),
                                               ((130, 200), (64, 128))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantize_matches_torch_bitwise(shape, block_size, dtype):
    g = gen("dq", shape, block_size, dtype)
    w_fp8, s = quantize_weight_blockwise(randn(g, *shape), block_size)
    out = nan_like(shape, dtype)
    got = K.dequantize_blockwise_triton(*dev(w_fp8, s), block_size, dtype, out=out)
    assert got is out
    assert torch.equal(got.cpu(), dequantize_weight_blockwise(w_fp8, s, block_size, dtype))


# ------------------------------------------------------------------- 2. RMSNorm + quantization
@pytest.mark.parametrize("m, d", [(1, 256), (3, 320), (16, 200), (33, 384), (128, 256)])
def test_rmsnorm_quant(m, d):
    g = gen("rq", m, d)
    h = randn(g, m, d, scale=3.0, dtype=torch.bfloat16)
    w = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)
    h[0, : min(d, 128)] = 0.0                               # an all-zero group: finite scale
    x_fp8, x_scale = poisoned_quant_outputs(m, d)
    normed = nan_like((m, d), torch.bfloat16)
    q, s = K.rmsnorm_quant(*dev(h, w), 1e-6, out=x_fp8, scale_out=x_scale, normed_out=normed)
    assert q is x_fp8 and s is x_scale
    q, s, normed = q.cpu(), s.cpu(), normed.cpu()
    # the quantizer in the kernel is the torch quantizer, bit for bit, on the kernel's own input
    ref_q, ref_s = quantize_activation(normed)
    assert torch.equal(bits(q), bits(ref_q)) and torch.equal(s, ref_s)
    # the normalized x is rms_norm's up to a rare last-place difference: the fp32 sum of squares
    # is reduced in another order, which can move rstd by an fp32 ulp and flip a rounding of the
    # bf16 x-hat by one ulp; the gain product, rounded again, turns that into at most two ulps of y
    ref = rms_norm(h, w, 1e-6)
    assert not torch.isnan(normed).any()
    ulp = torch.where(ref == 0, 0.0, BF16_EPS * 2.0 ** torch.floor(torch.log2(ref.float().abs())))
    far = (normed.float() - ref.float()).abs() > 2 * ulp
    assert not far.any(), f"{far.sum().item()} elements more than 2 ulp from rms_norm"
    assert (normed == ref).float().mean() >= 0.99
    # and the end result against quantize_activation(rms_norm(h))
    full_q, full_s = quantize_activation(ref)
    deq = q.float() * s.repeat_interleave(128, dim=1)[:, :d]
    ref_deq = full_q.float() * full_s.repeat_interleave(128, dim=1)[:, :d]
    assert rel_err(deq, ref_deq) <= 1e-2
    assert torch.equal(s[0, 0], torch.tensor(ACT_AMAX_EPS, dtype=torch.float32) / FP8_MAX)


def test_rmsnorm_quant_float32_gain():
    "An fp32 gain promotes the normalized x to fp32, as in rms_norm."
    g = gen("rq32")
    h = randn(g, 5, 320, dtype=torch.bfloat16)
    w = torch.rand(320, generator=g) + 0.5
    normed = nan_like((5, 320), torch.float32)
    q, s = K.rmsnorm_quant(*dev(h, w), 1e-5, normed_out=normed)
    q, s, normed = q.cpu(), s.cpu(), normed.cpu()
    ref_q, ref_s = quantize_activation(normed)
    assert torch.equal(bits(q), bits(ref_q)) and torch.equal(s, ref_s)
    assert rel_err(normed, rms_norm(h, w, 1e-5)) <= 1e-6


@pytest.mark.parametrize("m, k, dtype", [(1, 256, torch.bfloat16), (3, 320, torch.float32),
                                         (33, 200, torch.bfloat16), (128, 384, torch.float16)])
def test_act_quant_matches_quantize_activation_bitwise(m, k, dtype):
    g = gen("aq", m, k, dtype)
    x = (randn(g, m, k) * torch.logspace(-3, 3, k)).to(dtype)
    x[0, :128] = 0.0                                        # an all-zero group
    padded = torch.zeros(m, k + 64, dtype=dtype)            # rows with a stride > K
    padded[:, :k] = x
    out, scale_out = poisoned_quant_outputs(m, k)
    q, s = K.act_quant(dev(padded)[0][:, :k], out=out, scale_out=scale_out)
    assert q is out and s is scale_out
    ref_q, ref_s = quantize_activation(x)
    assert torch.equal(bits(q), bits(ref_q)) and torch.equal(s.cpu(), ref_s)


# --------------------------------------------------------------------------- 3. the FP8 GEMM
@pytest.mark.parametrize("m, n, k, split_k", [
    (1, 256, 640, 1), (1, 200, 640, 3), (3, 384, 320, 2), (16, 320, 256, 1),
    (33, 256, 200, 1), (33, 384, 640, 2), (128, 200, 384, 1),
])
def test_fp8_gemm(m, n, k, split_k):
    g = gen("gemm", m, n, k, split_k)
    x = randn(g, m, k, dtype=torch.bfloat16)
    w_fp8, w_s = weight(g, n, k)
    a_fp8, a_s = quantize_activation(x)                 # row-padded when k % 128 != 0
    out = nan_like((m, n), torch.bfloat16)
    got = K.fp8_gemm(*dev(a_fp8, a_s, w_fp8, w_s), out=out, split_k=split_k)
    assert got is out
    got = got.cpu()
    ref = fp8_linear_w8a8(x, w_fp8, w_s)
    assert rel_err(got, ref) <= 1e-2
    if K.INTERPRETED and split_k == 1:      # exact step sums in both, the same order: same bits
        assert torch.equal(got, ref)
    assert deepgemm_diff(got, fp8_linear_w8a16(x, w_fp8, w_s)) < 1e-3


def test_fp8_gemm_float32_output_and_split_k_agree():
    g = gen("gemm32")
    x = randn(g, 8, 640, dtype=torch.bfloat16)
    w_fp8, w_s = weight(g, 256, 640)
    a_fp8, a_s = quantize_activation(x)
    ref = fp8_linear_w8a8(x, w_fp8, w_s, out_dtype=torch.float32)
    for split_k in (1, 2, 5):
        out = nan_like((8, 256), torch.float32)
        got = K.fp8_gemm(*dev(a_fp8, a_s, w_fp8, w_s), torch.float32, out=out, split_k=split_k)
        assert rel_err(got.cpu(), ref) <= FP32_SUM_TOL   # fp32 out: only the association differs
        if K.INTERPRETED and split_k == 1:
            assert torch.equal(got.cpu(), ref)


# The planner (chapter 8's plan_gemm) at Kimi K2's shapes on an H200's 132 SMs.
def test_plan_decode_makes_whole_waves():
    gu = K.plan_gemm("gate_up", 1, 18432, 7168, 132)
    assert (gu["SWAP"], gu["tiles"], gu["split_k"], gu["steps"]) == (True, 144, 8, 7)
    assert gu["programs"] == 1152 and gu["wave_eff"] > 0.96    # 8.73 waves of 7 steps
    down = K.plan_gemm("down", 1, 7168, 18432, 132)
    assert (down["tiles"], down["split_k"], down["programs"]) == (56, 7, 392)   # 2.97
    for m in (1, 4, 16, 32, 64, 128, 1024, 4096):
        for kind, n, k in (("gate_up", 18432, 7168), ("down", 7168, 18432)):
            p = K.plan_gemm(kind, m, n, k, 132)
            one = K.plan_gemm(kind, m, n, k, 132, split_k=1)
            assert p["wave_eff"] >= one["wave_eff"], (kind, m)
            assert p["split_k"] == 1 or p["steps"] >= K.MIN_STEPS
            assert p["SWAP"] == (m <= 64) and p["smem"] <= 227 * 1024


def test_plan_split_follows_the_sm_count_and_the_budget():
    # a full GPU's worth of tiles needs no split; a 1-SM plan (the interpreter) neither
    assert K.plan_gemm("gate_up", 4096, 18432, 7168, 132)["split_k"] == 1
    assert K.plan_gemm("gate_up", 1, 18432, 7168, 1)["split_k"] == 1
    # more SMs, more slices; at M = 16 the partials' budget caps the gate/up slices
    assert K.plan_gemm("down", 1, 7168, 18432, 264)["split_k"] > 7
    caps = [K.plan_gemm("gate_up", 16, 18432, 7168, 132, budget=b)["split_k"]
            for b in (0.05, 0.1, None)]
    assert caps == [2, 4, 7]
    forced = K.plan_gemm("gemm", 1, 256, 384, 132, split_k=9)   # 3 K steps: 3 slices
    assert (forced["split_k"], forced["steps"], forced["programs"]) == (3, 1, 6)


def test_plan_weighs_the_tail_against_the_partials():
    """The split is the cheapest in program-steps, waves times the longest slice plus
    the partials' bytes over what the SMs stream in a step, computed here from the
    definition; at M = 64 the gated kernel's second wave of 12 programs loses to four
    slices, although their partials are 29% of the weight bytes."""
    for kind, n, k in (("gate_up", 18432, 7168), ("down", 7168, 18432)):
        w = 2 if kind == "gate_up" else 1
        for m in (1, 16, 32, 48, 64, 96, 128, 192, 256, 1024, 4096):
            p = K.plan_gemm(kind, m, n, k, 132)
            steps = -(-k // 128)

            def cost(s):
                partial = 0 if s == 1 else 2 * s * w * m * n * 4
                return (-(-p["tiles"] * s // 132) * -(-steps // s)
                        + partial / (132 * w * 128 * 128))

            allowed = [s for s in range(1, 33) if s == 1 or steps // s >= K.MIN_STEPS]
            assert cost(p["split_k"]) == min(cost(s) for s in allowed), (kind, m)
    p64 = K.plan_gemm("gate_up", 64, 18432, 7168, 132)
    assert (p64["split_k"], p64["programs"]) == (4, 576)
    assert round(p64["partial_share"], 3) == 0.286
    assert K.plan_gemm("gate_up", 64, 18432, 7168, 132, budget=0.1)["split_k"] == 1


def test_plan_takes_a_measured_row_and_its_split():
    row = dict(K.GEMM_TILES["gemm"][0][1], num_stages=3, split_k=5)
    tiles = {("gemm", 7168, 18432): ((16, row), (None, K.GEMM_TILES["gemm"][-1][1]))}
    p = K.plan_gemm("down", 8, 7168, 18432, 132, tiles=tiles)
    assert (p["num_stages"], p["split_k"]) == (3, 5)
    assert K.plan_gemm("down", 8, 7168, 18432, 132, split_k=2, tiles=tiles)["split_k"] == 2
    other = K.plan_gemm("gate_up", 8, 18432, 7168, 132, tiles=tiles)   # not in the file
    assert other == K.plan_gemm("gate_up", 8, 18432, 7168, 132)


@pytest.mark.parametrize("args, match", [
    (("conv", 1, 1, 1, 1), "kind: expected 'gemm', 'down' or 'gate_up', got 'conv'"),
    (("gemm", 0, 1, 1, 1), "m: expected a positive int, got 0"),
    (("gemm", 1, 1, 1, True), "num_sms: expected a positive int, got True"),
    (("gemm", 1, 1, 1, 1, 0), "split_k: expected a positive int or None, got 0"),
])
def test_plan_refuses_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        K.plan_gemm(*args)


# One K slice under the interpreter: the reference's arithmetic, bit for bit, in every
# bucket of GEMM_TILES (swapped and not), with TMA descriptors (aligned rows) and with
# masked loads (K = 200: rows of 200 bytes are not 16-byte multiples).
GEMM_SHAPES = [(1, 256, 256), (3, 320, 200), (16, 384, 320), (33, 256, 384),
               (65, 320, 256), (128, 200, 256), (300, 128, 256)]
BUCKET_M = {1: 16, 3: 16, 16: 16, 33: 64, 65: 64, 128: 64, 300: 128}
interpreted = pytest.mark.skipif(not K.INTERPRETED, reason="interpreter checks (CPU): "
                                 "exact step sums; a GPU's tensor cores sum in their order")


def blockwise_operands(g, m, n, k):
    "x [m, k] quantized 1 x 128 (heavy-ish tails) and w [n, k] quantized 128 x 128."
    x = torch.randn(m, k, generator=g) * torch.randn(m, k, generator=g).mul(0.5).exp()
    return (*quantize_activation(x), *quantize_weight_blockwise(
        torch.randn(n, k, generator=g) * k ** -0.5))


def step_terms(a, a_s, w, w_s):
    """[S, M, N] fp32: the reference's per-step terms t_j = (dot_j * a_s) * w_s (the dot
    exact in float64, rounded once): fp8_matmul_blockwise = t_0 + t_1 + ... in order."""
    n = w.shape[0]
    out = []
    for kb in range(w_s.shape[1]):
        cols = slice(kb * 128, (kb + 1) * 128)
        dot = (a[:, cols].double() @ w[:, cols].double().T).float()
        w_col = w_s[:, kb].repeat_interleave(128)[:n]
        out.append(dot * a_s[:, kb, None] * w_col[None, :])
    return torch.stack(out)


def assoc_bound(terms):
    "Per element: two fp32 sums of the same S terms differ by at most 2 S u sum |t_j|."
    return 2 * terms.shape[0] * 2.0 ** -24 * terms.double().abs().sum(0)


@interpreted
@pytest.mark.parametrize("m, n, k", GEMM_SHAPES)
def test_fp8_gemm_one_slice_is_the_reference_bit_for_bit(m, n, k):
    a, a_s, w, w_s = blockwise_operands(gen("gemm1", m, n, k), m, n, k)
    ref = fp8_matmul_blockwise(a, a_s, w, w_s)
    out = nan_like((m, n), torch.float32)
    assert K.fp8_gemm(a, a_s, w, w_s, torch.float32, out=out, split_k=1) is out
    assert torch.equal(out, ref)
    bf = K.fp8_gemm(a, a_s, w, w_s, split_k=1, out=nan_like((m, n), torch.bfloat16))
    assert torch.equal(bf, ref.to(torch.bfloat16))
    plan = K.plan_gemm("gemm", m, n, k, 1)
    assert plan["SWAP"] == (m <= 64) and plan["BLOCK_M"] == BUCKET_M[m]
    assert K._tma_ok(w) == (k % 16 == 0)


@interpreted
@pytest.mark.parametrize("m, n, k", [(3, 320, 256), (65, 256, 384)])
def test_tma_and_masked_loads_give_the_same_bits(m, n, k):
    a, a_s, w, w_s = blockwise_operands(gen("tma", m, n, k), m, n, k)
    ref = fp8_matmul_blockwise(a, a_s, w, w_s)
    base = K.plan_gemm("gemm", m, n, k, 1)
    (desc,) = K._weight_operands(w)
    assert not isinstance(desc, torch.Tensor)                 # aligned: a descriptor
    for tma_a in (False, True):
        for weight in (w, desc):
            plan = K._with_meta(dict(base, TMA_A=tma_a))
            out = nan_like((m, n), torch.float32)
            K._launch_gemm(a, a_s, weight, w_s, out, None, plan)
            assert torch.equal(out, ref), (tma_a, type(weight).__name__)


@interpreted
@pytest.mark.parametrize("m, n, k, split", [(1, 256, 640, 5), (16, 320, 384, 2),
                                            (65, 200, 704, 3)])
def test_split_k_is_deterministic_and_within_the_association_bound(m, n, k, split):
    a, a_s, w, w_s = blockwise_operands(gen("split", m, n, k), m, n, k)
    terms = step_terms(a, a_s, w, w_s)
    ref = fp8_matmul_blockwise(a, a_s, w, w_s)
    got = [K.fp8_gemm(a, a_s, w, w_s, torch.float32, split_k=split) for _ in range(2)]
    assert torch.equal(got[0], got[1])                       # a fixed order: same bits
    assert ((got[0].double() - ref.double()).abs() <= assoc_bound(terms)).all()


@interpreted
@pytest.mark.parametrize("m, f, d, split", [(1, 704, 256, 1), (3, 330, 320, 1),
                                            (33, 320, 200, 1), (16, 704, 320, 3)])
def test_down_residual_bitwise_or_within_the_bound(m, f, d, split):
    g = gen("down-bits", m, f, d)
    p, p_s, w, w_s = blockwise_operands(g, m, d, f)
    residual = torch.randn(m, d, generator=g).to(torch.bfloat16)
    out = K.fp8_down_residual(p, p_s, w, w_s, residual, split_k=split,
                              out=nan_like((m, d), torch.bfloat16))
    mlp = fp8_matmul_blockwise(p, p_s, w, w_s).to(torch.bfloat16)
    if split == 1:                                   # the unfused two bf16 roundings
        assert torch.equal(out, residual + mlp)
        return
    terms = step_terms(p, p_s, w, w_s)
    mlp64, assoc = terms.double().sum(0), assoc_bound(terms)
    # the fp32 sum, then two bf16 roundings of at most half an ulp (2^-8 relative): of
    # the GEMM's sum, and of residual + that (judged by the result itself)
    bound = assoc + 2.0**-8 * (mlp64.abs() + assoc) + 2.0**-8 * out.double().abs()
    assert ((out.double() - residual.double() - mlp64).abs() <= bound).all()


# ------------------------------------------------------------- 4. gate + up + SwiGLU + quant
@pytest.mark.parametrize("m, d, f", [(1, 256, 640), (3, 320, 320), (16, 384, 640),
                                     (33, 200, 320), (128, 256, 640)])
def test_gate_up_swiglu_quant(m, d, f):
    g = gen("gu", m, d, f)
    x = randn(g, m, d, dtype=torch.bfloat16)
    (gw, gs), (uw, us) = weight(g, f, d), weight(g, f, d)
    x_fp8, x_s = quantize_activation(x)
    out, scale_out = poisoned_quant_outputs(m, f)
    p_out = nan_like((m, f), torch.float32)
    q, s = K.fp8_gate_up_swiglu_quant(*dev(x_fp8, x_s, gw, gs, uw, us), out=out, scale_out=scale_out,
                                      p_out=p_out)
    assert q is out and s is scale_out
    q, s, p_out = q.cpu(), s.cpu(), p_out.cpu()
    # the epilogue's quantizer is the torch quantizer, bit for bit, on the kernel's own p
    ref_q, ref_s = quantize_activation(p_out)
    assert torch.equal(bits(q), bits(ref_q)) and torch.equal(s, ref_s)
    # the kernel's p is the w8a8 reference's p, up to SiLU's exp (see H_TOL)
    gate = fp8_linear_w8a8(x, gw, gs, out_dtype=torch.float32)
    up = fp8_linear_w8a8(x, uw, us, out_dtype=torch.float32)
    p_ref = torch.nn.functional.silu(gate) * up
    assert rel_err(p_out, p_ref) <= H_TOL
    deq = q.float() * s.repeat_interleave(128, dim=1)[:, :f]
    assert rel_err(deq, p_ref) <= 5e-2                 # e4m3 rounding of p: ~2^-5 relative RMS


def run_gate_up(x, x_s, gw, gs, uw, us, **kw):
    "The gated kernel into poisoned buffers, p_out included: (codes, scales, p)."
    m, f = x.shape[0], gw.shape[0]
    out, s_out = poisoned_quant_outputs(m, f)
    p = nan_like((m, f), torch.float32)
    q, s = K.fp8_gate_up_swiglu_quant(x, x_s, gw, gs, uw, us, out=out, scale_out=s_out,
                                      p_out=p, **kw)
    assert q is out and s is s_out
    return q, s, p


def gate_up_operands(m, d, f):
    g = gen("gu-ops", m, d, f)
    x, x_s, gw, gs = blockwise_operands(g, m, f, d)
    return x, x_s, gw, gs, *quantize_weight_blockwise(torch.randn(f, d, generator=g) / d**0.5)


@interpreted
@pytest.mark.parametrize("m, d, f", [(1, 256, 704), (3, 320, 330), (16, 200, 320),
                                     (33, 320, 330), (65, 256, 200), (300, 256, 128)])
def test_gate_up_every_bucket_and_its_split_path(m, d, f):
    """Every bucket, ragged shapes: the quantizer bitwise on the kernel's own h, h within
    H_TOL of the w8a8 reference (only SiLU's exp differs), and the split path with one
    slice (partials, then `_swiglu_quant_reduce_kernel`) the fused kernel's bits."""
    ops = gate_up_operands(m, d, f)
    q, s, h = run_gate_up(*ops, split_k=1)
    ref_q, ref_s = quantize_activation(h)
    assert torch.equal(bits(q), bits(ref_q)) and torch.equal(s, ref_s)
    x, x_s, gw, gs, uw, us = ops
    h_ref = torch.nn.functional.silu(fp8_matmul_blockwise(x, x_s, gw, gs)) \
        * fp8_matmul_blockwise(x, x_s, uw, us)
    assert rel_err(h, h_ref) <= H_TOL
    if m * f > 30_000:          # the interpreter's quantizer is slow: checked where cheap
        return
    plan = K._with_meta(K.plan_gemm("gate_up", m, f, d, 1))
    q1, s1 = poisoned_quant_outputs(m, f)
    h1 = nan_like((m, f), torch.float32)
    K._launch_gate_up(x, x_s, gw, gs, uw, us, q1.view(torch.uint8), s1, h1, plan,
                      force_reduce=True)
    assert torch.equal(bits(q1), bits(q)) and torch.equal(s1, s) and torch.equal(h1, h)


@interpreted
@pytest.mark.parametrize("m, d, f, split", [(1, 640, 320, 5), (16, 384, 330, 3)])
def test_gate_up_split_k_is_deterministic_and_within_the_bound(m, d, f, split):
    """Split-K for the gated kernel: the reduction's quantizer bitwise on its own h; h
    against one slice within |dh| <= 1.1 |dg| |u| + |silu(g)| |du| (silu' < 1.1), dg and
    du the association bounds of the two GEMMs, plus 8 fp32 ulps of the evaluation."""
    ops = gate_up_operands(m, d, f)
    q, s, h = run_gate_up(*ops, split_k=split)
    ref_q, ref_s = quantize_activation(h)
    assert torch.equal(bits(q), bits(ref_q)) and torch.equal(s, ref_s)
    _, _, h1 = run_gate_up(*ops, split_k=1)
    x, x_s, gw, gs, uw, us = ops
    gate, up = fp8_matmul_blockwise(x, x_s, gw, gs), fp8_matmul_blockwise(x, x_s, uw, us)
    dg = assoc_bound(step_terms(x, x_s, gw, gs))
    du = assoc_bound(step_terms(x, x_s, uw, us))
    silu = torch.nn.functional.silu(gate.double())
    bound = 1.1 * dg * up.double().abs() + silu.abs() * du + 8 * 2.0**-24 * h1.double().abs()
    assert ((h.double() - h1.double()).abs() <= bound).all()
    again = run_gate_up(*ops, split_k=split)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(again, (q, s, h)))


# -------------------------------------------------------------------- 5. down + residual
@pytest.mark.parametrize("m, f, d, split_k", [(1, 640, 256, 1), (1, 640, 320, 3), (3, 320, 384, 2),
                                              (16, 640, 200, 1), (33, 320, 256, 2), (128, 640, 384, 1)])
def test_down_residual(m, f, d, split_k):
    g = gen("down", m, f, d, split_k)
    p = randn(g, m, f)
    residual = randn(g, m, d, dtype=torch.bfloat16)
    dw, ds = weight(g, d, f)
    p_fp8, p_s = quantize_activation(p)
    out = nan_like((m, d), torch.bfloat16)
    got = K.fp8_down_residual(*dev(p_fp8, p_s, dw, ds, residual), out=out, split_k=split_k)
    assert got is out
    got = got.cpu()
    mlp = fp8_linear_w8a8(p, dw, ds, out_dtype=torch.bfloat16)
    assert rel_err(got, residual + mlp) <= 1e-2            # the unfused bf16 residual add
    if K.INTERPRETED and split_k == 1:      # exact step sums, the same two bf16 roundings
        assert torch.equal(got, residual + mlp)
    # the GEMM part alone (a zero residual adds nothing): w8a8 and w8a16 references
    alone = K.fp8_down_residual(*dev(p_fp8, p_s, dw, ds, torch.zeros_like(residual)),
                                out=nan_like((m, d), torch.bfloat16), split_k=split_k).cpu()
    assert rel_err(alone, mlp) <= 1e-2
    assert deepgemm_diff(alone, fp8_linear_w8a16(p, dw, ds)) < 1e-3


def test_down_residual_in_place():
    g = gen("inplace")
    p_fp8, p_s, dw, ds, residual = dev(*quantize_activation(randn(g, 4, 320)), *weight(g, 256, 320),
                                       randn(g, 4, 256, dtype=torch.bfloat16))
    expected = K.fp8_down_residual(p_fp8, p_s, dw, ds, residual)
    got = K.fp8_down_residual(p_fp8, p_s, dw, ds, residual, out=residual)
    assert got is residual and torch.equal(got, expected)


# ----------------------------------------------------------------------- the three together
@pytest.mark.parametrize("m, d, f", [(1, 256, 640), (33, 320, 320), (128, 256, 320)])
def test_three_kernels_make_the_ffn_half(m, d, f):
    g = gen("ffn", m, d, f)
    hidden = randn(g, m, d, dtype=torch.bfloat16)
    gain = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)
    (gw, gs), (uw, us), (dw, ds) = weight(g, f, d), weight(g, f, d), weight(g, d, f)
    x_fp8, x_s = K.rmsnorm_quant(*dev(hidden, gain), 1e-6)
    p_fp8, p_s = K.fp8_gate_up_swiglu_quant(x_fp8, x_s, *dev(gw, gs, uw, us))
    out = K.fp8_down_residual(p_fp8, p_s, *dev(dw, ds, hidden), out=nan_like((m, d), torch.bfloat16))
    mlp = K.fp8_down_residual(p_fp8, p_s, *dev(dw, ds, torch.zeros_like(hidden)),
                              out=nan_like((m, d), torch.bfloat16))
    out, mlp = out.cpu(), mlp.cpu()
    x = rms_norm(hidden, gain, 1e-6)
    # the w8a8 reference (Fp8DenseMLP's mode "w8a8", written out) and the block's residual add
    h = torch.nn.functional.silu(fp8_linear_w8a8(x, gw, gs, out_dtype=torch.float32)) \
        * fp8_linear_w8a8(x, uw, us, out_dtype=torch.float32)
    mlp_w8a8 = fp8_linear_w8a8(h, dw, ds, out_dtype=torch.bfloat16)
    assert rel_err(out, hidden + mlp_w8a8) <= 1e-2
    assert rel_err(mlp, mlp_w8a8) <= 1e-2
    # the bf16 reference with dequantized weights (w8a16): the chain's derived bound (see
    # CHAIN_DEEPGEMM_BOUND), and no worse than the torch w8a8 reference, which makes the same
    # three roundings, up to 1e-4 (a tenth of the measure: other fp32 sum orders can flip an
    # e4m3 code of h or a bf16 rounding of the output).
    mlp_w8a16 = fp8_linear_w8a16(
        torch.nn.functional.silu(fp8_linear_w8a16(x, gw, gs)) * fp8_linear_w8a16(x, uw, us), dw, ds)
    diff = deepgemm_diff(mlp, mlp_w8a16)
    assert diff < CHAIN_DEEPGEMM_BOUND and diff <= deepgemm_diff(mlp_w8a8, mlp_w8a16) + 1e-4


# ----------------------------------------------------------------------------- validation
def _operands():
    g = gen("val")
    return dev(*quantize_activation(randn(g, 4, 256)), *weight(g, 320, 256))


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a.update(a_fp8=a["a_fp8"].float()), r"a_fp8: expected dtype torch.float8_e4m3fn, got torch.float32"),
    (lambda a: a.update(a_scale=a["a_scale"][:, :1].contiguous()), r"a_scale: expected shape \[4, 2\], got \[4, 1\]"),
    (lambda a: a.update(w_scale=a["w_scale"].t().contiguous()), r"w_scale: expected shape \[3, 2\], got \[2, 3\]"),
    (lambda a: a.update(w_scale=a["w_scale"].double()), r"w_scale: expected dtype torch.float32"),
    (lambda a: a.update(w_fp8=a["w_fp8"][:, :128].contiguous()), r"w_fp8: expected \[N, 256\]"),
    (lambda a: a.update(w_fp8=a["w_fp8"][:, :128]), r"w_fp8: expected a contiguous tensor"),
    (lambda a: a.update(a_fp8=a["a_fp8"][:, ::2]), r"a_fp8: expected rows with unit stride"),
    (lambda a: a.update(a_fp8=a["a_fp8"][0]), r"a_fp8: expected a 2-d tensor \[M, K\], got shape \[256\]"),
    (lambda a: a.update(a_scale=torch.empty(4, 2, device="meta")), r"a_scale: expected a tensor on (cpu|cuda)"),
    (lambda a: a.update(out_dtype=torch.float16), r"out_dtype: expected torch.bfloat16 or torch.float32"),
    (lambda a: a.update(split_k=0), r"split_k: expected a positive int or None, got 0"),
    (lambda a: a.update(out=nan_like((4, 321), torch.bfloat16)), r"out: expected shape \[4, 320\]"),
])
def test_fp8_gemm_rejects_bad_input_before_writing(mutate, match):
    x_fp8, x_s, w, s = _operands()
    args = dict(a_fp8=x_fp8, a_scale=x_s, w_fp8=w, w_scale=s, out_dtype=torch.bfloat16, split_k=None,
                out=nan_like((4, 320), torch.bfloat16))
    poisoned = args["out"]
    mutate(args)
    with pytest.raises((ValueError, TypeError), match=match):
        K.fp8_gemm(**args)
    assert torch.isnan(poisoned).all()                       # nothing was launched


def test_other_wrappers_reject_bad_input():
    x_fp8, x_s, w, s = _operands()
    (h,) = dev(torch.randn(4, 256).to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"h: expected dtype torch.bfloat16, got torch.float32"):
        K.rmsnorm_quant(h.float(), torch.ones(256, dtype=torch.bfloat16, device=DEV), 1e-6)
    with pytest.raises(ValueError, match=r"weight: expected shape \[256\], got \[255\]"):
        K.rmsnorm_quant(h, torch.ones(255, dtype=torch.bfloat16, device=DEV), 1e-6)
    with pytest.raises(ValueError, match=r"eps: expected a number >= 0, got -1"):
        K.rmsnorm_quant(h, torch.ones(256, dtype=torch.bfloat16, device=DEV), -1)
    with pytest.raises(ValueError, match=r"group_size: expected a power of two >= 16 such as 128, got 100"):
        K.rmsnorm_quant(h, torch.ones(256, dtype=torch.bfloat16, device=DEV), 1e-6, group_size=100)
    out = nan_like((4, 256), E4M3)
    with pytest.raises(ValueError, match=r"scale_out: expected shape \[4, 2\], got \[4, 3\]"):
        K.rmsnorm_quant(h, torch.ones(256, dtype=torch.bfloat16, device=DEV), 1e-6, out=out,
                        scale_out=torch.empty(4, 3, device=DEV))
    assert (out.view(torch.uint8) == 0x7F).all()
    with pytest.raises(ValueError, match=r"up_w: expected shape \[320, 256\], got \[256, 256\]"):
        K.fp8_gate_up_swiglu_quant(x_fp8, x_s, w, s, w[:256].contiguous(), s[:2].contiguous())
    with pytest.raises(ValueError, match=r"up_scale: expected shape \[3, 2\], got \[2, 2\]"):
        K.fp8_gate_up_swiglu_quant(x_fp8, x_s, w, s, w, s[:2].contiguous())
    with pytest.raises(ValueError, match=r"p_out: expected dtype torch.float32, got torch.bfloat16"):
        K.fp8_gate_up_swiglu_quant(x_fp8, x_s, w, s, w, s, p_out=torch.empty(4, 320, dtype=torch.bfloat16, device=DEV))
    p_fp8, p_s, dw, ds = dev(*quantize_activation(torch.randn(4, 320)),
                             *quantize_weight_blockwise(torch.randn(320, 320)))
    with pytest.raises(ValueError, match=r"residual: expected shape \[4, 320\], got \[4, 256\]"):
        K.fp8_down_residual(p_fp8, p_s, dw, ds, h)
    with pytest.raises(ValueError, match=r"residual: expected dtype torch.bfloat16 or torch.float32"):
        K.fp8_down_residual(x_fp8, x_s, w, s, torch.zeros(4, 320, dtype=torch.float16, device=DEV))
    with pytest.raises(ValueError, match=r"block_size: expected a pair of powers of two"):
        K.dequantize_blockwise_triton(w, s, block_size=(128, 100))
    with pytest.raises(ValueError, match=r"weight_scale_inv: expected shape \[5, 4\], got \[3, 2\]"):
        K.dequantize_blockwise_triton(w, s, block_size=(64, 64))
    with pytest.raises(ValueError, match=r"dtype: expected torch.bfloat16, torch.float16 or torch.float32"):
        K.dequantize_blockwise_triton(w, s, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"x: expected dtype torch.bfloat16 or torch.float16 or "
                                         r"torch.float32, got torch.float8_e4m3fn"):
        K.act_quant(x_fp8)
    with pytest.raises(ValueError, match=r"group_size: expected a power of two >= 16"):
        K.act_quant(h, group_size=96)
    with pytest.raises(TypeError, match=r"w_fp8: expected a torch.Tensor, got ndarray"):
        K.dequantize_blockwise_triton(w.view(torch.uint8).cpu().numpy(), s)


@pytest.mark.skipif(K.INTERPRETED, reason="the interpreter runs kernels on CPU tensors")
def test_compiled_kernels_reject_cpu_tensors():
    x_fp8, x_s, w, s = (t.cpu() for t in _operands())
    with pytest.raises(ValueError, match=r"a_fp8: expected a CUDA tensor"):
        K.fp8_gemm(x_fp8, x_s, w, s)


# ------------------------------------------------- non-finite values propagate (issue: no silent
# wrong answers). A NaN or inf anywhere must give NaN (or inf) in the same places as the torch
# references: the quantizers' amax and clamp propagate NaN, the e4m3 NaN codes decode as NaN.
def nonfinite(t):
    "Elements that are NaN or inf, as a bool tensor on the CPU (e4m3: the NaN codes)."
    t = t.cpu()
    return ~torch.isfinite(t.float())


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [(0, 0), (2, 130), (4, 255)])
def test_act_quant_propagates_nonfinite(value, where):
    x = randn(gen("nanq", where), 5, 256, dtype=torch.bfloat16)
    x[where] = value
    q, s = K.act_quant(*dev(x))
    q_ref, s_ref = quantize_activation(x)
    assert torch.equal(nonfinite(q), nonfinite(q_ref)) and nonfinite(q).any()
    assert torch.equal(nonfinite(s), nonfinite(s_ref))
    finite = ~nonfinite(q_ref)               # the finite codes are still the reference's bytes
    assert torch.equal(bits(q)[finite], bits(q_ref)[finite])
    if value != value:                       # a NaN input: NaN code 0x7F, as torch's cast gives
        assert bits(q)[where] == 0x7F


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_rmsnorm_quant_propagates_nonfinite(value):
    g = gen("nanrms", value)
    h = randn(g, 4, 320, dtype=torch.bfloat16)
    h[1, 200] = value
    gain = (torch.rand(320, generator=g) + 0.5).to(torch.bfloat16)
    q, s = K.rmsnorm_quant(*dev(h, gain), 1e-6)
    q_ref, s_ref = quantize_activation(rms_norm(h, gain, 1e-6))
    assert torch.equal(nonfinite(q), nonfinite(q_ref)) and nonfinite(q[1]).any()
    assert torch.equal(nonfinite(s), nonfinite(s_ref))
    assert not nonfinite(q[[0, 2, 3]]).any()                 # other tokens are untouched


def test_gemm_reads_nan_codes_as_nan():
    g = gen("nancode")
    x = randn(g, 3, 256, dtype=torch.bfloat16)
    w_fp8, w_s = weight(g, 256, 256)
    w_fp8.view(torch.uint8)[7, 3] = 0x7F                     # NaN code in output column 7
    w_fp8.view(torch.uint8)[200, 131] = 0xFF                 # and -NaN in column 200
    a_fp8, a_s = quantize_activation(x)
    got = K.fp8_gemm(*dev(a_fp8, a_s, w_fp8, w_s), torch.float32, split_k=1).cpu()
    ref = fp8_linear_w8a8(x, w_fp8, w_s, out_dtype=torch.float32)
    assert torch.equal(nonfinite(got), nonfinite(ref))
    assert nonfinite(got)[:, [7, 200]].all() and nonfinite(got).sum() == 6


@pytest.mark.parametrize("case", ["h", "gate code", "up scale", "down code"])
def test_gate_up_and_down_propagate_nonfinite(case):
    g = gen("nanchain", case)
    m, d, f = 3, 256, 384
    x = randn(g, m, d, dtype=torch.bfloat16)
    (gw, gs), (uw, us), (dw, ds) = weight(g, f, d), weight(g, f, d), weight(g, d, f)
    if case == "h":
        x[1, 5] = float("nan")
    elif case == "gate code":
        gw.view(torch.uint8)[300, 17] = 0x7F
    elif case == "up scale":
        us[1, 0] = float("inf")
    else:
        dw.view(torch.uint8)[100, 50] = 0x7F
    x_fp8, x_s = quantize_activation(x)
    p_fp8, p_s = K.fp8_gate_up_swiglu_quant(*dev(x_fp8, x_s, gw, gs, uw, us))
    residual = randn(g, m, d, dtype=torch.bfloat16)
    out = K.fp8_down_residual(p_fp8, p_s, *dev(dw, ds, residual)).cpu()
    h_ref = torch.nn.functional.silu(fp8_linear_w8a8(x, gw, gs, out_dtype=torch.float32)) \
        * fp8_linear_w8a8(x, uw, us, out_dtype=torch.float32)
    ref = residual + fp8_linear_w8a8(h_ref, dw, ds, out_dtype=torch.bfloat16)
    assert nonfinite(ref).any()
    assert torch.equal(nonfinite(out), nonfinite(ref))


def test_round_to_bf16_keeps_nan_and_inf():
    @triton.jit
    def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        y = K.numerics._round_to_bf16(tl.load(x_ptr + offs, mask=mask, other=0.0))
        tl.store(y_ptr + offs, y, mask=mask)

    bits32 = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F800000,
                           0xFF800000, 0x7F7FFFFF], dtype=torch.int64).to(torch.int32)
    x = bits32.view(torch.float32)
    y = torch.empty_like(x)
    _round_kernel[(1,)](*dev(x, y), x.numel(), BLOCK=8)
    y = y.cpu()
    assert torch.isnan(y[:4]).all()                          # every NaN stays NaN
    assert torch.equal(y[4:6], x[4:6])                       # +-inf stay inf
    assert torch.equal(y[6:], x[6:].to(torch.bfloat16).float())   # largest finite: rounds to inf


@triton.jit
def _native_bits_kernel(x_ptr, e4m3_ptr, bf16_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(e4m3_ptr + offs, K.numerics._e4m3_bits(x, True), mask=offs < n)
    tl.store(bf16_ptr + offs, K.numerics._to_bf16(x, True), mask=offs < n)


@interpreted
def test_native_conversions_keep_torchs_nan_codes():
    """The GPU's branch (NATIVE) under the interpreter, on values that need no rounding
    (where the interpreter's own casts are exact): NaN -> 0x7F, -NaN -> 0xFF, the rest
    torch's codes. The roundings themselves are compared on a GPU (appendix C)."""
    vals = torch.tensor([float("nan"), -float("nan"), 448.0, -448.0, 0.0, -0.0, 2.0**-9,
                         -1.5, 240.0])
    e4m3, bf = torch.empty(9, dtype=torch.uint8), torch.empty(9)
    _native_bits_kernel[(1,)](vals, e4m3, bf, 9, BLOCK=16)
    ref = vals.to(E4M3).view(torch.uint8)
    assert e4m3.tolist()[:2] == [0x7F, 0xFF] and torch.equal(e4m3[2:], ref[2:])
    assert torch.equal(bf[2:], vals[2:]) and bf[:2].isnan().all()


# ----------------------------------------------------- outputs that overlap inputs are refused
def test_down_residual_refuses_partial_overlap_and_keeps_the_exact_alias():
    g = gen("overlap")
    p_fp8, p_s, dw, ds = dev(*quantize_activation(randn(g, 66, 320)), *weight(g, 256, 320))
    buf = randn(g, 67, 256, dtype=torch.bfloat16).to(DEV)
    before = buf.clone()
    with pytest.raises(ValueError, match="out: overlaps residual"):
        K.fp8_down_residual(p_fp8[:66], p_s[:66], dw, ds, buf[:66], out=buf[1:])
    assert torch.equal(buf, before)                          # refused before any write
    expected = K.fp8_down_residual(p_fp8, p_s, dw, ds, buf[:66].clone())
    got = K.fp8_down_residual(p_fp8, p_s, dw, ds, buf[:66], out=buf[:66])   # in place: allowed
    assert torch.equal(got, expected)


def test_outputs_may_not_overlap_inputs_or_each_other():
    g = gen("overlap2")
    x = randn(g, 4, 256).to(DEV)
    raw = torch.zeros(1024 + 32, dtype=torch.uint8, device=DEV)
    q_buf = raw[:1024].view(4, 256).view(E4M3)
    s_bad = raw[1000:1032].view(torch.float32).view(4, 2)       # shares q_buf's last 24 bytes
    with pytest.raises(ValueError, match="scale_out: overlaps out"):
        K.act_quant(x, out=q_buf, scale_out=s_bad)
    a_fp8, a_s = quantize_activation(randn(g, 4, 256))
    w_fp8, w_s = dev(*weight(g, 256, 256))
    raw = torch.zeros(4096, dtype=torch.uint8, device=DEV)
    a_in = raw[:1024].view(4, 256).view(E4M3)
    a_in.copy_(a_fp8.to(DEV))
    with pytest.raises(ValueError, match="out: overlaps a_fp8"):
        K.fp8_gemm(a_in, a_s.to(DEV), w_fp8, w_s, torch.float32,
                   out=raw.view(torch.float32).view(4, 256))
    x_fp8, x_s = dev(*quantize_activation(randn(g, 2, 256)))
    raw = torch.empty(2 * 256 + 2, device=DEV)
    p_out, s_bad = raw[:512].view(2, 256), raw[510:].view(2, 2)   # share two floats
    with pytest.raises(ValueError, match="p_out: overlaps scale_out"):
        K.fp8_gate_up_swiglu_quant(x_fp8, x_s, w_fp8, w_s, w_fp8, w_s,
                                   scale_out=s_bad, p_out=p_out)


# ----------------------------------------------------- 32-bit offsets: every wrapper, up front
@pytest.mark.skipif(not K.INTERPRETED, reason="meta tensors stand in for 4 GiB inputs on the CPU")
def test_offset_guards_cover_every_wrapper():
    big = torch.empty(2**31 // 256 + 1, 256, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="32-bit element offsets"):
        K.act_quant(big)
    with pytest.raises(ValueError, match="32-bit element offsets"):
        K.rmsnorm_quant(big, torch.ones(256, dtype=torch.bfloat16, device="meta"))


# --- the e4m3 decode from bytes (GPUs without an e4m3 type) --------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_byte_decode_is_exact_for_all_256_codes(dtype):
    """Every code against torch's own cast, bit for bit: normals, the 7 subnormals of
    each sign, +0 and -0 (sign kept), and NaN for exactly 0x7F and 0xFF."""
    codes = torch.arange(256, dtype=torch.uint8)
    got, ref = K.decode_e4m3(codes, dtype), codes.view(torch.float8_e4m3fn).float().to(dtype)
    nan = torch.isnan(ref)
    assert torch.isnan(got).nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), ref[~nan].view(torch.int16))
    assert got[0x80].view(torch.int16).item() == -32768            # -0, not +0


def test_the_byte_decode_reads_fp8_tensors_through_a_byte_view():
    w = torch.randn(130, 257).to(torch.float8_e4m3fn)[:, 3:200]     # not contiguous
    assert torch.equal(K.decode_e4m3(w).float(), w.float())
    assert K.decode_e4m3(torch.empty(0, 5, dtype=torch.uint8)).shape == (0, 5)


@pytest.mark.parametrize("args, error, match", [
    ((torch.zeros(3),), TypeError, "codes: expected a torch.uint8 or torch.float8_e4m3fn"
                                   " tensor, got torch.float32"),
    (([1, 2],), TypeError, "codes: .* got list"),
    ((torch.zeros(3, dtype=torch.uint8), torch.float32), ValueError,
     "dtype: expected torch.bfloat16 or torch.float16, got torch.float32"),
])
def test_the_byte_decode_refuses_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        K.decode_e4m3(*args)


def _w8a16_oracle(x, w_fp8, w_scale):
    "float64 on the same values, and the bound appendix H derives for the kernel."
    n, k = w_fp8.shape
    w64 = (w_fp8.double() * w_scale.double().repeat_interleave(128, 0)[:n]
           .repeat_interleave(128, 1)[:, :k])
    ref = x.double() @ w64.T
    eps = 2.0 ** -8 if x.dtype == torch.bfloat16 else 2.0 ** -11
    sums = ((x.double().abs() @ w64.abs().T).norm() / ref.norm()).item()
    return ref, eps + (k + k / 128) * 2.0 ** -24 * sums


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(1, 128, 128), (5, 200, 320), (17, 256, 129)])
def test_w8a16_gemm_against_float64(m, n, k, dtype):
    torch.manual_seed(m * 1000 + n + k)
    w_fp8, w_scale = quantize_weight_blockwise(torch.randn(n, k))
    x = torch.randn(m, k).to(dtype)
    y = K.w8a16_gemm(x, w_fp8, w_scale)
    ref, tol = _w8a16_oracle(x, w_fp8, w_scale)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, ref) <= tol
    assert torch.equal(K.w8a16_gemm(x, w_fp8.view(torch.uint8), w_scale), y)


def test_w8a16_gemm_propagates_nan_and_keeps_zero_blocks_zero():
    w_fp8, w_scale = quantize_weight_blockwise(torch.randn(256, 256))
    w_scale[1, 0] = 0.0                               # a zero block: zeros, not NaN
    x = torch.randn(2, 256).to(torch.bfloat16)
    x[1, 5] = float("nan")
    y = K.w8a16_gemm(x, w_fp8, w_scale)
    assert torch.isnan(y[1]).all() and not torch.isnan(y[0]).any()


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(2, 128), torch.zeros(128, 128, dtype=torch.uint8), torch.ones(1, 1)),
     "x: expected dtype torch.bfloat16 or torch.float16, got torch.float32"),
    ((torch.zeros(2, 128, dtype=torch.bfloat16), torch.zeros(128, 64, dtype=torch.uint8),
      torch.ones(1, 1)), r"w: expected \[N, 128\] \(K of x\), got shape \[128, 64\]"),
    ((torch.zeros(2, 128, dtype=torch.bfloat16), torch.zeros(128, 128, dtype=torch.uint8),
      torch.ones(2, 1)), r"weight_scale_inv: expected shape \[1, 1\], got \[2, 1\]"),
])
def test_w8a16_gemm_refuses_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        K.w8a16_gemm(*args)
