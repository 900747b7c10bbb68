"""`python -m kimi_mlp COMMAND ...`: the command line (`python -m kimi_mlp
--help` lists the commands).

Written by hand (not exported): the command line is kimi_mlp.cli (Appendix B),
whose `synth`, `info` and `check` call chapter 6's kimi_mlp.checkpoint; the
other commands' work lives in heavier modules (the GPU check and the report in
Appendix C, `inspect` in D, `bench` and `tune` in E, `tp-check` in chapter 12),
each imported only once its options, declared in a module that imports no
kernels, have parsed.
"""
import sys

from kimi_mlp.cli import main

if __name__ == "__main__":
    sys.exit(main())
