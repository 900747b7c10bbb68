"""Configs from measurements without a GPU: appendix C's tile tables (load_tiles,
tuned_tiles) read, checked and used by chapter 8's plan_gemm; appendix E's tune sweep
refuses without a GPU and runs its checks through the interpreter; the host-time
helpers stub every launch."""
import json

import pytest
import torch

from kimi_mlp import kernels, tiles
from kimi_mlp.apparatus import measure, tune
from kimi_mlp.tiles import (TILES_ENV, TILES_SCHEMA, load_tiles, tiles_file_name,
                            tuned_tiles)

ROW = {"kind": "gemm", "n": 7168, "k": 18432, "m_max": 16,
       "config": dict(kernels.GEMM_TILES["gemm"][0][1], num_stages=3, split_k=5)}
LAST = {"kind": "gemm", "n": 7168, "k": 18432, "m_max": None,
        "config": dict(kernels.GEMM_TILES["gemm"][-1][1])}


def write(path, rows, device="NVIDIA H200", **extra):
    path.write_text(json.dumps({"schema": TILES_SCHEMA, "device": device, "rows": rows,
                                **extra}))
    return path


def test_a_table_is_read_and_plan_gemm_uses_it(tmp_path):
    path = write(tmp_path / tiles_file_name("NVIDIA H200"), [ROW, LAST])
    assert path.name == "NVIDIA_H200.json"
    table = load_tiles(path)
    assert table.pop("device") == "NVIDIA H200"
    assert list(table) == [("gemm", 7168, 18432)]
    p = kernels.plan_gemm("down", 4, 7168, 18432, 132, tiles=table)
    assert (p["num_stages"], p["split_k"]) == (3, 5)
    big = kernels.plan_gemm("down", 4096, 7168, 18432, 132, tiles=table)
    assert big == kernels.plan_gemm("down", 4096, 7168, 18432, 132)


