"""Issue 23 (nothing lost, nothing stale): each case with inputs written by hand, with struct and
json rather than the package's writer. Items 4 and 5 (the writer's stale directories) are in
test_hostile_checkpoints.py (test_9_stale_partials_only_ours_and_not_in_use); item 3 (the norm
probe) in test_fused.py."""
import json
import struct

import pytest
import torch

from kimi_mlp import CheckpointError, load_dense_block
from kimi_mlp.parallel import load_dense_shard

D, F = 256, 640


def write_checkpoint(root, codes_at=(), scheme="dynamic", f=F, layers=1, scale_at=()):
    """A one-file Kimi-format checkpoint of `layers` dense layers (hidden 256, intermediate
    f), every byte laid out here: gain 1.0 (bf16 0x3F80), weight codes 0x38 (1.0) in
    layer 0 and 0x30 (0.5) in the others, scales 2^-7. `codes_at`: (tensor, row, col, code)
    to place in layer 0; `scale_at`: (layer, tensor, value) for its block (0, 0)."""
    root.mkdir()
    config = {"hidden_size": D, "intermediate_size": f, "num_hidden_layers": layers,
              "n_routed_experts": None, "rms_norm_eps": 1e-6, "hidden_act": "silu",
              "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                      "activation_scheme": scheme,
                                      "weight_block_size": [128, 128]}}
    (root / "config.json").write_text(json.dumps(config))
    tensors = {}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        tensors[p + "post_attention_layernorm.weight"] = ("BF16", [D], b"\x80\x3f" * D)
        for proj, (n, k) in {"gate_proj": (f, D), "up_proj": (f, D),
                             "down_proj": (D, f)}.items():
            codes = bytearray((b"\x38" if layer == 0 else b"\x30") * (n * k))
            for name, r, c, code in codes_at if layer == 0 else ():
                if name == proj:
                    codes[r * k + c] = code
            tensors[f"{p}mlp.{proj}.weight"] = ("F8_E4M3", [n, k], bytes(codes))
            blocks = [-(-n // 128), -(-k // 128)]
            values = [2.0 ** -7] * (blocks[0] * blocks[1])
            for at_layer, name, value in scale_at:
                if (at_layer, name) == (layer, proj):
                    values[0] = value
            tensors[f"{p}mlp.{proj}.weight_scale_inv"] = (
                "F32", blocks, struct.pack(f"<{len(values)}f", *values))
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
    return root


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_9_a_nan_weight_code_is_refused_naming_the_element_and_block(tmp_path, code):
    root = write_checkpoint(tmp_path / "ckpt", [("gate_proj", 300, 5, code)])
    with pytest.raises(CheckpointError, match=rf"model\.layers\.0\.mlp\.gate_proj\.weight'"
                       rf": element \[300, 5\] \(block \(2, 0\)\) holds the e4m3 NaN "
                       rf"code {code:#04x}") as e:
        load_dense_block(root)
    assert "\n" not in str(e.value)
    block = load_dense_block(root, keep_nan_codes=True)             # asked for: kept
    h = torch.ones(2, D, dtype=torch.bfloat16)
    with torch.no_grad():
        assert block(h).isnan().all()                # one code: every output is NaN


def test_9_the_shard_loader_refuses_nan_codes_in_its_own_slice_only(tmp_path):
    """Intermediate 1024: rank 1 of 2 holds gate rows 512..1023, so a NaN code at row 600 is
    its to refuse, named in the whole tensor's coordinates; rank 0's slice does not hold it."""
    root = write_checkpoint(tmp_path / "ckpt", [("gate_proj", 600, 7, 0x7F)], f=1024)
    load_dense_shard(root, rank=0, world_size=2)
    with pytest.raises(CheckpointError, match=r"element \[600, 7\] \(block \(4, 0\)\)"):
        load_dense_shard(root, rank=1, world_size=2)
    load_dense_shard(root, rank=1, world_size=2, keep_nan_codes=True)
    # down_proj [256, 1024] is cut by columns: rank 1 holds 512..1023
    root = write_checkpoint(tmp_path / "down", [("down_proj", 5, 600, 0xFF)], f=1024)
    load_dense_shard(root, rank=0, world_size=2)
    with pytest.raises(CheckpointError, match=r"down_proj\.weight'.*element \[5, 600\] "
                                              r"\(block \(0, 4\)\)"):
        load_dense_shard(root, rank=1, world_size=2)


def test_9_a_static_activation_scheme_is_refused(tmp_path):
    root = write_checkpoint(tmp_path / "ckpt", scheme="static")
    with pytest.raises(ValueError, match=r"config\.activation_scheme: expected 'dynamic'.*"
                                         r"got 'static'"):
        load_dense_block(root)


def test_the_hand_written_checkpoint_is_well_formed(tmp_path):
    block = load_dense_block(write_checkpoint(tmp_path / "ckpt"))
    h = torch.ones(1, D, dtype=torch.bfloat16)
    with torch.no_grad():
        assert block(h).isfinite().all()


@pytest.mark.parametrize("block", [[128, 2**28], [128, 2**31], [64, 128]])
def test_7_a_block_size_is_refused_before_anything_is_read_or_sized(tmp_path, block):
    """The refusal comes from the config alone: the directory holds no tensor file, so any
    later refusal would be a missing file."""
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({
        "hidden_size": D, "intermediate_size": F, "num_hidden_layers": 1,
        "n_routed_experts": None, "quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": block}}))
    with pytest.raises(ValueError, match=r"config\.weight_block_size: expected \[128, 128\]"):
        load_dense_block(root)


