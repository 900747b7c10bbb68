"""Appendix F's Gluon GEMMs: what the compiler makes of them for sm_90a (no GPU needed),
the refusals where they cannot run, the GPU check's Gluon row on a CPU stand-in, and what
appendix D's model does with a kernel that keeps a wgmma group in flight.

Gluon kernels do not run under Triton's interpreter, so no test here runs one; their
numbers are judged by `python -m kimi_mlp gpucheck --path gluon` on a Hopper GPU."""
import os
from pathlib import Path

import pytest
import torch

from kimi_mlp.apparatus import codegen
from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block
from kimi_mlp.kernels.gluon import (GLUON_MIN_M, GluonFp8DenseMLP, gluon_fp8_gemm,
                            gluon_gate_up_swiglu_quant)
from kimi_mlp.apparatus.gluon_codegen import inspect_gluon, loop_waits
from kimi_mlp.apparatus.gpu_check import check_gluon_once, gpucheck_main

FP8 = torch.float8_e4m3fn


def _assert_in_flight(report):
    """The static targets: every K loop keeps a wgmma group in flight (its waits leave
    at least one group), nothing spills, ptxas gives no advice (C7514, serialized
    wgmma), the shared memory fits an H200's block."""
    assert {v["kernel"] for v in report["variants"]} == {
        "_gluon_fp8_gemm_kernel", "_gluon_gate_up_kernel"}
    for v in report["variants"]:
        assert v["loop_waits"] and min(v["loop_waits"]) >= 1, v["kernel"]
        assert v["spill_stores"] == v["spill_loads"] == 0, v["kernel"]
        assert v["ptxas_advice"] == [], v["ptxas_advice"]
        assert v["matrix"]["kind"] == "wgmma" and v["matrix"]["fp8_to_f16"] == 0
        assert v["shared"] <= codegen.SHARED_MEM_LIMIT
        assert v["barrier_before_refill"], v["kernel"]   # both warp groups waited
    waits = {v["kernel"]: min(v["loop_waits"]) for v in report["variants"]}
    assert waits == {"_gluon_fp8_gemm_kernel": 1, "_gluon_gate_up_kernel": 2}


def test_the_gluon_gemms_keep_a_wgmma_group_in_flight_for_sm_90a():
    _assert_in_flight(inspect_gluon((1024,)))


@pytest.mark.skipif(not os.environ.get("KIMI_TRITON36"),
                    reason="KIMI_TRITON36 names no directory holding triton 3.6 "
                           "(pip install --target DIR --no-deps triton==3.6.0)")
def test_the_gluon_gemms_compile_with_triton_3_6_too():
    report = inspect_gluon((1024,), pythonpath=os.environ["KIMI_TRITON36"])
    assert report["triton"].startswith("3.6")
    _assert_in_flight(report)


def test_a_refill_without_a_barrier_after_the_wait_is_caught():
    from kimi_mlp.apparatus.gluon_codegen import barrier_before_refill
    body = ["$L__BB0_2:", "wgmma.wait_group.sync.aligned 1;", "{BARRIER}",
            "@%p1 cp.async.bulk.tensor.2d.shared::cluster.global [%r1], [%rd1, {%r2}];",
            "@%p2 bra $L__BB0_2;"]
    ptx = "\n".join(body)
    assert barrier_before_refill(ptx.replace("{BARRIER}", "bar.sync 0;"))
    assert not barrier_before_refill(ptx.replace("{BARRIER}", "mov.u32 %r3, %r4;"))


def test_loop_waits_reads_only_the_waits_inside_a_loop():
    ptx = "\n".join([
        "wgmma.wait_group.sync.aligned 0;",            # before the loop
        "$L__BB0_2:",
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {...};",
        "wgmma.wait_group.sync.aligned 1;",
        "@%p1 bra $L__BB0_2;",
        "$L__BB0_3:",
        "wgmma.wait_group.sync.aligned 0;",             # the tail, not a loop
        "ret;"])
    assert loop_waits(ptx) == [1]


