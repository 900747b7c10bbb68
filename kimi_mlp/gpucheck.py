"""`python -m kimi_mlp.gpucheck`: the kernel checks and timings at Kimi K2's real shapes on a GPU.

Written by hand (not exported): the work is `gpucheck_main` in kimi_mlp.gpu_check (appendix C).
"""
import sys

from kimi_mlp.gpu_check import gpucheck_main

if __name__ == "__main__":
    sys.exit(gpucheck_main())
