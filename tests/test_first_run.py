"""What a new user meets on the first day: the import order, the Hugging Face path, the
command line and the caches. Each fix came with a test here that failed before it; a few
tests guard what a fix added (the interpreter's probe, the progress helper)."""
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# A fresh Python runs the fused block on a seeded input and prints the interpreter flag,
# whether the output equals the torch w8a8 reference bit for bit, and a digest of it.
_FUSED_RUN = """
import hashlib, sys, warnings
{first}
import torch
import kimi_mlp.kernels as k
from kimi_mlp.fused import fused_ffn_block, random_dense_block
b = random_dense_block(256, 320, seed=5)
h = torch.randn(20, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
y = fused_ffn_block(h, b)
b.mlp.mode = "w8a8"
print(k.INTERPRETED, torch.equal(y, b(h)),
      hashlib.sha256(y.view(torch.int16).numpy()).hexdigest(),
      k.runtime.triton_adapter.REDECORATED > 0)
"""


def _fresh_python(code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**base, **env}, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is for no CUDA")
def test_the_kernels_work_whatever_was_imported_first():
    """`import triton` (or `from transformers import ...`, which imports it) before
    kimi_mlp: the same bits as importing kimi_mlp first, and INTERPRETED says so."""
    firsts = {"kimi_mlp": "", "triton": "import triton",
              "transformers": "warnings.simplefilter('ignore')\n"
                              "from transformers import DeepseekV3ForCausalLM"}
    lines = {}
    for name, first in firsts.items():
        run = _fresh_python(_FUSED_RUN.format(first=first))
        assert run.returncode == 0, f"{name} first: {run.stderr[-2000:]}"
        lines[name] = run.stdout.split()
    assert lines["kimi_mlp"][:2] == ["True", "True"] and lines["kimi_mlp"][3] == "False"
    for first in ("triton", "transformers"):        # the library had to be repaired
        assert lines[first][:3] == lines["kimi_mlp"][:3] and lines[first][3] == "True"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is for no CUDA")
def test_a_library_the_repair_cannot_reach_stops_the_import_in_one_line():
    """A Triton helper wrapped where the repair cannot see it (a plain function around
    the compiler's tl.sum): the import says what to do instead of kernels failing."""
    run = _fresh_python("import triton, triton.language as tl\n"
                        "jit_sum = tl.sum\n"
                        "tl.sum = lambda *a, **k: jit_sum(*a, **k)\n"
                        "import kimi_mlp.kernels\n")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith(
        "ImportError: kimi_mlp: Triton was imported before kimi_mlp without its "
        "interpreter"), run.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is for no CUDA")
def test_interpreted_never_claims_what_is_not_true():
    "TRITON_INTERPRET=0 on a machine without CUDA: the kernels compile, and the flag says so."
    run = _fresh_python("import triton; import kimi_mlp.kernels as k; print(k.INTERPRETED)",
                        TRITON_INTERPRET="0")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"]


# --- The Hugging Face path -------------------------------------------------------------

from test_hf import TINY, build  # noqa: E402  (chapter 13's tiny DeepseekV3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from kimi_mlp import hf
    model = build()
    ckpt = hf.save_fp8_ffn(model, tmp_path_factory.mktemp("ckpt") / "tiny")
    ids = torch.randint(3, TINY["vocab_size"], (1, 5),
                        generator=torch.Generator().manual_seed(1))
    return model, ckpt, ids


def _fused_tensors(model) -> dict:
    "Every FusedMLP's codes, scales and gain in `model`, by name: (dtype, a copy)."
    from kimi_mlp.hf import FusedMLP
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FusedMLP):
            for t_name, t in mod.state_dict().items():
                out[f"{name}.{t_name}"] = (t.dtype, t.clone())
    return out


