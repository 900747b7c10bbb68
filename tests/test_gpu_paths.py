"""The lines only a CUDA device reaches, run on the CPU with the device's answers stubbed.

No GPU runs any of this. What runs is the bookkeeping around the kernels that a GPU would
reach first: plans made with a device index and its tile table, the refusal of a GPU
without FP8 tensor cores, the provenance of a GPU, the ceilings, the timer, the sweep's
timed path and its targets, CUDA graph capture, and what a run cut short leaves behind.
torch.cuda's queries (name, capability, SM count) answer for a stand-in GPU; timings come
from a stand-in timer and are never read as measurements.
"""
import contextlib
import functools
import gc
import json
import subprocess
import sys
import types
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kimi_mlp import fused as FU
from kimi_mlp import gpus, kernels, tiles
from kimi_mlp.apparatus import gpu_check, harness, measure, provenance, report, tune
from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block

H200 = {"name": "NVIDIA H200", "capability": (9, 0), "sms": 132}
L4 = {"name": "NVIDIA L4", "capability": (8, 9), "sms": 58}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "capability": (8, 0), "sms": 108}


def _clear_device_caches():
    for cached in (kernels.runtime._cuda_target, kernels.plan._tuned_tiles,
                   kernels.plan._plan):
        cached.cache_clear()
    kernels.numerics._NATIVE_OK.clear()


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda answers for one GPU, `gpu` (an H200 until a test changes it); the
    caches that keep the answers are emptied before and after."""
    gpu = dict(H200)

    def props(index=None):
        major, minor = gpu["capability"]
        return types.SimpleNamespace(
            name=gpu["name"], major=major, minor=minor,
            multi_processor_count=gpu["sms"], total_memory=141 * 2**30,
            L2_cache_size=60 * 2**20)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: gpu["name"])
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda index=None: gpu["capability"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    _clear_device_caches()
    yield gpu
    _clear_device_caches()


CUDA0 = torch.device("cuda", 0)


# -- planning with a device index ----------------------------------------------------


def test_a_launch_on_a_gpu_plans_with_its_sms_and_its_tile_table(fake_gpu, tmp_path,
                                                                   monkeypatch):
    """The first thing every launch on a GPU does: `_plan_for` with a CUDA device, which
    reads the SM count, the family and the measured tile table of that device."""
    monkeypatch.delenv(tiles.TILES_ENV, raising=False)
    plan = kernels._plan_for("gate_up", 1, 18432, 7168, CUDA0)
    assert (plan["num_sms"], plan["arch"]) == (132, 90)
    assert plan == dict(kernels.plan_gemm("gate_up", 1, 18432, 7168, 132), meta=plan["meta"])
    # a measured table for this device, named by the environment variable, takes over
    row = dict(kernels.GEMM_TILES["gemm"][0][1], num_stages=3, split_k=5)
    table = {"schema": tiles.TILES_SCHEMA, "device": "NVIDIA H200",
             "rows": [{"kind": "gemm", "n": 7168, "k": 18432, "m_max": None,
                       "config": row}]}
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tiles.TILES_ENV, str(path))
    _clear_device_caches()
    tuned = kernels._plan_for("down", 4, 7168, 18432, CUDA0)
    assert (tuned["num_stages"], tuned["split_k"]) == (3, 5)
    # Ada plans from its own table: no swap, no TMA, smaller tiles
    fake_gpu.update(L4)
    monkeypatch.delenv(tiles.TILES_ENV)
    _clear_device_caches()
    ada = kernels._plan_for("gate_up", 4096, 18432, 7168, CUDA0)
    assert ada["arch"] == 89 and not ada["SWAP"] and not ada["TMA_A"]
    assert ada["BLOCK_M"] == kernels.ADA_TILES["gate_up"][-1][1]["BLOCK_M"]
    assert ada["num_sms"] == 58


def test_each_compute_capability_has_its_family():
    """Chapter 7's `arch_family`: the W8A16 families below 8.9, FP8 `mma.sync` for Ada
    and the RTX 50xx, Hopper's tiles for Hopper and the B200; below 7.5 one line."""
    families = {(7, 5): 75, (8, 0): 80, (8, 6): 86, (8, 7): 86, (8, 9): 89, (9, 0): 90,
                (10, 0): 100, (12, 0): 120, (12, 1): 120}
    assert {cap: kernels.arch_family(cap) for cap in families} == families
    for family in set(families.values()):
        assert kernels.family_tiles(family) and gpus.family(family).shared_per_sm
    with pytest.raises(RuntimeError, match=r"compute capability 7\.0: these kernels "
                       r"need 7\.5 or more") as e:
        kernels.arch_family((7, 0))
    assert "\n" not in str(e.value)


