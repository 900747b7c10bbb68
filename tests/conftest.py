import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before any kernel
# module is imported. kimi_mlp.kernels does the same; setting it here keeps test collection order
# irrelevant.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def rng():
    "A fresh, seeded generator per test, so each case draws its own inputs reproducibly."
    return torch.Generator().manual_seed(1234)
