"""Check `python -m kimi_mlp inspect` against an independent compile of its kernels.

    python -m kimi_mlp inspect --json report.json
    python tools/crosscheck_codegen.py report.json

For four variants (gate/up at M = 32 and 4096, the down GEMM at M = 1 and 4096) this
script builds the kernel's `triton.compiler.ASTSource` by hand (signature, constexprs,
alignment attributes written out below, not taken from a launch), compiles it with
`triton.compile` for GPUTarget("cuda", 90, 32) in an empty Triton cache, with no driver
replaced and no wrapper called, and reads the result with other tools than `inspect`:

- registers and stack from `cuobjdump -res-usage` on the cubin Triton built itself;
- spills from the log of Triton's own ptxas run (TRITON_DUMP_PTXAS_LOG=1);
- tensor-core instructions counted in the SASS (`cuobjdump -sass`: QGMMA is fp8 wgmma,
  HMMA is mma.sync, F2FP.F16.E4M3 the e4m3 -> f16 conversion);
- shared memory from the compiled kernel's metadata.

It prints each comparison and exits with status 1 if any disagrees. Needs no GPU.
"""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"                # compile, do not interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="crosscheck-triton-")
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kimi_mlp import kernels  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
D16 = [["tt.divisibility", 16]]

GATE_UP = ["x_ptr", "x_s_ptr", "g_ptr", "g_s_ptr", "u_ptr", "u_s_ptr", "q_ptr",
           "q_s_ptr", "h_ptr", "M", "F", "K", "stride_x", "fp8_max", "amax_eps"]
GATE_UP_TYPES = ["*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32", "*u8",
                 "*fp32", "*fp32", "i32", "i32", "i32", "i32", "fp32", "fp32"]
GEMM = ["a_ptr", "a_s_ptr", "w_ptr", "w_s_ptr", "c_ptr", "r_ptr", "M", "N", "K",
        "stride_a", "steps_per_split"]


def gemm_types(split: bool) -> list[str]:
    "c: the fp32 workspace when split, else the bf16 output; r: the bf16 residual."
    c = "*fp32" if split else "*bf16"
    return ["*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32", c, "*bf16", "i32", "i32", "i32",
            "i32", "i32"]


# (kernel, M, argument names and types, integers that are 1, integers divisible by 16,
#  constexprs, num_warps, num_stages): as the wrappers launch them at 7168 / 18432 on an
# H200 (132 SMs), worked out by hand from chapter 7's gemm_config and default_split_k.
CASES = [
    ("_gate_up_swiglu_quant_kernel", 32, GATE_UP, GATE_UP_TYPES, [],
     ["M", "F", "K", "stride_x"],
     dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, WRITE_H=False), 4, 3),
    ("_gate_up_swiglu_quant_kernel", 4096, GATE_UP, GATE_UP_TYPES, [],
     ["M", "F", "K", "stride_x"],
     dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, WRITE_H=False), 8, 3),
    # M = 1: 56 tiles < 132 SMs, so K (144 steps) is split in 3 slices of 48 steps
    ("_fp8_gemm_kernel", 1, GEMM, gemm_types(True), ["M"],
     ["N", "K", "stride_a", "steps_per_split"],
     dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT=True, HAS_RESIDUAL=False,
          ROUND_BF16=False), 8, 3),
    ("_fp8_gemm_kernel", 4096, GEMM, gemm_types(False), [],
     ["M", "N", "K", "stride_a", "steps_per_split"],
     dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, SPLIT=False, HAS_RESIDUAL=True,
          ROUND_BF16=True), 4, 4),
]


def compile_case(name, names, types, ones, div16, constexprs, num_warps, num_stages):
    "triton.compile of a hand-built ASTSource: (kernel, Triton's own ptxas log)."
    fn = getattr(kernels, name)
    signature = dict(zip(names, types))
    signature.update({k: "constexpr" for k in ones})
    signature.update({k: "constexpr" for k in constexprs})
    consts = {**{k: 1 for k in ones}, **constexprs}
    attrs = {(fn.arg_names.index(k),): D16 for k, t in signature.items()
             if t.startswith("*") or k in div16}
    src = ASTSource(fn, signature, consts, attrs)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        options = {"num_warps": num_warps, "num_stages": num_stages}
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return kernel, log.getvalue()


def sass_counts(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass, res = (subprocess.run([BIN / "cuobjdump", opt, f.name], text=True,
                                    capture_output=True, check=True).stdout
                     for opt in ("-sass", "-res-usage"))
    usage = re.search(r"REG:(\d+) STACK:(\d+)", res)
    return {"QGMMA": len(re.findall(r"\bQGMMA\.", sass)),
            "HMMA": len(re.findall(r"\bHMMA\.", sass)),
            "F2FP.F16.E4M3": len(re.findall(r"\bF2FP\.F16\.E4M3", sass)),
            "REG": int(usage.group(1)), "STACK": int(usage.group(2))}


def main(path) -> int:
    report = json.loads(Path(path).read_text())
    print(f"report: triton {report['triton']}, ptxas {report['ptxas']}; this compile: "
          f"triton {triton.__version__}")
    ok = True
    for name, m, names, types, ones, div16, constexprs, warps, stages in CASES:
        row = next(v for v in report["variants"] if v["kernel"] == name
                   and any(x["m"] == m for x in v["launches"]))
        kernel, log = compile_case(name, names, types, ones, div16, constexprs, warps,
                                   stages)
        frame = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        sass = sass_counts(kernel.asm["cubin"])
        ptx = kernel.asm["ptx"]
        n_mma = sum(op["count"] for op in row["matrix"]["ops"])
        n_wgmma = n_mma if row["matrix"]["kind"] == "wgmma" else 0
        stores, loads = int(frame.group(1)), int(frame.group(2))
        checks = [
            ("shared bytes", row["shared"], kernel.metadata.shared),
            ("registers (cuobjdump REG)", row["registers"], sass["REG"]),
            ("stack bytes (cuobjdump STACK)", row["stack"], sass["STACK"]),
            ("spill stores (Triton's ptxas log)", row["spill_stores"], stores),
            ("spill loads (Triton's ptxas log)", row["spill_loads"], loads),
            ("wgmma in PTX = QGMMA in SASS", n_wgmma, sass["QGMMA"]),
            ("mma.sync in PTX = HMMA in SASS",
             n_mma if row["matrix"]["kind"] == "mma.sync" else 0, sass["HMMA"]),
            ("wgmma lines in this PTX", n_wgmma,
             len(re.findall(r"^\s*wgmma\.mma_async", ptx, re.M))),
            ("cvt e4m3->f16 in PTX", row["matrix"]["fp8_to_f16"],
             ptx.count("cvt.rn.f16x2.e4m3x2")),
        ]
        print(f"\n{name} at M = {m} ({row['matrix']['kind']}, "
              f"{sass['F2FP.F16.E4M3']} F2FP.F16.E4M3 in the SASS)")
        for what, want, got in checks:
            agree = want == got
            ok &= agree
            print(f"  {what:<36} inspect {want:>6}  independent {got:>6}  "
                  f"{'agree' if agree else 'DISAGREE'}")
    print("\nall agree" if ok else "\nSOME DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
