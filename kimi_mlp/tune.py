"""`python -m kimi_mlp tune [--out FILE]`: time tile configurations of the fused block's
GEMMs on this GPU and write its tile table (appendix E; appendix C reads it back).

Written by hand (not exported): the work is `tune_main` in kimi_mlp.harness.
"""
import sys

from kimi_mlp.harness import tune_main as main

if __name__ == "__main__":
    sys.exit(main())
