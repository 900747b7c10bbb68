"""Chapter 6: the Kimi-format checkpoint, its loader and its writer (the command line is in
test_cli.py, hostile inputs in test_hostile_checkpoints.py)."""
import json
import os
import stat

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import kimi_mlp.checkpoint as ck
from kimi_mlp.block import ResidualBlock
from kimi_mlp.checkpoint import (K2_0905_SHARD_NAME, dense_block_float64, dense_block_tensors,
                                 dense_block_w8a8_float64, load_dense_block, relative_error,
                                 write_synthetic_checkpoint)
from kimi_mlp.cli import main
from kimi_mlp.config import KimiK2Config, count_parameters, dense_mlp_parameters
from kimi_mlp.safetensors_io import (INDEX_FILE, CheckpointError, checkpoint_tensors,
                                     resolve_tensor_files)
from kimi_mlp.fp8 import Fp8DenseMLP
from kimi_mlp.rmsnorm import RMSNorm

GAIN = "model.layers.0.post_attention_layernorm.weight"
GATE = "model.layers.0.mlp.gate_proj.weight"
RAGGED = KimiK2Config(hidden_size=200, intermediate_size=330, num_hidden_layers=1)  # partial blocks


def test_tensor_list_matches_the_real_checkpoint():
    "Layer 0 of Kimi-K2-Instruct as its safetensors index lists it: names, dtypes and shapes."
    specs = dense_block_tensors(KimiK2Config())
    assert specs == {
        GAIN: (torch.bfloat16, (7168,)),
        GATE: (torch.float8_e4m3fn, (18432, 7168)),
        GATE + "_scale_inv": (torch.float32, (144, 56)),
        "model.layers.0.mlp.up_proj.weight": (torch.float8_e4m3fn, (18432, 7168)),
        "model.layers.0.mlp.up_proj.weight_scale_inv": (torch.float32, (144, 56)),
        "model.layers.0.mlp.down_proj.weight": (torch.float8_e4m3fn, (7168, 18432)),
        "model.layers.0.mlp.down_proj.weight_scale_inv": (torch.float32, (56, 144)),
    }
    with pytest.raises(ValueError, match="FP8 e4m3"):
        dense_block_tensors(KimiK2Config(quant_method=None, weight_block_size=None))


def _index(root):
    return json.loads((root / INDEX_FILE).read_text())


