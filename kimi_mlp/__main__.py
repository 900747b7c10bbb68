"""`python -m kimi_mlp {synth,info,check,bench} ...`: the command line.

Written by hand (not exported): the commands live in kimi_mlp.checkpoint (chapter 6), and
`bench` in kimi_mlp.bench (chapter 9), which registers itself when first used.
"""
import sys

from kimi_mlp.checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