T4 = {"name": "Tesla T4", "capability": (7, 5), "sms": 40}
V100 = {"name": "Tesla V100-SXM2-16GB", "capability": (7, 0), "sms": 80}


def test_a_gpu_without_e4m3_gets_the_w8a16_path_and_clear_refusals(fake_gpu, monkeypatch,
                                                                   capsys):
    """An A100 and a T4: the module picks W8A16 (bf16 on the A100, fp16 on the T4), its
    plans use the family's table and SM count; the FP8 kernels, and the GPU check and
    the benchmark asked for them, each refuse in one line naming the GPU and what they
    need, while their W8A16 runs are not refused. A V100 (7.0) is refused by
    everything in one line."""
    fake_gpu.update(A100)
    assert kernels.device_arch(CUDA0) == 80
    assert FU._choose_mode(CUDA0) == ("w8a16", torch.bfloat16)
    with pytest.raises(RuntimeError, match="mode: 'w8a8' needs an e4m3 type"):
        FU._choose_mode(CUDA0, "w8a8")
    plan = kernels._w8a16_plan_for("down", 1, 7168, 18432, CUDA0)
    assert (plan["arch"], plan["num_sms"]) == (80, 108)
    with FakeTensorMode():                  # CUDA tensors without a GPU: no data
        x = torch.empty(4, 256, dtype=torch.bfloat16, device="cuda")
    kernels._check_tensor("x", x, torch.bfloat16)            # the W8A16 kernels take it
    with pytest.raises(RuntimeError, match=r"x: cuda:0 \(compute capability 8\.0\) has "
                       r"no e4m3 type") as e:
        kernels.act_quant(x)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for main, name, argv in ((gpu_check.gpucheck_main, "gpucheck", ["--path", "w8a8"]),
                             (harness.main, "bench", ["--path", "w8a8"])):
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert err.startswith(f"error: {name}: NVIDIA A100") and err.count("\n") == 1, err
        assert "compute capability 8.0 and no e4m3 type" in err
    assert measure.gpu_refusal(CUDA0).startswith("NVIDIA A100")
    assert measure.gpu_refusal(CUDA0, fp8=False) is None      # the W8A16 sweep runs
    assert gpu_check._gpucheck_refusal(False, "auto") is None  # the W8A16 check runs
    assert gpu_check._gpucheck_refusal(False, "w8a16") is None
    from kimi_mlp import parallel
    with pytest.raises(ValueError, match=r"--impl: expected 'torch' on this GPU, got "
                       r"'fused': NVIDIA A100.*no e4m3 type") as e:
        parallel._check_impl("fused", CUDA0)                 # tp-check, before loading
    assert "\n" not in str(e.value)
    parallel._check_impl("torch", CUDA0)
    assert harness._bench_path("auto", CUDA0) == "w8a16"
    with pytest.raises(RuntimeError, match="mode: 'w8a8' needs an e4m3 type"):
        harness._bench_path("w8a8", CUDA0)
    fake_gpu.update(T4)
    _clear_device_caches()
    assert FU._choose_mode(CUDA0) == ("w8a16", torch.float16)
    assert FU._choose_mode(CUDA0, None, torch.bfloat16) == ("w8a16", torch.bfloat16)
    assert kernels._w8a16_plan_for("gate_up", 1, 18432, 7168, CUDA0)["arch"] == 75
    fake_gpu.update(V100)
    _clear_device_caches()
    what = r"Tesla V100-SXM2-16GB \(cuda:0\): compute capability 7\.0: these kernels"
    with pytest.raises(RuntimeError, match=what):
        kernels.device_arch(CUDA0)
    with pytest.raises(RuntimeError, match=what):
        FU._choose_mode(CUDA0)
    assert measure.gpu_refusal(CUDA0).startswith("Tesla V100")
    fake_gpu.update(H200)
    _clear_device_caches()
    assert measure.gpu_refusal(CUDA0) is None
    assert FU._choose_mode(CUDA0) == ("w8a8", None)