@pytest.mark.parametrize("impl", ["fused", "w8a8", "w8a16"])
def test_casting_a_fused_model_keeps_its_codes_and_scales(tiny, impl):
    """model.to(torch.bfloat16), .half(), .float() after fuse_ffn: the e4m3 codes, the
    float32 scales and the bf16 gain keep their dtypes and bits, and each swapped
    module gives on a cast model's input what it gave before any cast on that input
    rounded to bf16, in the model's dtype."""
    import copy

    from kimi_mlp import hf
    model, ckpt, ids = tiny
    model = copy.deepcopy(model)
    report = hf.fuse_ffn(model, ckpt, layers="dense+shared", impl=impl)
    kept = _fused_tensors(model)
    assert {d for d, _ in kept.values()} == {torch.float8_e4m3fn, torch.float32,
                                             torch.bfloat16}
    gen = torch.Generator().manual_seed(2)
    xs = {dtype: torch.randn(3, 256, generator=gen).to(dtype)
          for dtype in (torch.float16, torch.float32)}
    mods = [s.new[-1] for s in report.swaps]
    with torch.no_grad():
        before = model(ids).logits
        want = {(i, dtype): mod(x.to(torch.bfloat16)).to(dtype)       # before any cast
                for i, mod in enumerate(mods) for dtype, x in xs.items()}
        model.to(torch.bfloat16)
        assert torch.equal(model(ids).logits, before)
    for cast, dtype in (("half", torch.float16), ("float", torch.float32)):
        getattr(model, cast)()
        now = _fused_tensors(model)
        for name, (was, t) in kept.items():
            assert now[name][0] == was and torch.equal(now[name][1], t), (cast, name)
        with torch.no_grad():
            for i, mod in enumerate(mods):
                y = mod(xs[dtype])
                assert y.dtype == dtype and torch.equal(y, want[i, dtype]), (cast, i)


def test_casting_a_fused_module_leaves_the_callers_block_intact():
    """FusedFp8DenseMLP shares the caller's block: a cast keeps its codes, scales and
    bf16 gain, and the module still gives the same bits."""
    from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block
    block = random_dense_block(256, 384, seed=7)
    fused = FusedFp8DenseMLP(block)
    h = torch.randn(3, 256, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    codes = {k: v.clone() for k, v in block.state_dict().items()}
    with torch.no_grad():
        before = fused(h)
        for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half()):
            assert cast(fused) is fused
            now = block.state_dict()
            assert all(now[k].dtype == v.dtype and torch.equal(now[k], v)
                       for k, v in codes.items())
            assert torch.equal(fused(h), before)
        fused.float()                 # float32: a gain the kernels read, so it follows
        gain = block.post_attention_layernorm.weight
        assert gain.dtype == torch.float32 and block.mlp.gate_proj.weight.dtype == \
            torch.float8_e4m3fn and torch.equal(gain, codes["post_attention_layernorm."
                                                           "weight"].float())
        assert fused(h).isfinite().all()


def test_saving_a_fused_model_is_refused_until_restore(tiny, tmp_path):
    """save_pretrained after fuse_ffn refuses before it writes anything, and so does
    state_dict() on the model; after restore() the model saves as it was."""
    import copy

    from kimi_mlp import hf
    model, ckpt, _ = tiny
    model = copy.deepcopy(model)
    report = hf.fuse_ffn(model, ckpt, layers="dense+shared")
    with pytest.raises(RuntimeError, match=r"restore\(\) first"):
        model.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
    with pytest.raises(RuntimeError, match=r"model\.layers\.0\.mlp: .*restore\(\)"):
        model.state_dict()
    assert set(report.swaps[0].new[-1].state_dict()) >= {"gate_proj.weight",
                                                         "gate_proj.weight_scale_inv"}
    report.restore()
    model.save_pretrained(tmp_path / "saved")
    from safetensors import safe_open
    with safe_open(tmp_path / "saved" / "model.safetensors", "pt") as f:
        w = f.get_tensor("model.layers.0.mlp.gate_proj.weight")
    assert w.dtype == torch.bfloat16
    assert torch.equal(w, model.model.layers[0].mlp.gate_proj.weight)


@pytest.mark.parametrize("impl", ["fused", "w8a8", "w8a16"])
def test_fuse_ffn_refuses_the_meta_device_before_replacing(tiny, impl):
    "device='meta' would give modules without data: refused for every impl, nothing replaced."
    from kimi_mlp import hf
    _, ckpt, _ = tiny
    model = build(meta=True)
    modules = list(model.modules())
    with pytest.raises(ValueError, match="device: expected a device that holds"):
        hf.fuse_ffn(model, ckpt, layers="dense+shared", impl=impl, device="meta")
    assert all(a is b for a, b in zip(model.modules(), modules))


