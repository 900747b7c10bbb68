"""One explicit target (chapter 7's `Target`): what a launch plans and compiles for comes
from the tensor's device, from KIMI_MLP_TARGET read once at import, or from
`compile_only`; every launch goes through `launch`; nothing else touches Triton."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kimi_mlp
from kimi_mlp import gpus, kernels

PACKAGE = Path(kimi_mlp.__file__).resolve().parent
ROOT = PACKAGE.parent


def _python(code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "KIMI_MLP_TARGET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**base, **env}, timeout=300)


def test_a_target_is_one_small_immutable_value():
    t = kernels.target_named("sm_89")
    assert (t.arch, t.capability, t.sms) == (89, (8, 9), gpus.default_gpu(89).sms)
    assert t.name == "sm_89" and kernels.target_named(90, sms=8).name == "sm_90a"
    assert kernels.target_named("sm_90a", sms=132) == kernels.Target(90, (9, 0), 132)
    with pytest.raises(AttributeError):
        t.sms = 1                                          # frozen


@pytest.mark.parametrize("args, match", [
    (("sm_70",), r"target: expected one of \['sm_75', .*got 'sm_70'"),
    (("hopper",), r"target: expected one of .*got 'hopper'"),
    (("sm_89", 0), r"sms: expected a positive int, got 0"),
    (("sm_89", True), r"sms: expected a positive int, got True"),
])
def test_a_bad_target_is_refused_in_one_line(args, match):
    with pytest.raises(ValueError, match=match):
        kernels.target_named(*args)


def test_a_capability_must_belong_to_its_family():
    with pytest.raises(ValueError, match=r"capability: expected one of family 90's"):
        kernels.Target(90, (8, 9), 132)
    assert kernels.Target(86, (8, 7), 16).name == "sm_86"     # Orin: the 8.6 family


def test_without_cuda_the_interpreter_plans_as_the_setting_names():
    cpu = torch.device("cpu")
    assert kernels.device_target(cpu) is kernels.INTERPRETER_TARGET
    assert (kernels.device_arch(cpu), kernels.device_sms(cpu)) == (
        kernels.INTERPRETER_TARGET.arch, 1)
    code = ("import torch, kimi_mlp.kernels as k; "
            "print(k.device_arch(torch.device('cpu')), k.device_sms(torch.device('cpu')))")
    assert _python(code).stdout.split() == ["90", "1"]            # the default: Hopper
    assert _python(code, KIMI_MLP_TARGET="sm_80").stdout.split() == ["80", "1"]
    bad = _python(code, KIMI_MLP_TARGET="a100")
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == (
        "ValueError: KIMI_MLP_TARGET: expected one of ['sm_75', 'sm_80', 'sm_86', "
        "'sm_89', 'sm_90a', 'sm_100a', 'sm_120a'], got 'a100'")


def test_the_setting_is_read_once_at_import(monkeypatch):
    "Changing the variable later changes nothing: no call reads the environment."
    before = kernels.device_target(torch.device("cpu"))
    monkeypatch.setenv("KIMI_MLP_TARGET", "sm_75")
    assert kernels.device_target(torch.device("cpu")) is before


def test_compile_only_needs_the_compiler():
    assert kernels.INTERPRETED
    with pytest.raises(RuntimeError, match=r"compile_only: the kernels were decorated "
                                           r"for Triton's interpreter"):
        with kernels.compile_only("sm_89"):
            pass
    assert kernels._MODE.get() is None


def test_stubbed_launches_run_nothing_and_plan_for_the_target_given():
    a = torch.zeros(4, 128, dtype=kernels.FP8_DTYPE)
    s = torch.ones(4, 1)
    w = torch.zeros(256, 128, dtype=kernels.FP8_DTYPE)
    ws = torch.ones(2, 1)
    l4 = kernels.target_named("sm_89")
    with kernels.launches_stubbed(l4):
        assert kernels.device_target(torch.device("cpu")) is l4
        assert kernels.launch(kernels.gemm._fp8_gemm_kernel, (1,)) is None
        out = torch.full((4, 256), float("nan"), dtype=torch.bfloat16)
        kernels.fp8_gemm(a, s, w, ws, out=out)
        assert out.isnan().all()                               # nothing ran
    assert kernels._MODE.get() is None
    kernels.fp8_gemm(a, s, w, ws, out=out)
    assert (out == 0).all()                                    # runs again


def _assigned_triton_attributes(path: Path) -> list[str]:
    """Assignments (and setattr, delattr) to an attribute of something imported from
    triton, in the module at `path`: `JITFunction.run = f`, `driver._active = d`."""
    tree = ast.parse(path.read_text())
    from_triton = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            from_triton |= {(a.asname or a.name).split(".")[0] for a in node.names
                            if a.name.split(".")[0] == "triton"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("triton"):
            from_triton |= {a.asname or a.name for a in node.names}

    def root(expr):
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [
                node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and node.args):
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and root(sub) in from_triton:
                    found.append(f"{path.name}:{node.lineno}")
    return found


def test_only_the_adapter_assigns_to_triton(tmp_path):
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) if p.name != "triton_adapter.py"
             for hit in _assigned_triton_attributes(p)]
    assert not found, found
    bad = tmp_path / "bad.py"                   # what the check is for, caught
    bad.write_text("import triton.language as tl\nfrom triton.runtime import driver\n"
                   "from triton.runtime.jit import JITFunction\n"
                   "JITFunction.run = print\ndriver._active = None\n"
                   "setattr(tl, 'sum', max)\n")
    assert _assigned_triton_attributes(bad) == ["bad.py:4", "bad.py:5", "bad.py:6"]


def test_no_hidden_switch_is_left():
    "No module global changes the target, and no call reads the environment to choose."
    text = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    assert not [p for p, s in text.items() if "_COMPILE_ONLY" in s]
    assert not [p for p, s in text.items() if "KIMI_MLP_INTERPRETER_ARCH" in s]
    for p in sorted((PACKAGE / "kernels").glob("*.py")):
        for fn in ast.walk(ast.parse(text[p])):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = ast.unparse(fn)
                assert "os.environ" not in inner and "getenv" not in inner, (p, fn.name)


def test_every_kernel_starts_through_launch():
    """No `kernel[grid](...)` anywhere in the package, by name or attribute
    (`kernels.gemm._fp8_gemm_kernel[grid](...)`): one launch function, `launch_with`."""
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                f = node.func.value
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
                assert not name.endswith("_kernel"), f"{p.name}:{node.lineno}: {name}"
