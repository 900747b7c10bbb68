"""Re-execute notebooks in place, on this machine, so their stored outputs are the CPU run.

    python tools/execute.py                  # every notebook in book/
    python tools/execute.py book/05_fp8.ipynb

CI's nbval re-runs each notebook and compares with what this script stores. Cells run with the
notebook's directory as the working directory, the same as nbval.
"""
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def merge_streams(cell) -> None:
    """Join consecutive stdout (or stderr) chunks, so a re-run stores the same outputs whatever
    the kernel's buffering did (nbval joins them too before comparing)."""
    merged = []
    for out in cell.get("outputs", []):
        if (out.output_type == "stream" and merged and merged[-1].output_type == "stream"
                and merged[-1].name == out.name):
            merged[-1].text += out.text
        else:
            merged.append(out)
    cell.outputs = merged


def execute(path: Path, timeout: int = 1800) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            merge_streams(cell)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nbformat.write(nb, path)


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "book").glob("*.ipynb"))
    for p in paths:
        print(f"executing {p}", flush=True)
        execute(p)
