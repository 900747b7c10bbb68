"""Export the book's notebooks into the package with nbdev's `nb_export`.

    python tools/export.py                 # book/*.ipynb -> kimi_mlp/
    python tools/export.py BOOK_DIR LIB_DIR

Only notebooks with a `#| default_exp` cell produce a module. nbdev runs standalone here (there is
no settings.ini), so the destination is passed explicitly.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def exporting_notebooks(book_dir: Path) -> list[Path]:
    "Notebooks in `book_dir` that declare a `#| default_exp` module."
    out = []
    for nb in sorted(Path(book_dir).glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        src = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        if any(line.strip().startswith("#| default_exp") for s in src for line in s.splitlines()):
            out.append(nb)
    return out


def export_all(book_dir: Path, lib_dir: Path) -> list[Path]:
    "Export every exporting notebook of `book_dir` into `lib_dir`; return the notebooks."
    from nbdev.export import nb_export

    notebooks = exporting_notebooks(book_dir)
    for nb in notebooks:
        nb_export(str(nb), lib_path=str(lib_dir))
    return notebooks


if __name__ == "__main__":
    book, lib = (Path(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (ROOT / "book", ROOT / "kimi_mlp")
    for nb in export_all(book, lib):
        print(f"exported {nb.name}")
