"""Issue 10 (loader, config, command line, writer): hostile or broken inputs get an error, never a
hang, a traceback, unbounded memory or a silent wrong answer.

Each test is one case of the issue, named by its item number. They use only the public API
(`kimi_mlp.*`, `python -m kimi_mlp`), so they run unchanged against the package before and after
the fix: before it, every one of them fails.
"""
import contextlib
import io
import json
import math
import os
import resource
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import kimi_mlp
from kimi_mlp import CheckpointError, KimiK2Config, count_parameters, load_dense_block
from kimi_mlp import write_synthetic_checkpoint
from kimi_mlp.__main__ import main

GAIN = "model.layers.0.post_attention_layernorm.weight"
GATE = "model.layers.0.mlp.gate_proj.weight"
UP = "model.layers.0.mlp.up_proj.weight"
SHARD = "model-1-of-1.safetensors"


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def cli(*args, timeout=60, cwd=None):
    """`python -m kimi_mlp ARGS` in a fresh process with 4 GiB of address space; a hang fails
    the test after `timeout` seconds. Returns (status, stdout, stderr)."""
    try:
        r = subprocess.run([sys.executable, "-m", "kimi_mlp", *map(str, args)], cwd=cwd,
                           capture_output=True, text=True, timeout=timeout,
                           preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m kimi_mlp {' '.join(map(str, args))} hung ({timeout} s)")
    return r.returncode, r.stdout, r.stderr


def one_error_line(stderr: str, *needles: str) -> str:
    "Assert `stderr` is one line `error: ...` containing every needle; return it."
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-2000:]
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def run_main(capsys, *args):
    "main(args) in-process: it must return (not raise); returns (status, stdout, stderr)."
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def synth(tmp_path, name="c", **kwargs):
    return write_synthetic_checkpoint(tmp_path / name, **kwargs)


def read_header(shard):
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_header(shard, header, data, pad_extra=0):
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * ((-len(body)) % 8 + pad_extra)
    shard.write_bytes(struct.pack("<Q", len(body)) + body + data)


def edit_header(shard, change):
    header, data = read_header(shard)
    change(header)
    write_header(shard, header, data)


def edit_config(root, **changes):
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(changes)
    (root / "config.json").write_text(json.dumps(cfg))


# ---- item 2: config.json is read like the shards ----

def test_2_config_fifo_is_refused_without_blocking(tmp_path):
    root = synth(tmp_path)
    (root / "config.json").unlink()
    os.mkfifo(root / "config.json")
    status, _, err = cli("check", root, timeout=30)
    assert status == 1
    one_error_line(err, "config.json", "FIFO")
    with pytest.raises(CheckpointError, match="config.json: expected the config file to be a "
                                              "regular file, got a FIFO"):
        KimiK2Config.from_json(root / "config.json")


def test_2_config_link_to_dev_zero_is_refused(tmp_path):
    root = synth(tmp_path)
    (root / "config.json").unlink()
    (root / "config.json").symlink_to("/dev/zero")
    status, _, err = cli("check", root)
    assert status == 1
    one_error_line(err, "config.json", "/dev/zero")


def test_2_config_link_out_of_the_directory_is_refused(tmp_path):
    root = synth(tmp_path)
    (root / "config.json").rename(tmp_path / "elsewhere.json")
    (root / "config.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        load_dense_block(root)


def test_2_config_size_is_capped(tmp_path):
    root = synth(tmp_path)
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps(cfg) + " " * (2 * 2**20))   # valid JSON
    with pytest.raises(CheckpointError, match="config.json: the config file has 2,097,"):
        load_dense_block(root)


@pytest.mark.parametrize("how", ["info", "check --layer 1", "load_dense_block(layer=1)"])
@pytest.mark.parametrize("layers, experts", [(10**12, True), (10**9, False)])
def test_2_huge_num_hidden_layers_is_refused_at_once(tmp_path, how, layers, experts):
    root = synth(tmp_path)
    edit_config(root, num_hidden_layers=layers, **({} if experts else {"n_routed_experts": None}))
    if how.startswith("load"):
        code = (f"from kimi_mlp import load_dense_block; "
                f"load_dense_block({str(root)!r}, layer=1)")
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60, preexec_fn=_limit_memory)
        except subprocess.TimeoutExpired:
            pytest.fail("load_dense_block hung")
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1 and "CheckpointError" in last, r.stderr[-2000:]
        assert "config.json: KimiK2Config.num_hidden_layers: expected an int" in last
        return
    status, _, err = cli(*how.split(), root, timeout=60)
    assert status == 1
    one_error_line(err, "config.json", "KimiK2Config.num_hidden_layers", str(layers))


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size", "moe_intermediate_size",
                                   "num_hidden_layers", "n_routed_experts", "n_shared_experts",
                                   "num_experts_per_tok", "num_attention_heads", "vocab_size",
                                   "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
                                   "kv_lora_rank"])
