"""A chapter is sized for one sitting: at most 5,500 words of prose and 80 cells.

Words are the whitespace-separated tokens of the markdown cells, outside code fences and
display math (a directive's fence, such as a takeaway's admonition, holds prose and counts);
cells are all cells, code and markdown. Appendices are reference material and
are not held to this."""
import json
import re
from pathlib import Path

import pytest
from book_markdown import without_code

BOOK = Path(__file__).resolve().parent.parent / "book"
MAX_WORDS, MAX_CELLS = 5500, 80
DISPLAY = re.compile(r"\$\$.*?\$\$", re.S)


def prose_words(markdown: str) -> int:
    """Whitespace-separated tokens outside code fences and display math. A directive's
    title and body (a takeaway, say) are prose; its option lines are not."""
    return len(DISPLAY.sub(" ", without_code(markdown)).split())


def test_prose_words_counts_only_prose():
    text = ("One two\n\n```python\nx = 1  # not prose\n```\n\n$$a + b$$ three\n\n"
            "```{admonition} Takeaway\n:class: tip\nfour five\n```\n")
    assert prose_words(text) == 6


CHAPTERS = sorted(p for p in BOOK.glob("*.ipynb") if p.name[:2].isdigit())


def test_every_chapter_is_found():
    assert len(CHAPTERS) >= 13, [p.name for p in CHAPTERS]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_fits_one_sitting(path):
    cells = json.loads(path.read_text())["cells"]
    words = sum(prose_words("".join(c["source"])) for c in cells
                if c["cell_type"] == "markdown")
    assert len(cells) <= MAX_CELLS, f"{path.name}: {len(cells)} cells, at most {MAX_CELLS}"
    assert words <= MAX_WORDS, f"{path.name}: {words} words of prose, at most {MAX_WORDS}"
