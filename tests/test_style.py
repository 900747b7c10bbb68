"""House rules the book's sources keep: every line of a notebook's code cells fits the
line length that pyproject.toml sets (the built page shows 79 characters of a code line),
and a shown cell fits a screen."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from book_markdown import fenced_code

ROOT = Path(__file__).resolve().parent.parent
# [tool.ruff] line-length, read without tomllib (Python 3.11+) since the package allows 3.10.
_RUFF = re.search(r"^\[tool\.ruff\]\n(?:[^\[].*\n)*?line-length\s*=\s*(\d+)",
                  (ROOT / "pyproject.toml").read_text(), re.M)
LINE_LENGTH = int(_RUFF.group(1))
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


def code_cells(path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            yield i, cell, "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_column(path):
    long = [(i, len(line)) for i, _, src in code_cells(path)
            for line in src.splitlines() if len(line) > LINE_LENGTH]
    assert not long, f"{path.name}: (cell, length) of lines over {LINE_LENGTH}: {long}"


def test_fenced_code_finds_code_not_directives():
    text = ("```python\nx = 1\n```\n\n```{admonition} Note\nprose\n```\n~~~bash\nls\n~~~\n"
            "````{dropdown} Solution\nwords\n```\ny = 2\n```\n````\n"
            "- a list item:\n\n  ```\n  z = 3\n  ```\n```{code-block} python\nw = 4\n```\n")
    assert list(fenced_code(text)) == ["x = 1", "ls", "y = 2", "  z = 3", "w = 4"]


PAGES = NOTEBOOKS + sorted((ROOT / "book").glob("*.md"))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_fenced_code_in_prose_fits_the_column(path):
    """Code shown inside markdown (commands, sketches, usage) is code on the page too."""
    if path.suffix == ".ipynb":
        texts = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                 if c["cell_type"] == "markdown"]
    else:
        texts = [path.read_text()]
    long = [line for text in texts for line in fenced_code(text) if len(line) > LINE_LENGTH]
    assert not long, f"{path.name}: fenced code lines over {LINE_LENGTH}: {long}"


#: Tags under which Jupyter Book collapses or removes a cell's code: the reader opens it
#: on purpose, so its length is not a page the reader has to scroll past.
HIDDEN = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
#: The longest code cell a reader sees: a teaching chapter shows what is studied in
#: pieces that fit a screen; an appendix may show a little more of a harness.
SHOWN_LINES = {"chapter": 35, "appendix": 60}


def _shown_limit(path: Path) -> int | None:
    if path.name.startswith("appendix_"):
        return SHOWN_LINES["appendix"]
    return SHOWN_LINES["chapter"] if path.name[:2].isdigit() else None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_shown_code_cells_fit_a_screen(path):
    limit = _shown_limit(path)
    if limit is None:
        pytest.skip("not a chapter or an appendix")
    long = [(i, len(src.splitlines())) for i, cell, src in code_cells(path)
            if not HIDDEN & set(cell["metadata"].get("tags", []))
            and len(src.splitlines()) > limit]
    assert not long, (f"{path.name}: (cell, lines) of shown code cells over {limit} "
                      f"lines (split them, or collapse plumbing with 'hide-input'): {long}")


def test_ruff_holds_the_notebooks_and_the_package_to_the_column():
    """`ruff check` under pyproject.toml's [tool.ruff]: 79 columns and no trailing
    whitespace, over the notebooks and every module of the package. A generated module's
    only lines of its own are nbdev's header and `__all__`, which tools/export.py wraps."""
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "book",
                          "kimi_mlp"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
