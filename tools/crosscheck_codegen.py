"""Check `python -m kimi_mlp inspect` against an independent compile of its kernels.

    python -m kimi_mlp inspect --json report.json
    python tools/crosscheck_codegen.py report.json

For four variants (gate/up at M = 32 and 4096, the down GEMM at M = 1 and 4096) this
script builds the kernel's `triton.compiler.ASTSource` by hand (signature, flags and
alignment attributes written out below, not taken from a launch; the tile row and the
split from chapter 8's `plan_gemm`), compiles it with
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
           "q_s_ptr", "ws_ptr", "p_ptr", "M", "F", "K", "stride_x", "splits", "fp8_max",
           "amax_eps"]
GEMM = ["a_ptr", "a_s_ptr", "w_ptr", "w_s_ptr", "c_ptr", "r_ptr", "M", "N", "K",
        "stride_a", "splits"]


def desc(rows: int) -> str:
    "A host TMA descriptor of [rows, 128] e4m3 blocks, as Triton types it."
    return f"tensordesc<fp8e4nv[{rows}, 128]>"


def gate_up_types(plan) -> list[str]:
    "x by TMA when the plan says so; the weights always (16-byte aligned rows)."
    x = desc(plan["BLOCK_M"]) if plan["TMA_A"] else "*fp8e4nv"
    return [x, "*fp32", desc(128), "*fp32", desc(128), "*fp32", "*u8", "*fp32", "*fp32",
            "*fp32", "i32", "i32", "i32", "i32", "i32", "fp32", "fp32"]


def gemm_types(plan) -> list[str]:
    "c: the fp32 workspace when split, else the bf16 output; r: the bf16 residual."
    a = desc(plan["BLOCK_M"]) if plan["TMA_A"] else "*fp8e4nv"
    c = "*fp32" if plan["split_k"] > 1 else "*bf16"
    return [a, "*fp32", desc(128), "*fp32", c, "*bf16", "i32", "i32", "i32", "i32",
            "i32"]


def case(kind, m, ones, div16):
    """One launch as the wrappers make it at 7168 / 18432 on an H200 (132 SMs): the tile
    row and split from chapter 8's plan_gemm, the rest (argument types, the integers
    that are 1 or divisible by 16, the flags) written out here."""
    n, k = (18432, 7168) if kind == "gate_up" else (7168, 18432)
    plan = kernels._with_meta(kernels.plan_gemm(kind, m, n, k, 132))
    split = plan["split_k"] > 1
    flags = dict(SPLIT=split, TMA_A=plan["TMA_A"], TMA_W=True, NATIVE=True)
    meta = {key: v for key, v in plan["meta"].items()
            if key not in ("num_warps", "num_stages")}
    if kind == "gate_up":
        return ("_gate_up_swiglu_quant_kernel", m, GATE_UP, gate_up_types(plan), ones,
                div16, dict(meta, WRITE_P=False, **flags),
                plan["num_warps"], plan["num_stages"])
    return ("_fp8_gemm_kernel", m, GEMM, gemm_types(plan), ones, div16,
            dict(meta, HAS_RESIDUAL=not split, ROUND_BF16=not split, **flags),
            plan["num_warps"], plan["num_stages"])


# Gate/up at M = 32 (swapped, 2 K slices) and 4096 (128 x 128 tiles, one slice), the
# down GEMM at M = 1 (swapped, 7 slices) and 4096.
CASES = [
    case("gate_up", 32, [], ["M", "F", "K", "stride_x"]),
    case("gate_up", 4096, ["splits"], ["M", "F", "K", "stride_x"]),
    case("down", 1, ["M"], ["N", "K", "stride_a"]),
    case("down", 4096, ["splits"], ["M", "N", "K", "stride_a"]),
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