def test_the_probe_reads_one_rounding_or_two():
    """Chapter 7's `_rounds_once` on the conversions Triton emits: 3.9 for sm_89 and
    either for sm_90a, one `cvt.rn.satfinite.e4m3x2.f32`; 3.6 for sm_89, f16 first."""
    one = "cvt.rn.satfinite.e4m3x2.f32 %rs1, %f2, %f1;"
    two = "cvt.rz.f16.f32 %rs1, %f1;\ncvt.rn.satfinite.e4m3x2.f16x2 %rs3, %r1;"
    assert kernels._rounds_once(one) and not kernels._rounds_once(two)
    assert not kernels._rounds_once("mov.b32 %r1, %r2;")


def test_environment_describes_the_gpu(fake_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    env = provenance.environment("0" * 40)
    assert (env["device"], env["gpu"], env["capability"], env["sms"]) == (
        "cuda", "NVIDIA H200", "9.0", 132)
    assert env["memory_gib"] == 141.0 and env["l2_bytes"] == 60 * 2**20
    assert env["git_commit"] == "0" * 40


# -- timing, ceilings, the sweep -----------------------------------------------------


def stand_in_time_ms(fn, use_graph=False, warmup_ms=25, rep_ms=100):
    "time_ms's answer, made up: runs fn once and says 2 ms (no number here is measured)."
    fn()
    return {"median_ms": 2.0, "p20_ms": 1.9, "p80_ms": 2.1,
            "timer": "cudagraph" if use_graph else "events"}


def test_the_timer_falls_back_to_events_when_capture_is_refused(monkeypatch):
    import triton.testing
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **k: [1.0, 2.0, 3.0])
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph",
                        lambda fn, **k: [0.5, 0.6, 0.7])
    assert measure.time_ms(lambda: None, use_graph=True)["timer"] == "cudagraph"

    def refuse(fn, **kwargs):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", refuse)
    t = measure.time_ms(lambda: None, use_graph=True)
    assert t == {"median_ms": 2.0, "p20_ms": 1.0, "p80_ms": 3.0, "timer": "events"}


def test_ceilings_run_their_gpu_lines_on_the_cpu(monkeypatch):
    """`measure_ceilings` with a stand-in timer at small sizes: the copy and matmul rates
    are worked out from the timer's 2 ms, and an fp8 product that does not run here is
    recorded with its one-line reason rather than stopping the benchmark."""
    monkeypatch.setattr(measure, "time_ms", stand_in_time_ms)
    c = provenance.measure_ceilings(device="cpu", copy_numel=4096, shapes=((32, 64, 128),))
    assert c["copy_bytes_per_s"] == 2 * 2 * 4096 / 2e-3
    assert c["bf16_flop_per_s"] == 2 * 32 * 64 * 128 / 2e-3
    fp8 = [d for d in c["details"] if d["what"].startswith("fp8")]
    assert len(fp8) == 2
    for d in fp8:
        assert ("flop_per_s" in d) != ("error" in d), d
        assert "\n" not in d.get("error", "")
    assert c["fp8_flop_per_s"] in (None, 2 * 32 * 64 * 128 / 2e-3)


