"""The book's prose speaks of its code, its measurements and public sources, never of
how the book was made or tested: no commit hash of ours, no test file, no CI, no
rehearsal, nothing about the machine it was built on. The rule reads markdown cells
(and the book's Markdown pages) only: code and cell tags may name what the tests need."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

#: Revisions of public sources that the book cites, each with the repository that
#: must be named in the same cell; any other hexadecimal token of 7 to 40
#: characters (digits and letters both) reads as a commit of this repository.
PUBLIC_REVISIONS = {
    "fd1984e2b7a3": "Kimi-K2-Instruct",     # modeling_deepseek.py, config.json
    "a204e40": "vllm-project/vllm",          # vLLM's tuned FP8 tile table
}
HASH = re.compile(r"(?<![0-9A-Za-z#])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
                  r"(?![0-9A-Za-z])")
#: What a reader's page must not say, by rule.
RULES = {
    "a test file": re.compile(r"\btests/|\btest_\w+\.py\b|\bconftest\b|\bnbval\b"),
    "CI": re.compile(r"\bCI\b|continuous integration", re.I),
    "a rehearsal": re.compile(r"rehears", re.I),
    "the machine the book was built on": re.compile(
        r"two-core|\b2-core|root access|gpu_day|this copy of the book|borrowed"
        r"|\bthe tests\b|when the book is (tested|built)|book was (built|made|written)",
        re.I),
}


def findings(text: str) -> list[str]:
    "What `text` (one markdown cell) says that the rule forbids, one line each."
    found = [f"{rule}: {m.group(0)!r}" for rule, pattern in RULES.items()
             for m in pattern.finditer(text)]
    for m in HASH.finditer(text):
        repo = PUBLIC_REVISIONS.get(m.group(0))
        if repo is None or repo not in text:
            found.append(f"a commit hash: {m.group(0)!r}")
    return found


def markdown_of(path: Path) -> list[tuple[str, str]]:
    "(where, text) of each markdown cell of a notebook, or of a Markdown page."
    if path.suffix == ".md":
        return [(path.name, path.read_text())]
    cells = json.loads(path.read_text())["cells"]
    return [(f"{path.name} cell {i} ({c.get('id')})", "".join(c["source"]))
            for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


PAGES = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_the_prose_speaks_only_of_the_book(path):
    bad = [f"{where}: {line}" for where, text in markdown_of(path)
           for line in findings(text)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("text", [
    "as of commit 2c07afd the planner", "see tests/test_fold.py", "test_fold.py checks",
    "what CI checks on every commit", "the rehearsal of the GPU code",
    "on a two-core machine", "`tools/gpu_day.sh` runs it", "the reference the tests use",
    "not compared when the book is tested", "revision fd1984e2b7a3 of something else",
])
def test_each_rule_catches_what_it_names(text):
    assert findings(text), text


@pytest.mark.parametrize("text", [
    "`moonshotai/Kimi-K2-Instruct` at revision `fd1984e2b7a3`",
    "the e4m3 NaN codes 0x7F and 0xFF", "128 × 128 blocks of 7168 and 18432",
    "the decode of 1 token", "a scale of 1e-3 in fp32",
    "`cudaMemcpy` and the CIFAR-like data",
])
def test_what_the_book_may_say_passes(text):
    assert not findings(text), findings(text)


def test_the_host_target_states_its_stored_figure():
    """Where chapter 11 states target 5 it gives the stored measurement and its verdict:
    the figure and the word must be those the measuring cell stored."""
    cells = {c.get("id"): c for c in
             json.loads((BOOK / "11_benchmarks.ipynb").read_text())["cells"]}
    stored = "".join("".join(o.get("text", "")) for o in cells["85bec4ef"]["outputs"])
    m = re.search(r"<= 15 µs: (\d+\.\d) µs, [\d.]+ x the target: (met|MISSED)", stored)
    assert m, stored
    figure, verdict = m.groups()
    prose = "".join(cells["6cd5f30e"]["source"])
    said = "Met" if verdict == "met" else "Missed"
    assert f"**{said}, at {figure} µs**" in prose, (figure, verdict)