def test_7_token_counts_are_bounded_before_anything_is_sized(capsys):
    import argparse

    from kimi_mlp.apparatus.gpu_check import MAX_M, _parse_m
    assert _parse_m(f"1,16,{MAX_M}") == (1, 16, MAX_M)
    for text in ("1099511627776", f"1,{MAX_M + 1}", "0", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"expected comma-separated "
                                                             rf"ints in \[1, {MAX_M}\]"):
            _parse_m(text)


# ---- item 2: the module follows its block ----
@pytest.fixture
def block_and_tokens():
    from kimi_mlp.fused import random_dense_block
    block = random_dense_block(256, 640, seed=4)
    h = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    return block, h


def _fresh(block, h):
    from kimi_mlp.fused import FusedFp8DenseMLP
    with torch.no_grad():
        return FusedFp8DenseMLP(block)(h)


@pytest.mark.parametrize("change", ["eps", "new scales", "load_state_dict assign"])
def test_2_the_module_serves_its_block_as_it_is_now(block_and_tokens, change):
    """After each change the kept module gives what a fresh one gives, bit for bit, and not
    what it gave before."""
    from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block
    block, h = block_and_tokens
    fused = FusedFp8DenseMLP(block)
    with torch.no_grad():
        before = fused(h)
    if change == "eps":
        block.post_attention_layernorm.eps = 0.5
    elif change == "new scales":
        block.mlp.down_proj.weight_scale_inv = block.mlp.down_proj.weight_scale_inv * 2
    else:
        other = random_dense_block(256, 640, seed=9)
        block.load_state_dict(other.state_dict(), assign=True)
    with torch.no_grad():
        after = fused(h)
    assert torch.equal(after, _fresh(block, h)) and not torch.equal(after, before)


@pytest.mark.parametrize("change", ["smaller weight", "float32 weight"])
def test_2_a_block_that_no_longer_passes_is_refused_not_read_out_of_bounds(block_and_tokens,
                                                                           change):
    from kimi_mlp.fused import FusedFp8DenseMLP
    block, h = block_and_tokens
    fused = FusedFp8DenseMLP(block)
    if change == "smaller weight":            # the same storage, read past its new end
        w = block.mlp.gate_proj.weight
        w.data = w.data[:128]
    else:                           # (block.to(torch.float32) keeps the codes: served)
        block.mlp.gate_proj.weight = block.mlp.gate_proj.weight.to(torch.float32)
    with pytest.raises(ValueError, match=r"block\.mlp\.gate_proj\.weight(_scale_inv)?: "
                                         r"expected \[") as e:
        fused(h)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"block\.mlp\.gate_proj\.weight"):
        FusedFp8DenseMLP(block)                   # as a fresh wrapper refuses it