def test_the_gluon_launches_refuse_what_cannot_run_them():
    block = random_dense_block(256, 512, seed=0)
    with pytest.raises(RuntimeError, match="need a Hopper GPU .* interpreter cannot"):
        GluonFp8DenseMLP(block)
    a, a_s = torch.zeros(4, 256, dtype=FP8), torch.ones(4, 2)
    w, w_s = torch.zeros(128, 256, dtype=FP8), torch.ones(1, 2)
    with pytest.raises(RuntimeError, match="got the CPU|got cpu|Hopper"):
        gluon_fp8_gemm(a, a_s, w, w_s)
    odd = torch.zeros(4, 200, dtype=FP8)          # K = 200: rows of 200 bytes
    with pytest.raises(ValueError, match="a_fp8, w_fp8: .* multiple of 16 .* K = 200"):
        gluon_fp8_gemm(odd, torch.ones(4, 2), torch.zeros(128, 200, dtype=FP8), w_s,
                       warmup=True)
    with pytest.raises(ValueError, match=r"block_m: expected one of \(64, 128\), got 32"):
        gluon_fp8_gemm(a, a_s, w, w_s, block_m=32, warmup=True)
    with pytest.raises(ValueError, match="up_w"):
        gluon_gate_up_swiglu_quant(a, a_s, w, w_s, torch.zeros(64, 256, dtype=FP8), w_s,
                                   warmup=True)


def test_gpucheck_refuses_the_gluon_path_without_a_hopper_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for argv in (["--path", "gluon"], ["--path", "gluon", "--cpu-smoke"]):
        assert gpucheck_main(argv) == 3
        err = capsys.readouterr().err
        assert "--path gluon: appendix F's Gluon kernels need a Hopper GPU" in err
        assert "no --cpu-smoke" in err


def test_the_gluon_row_holds_a_module_to_the_triton_bound():
    """check_gluon_once on the CPU, with the Triton module standing in for the Gluon one
    (which the interpreter cannot run): the same output passes with the same error as
    the Triton launches; a module of other weights fails."""
    block, other = random_dense_block(256, 640, seed=1), random_dense_block(256, 640, seed=2)
    h = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    good = check_gluon_once(block, h, FusedFp8DenseMLP(block))
    assert good["ok"] and good["path"] == "gluon"
    assert good["block_vs_w8a8"] == good["triton_vs_w8a8"]      # the same launches
    assert set(good["bounds"]) == {"block_vs_w8a8", "deepgemm_vs_w8a16"}
    bad = check_gluon_once(block, h, FusedFp8DenseMLP(other))
    assert not bad["ok"] and bad["block_vs_w8a8"] > 10 * bad["bounds"]["block_vs_w8a8"]


def _variant(waits, loop=None, bm=128, shared=128 * 1024, regs=200):
    v = {"kernel": "_fp8_gemm_kernel", "num_warps": 8, "shared": shared,
         "registers": regs, "constexprs": {"BLOCK_M": bm, "BLOCK_N": 128},
         "matrix": {"wgmma_waits": waits}}
    return v if loop is None else dict(v, loop_waits=loop)


def test_the_model_charges_the_drain_only_where_the_loop_waits_for_everything():
    hw = codegen.H200_MODEL
    serial = codegen.step_cycles(_variant([0]), hw)
    flight = codegen.step_cycles(_variant([0, 1], loop=[1, 1]), hw)
    assert serial["serial"] and not flight["serial"]
    # 128 x 128 x 128 fp8 at the SM's share of 1.576 PFLOP/s and 1.83 GHz
    mma = 2 * 128 ** 3 / (hw["fp8"] / hw["sms"] / hw["clock"])
    assert serial["mma"] == pytest.approx(mma) and serial["promote"] == 256
    assert serial["step"] == pytest.approx(mma + hw["drain"] + 256)
    assert flight["step"] == pytest.approx(max(mma, 256))


