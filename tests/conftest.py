import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before any kernel
# module is imported. kimi_mlp.kernels does the same; setting it here keeps test collection order
# irrelevant.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def rng():
    "A fresh, seeded generator per test, so each case draws its own inputs reproducibly."
    return torch.Generator().manual_seed(1234)


#: What `make test-fast` (`-m "not slow"`) leaves out, in one place: tests that compile
#: the kernels for GPU targets (ptxas), execute notebooks or build the book, run the static
#: checker over the package, start fresh Pythons that run the kernels or the command
#: line end to end, or run the benchmark's and the GPU check's sweeps end to end. Each entry is a test file's name, or file::test (every
#: parametrization); `make test` runs them all. A new test of these sorts is marked
#: `@pytest.mark.slow` where it is written.
SLOW = (
    # compile for GPU targets
    "test_codegen.py::test_the_fused_block_compiles_for_sm90a",
    "test_codegen.py::test_every_gpu_check_and_benchmark_variant_compiles_without_spills",
    "test_codegen.py::test_the_byte_decode_and_the_w8a16_gemm_compile_for_gpus_without_e4m3",
    "test_codegen.py::test_every_gpu_family_compiles_the_block_without_spills",
    "test_first_run.py::test_inspect_reports_its_progress_one_line_per_step",
    "test_gluon.py::test_the_gluon_gemms_keep_a_wgmma_group_in_flight_for_sm_90a",
    "test_gluon.py::test_the_gluon_gemms_compile_with_triton_3_6_too",
    # execute notebooks, build the book
    "test_measure.py::test_gpu_report_smoke_dry_runs_the_report_notebooks",
    "test_measure.py::test_the_kernel_chapters_run_as_a_gpu_without_e4m3_runs_them",
    "test_colab.py::test_the_built_book_links_each_notebook_to_colab",
    # the static check of the whole package
    "test_gpu_paths.py::test_mypy_finds_no_undefined_name_or_attribute",
    # fresh processes running the kernels, the README or the command line end to end
    "test_readme.py",
    "test_first_run.py::test_the_kernels_work_whatever_was_imported_first",
    "test_parallel.py::test_tp_check_under_torchrun",
    "test_parallel.py::test_spawned_ranks_on_gloo",
    # the benchmark's and the GPU check's CPU smoke runs, end to end
    "test_bench.py::test_cli_cpu_smoke_writes_valid_json",
    "test_w8a16.py::test_the_benchmark_runs_the_w8a16_path",
    "test_gpu_paths.py::test_the_timed_sweep_and_its_targets_with_a_stand_in_timer",
    "test_fused.py::test_gpucheck_cpu_smoke_writes_its_record",
    "test_fused.py::test_gpucheck_w8a16_checks_the_w8a16_launches_and_keeps_its_own_rows",
)


def pytest_collection_modifyitems(config, items):
    "Mark the SLOW tests; an entry naming no test of its (collected) file is an error."
    modules = {}
    for item in items:
        name = f"{item.path.name}::{item.originalname}"
        if any(entry in (item.path.name, name) for entry in SLOW):
            item.add_marker(pytest.mark.slow)
        if getattr(item, "module", None) is not None:
            modules[item.path.name] = item.module
    stale = [e for e in SLOW if "::" in e and e.split("::")[0] in modules
             and not hasattr(modules[e.split("::")[0]], e.split("::")[1])]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names no test: {stale}")


@pytest.fixture
def patch_everywhere(monkeypatch):
    """`monkeypatch.setattr(module, name, value)` for a name that several modules of the
    package hold: the modules of chapters 7 to 9 import names from one another (and
    `kimi_mlp.kernels` re-exports them), so every kimi_mlp module bound to the same
    object gets `value`, and a call from any of them sees it. Undone after the test."""
    import sys

    def patch(module, name, value):
        ours = [mod for key, mod in list(sys.modules.items()) if mod is not None
                and (key == "kimi_mlp" or key.startswith("kimi_mlp."))]
        holders = [mod for mod in (module, *ours) if name in vars(mod)]
        if not holders:
            raise AttributeError(f"patch_everywhere: no kimi_mlp module has {name!r}")
        old = vars(holders[0])[name]                  # the module's, else a submodule's
        for mod in ours:
            if name in vars(mod) and vars(mod)[name] is old:
                monkeypatch.setattr(mod, name, value)
    return patch