def test_the_timed_sweep_and_its_targets_with_a_stand_in_timer(fake_gpu, monkeypatch,
                                                                tmp_path, capsys):
    """bench's timed path (ceilings, each provider timed, each launch timed) on a small
    block on the CPU, as if a GPU were there; then run_bench judges the targets of the
    record it gets (check_targets) and writes it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(harness, "time_ms", stand_in_time_ms)
    monkeypatch.setattr(measure, "time_ms", stand_in_time_ms)
    small = functools.partial(provenance.measure_ceilings, copy_numel=4096,
                              shapes=((32, 64, 128),))
    monkeypatch.setattr(harness, "measure_ceilings", small)
    record = harness.bench((1, 3), ("fused", "unfused_w8a8"), hidden_size=256,
                           intermediate_size=640, device="cpu", log=lambda line: None)
    assert record["kind"] == "measurement" and record["complete"]
    assert record["ceilings"]["copy_bytes_per_s"] == 2 * 2 * 4096 / 2e-3
    assert [(r["provider"], r["m"], r["ok"], r["median_ms"]) for r in record["results"]] \
        == [("fused", 1, True, 2.0), ("unfused_w8a8", 1, True, 2.0),
            ("fused", 3, True, 2.0), ("unfused_w8a8", 3, True, 2.0)]
    assert len(record["launches"]) == 6 and {r["timer"] for r in record["launches"]} \
        == {"cudagraph"}
    assert record["results"][0]["rel_bound"] > harness.BENCH_BOUNDS["rel_mlp_fused"]
    monkeypatch.setattr(harness, "bench", lambda *args, **kwargs: record)
    assert harness.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "target: " in out and "wrote " in out
    assert len(list(tmp_path.glob("bench_nvidia-h200_*.json"))) == 1


# -- CUDA graphs ---------------------------------------------------------------------


class _StandInStream:
    def wait_stream(self, other):
        pass


def test_a_captured_graph_keeps_every_tensor_its_launches_touch(monkeypatch, patch_everywhere):
    """A CUDA graph holds addresses, not tensors. Capture the block's launches (torch's
    graph API stubbed, every Triton launch recorded instead of run) and check that every
    tensor a captured launch received is still alive once nothing but the module holds
    the graph: none of its memory can go to another tensor."""
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction
    from triton.tools.tensor_descriptor import TensorDescriptor
    capturing, touched = [False], []

    def record(self, grid):
        def launch(*args, **kwargs):
            if capturing[0]:
                for a in (*args, *kwargs.values()):
                    t = a.base if isinstance(a, TensorDescriptor) else a
                    if isinstance(t, torch.Tensor):
                        touched.append(weakref.ref(t))
        return launch

    class Graph:
        def __init__(self):
            pass

        def replay(self):
            pass

    class CaptureInto:
        def __init__(self, graph):
            pass

        def __enter__(self):
            capturing[0] = True

        def __exit__(self, *exc):
            capturing[0] = False

    for cls in (JITFunction, interpreter.InterpretedFunction):
        monkeypatch.setattr(cls, "__getitem__", record)
    monkeypatch.setattr(FU, "_check_capturable", lambda module: None)
    monkeypatch.setattr(torch.cuda, "Stream", _StandInStream)
    monkeypatch.setattr(torch.cuda, "current_stream", _StandInStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", CaptureInto)
    # 132 SMs: both GEMMs split K at M = 1 here, so there are partials to keep as well
    patch_everywhere(kernels, "device_sms", lambda device: 132)
    kernels._plan.cache_clear()
    module = FusedFp8DenseMLP(random_dense_block(1024, 1024, seed=1))
    module.capture_graphs((1, 3))
    kernels._plan.cache_clear()
    plan = kernels._plan_for("gate_up", 1, 1024, 1024, torch.device("cpu"))
    assert plan["split_k"] > 1
    gc.collect()
    assert touched, "no launch was captured"
    dead = [r for r in touched if r() is None]
    assert not dead, f"{len(dead)} of {len(touched)} tensors of captured launches freed"
    with torch.no_grad():                      # forward replays the stand-in graph
        module(torch.zeros(1, 1024, dtype=torch.bfloat16))


# -- runs cut short ------------------------------------------------------------------


def test_tune_writes_its_table_after_every_bucket(fake_gpu, monkeypatch, tmp_path, patch_everywhere):
    """A tune run killed after two buckets leaves a file that loads, those two buckets
    tuned, every other one at the table's row."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    patch_everywhere(kernels, "INTERPRETED", False)
    done = []

    class Killed(BaseException):
        pass

    def bucket(kind, bound, device, sms, rep_ms=50, log=print, arch=90, **kwargs):
        if len(done) == 2:
            raise Killed
        done.append((kind, bound))
        n, k = tune.TUNE_SHAPES[kind]
        row = dict(kernels.family_tiles(arch)[kind][0][1], num_stages=2)
        return {"kind": kind, "n": n, "k": k, "m_max": bound, "m_timed": 16,
                "tuned": True, "median_us": 1.0, "default_us": 1.0, "candidates": 1,
                "config": row}

    monkeypatch.setattr(tune, "tune_bucket", bucket)
    out = tmp_path / "tiles.json"
    with pytest.raises(Killed):
        tune.tune_main(["--out", str(out)])
    saved = json.loads(out.read_text())
    assert [r["tuned"] for r in saved["rows"]] == [True, True] + [False] * 8
    table = tiles.load_tiles(out)
    assert table.pop("device") == "NVIDIA H200" and len(table) == 2


