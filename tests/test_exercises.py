"""Every chapter, and every appendix that sets exercises, works at least three of them out in
a Solution dropdown, so a reader can check an answer."""
import json
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parent.parent / "book"
SOLUTION = re.compile(r"^:::\{dropdown\} Solution\s*$", re.M)


def _markdown(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _sets_exercises(path: Path) -> bool:
    return path.name[:2].isdigit() or "## Exercises" in _markdown(path)


@pytest.mark.parametrize("path", [p for p in sorted(BOOK.glob("*.ipynb"))
                                  if _sets_exercises(p)], ids=lambda p: p.name)
def test_at_least_three_worked_solutions(path):
    text = _markdown(path)
    assert "## Exercises" in text, f"{path.name} sets no exercises"
    found = len(SOLUTION.findall(text))
    assert found >= 3, f"{path.name}: {found} worked solutions, expected at least 3"
