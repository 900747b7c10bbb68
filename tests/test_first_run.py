"""What a new user meets on the first day: the import order, the Hugging Face path, the
command line and the caches. Each test here failed before its fix."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# A fresh Python runs the fused block on a seeded input and prints the interpreter flag,
# whether the output equals the torch w8a8 reference bit for bit, and a digest of it.
_FUSED_RUN = """
import hashlib, sys, warnings
{first}
import torch
import kimi_mlp.kernels as k
from kimi_mlp.fused import fused_ffn_block, random_dense_block
b = random_dense_block(256, 320, seed=5)
h = torch.randn(20, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
y = fused_ffn_block(h, b)
b.mlp.mode = "w8a8"
print(k.INTERPRETED, torch.equal(y, b(h)),
      hashlib.sha256(y.view(torch.int16).numpy()).hexdigest())
"""


def _fresh_python(code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**base, **env}, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is for no CUDA")
def test_the_kernels_work_whatever_was_imported_first():
    """`import triton` (or `from transformers import ...`, which imports it) before
    kimi_mlp: the same bits as importing kimi_mlp first, and INTERPRETED says so."""
    firsts = {"kimi_mlp": "",
              "triton": "import triton",
              "transformers": "warnings.simplefilter('ignore')\n"
                              "from transformers import DeepseekV3ForCausalLM"}
    lines = {}
    for name, first in firsts.items():
        run = _fresh_python(_FUSED_RUN.format(first=first))
        assert run.returncode == 0, f"{name} first: {run.stderr[-2000:]}"
        lines[name] = run.stdout.split()
    assert lines["kimi_mlp"][:2] == ["True", "True"]
    assert lines["triton"] == lines["kimi_mlp"] == lines["transformers"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is for no CUDA")
def test_interpreted_never_claims_what_is_not_true():
    "TRITON_INTERPRET=0 on a machine without CUDA: the kernels compile, and the flag says so."
    run = _fresh_python("import triton; import kimi_mlp.kernels as k; print(k.INTERPRETED)",
                        TRITON_INTERPRET="0")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"]
