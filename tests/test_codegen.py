"""Appendix D: the kernels compile for Hopper (sm_90a) without a GPU; what must not
regress.

The compile runs once per pytest run: one test runs `python -m kimi_mlp inspect
--json` (a process of its own with TRITON_INTERPRET=0) and checks its report.
"""
import json
import subprocess
import sys

import pytest

from kimi_mlp import gpus, kernels
from kimi_mlp.apparatus import codegen
from kimi_mlp.apparatus.codegen import (INSPECT_M, SHARED_MEM_LIMIT, format_table,
                              matrix_instructions, matrix_summary, parse_ptxas,
                              ptx_excerpt, shared_buffers)

GEMMS = ("_gate_up_swiglu_quant_kernel", "_fp8_gemm_kernel")

# Real `ptxas -v` output (ptxas 13.4, sm_90a), trimmed to the lines the parser reads and
# one it must skip; two entry functions, the first with spills.
PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_gate_up_swiglu_quant_kernel' for 'sm_90a'
ptxas info    : Function properties for _gate_up_swiglu_quant_kernel
    72 bytes stack frame, 72 bytes spill stores, 68 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 72 bytes cumulative stack size
ptxas info    : Compiling entry function '_fp8_gemm_kernel' for 'sm_90a'
ptxas info    : Function properties for _fp8_gemm_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 196 registers, used 1 barriers, 616 bytes cmem[0]
"""


def test_parse_ptxas_sample():
    assert parse_ptxas(PTXAS_SAMPLE) == {
        "_gate_up_swiglu_quant_kernel": {"registers": 255, "stack": 72,
                                         "spill_stores": 72, "spill_loads": 68},
        "_fp8_gemm_kernel": {"registers": 196, "stack": 0, "spill_stores": 0,
                             "spill_loads": 0}}


def test_parse_ptxas_refuses_other_text():
    with pytest.raises(ValueError, match="Used N registers"):
        parse_ptxas("ptxas fatal   : Unresolved extern function 'f'")
    truncated = PTXAS_SAMPLE.split("ptxas info    : Used 255")[0]
    with pytest.raises(ValueError, match="Used N registers"):
        parse_ptxas(truncated)


MMA_PTX = """\
\tcvt.rn.f16x2.e4m3x2 %r1, %rs1;
\t.loc 1 42 20
\tmov.b32 %r5, %r9;
\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r5,%r6}, {%r1,%r2}, {%r3}, {%r5};
\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r5,%r6}, {%r1,%r2}, {%r3}, {%r5};
\tadd.s32 %r10, %r10, 1;
"""
WGMMA_PTX = """\
\twgmma.fence.sync.aligned;
\twgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%r1}, %rd1, %rd2, p, 1, 1;
\twgmma.commit_group.sync.aligned;
\twgmma.wait_group.sync.aligned 0;
"""


def test_matrix_instructions_mma_sync():
    info = matrix_instructions(MMA_PTX)
    assert info["kind"] == "mma.sync" and info["fp8_to_f16"] == 1 and info["cvt_first"]
    assert [(op["shape"], op["a_type"], op["count"]) for op in info["ops"]] == [
        ("m16n8k16", "f16", 2)]
    assert info["first_line"] == 3 and info["wgmma_waits"] == []
    assert info["conversions"]["cvt.rn.satfinite.e4m3x2.f32"] == 0
    assert matrix_summary(info) == "mma.sync m16n8k16 f16<-e4m3"
    # the line-number and the register-copy lines are left out of the excerpt
    assert ptx_excerpt(MMA_PTX, width=40) == [
        "cvt.rn.f16x2.e4m3x2 %r1, %rs1;",
        "mma.sync.aligned.m16n8k16.row.col.f32.f…",
        "mma.sync.aligned.m16n8k16.row.col.f32.f…", "add.s32 %r10, %r10, 1;"]


def test_matrix_instructions_wgmma_and_none():
    info = matrix_instructions(WGMMA_PTX)
    assert info["kind"] == "wgmma" and info["fp8_to_f16"] == 0
    assert not info["cvt_first"]
    assert [(op["shape"], op["a_type"]) for op in info["ops"]] == [
        ("m64n128k32", "e4m3")]
    assert info["wgmma_waits"] == [0]
    assert matrix_summary(info) == "wgmma m64n128k32 e4m3"
    none = matrix_instructions("\tadd.s32 %r1, %r1, 1;\n")
    assert none["kind"] is None and matrix_summary(none) == "-"
    assert ptx_excerpt("") == []


def test_shared_buffers():
    ttgir = (
        "    %x_63 = ttg.local_alloc : () -> !ttg.memdesc<3x64x128xf8E4M3FN, #shared,"
        " #smem, mutable> loc(#loc127)\n"
        "    %acc = ttg.local_alloc %1 : (tensor<64x128xf32>) -> "
        "!ttg.memdesc<64x128xf32>\n"
        "    %w = ttg.local_alloc : () -> !ttg.memdesc<2x128x64xbf16, #shared1>\n")
    assert shared_buffers(ttgir) == [
        {"name": "x", "shape": "3x64x128", "dtype": "f8", "bytes": 3 * 64 * 128},
        {"name": "w", "shape": "2x128x64", "dtype": "bf16", "bytes": 2 * 128 * 64 * 2}]


@pytest.mark.parametrize("kwargs, match", [
    (dict(ms=()), "ms: expected a non-empty list"),
    (dict(ms=(1, 0)), "ms: expected a positive int, got 0"),
    (dict(ms=(True,)), "ms: expected a positive int, got True"),
    (dict(hidden_size=-1), "hidden_size: expected a positive int, got -1"),
    (dict(sms=2.5), "sms: expected a positive int, got 2.5"),
])
def test_inspect_kernels_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        codegen.inspect_kernels(**kwargs)


def test_command_line_refuses_bad_m(capsys):
    with pytest.raises(SystemExit):
        codegen.main(["--m", "1,x"])
    assert "expected comma-separated ints in [1, " in capsys.readouterr().err


def test_compile_launches_refuses_the_interpreter():
    # This process decorated the kernels for the interpreter (conftest.py, on a CPU), so
    # compiling here would silently compile nothing: it must refuse.
    from kimi_mlp import kernels
    if not kernels.INTERPRETED:
        pytest.skip("the kernels were decorated for compiling in this process")
    with pytest.raises(RuntimeError, match="interpreter"):
        codegen.compile_launches((1,))


def _check_launches(report, record_property):
    """Each M launched rmsnorm_quant, gate/up, the down GEMM: three launches, split or
    not (a split GEMM's last slice of a tile reduces it, FOLD: chapter 8)."""
    assert report["target"] == "sm_90a" and report["ms"] == list(INSPECT_M)
    by_m = {m: {} for m in INSPECT_M}
    for v in report["variants"]:
        assert v["registers"] and 0 < v["registers"] <= 255, v["kernel"]
        for launch in v["launches"]:
            by_m[launch["m"]][launch["index"]] = (v["kernel"], v["constexprs"])
        summary = (f"{matrix_summary(v['matrix'])}, {v['shared']} B shared, "
                   f"{v['registers']} registers, "
                   f"{v['spill_stores']}/{v['spill_loads']} B spilled")
        for launch in v["launches"]:    # instruction class and shared memory, recorded
            record_property(f"{v['kernel']}@M={launch['m']}", summary)
    for m, at in by_m.items():
        launched = [at[i] for i in sorted(at)]
        assert [k for k, _ in launched] == ["_rmsnorm_quant_kernel", *GEMMS], (m, launched)
        assert all(c["SPLIT"] == c["FOLD"] for k, c in launched if k in GEMMS), m
    assert any(c["FOLD"] for at in by_m.values() for k, c in at.values() if k in GEMMS)


def _check_shared_memory(report):
    "Every variant fits the 227 KB a block may use; a GEMM's is its pipeline buffers."
    for v in report["variants"]:
        assert v["shared"] <= SHARED_MEM_LIMIT, (v["kernel"], v["constexprs"])
        if v["kernel"] in GEMMS:
            buffers = sum(b["bytes"] for b in v["smem_buffers"])
            assert buffers == v["shared"], v["kernel"]


def _check_every_gemm_is_wgmma_without_spills(report):
    """The static target: every GEMM variant the block launches at every M of INSPECT_M
    is fp8 wgmma (no conversion to f16), in the plan's grid and tile (the swapped ones
    m64n{BLOCK_M}k32), within the plan's register estimate; no kernel spills; and the
    native epilogues use the hardware's conversions (chapter 7's NATIVE)."""
    from kimi_mlp.kernels import plan_gemm
    seen = set()
    for v in report["variants"]:
        assert v["spill_stores"] == v["spill_loads"] == 0, v["kernel"]
        c, mx = v["constexprs"], v["matrix"]
        cvt = mx["conversions"]
        if v["kernel"] not in GEMMS:
            continue
        assert matrix_summary(mx).startswith("wgmma"), (v["kernel"], c)
        assert {op["a_type"] for op in mx["ops"]} == {"e4m3"} and mx["fp8_to_f16"] == 0
        shapes = {op["shape"] for op in mx["ops"]}
        kind = "gate_up" if v["kernel"].startswith("_gate") else "down"
        n, k = (18432, 7168) if kind == "gate_up" else (7168, 18432)
        for x in v["launches"]:
            plan = plan_gemm(kind, x["m"], n, k, report["sms"])
            assert x["grid"] == [plan["tiles"], plan["split_k"]], (kind, x["m"])
            assert (c["SWAP"], c["BLOCK_M"], c["TMA_A"]) == (
                plan["SWAP"], plan["BLOCK_M"], plan["TMA_A"]) and c["TMA_W"]
            assert v["registers"] <= plan["regs"], (kind, x["m"], v["registers"])
            assert not plan["SWAP"] or shapes == {f"m64n{plan['BLOCK_M']}k32"}, shapes
            seen.add((kind, x["m"]))
        # the epilogue, in every program or (split) in the tile's last slice
        if kind == "gate_up":
            assert cvt["cvt.rn.satfinite.e4m3x2.f32"] > 0
        if kind == "down":
            # fp32 -> bf16 by the hardware; the residual's rounding fused by LLVM into a
            # bf16 add (one rounding of the exact sum of two bf16 values: the same result
            # as the interpreter's fp32 add, then rounding, as appendix D explains)
            assert cvt["cvt.rn.bf16x2.f32"] + cvt["cvt.rn.bf16.f32"] > 0
            assert (cvt["add.bf16x2"] > 0) == c["HAS_RESIDUAL"]
    assert seen == {(kind, m) for kind in ("gate_up", "down") for m in INSPECT_M}


def test_the_fused_block_compiles_for_sm90a(tmp_path, record_property):
    """`python -m kimi_mlp inspect --json FILE` at M in INSPECT_M, the run's one
    compile (one test, so that no second xdist worker waits for it), then each check."""
    path = tmp_path / "codegen.json"
    cmd = [sys.executable, "-m", "kimi_mlp", "inspect", "--json", str(path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(path.read_text())
    _check_launches(report, record_property)
    _check_shared_memory(report)
    _check_every_gemm_is_wgmma_without_spills(report)
    table = format_table(report)                      # the command printed the table
    assert res.stdout.startswith(table + "\n")
    assert len(table.splitlines()) == 2 + len(report["variants"])


def test_every_gpu_check_and_benchmark_variant_compiles_without_spills(record_property):
    """`inspect --workload gpucheck,bench` for Hopper and Ada, both compiled in one
    process (`inspect_matrix`): every launch of appendix C's GPU
    check (the integer variants included where the hardware's conversions are used)
    and of the benchmark's Triton providers, at their own token counts (1 to 8192),
    compiled for Hopper and for Ada. None spills, none needs more shared memory than
    a block may have, every GEMM is on FP8 tensor cores (wgmma on Hopper, mma.sync
    k32 on Ada) without a conversion to f16, and the hardware's e4m3 conversion is used
    exactly where it rounds once (chapter 7's probe, `native_e4m3` in the report)."""
    reports = codegen.inspect_matrix({90: None, 89: None}, None,
                                     workloads=("gpucheck", "bench"))
    for arch, report in zip(("sm_90a", "sm_89"), reports, strict=True):
        _check_gpucheck_and_bench(arch, report, record_property)
    assert not {v["hash"] for v in reports[0]["variants"]} & {
        v["hash"] for v in reports[1]["variants"]}          # each target its own binaries


def _check_gpucheck_and_bench(arch, report, record_property):
    family = gpus.by_target(arch).arch
    assert report["target"] == arch and report["arch"] == family
    assert {x["workload"] for v in report["variants"] for x in v["launches"]} == {
        "gpucheck", "bench"}
    assert set(report["ms"]) == set(codegen.WORKLOADS["gpucheck"][1]) | set(
        codegen.WORKLOADS["bench"][1])
    record_property(f"variants for {arch}", len(report["variants"]))
    native = report["native_e4m3"]
    for v in report["variants"]:
        name = (v["kernel"], v["constexprs"])
        assert v["spill_stores"] == v["spill_loads"] == 0, name
        assert v["shared"] <= gpus.family(family).shared_per_block, name
        # NATIVE launches only where the probe found one rounding, and then they
        # convert with it; the integer roundings leave no e4m3 conversion at all
        cvt = v["matrix"]["conversions"]["cvt.rn.satfinite.e4m3x2.f32"]
        if v["constexprs"].get("NATIVE"):
            assert native, name
        elif "NATIVE" in v["constexprs"]:
            assert cvt == 0, name
        if v["kernel"] in GEMMS:
            mx = v["matrix"]
            assert mx["kind"] == ("wgmma" if family == 90 else "mma.sync"), name
            assert {op["a_type"] for op in mx["ops"]} == {"e4m3"}, name
            assert mx["fp8_to_f16"] == 0, name
            if family == 89:
                assert {op["shape"] for op in mx["ops"]} == {"m16n8k32"}, name
            # chapter 8's `regs` column holds for every launch, not only the block's
            kind = "gate_up" if v["kernel"].startswith("_gate") else "gemm"
            c = v["constexprs"]
            same = [r["regs"] for _, r in kernels.family_tiles(family)[kind]
                    if (r["SWAP"], r["BLOCK_M"], r["num_warps"], r["num_stages"])
                    == (c["SWAP"], c["BLOCK_M"], v["num_warps"], v["num_stages"])]
            assert same and v["registers"] <= max(same), (name, v["registers"], same)
    assert len(format_table(report).splitlines()) == 2 + len(report["variants"])


_DECODE_COMPILE = """
import json, os
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kimi_mlp import kernels
from kimi_mlp.apparatus.codegen import matrix_instructions
out = {}
for arch, bf16 in ((75, False), (80, True), (86, True)):
    t = "*bf16" if bf16 else "*fp16"
    sig = {"c_ptr": "*u8", "out_ptr": t, "n": "i32", "BF16": "constexpr",
           "BLOCK": "constexpr"}
    src = ASTSource(kernels.w8a16._decode_kernel, sig, {"BF16": bf16, "BLOCK": 1024})
    decode = triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["ptx"]
    o = "*i16" if bf16 else "*fp16"
    sig = {"x_ptr": t, "w_ptr": "*u8", "w_s_ptr": "*fp32", "c_ptr": o, "r_ptr": "*i16",
           "M": "i32", "N": "i32", "K": "i32", "splits": "i32"}
    cx = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SUB_K": 32, "GROUP_M": 8,
          "SPLIT": False, "HAS_RESIDUAL": bf16, "BF16": bf16, "OUT_BF16": bf16,
          "UPCAST": False}
    sig.update({key: "constexpr" for key in cx})
    src = ASTSource(kernels.w8a16._w8a16_gemm_kernel, sig, cx)
    gemm = triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["ptx"]
    ops = matrix_instructions(gemm)["ops"]
    out[arch] = {"e4m3": "e4m3" in decode + gemm,
                 "ftz": "mul.ftz" in decode + gemm, "ieee_mul": "mul.f32" in decode,
                 "target": f".target sm_{arch}" in decode + gemm,
                 "mma": sorted({op["opcode"] for op in ops})}
print(json.dumps(out))
"""


def test_the_byte_decode_and_the_w8a16_gemm_compile_for_gpus_without_e4m3():
    """Appendix H's e4m3 decode from bytes and its W8A16 GEMM compile for Turing (fp16)
    and Ampere (bf16), targets where Triton has no e4m3 type; the PTX names none. On
    Ampere the GEMM runs on the tensor cores (bf16 mma.sync); on Turing Triton gives it
    no matrix instruction (FMA units)."""
    res = subprocess.run([sys.executable, "-c", _DECODE_COMPILE], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    bf16_mma = ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"]
    same = {"e4m3": False, "ftz": False, "ieee_mul": True, "target": True}
    assert got == {"75": dict(same, mma=[]), "80": dict(same, mma=bf16_mma),
                   "86": dict(same, mma=bf16_mma)}, got


FAMILY_M = (1, 16, 64, 4096)
#: The matrix instruction each family's GEMMs must compile to (`matrix_summary`):
#: Turing's W8A16 GEMMs get none (Triton computes tl.dot on the FMA units there).
FAMILY_MATRIX = {75: "-", 80: "mma.sync m16n8k16 bf16", 86: "mma.sync m16n8k16 bf16",
                 89: "mma.sync m16n8k32 e4m3", 120: "mma.sync m16n8k32 e4m3",
                 100: "tcgen05 f8f6f4"}
FAMILY_GEMMS = {"gate_up": ("_gate_up_swiglu_quant_kernel", "_w8a16_gate_up_kernel"),
                "gemm": ("_fp8_gemm_kernel", "_w8a16_gemm_kernel")}


def test_every_gpu_family_compiles_the_block_without_spills(record_property):
    """`inspect --m 1,16,64,4096` for each family besides Hopper (the test above), all
    six compiled in one process (`inspect_matrix`): the W8A16 launches on Turing and
    Ampere, FP8 mma.sync on Ada and RTX 50xx, tcgen05 on B200. No variant spills or
    needs more shared memory than a block may have there; every GEMM variant has the
    family's matrix instruction and at most the registers of its row of chapter 8's
    tile table (`regs`)."""
    archs = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_100", "sm_120")
    reports = codegen.inspect_matrix({gpus.by_target(a).arch: None for a in archs},
                                     FAMILY_M)
    for arch, report in zip(archs, reports, strict=True):
        _check_family(arch, report, record_property)
    # each target compiled its own binaries (Triton's hash covers the target): none was
    # found again in the cache of the target before it
    hashes = [{v["hash"] for v in r["variants"]} for r in reports]
    assert sum(map(len, hashes)) == len(set().union(*hashes))


def _check_family(arch, report, record_property):
    family = gpus.by_target(arch).arch
    assert report["target"] == codegen.target_name(family) and report["arch"] == family
    assert report["ms"] == list(FAMILY_M)
    assert (report["native_e4m3"] is None) == (not gpus.family(family).e4m3)
    seen = set()
    for v in report["variants"]:
        name = (v["kernel"], v["constexprs"], v["num_warps"], v["num_stages"])
        assert v["spill_stores"] == v["spill_loads"] == 0, name
        assert v["shared"] <= gpus.family(family).shared_per_block, name
        kind = next((k for k, ks in FAMILY_GEMMS.items() if v["kernel"] in ks), None)
        if kind is None:
            assert v["matrix"]["kind"] is None, name
            continue
        assert matrix_summary(v["matrix"]) == FAMILY_MATRIX[family], name
        n, k = (18432, 7168) if kind == "gate_up" else (7168, 18432)
        for x in v["launches"]:
            row = kernels.plan._tile_row(kind, x["m"], n, k, None, family)
            assert (v["constexprs"]["BLOCK_M"], v["num_warps"]) == (
                row["BLOCK_M"], row["num_warps"]), (name, x["m"])
            assert v["registers"] <= row["regs"], (name, x["m"], v["registers"])
            seen.add((kind, x["m"]))
        record_property(f"{arch} {v['kernel']}", f"{matrix_summary(v['matrix'])}, "
                        f"{v['registers']} registers, {v['shared']} B shared")
    assert seen == {(kind, m) for kind in FAMILY_GEMMS for m in FAMILY_M}
