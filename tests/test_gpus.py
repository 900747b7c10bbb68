"""Appendix G's registry of GPU families is the one place the package learns about a GPU:
a family added to it reaches the planners, the compile targets, the floors and the CLI,
and no other module keeps a table of families of its own."""
import ast
import dataclasses
import re
from pathlib import Path

import pytest

from kimi_mlp import bench, gpus, kernels
from kimi_mlp.apparatus import codegen

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def made_up_family(monkeypatch):
    """Family 95, compute capability 9.5, with Hopper's path and tiles but less shared
    memory, and one GPU, the X100 of 100 SMs: none of it exists."""
    fam = gpus.Family(95, "Made-up", ((9, 5),), "wgmma e4m3", 150 * 1024, 151 * 1024,
                      "hopper", True, ("X100",))
    gpu = gpus.GPU("X100", 95, ("Made-up X100",), 100, 1e12, 1e15, 1e15, 2e15, None,
                   "NVIDIA made-up datasheet", "https://www.nvidia.com/x100")
    monkeypatch.setitem(gpus.FAMILIES, 95, fam)
    monkeypatch.setitem(gpus.GPUS, "X100", gpu)
    kernels._plan.cache_clear()
    yield fam
    kernels._plan.cache_clear()


def test_a_new_family_reaches_every_reader(made_up_family):
    assert kernels.arch_family((9, 5)) == 95 and gpus.family_of((9, 7)).arch == 95
    assert kernels.arch_family((9, 0)) == 90
    # the planner: Hopper's rows, this family's shared memory in the occupancy
    plan = kernels.plan_gemm("gate_up", 4096, 18432, 7168, 100, arch=95)
    hopper = kernels.plan_gemm("gate_up", 4096, 18432, 7168, 100, arch=90)
    assert plan["BLOCK_M"] == hopper["BLOCK_M"] and plan["smem"] == hopper["smem"]
    assert plan["per_sm"] == 151 * 1024 // (plan["smem"] + 1024)
    assert hopper["per_sm"] >= plan["per_sm"]
    # the compile targets and the inspect command's --arch
    assert codegen.targets()["sm_95a"] == (95, 100)
    assert codegen.inspect_parser().parse_args(["--arch", "sm_95a"]).arch is made_up_family
    # chapter 11's floors
    x100 = next(g for g in bench.datasheet_gpus() if g["name"] == "X100")
    assert (x100["mode"], x100["rate_key"], x100["target"]) == (
        "w8a8", "fp8_flop_per_s", "sm_95a")
    assert bench.prefill_floor_s(x100, 4096) == bench.ffn_flop(4096) / 2e15
    assert bench.fused_path({"environment": {"capability": "9.5"}}) == "w8a8"


def test_a_made_up_family_without_e4m3_plans_the_w8a16_rows(monkeypatch):
    fam = gpus.Family(81, "Made-up", ((8, 1),), "mma.sync bf16", 99 * 1024,
                      100 * 1024, "ampere", False, ("A100 80GB",))
    monkeypatch.setitem(gpus.FAMILIES, 81, fam)
    kernels._plan.cache_clear()
    try:
        assert kernels.arch_family((8, 1)) == 81 and not gpus.family(81).e4m3
        assert "SUB_K" in kernels.plan_gemm("gemm", 1, 7168, 18432, 108, arch=81)
        with pytest.raises(ValueError, match="does not fit the W8A16 kernels of family 81"):
            kernels.plan_gemm("gemm", 1, 7168, 18432, 108, arch=81, tiles={
                ("gemm", 7168, 18432): kernels.GEMM_TILES["gemm"]})
    finally:
        kernels._plan.cache_clear()