def test_the_report_saves_the_sweep_after_every_m(monkeypatch, tmp_path):
    """gpu-report's bench step hands the sweep a callback that writes the record after
    each M, so a sweep stopped midway (a time limit's SIGINT) leaves its first M on
    disk, and the report records the interruption."""
    def sweep(*args, on_update=None, **kwargs):
        record = harness._new_record((1, 2), ("fused",), 64, 128, False, {}, None)
        record["results"].append({"provider": "fused", "m": 1, "ok": True})
        on_update(record)
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "bench", sweep)
    assert report.gpu_report_main(["--cpu-smoke", "--steps", "bench", "--out",
                                    str(tmp_path)]) == 130
    saved = list(tmp_path.glob("bench-smoke_*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["results"][0]["m"] == 1
    run = json.loads((tmp_path / "gpu-report.json").read_text())["runs"][-1]
    assert [s["step"] for s in run["steps"]] == ["interrupted"]


def test_the_smoke_report_runs_notebooks_with_no_time_limit(monkeypatch, tmp_path):
    """The CPU dry run must not pass or fail with the machine's load: no timeout."""
    seen = []

    def run(src, dst, timeout_s=None, env=None):
        seen.append(timeout_s)
        return {"notebook": src.name, "cells": 1, "failed": None, "seconds": 0.0}

    monkeypatch.setattr(report, "run_notebook", run)
    argv = ["--cpu-smoke", "--steps", "notebooks", "--notebooks", "11_benchmarks.ipynb",
            "--out", str(tmp_path)]
    assert report.gpu_report_main(argv) == 0
    assert seen == [None]
    assert report.gpu_report_main(argv) == 0          # a second call adds a run
    record = json.loads((tmp_path / "gpu-report.json").read_text())
    assert [r["steps"][0]["step"] for r in record["runs"]] == [
        "notebook 11_benchmarks.ipynb"] * 2


# -- the compiled path of the notebook runner -----------------------------------------


def _notebook(path, *sources):
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
              "outputs": [], "source": s} for i, s in enumerate(sources)]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_the_runner_lets_triton_compile_a_cell_s_jit_function(tmp_path):
    """With TRITON_INTERPRET=0, as gpu-report runs chapters 7 to 9 on a GPU, `@triton.jit`
    reads the function's source through `inspect`, which must find the cell's: the
    decorator has to succeed (nothing is compiled or launched)."""
    src = _notebook(tmp_path / "jit.ipynb",
                    "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                    "def add_one(x_ptr):\n    tl.store(x_ptr, tl.load(x_ptr) + 1)\n\n\n"
                    "print(type(add_one).__name__, len(add_one.src) > 0)")
    r = report.run_notebook(src, tmp_path / "out.ipynb", env={"TRITON_INTERPRET": "0"})
    assert r["failed"] is None, r
    out = json.loads((tmp_path / "out.ipynb").read_text())["cells"][0]["outputs"]
    assert out[0]["text"] == "JITFunction True\n"


