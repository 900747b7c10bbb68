"""Write the repository and the launch buttons into the book's _config.yml (idempotent).

    python tools/launch_config.py --url https://github.com/ORG/REPO --branch main

Jupyter Book 1 bakes its launch links into the HTML at build time, from `repository` and
`launch_buttons` in _config.yml, and expands no environment variables there; so the publishing
workflow runs this script before `make book`. The committed _config.yml names no repository:
a local `make book` builds pages without launch buttons.

The script appends one block between two marker comments, replacing the block an earlier run
wrote, so running it twice gives the same file; the rest of the file, comments included, is
left as it is. The block holds

- `repository`: `url`, `branch`, and `path_to_book: ""` (the book's root is the repository's);
- `launch_buttons`: Binder (`--binderhub-url`, mybinder.org unless given empty) and Colab.

A Colab button opens the notebook as committed on GitHub at `branch`, so its first cell (the
install cell that tools/colab_cell.py writes) must name the same repository and branch.
The script checks every notebook and turns the Colab button on only when they all do (and
the repository is on github.com, the only host Colab opens); otherwise it says which
notebooks differ and how to fix them, and the pages go out without a Colab button rather than
with one that installs something else.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colab_cell import check_target, stale  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "# >>> launch buttons: written by tools/launch_config.py; do not edit by hand\n"
END = "# <<< launch buttons\n"
COLAB_URL = "https://colab.research.google.com"
BINDERHUB_URL = "https://mybinder.org"
#: The top-level keys the block owns; the rest of the file must not set them.
KEYS = ("repository", "launch_buttons")
#: A BinderHub's address: https, a host, and an optional path.
HUB_RE = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~-]+)*/?")


def strip_block(text: str) -> str:
    "`text` without the block an earlier run appended (unchanged if there is none)."
    if BEGIN not in text:
        return text
    head, _, tail = text.partition(BEGIN)
    if END not in tail:
        raise ValueError("_config.yml has the launch block's first marker but not its last")
    return head.rstrip("\n") + "\n" + tail.partition(END)[2].lstrip("\n")


def block(url: str, branch: str, colab: bool, binderhub_url: str = BINDERHUB_URL) -> str:
    "The YAML block for repository `url` at `branch` (strings JSON-quoted: valid YAML)."
    buttons = [("notebook_interface", "classic")]
    if binderhub_url:
        buttons.append(("binderhub_url", binderhub_url))
    if colab:
        buttons.append(("colab_url", COLAB_URL))
    q = json.dumps
    return (BEGIN
            + f"repository:\n  url: {q(url)}\n  branch: {q(branch)}\n  path_to_book: \"\"\n"
            + "launch_buttons:\n"
            + "".join(f"  {k}: {q(v)}\n" for k, v in buttons)
            + END)


def configure(text: str, url: str, branch: str, colab: bool,
              binderhub_url: str = BINDERHUB_URL) -> str:
    "_config.yml's `text` with the block for `url` at `branch` in place of any earlier one."
    check_target(url, branch)
    if not url:
        raise ValueError("expected a repository URL, got none")
    if binderhub_url and not HUB_RE.fullmatch(binderhub_url):
        raise ValueError(f"expected an https URL of a BinderHub, got {binderhub_url!r}")
    rest = strip_block(text)
    taken = [k for k in KEYS if re.search(rf"^{k}\s*:", rest, re.M)]
    if taken:
        raise ValueError(f"_config.yml already sets {', '.join(taken)} outside the block "
                         "this script writes")
    new = rest.rstrip("\n") + "\n\n" + block(url, branch, colab, binderhub_url)
    conf = yaml.safe_load(new)                        # the result must read back as written
    if (conf["repository"] != {"url": url, "branch": branch, "path_to_book": ""}
            or ("colab_url" in conf["launch_buttons"]) != colab):
        raise ValueError(f"_config.yml did not read back as written: {conf}")
    return new


def colab_blockers(book_dir: Path, url: str, branch: str) -> list[str]:
    "Why a Colab button would not install what it opens (an empty list: nothing)."
    if not url.startswith("https://github.com/"):
        return [f"Colab opens notebooks from github.com only, not from {url}"]
    return [f"{p.name}: its first cell does not install {url} at {branch}"
            for p in stale(book_dir, url, branch)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/launch_config.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the repository, https://github.com/ORG/REPO")
    p.add_argument("--branch", required=True, help="the branch the links open")
    p.add_argument("--binderhub-url", default=BINDERHUB_URL,
                   help=f"the BinderHub (default {BINDERHUB_URL}; empty: no Binder button)")
    p.add_argument("--config", type=Path, default=ROOT / "_config.yml")
    p.add_argument("--book", type=Path, default=ROOT / "book", help="the notebooks' folder")
    a = p.parse_args(argv)
    try:
        check_target(a.url, a.branch)
        blockers = colab_blockers(a.book, a.url, a.branch)
        text = configure(a.config.read_text(encoding="utf-8"), a.url, a.branch,
                         colab=not blockers, binderhub_url=a.binderhub_url)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    a.config.write_text(text, encoding="utf-8")
    if blockers:
        # On GitHub Actions the prefix turns the line into a warning on the run's page.
        prefix = "::warning::" if os.environ.get("GITHUB_ACTIONS") == "true" else "warning: "
        print(f"{prefix}no Colab button: " + "; ".join(blockers[:3])
              + (f" (and {len(blockers) - 3} more)" if len(blockers) > 3 else "")
              + f". Run `python tools/colab_cell.py --url {a.url} --ref {a.branch}` "
              "and commit the notebooks.", file=sys.stderr)
    on = [b for b, wanted in (("Binder", a.binderhub_url), ("Colab", not blockers)) if wanted]
    print(f"{a.config.name}: {a.url} at {a.branch}; buttons: {', '.join(on) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
