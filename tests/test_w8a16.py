"""The W8A16 block of appendix H: the launches GPUs without an e4m3 type run, here
through Triton's interpreter (on a GPU, compiled). Bounds are the appendix's: the
reference `mode="w8a16"` rounds the three dequantized weights too, so every later
rounding lands on other values: W8A16_BOUND; chapter 6's float64 oracle holds both
within 2^-6."""
import math
import warnings

import pytest
import torch

from kimi_mlp import kernels as K  # first: sets TRITON_INTERPRET=1 when there is no CUDA
from kimi_mlp.checkpoint import dense_block_float64  # noqa: E402
from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block  # noqa: E402
from kimi_mlp.rmsnorm import rms_norm  # noqa: E402

D, F = 320, 704          # a partial last group on both sides


def rel_err(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def block():
    return random_dense_block(D, F, seed=3)


def _reference(block, h):
    "The block's reference forward in mode w8a16 (bf16 throughout)."
    norm = block.post_attention_layernorm
    return h + block.mlp(rms_norm(h, norm.weight, norm.eps), mode="w8a16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 7])
def test_the_w8a16_block_is_within_its_bounds(block, m, dtype):
    bound = K.W8A16_BOUND
    torch.manual_seed(m)
    h = torch.randn(m, D).to(torch.bfloat16)
    fused = FusedFp8DenseMLP(block, mode="w8a16", act_dtype=dtype)
    out = fused(h)
    assert out.dtype == torch.bfloat16 and out.shape == h.shape
    assert rel_err(out, _reference(block, h)) <= bound
    assert rel_err(out, dense_block_float64(block, h)) <= 2.0**-6
    # split-K changes only the order of the float32 sums: the same bounds
    x = K.rmsnorm_act(h, block.post_attention_layernorm.weight, 1e-6, dtype)
    mlp = block.mlp
    p = K.w8a16_gate_up_swiglu(x, mlp.gate_proj.weight, mlp.gate_proj.weight_scale_inv,
                               mlp.up_proj.weight, mlp.up_proj.weight_scale_inv,
                               split_k=3)
    split = K.w8a16_gemm(p, mlp.down_proj.weight, mlp.down_proj.weight_scale_inv,
                         residual=h, split_k=2)
    assert rel_err(split, _reference(block, h)) <= bound


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_act_is_rms_norm_bit_for_bit(dtype):
    torch.manual_seed(0)
    h = torch.randn(5, D).to(torch.bfloat16) * 3
    gain = (torch.rand(D) + 0.5).to(torch.bfloat16)
    assert torch.equal(K.rmsnorm_act(h, gain, 1e-6, dtype),
                       rms_norm(h, gain, 1e-6).to(dtype))


def test_nan_in_a_code_a_scale_or_h_propagates_and_zero_blocks_stay_finite():
    blk = random_dense_block(256, 256, seed=1)
    h = torch.randn(3, 256).to(torch.bfloat16)
    mlp = blk.mlp
    with torch.no_grad():
        mlp.down_proj.weight_scale_inv[1, 0] = 0.0           # a zero block: zeros
    fused = FusedFp8DenseMLP(blk, mode="w8a16")
    assert fused(h).isfinite().all()
    h_nan = h.clone()
    h_nan[1, 7] = float("nan")
    out = fused(h_nan)
    assert out[1].isnan().all() and out[[0, 2]].isfinite().all()
    for poison in ("code", "scale"):
        b2 = random_dense_block(256, 256, seed=1)
        with torch.no_grad():
            if poison == "code":
                b2.mlp.gate_proj.weight.view(torch.uint8)[5, 9] = 0x7F
            else:
                b2.mlp.up_proj.weight_scale_inv[0, 1] = float("nan")
        assert FusedFp8DenseMLP(b2, mode="w8a16")(h).isnan().all(), poison


def test_fp16_overflow_is_inf_or_nan_never_a_clip():
    """Wherever silu(g) u, computed exactly from the kernel's own fp16 g and u, reaches
    65520 (or g or u already overflowed), p is inf or NaN; below 65000 it is finite."""
    blk = random_dense_block(256, 256, seed=2)
    mlp = blk.mlp
    x = torch.full((2, 256), 6.0e4, dtype=torch.float16)
    x[1] = 3.0e2                                     # a row that stays in range
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = K.w8a16_gate_up_swiglu(x, mlp.gate_proj.weight, mlp.gate_proj.weight_scale_inv,
                                   mlp.up_proj.weight, mlp.up_proj.weight_scale_inv)
        g, u = (K.w8a16_gemm(x, lin.weight, lin.weight_scale_inv)
                for lin in (mlp.gate_proj, mlp.up_proj))
        exact = torch.nn.functional.silu(g.double()) * u.double()
    over = ~(exact.abs() < 65520.0)
    assert over.any() and (~p[over].isfinite()).all()
    assert p[exact.abs() < 65000].isfinite().all() and (exact.abs() < 65000).any()
    bounds = K.fp16_bounds(blk.post_attention_layernorm.weight, mlp.gate_proj.weight,
                           mlp.gate_proj.weight_scale_inv, mlp.up_proj.weight,
                           mlp.up_proj.weight_scale_inv, rows=128)
    gain_max = blk.post_attention_layernorm.weight.abs().max().double().item()
    # sqrt(d) max|gain| stretched by the kernel's roundings (at most 3 bf16/fp16 ones)
    assert math.sqrt(256) * gain_max * (1 - 2.0**-8) <= bounds["x"] \
        <= math.sqrt(256) * gain_max * (1 + 2.0**-8) ** 2 * (1 + 2.0**-11) * 1.001
    assert bounds["p"] == pytest.approx(bounds["g"] * bounds["u"], rel=2.0**-9)
    # the bound holds: the largest |g| over random inputs stays below it
    h = torch.randn(64, 256).to(torch.bfloat16) * 10
    xx = K.rmsnorm_act(h, blk.post_attention_layernorm.weight, 1e-6, torch.float16)
    g = K.w8a16_gemm(xx, mlp.gate_proj.weight, mlp.gate_proj.weight_scale_inv)
    assert g.abs().max().item() <= bounds["g"] and xx.abs().max().item() <= bounds["x"]


def test_w8a16_wrappers_refuse_bad_input(block):
    mlp = block.mlp
    x = torch.zeros(2, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dtype: expected torch.bfloat16 or torch.float16"):
        K.rmsnorm_act(x, block.post_attention_layernorm.weight, 1e-6, torch.float32)
    with pytest.raises(ValueError, match=rf"up_w: expected \[{F}, {D}\] \(K of x\), "
                       r"got shape \[5, 320\]"):
        K.w8a16_gate_up_swiglu(x, mlp.gate_proj.weight, mlp.gate_proj.weight_scale_inv,
                               torch.zeros(5, D, dtype=torch.uint8),
                               torch.ones(1, 3))
    with pytest.raises(ValueError, match="residual: expected dtype torch.bfloat16"):
        K.w8a16_gemm(x, mlp.up_proj.weight, mlp.up_proj.weight_scale_inv,
                     residual=torch.zeros(2, F))
    with pytest.raises(ValueError, match="out: overlaps x in memory"):
        K.w8a16_gemm(x, torch.zeros(D, D, dtype=torch.uint8), torch.ones(3, 3), out=x)
    with pytest.raises(ValueError, match="mode: expected None, 'w8a8' or 'w8a16'"):
        FusedFp8DenseMLP(block, mode="fp8")
    with pytest.raises(ValueError, match="act_dtype: expected None with mode 'w8a8'"):
        FusedFp8DenseMLP(block, mode="w8a8", act_dtype=torch.float16)
    assert FusedFp8DenseMLP(block, act_dtype=torch.float16).mode == "w8a16"
    with pytest.raises(ValueError, match=rf"up: expected \[{F}, {D}\] \(K of x\)"):
        K.fp16_bounds(block.post_attention_layernorm.weight, mlp.gate_proj.weight,
                      mlp.gate_proj.weight_scale_inv, mlp.up_proj.weight.T.contiguous(),
                      mlp.up_proj.weight_scale_inv)


def test_the_benchmark_runs_the_w8a16_path():
    """Appendix E's sweep with path "w8a16" (the smoke run: interpreter, no timings):
    the fused module and the unfused W8A16 pipeline are held to appendix H's bound on
    the output against w8a16, the record says which launches ran, and the launches
    timed one by one are the W8A16 ones."""
    from kimi_mlp.apparatus import harness
    r = harness.bench(ms=(3,), cpu_smoke=True, path="w8a16", log=lambda *a: None)
    assert r["settings"]["path"] == "w8a16"
    assert (r["providers"]["fused"]["path"], r["providers"]["fused"]["w8a16"]) == \
        ("w8a16", "bf16")
    rows = {row["provider"]: row for row in r["results"]}
    for name in ("fused", "unfused_w8a16"):
        assert rows[name]["ok"] and rows[name]["rel_bound"] == K.W8A16_BOUND
        assert rows[name]["rel_err_out"] <= K.W8A16_BOUND
    assert [x["launch"] for x in r["launches"]] == [
        "rmsnorm_act", "w8a16_gate_up_swiglu", "w8a16_down_residual"]
    assert r["kernel_choices"]["3"]["gate_up"]["arch"] == 80
    with pytest.raises(ValueError, match="path: expected 'auto', 'w8a8' or 'w8a16'"):
        harness.bench(ms=(1,), cpu_smoke=True, path="fp8", log=lambda *a: None)


def test_the_providers_on_a_gpu_without_e4m3(block, monkeypatch, patch_everywhere):
    """What `make_providers` gives on an Ampere GPU (its family stubbed, the block on the
    CPU): the fused module on the W8A16 path in bf16, the unfused W8A16 pipeline, and the
    two FP8 pipelines unavailable with the reason, without a function to call."""
    from kimi_mlp.apparatus import harness
    patch_everywhere(K, "device_arch", lambda device: 80)
    provs = harness.make_providers(block, ("fused", "unfused_w8a16", "unfused_w8a8",
                                           "scaled_mm"))
    assert (provs["fused"]["path"], provs["fused"]["w8a16"]) == ("w8a16", "bf16")
    assert provs["fused"]["fn"].mode == "w8a16" and provs["unfused_w8a16"]["available"]
    for name in ("unfused_w8a8", "scaled_mm"):
        assert not provs[name]["available"] and "fn" not in provs[name]
        assert provs[name]["reason"] == "no e4m3 type on this GPU"
