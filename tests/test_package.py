"""The package installs and imports with its runtime dependencies alone."""
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kimi_mlp

# Authoring and test tools that must never be needed to import kimi_mlp.
FORBIDDEN = ["nbdev", "fastcore", "execnb", "IPython", "ipykernel", "jupyter_book", "jupyter_core",
             "nbformat", "nbclient", "matplotlib", "transformers", "pytest", "jsonschema"]

PUBLIC_API = [
    # issue 2
    "KimiK2Config", "count_parameters",
    # issue 3
    "rms_norm", "RMSNorm", "ResidualBlock", "GeluMLP", "silu", "swiglu", "DenseMLP",
    # issue 4
    "quantize_weight_blockwise", "dequantize_weight_blockwise", "quantize_activation", "Fp8Linear",
    "Fp8DenseMLP", "load_dense_block", "write_synthetic_checkpoint",
    # issue 5 (imported lazily: they need Triton)
    "FusedFp8DenseMLP", "fused_ffn_block",
    # issue 15 (imported lazily: chapter 12's module imports the kernels)
    "TensorParallelFFN", "load_dense_shard", "tp_ffn_block",
    # issue 21 (imported lazily: chapter 13's module imports the kernels)
    "fuse_ffn", "FusedMLP",
]


def test_import_needs_no_authoring_tools():
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {FORBIDDEN!r}:
                    raise ImportError("blocked for this test: " + name)
        sys.meta_path.insert(0, Block())
        import pkgutil, kimi_mlp
        for m in pkgutil.walk_packages(kimi_mlp.__path__, "kimi_mlp."):
            if not m.name.endswith(".__main__"):
                importlib.import_module(m.name)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_public_api():
    missing = [name for name in PUBLIC_API if not hasattr(kimi_mlp, name)]
    assert not missing, f"kimi_mlp does not export {missing}"


def _modules(root: Path) -> dict[str, Path]:
    """The package's modules by dotted name relative to it, subpackages included
    (`kernels.gemm` for kimi_mlp/kernels/gemm.py, `kernels` for its `__init__`), without
    the top `__init__` and `__main__`."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:      # a subpackage: its name
            out[".".join(parts[:-1])] = p
        elif parts[-1] not in ("__init__", "__main__"):
            out[".".join(parts)] = p
    return out


def _resolve(name: str, package: set[str]) -> str | None:
    "The package module a dotted name (relative to kimi_mlp) lies in: its longest prefix."
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in package:
            return ".".join(parts[:n])
    return None


def _imported_modules(path: Path, package: set[str], root: Path | None = None) -> set[str]:
    """The package's modules `path` imports, anywhere in it (inside functions too), by
    their dotted names relative to the package (`root`: the package's folder)."""
    import ast
    root = root or path.parent
    here = list(path.relative_to(root).with_suffix("").parts[:-1])   # its subpackage
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name[len("kimi_mlp."):] for a in node.names
                      if a.name.startswith("kimi_mlp.")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = here[:len(here) - node.level + 1] if node.level > 1 else here
                mod = ".".join(base + ([mod] if mod else []))
            elif mod == "kimi_mlp" or mod.startswith("kimi_mlp."):
                mod = mod[len("kimi_mlp."):]
            else:
                continue
            names += [f"{mod}.{a.name}" if mod else a.name for a in node.names]
            names.append(mod)
    parts = path.relative_to(root).with_suffix("").parts
    me = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)   # a package: its name
    return {m for m in (_resolve(n, package) for n in names if n) if m} - {me}


def test_the_import_graph_has_no_cycle():
    """Modules import only downward: chapters from earlier chapters, appendices from the
    chapters, never the other way round, counting imports inside functions as well (a
    cycle there breaks the first call that takes it, which may be a GPU's). Modules in
    subpackages are counted under their dotted names."""
    root = Path(kimi_mlp.__file__).resolve().parent
    files = _modules(root)
    edges = {m: _imported_modules(p, set(files), root) for m, p in files.items()}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join(path[path.index(n):] + [m, n]))
            elif n not in state:
                visit(n, path + [m])
        state[m] = "done"

    for m in sorted(files):
        if m not in state:
            visit(m, [])
    assert not cycles, cycles


