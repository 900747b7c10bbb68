"""Rounding constants and the relative-rms criterion shared by the reference-model tests."""
import math

import torch

U_BF16, U_F32 = 2.0**-8, 2.0**-24  # unit roundoff: 8 and 24 significant bits


def rel_rms(y, o):
    "Relative rms error ||y - o|| / ||o|| of `y` against a float64 oracle `o`."
    return ((y.double() - o).pow(2).mean().sqrt() / o.pow(2).mean().sqrt()).item()


def rel_rms_bound(dtype, k):
    """Allowed relative rms error of an MLP or block output against float64, k = the longest
    accumulation. bf16: the path rounds to bf16 five (MLP: gate, up, silu, product, down) or six
    (block: norm cast, gain, first projection, activation, down projection, residual add) times,
    each at most u = 2^-8 and about u/sqrt(3) rms; independent errors add in quadrature to about
    1.3u-1.4u, and 4u leaves room for amplification through the activation and the matmuls.
    float32: the k-term float32 accumulations dominate and drift like sqrt(k) u_f32; we allow
    4 sqrt(k) u_f32."""
    return 4 * U_BF16 if dtype == torch.bfloat16 else 4 * math.sqrt(k) * U_F32
