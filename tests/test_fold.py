"""Split-K's reduction folded into its GEMM (chapter 8): the last slice of a tile to arrive
sums the tile's partials and runs the epilogue, so a split GEMM is one launch.

Under Triton's interpreter the programs run one after another, and the folded sum adds the
same float32 partials in the same slice order as the reduction kernels (the reference path,
`force_reduce=True`): the results must be the same bits. Output buffers are poisoned with NaN
(0x7F for e4m3) so an element nobody writes fails `torch.equal`. The arrival counters must be
zero after every launch, so the next launch (the cached scratch of chapter 10, a CUDA graph's
replay) finds them ready: a second launch on the same counters gives the same bits.
"""
import json
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from kimi_mlp import kernels as K  # first: sets TRITON_INTERPRET=1 when there is no CUDA device
from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block
from test_kernels import (bits, blockwise_operands, gate_up_operands, gen,
                          interpreted, nan_like, poisoned_quant_outputs)


def _gemm(a, a_s, w, w_s, residual, out_dtype, plan, **kw):
    out = nan_like((a.shape[0], w.shape[0]), out_dtype)
    K._launch_gemm(a, a_s, w, w_s, out, residual, plan, **kw)
    return out


# (m, n, k, split): swapped 16- and 64-token tiles, an unswapped 64-token tile (m 70),
# N and K not multiples of 128 (masked loads), 2 and 3 slices
GEMM_CASES = [(1, 200, 640, 2), (3, 330, 384, 3), (33, 256, 520, 2), (70, 200, 384, 3)]


@interpreted
# each case with both epilogues: bf16 with the residual (the down GEMM), fp32 without
@pytest.mark.parametrize("with_residual, out_dtype", [(True, torch.bfloat16),
                                                      (False, torch.float32)])
@pytest.mark.parametrize("m, n, k, split", GEMM_CASES)
def test_folded_gemm_is_the_reduction_bit_for_bit(m, n, k, split, with_residual,
                                                  out_dtype):
    g = gen("fold-gemm", m, n, k, split)
    a, a_s, w, w_s = blockwise_operands(g, m, n, k)
    residual = torch.randn(m, n, generator=g).to(out_dtype) if with_residual else None
    plan = K._with_meta(K.plan_gemm("gemm", m, n, k, 1, split_k=split))
    assert plan["split_k"] == split and plan["tiles"] > 1
    ref = _gemm(a, a_s, w, w_s, residual, out_dtype, plan, force_reduce=True)
    counters = torch.zeros(plan["tiles"], dtype=torch.int32)
    ws = torch.full((split, m, n), float("nan"))
    folded = _gemm(a, a_s, w, w_s, residual, out_dtype, plan, ws=ws, counters=counters)
    assert not ref.isnan().any() and torch.equal(folded, ref)
    assert torch.equal(counters, torch.zeros_like(counters))        # ready again
    again = _gemm(a, a_s, w, w_s, residual, out_dtype, plan, ws=ws, counters=counters)
    assert torch.equal(again, ref) and not counters.any()


@interpreted
def test_folded_gemm_allocates_its_counters_and_the_wrappers_fold():
    "Without counters the launcher makes its own; fp8_gemm and fp8_down_residual fold."
    m, n, k = 2, 256, 512
    a, a_s, w, w_s = blockwise_operands(gen("fold-wrap", m, n, k), m, n, k)
    plan = K._with_meta(K.plan_gemm("gemm", m, n, k, 1, split_k=4))
    ref = _gemm(a, a_s, w, w_s, None, torch.bfloat16, plan, force_reduce=True)
    assert torch.equal(_gemm(a, a_s, w, w_s, None, torch.bfloat16, plan), ref)
    assert torch.equal(K.fp8_gemm(a, a_s, w, w_s, split_k=4), ref)
    residual = torch.randn(m, n, generator=gen("fold-res")).to(torch.bfloat16)
    ref_r = _gemm(a, a_s, w, w_s, residual, torch.bfloat16, plan, force_reduce=True)
    assert torch.equal(K.fp8_down_residual(a, a_s, w, w_s, residual, split_k=4), ref_r)


def _gate_up(ops, plan, write_p, **kw):
    x, x_s, gw, gs, uw, us = ops
    m, f = x.shape[0], gw.shape[0]
    q, s = poisoned_quant_outputs(m, f)
    p = nan_like((m, f), torch.float32) if write_p else None
    K._launch_gate_up(x, x_s, gw, gs, uw, us, q.view(torch.uint8), s, p, plan, **kw)
    return q, s, p


# (m, d, f, split): swapped 16- and 64-token tiles, an unswapped one (m 70); F ragged
# (m, d, f, split, write_p): p itself written in two of the four
GATE_UP_CASES = [(1, 256, 330, 2, True), (5, 384, 200, 3, False), (33, 320, 330, 2, False),
                 (70, 384, 200, 3, True)]


@interpreted
@pytest.mark.parametrize("m, d, f, split, write_p", GATE_UP_CASES)
def test_folded_gate_up_is_the_reduction_bit_for_bit(m, d, f, split, write_p):
    ops = gate_up_operands(m, d, f)
    plan = K._with_meta(K.plan_gemm("gate_up", m, f, d, 1, split_k=split))
    assert plan["split_k"] == split and plan["SWAP"] == (m <= 64)
    ref = _gate_up(ops, plan, write_p, force_reduce=True)
    counters = torch.zeros(plan["tiles"], dtype=torch.int32)
    ws = torch.full((split, 2, m, f), float("nan"))
    for _ in range(2):                       # the second launch reuses the counters
        got = _gate_up(ops, plan, write_p, ws=ws, counters=counters)
        assert torch.equal(bits(got[0]), bits(ref[0])) and torch.equal(got[1], ref[1])
        assert not write_p or (torch.equal(got[2], ref[2]) and not ref[2].isnan().any())
        assert not counters.any()
    assert ((bits(ref[0]) & 0x7F) != 0x7F).all() and not ref[1].isnan().any()