def test_2_config_sizes_have_upper_bounds(field):
    "Each of these sizes a loop or a tensor: 10**12 is refused, naming the field."
    with pytest.raises(ValueError, match=rf"KimiK2Config\.{field}: expected an int in \[\d, \d+\], "
                                         r"got 1000000000000"):
        KimiK2Config(**{field: 10**12})


def test_2_config_bounds_leave_room_for_real_models():
    cfg = KimiK2Config(num_hidden_layers=126, hidden_size=16384, intermediate_size=53248,
                       vocab_size=256000, n_routed_experts=512)
    assert cfg.dense_layers == [0]


# ---- item 3: the layout is validated as safetensors validates it ----

def test_3_two_tensors_sharing_bytes_are_refused(tmp_path):
    "up_proj's offsets set to gate_proj's: readable, right dtype and shape; once, check said OK."
    root = synth(tmp_path)
    edit_header(root / SHARD, lambda h: h[UP].update(data_offsets=h[GATE]["data_offsets"]))
    with pytest.raises(CheckpointError, match=rf"{SHARD}: tensor '{UP}': corrupt layout: .*"
                                              "overlaps"):
        load_dense_block(root)
    with pytest.raises(CheckpointError, match="overlaps"):
        count_parameters(root)


def test_3_header_length_a_few_bytes_short_is_refused(tmp_path):
    "The JSON still parses (its padding is cut), but every tensor would be read 3 bytes early."
    root = synth(tmp_path)
    header, data = read_header(root / SHARD)
    write_header(root / SHARD, header, data, pad_extra=8)
    raw = (root / SHARD).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    (root / SHARD).write_bytes(struct.pack("<Q", n - 3) + raw[8:])
    with pytest.raises(CheckpointError, match=rf"{SHARD}: corrupt layout: the tensors cover "
                                              r"[\d,]+ bytes of a data region of [\d,]+ \(3 bytes"):
        load_dense_block(root)


@pytest.mark.parametrize("how", ["gap at the start", "gap between", "trailing bytes"])
def test_3_bytes_no_tensor_owns_are_refused(tmp_path, how):
    root = synth(tmp_path)
    header, data = read_header(root / SHARD)
    spans = sorted((e["data_offsets"], k) for k, e in header.items() if k != "__metadata__")
    if how == "trailing bytes":
        data += b"\0" * 64
    else:
        shift = spans if how == "gap at the start" else spans[3:]
        for _, name in shift:
            header[name]["data_offsets"] = [o + 16 for o in header[name]["data_offsets"]]
        data += b"\0" * 16
    write_header(root / SHARD, header, data)
    with pytest.raises(CheckpointError, match=rf"{SHARD}: .*corrupt layout"):
        load_dense_block(root)


def test_3_a_header_without_padding_still_loads(tmp_path):
    "safetensors pads headers to a multiple of 8, but its reader does not require it; nor do we."
    root = synth(tmp_path)
    header, data = read_header(root / SHARD)
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (1 if len(body) % 8 == 0 else 0)             # a length that is not 8k
    assert len(body) % 8
    (root / SHARD).write_bytes(struct.pack("<Q", len(body)) + body + data)
    assert load_dense_block(root).mlp.gate_proj.weight.shape == (640, 256)


# ---- item 4: block scales must be positive and normal ----

@pytest.mark.parametrize("value", [-1e-3, 0.0, 1e-40, -0.0, float("inf"), float("nan"), 1e37])
@pytest.mark.parametrize("tensor, block", [(GATE + "_scale_inv", (0, 0)),
                                           ("model.layers.0.mlp.down_proj.weight_scale_inv",
                                            (1, 3))])