def test_the_registry_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match=r"arch: expected one of \[75, 80, 86, 89, 90, "
                       r"100, 120\], got 91"):
        gpus.family(91)
    with pytest.raises(ValueError, match="target: expected one of"):
        gpus.by_target("sm_70")
    with pytest.raises(RuntimeError, match=r"compute capability 7\.0: these kernels need "
                       r"7\.5 or more"):
        gpus.family_of((7, 0))
    assert gpus.family_of((13, 0)).arch == gpus.NEWER     # a later major: the newest
    assert gpus.family_of((8, 8)).arch == 86              # the closest below, same major
    assert gpus.by_target("sm_100").arch == gpus.by_target("sm_100a").arch == 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpus.family(90).sms = 1


def test_the_registry_agrees_with_itself():
    caps = [c for f in gpus.FAMILIES.values() for c in f.capabilities]
    assert len(caps) == len(set(caps))
    for f in gpus.FAMILIES.values():
        assert f.path in gpus.PATHS and f.tiles in kernels.TILE_TABLES
        assert f.shared_per_block <= f.shared_per_sm
        assert f.gpus and all(gpus.gpu(n).arch == f.arch for n in f.gpus)
        assert f.e4m3 == (f.arch >= 89), f.name            # e4m3 from Ada on
        assert f.tma == (f.path in ("wgmma e4m3", "tcgen05 e4m3")), f.name
    names = [n.lower() for g in gpus.GPUS.values() for n in g.device_names]
    assert len(names) == len(set(names))
    assert gpus.find_gpu(" nvidia h200 ").name == "H200" and gpus.find_gpu(None) is None


#: What a table of GPU families looks like in code: family numbers or sm_ names.
ARCHS = {75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121}
SM_NAME = re.compile(r"^sm_\d+a?$")


def _family_tables(tree):
    "Literals that list two or more GPU families, by number or by sm_ name."
    def family_like(node):
        if not isinstance(node, ast.Constant):
            return False
        v = node.value
        return (isinstance(v, int) and not isinstance(v, bool) and v in ARCHS) or (
            isinstance(v, str) and bool(SM_NAME.match(v)))

    for node in ast.walk(tree):
        items = (node.keys if isinstance(node, ast.Dict)
                 else node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                 else [])
        hits = [k for k in items if k is not None and family_like(k)]
        if len(hits) >= 2:
            yield node.lineno, ast.unparse(node)[:80]


def test_no_other_module_keeps_a_table_of_gpu_families():
    found = {}
    for path in sorted((ROOT / "kimi_mlp").rglob("*.py")):
        if path.name == "gpus.py":
            continue
        hits = list(_family_tables(ast.parse(path.read_text())))
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert not found, f"tables of GPU families outside kimi_mlp/gpus.py: {found}"


def test_the_table_finder_finds_a_table():
    src = 'SMEM = {90: 228 * 1024, 89: 100 * 1024}\nW = ("sm_80", "sm_86")\nM = (1, 16, 64)'
    assert [line for line, _ in _family_tables(ast.parse(src))] == [1, 2]


def test_an_unlisted_capability_plans_with_the_least_shared_memory_of_its_kind():
    # 8.1 to 8.5 and 8.8 are listed nowhere: the bf16 path of Ampere, and of its
    # families the one with 99 KB a block, not the A100's 163 KB
    assert {gpus.family_of((8, m)).arch for m in (1, 2, 5, 8)} == {86}
    assert gpus.family_of((8, 0)).arch == 80 and gpus.family_of((8, 9)).arch == 89
    assert bench.fused_path({"environment": {"capability": "7.0"}}) is None


def test_the_registry_check_refuses_an_entry_that_disagrees(monkeypatch):
    gpus.check_registry()
    stray = dataclasses.replace(gpus.gpu("L4"), name="L5")      # in no family's list
    monkeypatch.setitem(gpus.GPUS, "L5", stray)
    with pytest.raises(ValueError, match="GPU L5: family 89 does not list it"):
        gpus.check_registry()
    monkeypatch.delitem(gpus.GPUS, "L5")
    twice = dataclasses.replace(gpus.family(86), arch=87, capabilities=((8, 9),))
    monkeypatch.setitem(gpus.FAMILIES, 87, twice)
    with pytest.raises(ValueError, match="capabilities: claimed twice"):
        gpus.check_registry()
