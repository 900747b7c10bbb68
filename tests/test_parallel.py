"""Chapter 12: the FFN block across ranks (kimi_mlp.parallel), on the CPU with gloo.

The distributed tests start real processes, as users do: `spawn_ranks`
(torch.multiprocessing, start method spawn, a file rendezvous) for P = 2 and 4, and
`torchrun` for the command line. Each is bounded in time (`timeout_s`, the subprocess
timeout) so that a hang fails instead of stalling CI. Shapes are small: hidden 256,
intermediate 1024 (8 blocks of 128).
"""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kimi_mlp.parallel as tp
from kimi_mlp.checkpoint import (SMALL_CONFIG, load_dense_block,
                                 write_synthetic_checkpoint)
from kimi_mlp.fp8 import fp8_matmul_blockwise
from kimi_mlp.fused import ffn_tensors, fused_ffn_block, random_dense_block
from kimi_mlp.safetensors_io import (CheckpointError, read_safetensors_layout,
                                     resolve_tensor_files)

CONFIG = dataclasses.replace(SMALL_CONFIG, intermediate_size=1024)
SPAWN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    "Two shards (the gains in their own), so the loader opens more than one file."
    path = tmp_path_factory.mktemp("tp") / "c"
    return write_synthetic_checkpoint(path, config=CONFIG, seed=3, norm_separate=True)


def _metadata_bytes(root) -> int:
    "config.json, the index and every shard header: what a rank reads besides tensors."
    files = resolve_tensor_files(root, None)
    heads = sum(read_safetensors_layout(f)[1] for f in files)
    return heads + sum((root / n).stat().st_size
                       for n in ("config.json", "model.safetensors.index.json"))


def test_valid_degrees_and_refusals(ckpt):
    assert tp.valid_degrees(18432) == [p for p in range(1, 145) if 144 % p == 0]
    assert tp.valid_degrees(1024) == [1, 2, 4, 8]
    assert tp.valid_degrees(704) == [1]                  # a partial last block
    assert tp.shard_range(18432, 7, 8) == (16128, 18432)
    with pytest.raises(ValueError) as e:
        tp.check_degree(18432, 5)
    assert str(e.value) == (
        "world_size: expected a tensor-parallel degree that cuts intermediate_size "
        "18432 (144 blocks of 128) into equal runs of whole blocks, one of 1, 2, 3, 4, "
        "6, 8, 9, 12, 16, 18, 24, 36, 48, 72, 144; got 5")
    for bad in (0, 3, 16, True, "2", 2.0):
        with pytest.raises(ValueError, match="one of 1, 2, 4, 8; got"):
            tp.check_degree(1024, bad)
    with pytest.raises(ValueError, match=r"rank: expected an int in \[0, 4\), got 4"):
        tp.shard_range(1024, 4, 4)
    with pytest.raises(ValueError, match="one of 1, 2, 4, 8; got 3"):
        tp.load_dense_shard(ckpt, 0, 3)
    ragged = random_dense_block(320, 704, seed=1)
    with pytest.raises(ValueError, match=r"704 \(5.5 blocks of 128\).*one of 1; got 2"):
        tp.slice_block(ragged, 0, 2)


