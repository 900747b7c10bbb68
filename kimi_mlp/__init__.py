"""kimi-mlp: Kimi K2's dense feed-forward block, from scratch.

The modules are exported from the book's notebooks (book/*.ipynb) with nbdev;
this file, written by hand, gathers the public API. Modules that need Triton
(kernels, fused, parallel, hf) are not imported here: `import kimi_mlp` needs
only torch, safetensors and numpy.
"""
from importlib.util import find_spec as _find_spec

from .safetensors_io import CheckpointError, read_safetensors_header
from .config import KimiK2Config, count_parameters, dense_mlp_parameters
from .rmsnorm import RMSNorm, rms_norm
from .block import GeluMLP, ResidualBlock
from .swiglu import DenseMLP, silu, swiglu
from .fp8 import (ACT_AMAX_EPS, FP8_MAX, Fp8DenseMLP, Fp8Linear,
                  dequantize_weight_blockwise, fp8_linear_w8a8,
                  fp8_linear_w8a16, fp8_matmul_blockwise, quantize_activation,
                  quantize_weight_blockwise)

from .checkpoint import load_dense_block, write_synthetic_checkpoint

__version__ = "0.1.0"

# The fused Triton block (chapter 10) needs Triton: import it on first use, so
# that `import kimi_mlp` works without it. Importing kimi_mlp.fused (or
# kimi_mlp.kernels) turns on Triton's CPU interpreter when no CUDA device is
# present.
_LAZY = {"FusedFp8DenseMLP": "fused", "fused_ffn_block": "fused",
         # the block across ranks (chapter 12): torch.distributed, and
         # Triton for "fused"
         "TensorParallelFFN": "parallel", "load_dense_shard": "parallel",
         "tp_ffn_block": "parallel",
         # inside a Hugging Face DeepseekV3 model (chapter 13); Triton for
         # "fused"
         "fuse_ffn": "hf", "FusedMLP": "hf",
         # the Gluon GEMMs for Hopper (appendix F), opt-in
         "GluonFp8DenseMLP": "kernels.gluon",
         # what launches plan and compile for (chapter 7): a GPU's, or a named
         # one's (`with kimi_mlp.compile_only("sm_89", sms=58): block(h)`
         # compiles, runs nothing)
         "Target": "kernels", "compile_only": "kernels"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        try:
            module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        except ModuleNotFoundError as e:   # the base install: one line
            from .cli import EXTRAS, missing_package   # appendix B's rule
            package = missing_package(e)
            if package is None:            # a submodule: an older Triton, say
                raise
            raise ModuleNotFoundError(
                f"kimi_mlp.{name} needs {package}, which is not installed: "
                f"pip install 'kimi-mlp[{EXTRAS[package]}]'",
                name=package) from None
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CheckpointError", "read_safetensors_header",
    "KimiK2Config", "count_parameters", "dense_mlp_parameters",
    "RMSNorm", "rms_norm", "GeluMLP", "ResidualBlock",
    "DenseMLP", "silu", "swiglu",
    "ACT_AMAX_EPS", "FP8_MAX", "Fp8DenseMLP", "Fp8Linear",
    "dequantize_weight_blockwise", "fp8_linear_w8a8", "fp8_linear_w8a16",
    "fp8_matmul_blockwise", "quantize_activation", "quantize_weight_blockwise",
    "load_dense_block", "write_synthetic_checkpoint",
    # the lazy names, where Triton is installed (`from kimi_mlp import *` then
    # imports their modules, and with them the kernels); without it, the star
    # import takes the rest, and the names raise the line above
    *(_LAZY if _find_spec("triton") is not None else ()),
]