def test_fuse_ffn_refuses_a_checkpoint_of_another_layer_layout(tiny, tmp_path):
    """A checkpoint whose config makes layer 0 a mixture of experts, for a model whose
    layer 0 is dense: refused by name before anything is replaced (it replaced nothing
    and said nothing)."""
    from kimi_mlp import hf
    model, _, _ = tiny
    other = hf.save_fp8_ffn(build(first_k_dense_replace=0), tmp_path / "all-moe")
    modules = list(model.modules())
    for layers in hf.LAYERS:
        with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp: expected a mixture "
                           r"of experts, as the checkpoint's config makes layer 0"):
            hf.fuse_ffn(model, other, layers=layers)
    assert all(a is b for a, b in zip(model.modules(), modules))
    with pytest.raises(ValueError, match="layers: expected a checkpoint with a dense layer"):
        hf.fuse_ffn(build(first_k_dense_replace=0), other, layers="dense")


def test_save_fp8_ffn_names_a_layer_its_config_places_otherwise(tmp_path):
    """moe_layer_freq 2 makes layer 1 dense by the config's rule, while transformers'
    DeepseekV3 builds a mixture of experts there: one clear error, nothing written (it
    was a bare AttributeError)."""
    from kimi_mlp import hf
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp: expected a dense MLP, as "
                       r"the model's config makes layer 1 .*moe_layer_freq 2\), got "
                       r"DeepseekV3MoE"):
        hf.save_fp8_ffn(build(moe_layer_freq=2), tmp_path / "freq2")
    assert not (tmp_path / "freq2").exists()


def test_save_fp8_ffn_refuses_a_fused_model(tiny, tmp_path):
    "A FusedMLP's weights are FP8 codes, not values: save_fp8_ffn says restore() first."
    import copy

    from kimi_mlp import hf
    model, ckpt, _ = tiny
    for source, layers in ((model, "dense"), (build(first_k_dense_replace=0), "dense+shared")):
        fused = copy.deepcopy(source)
        path = ckpt if source is model else hf.save_fp8_ffn(fused, tmp_path / "moe")
        hf.fuse_ffn(fused, path, layers=layers)
        with pytest.raises(ValueError, match=r"model\.layers\.\d\.mlp.*FusedMLP.*"
                           r"restore\(\) before save_fp8_ffn"):
            hf.save_fp8_ffn(fused, tmp_path / f"again-{layers}")
        assert not (tmp_path / f"again-{layers}").exists()


def test_save_fp8_ffn_refuses_a_model_on_the_meta_device(tmp_path):
    "Weights without data: one error naming the first tensor, nothing written."
    from kimi_mlp import hf
    with pytest.raises(ValueError, match=r"model\.layers\.0\.post_attention_layernorm\."
                       r"weight: expected a tensor with data, got one on the meta device"):
        hf.save_fp8_ffn(build(meta=True), tmp_path / "meta")
    assert not (tmp_path / "meta").exists()


def test_we_never_write_a_checkpoint_we_cannot_read(tmp_path):
    """save_fp8_ffn on weights so small that amax / 448 is subnormal in float32: every
    scale within chapter 6's SCALE_RANGE, the checkpoint loads and dequantizes within
    e4m3's rounding (relative 2^-4, or half the smallest code step at the scale)."""
    from kimi_mlp import hf
    from kimi_mlp.checkpoint import SCALE_RANGE, load_dense_block
    tiny_normal = torch.finfo(torch.float32).tiny          # fp8.SCALE_MIN, 2^-126
    model = build()
    gate = model.model.layers[0].mlp.gate_proj.weight
    with torch.no_grad():
        gate.mul_(1e-36)                       # amax / 448 about 1e-40: subnormal
    want = gate.detach().double()
    ckpt = hf.save_fp8_ffn(model, tmp_path / "tiny-weights")
    block = load_dense_block(ckpt, layer=0)            # refused before: subnormal scales
    s = block.mlp.gate_proj.weight_scale_inv
    assert bool(((s >= SCALE_RANGE[0]) & (s <= SCALE_RANGE[1])).all())
    assert bool((s == tiny_normal).any())
    got = block.mlp.gate_proj.dequantized_weight(torch.float32).double()
    err = (got - want).abs()
    assert bool((err <= torch.maximum(want.abs() * 2.0**-4,
                                      torch.tensor(2.0**-10 * tiny_normal))).all())