def test_a_runner_killed_midway_leaves_the_cells_it_ran(tmp_path):
    """A notebook whose second cell kills its own process, as a time limit would: the
    executed copy holds the first cell's output, and the result names the cell."""
    src = _notebook(tmp_path / "kill.ipynb", "print('first')",
                    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                    "print('never')")
    r = report.run_notebook(src, tmp_path / "out.ipynb")
    assert r["failed"]["cell"] == 1 and r["cells"] == 1, r
    cells = json.loads((tmp_path / "out.ipynb").read_text())["cells"]
    assert cells[0]["outputs"][0]["text"] == "first\n"
    assert cells[1]["execution_count"] is None and cells[2]["outputs"] == []


def test_mypy_finds_no_undefined_name_or_attribute(tmp_path):
    """The static check (configuration in pyproject.toml): undefined names, missing
    module attributes and calls that do not fit, on every line, those only a GPU runs
    included."""
    root = tiles._package_dir().parent
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path),
                          "--config-file", str(root / "pyproject.toml")],
                         cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_the_hardware_conversions_are_decided_once_per_gpu(fake_gpu, monkeypatch, patch_everywhere):
    """`_native` on a CUDA device: the probe's answer for that GPU's target, asked once
    and kept per device (the probe itself compiles for real in test_codegen)."""
    import triton
    asked = []
    patch_everywhere(kernels, "NATIVE", True)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(
        get_current_target=lambda: ("cuda", 89, 32)), raising=False)
    monkeypatch.setattr(type(triton.runtime.driver), "active",
                        property(lambda self: self._active), raising=False)
    patch_everywhere(kernels, "_e4m3_rounds_once",
                        lambda target: asked.append(target) or False)
    assert kernels._native(CUDA0) is False and kernels._native(CUDA0) is False
    assert asked == [("cuda", 89, 32)]
    patch_everywhere(kernels, "NATIVE", False)             # switched off: integer
    assert kernels._native(torch.device("cuda", 1)) is False and len(asked) == 1


def test_rate_and_the_checks_timings_with_a_stand_in_timer(monkeypatch):
    """The chapters' timing line (`rate`) and the GPU check's two timings, on the CPU."""
    monkeypatch.setattr(measure, "time_ms", stand_in_time_ms)
    ceilings = {"copy_bytes_per_s": 4e12, "bf16_flop_per_s": 8e14, "fp8_flop_per_s": 16e14}
    r = measure.rate(lambda: None, bytes_moved=4e9, flop=1.6e12, ceilings=ceilings)
    assert r["median_ms"] == 2.0 and r["tb_per_s"] == pytest.approx(2.0)
    assert r["floor_ms"] == pytest.approx(1.0) and "reached at 50%" in r["line"]
    block = random_dense_block(256, 640, seed=2)
    h = torch.randn(3, 256).to(torch.bfloat16)
    fused, w16 = FusedFp8DenseMLP(block), gpu_check.dequantized_weights(block)
    t = gpu_check.time_block(fused, block, w16, h, True, 10)
    assert t == {"fused_ms": 2.0, "torch_bf16_ms": 2.0, "timer": "cudagraph"}
    # one row of the check as a GPU makes it: the checks, then the timings (M = 3 is
    # above graph_max_m here, so events)
    args = types.SimpleNamespace(graph_max_m=2, rep_ms=10)
    row = gpu_check._check_m(block, fused, w16, h, args, timed=True)
    assert row["ok"] and (row["fused_ms"], row["timer"]) == (2.0, "events")


