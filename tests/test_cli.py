"""Appendix B: the command line (python -m kimi_mlp synth | info | check | bench)."""
import os
import subprocess
import sys

import pytest

import kimi_mlp.cli as cli
from kimi_mlp.cli import int_in, main

GAIN = "model.layers.0.post_attention_layernorm.weight"


def _fresh(tmp_path, name="c"):
    from kimi_mlp.checkpoint import write_synthetic_checkpoint
    return write_synthetic_checkpoint(tmp_path / name, norm_separate=True)


def test_cli_synth_info_check(tmp_path, capsys):
    d = tmp_path / "cli"
    assert main(["synth", str(d), "--seed", "1", "--norm-separate"]) == 0
    out = capsys.readouterr().out
    assert "drawing and quantizing" in out and "wrote" in out
    assert (d / "model-2-of-2.safetensors").is_file()
    assert main(["info", str(d)]) == 0
    out = capsys.readouterr().out
    assert f"parameters (headers, scales excluded): {3 * 256 * 640 + 256:,}" in out
    assert f"dense MLP by the config: {3 * 256 * 640:,}" in out
    for line in ("model.layers.0.mlp.down_proj.weight_scale_inv   F32      [2, 5]",
                 "model.layers.0.post_attention_layernorm.weight  BF16     [256]            model-2-of-2.safetensors"):
        assert line in out
    assert main(["info", str(d), "--match", "gate", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "gate_proj.weight " in out and "up_proj" not in out and "... and 1 more" in out
    assert main(["check", str(d), "--tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count(": OK") == 2 and "w8a16: relative error" in out and "w8a8: relative error" in out


def test_cli_errors(tmp_path, capsys):
    root = _fresh(tmp_path)
    (root / "model-2-of-2.safetensors").unlink()
    assert main(["check", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "model-2-of-2.safetensors" in err and GAIN in err
    with pytest.raises(SystemExit) as e:
        main(["check", str(root), "--tokens", "0"])
    assert e.value.code == 2
    assert "--tokens: expected an int in [1, 4096], got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nonsense"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: python -m kimi_mlp: argument COMMAND")


def test_cli_is_extensible(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    cli.register_command("hello", lambda args: print("hello", args.name) or 3,
                        lambda p: p.add_argument("name"), "say hello")
    assert main(["hello", "kimi"]) == 3
    assert capsys.readouterr().out == "hello kimi\n"
    # an external command: its parser from a light module first, its work imported only
    # when the command line has parsed, and handed the rest of the command line
    (tmp_path / "fake_bench_options.py").write_text(
        "import argparse\n"
        "def parser():\n"
        "    p = argparse.ArgumentParser(prog='bench')\n"
        "    p.add_argument('--sizes')\n"
        "    return p\n")
    (tmp_path / "fake_bench_cmd.py").write_text("def main(argv):\n    print('bench got', argv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "EXTERNAL_COMMANDS", {"bench": (
        "fake", "fake_bench_options:parser", "fake_bench_cmd:main")})
    assert "fake_bench_cmd" not in sys.modules
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0 and "--sizes" in capsys.readouterr().out
    assert "fake_bench_cmd" not in sys.modules                  # help imports no work
    with pytest.raises(SystemExit) as e:
        main(["bench", "--no-such-option"])
    assert e.value.code == 2 and "fake_bench_cmd" not in sys.modules
    assert main(["bench", "--sizes", "1,2"]) == 0
    assert capsys.readouterr().out == "bench got ['--sizes', '1,2']\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out
    sys.modules.pop("fake_bench_cmd", None)
    sys.modules.pop("fake_bench_options", None)


def test_python_dash_m_runs_the_cli(tmp_path):
    """kimi_mlp/__main__.py: the real entry point, in a fresh process; and
    `python -m kimi_mlp.cli`, the module the book names, is the same command line."""
    def run(module, *args):
        return subprocess.run([sys.executable, "-m", module, *args],
                              capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "COLUMNS": "100"})
    r = run("kimi_mlp", "synth", str(tmp_path / "c"))
    assert r.returncode == 0 and "wrote" in r.stdout and not r.stderr
    r = run("kimi_mlp", "info", str(tmp_path / "nowhere"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    for args in (["--help"], ["info", str(tmp_path / "c")], ["info", "nowhere"]):
        main, cli_ = run("kimi_mlp", *args), run("kimi_mlp.cli", *args)
        assert (cli_.returncode, cli_.stdout, cli_.stderr) == (
            main.returncode, main.stdout, main.stderr), args
        assert cli_.stdout or cli_.stderr
    assert run("kimi_mlp.cli", "--help").stdout.startswith("usage: python -m kimi_mlp ")


def test_int_in():
    parse = int_in(1, 4096)
    assert parse("4096") == 4096
    for text in ("0", "4097", "1e9", "", "x"):
        with pytest.raises(Exception, match=r"expected an int in \[1, 4096\]"):
            parse(text)


def test_keyboard_interrupt_is_one_line(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))
    cli.register_command("slow", interrupted)
    assert main(["slow"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_synth_intermediate_size(tmp_path, capsys):
    "`--intermediate-size` (chapter 12): a small checkpoint of another MLP width."
    from kimi_mlp.config import KimiK2Config
    d = tmp_path / "wide"
    assert main(["synth", str(d), "--intermediate-size", "1024"]) == 0
    assert "hidden 256, intermediate 1024" in capsys.readouterr().out
    assert KimiK2Config.from_json(d / "config.json").intermediate_size == 1024
    assert main(["synth", str(tmp_path / "x"), "--full-size",
                 "--intermediate-size", "1024"]) == 1
    assert capsys.readouterr().err == (
        "error: --intermediate-size: expected it without --full-size (the real width "
        "is 18432), got both\n")
    assert not (tmp_path / "x").exists()


def test_only_a_missing_optional_package_is_named_as_one():
    """A missing optional package is named with its extra; a missing module inside one (an
    older Triton without a module we use) is not called "not installed"."""
    assert cli.missing_package(ModuleNotFoundError("no", name="triton")) == "triton"
    assert cli.missing_package(ModuleNotFoundError("no", name="transformers")) == "transformers"
    assert cli.missing_package(ModuleNotFoundError(
        "no", name="triton.tools.tensor_descriptor")) is None
    assert cli.missing_package(ModuleNotFoundError("no", name="numpyy")) is None
    assert cli.missing_package(ImportError("cannot import name", name="triton")) is None