def test_a_long_directory_name_that_is_legal_is_written(tmp_path):
    """A 240-byte directory name (legal: at most 255) gets a checkpoint: the temporary
    directory beside it is named within the limit too. Above 255 bytes: one error."""
    from kimi_mlp import hf
    from kimi_mlp.checkpoint import load_dense_block
    model = build()
    name = "k" * 200 + "é" * 20                       # 240 bytes in UTF-8
    ckpt = hf.save_fp8_ffn(model, tmp_path / name)
    assert load_dense_block(ckpt, layer=0).mlp.gate_proj.weight.shape == (640, 256)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]   # nothing left beside
    with pytest.raises(ValueError, match="path: expected a name of at most 255 bytes"):
        hf.save_fp8_ffn(model, tmp_path / ("k" * 256))


# --- The caches of the fused module -------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs programs in turn")
def test_an_interrupt_inside_a_split_launch_leaves_no_stale_counter(monkeypatch, patch_everywhere):
    """A launch cut short after one slice of a tile arrived (an interrupt inside the
    gate/up launch, split 3 ways): the next call at the same M gives the same bits as
    before, because the cached intermediates with their arrival counters were dropped."""
    from kimi_mlp import kernels as K
    from kimi_mlp.fused import FusedFp8DenseMLP, random_dense_block
    real_plan, real_last = K._plan_for, K.gemm._last_of_tile
    patch_everywhere(K, "_plan_for", lambda kind, m, n, k, device, *a, **kw:
                        real_plan(kind, m, n, k, device, 3))
    fused = FusedFp8DenseMLP(random_dense_block(384, 330, seed=1))
    gen = torch.Generator().manual_seed(9)
    h, h2 = (torch.randn(2, 384, generator=gen).to(torch.bfloat16) for _ in range(2))
    calls = []

    def cut_short(*args):
        last = real_last(*args)                     # the slice has counted itself
        calls.append(last)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return last

    with torch.no_grad():
        want = FusedFp8DenseMLP(fused)(h2)          # a module of its own
        fused(h)                                    # the scratch for M = 2 is kept
        patch_everywhere(K, "_last_of_tile", cut_short)
        with pytest.raises(KeyboardInterrupt):
            fused(h)
        patch_everywhere(K, "_last_of_tile", real_last)
        assert torch.equal(fused(h2), want)
        assert torch.equal(fused(h2), want)


def test_the_kept_intermediates_are_bounded_visible_and_freed(monkeypatch):
    """The fused module keeps at most cache_entries token counts and cache_bytes bytes,
    least recently used out first; cache_info() reports it, clear_cache() frees it, and
    the defaults bound a decode loop over many token counts."""
    from kimi_mlp import fused as F
    block = F.random_dense_block(256, 384, seed=4)
    gen = torch.Generator().manual_seed(10)
    hs = {m: torch.randn(m, 256, generator=gen).to(torch.bfloat16) for m in range(1, 8)}
    size = {m: F.kept_bytes(m, 256, 384, num_sms=1) for m in hs}
    with torch.no_grad():
        module = F.FusedFp8DenseMLP(block, cache_entries=2)
        want = {m: module(hs[m]) for m in (1, 2, 3)}
        assert module.cache_info()["ms"] == [2, 3]
        module(hs[2])                                        # 2 is the most recent now
        module(hs[4])
        assert module.cache_info()["ms"] == [2, 4]
        assert module.cache_info()["bytes"] == size[2] + size[4]
        by_bytes = F.FusedFp8DenseMLP(block, cache_bytes=size[6] + size[7])
        for m in (5, 6, 7):
            by_bytes(hs[m])
        assert by_bytes.cache_info()["ms"] == [6, 7]         # 5 went for 7
        assert by_bytes.cache_info()["bytes"] == size[6] + size[7]
        small = F.FusedFp8DenseMLP(block, cache_bytes=size[1])
        small(hs[2])                                         # larger than the bound
        assert small.cache_info()["ms"] == [] and small.cache_info()["bytes"] == 0
        default = F.FusedFp8DenseMLP(block).cache_info()
        assert (default["cache_entries"], default["cache_bytes"]) == (32, 256 * 2**20)
        monkeypatch.setattr(F, "CACHE_ENTRIES", 3)          # the defaults bound a loop
        loop = F.FusedFp8DenseMLP(block)
        for m in hs:
            loop(hs[m])
        assert loop.cache_info()["ms"] == [5, 6, 7]
        module.clear_cache()
        assert module.cache_info()["ms"] == [] and module.cache_info()["bytes"] == 0
        assert all(torch.equal(module(hs[m]), want[m]) for m in want)
    with pytest.raises(ValueError, match=r"cache_bytes: expected an int >= 0, got -1"):
        F.FusedFp8DenseMLP(block, cache_bytes=-1)


