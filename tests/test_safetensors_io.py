"""Appendix A: reading and writing safetensors safely (kimi_mlp.safetensors_io)."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kimi_mlp import safetensors_io as sio
from kimi_mlp.safetensors_io import (CheckpointError, CheckpointFileNotFoundError, as_path,
                                     atomic_directory, check_extra_tensors, checkpoint_file,
                                     checkpoint_root, open_regular_file, parse_json,
                                     read_safetensors_layout, read_small_file, shard_file_names)


def test_error_types():
    e = CheckpointFileNotFoundError("x: no such shard file")
    assert isinstance(e, CheckpointError) and isinstance(e, FileNotFoundError)
    assert isinstance(e, ValueError) and str(e) == "x: no such shard file"
    with pytest.raises(TypeError, match="where: expected a path"):
        as_path(b"bytes", "where")
    with pytest.raises(ValueError, match="where: expected a path without NUL"):
        as_path("a\0b", "where")


def test_open_regular_file_types(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    with open_regular_file(tmp_path / "f") as f:
        assert f.read() == b"abc" and os.get_blocking(f.fileno())
    os.mkfifo(tmp_path / "fifo")
    for path, kind in [(tmp_path / "fifo", "a FIFO"), (tmp_path, "a directory"),
                       ("/dev/null", "a character device")]:
        with pytest.raises(CheckpointError, match=f"expected the file to be a regular file, "
                                                  f"got {kind}"):
            open_regular_file(path)
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(CheckpointError, match="cannot open the file .a symbolic link loop"):
        open_regular_file(tmp_path / "loop")
    with pytest.raises(CheckpointFileNotFoundError, match="no such shard file"):
        open_regular_file(tmp_path / "absent", "shard file")


def test_read_small_file_cap(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100)
    assert read_small_file(tmp_path / "f", "config file", 100) == b"x" * 100
    with pytest.raises(CheckpointError, match="the config file has 100 bytes, more than the 99"):
        read_small_file(tmp_path / "f", "config file", 99)


@pytest.mark.parametrize("data, reason", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"[" + b"7" * 4301 + b"]", "Exceeds the limit .4300 digits."),
    (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
    (b'{"b": {"a": 1, "a": 2}}', "duplicate key 'a'"),
    (b'{"a": "\xff"}', "not UTF-8"),
    (b"\xff\xfe{\x00}\x00", "not UTF-8"),          # UTF-16: json.loads(bytes) would accept it
    (b'{"a": ', "Expecting value"),
])
def test_parse_json_failures_are_checkpoint_errors(data, reason):
    with pytest.raises(CheckpointError, match=f"^f.json: corrupt thing .not valid JSON: {reason}"):
        parse_json(data, "f.json", "thing")


def test_checkpoint_file_rules(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "a.safetensors").write_bytes(b"")
    assert checkpoint_file(root, "a.safetensors", "idx", "t") == root / "a.safetensors"
    (root / "sub").mkdir()
    (root / "sub" / "b.safetensors").write_bytes(b"")
    assert checkpoint_file(root, "sub/b.safetensors", "idx", "t") == root / "sub" / "b.safetensors"
    for bad in ["../x", "sub/../../x", "/etc/passwd", "a\\b", "", None, 3, "a\0b"]:
        with pytest.raises(CheckpointError, match="idx: tensor 't'"):
            checkpoint_file(root, bad, "idx", "t")
    with pytest.raises(CheckpointFileNotFoundError, match=r"no such config file$"):
        checkpoint_file(root, "config.json", root, what="config file")


def test_checkpoint_root(tmp_path):
    assert checkpoint_root(tmp_path) == (tmp_path, None)
    (tmp_path / sio.INDEX_FILE).write_text("{}")
    assert checkpoint_root(tmp_path) == (tmp_path, tmp_path / sio.INDEX_FILE)
    assert checkpoint_root(tmp_path / sio.INDEX_FILE) == (tmp_path, tmp_path / sio.INDEX_FILE)
    (tmp_path / "x.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="dir: expected a directory .or its index file."):
        checkpoint_root(tmp_path / "x.safetensors", "dir")
    with pytest.raises(CheckpointFileNotFoundError, match="which does not exist"):
        checkpoint_root(tmp_path / "nothing")


def _write(path, header, data=b"", pad=True, length=None):
    body = json.dumps(header, separators=(",", ":")).encode() if isinstance(header, dict) else header
    body += b" " * (-len(body) % 8 if pad else 0)
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


def _safetensors_accepts(path) -> bool:
    try:
        with safe_open(path, "pt") as f:
            for k in f.keys():
                f.get_tensor(k)
        return True
    except Exception:
        return False


def _ours_accepts(path) -> bool:
    try:
        read_safetensors_layout(path)
        return True
    except CheckpointError:
        return False


def e(dtype, shape, b, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, end]}


LAYOUTS = {   # name: (header, data bytes, valid)
    "in order": ({"a": e("F32", [2], 0, 8), "b": e("U8", [3], 8, 11)}, 11, True),
    "listed out of order": ({"b": e("U8", [3], 8, 11), "a": e("F32", [2], 0, 8)}, 11, True),
    "empty tensors": ({"z": e("F32", [0, 4], 0, 0), "a": e("F32", [2], 0, 8),
                       "y": e("BF16", [0], 8, 8)}, 8, True),
    "scalar": ({"s": e("F64", [], 0, 8)}, 8, True),
    "no tensors": ({}, 0, True),
    "metadata": ({"__metadata__": {"format": "pt"}, "a": e("F32", [2], 0, 8)}, 8, True),
    "overlap": ({"a": e("F32", [2], 0, 8), "b": e("F32", [2], 4, 12)}, 12, False),
    "same bytes": ({"a": e("F32", [2], 0, 8), "b": e("F32", [2], 0, 8)}, 8, False),
    "gap": ({"a": e("F32", [2], 0, 8), "b": e("F32", [2], 12, 20)}, 20, False),
    "not from 0": ({"a": e("F32", [2], 4, 12)}, 12, False),
    "trailing bytes": ({"a": e("F32", [2], 0, 8)}, 9, False),
    "truncated": ({"a": e("F32", [2], 0, 8)}, 7, False),
    "size mismatch": ({"a": e("F32", [3], 0, 8)}, 8, False),
    "negative dim": ({"a": e("F32", [-2], 0, 8)}, 8, False),
    "end before begin": ({"a": e("F32", [0], 8, 0)}, 8, False),
    "metadata not strings": ({"__metadata__": {"n": 1}, "a": e("F32", [2], 0, 8)}, 8, False),
    "entry not an object": ({"a": [0, 8]}, 8, False),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_rules_agree_with_safetensors(tmp_path, name):
    header, n, valid = LAYOUTS[name]
    path = _write(tmp_path / "f.safetensors", header, b"\0" * n)
    assert _safetensors_accepts(path) == valid, "the reference reader disagrees with the table"
    assert _ours_accepts(path) == valid


def test_where_we_are_stricter_than_the_reference_reader(tmp_path):
    "The format says: header begins with '{', no duplicate keys; the reader does not enforce it."
    lead = _write(tmp_path / "lead.safetensors", b' {"a":' + json.dumps(e("F32", [2], 0, 8)).encode()
                  + b"}", b"\0" * 8)
    dup = _write(tmp_path / "dup.safetensors", b'{"a":' + json.dumps(e("F32", [2], 0, 8)).encode()
                 + b',"a":' + json.dumps(e("F32", [2], 0, 8)).encode() + b"}", b"\0" * 8)
    for path, message in [(lead, "expected it to begin with '{'"), (dup, "duplicate key 'a'")]:
        assert _safetensors_accepts(path)
        with pytest.raises(CheckpointError, match=message):
            read_safetensors_layout(path)


def test_header_length_need_not_be_a_multiple_of_8(tmp_path):
    header = {"a": e("F32", [2], 0, 8)}
    path = _write(tmp_path / "f.safetensors", header, b"\0" * 8, pad=False)
    assert (len(json.dumps(header, separators=(",", ":")))) % 8 and _safetensors_accepts(path)
    header_read, start = read_safetensors_layout(path)
    assert header_read == header and start % 8


def test_header_cap(tmp_path):
    big = b"{" + b" " * (sio.MAX_HEADER_BYTES) + b"}"
    path = _write(tmp_path / "f.safetensors", big, pad=False)
    with pytest.raises(CheckpointError, match="headers of more than 8,388,608 bytes are refused"):
        read_safetensors_layout(path)


MEASURE = textwrap.dedent("""
    import sys
    def rss(key):
        return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024
    from kimi_mlp.safetensors_io import CheckpointError, read_safetensors_layout
    base = rss("VmRSS")
    try:
        read_safetensors_layout(sys.argv[1])
    except CheckpointError as e:
        print("refused", rss("VmHWM") - base)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