def test_4_bad_scales_are_refused_naming_the_block(tmp_path, value, tensor, block):
    root = synth(tmp_path)
    header, data = read_header(root / SHARD)
    begin = header[tensor]["data_offsets"][0]
    cols = header[tensor]["shape"][1]
    at = begin + 4 * (block[0] * cols + block[1])
    data = data[:at] + struct.pack("<f", value) + data[at + 4:]
    write_header(root / SHARD, header, data)
    with pytest.raises(CheckpointError, match=rf"{SHARD}: tensor '{tensor}': block "
                                              rf"\({block[0]}, {block[1]}\) has scale"):
        load_dense_block(root)


def test_4_extreme_legal_scales_load(tmp_path):
    "The smallest normal float32, and FLT_MAX / 448 (the largest dequantized weight is finite)."
    root = synth(tmp_path)
    header, data = read_header(root / SHARD)
    begin = header[GATE + "_scale_inv"]["data_offsets"][0]
    lo, hi = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max / 448
    data = data[:begin] + struct.pack("<ff", lo, hi) + data[begin + 8:]
    write_header(root / SHARD, header, data)
    scale = load_dense_block(root).mlp.gate_proj.weight_scale_inv
    assert scale[0, 0].item() == lo and scale[0, 1].item() == pytest.approx(hi, rel=1e-7)


# ---- item 5: counting validates every entry ----

@pytest.mark.parametrize("change, message", [
    (lambda h: h[GATE].update(shape=[-1000000, 7]), "corrupt header entry"),
    (lambda h: h[GATE].update(shape=[10**9, 7168]), "corrupt header: 163840 data bytes"),
    (lambda h: h.update({GATE: [0, 163840]}), "corrupt header entry"),
    (lambda h: h[GATE].pop("dtype"), "corrupt header entry"),
    (lambda h: h[GATE].update(dtype="F4"), "unknown dtype 'F4'"),
    (lambda h: h[GATE].update(shape=[640.0, 256]), "corrupt header entry"),
    (lambda h: h[GATE].update(data_offsets=[5, 1]), "corrupt header entry"),
])
def test_5_counting_validates_every_entry(tmp_path, capsys, change, message):
    root = synth(tmp_path)
    edit_header(root / SHARD, change)
    with pytest.raises(CheckpointError, match=rf"{SHARD}: tensor '{GATE}': {message}"):
        count_parameters(root)
    status, _, err = run_main(capsys, "info", root)
    assert status == 1
    one_error_line(err, SHARD, GATE)


# ---- item 6: one error type; the command line prints one line ----

def _bad_config(root, text):
    (root / "config.json").write_text(text)


def _bad_header(root, body: bytes):
    body += b" " * (-len(body) % 8)
    (root / SHARD).write_bytes(struct.pack("<Q", len(body)) + body)