def test_the_import_graph_reads_subpackages(tmp_path):
    "The graph's reader resolves absolute, relative and dotted imports in subpackages."
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "gemm.py").write_text(
        "from ..tiles import x\nfrom . import act\nimport kimi_mlp.config\n"
        "def f():\n    from kimi_mlp.kernels.act import y\n")
    (tmp_path / "kernels" / "act.py").write_text("")
    (tmp_path / "tiles.py").write_text("from .kernels import gemm\n")
    (tmp_path / "config.py").write_text("")
    files = _modules(tmp_path)
    assert set(files) == {"kernels.gemm", "kernels.act", "tiles", "config"}
    (tmp_path / "kernels" / "__init__.py").write_text("from .gemm import *\n")
    assert _modules(tmp_path)["kernels"] == tmp_path / "kernels" / "__init__.py"
    assert _imported_modules(files["kernels.gemm"], set(files), tmp_path) == {
        "tiles", "kernels.act", "config"}
    assert _imported_modules(files["tiles"], set(files), tmp_path) == {"kernels.gemm"}


#: The teaching modules in the order of their chapters, with the modules they rest on
#: first (appendix A's reader; appendix C's tile tables and its adapter to Triton's
#: internals; appendix G's registry of GPU families), and appendix B's command line,
#: which chapter 12's command extends (its options in parallel_cli, which imports no
#: kernels, so that --help needs no Triton).
TEACHING = ("safetensors_io", "tiles", "triton_adapter", "gpus", "config", "rmsnorm", "block", "swiglu", "fp8",
            "checkpoint", "cli", "kernels.runtime", "kernels.numerics", "kernels.dequant",
            "kernels.norm_quant", "kernels.plan", "kernels.gemm", "kernels.tensor_cores",
            "kernels.epilogues",
            "kernels.w8a16", "kernels", "fused", "bench", "parallel_cli", "parallel", "hf")


def test_teaching_modules_import_only_earlier_chapters():
    """A teaching module imports only the modules of earlier chapters (and the two data
    modules below them), never the measuring and benchmarking code of appendices C-E,
    inside functions included."""
    root = Path(kimi_mlp.__file__).resolve().parent
    files = _modules(root)
    upward = []
    for i, m in enumerate(TEACHING):
        allowed = set(TEACHING[:i])
        for n in sorted(_imported_modules(files[m], set(files), root) - allowed - {m}):
            upward.append(f"{m} imports {n}")
    assert not upward, upward


#: The measuring and benchmarking modules (appendices C and E), split by purpose, in
#: kimi_mlp.apparatus.
HARNESS = ("measure", "provenance", "gpu_check", "report", "harness_cli", "harness",
           "records", "plots", "tune")
#: Everything the appendices export to measure, compile and report: the subpackage
#: kimi_mlp.apparatus, which no teaching module imports.
APPARATUS = HARNESS + ("codegen", "gluon_codegen")


