"""`python -m kimi_mlp.gpucheck`: the same as `python -m kimi_mlp gpucheck`,
the kernel checks and timings at Kimi K2's real shapes on a GPU.

Written by hand (not exported): the work is `gpucheck_main` in
kimi_mlp.apparatus.gpu_check (appendix C), run under the command line's rules
(appendix B's `run_external`: one line per error, the exit statuses of
`python -m kimi_mlp`).
"""
import sys

from kimi_mlp.cli import run_external

if __name__ == "__main__":
    sys.exit(run_external("gpucheck"))