BAD_INPUTS = {
    "config nested 200k deep": (lambda r: _bad_config(r, '{"x":' + "[" * 200_000
                                                      + "]" * 200_000 + "}"), "config.json"),
    "header nested 200k deep": (lambda r: _bad_header(r, b'{"x":' + b"[" * 200_000
                                                      + b"]" * 200_000 + b"}"), SHARD),
    "config 4301-digit int": (lambda r: _bad_config(r, '{"hidden_size": ' + "9" * 4301 + "}"),
                              "config.json"),
    "header 4301-digit int": (lambda r: _bad_header(r, b'{"a":{"dtype":"U8","shape":[' + b"9" * 4301
                                                    + b'],"data_offsets":[0,0]}}'), SHARD),
    "config is a list": (lambda r: _bad_config(r, "[1, 2]"), "config.json"),
    "dtype is a list": (lambda r: edit_header(r / SHARD, lambda h: h[GATE].update(
        dtype=["F8_E4M3"])), GATE),
    "config is a directory": (lambda r: ((r / "config.json").unlink(),
                                         (r / "config.json").mkdir()), "config.json"),
    "shard is a directory": (lambda r: ((r / SHARD).unlink(), (r / SHARD).mkdir()), SHARD),
    "config link loop": (lambda r: ((r / "config.json").unlink(),
                                    (r / "config.json").symlink_to("config.json")), "config.json"),
    "shard link loop": (lambda r: ((r / SHARD).unlink(), (r / SHARD).symlink_to(SHARD)), SHARD),
    "config not UTF-8": (lambda r: (r / "config.json").write_bytes(b'{"model_type": "\xff"}'),
                         "config.json"),
    "duplicate keys": (lambda r: _bad_config(r, '{"hidden_size": 256, "hidden_size": 7168}'),
                       "duplicate key 'hidden_size'"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("command", ["check", "info"])
def test_6_bad_input_is_one_error_line(tmp_path, capsys, case, command):
    root = synth(tmp_path)
    make, needle = BAD_INPUTS[case]
    make(root)
    status, _, err = run_main(capsys, command, root)
    assert status == 1
    one_error_line(err, needle)
    with pytest.raises(CheckpointError):
        load_dense_block(root)


def test_6_embedded_nul(tmp_path, capsys):
    root = synth(tmp_path, norm_separate=True)
    index = root / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"][GATE] = "model-1-of-2\0.safetensors"
    index.write_text(json.dumps(doc))
    status, _, err = run_main(capsys, "check", root)
    assert status == 1
    one_error_line(err, "model.safetensors.index.json", GATE, "expected a file name")
    with pytest.raises(ValueError, match="checkpoint_dir: expected a path without NUL bytes"):
        load_dense_block(str(root) + "\0x")
    with pytest.raises(TypeError, match="checkpoint_dir: expected a path"):
        load_dense_block(61)


def test_6_the_index_path_works_as_the_checkpoint(tmp_path, capsys):
    "Given model.safetensors.index.json instead of its directory: once a NotADirectoryError."
    root = synth(tmp_path, norm_separate=True)
    index = root / "model.safetensors.index.json"
    assert run_main(capsys, "check", index, "--tokens", 2)[0] == 0
    status, out, _ = run_main(capsys, "info", index)
    assert status == 0 and "7 tensors in 2 file(s)" in out
    assert load_dense_block(index).config.hidden_size == 256
    status, _, err = run_main(capsys, "check", root / "model-1-of-2.safetensors")
    assert status == 1
    one_error_line(err, "expected a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_6_synth_into_a_read_only_directory(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        status, _, err = run_main(capsys, "synth", ro / "c")
    finally:
        ro.chmod(0o755)
    assert status == 1
    one_error_line(err, "Permission denied", str(ro))


def test_6_synth_when_the_file_system_refuses(tmp_path, capsys, monkeypatch):
    "A PermissionError (as for a read-only directory, even as root) and other OSErrors."
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".c.xxxxxxxx.partial"))
    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkdtemp", refuse)
        status, _, err = run_main(capsys, "synth", tmp_path / "c")
    assert status == 1
    one_error_line(err, "Permission denied")
    (tmp_path / "afile").write_text("x")
    status, _, err = run_main(capsys, "synth", tmp_path / "afile" / "c")
    assert status == 1
    one_error_line(err, "afile")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_6_synth_dot(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    status, _, err = run_main(capsys, "synth", ".")
    assert status == 1
    one_error_line(err, "path: expected a new directory's name")
    assert list((tmp_path / "empty").iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["empty"]


@pytest.mark.parametrize("tokens", ["1e9", "1000000000", "0", "-1"])
def test_6_check_tokens_out_of_range(tmp_path, capsys, tokens):
    root = synth(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["check", str(root), "--tokens", tokens])
    assert e.value.code == 2
    one_error_line(capsys.readouterr().err, "--tokens", "expected an int in [1, 4096]",
                   repr(tokens))


# ---- item 9: the writer ----

def _start_full_size_synth(parent):
    p = subprocess.Popen([sys.executable, "-m", "kimi_mlp", "synth", str(parent / "big"),
                          "--full-size"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    while line and "drawing and quantizing" not in line:
        line = p.stdout.readline()
    assert line, p.stderr.read()
    assert [q.name for q in parent.iterdir() if q.name.endswith(".partial")], "no partial dir yet?"
    return p


def test_9_sigterm_leaves_nothing(tmp_path):
    p = _start_full_size_synth(tmp_path)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGTERM               # it still dies of the signal
    assert list(tmp_path.iterdir()) == []


def test_9_after_sigkill_the_next_writer_cleans_up(tmp_path):
    p = _start_full_size_synth(tmp_path)
    p.kill()
    p.communicate(timeout=120)
    left = [q.name for q in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".big.") and left[0].endswith(".partial")
    synth(tmp_path, "next")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["next"]


def test_9_stale_partials_only_ours_and_not_in_use(tmp_path):
    """Item 4 of issue 23: only a directory with the writer's marker is a writer's; a user's
    `.backup.20241201.partial` of safetensors files stays. Item 5: a killed writer's
    directory goes with safetensors' temporary `.tmpXXXXXX` file in it."""
    fcntl = pytest.importorskip("fcntl")
    from kimi_mlp.safetensors_io import _MARK_TEXT, WRITER_MARK
    stale = tmp_path / ".old.abcd1234.partial"                   # a killed writer's leftover
    stale.mkdir()
    (stale / WRITER_MARK).write_bytes(_MARK_TEXT)
    (stale / "config.json").write_text("{}")
    (stale / "model-1-of-1.safetensors").write_bytes(b"\0" * 64)
    (stale / ".tmpq8z1xk").write_bytes(b"\0" * 4096)            # safetensors, mid-write
    backup = tmp_path / ".backup.20241201.partial"               # a user's: no marker
    backup.mkdir()
    (backup / "old.safetensors").write_bytes(b"\0" * 64)
    forged = tmp_path / ".forged.abcd1234.partial"               # a marker with other text
    forged.mkdir()
    (forged / WRITER_MARK).write_text("mine")
    busy = tmp_path / ".busy.abcd1234.partial"                   # a writer still at work:
    busy.mkdir()                                                 # marked, but locked
    (busy / WRITER_MARK).write_bytes(_MARK_TEXT)
    fd = os.open(busy, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    notes = tmp_path / ".notes.abcd1234.partial"                 # our naming, not our files
    notes.mkdir()
    (notes / "todo.txt").write_text("keep")
    other = tmp_path / ".cache"                                  # not our naming
    other.mkdir()
    nested = tmp_path / ".deep.abcd1234.partial"                 # holds a directory: not ours
    (nested / "sub").mkdir(parents=True)
    (nested / WRITER_MARK).write_bytes(_MARK_TEXT)
    try:
        synth(tmp_path, "c")
    finally:
        os.close(fd)
    assert sorted(q.name for q in tmp_path.iterdir()) == [
        ".backup.20241201.partial", ".busy.abcd1234.partial", ".cache",
        ".deep.abcd1234.partial", ".forged.abcd1234.partial", ".notes.abcd1234.partial", "c"]
    assert (backup / "old.safetensors").is_file()
    assert not (tmp_path / "c" / WRITER_MARK).exists()         # the checkpoint has none


def test_9_shard_permissions_follow_the_umask(tmp_path):
    mask = os.umask(0o027)
    try:
        root = synth(tmp_path, norm_separate=True)
    finally:
        os.umask(mask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in root.iterdir()}
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
    assert modes == dict.fromkeys(modes, 0o640), modes          # shards like the JSON files


def test_9_reserved_names_are_refused(tmp_path):
    for name in ("__metadata__", ""):
        with pytest.raises(ValueError, match="extra_tensors: expected tensor names"):
            synth(tmp_path, extra_tensors={name: ((2,), torch.float32)})
    with pytest.raises(ValueError, match="extra_tensors: 'e'"):
        synth(tmp_path, extra_tensors={"e": ((2,), torch.complex64)})
    assert list(tmp_path.iterdir()) == []


# ---- item 10: headers are parsed once, and their memory is bounded ----

def test_10_info_parses_each_header_once(tmp_path, capsys, monkeypatch):
    root = synth(tmp_path, num_layers=2, norm_separate=True)
    parsed = []
    real = json.loads

    def counting(s, *args, **kwargs):
        text = s.decode() if isinstance(s, (bytes, bytearray)) else s
        if '"data_offsets"' in text:
            parsed.append(1)
        return real(s, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    status, out, _ = run_main(capsys, "info", root)
    assert status == 0 and "8 tensors in 2 file(s)" in out
    assert len(parsed) == 2


MEASURE = textwrap.dedent("""
    import sys
    def rss(key):
        return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024
    from kimi_mlp import count_parameters
    base = rss("VmRSS")
    try:
        count_parameters(sys.argv[1])
        outcome = "counted"
    except ValueError as e:
        outcome = type(e).__name__
    print(outcome, rss("VmHWM") - base)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_10_a_100_mib_header_costs_no_memory(tmp_path):
    "100 MiB of '[]': a careless parser spends ~27 bytes per byte on it (2.7 GB)."
    path = tmp_path / "model.safetensors"
    n = 100 * 2**20 - 64
    body = b'{"x":[' + b"[]," * ((n - 10) // 3) + b"[]]}"
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    r = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                       text=True, timeout=300)
    outcome, rise = r.stdout.split()
    assert outcome == "CheckpointError" and int(rise) < 32 * 2**20, (r.stdout, r.stderr)