def test_no_harness_function_is_longer_than_about_sixty_lines():
    import ast

    root = Path(kimi_mlp.__file__).resolve().parent
    long = []
    for m in HARNESS:
        for node in ast.walk(ast.parse((root / "apparatus" / f"{m}.py").read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 65:
                    long.append(f"{m}.{node.name}: {n} lines")
    assert not long, long


def test_the_apparatus_is_a_subpackage_of_its_own():
    """appendices C to F's measuring modules sit in kimi_mlp.apparatus, the chapters'
    kernels in kimi_mlp.kernels; no module of either is left at the top."""
    root = Path(kimi_mlp.__file__).resolve().parent
    files = _modules(root)
    assert {f"apparatus.{m}" for m in APPARATUS} <= set(files)
    assert not set(APPARATUS) & set(files)
    kernels = {m for m in files if m.startswith("kernels.")}
    assert kernels == {f"kernels.{m}" for m in ("runtime", "numerics", "dequant",
                                                 "norm_quant", "plan", "gemm", "tensor_cores",
                                                 "epilogues", "w8a16", "gluon")}
    assert not {"gluon", "measure", "codegen"} & set(files)


#: Imports every module of the installed package (subpackages included) and prints where
#: kimi_mlp came from; run by the wheel's own virtual environment, outside the tree.
_IMPORT_ALL = """
import importlib, pkgutil, sys, kimi_mlp
for m in pkgutil.walk_packages(kimi_mlp.__path__, "kimi_mlp."):
    if not m.name.endswith(".__main__"):
        importlib.import_module(m.name)
print(kimi_mlp.__file__)
print(sorted(n for n in sys.modules if n.startswith("kimi_mlp.")))
"""


@pytest.mark.slow
def test_the_wheel_installs_every_module(tmp_path):
    """The wheel built from this tree, installed with --no-deps into a fresh virtual
    environment (system site-packages for torch and the rest; no network: --no-index),
    imports every module of the tree's package from a folder outside the tree, from the
    environment's copy, and carries the package data (configs/*.json)."""
    import ast
    import os
    import venv
    import zipfile

    root = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"          # a copy: the build writes build/ and egg-info beside it
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(root / "kimi_mlp", src / "kimi_mlp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                          "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, text=True, env=env, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("kimi_mlp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tree = sorted(p.relative_to(root).as_posix() for p in (root / "kimi_mlp").rglob("*")
                  if p.suffix == ".py" or (p.suffix == ".json" and p.parent.name == "configs"))
    assert not set(tree) - set(names), f"left out of the wheel: {set(tree) - set(names)}"

    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    # The base Python's site-packages come with system_site_packages; torch and the rest
    # live in this (virtual) environment's, which a .pth line appends after the new one's.
    # A plain line runs none of the .pth files there (an editable install of kimi_mlp).
    (site,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "outer_environment.pth").write_text("\n".join(ours) + "\n")
    # This pip installs into the new environment (`--python`): no ensurepip there.
    subprocess.run(pip + ["--python", str(python), "install", "--no-deps", "--no-index",
                          "-q", str(wheel)],
                   check=True, capture_output=True, text=True, env=env, timeout=300)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run = subprocess.run([str(python), "-c", _IMPORT_ALL], cwd=outside, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    where, imported = run.stdout.splitlines()[-2:]
    assert Path(where).resolve().is_relative_to((tmp_path / "venv").resolve()), where
    expected = {".".join(Path(n).with_suffix("").parts) for n in tree if n.endswith(".py")}
    expected -= {"kimi_mlp.__init__", "kimi_mlp.__main__"}
    expected = {n.removesuffix(".__init__") for n in expected}
    missing = expected - set(ast.literal_eval(imported))
    assert not missing, f"not imported from the wheel: {sorted(missing)}"

    # gpu-report from the installed copy: the notebooks are skipped in one line that
    # says why and what to run instead, the step it could run passes, and it exits 0
    report = subprocess.run([str(python), "-m", "kimi_mlp", "gpu-report", "--cpu-smoke",
                             "--steps", "gpucheck,notebooks", "--m", "1",
                             "--out", str(tmp_path / "report")],
                            cwd=outside, env=env, capture_output=True, text=True,
                            timeout=600)
    lines = report.stdout.splitlines()
    assert report.returncode == 0, (report.stdout[-2000:], report.stderr[-2000:])
    (skip,) = [line for line in lines if line.startswith("notebooks: ")]
    assert "an installed copy" in skip and "--steps notebooks" in skip, skip
    assert "gpucheck: passed" in lines and lines[-1].startswith(
        "gpu-report: every step it could run passed"), lines
    # the notebooks alone: nothing could run there, and that is not a pass
    alone = subprocess.run([str(python), "-m", "kimi_mlp", "gpu-report", "--cpu-smoke",
                            "--steps", "notebooks", "--out", str(tmp_path / "alone")],
                           cwd=outside, env=env, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 1, alone.stdout[-2000:]
    assert alone.stdout.splitlines()[-1].startswith("gpu-report: NO STEP COULD RUN HERE")


def test_every_kernel_module_is_short():
    """Each module of `kimi_mlp.kernels` is one chapter's idea (or one appendix's), short
    enough to read beside its chapter: at most 600 lines."""
    folder = Path(kimi_mlp.__file__).parent / "kernels"
    long = {p.name: n for p in folder.glob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_each_kernel_module_comes_from_one_chapter():
    """A chapter exports its own modules: no module of `kimi_mlp.kernels` is assembled from
    the cells of two notebooks."""
    import re
    folder = Path(kimi_mlp.__file__).parent / "kernels"
    for p in folder.glob("*.py"):
        sources = set(re.findall(r"^# %% \.\./\.\./book/(\S+\.ipynb)", p.read_text(), re.M))
        assert len(sources) <= 1, (p.name, sources)


def test_dir_and_all_list_the_lazy_names():
    """`dir(kimi_mlp)` and `__all__` list the names imported on first use (the fused block,
    the tensor-parallel and Hugging Face paths, compile_only), and every name in `__all__`
    is there to take."""
    lazy = set(kimi_mlp._LAZY)
    assert lazy <= set(dir(kimi_mlp)) and lazy <= set(kimi_mlp.__all__)
    assert set(PUBLIC_API) <= set(kimi_mlp.__all__)
    assert all(hasattr(kimi_mlp, name) for name in kimi_mlp.__all__)
    assert len(set(kimi_mlp.__all__)) == len(kimi_mlp.__all__)


#: A fresh Python of the base install: Triton cannot be imported.
_NO_TRITON = "import sys\nsys.modules['triton'] = None\n"


@pytest.mark.parametrize("statement, names", [
    ("from kimi_mlp import fused_ffn_block", "kimi_mlp.fused_ffn_block needs triton"),
    ("import kimi_mlp; kimi_mlp.FusedFp8DenseMLP", "kimi_mlp.FusedFp8DenseMLP needs triton"),
    ("from kimi_mlp import compile_only", "kimi_mlp.compile_only needs triton"),
    ("import kimi_mlp.fused", "kimi_mlp's kernels need triton")])
def test_a_name_that_needs_triton_says_which_extra_in_one_line(statement, names):
    """Without Triton, a name that needs it raises an ImportError whose message is one line
    naming kimi-mlp[kernels]; a lazy name's traceback is two frames (the import chain
    behind it is not shown)."""
    run = subprocess.run([sys.executable, "-c", _NO_TRITON + statement],
                         capture_output=True, text=True)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ") and names in last, run.stderr
    assert last.endswith("which is not installed: pip install 'kimi-mlp[kernels]'")
    if statement.startswith(("from kimi_mlp import", "import kimi_mlp;")):
        assert run.stderr.count('File "') == 2, run.stderr        # the line, __getattr__


def test_without_triton_a_star_import_takes_what_there_is():
    star = subprocess.run([sys.executable, "-c", _NO_TRITON + "from kimi_mlp import *\n"
                           "print('fused_ffn_block' in dir(), 'KimiK2Config' in dir())"],
                          capture_output=True, text=True)
    assert star.returncode == 0 and star.stdout.split() == ["False", "True"], star.stderr


def test_the_hf_extra_pins_the_transformers_the_tests_use():
    """`pip install kimi-mlp[hf]` brings the transformers version requirements.txt pins for
    the tests (the Hugging Face path and README example 2), and the kernels."""
    import re
    root = Path(kimi_mlp.__file__).parent.parent
    (hf,) = re.findall(r"^hf = \[(.*)\]$", (root / "pyproject.toml").read_text(), re.M)
    extras = {"hf": re.findall(r'"([^"]+)"', hf)}
    pins = [line.split("#")[0].strip() for line in
            (Path(kimi_mlp.__file__).parent.parent / "requirements.txt").read_text().splitlines()]
    (tested,) = [p for p in pins if p.startswith("transformers==")]
    assert tested in extras["hf"] and any(r.startswith("triton") for r in extras["hf"])
    from kimi_mlp.cli import EXTRAS
    assert EXTRAS["transformers"] == "hf"
