"""Chapter 8's model of FP8 tensor-core sums, and the GPU bounds derived from it.

The model: products exact, the running sum cut toward zero to TC_ACC_BITS mantissa bits
after each 32 products, promoted (scaled, added in float32) every 128. Every bound that
only a GPU checks is the interpreter's bound plus twice the model's error on the same
operands; these tests hold the model to its definition and the bounds to the model.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from kimi_mlp import kernels
from kimi_mlp.apparatus import gpu_check
from kimi_mlp.fp8 import (fp8_matmul_blockwise, quantize_activation,
                          quantize_weight_blockwise)
from kimi_mlp.fused import ffn_tensors, random_dense_block, tensor_core_shares
from kimi_mlp.rmsnorm import rms_norm


def rel(x, y):
    return ((x.double() - y.double()).norm() / y.double().norm()).item()


def operands(m, n, k, gen, scale=0.05):
    a, a_s = quantize_activation(torch.randn(m, k, generator=gen))
    w, w_s = quantize_weight_blockwise(torch.randn(n, k, generator=gen) * scale)
    return a, a_s, w, w_s


def test_without_the_cut_the_model_is_the_exact_reference(rng):
    """acc_bits=None: the same exact steps, scales and float32 accumulation as chapter
    5's fp8_matmul_blockwise, so the same bits, ragged shapes included."""
    for m, n, k in ((3, 200, 320), (1, 128, 128), (5, 130, 1000)):
        a, a_s, w, w_s = operands(m, n, k, rng)
        assert torch.equal(kernels.tensor_core_matmul(a, a_s, w, w_s, None),
                           fp8_matmul_blockwise(a, a_s, w, w_s))


def test_the_cut_keeps_bits_plus_one_significant_bits_toward_zero(rng):
    x = torch.randn(10_000, generator=rng, dtype=torch.float64) * 1e3
    for bits in (10, 13, 14):
        c = kernels.tensor_cores._cut(x, bits)
        assert (c.abs() <= x.abs()).all() and (torch.sign(c) == torch.sign(x)).all()
        assert ((x - c).abs() < x.abs() * 2.0**-bits).all()
        mant, _ = torch.frexp(c)
        scaled = mant * 2.0 ** (bits + 1)
        assert torch.equal(scaled, torch.trunc(scaled))     # no bit below the kept ones
        assert torch.equal(kernels.tensor_cores._cut(c, bits), c)         # representable: unchanged
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf")], dtype=torch.float64)
    out = kernels.tensor_cores._cut(special, 13)
    assert out[0] == 0 and out[1] == 0 and out[2].isnan() and out[3] == float("inf")


def test_the_model_error_at_the_gemm_shapes(rng):
    """At both K of the block (7168, 18432) the promoted model's relative error is near
    2^-13: the size of the share a GPU bound adds (twice it), and above the 1e-4 that a
    bound on p once allowed on a GPU."""
    for k in (7168, 18432):
        a, a_s, w, w_s = operands(2, 256, k, rng)
        e = kernels.tensor_core_error(a, a_s, w, w_s)
        assert 2.0**-15 < e <= 2.0**-12, (k, e)
    a, a_s, w, w_s = operands(2, 256, 7168, rng)
    _, _, u, u_s = operands(2, 256, 7168, rng)
    p = {b: kernels.tensor_core_mlp(a, a_s, w, w_s, u, u_s, acc_bits=b)["p"]
         for b in (13, None)}
    assert torch.equal(p[None], F.silu(fp8_matmul_blockwise(a, a_s, w, w_s))
                       * fp8_matmul_blockwise(a, a_s, u, u_s))      # the reference's p
    e_p = rel(p[13], p[None])
    assert 1e-4 < e_p < 2.0**-11, e_p


def test_promotion_keeps_the_error_from_growing_with_k(rng):
    """The argument for promoting every 128: with unit scales, one chain over all of K
    (cut after every 32 products) loses far more than a chain restarted every step."""
    a = torch.randn(2, 4096, generator=rng).to(torch.float8_e4m3fn)
    w = (4 * torch.randn(128, 4096, generator=rng)).to(torch.float8_e4m3fn)
    ones_a, ones_w = torch.ones(2, 32), torch.ones(1, 32)
    exact = kernels.tensor_core_matmul(a, ones_a, w, ones_w, None).double()
    promoted = rel(kernels.tensor_core_matmul(a, ones_a, w, ones_w), exact)
    chain = torch.zeros(2, 128, dtype=torch.float64)
    for c in range(0, 4096, 32):
        chain = kernels.tensor_cores._cut(chain + a[:, c:c + 32].double() @ w[:, c:c + 32].double().T,
                             kernels.TC_ACC_BITS)
    assert rel(chain, exact) > 8 * promoted


def test_a_gpu_that_sums_like_the_model_passes_the_gpu_check(monkeypatch):
    """The GPU check with its kernels' results replaced by the model's (13 bits, every
    GEMM): its bounds, each the interpreter's plus the tensor cores' share, admit it."""
    block = random_dense_block(512, 768, seed=3)
    h = torch.randn(5, 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    t = ffn_tensors(block)
    n = kernels.TC_ACC_BITS

    def model_launches(block_, h_, x_fp8, x_scale):
        g = kernels.tensor_core_matmul(x_fp8, x_scale, t.gate, t.gate_scale, n)
        p = kernels.tensor_core_mlp(x_fp8, x_scale, t.gate, t.gate_scale, t.up,
                                    t.up_scale, acc_bits=n)["p"]
        x8, xs = quantize_activation(rms_norm(h_, t.norm_weight, t.eps))
        y = kernels.tensor_core_mlp(x8, xs, t.gate, t.gate_scale, t.up, t.up_scale,
                                    t.down, t.down_scale, n)["y"]
        return g.to(torch.bfloat16), quantize_activation(p), h_ + y.to(torch.bfloat16)

    monkeypatch.setattr(gpu_check, "checked_launches", model_launches)
    r = gpu_check.check_block_once(block, h)
    assert r["ok"], r
    shares = tensor_core_shares(block, h)
    for k, share in gpu_check.TENSOR_CORE_CHECKS.items():
        assert math.isfinite(shares[share]) and shares[share] > 0, k
        assert r["bounds"][k] == pytest.approx(gpu_check.GPUCHECK_BOUNDS[k] + shares[share])