# ---- items 1 and 8: tp-check ----
@pytest.fixture
def world_of_one(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_1_tp_check_compares_the_layer_it_was_given(tmp_path, world_of_one, capsys):
    """Two dense layers with different weights, layer 0's gate scale NaN: `--layer 1` checks
    layer 1 against layer 1, and never reads layer 0."""
    from kimi_mlp import parallel as tp
    root = write_checkpoint(tmp_path / "ckpt", layers=2,
                            scale_at=[(0, "gate_proj", float("nan"))])
    assert tp.main([str(root), "--layer", "1", "--tokens", "2", "--impl", "torch"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "tp-check: 1 rank(s), gloo on the CPU, impl torch: OK"
    assert tp.main([str(root), "--layer", "0", "--tokens", "2"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: rank 0: ")
    assert "model.layers.0.mlp.gate_proj.weight_scale_inv" in err[0]


def test_1_a_failing_reference_is_one_line_agreed_by_every_rank(tmp_path, world_of_one,
                                                                capsys):
    from kimi_mlp import parallel as tp
    from kimi_mlp.safetensors_io import CheckpointError
    root = write_checkpoint(tmp_path / "ckpt")

    def broken(*args, **kwargs):
        raise CheckpointError("model.safetensors: tensor 'x': corrupt")

    world_of_one.setattr(tp, "single_rank_reference", broken)
    assert tp.main([str(root), "--tokens", "2", "--impl", "torch"]) == 1
    captured = capsys.readouterr()
    assert captured.err == ("error: rank 0: the unsharded reference: model.safetensors: "
                            "tensor 'x': corrupt\n") and not captured.out


def test_8_a_rank_outside_its_world_says_so(tmp_path, world_of_one, capsys):
    from kimi_mlp import parallel as tp
    world_of_one.setenv("RANK", "1")
    assert tp.main([str(write_checkpoint(tmp_path / "ckpt")), "--tokens", "2"]) == 1
    assert capsys.readouterr().err == (
        "error: RANK: expected an int in [0, 1) (below WORLD_SIZE=1), got 1\n")


# ---- item 6: one line, never a traceback ----
@pytest.mark.parametrize("dtype", ["float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                                   "float8_e4m3fn"])
def test_6_a_gain_dtype_that_is_no_norms_is_one_line(tmp_path, capsys, dtype):
    from kimi_mlp.cli import main
    root = write_checkpoint(tmp_path / "ckpt")
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}))
    assert main(["check", str(root)]) == 1
    err = capsys.readouterr().err
    assert err == ("error: config.torch_dtype: expected one of ('bfloat16', 'float16', "
                   f"'float32') (the norm gain's dtype), got '{dtype}'\n")


def _huge_checkpoint(root, d=2**16, f=2**17):
    "A consistent checkpoint whose tensors are sparse: a few MiB on disk, 25 GiB of bytes."
    root.mkdir()
    (root / "config.json").write_text(json.dumps({
        "hidden_size": d, "intermediate_size": f, "num_hidden_layers": 1,
        "n_routed_experts": None, "torch_dtype": "bfloat16", "quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]}}))
    header, offset = {}, 0
    specs = {"model.layers.0.post_attention_layernorm.weight": ("BF16", [d], 2 * d)}
    for proj, (n, k) in {"gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f)}.items():
        p = f"model.layers.0.mlp.{proj}."
        specs[p + "weight"] = ("F8_E4M3", [n, k], n * k)
        specs[p + "weight_scale_inv"] = ("F32", [n // 128, k // 128], 4 * n * k // 2**14)
    for name, (dtype, shape, size) in specs.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(root / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        fh.truncate(8 + len(text) + offset)                       # a hole, not bytes
    return root


def test_6_a_checkpoint_larger_than_memory_is_one_line(tmp_path):
    import subprocess
    import sys
    root = _huge_checkpoint(tmp_path / "huge")
    limit = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
             "import sys; from kimi_mlp.cli import main; sys.exit(main(sys.argv[1:]))")
    for cmd in (["check", str(root)], ["tp-check", str(root), "--impl", "torch"]):
        r = subprocess.run([sys.executable, "-c", limit, *cmd], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 1, (cmd, r.stderr[-2000:])
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and "out of memory" in lines[0], (cmd, r.stderr[-2000:])


# ---- item 8: usage errors and refusals are one line, with `error:` ----
def _mains():
    from kimi_mlp.apparatus import codegen, gpu_check, harness, report, tune
    return {"inspect": codegen.main, "bench": harness.main, "tune": tune.tune_main,
            "gpucheck": gpu_check.gpucheck_main, "gpu-report": report.gpu_report_main}


@pytest.mark.parametrize("name", ["inspect", "bench", "tune", "gpucheck", "gpu-report"])
def test_8_a_usage_error_is_one_line(name, capsys):
    with pytest.raises(SystemExit) as e:
        _mains()[name](["--out", "x", "--no-such-option"] if name == "gpu-report"
                       else ["--no-such-option"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "unrecognized arguments: --no-such-option" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusals")
@pytest.mark.parametrize("name", ["bench", "tune", "gpucheck", "gpu-report"])
def test_8_the_no_cuda_refusals_say_error(name, capsys, tmp_path):
    argv = ["--out", str(tmp_path / "out")] if name != "tune" else []
    assert _mains()[name](argv) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"error: {name}: no CUDA device") and err.count("\n") == 1


def test_6_a_full_disk_in_the_shard_write_is_one_line_and_leaves_nothing(tmp_path, capsys,
                                                                         monkeypatch):
    from safetensors import SafetensorError

    import kimi_mlp.checkpoint as ck
    from kimi_mlp.cli import main

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(ck, "save_file", full)
    assert main(["synth", str(tmp_path / "ckpt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: model-1-of-1.safetensors: cannot write")
    assert "No space left on device" in err and list(tmp_path.iterdir()) == []


def test_6_sigterm_at_the_commit_keeps_the_finished_checkpoint_and_prints_nothing(tmp_path):
    """A SIGTERM that lands as the writer renames its finished directory: the process still
    dies of it, after the rename, with no traceback, and the checkpoint is complete."""
    import signal
    import subprocess
    import sys
    script = (
        "import os, signal, sys\n"
        "real = os.rename\n"
        "def rename(a, b):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    real(a, b)\n"
        "os.rename = rename\n"
        "from kimi_mlp.cli import main\n"
        "sys.exit(main(['synth', sys.argv[1]]))\n")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ckpt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGTERM and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert load_dense_block(tmp_path / "ckpt").config.hidden_size == 256


def test_6_a_lone_surrogate_in_a_tensor_name_is_one_line_naming_the_file(tmp_path, capsys):
    """`info` on a header whose name is the JSON escape \\ud800 (valid JSON, not Unicode):
    one error line naming the file, before any row of the table is printed."""
    from kimi_mlp.cli import main
    root = write_checkpoint(tmp_path / "ckpt")
    data = (root / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8:8 + n].replace(b'"model.layers.0.mlp.up_proj.weight"',
                                   b'"model.layers.0.mlp.up_proj.\\ud800"')
    assert header != data[8:8 + n] and len(header) == n
    (root / "model.safetensors").write_bytes(data[:8] + header + data[8 + n:])
    assert main(["info", str(root)]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "model.safetensors: corrupt safetensors " \
        "header (not valid JSON: a string that is not Unicode text" in captured.err
    assert "name" not in captured.out                     # no partial table


def test_9_an_index_of_many_entries_checks_each_file_once(tmp_path, monkeypatch):
    """510,000 index entries over two files: two file checks, not 510,000 (the count, not
    the time, is what the test holds)."""
    import kimi_mlp.safetensors_io as io
    root = tmp_path / "ckpt"
    root.mkdir()
    for f in ("a.safetensors", "b.safetensors"):
        (root / f).write_bytes(struct.pack("<Q", 2) + b"{}")
    weight_map = {f"t.{i}": ("a" if i % 2 else "b") + ".safetensors" for i in range(510_000)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    calls = []
    real = io.checkpoint_file
    monkeypatch.setattr(io, "checkpoint_file", lambda *a: calls.append(a[1]) or real(*a))
    files = io.resolve_tensor_files(root)
    assert sorted(len(v) for v in files.values()) == [255_000, 255_000]
    assert sorted(calls) == ["a.safetensors", "b.safetensors"]