@pytest.mark.parametrize("unit", [b"[],", b"{},"])
def test_the_costliest_header_under_the_cap_is_bounded(tmp_path, unit):
    "The worst structure per byte for Python's JSON parser, just under the cap: ~27 bytes/byte."
    n = (sio.MAX_HEADER_BYTES - 16) // 3
    body = b'{"x":[' + unit * n + unit[:2] + b"]}"
    assert len(body) <= sio.MAX_HEADER_BYTES
    path = _write(tmp_path / "f.safetensors", body, pad=False)
    r = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True,
                       timeout=300)
    verdict, rise = r.stdout.split()
    assert verdict == "refused" and int(rise) < 40 * sio.MAX_HEADER_BYTES, (r.stdout, r.stderr)


def test_shard_file_names():
    assert shard_file_names("model-{i}-of-{n}.safetensors", 2) == ["model-1-of-2.safetensors",
                                                                   "model-2-of-2.safetensors"]
    for bad in ["../m{i}.safetensors", "m{i}.bin", "model.safetensors", "m{n}.safetensors",
                "m{x}.safetensors", 7]:
        with pytest.raises(ValueError, match="shard_name"):
            shard_file_names(bad, 2)


def test_check_extra_tensors():
    assert check_extra_tensors(None, bool) == {}
    assert check_extra_tensors({"e": ([2, 3], torch.bfloat16)}, lambda n: False) == {
        "e": ((2, 3), torch.bfloat16)}
    for bad in [{"__metadata__": ((1,), torch.float32)}, {"": ((1,), torch.float32)},
                {"e": ((1.5,), torch.float32)}, {"e": ((1,), "F32")}, {"e": (1,)}]:
        with pytest.raises(ValueError, match="extra_tensors"):
            check_extra_tensors(bad, lambda n: False)
    with pytest.raises(ValueError, match="would replace a tensor the writer makes"):
        check_extra_tensors({"mine": ((1,), torch.float32)}, lambda n: n == "mine")
    with pytest.raises(TypeError, match="extra_tensors: expected a dict"):
        check_extra_tensors([("e", ((1,), torch.float32))], lambda n: False)