def test_a_replacement_is_modelled_with_its_own_tiles_and_no_split():
    """model_block with `replace`: the Triton launch's grid (here split 2) gives way to
    the replacement's tiles, one slice each, and its time is its own."""
    d, f, m = 7168, 18432, 1024
    tri = dict(_variant([0], bm=128), launches=[
        {"workload": "block", "m": m, "index": 0, "grid": [448, 2]}])
    report = {"hidden_size": d, "intermediate_size": f, "ms": [m], "variants": [tri]}
    glu = dict(_variant([0, 1], loop=[1], bm=64), kernel="_gluon_fp8_gemm_kernel",
               stands_for="_fp8_gemm_kernel")
    before = codegen.model_block(report, m)["launches"][0]
    after = codegen.model_block(report, m, replace={"_fp8_gemm_kernel": glu})
    (row,) = after["launches"]
    assert before["split"] == 2 and row["split"] == 1
    assert row["kernel"] == "_gluon_fp8_gemm_kernel"
    assert row["steps"] == 144 and row["waves"] == -(-(16 * 56) // 132)
    assert GLUON_MIN_M == 257


def test_the_stored_model_has_the_three_entries_chapter_9_prints():
    import json
    root = Path(__file__).resolve().parent.parent
    model = json.loads((root / "book" / "data" / "h200_model.json").read_text())
    assert model["schema"] == codegen.MODEL_SCHEMA and model["machine"] == codegen.H200_MODEL
    assert set(model["entries"]) == {"before", "triton", "gluon"}
    for e in model["entries"].values():
        assert [r["m"] for r in e["rows"]] == list(codegen.MODEL_M)


@pytest.mark.parametrize("gate_up", [False, True])
def test_the_gluon_module_wires_the_block_as_the_triton_one(monkeypatch, gate_up):
    """GluonFp8DenseMLP's launches on the CPU, its Gluon kernels replaced by chapter 9's
    kernels of the same contract (the interpreter cannot run Gluon), GLUON_MIN_M set
    to 4 to keep the shapes small: from GLUON_MIN_M tokens on, the module's scratch, plans and operands reach them in the right places,
    so the output is the Triton module's, bit for bit; below, it is the Triton path."""
    from kimi_mlp import kernels
    from kimi_mlp.kernels import gluon
    monkeypatch.setattr(gluon, "check_gluon_device", lambda device: None)
    monkeypatch.setattr(gluon, "gluon_fp8_gemm", lambda p, ps, w, ws, r:
                        kernels.fp8_down_residual(p, ps, w, ws, r))
    monkeypatch.setattr(gluon, "gluon_gate_up_swiglu_quant",
                        lambda x, xs, g, gs, u, us, out, scale_out:
                        kernels.fp8_gate_up_swiglu_quant(x, xs, g, gs, u, us, out=out,
                                                         scale_out=scale_out))
    monkeypatch.setattr(gluon, "GLUON_MIN_M", 4)      # small shapes: quick to interpret
    block = random_dense_block(256, 384, seed=3)
    gen = torch.Generator().manual_seed(4)
    fused = gluon.GluonFp8DenseMLP(block, gate_up=gate_up)
    assert fused.gate_up is gate_up and fused.path == "gluon"
    for m in (3, 5):
        h = torch.randn(m, 256, generator=gen).to(torch.bfloat16)
        assert torch.equal(fused(h), FusedFp8DenseMLP(block)(h)), m


def test_the_gluon_launchers_refuse_a_ring_that_cannot_fill():
    a, a_s = torch.zeros(4, 256, dtype=FP8), torch.ones(4, 2)
    w, w_s = torch.zeros(128, 256, dtype=FP8), torch.ones(1, 2)
    with pytest.raises(ValueError, match="num_stages: expected an int of at least 2, got 1"):
        gluon_fp8_gemm(a, a_s, w, w_s, num_stages=1, warmup=True)
    with pytest.raises(ValueError, match=r"block_m: expected one of \(64,\), got 128"):
        gluon_gate_up_swiglu_quant(a, a_s, w, w_s, w, w_s, block_m=128, warmup=True)
