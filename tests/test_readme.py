"""The README's Python examples run as written, offline, on a CPU, and again in the same
directory (a reader runs them twice)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from installs import only_declared

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    "The ```python blocks of README.md, in order."
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_its_two_examples():
    blocks = python_blocks()
    assert len(blocks) == 2, [b[:60] for b in blocks]
    assert "write_synthetic_checkpoint" in blocks[0] and "fuse_ffn" in blocks[1]


#: What each example says it prints (its comments), line by line; None: not compared.
PRINTED = [["[0]", "396361728", "True", None],
           [*(f"model.layers.{i}.mlp{s}: {kind} -> hidden_size=256, intermediate_size="
              f"{f}, impl='fused', path='w8a8', norm={norm}"
              for i, s, kind, f, norm in ((0, "", "dense FFN: norm and MLP", 640,
                                           "fused"),
                                          (1, ".shared_experts", "shared expert", 128,
                                           "None"))), None]]


#: The extra each example names: all it may import beyond the base install.
EXTRA = ("kernels", "hf")


def README_EXAMPLE_HEADS() -> list[str]:
    "The text between each example's heading and its code block."
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^## Example \d[^\n]*\n(.*?)^```python", text, flags=re.S | re.M)


@pytest.mark.parametrize("index", [0, 1], ids=["package", "hugging-face"])
def test_each_readme_example_runs_as_written_twice(index, tmp_path):
    """Each block in a fresh Python, in an empty directory, with no network, the
    interpreter not asked for, and only what the extra its text names installs
    (tests/installs.py): it finishes twice in a row and prints what its comments say
    (the w8a16 error's digits and the tokens aside)."""
    block = python_blocks()[index]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(tmp_path))
    # with what the README's install table says the example needs, and nothing else
    env.update(only_declared(tmp_path / "site", (EXTRA[index],)))
    assert f'".[{EXTRA[index]}]"' in README_EXAMPLE_HEADS()[index]
    for attempt in (1, 2):
        run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, (attempt, run.stderr[-3000:])
    assert "Traceback" not in run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(PRINTED[index]), lines
    assert all(want is None or got == want for got, want in zip(lines, PRINTED[index]))
    if index == 0:
        assert re.fullmatch(r"w8a16 vs w8a8: \d\.\d%", lines[3]), lines[3]
    else:
        assert re.fullmatch(r"\[\[1, 17, 42, 7(, \d+){3}\]\]", lines[2]), lines[2]
