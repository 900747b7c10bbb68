"""Recompute the static H200 model's current entries in book/data/h200_model.json.

    python tools/refresh_model.py            # writes the `triton` and `gluon` entries
    python tools/refresh_model.py --check    # exit 1 if the stored entries differ

Appendix D's model (`kimi_mlp.apparatus.codegen.model_entry`) of the block's Triton launches as
compiled for sm_90a (`triton`), and of `GluonFp8DenseMLP`'s default launches, appendix F's
Gluon down GEMM from GLUON_MIN_M tokens on (`gluon`). Other entries (`before`) are kept as they are. Needs no GPU:
the kernels are compiled, not run. Appendices D and F assert that the stored entries are
these, so a change to the kernels or the plans that is not followed by this command fails
their notebooks.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kimi_mlp.apparatus.codegen import MODEL_M, inspect_kernels, model_entry, write_model  # noqa: E402
from kimi_mlp.kernels.gluon import GLUON_MIN_M  # noqa: E402
from kimi_mlp.apparatus.gluon_codegen import inspect_gluon  # noqa: E402

PATH = ROOT / "book" / "data" / "h200_model.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    a = p.parse_args(argv)
    report = inspect_kernels(MODEL_M)
    gluon = inspect_gluon([m for m in MODEL_M if m >= GLUON_MIN_M])
    replace = {v["stands_for"]: v for v in gluon["variants"]      # GluonFp8DenseMLP's
               if v["stands_for"] == "_fp8_gemm_kernel"}          # default: the down GEMM
    entries = {"triton": model_entry(report),
               "gluon": model_entry(report, replace=replace, replace_from=GLUON_MIN_M)}
    if a.check:
        stored = json.loads(PATH.read_text())["entries"]
        stale = [k for k, e in entries.items() if stored.get(k) != e]
        print(f"stale entries: {stale}" if stale else "h200_model.json is current")
        return 1 if stale else 0
    write_model(PATH, entries)
    print(f"wrote {', '.join(entries)} to {PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
