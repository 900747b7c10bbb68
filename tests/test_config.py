"""Chapter 1: the config, the dense-layer rule, parameter accounting, header-only counting."""
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from kimi_mlp.config import (KimiK2Config, count_parameters, dense_mlp_bytes, dense_mlp_parameters,
                             dense_mlp_shapes, gelu_mlp_parameters, parameters_in, scale_shape)
from kimi_mlp.safetensors_io import (CheckpointError, checkpoint_tensors, read_safetensors_header,
                                     read_safetensors_layout)

REAL = KimiK2Config()


def test_real_values():
    assert (REAL.hidden_size, REAL.intermediate_size, REAL.num_hidden_layers) == (7168, 18432, 61)
    assert REAL.rms_norm_eps == 1e-6 and REAL.hidden_act == "silu"
    assert (REAL.quant_method, REAL.fmt, REAL.weight_block_size) == ("fp8", "e4m3", (128, 128))


def test_dense_layer_rule():
    assert REAL.dense_layers == [0]
    assert REAL.is_dense_layer(0) and not any(REAL.is_dense_layer(i) for i in range(1, 61))
    assert KimiK2Config(first_k_dense_replace=3).dense_layers == [0, 1, 2]
    assert KimiK2Config(n_routed_experts=None, num_hidden_layers=4).dense_layers == [0, 1, 2, 3]
    assert KimiK2Config(moe_layer_freq=2, num_hidden_layers=6).dense_layers == [0, 1, 3, 5]
    with pytest.raises(ValueError, match="layer_idx"):
        REAL.is_dense_layer(61)


def test_seed_table_exactly():
    counts = dense_mlp_parameters(REAL)
    assert counts == {"gate_proj": 132_120_576, "up_proj": 132_120_576,
                      "down_proj": 132_120_576, "total": 396_361_728}
    assert counts["total"] * len(REAL.dense_layers) == 396_361_728
    assert gelu_mlp_parameters(REAL) == 264_241_152
    nbytes = dense_mlp_bytes(REAL)
    assert nbytes["fp8"] / 2**20 == 378 and gelu_mlp_parameters(REAL) / 2**20 == 252
    assert nbytes["bf16"] / 2**20 == 756
    assert nbytes["scales"] == 3 * 144 * 56 * 4 == 96_768
    assert dense_mlp_shapes(REAL) == {"gate_proj": (18432, 7168), "up_proj": (18432, 7168),
                                      "down_proj": (7168, 18432)}


def test_scale_shape_ragged():
    assert scale_shape((18432, 7168)) == (144, 56)
    assert scale_shape((7168, 18432)) == (56, 144)
    assert scale_shape((576, 7168)) == (5, 56)  # kv_a_proj_with_mqa: a partial last row of blocks


@pytest.mark.parametrize("bad, field", [
    ({"hidden_size": 0}, "hidden_size"), ({"intermediate_size": -5}, "intermediate_size"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers"), ({"hidden_size": True}, "hidden_size"),
    ({"hidden_act": "gelu"}, "hidden_act"), ({"weight_block_size": (128,)}, "weight_block_size"),
    ({"weight_block_size": (128, 0)}, "weight_block_size"),
    ({"weight_block_size": "128x128"}, "weight_block_size"), ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace"), ({"moe_layer_freq": 0}, "moe_layer_freq"),
    ({"rope_theta": float("inf")}, "rope_theta"), ({"rope_theta": "50000"}, "rope_theta"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"), ({"torch_dtype": ["bfloat16"]}, "torch_dtype"),
    ({"quant_method": 8}, "quant_method"), ({"n_routed_experts": 0}, "n_routed_experts"),
])
def test_validation_names_the_field(bad, field):
    with pytest.raises(ValueError, match=rf"KimiK2Config\.{field}: expected .* got"):
        KimiK2Config(**bad)


def test_from_json_reads_hf_layout(tmp_path):
    hf = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
          "intermediate_size": 18432, "num_hidden_layers": 61, "rms_norm_eps": 1e-05,
          "rope_scaling": {"type": "yarn", "factor": 32.0}, "bos_token_id": 163584,
          "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": [128, 64]}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(hf))
    cfg = KimiK2Config.from_json(p)
    assert cfg.rms_norm_eps == 1e-05 and cfg.weight_block_size == (128, 64)
    assert KimiK2Config.from_dict(cfg.to_dict()) == cfg
    del hf["quantization_config"]
    p.write_text(json.dumps(hf))
    assert KimiK2Config.from_json(p).quant_method is None
    p.write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: corrupt config file .not valid JSON"):
        KimiK2Config.from_json(p)
    p.write_text('{"hidden_size": 0}')
    with pytest.raises(CheckpointError, match="config.json: KimiK2Config.hidden_size: expected"):
        KimiK2Config.from_json(p)
    with pytest.raises(FileNotFoundError, match="no such config file"):
        KimiK2Config.from_json(tmp_path / "missing.json")


