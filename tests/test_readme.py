"""The README's Python examples run as written, offline, on a CPU, and again in the same
directory (a reader runs them twice)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    "The ```python blocks of README.md, in order."
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_its_two_examples():
    blocks = python_blocks()
    assert len(blocks) == 2, [b[:60] for b in blocks]
    assert "write_synthetic_checkpoint" in blocks[0] and "fuse_ffn" in blocks[1]


@pytest.mark.parametrize("index", [0, 1], ids=["package", "hugging-face"])
def test_each_readme_example_runs_as_written_twice(index, tmp_path):
    """Each block in a fresh Python, in an empty directory, with no network and the
    interpreter not asked for: it must finish twice in a row."""
    block = python_blocks()[index]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for attempt in (1, 2):
        run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, (attempt, run.stderr[-3000:])
    assert "Traceback" not in run.stderr