def test_kept_bytes_is_what_a_module_keeps():
    """kept_bytes (meta device, no allocation) equals the bytes of what the module really
    allocates for the same plans, here at small widths with a plan split along K."""
    from kimi_mlp import fused as F
    block = F.random_dense_block(384, 330, seed=1)
    module = F.FusedFp8DenseMLP(block)
    for m in (1, 16):
        plans, scratch = module._prepare(m, keep=False)
        assert F._nbytes(scratch) == F.kept_bytes(m, 384, 330, num_sms=1)
    wide = F.FusedFp8DenseMLP(F.random_dense_block(1024, 640, seed=2))
    split = F._plans_and_scratch(wide._t, 1, None, num_sms=132)
    assert split[0][0]["split_k"] == 2                   # gate/up's partials kept too
    assert F._nbytes(split[1]) == F.kept_bytes(1, 1024, 640, num_sms=132)


# --- Bounds -------------------------------------------------------------------------------

@pytest.mark.parametrize("d, gain_safe, gain_over", [(129, 5728.0, 5760.0),
                                                     (7168, 772.0, 776.0)])
def test_fp16_bounds_holds_at_its_edge_and_is_tight_there(d, gain_safe, gain_over):
    """rmsnorm_act in fp16 at the edge of what fp16_bounds claims: with the largest bf16
    gain it calls safe, the worst input (one large feature: |h_0| rstd on sqrt(d))
    stores a finite value, equal to the bound (tight: ratio 1); one bf16 step higher the
    bound is not finite, and the kernel does give inf there (5760 at d = 129: the old
    bound, sqrt(d) max|gain| = 65421, called it safe)."""
    import warnings

    from kimi_mlp import kernels as K
    codes, unit = torch.zeros(128, d, dtype=torch.uint8), torch.ones(1, -(-d // 128))
    hot = torch.zeros(1, d, dtype=torch.bfloat16)
    hot[0, 0] = 2.0**10
    for g, finite in ((gain_safe, True), (gain_over, False)):
        gain = torch.full((d,), g, dtype=torch.bfloat16)
        bound = K.fp16_bounds(gain, codes, unit, codes, unit)["x"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = K.rmsnorm_act(hot, gain, 1e-6, torch.float16).abs().max().item()
        assert (bound <= K.FP16_MAX) == finite == math.isfinite(got), (g, bound, got)
        if finite:
            assert got == bound                                      # tight
    # random inputs at every scale stay within the safe gain's bound
    gain = torch.full((d,), gain_safe, dtype=torch.bfloat16)
    bound = K.fp16_bounds(gain, codes, unit, codes, unit)["x"]
    gen = torch.Generator().manual_seed(12)
    h = torch.randn(64, d, generator=gen) * torch.logspace(-3, 3, 64)[:, None]
    x = K.rmsnorm_act(h.to(torch.bfloat16), gain, 1e-6, torch.float16)
    assert x.isfinite().all() and x.abs().max().item() <= bound


# --- The command line ---------------------------------------------------------------------

#: Every command, with arguments that would run it (DIR: a small checkpoint).
COMMANDS = {
    "synth": ["synth", "{tmp}/new"], "info": ["info", "{ckpt}"],
    "check": ["check", "{ckpt}", "--tokens", "2"],
    "bench": ["bench", "--cpu-smoke", "--out", "{tmp}/bench"],
    "gpu-report": ["gpu-report", "--cpu-smoke", "--out", "{tmp}/report"],
    "inspect": ["inspect", "--m", "1"], "tune": ["tune", "--out", "{tmp}/t.json"],
    "tp-check": ["tp-check", "{ckpt}"],
    "gpucheck": ["gpucheck", "--cpu-smoke", "--out", "{tmp}/check"],
}
#: The imports the base install lacks: Triton, transformers, matplotlib.
_BLOCKED = ("import sys\n"
            "for name in ('triton', 'transformers', 'matplotlib'):\n"
            "    sys.modules[name] = None     # `import name` raises ModuleNotFoundError\n")


def run_command(name: str, args: list, blocked: bool = False) -> subprocess.CompletedProcess:
    "`python -m kimi_mlp ARGS` in a fresh Python."
    module = "kimi_mlp"
    code = (_BLOCKED if blocked else "import sys\n") + (
        "import runpy\n"
        f"sys.argv = ['python -m {module}', *{args!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    return _fresh_python(code)


def run_here(name: str, args: list, capsys) -> subprocess.CompletedProcess:
    """The same in this process (for what stops before any work: usage errors and
    refusals), as a CompletedProcess: exit status, stdout, stderr."""
    import runpy
    module = "kimi_mlp"
    capsys.readouterr()
    sys.modules.pop(f"{module}.__main__" if module == "kimi_mlp" else module, None)
    saved = sys.argv
    sys.argv = [f"python -m {module}", *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = saved
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory):
    from kimi_mlp import write_synthetic_checkpoint
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("cli") / "ckpt")


def _one_error_line(run) -> str:
    lines = run.stderr.strip().splitlines()
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr[-3000:]
    return lines[0]


# One fresh Python with the base install's imports blocked runs every command in turn and
# prints, per command, a JSON line: its name, exit status and stderr.
_EVERY_COMMAND = _BLOCKED + """import contextlib, io, json, runpy
for name, module, args in {runs!r}:
    err, out = io.StringIO(), io.StringIO()
    sys.argv = [f"python -m {{module}}", *args]
    sys.modules.pop("kimi_mlp.__main__", None)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=False)
            code = 0
        except SystemExit as e:
            code = e.code
    print(json.dumps([name, code, out.getvalue(), err.getvalue()]))
"""


def test_without_the_optional_packages_every_command_says_what_to_install(small_ckpt,
                                                                         tmp_path):
    """The base install (triton, transformers and matplotlib blocked): each command
    runs, or says in one line which package and which extra it needs, exit status 4;
    never a traceback. Asked for its help, every command prints it and exits 0: a
    command needs Triton to run, not to say what it takes. `python -m kimi_mlp.gpucheck`,
    the old name of `gpucheck`, behaves the same."""
    import json
    runs = [(name, "kimi_mlp", [a.format(tmp=tmp_path, ckpt=small_ckpt) for a in args])
            for name, args in COMMANDS.items()]
    runs += [(f"{name} --help", "kimi_mlp", [args[0], "--help"])
             for name, args in COMMANDS.items()]
    runs += [("kimi_mlp.gpucheck", "kimi_mlp.gpucheck", ["--cpu-smoke"]),
             ("kimi_mlp.gpucheck --help", "kimi_mlp.gpucheck", ["--help"])]
    run = _fresh_python(_EVERY_COMMAND.format(runs=runs))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert [name for name, _, _, _ in results] == [name for name, _, _ in runs]
    for name, code, out, err in results:
        if name.endswith("--help"):
            command = name.split()[0].replace("kimi_mlp.gpucheck", "gpucheck")
            assert code == 0 and not err, (name, code, err[-3000:])
            assert out.startswith("usage: ") and f" {command} [-h]" in out.splitlines()[0], \
                (name, out[:300])
            continue
        if name in ("synth", "info", "check"):
            assert code == 0 and "Traceback" not in err, (name, err[-3000:])
            continue
        lines = err.strip().splitlines()
        assert code == 4 and len(lines) == 1, (name, code, err[-3000:])
        assert lines[0].startswith("error: ") and "needs triton, which is not " \
            "installed: pip install 'kimi-mlp[kernels]'" in lines[0], (name, lines)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_refuses_a_bad_argument_in_one_line(name, small_ckpt, tmp_path,
                                                         capsys):
    "A malformed command line: one line naming the option, exit status 2."
    args = [a.format(tmp=tmp_path, ckpt=small_ckpt) for a in COMMANDS[name]]
    run = run_here(name, args + ["--no-such-option"], capsys)
    line = _one_error_line(run)
    assert run.returncode == 2, (run.returncode, line)
    assert "--no-such-option" in line


def test_gpu_report_names_matplotlib_and_its_extra(tmp_path):
    "With Triton but without matplotlib, gpu-report stops at its start and says so."
    code = ("import sys\nsys.modules['matplotlib'] = None\nimport runpy\n"
            f"sys.argv = ['python -m kimi_mlp', 'gpu-report', '--cpu-smoke', '--out', "
            f"{str(tmp_path / 'r')!r}]\n"
            "runpy.run_module('kimi_mlp', run_name='__main__', alter_sys=True)\n")
    run = _fresh_python(code)
    line = _one_error_line(run)
    assert run.returncode == 4 and "needs matplotlib" in line \
        and "pip install 'kimi-mlp[report]'" in line, line
    assert not (tmp_path / "r").exists()                    # stopped before any work


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name, args", [("bench", ["bench"]), ("tune", ["tune"]),
                                        ("gpu-report", ["gpu-report", "--out", "{tmp}"]),
                                        ("gpucheck", ["gpucheck"])])
def test_a_command_that_needs_a_gpu_exits_with_3(name, args, tmp_path, capsys):
    "No CUDA device and no --cpu-smoke: one line, exit status 3 (2 means a usage error)."
    run = run_here(name, [a.format(tmp=tmp_path / "out") for a in args], capsys)
    line = _one_error_line(run)
    assert run.returncode == 3, (run.returncode, line)
    assert "CUDA" in line


@pytest.mark.parametrize("name, args", [
    ("bench", ["bench", "--cpu-smoke", "--out", "{file}"]),
    ("gpu-report", ["gpu-report", "--cpu-smoke", "--out", "{file}"]),
    ("gpucheck", ["gpucheck", "--cpu-smoke", "--out", "{file}"]),
    ("tune", ["tune", "--out", "{dir}"])])
def test_out_naming_the_wrong_kind_of_path_is_a_usage_error(name, args, tmp_path,
                                                           capsys):
    """--out naming an existing file where a directory is written (a directory where
    tune writes a file): one line, exit status 2, before any work."""
    target = tmp_path / "results"
    target.write_text("keep me") if name != "tune" else target.mkdir()
    run = run_here(name, [a.format(file=target, dir=target) for a in args], capsys)
    line = _one_error_line(run)
    assert run.returncode == 2 and "argument --out: expected a" in line, line
    assert target.is_dir() if name == "tune" else target.read_text() == "keep me"


@pytest.mark.parametrize("name, args, option", [
    ("gpucheck", ["gpucheck", "--cpu-smoke", "--hidden-size", "0"], "--hidden-size"),
    ("gpucheck", ["gpucheck", "--cpu-smoke", "--intermediate-size", "100"],
     "--intermediate-size"),
    ("inspect", ["inspect", "--hidden-size", "-128"], "--hidden-size"),
    ("inspect", ["inspect", "--sms", "0"], "--sms"),
    ("synth", ["synth", "{tmp}/x", "--intermediate-size", "64"], "--intermediate-size"),
    ("bench", ["bench", "--cpu-smoke", "--budget-s", "nan"], "--budget-s"),
    ("bench", ["bench", "--cpu-smoke", "--rep-ms", "-1"], "--rep-ms"),
    ("gpu-report", ["gpu-report", "--out", "{tmp}/r", "--budget-s", "-1"],
     "--budget-s")])
def test_sizes_and_numbers_are_validated_always(name, args, option, tmp_path, capsys):
    "A width below 128, a count below 1, a NaN budget: a usage error with --cpu-smoke too."
    run = run_here(name, [a.format(tmp=tmp_path) for a in args], capsys)
    line = _one_error_line(run)
    assert run.returncode == 2 and f"argument {option}: expected" in line, line


def test_gpucheck_cpu_smoke_honours_the_sizes_it_is_given(tmp_path):
    "--cpu-smoke with --hidden-size and --intermediate-size checks those widths."
    import contextlib
    import io
    import json

    from kimi_mlp.apparatus.gpu_check import gpucheck_main
    with contextlib.redirect_stdout(io.StringIO()):
        rc = gpucheck_main(["--cpu-smoke", "--hidden-size", "128", "--intermediate-size",
                            "256", "--m", "1", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "gpucheck.json").read_text())
    assert rc == 0 and record["shapes"] == {"hidden_size": 128, "intermediate_size": 256}


def test_inspect_reports_its_progress_one_line_per_step():
    "Not on a terminal: `inspect` prints one line per workload and M on stderr."
    run = run_command("inspect", ["inspect", "--m", "1,3", "--hidden-size", "256",
                                  "--intermediate-size", "256"])
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["inspect [1/2]", "inspect [2/2]"]
    assert "block at M = 3: 3 launches" in lines[1]


def test_on_a_terminal_bench_draws_a_bar_below_its_table(tmp_path, capsys, monkeypatch):
    """bench --cpu-smoke with stderr on a terminal (a stand-in that says it is one): a
    tqdm bar, and the table's lines intact on stdout. (Its summary's count of skipped
    cells: test_bench's smoke test.)"""
    import io

    pytest.importorskip("tqdm")
    from kimi_mlp.apparatus import harness

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    assert harness.main(["--cpu-smoke", "--m", "1", "--providers", "fused,scaled_mm",
                         "--out", str(tmp_path)]) == 0
    assert "bench: 100%" in screen.getvalue() and "1/1" in screen.getvalue()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bench: CPU") and any(
        line.startswith("done in ") and "1 skipped (scaled_mm" in line for line in out)


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere():
    """Not a terminal: "WHAT [i/n]: text" lines (none with lines=False). A terminal with
    tqdm: a bar, and the command's own printed lines go above it, the last one even
    when it has no newline yet."""
    import contextlib
    import io

    from kimi_mlp.cli import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    plain, quiet = io.StringIO(), io.StringIO()
    with Progress("work", 2, stream=plain) as step:
        step("one"), step("two")
    with Progress("work", 2, lines=False, stream=quiet) as step:
        step("one")
    assert plain.getvalue() == "work [1/2]: one\nwork [2/2]: two\n"
    assert quiet.getvalue() == ""
    if importlib.util.find_spec("tqdm") is None:
        return
    screen, out = Terminal(), io.StringIO()
    with contextlib.redirect_stdout(out):
        with Progress("work", 2, lines=False, stream=screen) as step:
            print("row 1")
            step("one")
            print("row 2", end="")
    assert "work" in screen.getvalue() and "[1/2]" not in screen.getvalue()
    assert out.getvalue() == "row 1\nrow 2\n"


