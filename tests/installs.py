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


def blocked(extras: tuple[str, ...] = ()) -> tuple[set[str], set[str]]:
    """(top-level modules, distributions) installed here but outside `closure(extras)`:
    IPython, Jupyter, nbdev, pytest, transformers and the like."""
    keep = closure(extras)
    modules = {module for module, dists in md.packages_distributions().items()
               if not any(_norm(d) in keep for d in dists)}
    dists = {_norm(d.metadata["Name"]) for d in md.distributions()} - keep
    return modules, dists


_SITECUSTOMIZE = """\
# Written by tests/installs.py: the modules and distributions below are not found, as if
# they were not installed (they are not dependencies of kimi-mlp{extras}). Python's path
# finder is wrapped rather than put behind a finder that raises, so that a library's
# importlib.util.find_spec(name) answers None for them, as it does without them.
import re
import sys
from importlib.machinery import PathFinder

_MODULES = frozenset({modules})
_DISTS = frozenset({dists})


class _DeclaredOnly:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in _MODULES:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
            if name not in _DISTS:
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [_DeclaredOnly if f is PathFinder else f for f in sys.meta_path]
"""


def only_declared(folder: Path, extras: tuple[str, ...] = ()) -> dict:
    """Environment variables for a Python (and every Python it starts) that can import
    only what kimi-mlp[extras] declares: a `sitecustomize` on PYTHONPATH hides the rest."""
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"[{','.join(extras)}]" if extras else ""
    modules, dists = blocked(extras)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(
        extras=tag, modules=json.dumps(sorted(modules)), dists=json.dumps(sorted(dists))))
    return {"PYTHONPATH": str(folder)}
