"""The Colab button: the install cell that tools/colab_cell.py puts first in every notebook, the
launch block that tools/launch_config.py writes into _config.yml, and a build of the whole book
(from its stored outputs, about ten seconds) for a test repository, whose pages must link to
Colab and whose downloadable notebooks must install from that repository at that commit."""
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import colab_cell  # noqa: E402
import launch_config  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
URL, BRANCH = "https://github.com/example-org/kimi-mlp", "main"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def first_cell(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["cells"][0]


# -- the committed notebooks ---------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_starts_with_the_install_cell(path):
    cell = first_cell(path)
    target = colab_cell.read_target(cell)
    assert target is not None, f"{path.name}: run `python tools/colab_cell.py`"
    assert cell == colab_cell.install_cell(*target), f"{path.name}: the cell was edited"
    # Left out of the pages, never exported by nbdev, nothing stored for nbval to compare.
    assert cell["metadata"]["tags"] == ["remove-cell"] and cell["outputs"] == []
    assert not any(line.startswith("#|") for line in cell["source"])


def test_all_notebooks_name_the_same_repository():
    assert len({colab_cell.read_target(first_cell(p)) for p in NOTEBOOKS}) == 1


# -- the cell itself -----------------------------------------------------------------------

def run_cell(source: str) -> str:
    "Execute the cell's code as a kernel would, in a fresh namespace; return its stdout."
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        exec(compile(source, "<install cell>", "exec"), {"__name__": "__main__"})
    return out.getvalue()


def test_off_colab_the_cell_does_nothing(monkeypatch, tmp_path):
    def refuse(*a, **k):
        raise AssertionError(f"the cell ran something off Colab: {a}")

    monkeypatch.chdir(tmp_path)
    for name in ("run", "Popen", "call", "check_call"):
        monkeypatch.setattr(subprocess, name, refuse)
    monkeypatch.setattr(os, "chdir", refuse)
    monkeypatch.setattr(shutil, "rmtree", refuse)
    assert run_cell(colab_cell.cell_source(URL, COMMIT)) == ""
    assert run_cell(colab_cell.cell_source()) == ""


@pytest.fixture
def colab(monkeypatch):
    """A stand-in Colab: /content exists, google.colab is imported, kimi_mlp is not
    installed; commands, removals and directory changes are recorded, not carried out."""
    calls = []
    real_isdir = os.path.isdir
    monkeypatch.setattr(os.path, "isdir", lambda p: p == "/content" or real_isdir(p))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    import importlib.util
    real_find_spec = importlib.util.find_spec
    installed = {"kimi_mlp": False}

    def find_spec(name, *a):
        if name == "kimi_mlp":
            return object() if installed["kimi_mlp"] else None
        return real_find_spec(name, *a)

    def run(cmd, check=False, **k):
        assert check, "a failed command must stop the cell"
        calls.append(("run", list(cmd)))
        if "pip" in cmd:
            installed["kimi_mlp"] = True
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(shutil, "rmtree", lambda p, **k: calls.append(("rmtree", p)))
    monkeypatch.setattr(os, "chdir", lambda p: calls.append(("chdir", p)))
    return calls


def test_on_colab_the_cell_installs_that_commit_and_moves_into_book(colab):
    source = colab_cell.cell_source(URL, COMMIT)
    run_cell(source)
    src = "/content/kimi-mlp"
    assert colab == [
        ("rmtree", src),
        ("run", ["git", "clone", "-q", "--filter=blob:none", URL, src]),
        ("run", ["git", "-C", src, "checkout", "-q", COMMIT]),
        ("run", [sys.executable, "-m", "pip", "install", "-q", src + "[kernels]"]),
        ("chdir", src + "/book")]
    colab.clear()
    run_cell(source)                        # run again: installed, so only the move
    assert colab == [("chdir", src + "/book")]


def test_on_colab_a_cell_without_a_repository_says_so(colab):
    with pytest.raises(RuntimeError, match="set REPOSITORY and REF"):
        run_cell(colab_cell.cell_source())
    assert colab == []


# -- the tools -----------------------------------------------------------------------------

def test_colab_cell_is_idempotent_and_touches_nothing_else(tmp_path):
    for name in ("intro.ipynb", "01_config.ipynb"):
        shutil.copy(ROOT / "book" / name, tmp_path / name)
    before = {p.name: json.loads(p.read_text())["cells"][1:] for p in tmp_path.glob("*")}
    assert len(colab_cell.write_all(tmp_path, URL, COMMIT)) == 2
    assert colab_cell.write_all(tmp_path, URL, COMMIT) == []          # a second run: no change
    assert colab_cell.stale(tmp_path, URL, COMMIT) == []
    assert colab_cell.stale(tmp_path, URL, BRANCH) == sorted(tmp_path.glob("*"))
    for p in tmp_path.glob("*"):
        cells = json.loads(p.read_text())["cells"]
        assert colab_cell.read_target(cells[0]) == (URL, COMMIT)
        assert cells[1:] == before[p.name]
    # A cell moved down (or a notebook edited around it) is put back first, once.
    nb = json.loads((tmp_path / "intro.ipynb").read_text())
    nb["cells"] = nb["cells"][1:2] + nb["cells"][:1] + nb["cells"][2:]
    (tmp_path / "intro.ipynb").write_text(colab_cell.dumps(nb))
    assert colab_cell.write_all(tmp_path, URL, BRANCH) == sorted(tmp_path.glob("*"))
    cells = json.loads((tmp_path / "intro.ipynb").read_text())["cells"]
    assert [c["id"] for c in cells].count(colab_cell.CELL_ID) == 1
    assert cells[1:] == before["intro.ipynb"]


@pytest.mark.parametrize("url, ref", [
    ("http://github.com/a/b", "main"), ("https://github.com/a/b\"; import os", "main"),
    ("https://github.com", "main"), (URL, "-main"), (URL, "a..b"), (URL, "main\n"),
    (URL, ""), ("", "main")])
def test_colab_cell_refuses_what_it_cannot_write_verbatim(url, ref):
    with pytest.raises(ValueError):
        colab_cell.cell_source(url, ref)


def test_launch_config_is_idempotent_and_keeps_the_rest_of_the_file():
    text = (ROOT / "_config.yml").read_text()
    once = launch_config.configure(text, URL, BRANCH, colab=True)
    assert launch_config.configure(once, URL, BRANCH, colab=True) == once
    assert once.startswith(text.rstrip("\n"))                     # comments and all
    conf = yaml.safe_load(once)
    assert conf["repository"] == {"url": URL, "branch": BRANCH, "path_to_book": ""}
    assert conf["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert conf["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    other = launch_config.configure(once, "https://github.com/fork/kimi-mlp", "dev",
                                    colab=False, binderhub_url="")
    assert yaml.safe_load(other)["launch_buttons"] == {"notebook_interface": "classic"}
    assert launch_config.strip_block(other) == text.rstrip("\n") + "\n"
    with pytest.raises(ValueError, match="already sets repository"):
        launch_config.configure(text + "repository:\n  url: x\n", URL, BRANCH, colab=True)


def test_no_colab_button_unless_the_committed_cells_install_what_it_opens(tmp_path):
    shutil.copy(ROOT / "book" / "intro.ipynb", tmp_path / "intro.ipynb")
    colab_cell.write_all(tmp_path, "https://github.com/other/kimi-mlp", BRANCH)
    assert launch_config.colab_blockers(tmp_path, URL, BRANCH) == [
        f"intro.ipynb: its first cell does not install {URL} at {BRANCH}"]
    colab_cell.write_all(tmp_path, URL, BRANCH)
    assert launch_config.colab_blockers(tmp_path, URL, BRANCH) == []
    assert launch_config.colab_blockers(tmp_path, "https://gitlab.com/a/b", BRANCH)


def test_the_workflow_writes_the_launch_block_then_pins_the_cells_then_builds():
    w = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    steps = w["jobs"]["build"]["steps"]
    runs = [line.strip() for s in steps for line in s.get("run", "").splitlines()]
    order = [next(i for i, r in enumerate(runs) if key in r)
             for key in ("make venv", "tools/launch_config.py", "tools/colab_cell.py",
                         "make book")]
    assert order == sorted(order), runs
    env = next(s["env"] for s in steps if "tools/launch_config.py" in s.get("run", ""))
    assert env == {"REPOSITORY_URL": "${{ github.server_url }}/${{ github.repository }}",
                   "BRANCH": "${{ github.ref_name }}", "COMMIT": "${{ github.sha }}"}
    assert '--branch "$BRANCH"' in runs[order[1]] and '--ref "$COMMIT"' in runs[order[2]]


# -- the book, built for a test repository -------------------------------------------------

#: The pictures drawn from the code's numbers, by the sentence that introduces each.
FIGURES = {"01_config.ipynb": "Where those three matrices sit in the model",
           "08_gemm.ipynb": "The figure follows one output element through the loop",
           "13_hf.ipynb": "The two sizes side by side",
           "appendix_f_gluon.ipynb": "drawn for the down GEMM"}


def test_the_built_book_links_each_notebook_to_colab(tmp_path):
    """What the publishing workflow does, on a copy of the book: the committed cells name
    the repository and branch (as a maintainer's `colab_cell.py --ref main` leaves them), the
    launch block goes into _config.yml, the cells are pinned to the commit, and the book is
    built with warnings as errors."""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, site / name)
    shutil.copytree(ROOT / "_ext", site / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "book", site / "book",
                    ignore=shutil.ignore_patterns("_build", ".ipynb_checkpoints"))
    tools = [sys.executable, str(ROOT / "tools" / "colab_cell.py"), "--book", str(site / "book")]
    subprocess.run([*tools, "--url", URL, "--ref", BRANCH], check=True, capture_output=True)
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "launch_config.py"), "--url", URL,
                        "--branch", BRANCH, "--config", str(site / "_config.yml"),
                        "--book", str(site / "book")], capture_output=True, text=True)
    assert p.returncode == 0 and "buttons: Binder, Colab" in p.stdout, p.stdout + p.stderr
    subprocess.run([*tools, "--url", URL, "--ref", COMMIT], check=True, capture_output=True)
    jb = Path(sys.executable).parent / "jupyter-book"
    flags = ["--builder", "html", "-W", "-n", "--keep-going"]
    # the Makefile's `make book` builds with the same flags: CI builds the book only here
    assert f"jupyter-book build . {' '.join(flags)}" in (ROOT / "Makefile").read_text()
    p = subprocess.run([str(jb), "build", str(site), *flags], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    html = site / "_build" / "html"
    org_repo = URL.removeprefix("https://github.com/")
    for nb in NOTEBOOKS:
        page = (html / "book" / nb.name).with_suffix(".html").read_text(encoding="utf-8")
        link = (f'href="https://colab.research.google.com/github/{org_repo}/blob/{BRANCH}/'
                f'book/{nb.name}"')
        assert link in page, f"{nb.name}: no Colab link {link}"
        assert "REPOSITORY" not in page, f"{nb.name}: the install cell shows on the page"
        download = json.loads((html / "_sources" / "book" / nb.name).read_text())
        assert colab_cell.read_target(download["cells"][0]) == (URL, COMMIT), nb.name
    # The pictures drawn from the code's numbers render: each page shows an image right
    # after the sentence that introduces it, and the image file is in the build.
    for name, lead in FIGURES.items():
        page = (html / "book" / name).with_suffix(".html").read_text(encoding="utf-8")
        assert lead in page, f"{name}: no {lead!r}"
        img = re.search(r'<img [^>]*src="([^"]+)"', page[page.index(lead):][:4000])
        assert img and (html / "book" / img.group(1)).is_file(), f"{name}: no picture"
