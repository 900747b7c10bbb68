"""Appendix C (kimi_mlp.apparatus.measure): the book's mode switch, the notebook runner and the GPU report,
on a machine without a GPU."""
import json
import subprocess
import sys

import pytest
import torch

from kimi_mlp.apparatus import measure, report


def run_fresh(code: str, **env) -> subprocess.CompletedProcess:
    "Run `code` in a fresh Python (book_mode must run before kimi_mlp.kernels is imported)."
    import os
    full = {**os.environ, **env}
    full.pop("TRITON_INTERPRET", None) if "TRITON_INTERPRET" not in env else None
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's mode")
def test_book_mode_without_cuda_picks_the_interpreter_before_the_kernels():
    p = run_fresh("from kimi_mlp.apparatus.measure import book_mode; m = book_mode(); "
                  "import os; from kimi_mlp import kernels; "
                  "print(m.gpu, m.device, os.environ['TRITON_INTERPRET'], kernels.INTERPRETED); "
                  "print(m.reason); print(m.pick(cpu='small', gpu='big'))")
    assert p.returncode == 0, p.stderr
    first, reason, pick = p.stdout.splitlines()
    assert first == "False cpu 1 True"
    assert reason == "Triton's CPU interpreter at small widths: there is no CUDA device"
    assert pick == "small"


def test_a_dry_run_runs_the_gpu_code_at_the_cpu_shapes():
    p = run_fresh("from kimi_mlp.apparatus.measure import book_mode; m = book_mode(); "
                  "print(m.gpu, m.dry_run, m.device, m.pick(cpu=1, gpu=2)); "
                  "print(m.rate(lambda: None)['line'])", KIMI_BOOK_MODE="dry-run")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["True True cpu 1", "dry run on the CPU: ran, not timed"]


def test_book_mode_refuses_to_follow_kernels_imported_the_other_way(monkeypatch, patch_everywhere):
    import kimi_mlp.kernels as kernels
    patch_everywhere(kernels, "INTERPRETED", not kernels.INTERPRETED)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if not kernels.INTERPRETED:                      # pretend they were compiled for a GPU
        with pytest.raises(RuntimeError, match="imported with the interpreter off"):
            measure.book_mode()


def test_a_gpu_without_e4m3_runs_the_w8a16_cells_and_an_older_one_is_named(monkeypatch):
    """An A100 (8.0): the GPU mode at the real widths with `fp8` False (the chapters skip
    their FP8 cells); a V100 (7.0), which tl.dot does not serve: one clear error, and the
    interpreter only when the reader asks for it."""
    import os
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("KIMI_BOOK_MODE", raising=False)
    monkeypatch.setattr(measure, "_agreed", lambda mode: mode)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    mode = measure.book_mode()
    assert (mode.gpu, mode.dry_run, mode.fp8, mode.device) == (True, False, False,
                                                                 torch.device("cuda"))
    assert "A100" in mode.reason and "W8A16 cells run" in mode.reason
    assert mode.pick(cpu=1, gpu=2) == 2 and "e4m3" in mode.skipped
    assert "TRITON_INTERPRET" not in os.environ
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert measure.book_mode().fp8
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    with pytest.raises(RuntimeError, match=r"V100.*compute capability 7\.0.*7\.5 or more.*"
                                           "set TRITON_INTERPRET=1"):
        measure.book_mode()
    assert "TRITON_INTERPRET" not in os.environ              # it did not switch by itself
    monkeypatch.setenv("TRITON_INTERPRET", "1")              # the reader asks for it
    mode = measure.book_mode()
    assert not mode.gpu and "TRITON_INTERPRET=1 is set" in mode.reason and "V100" in mode.reason


def test_the_w8a16_dry_run_runs_the_gpu_code_without_the_fp8_cells():
    p = run_fresh("from kimi_mlp.apparatus.measure import book_mode; m = book_mode(); "
                  "print(m.gpu, m.dry_run, m.fp8, m.device, m.pick(cpu=1, gpu=2)); "
                  "print(m.reason)", KIMI_BOOK_MODE="dry-run-w8a16")
    assert p.returncode == 0, p.stderr
    first, reason = p.stdout.splitlines()
    assert first == "True True False cpu 1" and "CPU, as a GPU without e4m3 runs it" in reason
    # the kernels stand for an A100: an FP8 kernel a cell forgot to guard refuses there
    p = run_fresh("from kimi_mlp.apparatus.measure import book_mode; book_mode(); import torch; "
                  "from kimi_mlp import kernels; print(kernels.device_arch(torch.device('cpu')))"
                  "\ntry:\n    kernels.act_quant(torch.ones(1, 128))\n"
                  "except RuntimeError as e:\n    print(e)", KIMI_BOOK_MODE="dry-run-w8a16")
    assert p.returncode == 0, p.stderr
    arch, refusal = p.stdout.splitlines()
    assert arch == "80" and refusal.startswith("x: cpu (Triton's interpreter, standing for "
                                               "sm_80) has no e4m3 type")