def test_atomic_directory_restores_signal_handlers(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with atomic_directory(tmp_path / "a"):
        assert signal.getsignal(signal.SIGTERM) is sio._raise_terminated
    assert signal.getsignal(signal.SIGTERM) == before
    mine = lambda signum, frame: None                                   # noqa: E731
    signal.signal(signal.SIGTERM, mine)
    try:
        with atomic_directory(tmp_path / "b"):
            assert signal.getsignal(signal.SIGTERM) is mine             # someone else's: kept
    finally:
        signal.signal(signal.SIGTERM, before)


def test_atomic_directory_in_a_thread(tmp_path):
    "Signal handlers can only be set in the main thread; elsewhere the writer works without."
    errors = []

    def write():
        try:
            with atomic_directory(tmp_path / "t") as d:
                (d / "config.json").write_text("{}")
        except Exception as exc:                                       # pragma: no cover
            errors.append(exc)

    t = threading.Thread(target=write)
    t.start()
    t.join()
    assert not errors and (tmp_path / "t" / "config.json").is_file()


def test_atomic_directory_replaces_only_an_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with atomic_directory(tmp_path / "empty") as d:
        (d / "x.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["x.json"]
    with pytest.raises(FileExistsError, match="path: expected a new or empty directory"):
        atomic_directory(tmp_path / "empty").__enter__()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        atomic_directory(tmp_path / "link").__enter__()
    for name in (".", "..", "/"):
        with pytest.raises(ValueError, match="path: expected a new directory's name"):
            atomic_directory(name).__enter__()


def test_sigterm_in_the_block_removes_the_directory_and_kills(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from kimi_mlp.safetensors_io import atomic_directory
        with atomic_directory(Path({str(tmp_path / 'c')!r})) as d:
            (d / "config.json").write_text("{{}}")
            os.kill(os.getpid(), signal.SIGTERM)
            while True:
                pass
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGTERM and list(tmp_path.iterdir()) == [], r.stderr