# --- Long work says so -------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is for no CUDA")
def test_a_launch_the_interpreter_takes_long_over_is_announced_once(monkeypatch, caplog):
    """The interpreter about to run a launch with an operand as large as SLOW_OPERAND: one
    line on the logger kimi_mlp, once per process, from either place a launch runs (a
    plain launch, and the recording a module makes of its first call); nothing at the
    widths below it."""
    import logging
    from kimi_mlp import triton_adapter
    from kimi_mlp.fused import FusedFp8DenseMLP, fused_ffn_block, random_dense_block
    block = random_dense_block(256, 320, seed=5)
    h = torch.randn(3, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    assert 7168 * 18432 >= triton_adapter.SLOW_OPERAND > 256 * 640    # a real weight is
    caplog.set_level(logging.WARNING, logger="kimi_mlp")
    monkeypatch.setattr(triton_adapter, "_noted", [])
    fused_ffn_block(h, block)
    assert not caplog.records                                     # small: nothing said
    monkeypatch.setattr(triton_adapter, "SLOW_OPERAND", 256 * 320)
    for run in (lambda: fused_ffn_block(h, block),                 # a plain launch
                lambda: FusedFp8DenseMLP(block)(h)):               # a recorded first call
        monkeypatch.setattr(triton_adapter, "_noted", [])
        caplog.clear()
        run(), run()
        (record,) = caplog.records                                 # once, not per call
        assert record.name == "kimi_mlp" and record.levelno == logging.WARNING
        message = record.getMessage()
        assert "\n" not in message and "Triton's CPU interpreter is running a launch" \
            in message and "takes minutes at Kimi K2's widths" in message


def test_the_checkpoint_writer_reports_progress_at_full_size_by_default(tmp_path, capsys,
                                                                        monkeypatch):
    """write_synthetic_checkpoint prints its steps when the weights pass PROGRESS_BYTES (a
    full-size layer's 378 MiB do) unless progress=False, and is silent for a small one."""
    from kimi_mlp import checkpoint
    assert 3 * 7168 * 18432 >= checkpoint.PROGRESS_BYTES > 3 * 256 * 640
    checkpoint.write_synthetic_checkpoint(tmp_path / "small")
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(checkpoint, "PROGRESS_BYTES", 3 * 256 * 640)   # as if full size
    checkpoint.write_synthetic_checkpoint(tmp_path / "large")
    lines = capsys.readouterr().out.splitlines()
    assert any("drawing and quantizing to e4m3" in line for line in lines)
    assert lines[-1].startswith(f"wrote {tmp_path / 'large'}: ")
    checkpoint.write_synthetic_checkpoint(tmp_path / "quiet", progress=False)
    assert capsys.readouterr().out == ""
