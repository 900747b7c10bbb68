"""Put the Colab install cell first in every notebook of the book (idempotent).

    python tools/colab_cell.py --url https://github.com/ORG/REPO --ref main
    python tools/colab_cell.py --url https://github.com/ORG/REPO --ref 0123abcd...
    python tools/colab_cell.py                      # the cell, naming no repository
    python tools/colab_cell.py --check --url URL --ref REF   # exit 1 if a notebook differs

A Colab launch button opens a notebook straight from GitHub, alone: without the package and
without book/data/. The cell this script writes makes such a notebook self-sufficient on Colab
(and only there): it clones the repository named in the cell, checks out the commit or branch
named in the cell, installs the package from that checkout with its Triton extra, and moves
into the checkout's book/ folder, where the chapters find their data. Anywhere else (a laptop,
CI's nbval, `make execute`, the GPU report) it imports three modules, sets two strings and
prints nothing.

The cell keeps the id `colab-install`: a second run rewrites that cell in place (moving it back
to the top if needed), so the script can be re-run after any notebook is edited or added. It
carries the tag `remove-cell` (the online book leaves it out; the notebook a reader downloads
or opens on Colab keeps it), no nbdev directive (nothing is exported), no outputs and
execution count 1: it is the first cell a run executes, and off Colab it prints nothing, which
is what nbval compares. Nothing else in a notebook changes: the file is written back with
nbformat's layout, byte for byte.
"""
import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELL_ID = "colab-install"
TAGS = ["remove-cell"]
#: What may be written into the cell: an https URL of plain path segments, and a git ref
#: (a branch name or a commit), so that the cell's two strings never need escaping.
URL_RE = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~-]+)+")
REF_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*")

TEMPLATE = '''\
# On Google Colab: fetch the book's repository at the commit (or branch) named
# below, install its package with the Triton kernels, and work in its book/
# folder, where the chapters find their data. Anywhere else this cell does
# nothing.
import importlib.util, os, shutil, subprocess, sys

# The repository and the commit or branch, both written by tools/colab_cell.py:
REPOSITORY = {repository}
REF = {ref}
if os.path.isdir("/content") and "google.colab" in sys.modules:
    src = "/content/kimi-mlp"
    if importlib.util.find_spec("kimi_mlp") is None:
        if not (REPOSITORY and REF):
            raise RuntimeError("set REPOSITORY and REF above: this copy of "
                               "the notebook names no repository to "
                               "install kimi-mlp from")
        shutil.rmtree(src, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "-q"]
        for cmd in (["git", "clone", "-q", "--filter=blob:none", REPOSITORY,
                     src],
                    ["git", "-C", src, "checkout", "-q", REF],
                    pip + [src + "[kernels]"]):
            subprocess.run(cmd, check=True)
        importlib.invalidate_caches()
    os.chdir(src + "/book")'''


def check_target(url: str, ref: str) -> None:
    "Refuse what the cell cannot hold verbatim: both empty, or a plain URL and a git ref."
    if not url and not ref:
        return
    if not URL_RE.fullmatch(url):
        raise ValueError(f"expected an https URL of a repository, got {url!r}")
    if not REF_RE.fullmatch(ref) or ".." in ref or ref.endswith((".", "/", ".lock")):
        raise ValueError(f"expected a branch name or a commit, got {ref!r}")


def cell_source(url: str = "", ref: str = "") -> str:
    "The install cell's code, naming repository `url` at `ref` (both empty: none)."
    check_target(url, ref)
    return TEMPLATE.format(repository=json.dumps(url), ref=json.dumps(ref))


def install_cell(url: str = "", ref: str = "") -> dict:
    "The install cell as nbformat stores it (source split into lines, keys sorted)."
    return {"cell_type": "code", "execution_count": 1, "id": CELL_ID,
            "metadata": {"tags": list(TAGS)}, "outputs": [],
            "source": cell_source(url, ref).splitlines(keepends=True)}


def read_target(cell: dict) -> tuple[str, str] | None:
    """(REPOSITORY, REF) as the install cell `cell` names them, or None when `cell` is not
    the install cell."""
    if cell.get("id") != CELL_ID or cell.get("cell_type") != "code":
        return None
    values = {}
    for node in ast.parse("".join(cell["source"])).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in ("REPOSITORY", "REF")):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values.get("REPOSITORY"), values.get("REF")


def with_install_cell(nb: dict, url: str = "", ref: str = "") -> dict:
    "`nb` with the install cell first, exactly once; every other cell as it was."
    rest = [c for c in nb["cells"] if c.get("id") != CELL_ID]
    return {**nb, "cells": [install_cell(url, ref), *rest]}


def dumps(nb: dict) -> str:
    "A notebook in nbformat's on-disk layout (indent 1, keys sorted, UTF-8, final newline)."
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def notebooks(book_dir: Path) -> list[Path]:
    return sorted(Path(book_dir).glob("*.ipynb"))


def write_all(book_dir: Path, url: str = "", ref: str = "") -> list[Path]:
    "Put the install cell first in every notebook of `book_dir`; return those rewritten."
    check_target(url, ref)
    changed = []
    for path in notebooks(book_dir):
        old = path.read_text(encoding="utf-8")
        new = dumps(with_install_cell(json.loads(old), url, ref))
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def stale(book_dir: Path, url: str = "", ref: str = "") -> list[Path]:
    "Notebooks of `book_dir` whose first cell is not the install cell for `url` at `ref`."
    check_target(url, ref)
    want = install_cell(url, ref)
    return [p for p in notebooks(book_dir)
            if (json.loads(p.read_text(encoding="utf-8"))["cells"] or [None])[0] != want]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/colab_cell.py", description=__doc__
                                .split("\n\n")[0])
    p.add_argument("--url", default="", help="the repository, https://github.com/ORG/REPO")
    p.add_argument("--ref", default="", help="the commit or branch the cell installs")
    p.add_argument("--book", type=Path, default=ROOT / "book", help="the notebooks' folder")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a notebook's first cell differs")
    a = p.parse_args(argv)
    if bool(a.url) != bool(a.ref):
        p.error("give --url and --ref together, or neither")
    try:
        if a.check:
            bad = stale(a.book, a.url, a.ref)
            for path in bad:
                print(f"{path.name}: the first cell is not the install cell for "
                      f"{a.url or 'no repository'} at {a.ref or '-'}", file=sys.stderr)
            return 1 if bad else 0
        for path in write_all(a.book, a.url, a.ref):
            print(f"wrote the install cell into {path.name}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
