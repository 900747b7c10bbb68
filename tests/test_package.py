"""The package installs and imports with its runtime dependencies alone."""
import subprocess
import sys
import textwrap
from pathlib import Path

import kimi_mlp

# Authoring and test tools that must never be needed to import kimi_mlp.
FORBIDDEN = ["nbdev", "fastcore", "execnb", "IPython", "ipykernel", "jupyter_book", "jupyter_core",
             "nbformat", "nbclient", "matplotlib", "transformers", "pytest"]

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
    # issue 15 (imported lazily: chapter 10's module imports the kernels)
    "TensorParallelFFN", "load_dense_shard", "tp_ffn_block",
    # issue 21 (imported lazily: chapter 11's module imports the kernels)
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
        for m in pkgutil.iter_modules(kimi_mlp.__path__):
            if m.name not in ("__main__",):
                importlib.import_module("kimi_mlp." + m.name)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_public_api():
    missing = [name for name in PUBLIC_API if not hasattr(kimi_mlp, name)]
    assert not missing, f"kimi_mlp does not export {missing}"


def _imported_modules(path: Path, package: set[str]) -> set[str]:
    "The package's modules `path` imports, anywhere in it (inside functions too)."
    import ast
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names
                    if a.name.startswith("kimi_mlp.")}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 and mod:
                out.add(mod.split(".")[0])
            elif node.level == 1 or mod == "kimi_mlp":
                out |= {a.name for a in node.names}
            elif mod.startswith("kimi_mlp."):
                out.add(mod.split(".")[1])
    return (out & package) - {path.stem}


def test_the_import_graph_has_no_cycle():
    """Modules import only downward: chapters from earlier chapters, appendices from the
    chapters, never the other way round, counting imports inside functions as well (a
    cycle there breaks the first call that takes it, which may be a GPU's)."""
    root = Path(kimi_mlp.__file__).resolve().parent
    files = {p.stem: p for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")}
    edges = {m: _imported_modules(p, set(files)) for m, p in files.items()}
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


#: The teaching modules in the order of their chapters, with the modules they rest on
#: first (appendix A's reader; appendix C's tile tables and its adapter to Triton's
#: internals; appendix G's registry of GPU families), and appendix B's command line,
#: which chapter 10's command extends.
TEACHING = ("safetensors_io", "tiles", "triton_adapter", "gpus", "config", "rmsnorm", "block", "swiglu", "fp8",
            "checkpoint", "cli", "kernels", "fused", "bench", "parallel", "hf")


def test_teaching_modules_import_only_earlier_chapters():
    """A teaching module imports only the modules of earlier chapters (and the two data
    modules below them), never the measuring and benchmarking code of appendices C-E,
    inside functions included."""
    root = Path(kimi_mlp.__file__).resolve().parent
    package = {p.stem for p in root.glob("*.py")}
    upward = []
    for i, m in enumerate(TEACHING):
        allowed = set(TEACHING[:i])
        for n in sorted(_imported_modules(root / f"{m}.py", package) - allowed - {m}):
            upward.append(f"{m} imports {n}")
    assert not upward, upward


#: The measuring and benchmarking modules (appendices C and E), split by purpose.
HARNESS = ("measure", "provenance", "gpu_check", "report", "harness", "records", "plots",
           "tune")


def test_no_harness_function_is_longer_than_about_sixty_lines():
    import ast

    root = Path(kimi_mlp.__file__).resolve().parent
    long = []
    for m in HARNESS:
        for node in ast.walk(ast.parse((root / f"{m}.py").read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 65:
                    long.append(f"{m}.{node.name}: {n} lines")
    assert not long, long