def test_the_environment_variable_overrides_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "configs").mkdir(parents=True)
    monkeypatch.setattr(tiles, "_package_dir", lambda: pkg)
    monkeypatch.delenv(TILES_ENV, raising=False)
    assert tuned_tiles("NVIDIA H200") is None                 # nothing shipped: defaults
    write(pkg / "configs" / "NVIDIA_H200.json", [ROW, LAST])
    shipped = tuned_tiles("NVIDIA H200")
    assert shipped[("gemm", 7168, 18432)][0][1]["split_k"] == 5
    assert tuned_tiles("NVIDIA H100 80GB HBM3") is None       # another GPU: its own file
    mine = write(tmp_path / "mine.json", [dict(ROW, m_max=None)])
    monkeypatch.setenv(TILES_ENV, str(mine))
    assert tuned_tiles("NVIDIA H200")[("gemm", 7168, 18432)][0][0] is None
    with pytest.raises(ValueError, match="expected a table measured on NVIDIA H100"):
        tuned_tiles("NVIDIA H100")


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(schema="other/1"), "schema: expected 'kimi-mlp-tiles/1'"),
    (lambda d: d.update(device=""), "device: expected the GPU's name"),
    (lambda d: d.update(rows=[]), "rows: expected a non-empty list"),
    (lambda d: d["rows"][0].update(kind="conv"), r"rows\[0\].kind: expected 'gate_up'"),
    (lambda d: d["rows"][0].update(n=0), r"rows\[0\].n: expected a positive int, got 0"),
    (lambda d: d["rows"][0].update(m_max=1.5), r"rows\[0\].m_max: expected a positive int"),
    (lambda d: d["rows"][0]["config"].update(num_warps=6),
     r"rows\[0\].config.num_warps: expected 4 or 8, got 6"),
    (lambda d: d["rows"][0]["config"].pop("BLOCK_M"),
     r"rows\[0\].config.BLOCK_M: expected 16, 32, 64 or 128, got 'nothing'"),
    (lambda d: d["rows"][0]["config"].update(PIPELINE=True),
     r"rows\[0\].config: unexpected fields \['PIPELINE'\]"),
    (lambda d: d["rows"][0]["config"].update(split_k=0),
     r"rows\[0\].config.split_k: expected a positive int, got 0"),
    (lambda d: d["rows"].pop(1), r"rows for \('gemm', 7168, 18432\): expected increasing "
                                 r"m_max ending with null, got \[16\]"),
])
def test_a_bad_table_is_refused_naming_the_field(tmp_path, edit, match):
    data = {"schema": TILES_SCHEMA, "device": "NVIDIA H200",
            "rows": [json.loads(json.dumps(ROW)), json.loads(json.dumps(LAST))]}
    edit(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        load_tiles(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="expected a readable JSON tile file"):
        load_tiles(path)


def test_tune_refuses_without_a_gpu(capsys):
    if torch.cuda.is_available() and not kernels.INTERPRETED:
        pytest.skip("a GPU is here")
    assert tune.tune_main([]) == 3
    assert "tune: no CUDA device" in capsys.readouterr().err


def test_tune_candidates_and_a_bucket_through_the_interpreter(tmp_path):
    """The candidates start with the table's row and stay distinct; one bucket's sweep runs
    them all (untimed), checks each against the first, and its row is a valid tile file."""
    cands = tune.tile_candidates("gate_up", 16)
    assert cands[0] == dict(kernels.GEMM_TILES["gate_up"][0][1])
    assert len(cands) == len({json.dumps(c, sort_keys=True) for c in cands}) >= 8
    assert {c.get("split_k") for c in cands} >= {1, 2, 4, 8, 16, None}
    device = "cuda" if torch.cuda.is_available() and not kernels.INTERPRETED else "cpu"
    row = tune.tune_bucket("gemm", None, device, 132, m=3, n_k=(128, 128),
                              timed=False, log=lambda line: None)
    assert row["candidates"] >= 5 and row["m_max"] is None and row["config"] in \
        tune.tile_candidates("gemm", None)
    table = load_tiles(write(tmp_path / "t.json", [row]))
    assert ("gemm", 128, 128) in table


def test_launches_stubbed_runs_no_kernel_and_host_time_is_measured():
    from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block
    fused = FusedFp8DenseMLP(random_dense_block(128, 128, seed=1))
    h = torch.randn(2, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with measure.poisoned_allocations(), measure.launches_stubbed(), torch.no_grad():
        out = fused(h)
    assert torch.isnan(out).all()                          # nothing wrote the output
    us = measure.host_time_us(lambda: fused(h), plan_sms=132, number=20, repeat=2)
    assert 0 < us < 1e5
    assert kernels._MODE.get() is None                     # launches run again
    with torch.no_grad():
        assert torch.isfinite(fused(h)).all()              # and the launches are back


@pytest.mark.parametrize("arch", [80, 75])
def test_tune_sweeps_the_w8a16_kernels_on_their_families(tmp_path, arch):
    """On Ampere and Turing the candidates are the W8A16 tables' rows and their
    neighbours (weight rows and K slices too), the sweep launches the W8A16 kernels
    (bf16, or fp16 on Turing; untimed here, through the interpreter), and the winning
    row is a valid tile file's."""
    cands = tune.tile_candidates("gate_up", None, arch)
    assert cands[0] == dict(kernels.family_tiles(arch)["gate_up"][-1][1])
    assert {c["SUB_K"] for c in cands} > {cands[0]["SUB_K"]}
    assert {c["BLOCK_N"] for c in cands} == {64, 128}
    for kind in ("gate_up", "gemm"):
        row = tune.tune_bucket(kind, None, "cpu", 4, m=3, n_k=(128, 256), timed=False,
                               log=lambda line: None, arch=arch)
        assert row["candidates"] >= 5 and row["config"] in tune.tile_candidates(
            kind, None, arch)
        table = load_tiles(write(tmp_path / f"{kind}.json", [row]))
        assert (kind, 128, 256) in table
