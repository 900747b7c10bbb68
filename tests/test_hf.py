"""Chapter 13 (kimi_mlp.hf): the fused FFN inside a Hugging Face DeepseekV3 model built from a
config written here (nothing is downloaded), under Triton's interpreter."""
import copy

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from kimi_mlp import hf
from kimi_mlp.checkpoint import load_dense_block, relative_error
from kimi_mlp.fp8 import Fp8DenseMLP
from kimi_mlp.fused import deepgemm_measure
from kimi_mlp.kernels import W8A16_BOUND
from kimi_mlp.safetensors_io import CheckpointError

#: Two layers: layer 0 dense (hidden 256, intermediate 640), layer 1 mixture-of-experts with
#: four routed experts (two per token) and a shared expert of width 128.
TINY = dict(vocab_size=256, hidden_size=256, intermediate_size=640, num_hidden_layers=2,
            first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, n_shared_experts=1, moe_intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=64,
            qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
            max_position_embeddings=128, rope_scaling=None, tie_word_embeddings=False)


def build(meta=False, **changes):
    config = DeepseekV3Config(**{**TINY, **changes})
    if meta:
        with torch.device("meta"):
            return DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = build()
    ckpt = hf.save_fp8_ffn(model, tmp_path_factory.mktemp("ckpt") / "tiny")
    ids = torch.randint(3, TINY["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(1))
    return model, ckpt, ids


def logits(model, ckpt, ids, impl, layers="dense+shared"):
    report = hf.fuse_ffn(model, ckpt, layers=layers, impl=impl)
    try:
        with torch.no_grad():
            return model(ids).logits.float()
    finally:
        report.restore()


def test_the_fused_model_is_the_w8a8_model_and_w8a16_is_the_dequantized_one(tiny):
    """Logits: the kernels at least as close to the torch w8a8 swap as w8a16 is (they differ
    from it only where a float32 sum in another order crosses an e4m3 rounding boundary,
    w8a16 at every activation); the torch w8a16 swap equal to the model holding the
    dequantized weights in its own DeepseekV3MLPs, bit for bit (the same arithmetic)."""
    model, ckpt, ids = tiny
    got = {impl: logits(model, ckpt, ids, impl) for impl in hf.IMPLS}
    twin = copy.deepcopy(model)
    report = hf.fuse_ffn(twin, ckpt, layers="dense+shared", impl="w8a16")
    for s in report.swaps:
        for p in Fp8DenseMLP.PROJECTIONS:
            getattr(s.old[-1], p).weight.data.copy_(getattr(s.new[-1], p).dequantized_weight())
    report.restore()
    with torch.no_grad():
        bf16 = twin(ids).logits.float()
    assert torch.equal(got["w8a16"], bf16)
    e_fused = relative_error(got["fused"], got["w8a8"])
    e_w8a16 = relative_error(got["w8a16"], got["w8a8"])
    assert e_w8a16 > 1e-3 and e_fused <= e_w8a16, (e_fused, e_w8a16)
    assert relative_error(got["fused"], bf16) <= 2 * relative_error(got["w8a8"], bf16)


def test_each_replaced_module_meets_chapter_8s_bounds_on_its_own_inputs(tiny):
    """Every FusedMLP, on the inputs it received in the fused run, against the torch modules:
    within 1e-2 of w8a8 (chapter 10, interpreter) and DeepGEMM's measure below 2^-9 against
    w8a16."""
    model, ckpt, ids = tiny
    report, seen = hf.fuse_ffn(model, ckpt, layers="dense+shared"), {}
    for s in report.swaps:
        s.new[-1].register_forward_hook(      # returns None: the output is kept
            lambda mod, args, out, name=s.module: seen.update({name: (args[0], out)}))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        report.restore()                      # the module-scoped model, as it was
    refs = {}
    for impl in ("w8a8", "w8a16"):
        r = hf.fuse_ffn(model, ckpt, layers="dense+shared", impl=impl)
        r.restore()
        refs[impl] = {s.module: s.new[-1] for s in r.swaps}
    assert sorted(seen) == ["model.layers.0.mlp", "model.layers.1.mlp.shared_experts"]
    for name, (x, y) in seen.items():
        with torch.no_grad():
            y8, y16 = refs["w8a8"][name](x), refs["w8a16"][name](x)
        assert relative_error(y, y8) <= 1e-2
        assert deepgemm_measure(y, y16) < 2.0 ** -9


def test_greedy_generation_gives_the_w8a8_swaps_tokens(tiny):
    model, ckpt, ids = tiny
    out = {}
    for impl in ("w8a8", "fused"):
        report = hf.fuse_ffn(model, ckpt, layers="dense+shared", impl=impl)
        try:
            with torch.no_grad():
                out[impl] = model.generate(ids, max_new_tokens=8, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
        finally:
            report.restore()
    assert out["fused"].shape == (2, 14) and torch.equal(out["fused"], out["w8a8"])


def test_restoring_leaves_the_model_exactly_as_it_was(tiny):
    model, ckpt, ids = tiny
    modules, state = list(model.modules()), model.state_dict()
    with torch.no_grad():
        before = model(ids).logits
    report = hf.fuse_ffn(model, ckpt, layers="dense+shared")
    assert isinstance(model.model.layers[0].mlp, hf.FusedMLP)
    assert isinstance(model.model.layers[0].post_attention_layernorm, torch.nn.Identity)
    assert isinstance(model.model.layers[1].mlp.shared_experts, hf.FusedMLP)
    report.restore()
    report.restore()                                   # a second call does nothing
    after = model.state_dict()
    assert [m for m in model.modules()] == modules and all(
        a is b for a, b in zip(model.modules(), modules))
    assert after.keys() == state.keys()
    assert all(after[k].data_ptr() == v.data_ptr() and torch.equal(after[k], v)
               for k, v in state.items())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_a_model_on_the_meta_device_gets_the_checkpoints_codes(tiny):
    _, ckpt, _ = tiny
    meta = build(meta=True)
    report = hf.fuse_ffn(meta, ckpt, layers="dense+shared", device="cpu")
    dense, shared = (s.new[-1] for s in report.swaps)
    block = load_dense_block(ckpt, layer=0)
    assert dense.gate_proj.weight.device.type == "cpu"
    assert torch.equal(dense.gate_proj.weight.view(torch.uint8),
                       block.mlp.gate_proj.weight.view(torch.uint8))
    assert torch.equal(dense.norm.weight, block.post_attention_layernorm.weight)
    assert shared.intermediate_size == 128 and shared.norm is None
    assert meta.model.layers[1].mlp.experts.gate_up_proj.device.type == "meta"
    assert [s.module for s in report.swaps] == ["model.layers.0.mlp",
                                                "model.layers.1.mlp.shared_experts"]
    assert "dense FFN" in str(report) and "impl='fused'" in str(report)


def test_w8a16_launches_in_the_swap(tiny, monkeypatch):
    """The W8A16 path (what a GPU without e4m3 takes), forced under the interpreter: the
    dense layer's h + mlp(h) against the reference mode "w8a16" within appendix H's
    W8A16_BOUND, in bf16 and in fp16."""
    _, ckpt, _ = tiny
    block = load_dense_block(ckpt, layer=0)
    h = torch.randn(5, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        ref = block(h)                                         # mode "w8a16"
    mlp = hf.FusedMLP(block.mlp, block.post_attention_layernorm)
    for dtype in (torch.bfloat16, torch.float16):
        monkeypatch.setattr(hf, "_choose_mode", lambda device, d=dtype: ("w8a16", d))
        assert mlp.path == "w8a16"
        with torch.no_grad():
            assert relative_error(h + mlp(h), ref) <= W8A16_BOUND
    assert mlp(h[:0]).shape == (0, 256)


def _unchanged(model, modules):
    return all(a is b for a, b in zip(model.modules(), modules))


@pytest.mark.parametrize("case, error, match", [
    ("layers", ValueError, r"layers: expected one of \('dense', 'dense\+shared'\), got 'all'"),
    ("impl", ValueError, r"impl: expected one of \('fused', 'w8a8', 'w8a16'\), got 'bf16'"),
    ("shape", ValueError, r"model\.layers\.0\.mlp\.gate_proj\.weight: expected shape "
                          r"\[640, 256\] \(the checkpoint's\), got \[768, 256\]"),
    ("gelu", ValueError, r"model\.config\.hidden_act: expected 'silu'.*got 'gelu'"),
    ("layers count", ValueError, r"model\.layers: expected 2 decoder layers \(the "
                                 r"checkpoint's\), got 3"),
    ("float32", TypeError, r"model: expected torch\.bfloat16.*got torch\.float32"),
    ("not a deepseek", TypeError, r"model: expected a DeepseekV3-style model"),
    ("meta device", ValueError, r"model\.layers\.0\.mlp: device: expected a device that "
                                r"holds the checkpoint's FP8 tensors.*got meta"),
    ("compiled kernels on the CPU", RuntimeError, r"model\.layers\.0\.mlp: impl 'fused':.*"
                                                  r"compiled for CUDA"),
    ("no shared expert", CheckpointError, r"model\.layers\.1\.mlp\.shared_experts\."),
])
def test_bad_input_names_the_module_and_replaces_nothing(tiny, tmp_path, monkeypatch, case,
                                                         error, match):
    model, ckpt, _ = tiny
    kwargs = {"layers": "dense+shared"}
    target = model
    if case == "layers":
        kwargs["layers"] = "all"
    elif case == "impl":
        kwargs["impl"] = "bf16"
    elif case == "shape":
        target = build(meta=True, intermediate_size=768)
    elif case == "gelu":
        target = build(meta=True, hidden_act="gelu")
    elif case == "layers count":
        target = build(meta=True, num_hidden_layers=3)
    elif case == "float32":
        target = copy.deepcopy(model).float()
    elif case == "not a deepseek":
        target = torch.nn.Linear(4, 4)
    elif case == "meta device":
        kwargs["device"] = "meta"
    elif case == "compiled kernels on the CPU":
        monkeypatch.setattr(hf.kernels, "INTERPRETED", False)
    elif case == "no shared expert":                       # layer 0 loads, layer 1 fails
        (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
        save_file({k: v for k, v in load_file(ckpt / "model.safetensors").items()
                   if ".shared_experts." not in k}, tmp_path / "model.safetensors")
        ckpt = tmp_path
    modules = list(target.modules())
    with pytest.raises(error, match=match) as e:
        hf.fuse_ffn(target, ckpt, **kwargs)
    assert "\n" not in str(e.value) and _unchanged(target, modules)


def test_widths_that_are_not_whole_blocks_are_refused(tmp_path):
    ragged = build(intermediate_size=600)
    ckpt = hf.save_fp8_ffn(ragged, tmp_path / "ragged")
    modules = list(ragged.modules())
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp: expected widths that are "
                                         r"multiples of 128.*intermediate 600"):
        hf.fuse_ffn(ragged, ckpt)
    assert _unchanged(ragged, modules)


def test_fused_mlp_refuses_an_unknown_impl_and_a_bad_input(tiny):
    _, ckpt, _ = tiny
    block = load_dense_block(ckpt, layer=0)
    with pytest.raises(ValueError, match=r"impl: expected one of"):
        hf.FusedMLP(block.mlp, impl="torch")
    with pytest.raises(ValueError, match=r"h: expected torch\.bfloat16.*got torch\.int32"):
        hf.FusedMLP(block.mlp)(torch.zeros(2, 256, dtype=torch.int32))   # not floating