def test_a_tune_bucket_is_checked_then_timed(monkeypatch):
    """tune_bucket's timed path with a stand-in timer: every candidate passes the check
    against the first, and the fastest (here all equal: the first) is kept."""
    monkeypatch.setattr(tune, "time_ms", stand_in_time_ms)
    row = tune.tune_bucket("gemm", 16, "cpu", 132, m=3, n_k=(256, 384),
                              log=lambda line: None)
    assert row["median_us"] == row["default_us"] == 2000.0
    assert row["config"] == tune.tile_candidates("gemm", 16)[0]
    assert row["candidates"] == len(tune.tile_candidates("gemm", 16))


def test_a_report_on_a_gpu_gives_a_notebook_what_is_left_of_its_budget(fake_gpu,
                                                                      monkeypatch,
                                                                      tmp_path):
    seen = []

    def run(src, dst, timeout_s=None, env=None):
        seen.append(timeout_s)
        return {"notebook": src.name, "cells": 1, "failed": None, "seconds": 0.0}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(report, "run_notebook", run)
    argv = ["--steps", "notebooks", "--notebooks", "11_benchmarks.ipynb", "--budget-s",
            "300", "--out", str(tmp_path)]
    assert report.gpu_report_main(argv) == 0
    assert len(seen) == 1 and 200 < seen[0] <= 300


@pytest.mark.parametrize("step, expected", [
    ("check-decode", "--steps gpucheck --m 1,3,16,33"),
    ("check-prefill", "--steps gpucheck --m 128,512,1024,4096"),
    ("bench", "--steps bench --budget-s 350"),
    ("ch7", "--steps notebooks --notebooks 07_triton.ipynb --budget-s 410"),
    ("ch11", "--steps notebooks --notebooks 11_benchmarks.ipynb --budget-s 410"),
    ("appH", "--steps notebooks --notebooks appendix_h_w8a16.ipynb --budget-s 410"),
    ("bench-w8a16", None),
    ("check-w8a16", None),
    ("check-gluon", None),
])
def test_the_gpu_day_steps_call_the_report(tmp_path, step, expected):
    """tools/gpu_day.sh, with `echo` standing in for Python: each step is one gpu-report
    call into OUT (the W8A16 sweep: the benchmark itself; the W8A16 check: the check
    itself, into OUT/w8a16), under the time limit, with its budget below it."""
    root = tiles._package_dir().parent
    env = {"PATH": "/usr/bin:/bin", "PYTHON": "echo", "GIT_COMMIT": "abc"}
    res = subprocess.run(["bash", str(root / "tools" / "gpu_day.sh"), step,
                          str(tmp_path / "out")], capture_output=True, text=True,
                         env=env)
    assert res.returncode == 0, res.stderr
    want = (f"-m kimi_mlp gpu-report --out {tmp_path / 'out'} --git-commit abc {expected}"
            if expected else f"-m kimi_mlp bench --path w8a16 --out {tmp_path / 'out'} "
            "--git-commit abc --budget-s 350" if step == "bench-w8a16" else
            "-m kimi_mlp gpucheck --path w8a16 --m 1,16,128,4096 --out "
            f"{tmp_path / 'out' / 'w8a16'} --git-commit abc" if step == "check-w8a16" else
            "-m kimi_mlp gpucheck --path gluon --m 512,1024,4096 --out "
            f"{tmp_path / 'out' / 'gluon'} --git-commit abc")
    assert res.stdout.strip() == want
    bad = subprocess.run(["bash", str(root / "tools" / "gpu_day.sh"), "warm",
                          str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown step 'warm'" in bad.stderr
