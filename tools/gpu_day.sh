#!/usr/bin/env bash
# The book's GPU work in steps that each end within LIMIT_S seconds (default 470, under
# 8 minutes), for a GPU that is available a few minutes at a time. Every step writes
# under OUT as it goes, so a step cut short keeps what it finished:
#   gpu-report.json / .log   which step ran, passed, failed or was interrupted, with the
#                            machine's provenance; one entry per call
#   gpucheck.json / .log     the GPU check, one row per M, rows of earlier calls kept
#   bench_*.json / .log      the sweep, rewritten after every M
#   07_triton.ipynb ...      a chapter executed on the GPU, rewritten after every cell
#
# usage: tools/gpu_day.sh STEP OUT
#   check-decode    the GPU check at M = 1, 3, 16, 33 (real shapes, compiled kernels)
#   check-prefill   the GPU check at M = 128, 512, 1024, 4096
#   bench           the benchmark sweep, M = 1 ... 8192 while the time lasts
#   bench-w8a16     the same sweep on appendix H's W8A16 path (on an FP8 GPU: W8A16 there)
#   check-w8a16     the GPU check of the W8A16 launches at M = 1, 16, 128, 4096, into
#                   OUT/w8a16/ (its own gpucheck.json beside the FP8 one)
#   check-gluon     the GPU check of appendix F's Gluon GEMMs (Hopper) at M = 512, 1024,
#                   4096, against the same oracle as the Triton ones and timed beside
#                   them, into OUT/gluon/
#   ch7 ... ch11    one chapter executed on the GPU (7 to 9: the kernels; 10: the fused
#                   module; 11: the benchmarks)
#   appH            appendix H, the W8A16 kernels, executed on the GPU
# In this order on one GPU: check-decode, check-prefill, bench, ch7 ... ch11, appH,
# bench-w8a16, check-w8a16, check-gluon.
#
# Compiled kernels go to TRITON_CACHE_DIR, by default .triton-cache/ in the tree (ignored by
# git), so a later step on the same machine reuses what an earlier one compiled; fused
# multiply-adds are named explicitly (TRITON_DEFAULT_FP_FUSION=1, Triton's default), since
# Triton keys its cache on the variable. A cache made on another machine is not reused
# here on purpose: Triton's key includes its own compiled library, which differs between
# Python versions, so a copy would only look like a hit.
# GIT_COMMIT names the commit for a tree copied without .git; PYTHON the interpreter.
set -euo pipefail
step=${1:?usage: tools/gpu_day.sh STEP OUT}
out=${2:?usage: tools/gpu_day.sh STEP OUT}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}"
export TRITON_DEFAULT_FP_FUSION=1
py=${PYTHON:-python3}
limit=${LIMIT_S:-470}
commit=${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

report() {
    # At the limit, SIGINT to Python alone: gpu-report records the step as interrupted and
    # stops; a notebook or the sweep keeps what it wrote. SIGKILL 15 s later if need be.
    # Budgets leave a minute for starting Python and torch and for the last cell or M.
    timeout --foreground --signal=INT --kill-after=15 "$limit" \
        "$py" -m kimi_mlp gpu-report --out "$out" --git-commit "$commit" "$@"
}

case "$step" in
    check-decode)  report --steps gpucheck --m 1,3,16,33 ;;
    check-prefill) report --steps gpucheck --m 128,512,1024,4096 ;;
    bench)         report --steps bench --budget-s $((limit - 120)) ;;
    bench-w8a16)   timeout --foreground --signal=INT --kill-after=15 "$limit" \
                       "$py" -m kimi_mlp bench --path w8a16 --out "$out" \
                       --git-commit "$commit" --budget-s $((limit - 120)) ;;
    check-w8a16)   timeout --foreground --signal=INT --kill-after=15 "$limit" \
                       "$py" -m kimi_mlp gpucheck --path w8a16 --m 1,16,128,4096 \
                       --out "$out/w8a16" --git-commit "$commit" ;;
    check-gluon)   timeout --foreground --signal=INT --kill-after=15 "$limit" \
                       "$py" -m kimi_mlp gpucheck --path gluon --m 512,1024,4096 \
                       --out "$out/gluon" --git-commit "$commit" ;;
    ch7)           report --steps notebooks --notebooks 07_triton.ipynb --budget-s $((limit - 60)) ;;
    ch8)           report --steps notebooks --notebooks 08_gemm.ipynb --budget-s $((limit - 60)) ;;
    ch9)           report --steps notebooks --notebooks 09_epilogues.ipynb --budget-s $((limit - 60)) ;;
    ch10)          report --steps notebooks --notebooks 10_fused_mlp.ipynb --budget-s $((limit - 60)) ;;
    ch11)          report --steps notebooks --notebooks 11_benchmarks.ipynb --budget-s $((limit - 60)) ;;
    appH)          report --steps notebooks --notebooks appendix_h_w8a16.ipynb --budget-s $((limit - 60)) ;;
    *) echo "tools/gpu_day.sh: unknown step '$step'" >&2; exit 2 ;;
esac
