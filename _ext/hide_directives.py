"""Sphinx extension: hide nbdev directives from the online book.

nbdev reads lines such as ``#| export`` and ``#| default_exp config`` at the top of a code
cell. They matter to the exporter, not to a reader, so this extension removes them from every
notebook before MyST-NB parses it. A code cell that held nothing but directives (and has no
output) is dropped. The notebook files on disk are not touched.
"""
import json
import re

_DIRECTIVE = re.compile(r"^\s*#\|")


def _strip_cell(source: str) -> str:
    lines = source.splitlines(keepends=True)
    kept = [line for line in lines if not _DIRECTIVE.match(line)]
    return "".join(kept).lstrip("\n")


def strip_directives(nb: dict) -> dict:
    """Return ``nb`` with directive lines removed from its code cells."""
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            cell = dict(cell, source=_strip_cell(src))
            if not cell["source"].strip() and not cell.get("outputs"):
                continue
        cells.append(cell)
    return dict(nb, cells=cells)


def _on_source_read(app, docname, source):
    path = str(app.env.doc2path(docname))
    if not path.endswith(".ipynb"):
        return
    source[0] = json.dumps(strip_directives(json.loads(source[0])))


def setup(app):
    app.connect("source-read", _on_source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