@interpreted
def test_force_reduce_with_one_slice_is_still_the_fused_epilogue():
    "The bitwise check of the split path with one slice keeps working beside the fold."
    ops = gate_up_operands(3, 256, 200)
    plan = K._with_meta(K.plan_gemm("gate_up", 3, 200, 256, 1, split_k=1))
    fused = _gate_up(ops, plan, True)
    reduced = _gate_up(ops, plan, True, force_reduce=True)
    assert torch.equal(bits(fused[0]), bits(reduced[0]))
    assert torch.equal(fused[1], reduced[1]) and torch.equal(fused[2], reduced[2])


def _counting(log):
    "Chapter 7's `launch_with`, appending (kernel name, grid) to `log` before it runs."
    real = K.launch_with

    def launch_with(kernel, grid, args, kwargs):
        log.append((kernel.__name__, tuple(grid)))
        return real(kernel, grid, args, kwargs)
    return launch_with


@interpreted
# M <= 16 is the target; every M of appendix D's table, 32 included, is held to three
# launches by test_codegen's compile-only runs
@pytest.mark.parametrize("m", [1, 16])
def test_the_split_fused_block_makes_three_launches(m, monkeypatch, patch_everywhere):
    """The FP8 block at decode with both GEMMs split (forced: the interpreter's one SM
    never splits) launches rmsnorm_quant, gate/up, down: three kernels, no reduction and
    no fill (the counters live in the cached scratch), and its output is the same bits
    with the reductions as separate launches."""
    log = []
    patch_everywhere(K, "launch_with", _counting(log))   # every kernel starts through it
    real_plan = K._plan_for
    patch_everywhere(K, "_plan_for", lambda kind, m, n, k, device, *a, **kw:
                        real_plan(kind, m, n, k, device, 3))
    base = random_dense_block(384, 330, seed=1)
    block = FusedFp8DenseMLP(base)
    h = torch.randn(m, 384, generator=gen("fold-block", m)).to(torch.bfloat16)
    with torch.no_grad():
        out = block(h)
        log.clear()
        with mock.patch.object(torch, "zeros", wraps=torch.zeros) as zeros:
            again = block(h)                              # the cached scratch
    assert zeros.call_count == 0                          # no counters zeroed again
    names = [n for n, _ in log]
    assert names == ["_rmsnorm_quant_kernel", "_gate_up_swiglu_quant_kernel",
                     "_fp8_gemm_kernel"], log
    assert log[1][1][1] == 3 and log[2][1][1] == 3        # both split in 3
    assert torch.equal(out, again)
    plans, scratch = block._per_m[m]
    assert all(not c.any() for c in scratch[7::2])        # both counters zero again
    real_gate_up, real_gemm = K._launch_gate_up, K._launch_gemm
    patch_everywhere(K, "_launch_gate_up", lambda *a, **kw: real_gate_up(
        *a, **dict(kw, force_reduce=True)))
    patch_everywhere(K, "_launch_gemm", lambda *a, **kw: real_gemm(
        *a[:7], force_reduce=True))
    log.clear()
    with torch.no_grad():
        reduced = FusedFp8DenseMLP(base)(h)
    assert len(log) == 5 and torch.equal(reduced, out)


_FOLD_PTX = """
import json, sys
from kimi_mlp.apparatus import codegen
codegen.ptx_excerpt = lambda ptx, *a, **k: ptx            # keep the whole PTX
out = {v["kernel"]: [v["excerpt"], v["spill_stores"] + v["spill_loads"]]
       for v in codegen.compile_launches((1,)) if v["constexprs"].get("FOLD")}
json.dump(out, sys.stdout)
"""


def _ordered(ptx):
    """The lines of the fold's handshake in the PTX: the partial's last global store, the
    barriers, the atomic, the loads of the partials."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    atom = [i for i, ln in enumerate(lines) if "atom.global.gpu.acq_rel.add" in ln]
    assert len(atom) == 1, atom
    a = atom[0]
    stores = [i for i, ln in enumerate(lines[:a]) if "st.global.v4" in ln]
    bars = [i for i, ln in enumerate(lines) if ln.startswith("bar.sync")]
    loads = [i for i, ln in enumerate(lines) if "ld.global.cg" in ln]
    return stores, bars, a, loads


def test_the_folded_kernels_order_their_memory_for_sm90a():
    """Compiled for sm_90a without a GPU (appendix D's compile-only launches at M = 1,
    where both GEMMs split): every thread's partial is stored, then bar.sync, then one
    atom...acq_rel.gpu; its result reaches the threads through shared memory behind a
    bar.sync, and only then the partials are loaded, ld.global.cg (L1 bypassed).
    Neither folded kernel spills."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, "-c", _FOLD_PTX], env=env, capture_output=True,
                         text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout)
    assert set(out) == {"_fp8_gemm_kernel", "_gate_up_swiglu_quant_kernel"}
    for name, (ptx, spilled) in out.items():
        stores, bars, atom, loads = _ordered(ptx)
        assert spilled == 0, name
        assert stores and any(stores[-1] < b < atom for b in bars), name
        assert loads and all(atom < i for i in loads), name
        assert any(atom < b < loads[0] for b in bars), name
