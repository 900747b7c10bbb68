#!/usr/bin/env bash
# The book's GPU work in steps that each end within LIMIT_S seconds (default 470, under
# 8 minutes), for a GPU that is available a few minutes at a time. Every step writes
# under OUT as it goes, so a step cut short keeps what it finished:
#   gpu-report.json / .log   which step ran, passed or failed, with the machine's provenance
#   gpucheck.json / .log     the GPU check, one row per M, rows of earlier calls kept
#   bench_*.json / .log      the sweep, rewritten after every M
#   07_kernels.ipynb ...     a chapter executed on the GPU, rewritten after every cell
#
# usage: tools/gpu_day.sh STEP OUT
#   check-decode    the GPU check at M = 1, 3, 16, 33 (real shapes, compiled kernels)
#   check-prefill   the GPU check at M = 128, 512, 1024, 4096
#   bench           the benchmark sweep, M = 1 ... 8192 while the time lasts
#   ch7 | ch8 | ch9 one chapter executed on the GPU
#   warm            on a CPU: compile every GPU-check and benchmark variant for sm_90a into
#                   OUT/triton-cache twice and check that the second compile finds them all
#                   (use the GPU's Triton version; set TRITON_CACHE_DIR to it on the GPU)
# In this order on one GPU: check-decode, check-prefill, bench, ch7, ch8, ch9.
# GIT_COMMIT names the commit for a tree copied without .git; PYTHON the interpreter.
set -euo pipefail
step=${1:?usage: tools/gpu_day.sh STEP OUT}
out=${2:?usage: tools/gpu_day.sh STEP OUT}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
limit=${LIMIT_S:-470}
commit=${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

report() {
    # SIGINT first (Python ends the step and keeps what it wrote), SIGKILL 10 s later
    timeout --signal=INT --kill-after=10 "$limit" \
        "$py" -m kimi_mlp gpu-report --out "$out" --git-commit "$commit" "$@"
}

case "$step" in
    check-decode)  report --steps gpucheck --m 1,3,16,33 ;;
    check-prefill) report --steps gpucheck --m 128,512,1024,4096 ;;
    bench)         report --steps bench --budget-s $((limit - 90)) ;;
    ch7)           report --steps notebooks --notebooks 07_kernels.ipynb --budget-s $((limit - 20)) ;;
    ch8)           report --steps notebooks --notebooks 08_fused_mlp.ipynb --budget-s $((limit - 20)) ;;
    ch9)           report --steps notebooks --notebooks 09_benchmarks.ipynb --budget-s $((limit - 20)) ;;
    warm)
        export TRITON_CACHE_DIR="$out/triton-cache"
        for pass in 1 2; do
            start=$(date +%s)
            "$py" -m kimi_mlp inspect --workload block,gpucheck,bench --json "$out/warm-$pass.json" \
                > "$out/warm-$pass.log"
            files=$(find "$TRITON_CACHE_DIR" -type f | wc -l)
            echo "pass $pass: $(( $(date +%s) - start )) s, $files files in the cache"
            echo "$files" > "$out/warm-$pass.files"
        done
        if [ "$(cat "$out/warm-1.files")" != "$(cat "$out/warm-2.files")" ]; then
            echo "the second compile wrote new cache entries: the cache did not hit" >&2
            exit 1
        fi
        du -sh "$TRITON_CACHE_DIR"
        ;;
    *) echo "tools/gpu_day.sh: unknown step '$step'" >&2; exit 2 ;;
esac
