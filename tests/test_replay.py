"""Chapter 10's kept launches: the first call at a kept token count records its launches
(chapter 7's `recording`), later calls make the same ones on their own rows and output
(`_replayed`), and anything the recording cannot vouch for is not reused."""
import pytest
import torch

from kimi_mlp import kernels
from kimi_mlp.fused import FusedFp8DenseMLP, _prepared, random_dense_block


def _rows(m, d, seed):
    return torch.randn(m, d, generator=torch.Generator().manual_seed(seed)).to(
        torch.bfloat16)


@pytest.mark.parametrize("mode", ["w8a8", "w8a16"])
def test_later_calls_replay_the_first_calls_launches_bit_for_bit(mode):
    """The same launches on new rows give the same bits as a module that has kept
    nothing (integer arithmetic on the interpreter aside, the kernels and arguments are
    the same ones, so the bits must be too)."""
    base = random_dense_block(256, 320, seed=3)
    kept = FusedFp8DenseMLP(base, mode=mode)
    with torch.no_grad():
        kept(_rows(3, 256, 0))                                   # records
        assert kept._replays.get(3)

        def launchers(*args):
            raise AssertionError("a replayed call ran the launchers")
        kept._launches = launchers                               # from now on: replays
        for seed in (1, 2):
            h = _rows(3, 256, seed)
            again = kept(h)                                      # replays
            fresh = FusedFp8DenseMLP(base, mode=mode, cache_entries=0)(h)
            assert fresh.data_ptr() != again.data_ptr()
            assert torch.equal(again.view(torch.int16), fresh.view(torch.int16))


def test_a_replay_makes_the_recorded_launches_and_no_others(patch_everywhere):
    base = random_dense_block(256, 320, seed=4)
    block = FusedFp8DenseMLP(base)
    log, real = [], kernels.launch_with

    def counted(kernel, grid, args, kwargs):
        log.append((kernel.__name__, tuple(grid)))
        return real(kernel, grid, args, kwargs)

    patch_everywhere(kernels, "launch_with", counted)
    with torch.no_grad():
        block(_rows(2, 256, 0))
        first, log[:] = list(log), []
        block(_rows(2, 256, 1))
    assert log == first and len(first) == 3


def test_rebinding_drops_the_kept_launches():
    """A changed block (its fingerprint) binds again: nothing recorded before is reused,
    so the new eps is what the kernels get."""
    base = random_dense_block(256, 320, seed=5)
    block = FusedFp8DenseMLP(base)
    with torch.no_grad():
        block(_rows(2, 256, 0))
        assert block._replays.get(2)
        base.post_attention_layernorm.eps = 0.5                  # shared with the module
        h = _rows(2, 256, 1)
        out = block(h)                                           # binds, records again
        fresh = FusedFp8DenseMLP(base, cache_entries=0)(h)       # eps 0.5, nothing kept
        before = FusedFp8DenseMLP(random_dense_block(256, 320, seed=5),
                                  cache_entries=0)(h)            # eps as it was
    assert torch.equal(out.view(torch.int16), fresh.view(torch.int16))
    assert not torch.equal(out.view(torch.int16), before.view(torch.int16))
    assert set(block._replays) == {2}
    block.clear_cache()
    assert not block._replays


def test_a_refused_recording_keeps_every_call_working(monkeypatch):
    "Launches `_prepared` refuses are run by their launchers on every call, never lost."
    import kimi_mlp.fused as fused
    monkeypatch.setattr(fused, "_prepared", lambda *a: None)
    base = random_dense_block(256, 320, seed=7)
    block = FusedFp8DenseMLP(base)
    with torch.no_grad():
        outs = [block(_rows(2, 256, s)) for s in (0, 1, 2)]
        fresh = [FusedFp8DenseMLP(base, cache_entries=0)(_rows(2, 256, s))
                 for s in (0, 1, 2)]
    assert block._replays == {2: False} and 2 in block._per_m
    assert all(torch.equal(a, b) for a, b in zip(outs, fresh))


def test_what_is_kept_for_a_named_target_never_serves_the_device():
    "Plans made inside a block that names a GPU are kept under (m, that GPU) only."
    block = FusedFp8DenseMLP(random_dense_block(256, 320, seed=8))
    h200 = kernels.target_named("sm_90a", sms=132)
    with torch.no_grad():
        with kernels.launches_stubbed(h200):
            block(_rows(1, 256, 0))
        assert list(block._per_m) == [(1, h200)]
        out = block(_rows(1, 256, 1))                             # the interpreter's
    assert list(block._per_m) == [(1, h200), 1]
    one, h200s = block._per_m[1][0][0], block._per_m[(1, h200)][0][0]
    assert one["waves"] == 132 * h200s["waves"]                  # 1 SM against 132
    assert torch.isfinite(out).all()


def test_compile_only_is_seen_through_the_blocks_inside_it():
    "A stub or a recording inside `compile_only` still compiles, for its target."
    runtime = kernels.runtime
    l4 = kernels.target_named("sm_89")
    token = runtime._MODE.set(runtime.CompileOnly(l4))          # as compile_only sets it
    try:
        with kernels.recording(), kernels.launches_stubbed():
            assert runtime._compiling()
            assert kernels.device_target(torch.device("cpu")) is l4
    finally:
        runtime._MODE.reset(token)
    with kernels.recording():
        assert not runtime._compiling()


def test_a_token_count_that_is_not_kept_is_never_replayed():
    block = FusedFp8DenseMLP(random_dense_block(256, 320, seed=6), cache_entries=0)
    with torch.no_grad():
        block(_rows(2, 256, 0))
        block(_rows(2, 256, 1))
    assert not block._replays and not block._per_m


def test_prepared_refuses_a_tensor_made_for_one_call():
    """A launch argument that is neither the rows, the output nor a kept tensor (a
    workspace allocated inside a launcher, say) would be stale on the next call: the
    launches are then not kept at all."""
    rows, out = torch.zeros(2, 8), torch.zeros(2, 8)
    kept, other = torch.zeros(4), torch.zeros(4)
    k = kernels.gemm._fp8_gemm_kernel
    ok = _prepared([(k, (1,), (rows, kept, out.view(torch.int32), 3), {"X": 1})],
                   rows, out, [kept])
    assert ok is not None
    (made,), dtype, shape = ok
    assert made[4] == ((0, 0, None, None), (2, 1, torch.int32, None))
    assert (dtype, shape) == (out.dtype, (2, 8))
    assert _prepared([(k, (1,), (rows, other, out), {})], rows, out, [kept]) is None
    assert _prepared([(k, (1,), (rows, kept), {"w": other})], rows, out, [kept]) is None
    assert _prepared([(k, (1,), (rows, kept), {})], rows, out, [kept]) is None  # no out