def test_writer_layout_and_index(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "c", num_layers=2, norm_separate=True)
    assert sorted(p.name for p in root.iterdir()) == [
        "config.json", "model-1-of-3.safetensors", "model-2-of-3.safetensors",
        "model-3-of-3.safetensors", INDEX_FILE]
    assert not [p for p in tmp_path.iterdir() if p.name != "c"], "no temporary leftovers"
    index = _index(root)
    wm = index["weight_map"]
    assert wm[GAIN] == wm["model.layers.1.post_attention_layernorm.weight"] == "model-3-of-3.safetensors"
    assert wm[GATE] == "model-1-of-3.safetensors"
    assert not any(k.startswith("model.layers.1.mlp") for k in wm), "layer 1 is MoE under Kimi's rule"
    # total_size is the sum of the tensors' bytes, read back with an independent reader
    total = 0
    for shard in set(wm.values()):
        with safe_open(root / shard, "pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                total += t.numel() * t.element_size()
                assert wm[k] == shard
    assert index["metadata"]["total_size"] == total
    cfg = KimiK2Config.from_json(root / "config.json")
    assert cfg.num_hidden_layers == 2 and (cfg.hidden_size, cfg.intermediate_size) == (256, 640)
    assert cfg.dense_layers == [0]
    # count_parameters on the headers equals the config's arithmetic (+ the two gains)
    assert count_parameters(root) == dense_mlp_parameters(cfg)["total"] + 2 * cfg.hidden_size


def test_writer_dtypes_shapes_and_weights_are_realistic(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "c", single_file=True)
    specs = dense_block_tensors(ck.SMALL_CONFIG)
    with safe_open(root / "model.safetensors", "pt") as f:
        assert set(f.keys()) == set(specs)
        for name, (dtype, shape) in specs.items():
            t = f.get_tensor(name)
            assert (t.dtype, tuple(t.shape)) == (dtype, shape), name
        gain = f.get_tensor(GAIN).float()
        scale = f.get_tensor(GATE + "_scale_inv")
    assert 0.8 < gain.median() < 1.25 and gain.std() > 0.1          # around 1, with spread
    assert (scale > 0).all() and scale.max() / scale.min() > 1.5     # blocks differ
    w = ck.synthetic_weight(512, 1024, torch.Generator().manual_seed(0))
    kurtosis = ((w - w.mean()) ** 4).mean() / w.var() ** 2
    assert 0.7 < w.std() * 1024 ** 0.5 < 1.4 and kurtosis > 6       # ~1/sqrt(K), heavy-tailed


def test_writer_is_reproducible_from_seed(tmp_path):
    a = write_synthetic_checkpoint(tmp_path / "a", seed=3)
    b = write_synthetic_checkpoint(tmp_path / "b", seed=3)
    c = write_synthetic_checkpoint(tmp_path / "c", seed=4)
    shard = "model-1-of-1.safetensors"
    assert (a / shard).read_bytes() == (b / shard).read_bytes() != (c / shard).read_bytes()


def test_writer_refuses_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(FileExistsError, match="path: expected a new or empty directory"):
        write_synthetic_checkpoint(tmp_path / "full")
    with pytest.raises(ValueError, match="shard_name"):
        write_synthetic_checkpoint(tmp_path / "bad", shard_name="../model-{i}.safetensors")
    calls = []

    def failing_save(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:
            raise OSError("disk full")
        return save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ck, "save_file", failing_save)      # the name chapter 6's writer calls
    with pytest.raises(OSError, match="disk full"):
        write_synthetic_checkpoint(tmp_path / "half", norm_separate=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"], "no partial checkpoint left behind"


def _built_by_hand(tensors, cfg, layer=0):
    "A ResidualBlock assembled directly from the tensors (no loader code involved)."
    p = f"model.layers.{layer}."
    mlp = Fp8DenseMLP(cfg.hidden_size, cfg.intermediate_size)
    for proj in ("gate_proj", "up_proj", "down_proj"):
        getattr(mlp, proj).weight = tensors[f"{p}mlp.{proj}.weight"]
        getattr(mlp, proj).weight_scale_inv = tensors[f"{p}mlp.{proj}.weight_scale_inv"]
    norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(tensors[p + "post_attention_layernorm.weight"])
    return ResidualBlock(norm, mlp)


def _read_all(root):
    out = {}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


LAYOUTS = {
    "single_file": dict(single_file=True),
    "sharded_norm_elsewhere": dict(norm_separate=True),
    "0905_names_three_layers": dict(shard_name=K2_0905_SHARD_NAME, num_layers=3),
    "ragged_dense_first_two": dict(config=KimiK2Config(hidden_size=200, intermediate_size=330,
                                                       first_k_dense_replace=2, rms_norm_eps=1e-5),
                                   num_layers=3, norm_separate=True),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_and_forward(tmp_path, layout):
    kwargs = LAYOUTS[layout]
    root = write_synthetic_checkpoint(tmp_path / "c", seed=7, **kwargs)
    if "shard_name" in kwargs:
        assert (root / "model-00001-of-000003.safetensors").is_file()
    cfg = KimiK2Config.from_json(root / "config.json")
    written = _read_all(root)
    h = torch.randn(2, 3, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for layer in cfg.dense_layers:
        block = load_dense_block(root, layer=layer)
        assert isinstance(block, ResidualBlock) and isinstance(block.post_attention_layernorm, RMSNorm)
        assert isinstance(block.mlp, Fp8DenseMLP) and block.config == cfg
        assert block.post_attention_layernorm.eps == cfg.rms_norm_eps
        state = block.state_dict()
        assert len(state) == 7
        for key, t in state.items():
            ref = written[f"model.layers.{layer}.{key}"]
            assert t.dtype == ref.dtype and torch.equal(t.view(torch.uint8), ref.view(torch.uint8)), key
        by_hand = _built_by_hand(written, cfg, layer)
        with torch.no_grad():
            for mode in ("w8a16", "w8a8"):
                block.mlp.mode = by_hand.mlp.mode = mode
                y = block(h)
                assert y.dtype == torch.bfloat16 and torch.equal(y, by_hand(h)), mode
                err = relative_error(y, ck.CHECK_ORACLES[mode](block, h))
                assert err <= ck.CHECK_BOUNDS[mode], (mode, err)



def _forward_and_wrong(block, h, ref):
    "The forward's output, the same with its MLP part 5% too large, and with 5% of noise."
    with torch.no_grad():
        out = block(h).double()
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    noise *= 0.05 * ref.norm() / noise.norm()
    h64 = h.double()
    return out, h64 + 1.05 * (out - h64), out + noise


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_check_bounds_pass_the_forwards_and_fail_a_5_percent_error(tmp_path, seed):
    """CHECK_BOUNDS with CHECK_ORACLES on `check`'s inputs (its synthetic checkpoint, 8 tokens
    from its generator): each real forward passes with a margin of 2, and the same output with
    an extra 5% error (its MLP part scaled by 1.05, or 5% of independent noise added) fails."""
    root = write_synthetic_checkpoint(tmp_path / "c", seed=seed, norm_separate=True)
    block = load_dense_block(root)
    h = torch.randn(8, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for mode, bound in ck.CHECK_BOUNDS.items():
        block.mlp.mode = mode
        ref = ck.CHECK_ORACLES[mode](block, h)
        out, larger, noisy = _forward_and_wrong(block, h, ref)
        assert relative_error(out, ref) <= 0.5 * bound, mode
        assert relative_error(larger, ref) > bound, mode
        assert relative_error(1.05 * out, ref) > bound, mode
        assert relative_error(noisy, ref) > bound, mode
    assert ck.CHECK_BOUNDS["w8a8"] < relative_error(out, dense_block_float64(block, h))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("how", ["h_small", "gain_large", "ragged_one_token"])
def test_w8a8_oracle_when_the_mlp_dominates_the_output(tmp_path, seed, how):
    """dense_block_w8a8_float64 agrees with the w8a8 forward within half of its bound when the
    MLP's output is nearly all of the block's output (h scaled by 2^-8, or a gain 16 times
    larger; a partial quantization group and one token), and a 5% error still fails; the
    unquantized oracle would fail the forward there."""
    config = RAGGED if how == "ragged_one_token" else None
    root = write_synthetic_checkpoint(tmp_path / "c", config=config, seed=seed)
    block = load_dense_block(root, mode="w8a8")
    d, m = block.config.hidden_size, 1 if how == "ragged_one_token" else 8
    h = torch.randn(m, d, generator=torch.Generator().manual_seed(seed))
    h = h * 2.0 ** -8 if how != "gain_large" else h
    h = h.to(torch.bfloat16)
    if how == "gain_large":
        block.post_attention_layernorm.weight.mul_(16)          # exact in bf16
    ref, bound = dense_block_w8a8_float64(block, h), ck.CHECK_BOUNDS["w8a8"]
    assert ref.dtype == torch.float64 and ref.shape == h.shape
    y = ref - h.double()
    assert y.norm() > 0.9 * ref.norm()                               # the MLP dominates
    out, larger, noisy = _forward_and_wrong(block, h, ref)
    assert relative_error(out, ref) <= 0.5 * bound
    assert relative_error(larger, ref) > bound and relative_error(noisy, ref) > bound
    assert relative_error(out, dense_block_float64(block, h)) > bound


def test_w8a8_oracle_quantizes_where_the_forward_does(tmp_path):
    """Without the output's two bf16 roundings (the forward's MLP part kept in float32) the
    w8a8 forward equals the oracle to float32 accumulation: its x codes are the forward's."""
    block = load_dense_block(write_synthetic_checkpoint(tmp_path / "c"), mode="w8a8")
    h = torch.randn(4, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    mlp = block.mlp
    with torch.no_grad():
        x = block.post_attention_layernorm(h)
        g = mlp.gate_proj(x, out_dtype=torch.float32)
        u = mlp.up_proj(x, out_dtype=torch.float32)
        y32 = mlp.down_proj(torch.nn.functional.silu(g) * u, out_dtype=torch.float32)
    ref = dense_block_w8a8_float64(block, h)
    assert relative_error(h.double() + y32.double(), ref) < 1e-5
    zero = dense_block_w8a8_float64(block, torch.zeros(2, 256, dtype=torch.bfloat16))
    assert torch.equal(zero, torch.zeros(2, 256, dtype=torch.float64))   # no NaN from 0/0


def test_not_a_dense_layer_and_out_of_range(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "c", num_layers=2)
    with pytest.raises(ValueError, match="layer: expected a dense layer .* got 1, a mixture-of-experts"):
        load_dense_block(root, layer=1)
    with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 2\), got 2"):
        load_dense_block(root, layer=2)


def test_config_argument_overrides_and_is_checked(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "c")
    block = load_dense_block(root, config=ck.SMALL_CONFIG)
    assert block.config == ck.SMALL_CONFIG
    with pytest.raises(CheckpointError, match=r"model-1-of-1.safetensors: tensor '.*gate_proj.weight': "
                                              r"expected shape \[512, 256\], got \[640, 256\]"):
        load_dense_block(root, config=KimiK2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=1))


def _snapshot(root):
    return {p.relative_to(root): (p.stat().st_mtime_ns, p.stat().st_size, stat.S_IMODE(p.stat().st_mode))
            for p in [root, *root.rglob("*")]}


def test_loading_never_writes(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "c", norm_separate=True)
    for p in root.iterdir():
        p.chmod(0o444)
    root.chmod(0o555)
    try:
        before = _snapshot(root)
        load_dense_block(root)
        main(["info", str(root)])
        assert _snapshot(root) == before
    finally:
        root.chmod(0o755)


def _fresh(tmp_path, name="c"):
    return write_synthetic_checkpoint(tmp_path / name, norm_separate=True)


def _edit_index(root, change):
    index = _index(root)
    change(index["weight_map"])
    (root / INDEX_FILE).write_text(json.dumps(index))


def test_error_missing_index_entry(tmp_path):
    root = _fresh(tmp_path)
    _edit_index(root, lambda wm: wm.pop(GATE + "_scale_inv"))
    with pytest.raises(CheckpointError, match=rf"{INDEX_FILE}: no entry for tensor '{GATE}_scale_inv'"):
        load_dense_block(root)


def test_error_missing_shard(tmp_path):
    root = _fresh(tmp_path)
    (root / "model-2-of-2.safetensors").unlink()
    with pytest.raises(CheckpointError, match=rf"model-2-of-2.safetensors: no such shard file .*'{GAIN}'"):
        load_dense_block(root)
    with pytest.raises(FileNotFoundError):                             # also a FileNotFoundError
        load_dense_block(root)


def test_error_tensor_not_in_its_shard(tmp_path):
    root = _fresh(tmp_path)
    _edit_index(root, lambda wm: wm.update({GAIN: "model-1-of-2.safetensors"}))   # stale index
    with pytest.raises(CheckpointError, match=rf"model-1-of-2.safetensors: tensor '{GAIN}' is not in this file"):
        load_dense_block(root)


@pytest.mark.parametrize("tensor, bad, message", [
    (GAIN, torch.ones(256), r"expected dtype BF16 \(torch.bfloat16\), got F32"),
    (GAIN, torch.ones(255, dtype=torch.bfloat16), r"expected shape \[256\], got \[255\]"),
    (GATE + "_scale_inv", torch.ones(5, 2, dtype=torch.float64), "expected dtype F32"),
    (GATE + "_scale_inv", torch.ones(5, 3), r"expected shape \[5, 2\], got \[5, 3\]"),
    (GATE, torch.zeros(640, 256, dtype=torch.bfloat16), "expected dtype F8_E4M3"),
    (GATE + "_scale_inv", torch.full((5, 2), float("nan")), r"block \(0, 0\) has scale nan"),
    (GAIN, torch.full((256,), float("inf"), dtype=torch.bfloat16), "expected finite values"),
])
def test_error_wrong_dtype_shape_or_values(tmp_path, tensor, bad, message):
    root = _fresh(tmp_path)
    shard = root / _index(root)["weight_map"][tensor]
    tensors = _read_all(root)
    with safe_open(shard, "pt") as f:
        keep = {k: tensors[k] for k in f.keys()}
    keep[tensor] = bad
    save_file(keep, shard)
    with pytest.raises(CheckpointError, match=rf"{shard.name}: tensor '{tensor}': {message}"):
        load_dense_block(root)


def test_error_truncated_shard(tmp_path):
    root = _fresh(tmp_path)
    shard = root / "model-1-of-2.safetensors"
    os.truncate(shard, shard.stat().st_size - 10)
    with pytest.raises(CheckpointError, match=r"model-1-of-2.safetensors: tensor 'model.layers.0.mlp.\w+.weight': "
                                              "file truncated or corrupt"):
        load_dense_block(root)
    os.truncate(shard, 4)
    with pytest.raises(CheckpointError, match=rf"model-1-of-2.safetensors: not a safetensors file.*'{GATE}'"):
        load_dense_block(root)


def test_error_corrupt_header(tmp_path):
    root = _fresh(tmp_path)
    shard = root / "model-1-of-2.safetensors"
    with open(shard, "r+b") as f:
        f.seek(8)
        f.write(b"#!")
    with pytest.raises(CheckpointError, match=rf"model-1-of-2.safetensors: corrupt safetensors header.*'{GATE}'"):
        load_dense_block(root)
    with open(shard, "r+b") as f:
        f.write((10**12).to_bytes(8, "little"))                        # header longer than the file
    with pytest.raises(CheckpointError, match=rf"model-1-of-2.safetensors: corrupt safetensors header.*'{GATE}'"):
        load_dense_block(root)


def test_error_header_offsets_inconsistent(tmp_path):
    "A header whose byte count disagrees with dtype x shape is corrupt, even if it fits the file."
    root = _fresh(tmp_path)
    shard = root / "model-2-of-2.safetensors"
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header[GAIN]["shape"] = [128]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    shard.write_bytes(raw[:8] + text + raw[8 + n:])
    with pytest.raises(CheckpointError, match=rf"model-2-of-2.safetensors: tensor '{GAIN}': corrupt header: "
                                              "512 data bytes for BF16 \\[128\\]"):
        load_dense_block(root)


def test_error_bad_index_json(tmp_path):
    root = _fresh(tmp_path)
    (root / INDEX_FILE).write_text("{")
    with pytest.raises(CheckpointError, match=f"{INDEX_FILE}: corrupt safetensors index"):
        load_dense_block(root)
    (root / INDEX_FILE).write_text('{"weight_map": []}')
    with pytest.raises(CheckpointError, match="weight_map object"):
        load_dense_block(root)


def test_error_no_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json: no such config file"):
        load_dense_block(tmp_path / "empty")
    with pytest.raises(CheckpointError, match=f"expected {INDEX_FILE} or model.safetensors"):
        load_dense_block(tmp_path / "empty", config=ck.SMALL_CONFIG)
    with pytest.raises(FileNotFoundError, match="checkpoint_dir: expected a directory"):
        resolve_tensor_files(tmp_path / "nothing", [GAIN])


@pytest.mark.parametrize("entry", ["../outside.safetensors", "sub/../../outside.safetensors", "ABSOLUTE"])
def test_error_index_entry_outside_the_directory(tmp_path, entry):
    root = _fresh(tmp_path)
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((root / "model-2-of-2.safetensors").read_bytes())   # a valid file, still refused
    entry = str(outside) if entry == "ABSOLUTE" else entry
    _edit_index(root, lambda wm: wm.update({GAIN: entry}))
    with pytest.raises(CheckpointError, match=rf"tensor '{GAIN}' is mapped to .*outside the checkpoint directory"):
        load_dense_block(root)


def test_symlinks_escaping_refused_inside_allowed(tmp_path):
    root = _fresh(tmp_path)
    shard = root / "model-2-of-2.safetensors"
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(CheckpointError, match=rf"tensor '{GAIN}' is mapped to 'model-2-of-2.safetensors', "
                                              "which resolves to .*outside the checkpoint directory"):
        load_dense_block(root)
    (root / "blobs").mkdir()
    (root / "blobs" / "gain").write_bytes(outside.read_bytes())
    shard.unlink()
    shard.symlink_to("blobs/gain")                                    # a link that stays inside: fine
    load_dense_block(root)


def test_hugging_face_cache_layout(tmp_path):
    "snapshots/<rev>/ holds links into ../../blobs/, as huggingface_hub's cache does: allowed."
    src = _fresh(tmp_path, "src")
    repo = tmp_path / "models--moonshotai--Kimi-K2-Instruct"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "fd1984e2b7a3"
    snap.mkdir(parents=True)
    for i, p in enumerate(sorted(src.iterdir())):
        (repo / "blobs" / f"sha{i}").write_bytes(p.read_bytes())
        (snap / p.name).symlink_to(f"../../blobs/sha{i}")
    block = load_dense_block(snap)
    assert torch.equal(block.mlp.gate_proj.weight.view(torch.uint8),
                       load_dense_block(src).mlp.gate_proj.weight.view(torch.uint8))
    other = tmp_path / "elsewhere.safetensors"                        # but not outside the repo
    other.write_bytes((src / "model-2-of-2.safetensors").read_bytes())
    (snap / "model-2-of-2.safetensors").unlink()
    (snap / "model-2-of-2.safetensors").symlink_to(other)
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        load_dense_block(snap)


def test_writer_extra_tensors(tmp_path):
    "Other tensors join layer 0's shard; the loader reads around them."
    root = write_synthetic_checkpoint(tmp_path / "c", extra_tensors={
        "model.embed_tokens.weight": ((1000, 256), torch.bfloat16)})
    index = _index(root)
    assert index["weight_map"]["model.embed_tokens.weight"] == "model-1-of-1.safetensors"
    assert count_parameters(root) == 3 * 256 * 640 + 256 + 1000 * 256
    assert load_dense_block(root).mlp.gate_proj.weight.shape == (640, 256)
    with pytest.raises(ValueError, match="extra_tensors: 'model.layers.0.mlp.x' would replace"):
        write_synthetic_checkpoint(tmp_path / "d", extra_tensors={"model.layers.0.mlp.x": ((1,), torch.float32)})


def test_opens_only_the_shards_it_needs(tmp_path):
    "Layer 1's shard is garbage; loading layer 0 never opens it."
    root = write_synthetic_checkpoint(tmp_path / "c", num_layers=2)
    (root / "model-2-of-2.safetensors").write_bytes(b"not a safetensors file at all")
    block = load_dense_block(root, layer=0)
    assert block.post_attention_layernorm.weight.shape == (256,)
    with pytest.raises(CheckpointError, match="model-2-of-2.safetensors: corrupt safetensors header"):
        checkpoint_tensors(root)                                      # reading every header does fail


def test_read_tensors_accepts_the_header_when_no_spec(tmp_path):
    root = write_synthetic_checkpoint(tmp_path / "c", single_file=True)
    out = ck.read_tensors(root / "model.safetensors", {GAIN: None, GATE + "_scale_inv": None})
    assert out[GAIN].dtype == torch.bfloat16 and out[GATE + "_scale_inv"].shape == (5, 2)
