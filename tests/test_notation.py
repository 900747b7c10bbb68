"""The notation page's table of floors and ridges holds the values the code computes from the
book's record of an H200's ceilings, so a number cited by name has one value."""
import re
from pathlib import Path

from kimi_mlp.apparatus.provenance import load_ceilings
from kimi_mlp.bench import ffn_flop, ffn_min_bytes, roofline_floor_s

BOOK = Path(__file__).resolve().parent.parent / "book"


def _table() -> dict:
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", (BOOK / "notation.md").read_text(), re.M)
    return {k: v for k, v in rows}


def _crossing(ceil, weights_only: bool) -> float:
    "The M at which the FP8 FLOP time equals the bytes time (bisection)."
    rate, bw = ceil["fp8_flop_per_s"], ceil["copy_bytes_per_s"]
    if weights_only:
        return rate / bw / 2                         # 2M FLOP per weight byte
    lo, hi = 1.0, 1e4
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ffn_flop(mid) / rate >= ffn_min_bytes(mid) / bw else (mid, hi)
    return hi


def test_notation_table_matches_the_code():
    ceil = load_ceilings(BOOK / "data" / "h200_ceilings.json")
    t = _table()
    ridge = ceil["fp8_flop_per_s"] / ceil["copy_bytes_per_s"]
    assert t["ridge point, FP8"] == f"{ridge:.0f} FLOP per byte"
    assert t["compute-bound from, FP8, weights' bytes alone"] == \
        f"$M \\approx {_crossing(ceil, True):.0f}$"
    assert t["compute-bound from, FP8, every byte"] == \
        f"$M \\approx {_crossing(ceil, False):.0f}$"
    for key, m, w in (("floor at $M = 1$ (decode), FP8 weights", 1, "fp8"),
                      ("floor at $M = 1$, bf16 weights", 1, "bf16"),
                      ("floor at $M = 4096$ (prefill), FP8 weights", 4096, "fp8"),
                      ("floor at $M = 4096$, bf16 weights", 4096, "bf16")):
        assert t[key] == f"{roofline_floor_s(m, ceil, w) * 1e6:.1f} µs", key