def _small_checkpoint(cfg):
    tensors = {}
    for name, (n, k) in dense_mlp_shapes(cfg).items():
        key = f"model.layers.0.mlp.{name}.weight"
        tensors[key] = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
        tensors[key + "_scale_inv"] = torch.ones(scale_shape((n, k)))
    norm = {"model.layers.0.post_attention_layernorm.weight": torch.ones(cfg.hidden_size, dtype=torch.bfloat16),
            "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(32)}
    return tensors, norm


def test_count_parameters_single_and_sharded(tmp_path):
    cfg = KimiK2Config(hidden_size=200, intermediate_size=330)  # ragged: not multiples of 128
    tensors, norm = _small_checkpoint(cfg)
    expected = 3 * 200 * 330 + 200  # scales and inv_freq are not parameters
    save_file({**tensors, **norm}, tmp_path / "model.safetensors")
    assert count_parameters(tmp_path / "model.safetensors") == expected
    assert count_parameters(tmp_path) == expected
    shard = tmp_path / "sharded"
    shard.mkdir()
    save_file(tensors, shard / "model-1-of-2.safetensors")
    save_file(norm, shard / "model-2-of-2.safetensors")
    wm = {**{k: "model-1-of-2.safetensors" for k in tensors}, **{k: "model-2-of-2.safetensors" for k in norm}}
    (shard / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    assert count_parameters(shard) == expected
    assert count_parameters(shard / "model.safetensors.index.json") == expected
    wm["model.layers.0.mlp.extra.weight"] = "model-1-of-2.safetensors"
    (shard / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointError, match="model-1-of-2.safetensors: the index puts tensor "
                                              "'model.layers.0.mlp.extra.weight' in this file"):
        count_parameters(shard)


@pytest.mark.parametrize("entry", ["../outside.safetensors", "sub/../../outside.safetensors",
                                   "ABSOLUTE", "LINK"])
def test_count_parameters_refuses_files_outside_the_checkpoint(tmp_path, entry):
    "The index is untrusted input: an entry (or a link) leading outside the directory is refused."
    cfg = KimiK2Config(hidden_size=256, intermediate_size=384)
    tensors, norm = _small_checkpoint(cfg)
    root = tmp_path / "ckpt"
    root.mkdir()
    save_file(tensors, root / "model-1-of-2.safetensors")
    outside = tmp_path / "outside.safetensors"
    save_file(norm, outside)                                  # a valid file, still refused
    shard2 = "model-2-of-2.safetensors"
    if entry == "LINK":
        (root / shard2).symlink_to(outside)
    wm = {**{k: "model-1-of-2.safetensors" for k in tensors},
          **{k: {"ABSOLUTE": str(outside), "LINK": shard2}.get(entry, entry) for k in norm}}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        count_parameters(root)


def test_count_parameters_reads_headers_only(tmp_path, monkeypatch):
    "Counting must not touch tensor data: garbage in the data region does not change the count."
    cfg = KimiK2Config(hidden_size=256, intermediate_size=384)
    tensors, norm = _small_checkpoint(cfg)
    path = tmp_path / "model.safetensors"
    save_file({**tensors, **norm}, path)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(raw[: 8 + n] + b"\xff" * (len(raw) - 8 - n))   # same size, no tensors
    assert count_parameters(garbage) == count_parameters(path) == 3 * 256 * 384 + 256
    header, data_start = read_safetensors_layout(garbage)
    assert data_start == 8 + n and header == read_safetensors_header(path)
    rows = checkpoint_tensors(path)
    assert parameters_in(rows) == count_parameters(path) and len(rows) == 8
    (tmp_path / "cut.safetensors").write_bytes(raw[: 8 + n] + b"\0")     # but the sizes are checked
    with pytest.raises(CheckpointError, match="file truncated or corrupt"):
        count_parameters(tmp_path / "cut.safetensors")
    key = "model.layers.0.post_attention_layernorm.weight"
    begin, end = header[key]["data_offsets"]
    raw = path.read_bytes()[data_start + begin:data_start + end]  # the gain's bytes: bf16 ones
    assert torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).eq(1).all()


def test_corrupt_headers(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_safetensors_header(p)
    p.write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="corrupt safetensors header"):
        read_safetensors_header(p)
    p.write_bytes((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        read_safetensors_header(p)
    with pytest.raises(FileNotFoundError, match="no such safetensors file"):
        read_safetensors_header(tmp_path / "nothing.safetensors")
    with pytest.raises(CheckpointError, match="expected model.safetensors.index.json or model.safetensors"):
        count_parameters(tmp_path)
