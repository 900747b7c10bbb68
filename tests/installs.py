"""What a user's install holds: a Python in which only kimi-mlp's declared dependencies
(with the extras asked for) can be imported, for the tests that check a command works
with exactly those."""
import importlib.metadata as md
import json
import re
from pathlib import Path

from packaging.requirements import Requirement


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(extras: tuple[str, ...] = ()) -> set[str]:
    """The distributions that `pip install kimi-mlp[extras]` installs (normalized names),
    kimi-mlp's own among them: its requirements, theirs, and so on."""
    seen, todo = set(), [("kimi-mlp", tuple(extras))]
    while todo:
        name, wanted = todo.pop()
        key = _norm(name)
        if (key, wanted) in seen:
            continue
        seen.add((key, wanted))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue                                    # an optional one not installed
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, tuple(sorted(req.extras))))
    return {key for key, _ in seen}


def blocked_modules(extras: tuple[str, ...] = ()) -> set[str]:
    """Top-level modules of the installed distributions outside `closure(extras)`:
    IPython, Jupyter, nbdev, pytest, transformers and the like."""
    keep = closure(extras)
    return {module for module, dists in md.packages_distributions().items()
            if not any(_norm(d) in keep for d in dists)}


_SITECUSTOMIZE = """\
# Written by tests/installs.py: imports of the modules below fail, as if their
# distributions were not installed (they are not dependencies of kimi-mlp{extras}).
import sys

_BLOCKED = frozenset({blocked})


class _NotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled)
"""


def only_declared(folder: Path, extras: tuple[str, ...] = ()) -> dict:
    """Environment variables for a Python (and every Python it starts) that can import
    only what kimi-mlp[extras] declares: a `sitecustomize` on PYTHONPATH blocks the rest."""
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"[{','.join(extras)}]" if extras else ""
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(
        extras=tag, blocked=json.dumps(sorted(blocked_modules(extras)))))
    return {"PYTHONPATH": str(folder)}
