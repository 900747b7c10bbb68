"""`python -m kimi_mlp {synth,info,check,bench,gpu-report,inspect} ...`: the
command line.

Written by hand (not exported): the command line is kimi_mlp.cli (Appendix B),
whose `synth`, `info` and `check` call chapter 6's kimi_mlp.checkpoint; `bench`
lives in kimi_mlp.apparatus.harness (Appendix E), `gpu-report` in
kimi_mlp.apparatus.report (Appendix C) and `inspect` in
kimi_mlp.apparatus.codegen (Appendix D), each imported only when it runs.
"""
import sys

from kimi_mlp.cli import main

if __name__ == "__main__":
    sys.exit(main())