def test_run_notebook_keeps_outputs_and_stops_at_the_first_error(tmp_path):
    cells = [
        {"cell_type": "markdown", "id": "m", "metadata": {}, "source": ["# t"]},
        {"cell_type": "code", "id": "a", "metadata": {}, "execution_count": None,
         "outputs": [], "source": ["x = 6 * 7\n", "print('x is', x)"]},
        {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": None,
         "outputs": [], "source": ["import matplotlib.pyplot as plt\n",
                                   "from IPython.display import Markdown, display\n",
                                   "display(Markdown('**bold**'))\n",
                                   "plt.plot([1, 2]); plt.show()"]},
        {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": None,
         "outputs": [], "source": ["raise ValueError('broken on purpose')"]},
        {"cell_type": "code", "id": "d", "metadata": {}, "execution_count": None,
         "outputs": [], "source": ["print('never')"]}]
    src = tmp_path / "t.ipynb"
    src.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                               "nbformat_minor": 5}))
    r = report.run_notebook(src, tmp_path / "out.ipynb", timeout_s=120)
    assert r["failed"] == {"cell": 3, "error": "ValueError: broken on purpose"} and r["cells"] == 3
    nb = json.loads((tmp_path / "out.ipynb").read_text())
    a, b, c, d = nb["cells"][1:]
    assert a["outputs"] == [{"name": "stdout", "output_type": "stream", "text": "x is 42\n"}]
    mimes = [next(iter(o["data"])) for o in b["outputs"]]
    assert mimes == ["text/markdown", "image/png"] and b["outputs"][0]["data"]["text/markdown"] \
        == "**bold**"
    assert c["outputs"][0]["output_type"] == "error" and c["execution_count"] == 3
    assert d["outputs"] == [] and d["execution_count"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the smoke run is the CPU's")
def test_gpu_report_smoke_dry_runs_the_report_notebooks(tmp_path):
    """The GPU report end to end without a GPU, as `python -m kimi_mlp gpu-report` in a
    Python that can import only what `pip install kimi-mlp[report]` installs (no IPython,
    no Jupyter, no transformers: tests/installs.py), as on a GPU machine with a bare CUDA
    PyTorch: the smoke GPU check, chapters 7-11 and appendix H executed in a dry run
    (their GPU code, at the small widths, through the interpreter) and the smoke sweep;
    every step must pass and everything lands under --out (the notebooks and five files),
    the chapters' figures and Markdown tables among the executed notebooks' outputs. A
    smoke run has no time limit, so the machine's load cannot fail it."""
    import os
    from installs import only_declared
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(only_declared(tmp_path / "site", ("report",)))
    out = tmp_path / "out"
    bare = subprocess.run([sys.executable, "-c", "import IPython"], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert "No module named 'IPython'" in bare.stderr            # the block holds
    run = subprocess.run([sys.executable, "-m", "kimi_mlp", "gpu-report", "--cpu-smoke",
                          "--out", str(out)], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=1800)
    record = json.loads((out / "gpu-report.json").read_text())
    (run_,) = record["runs"]
    failed = [s for s in run_["steps"] if not s["ok"]]
    assert run.returncode == 0 and not failed, (failed, run.stderr[-3000:])
    assert [s["step"] for s in run_["steps"]] == [
        "gpucheck", *(f"notebook {n}" for n in report.REPORT_NOTEBOOKS), "bench"]
    assert report.REPORT_NOTEBOOKS[:3] == ("07_triton.ipynb", "08_gemm.ipynb",
                                           "09_epilogues.ipynb")
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 5 + len(report.REPORT_NOTEBOOKS) and "08_gemm.ipynb" in files
    nb = json.loads((out / "08_gemm.ipynb").read_text())
    text = "".join(o.get("text", "") for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c["outputs"])
    assert "a dry run of the GPU code" in text and "ran, not timed" in text
    for name, kind in (("07_triton.ipynb", "image/png"),
                       ("11_benchmarks.ipynb", "text/markdown")):
        cells = json.loads((out / name).read_text())["cells"]
        assert any(kind in o.get("data", {}) for c in cells if c["cell_type"] == "code"
                   for o in c["outputs"]), (name, kind)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's dry run")
def test_the_kernel_chapters_run_as_a_gpu_without_e4m3_runs_them(tmp_path):
    """KIMI_BOOK_MODE=dry-run-w8a16: chapters 7 to 10 and appendix H as a T4 or an A100 runs
    them, through the interpreter at the small widths. Every cell that tests MODE.fp8 prints
    MODE.skipped and no other does; every other cell runs, the W8A16 checks among them, so no
    W8A16 cell depends on a skipped one. No time limit: the machine's load cannot fail it.
    (Chapter 11 has no FP8 cell; its W8A16 re-measurement is test_w8a16's benchmark run.)"""
    import re
    skipped = measure.BookMode(True, torch.device("cpu"), "", fp8=False).skipped
    guard = re.compile(r"^(if|elif) .*MODE\.fp8.*:", re.M)
    ran = {"07_triton.ipynb": None, "08_gemm.ipynb": None, "09_epilogues.ipynb": None,
           "appendix_h_w8a16.ipynb": "vs the w8a16 reference within",
           "10_fused_mlp.ipynb": "w8a16,  float16, M = 7"}
    for name, w8a16_line in ran.items():
        r = report.run_notebook(report._package_dir().parent / "book" / name,
                                tmp_path / name, env={"KIMI_BOOK_MODE": "dry-run-w8a16"})
        assert r["failed"] is None, (name, r["failed"])
        cells = [c for c in json.loads((tmp_path / name).read_text())["cells"]
                 if c["cell_type"] == "code"]
        text = ["".join(o.get("text", "") for o in c["outputs"]) for c in cells]
        guarded = [bool(guard.search("".join(c["source"]))) for c in cells]
        assert [skipped in t for t in text] == guarded, name
        if w8a16_line is None:                        # an FP8 kernel chapter
            assert sum(guarded) >= 2, name
        else:
            assert any(w8a16_line in t for t in text), name
        if name == "10_fused_mlp.ipynb":                  # the module picked W8A16
            assert any("mode='w8a16'" in t for t in text)


def test_gpu_report_refuses_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert report.gpu_report_main(["--out", "/nonexistent/never-written"]) == 3
    assert "no CUDA device" in capsys.readouterr().err
