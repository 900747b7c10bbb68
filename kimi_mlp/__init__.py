"""kimi-mlp: Kimi K2's dense feed-forward block, from scratch.

The modules are exported from the book's notebooks (book/*.ipynb) with nbdev; this file, written
by hand, gathers the public API.
"""
from .config import KimiK2Config, count_parameters, dense_mlp_parameters, read_safetensors_header

__version__ = "0.1.0"