def test_shard_reads_its_slice_and_nothing_else(ckpt, monkeypatch):
    full = load_dense_block(ckpt)
    reads = []
    real_read = tp._readinto_exactly

    def counting(f, offset, buf, file, name):
        reads.append((file.name, offset, len(buf)))
        real_read(f, offset, buf, file, name)

    monkeypatch.setattr(tp, "_readinto_exactly", counting)
    meta = _metadata_bytes(ckpt)
    for p in (2, 4):
        for r in range(p):
            reads.clear()
            before = tp.rchar()
            shard = tp.load_dense_shard(ckpt, r, p)
            io = None if before is None else tp.rchar() - before
            cut = tp.slice_block(full, r, p)
            assert list(shard.state_dict()) == list(cut.state_dict())
            for (k, a), b in zip(shard.state_dict().items(), cut.state_dict().values()):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), k
            need = tp.shard_bytes(CONFIG, p)
            assert shard.bytes_read == need["total"] == sum(n for _, _, n in reads)
            assert need["weights"] * p == 3 * 256 * 1024
            spans = sorted((f, o, o + n) for f, o, n in reads)
            assert all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(spans, spans[1:]))
            # down_proj's columns: one read of F/P bytes per row of the 256 rows
            assert sum(n == 1024 // p for _, _, n in reads) >= 256
            if io is not None:                   # Linux: the kernel's own count
                assert meta <= io - shard.bytes_read <= meta + 64 * 1024, (io, meta)


def test_loader_checks_only_what_it_reads(ckpt, tmp_path):
    bad = write_synthetic_checkpoint(tmp_path / "bad", config=CONFIG, seed=3)
    shard_file = bad / "model-1-of-1.safetensors"
    header, start = read_safetensors_layout(shard_file)
    name = "model.layers.0.mlp.down_proj.weight_scale_inv"      # [2, 8]
    offset = start + header[name]["data_offsets"][0] + 4 * (1 * 8 + 5)
    with open(shard_file, "r+b") as f:                          # block (1, 5): rank 1's
        f.seek(offset)
        f.write(torch.tensor([-1.0]).numpy().tobytes())
    tp.load_dense_shard(bad, 0, 2)                              # rank 0 never reads it
    with pytest.raises(CheckpointError, match=r"down_proj.weight_scale_inv': block "
                                              r"\(1, 5\) has scale -1"):
        tp.load_dense_shard(bad, 1, 2)


def test_down_abs_terms_and_the_bound(rng):
    block = random_dense_block(256, 1024, seed=4)
    t = ffn_tensors(block)
    h = torch.randn(5, 256, generator=rng).to(torch.bfloat16)
    ref = tp.ffn_partial(h, t, "torch")
    w, s = t.down, t.down_scale
    total = tp.down_abs_terms(ref["p_fp8"], ref["p_scale"], w, s)
    steps = torch.zeros_like(total)
    for k in range(s.shape[1]):         # each step alone: fp8_matmul_blockwise's t_k
        cols, one = slice(128 * k, 128 * (k + 1)), slice(k, k + 1)
        steps += fp8_matmul_blockwise(
            ref["p_fp8"][:, cols].contiguous(), ref["p_scale"][:, one].contiguous(),
            w[:, cols].contiguous(), s[:, one].contiguous()).abs()
    assert torch.equal(total, steps)
    assert (total * (1 + tp.gamma(7)) >= ref["y"].double().abs()).all()   # 8 terms
    eps = 2.0 ** -24
    assert tp.sharded_sum_bound(144, 8) == pytest.approx(169 * eps, rel=1e-4)
    assert tp.sharded_sum_bound(8, 2) == pytest.approx(13 * eps, rel=1e-6)


@pytest.mark.parametrize("impl", ["torch", "fused"])
def test_split_in_one_process(impl, rng):
    """The ranks' arithmetic without processes: P slices, their partials summed in
    float32 in rank order, against the unsharded block: groups bit for bit, y within the
    bound; a y moved by twice its bound fails."""
    block = random_dense_block(256, 1024, seed=5)
    h = torch.randn(7, 256, generator=rng).to(torch.bfloat16)
    ref = tp.ffn_partial(h, ffn_tensors(block), impl)
    ref["out"] = ref["y"].to(torch.bfloat16) + h
    down = block.mlp.down_proj
    ref["abs_terms"] = tp.down_abs_terms(ref["p_fp8"], ref["p_scale"], down.weight,
                                         down.weight_scale_inv)
    for p in (1, 2, 4, 8) if impl == "torch" else (1, 2):     # the interpreter is slow
        parts = [tp.ffn_partial(h, ffn_tensors(tp.slice_block(block, r, p)), impl)
                 for r in range(p)]
        y = parts[0]["y"].clone()
        for q in parts[1:]:
            y += q["y"]
        for r, q in enumerate(parts):
            f0, f1 = tp.shard_range(1024, r, p)
            mine = dict(q, features=torch.tensor([f0, f1]), y_float32=y,
                        out_float32=y.to(torch.bfloat16) + h)
            c = tp.compare_with_single_rank(mine, ref, p)
            assert c["groups"] and c["within"] and c["ok"], (p, r, c)
        if p == 1:
            assert torch.equal(y, ref["y"])
    c_bound = tp.sharded_sum_bound(8, p)          # the last p: a y moved by 2x fails
    moved = ref["y"].clone()
    moved[3, 17] += 2 * c_bound * ref["abs_terms"][3, 17].float()
    mine = dict(parts[0], features=torch.tensor(tp.shard_range(1024, 0, p)),
                y_float32=moved, out_float32=ref["out"])
    assert not tp.compare_with_single_rank(mine, ref, p)["within"]


def test_shards_cut_k_like_the_unsharded_block(monkeypatch, rng, patch_everywhere):
    """On a GPU the planner cuts K by the number of tiles, and a shard has fewer: left
    alone, its gate/up GEMM would sum other slices, and the quantization groups of p
    would no longer be the unsharded ones. With the SM count stubbed (8 here makes the
    cuts differ at these small sizes, as 132 does at Kimi K2's) every rank's groups
    must still be bit for bit, through ffn_partial and through tp_ffn_block."""
    from kimi_mlp import kernels
    patch_everywhere(kernels, "device_sms", lambda device: 8)
    kernels._plan.cache_clear()
    cpu = torch.device("cpu")
    whole = kernels._plan_for("gate_up", 1, 1024, 1024, cpu)["split_k"]
    half = kernels._plan_for("gate_up", 1, 512, 1024, cpu)["split_k"]
    assert whole != half                       # the premise: shards would cut otherwise
    block = random_dense_block(1024, 1024, seed=7)
    h = torch.randn(1, 1024, generator=rng).to(torch.bfloat16)
    ref = tp.ffn_partial(h, ffn_tensors(block), "fused")
    ref["out"] = ref["y"].to(torch.bfloat16) + h
    down = block.mlp.down_proj
    ref["abs_terms"] = tp.down_abs_terms(ref["p_fp8"], ref["p_scale"], down.weight,
                                         down.weight_scale_inv)
    seen = []
    real = tp.ffn_partial
    monkeypatch.setattr(tp, "ffn_partial",
                        lambda *a, **k: seen.append(k.get("full_width")) or real(*a, **k))
    parts = []
    for r in range(2):
        shard = tp.slice_block(block, r, 2)
        parts.append(real(h, ffn_tensors(shard), "fused", full_width=1024))
        with pytest.raises(ValueError, match="group: expected 2 ranks"):
            tp.tp_ffn_block(h, shard)          # one process: refused before launching
    tp.tp_ffn_block(h, tp.slice_block(block, 0, 1))
    assert seen == [1024]                      # tp_ffn_block passes the whole width
    y = parts[0]["y"] + parts[1]["y"]
    for r, q in enumerate(parts):
        mine = dict(q, features=torch.tensor(tp.shard_range(1024, r, 2)), y_float32=y,
                    out_float32=y.to(torch.bfloat16) + h)
        c = tp.compare_with_single_rank(mine, ref, 2)
        assert c["groups"] and c["ok"], (r, c)
    kernels._plan.cache_clear()


def test_one_rank_is_the_unsharded_block(rng):
    block = random_dense_block(256, 1024, seed=6)
    shard = tp.slice_block(block, 0, 1)
    h = torch.randn(2, 3, 256, generator=rng).to(torch.bfloat16)
    with torch.no_grad():
        block.mlp.mode = "w8a8"
        assert torch.equal(tp.tp_ffn_block(h, shard, impl="torch"), block(h))
        assert torch.equal(shard(h), fused_ffn_block(h, block))      # interpreter
        none = torch.empty(0, 256, dtype=torch.bfloat16)
        assert tp.tp_ffn_block(none, shard).shape == (0, 256)        # no tokens
    with pytest.raises(ValueError, match="group: expected 2 ranks"):
        tp.tp_ffn_block(h, tp.slice_block(block, 0, 2))
    with pytest.raises(ValueError, match="impl: expected one of"):
        tp.tp_ffn_block(h, shard, impl="cuda")
    with pytest.raises(ValueError, match="reduce_dtype: expected one of"):
        tp.tp_ffn_block(h, shard, reduce_dtype=torch.float16)
    with pytest.raises(ValueError, match="h: expected torch.bfloat16"):
        tp.tp_ffn_block(h.float(), shard)


@pytest.mark.parametrize("world_size, impl", [(2, "torch"), (4, "fused")])
def test_spawned_ranks_on_gloo(ckpt, world_size, impl):
    ranks = tp.spawn_ranks(tp.tp_rank_run, world_size, str(ckpt), 5, 2, impl, True,
                           timeout_s=SPAWN_TIMEOUT_S)
    ref, meta = ranks[0]["reference"], _metadata_bytes(ckpt)
    need = tp.shard_bytes(CONFIG, world_size)
    for r, out in enumerate(ranks):
        assert out["bytes_read"] == need["total"]
        if out["rchar"] is not None:
            assert meta <= out["rchar"] - out["bytes_read"] <= meta + 64 * 1024
        assert tuple(out["features"].tolist()) == tp.shard_range(1024, r, world_size)
        c = tp.compare_with_single_rank(out, ref, world_size)
        assert c["groups"] and c["within"] and c["ratio"] <= 1, (r, c)
        assert c["out_same"] > 0.99
        assert torch.equal(out["out_float32"], ranks[0]["out_float32"])  # replicated
        assert torch.equal(out["out_bfloat16"], ranks[0]["out_bfloat16"])
    assert not torch.equal(ranks[0]["out_bfloat16"], ranks[0]["out_float32"])


def _torchrun(ckpt, ranks):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(ranks), "-m", "kimi_mlp", "tp-check", str(ckpt),
           "--tokens", "3"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=SPAWN_TIMEOUT_S,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_tp_check_under_torchrun(ckpt):
    r = _torchrun(ckpt, 2)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and not r.stderr
    total = tp.shard_bytes(CONFIG, 2)["total"]
    for rank, line in enumerate(lines[:2]):
        assert line.startswith(f"rank {rank}/2: read {total:,} B of tensors")
        assert "the gain: True; groups bit-identical: True;" in line
        assert "<= 1: OK" in line
    assert lines[2] == "tp-check: 2 rank(s), gloo on the CPU, impl fused: OK"
    r = _torchrun(ckpt, 3)                   # refused, once, by rank 0, before the exit
    assert r.returncode != 0 and not r.stdout
    assert r.stderr.splitlines()[0] == (
        "error: ranks 0, 1, 2: world_size: expected a tensor-parallel degree that cuts "
        "intermediate_size 1024 (8 blocks of 128) into equal runs of whole blocks, one "
        "of 1, 2, 4, 8; got 3")
    assert r.stderr.count("world_size: expected") == 1
    # what torchrun adds after a rank's line, as the README says: its own traceback,
    # ending in ChildFailedError, and a table of the failed ranks
    assert "Traceback" in r.stderr and "ChildFailedError" in r.stderr
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "ChildFailedError" in readme


def test_tp_check_in_process(ckpt, capsys, monkeypatch):
    from kimi_mlp.cli import main
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    assert main(["tp-check", str(ckpt), "--tokens", "2", "--impl", "torch"]) == 0
    out = capsys.readouterr().out.splitlines()       # a world of one, through the CLI
    assert out[-1] == "tp-check: 1 rank(s), gloo on the CPU, impl torch: OK"
    monkeypatch.setenv("WORLD_SIZE", "3")             # no rendezvous: refused at once
    assert tp.main([str(ckpt)]) == 1
    assert capsys.readouterr().err == (
        "error: WORLD_SIZE: expected 1 without torchrun's rendezvous (MASTER_ADDR is "
        "not set), got 3; start the ranks with torchrun\n")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert tp.main([str(ckpt.parent / "no-such-checkpoint")]) == 1
    assert capsys.readouterr().err.startswith("error: rank 0: DIR: expected a directory")
    monkeypatch.setenv("RANK", "x")
    assert tp.main([str(ckpt)]) == 1
    assert "RANK: expected a non-negative int (torchrun sets it), got 'x'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        tp.main([str(ckpt), "--tokens", "0"])
    assert e.value.code == 2
