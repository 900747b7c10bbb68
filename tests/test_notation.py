"""The notation page's tables of floors and ridges hold the values the code computes: from the
book's record of an H200's ceilings, and from appendix G's registry of datasheet figures for every
named GPU. A number cited by name has one value."""
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


#: The matrix unit that bounds the kernels' arithmetic, by appendix G's rate key.
UNIT = {"fp8_flop_per_s": "FP8 tensor cores", "bf16_flop_per_s": "bf16 tensor cores",
        "fp32_flop_per_s": "fp32 FMA units"}


def gpu_row(g: dict) -> list[str]:
    """A GPU's row of the notation page's datasheet table, computed as chapter 11 computes
    its floors: GPU, unit, rate, bandwidth, ridge, floors at M = 1 and 4096, crossing."""
    from kimi_mlp.bench import compute_bound_from, gpu_floor_s
    rate, bw = g[g["rate_key"]], g["hbm_bytes_per_s"]
    mark = "" if rate else "≥ "                   # no rate: the bandwidth floor alone
    cross = "unknown" if rate is None else f"$M = {compute_bound_from(g)}$"
    return [g["name"], UNIT[g["rate_key"]],
            "none recorded" if rate is None else f"{rate / 1e12:,.4g}",
            f"{bw / 1e9:,.0f}", "unknown" if rate is None else f"{rate / bw:.0f}",
            f"{mark}{gpu_floor_s(g, 1) * 1e6:,.0f}",
            f"{mark}{gpu_floor_s(g, 4096) * 1e6:,.0f}", cross]


def test_notation_gpu_table_matches_the_registry():
    """Every named GPU of appendix G's registry has its row, with the values chapter 11's
    functions compute from the datasheet figures, and no row names another GPU."""
    from kimi_mlp.bench import datasheet_gpus
    text = (BOOK / "notation.md").read_text()
    section = text.split("### Other GPUs", 1)[1]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")][1:]
    assert rows == [gpu_row(g) for g in datasheet_gpus()]
