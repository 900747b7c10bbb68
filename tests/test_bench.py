"""Chapter 11 and appendix E: the roofline (kimi_mlp.bench) and the benchmark harness
(kimi_mlp.apparatus.harness) without a GPU.

The plot and target functions are exercised on a SYNTHETIC record written to a temporary directory
(kind "synthetic-test", GPU "FAKE GPU"): its numbers are invented for the test and mean nothing. It is
never stored under book/data. The sweep itself runs in its --cpu-smoke form (tiny shapes, interpreter,
no timings).
"""
import json

import matplotlib
import pytest
import torch

import kimi_mlp

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pathlib import Path  # noqa: E402

from kimi_mlp import bench as B  # noqa: E402  (chapter 11)
from kimi_mlp import fused as FU  # noqa: E402
from kimi_mlp.apparatus import harness, plots, provenance, records  # noqa: E402  (appendices C, E)
from kimi_mlp.fused import random_dense_block  # noqa: E402
from kimi_mlp.apparatus.gpu_check import dequantized_weights, torch_bf16_ffn  # noqa: E402

FAKE_CEILINGS = {"copy_bytes_per_s": 4.0e12, "bf16_flop_per_s": 8.0e14, "fp8_flop_per_s": 1.6e15}


def fake_record(kind="synthetic-test", date="2000-01-01T00:00:00+00:00", fused_decode_us=100.0):
    "A made-up record in the bench schema. Times are invented: fused at the given decode time."
    ms = [1, 16, 4096, 8192]
    results = []
    for m in ms:
        floor = B.roofline_floor_s(m, FAKE_CEILINGS)
        fused = fused_decode_us * 1e-6 if m <= 16 else 1.2 * floor
        times = {"fused": fused, "torch_bf16": 1.5 * fused if m >= 4096 else 2.0 * fused,
                 "unfused_w8a8": 1.1 * fused}
        for name, t in times.items():
            results.append({"provider": name, "m": m, "median_ms": t * 1e3, "timer": "events",
                            "deepgemm": 1e-4, "rel_err_mlp": 1e-3, "rel_bound": 1e-2, "ok": True})
    launches = []
    for m in ms:
        for cost in FU.fused_launch_costs(m):
            floor = FU.launch_floor_s(cost, FAKE_CEILINGS["copy_bytes_per_s"], FAKE_CEILINGS["fp8_flop_per_s"])
            launches.append({"m": m, "launch": cost["launch"], "median_ms": 1.5 * floor * 1e3, "timer": "events"})
    return {
        "schema": records.BENCH_SCHEMA, "kind": kind, "launches": launches,
        "environment": {"gpu": "FAKE GPU (test)", "date_utc": date, "torch": "x", "triton": "y"},
        "shapes": {"hidden_size": 7168, "intermediate_size": 18432, "block_size": [128, 128]},
        "settings": {"m": ms}, "ceilings": dict(FAKE_CEILINGS, details=[]),
        "providers": {n: {"label": harness.PROVIDERS[n], "available": True, "reason": None}
                      for n in ("torch_bf16", "unfused_w8a8", "fused")}
        | {"scaled_mm": {"label": harness.PROVIDERS["scaled_mm"], "available": False, "reason": "test"}},
        "results": results, "skipped": [{"provider": "unfused_w8a8", "m": 8192, "reason": "test"}],
    }


def test_work_by_hand():
    assert B.ffn_flop(1) == 2 * 396_361_728
    assert B.ffn_min_bytes(1) == 396_361_728 + 96_768 + 14_336 + 28_672
    assert B.ffn_min_bytes(3, weights="bf16") == 2 * 396_361_728 + 14_336 + 3 * 28_672
    with pytest.raises(ValueError, match="weights: expected 'fp8' or 'bf16'"):
        B.ffn_min_bytes(1, weights="int4")
    root = Path(kimi_mlp.__file__).resolve().parent.parent
    c = provenance.load_ceilings(root / "book" / "data" / "h200_ceilings.json")
    assert c["sources"]["fp8_flop_per_s"]["status"].startswith("datasheet lead")
    assert B.roofline_floor_s(1, c) == pytest.approx(B.ffn_min_bytes(1) / 4.3e12)    # memory-bound
    assert B.roofline_floor_s(8192, c) == pytest.approx(B.ffn_flop(8192) / c["fp8_flop_per_s"])
    assert B.roofline_floor_s(8192, c, "bf16") == pytest.approx(2 * B.roofline_floor_s(8192, c))


def test_record_round_trip_and_plots(tmp_path):
    path = tmp_path / "bench_fake-gpu_20000101T000000Z.json"
    path.write_text(json.dumps(fake_record()))
    record = records.load_record(path)
    tm = B.timings(record)
    assert set(tm) == {"torch_bf16", "unfused_w8a8", "fused"} and tm["fused"][0] == [1, 16, 4096, 8192]
    fig, axes = plt.subplots(2, 2)
    for fn, ax in zip((plots.plot_time, plots.plot_bandwidth, plots.plot_tflops, plots.plot_speedup), axes.flat):
        assert fn(record, ax) is ax
        assert ax.lines, fn.__name__
        assert "NOT A MEASUREMENT" in ax.get_title()
    # bandwidth: fused at 100 µs moves ffn_min_bytes(m) over 4 TB/s
    frac = axes[0, 1].lines[[l.get_label() for l in axes[0, 1].lines].index(harness.PROVIDERS["fused"])].get_ydata()
    assert frac[0] == pytest.approx(B.ffn_min_bytes(1) / 100e-6 / 4.0e12)
    speed = {l.get_label(): l.get_ydata() for l in axes[1, 1].lines}
    assert list(speed["over unfused_w8a8"]) == pytest.approx([1.1] * 4)
    plt.close(fig)
    rows = plots.launch_breakdown(record)
    assert len(rows) == 12 and all(r["ratio"] == pytest.approx(1.5) for r in rows)
    fig, ax = plt.subplots()
    assert len(plots.plot_launches(record, ax).lines) == 3 + 1          # three launches and the y = 1 line
    plt.close(fig)
    fig, ax = plt.subplots()
    assert len(plots.plot_floors(FAKE_CEILINGS, [1, 2, 4], ax).lines) == 2
    plt.close(fig)
    # a record without ceilings of its own is drawn against ceilings given, or refused
    record["ceilings"] = None
    with pytest.raises(ValueError, match="no measured ceilings"):
        plots.plot_bandwidth(record)
    fig, ax = plt.subplots()
    assert plots.plot_bandwidth(record, ax, ceilings=FAKE_CEILINGS).lines
    plt.close("all")


def test_targets_are_judged_from_the_record():
    met = {t["target"]: t for t in B.check_targets(fake_record(fused_decode_us=100.0))}
    decode, prefill, unfused, scaled_mm = met.values()
    # the worst decode M is M = 1, which moves the fewest bytes in the same 100 µs
    assert decode["met"] is True and decode["worst"] == pytest.approx(B.ffn_min_bytes(1) / 100e-6 / 4e12)
    assert prefill["met"] is True and prefill["worst"] == pytest.approx(1.5)
    assert unfused["met"] is True and unfused["worst"] == pytest.approx(1.1)
    assert scaled_mm["met"] is None and scaled_mm["worst"] is None     # it did not run
    r = fake_record()
    fused = {x["m"]: x for x in r["results"] if x["provider"] == "fused"}
    for m in (1, 16):                                  # cuBLAS ran at two M, faster at one
        r["results"].append({**fused[m], "provider": "scaled_mm",
                             "median_ms": fused[m]["median_ms"] * (0.9 if m == 16 else 1.3)})
    r["providers"]["scaled_mm"] = {"label": "cuBLAS", "available": True, "reason": None}
    target = B.check_targets(r)[3]
    assert target["met"] is False and target["worst"] == pytest.approx(0.9)
    slow = B.check_targets(fake_record(fused_decode_us=200.0))
    assert slow[0]["met"] is False
    # no fused timings: nothing is judged, nothing is "met"
    r = fake_record()
    r["results"] = [x for x in r["results"] if x["provider"] != "fused"]
    assert [t["met"] for t in B.check_targets(r)] == [None, None, None, None]
    # a failed check removes the row from the timings
    r = fake_record()
    for x in r["results"]:
        if x["provider"] == "unfused_w8a8" and x["m"] == 16:
            x["ok"] = False
    assert B.check_targets(r)[2]["met"] is None


@pytest.mark.parametrize("edit, match", [
    (lambda r: r.update(schema="other/1"), "schema: expected 'kimi-mlp-bench/1'"),
    (lambda r: r.pop("results"), "results: expected a list"),
    (lambda r: r["results"][0].pop("median_ms"), r"results\[0\]: missing 'median_ms'"),
    (lambda r: r["results"][0].update(provider="cublas"), r"results\[0\].provider: expected one of"),
    (lambda r: r["results"][0].update(median_ms=-1.0), r"results\[0\].median_ms: expected a positive"),
    (lambda r: r["ceilings"].update(copy_bytes_per_s=0), "ceilings.copy_bytes_per_s: expected a positive"),
])
def test_validate_record_names_the_field(edit, match):
    r = fake_record()
    edit(r)
    with pytest.raises(ValueError, match=match):
        records.validate_record(r)


def test_find_measurements_ignores_other_record_types(tmp_path):
    for name, date in (("bench_a.json", "2026-01-02T00:00:00+00:00"), ("bench_b.json", "2025-01-01T00:00:00+00:00")):
        (tmp_path / name).write_text(json.dumps(fake_record(kind="measurement", date=date)))
    (tmp_path / "bench_c.json").write_text(json.dumps(fake_record(kind="cpu-smoke")))
    assert [p.name for p in records.find_measurements(tmp_path)] == ["bench_b.json", "bench_a.json"]
    assert records.find_measurements(tmp_path / "missing") == []


def test_smoke_records_never_go_to_book_data(tmp_path):
    r = fake_record(kind="cpu-smoke")
    with pytest.raises(ValueError, match="never stored in book/data"):
        records.write_record(r, tmp_path / "book" / "data")
    path = records.write_record(r, tmp_path / "elsewhere")
    assert path.name.startswith("bench-smoke_fake-gpu-test_2000")


def test_providers_agree_before_timing():
    "Every provider that runs here computes the block: checked against both references."
    block = random_dense_block(256, 640, seed=4)
    provs = harness.make_providers(block)
    assert provs["scaled_mm"]["available"] is (provs["scaled_mm"]["reason"] is None)
    if not torch.cuda.is_available():
        assert "CUDA" in provs["scaled_mm"]["reason"]
    h = torch.randn(3, 256, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    with torch.no_grad():
        ref16 = torch_bf16_ffn(h, block, dequantized_weights(block))
        block.mlp.mode = "w8a8"
        ref8 = block(h)
        block.mlp.mode = "w8a16"
        for name, p in provs.items():
            if p["available"]:
                r = harness.check_output(name, p["fn"](h), h, ref16, ref8)
                assert r["ok"], (name, r)
        # and the check can fail: a provider that drops the MLP is caught
        assert not harness.check_output("fused", h.clone(), h, ref16, ref8)["ok"]
    with pytest.raises(ValueError, match="providers: expected names from"):
        harness.make_providers(block, ("cublas",))


def test_cli_cpu_smoke_writes_valid_json(tmp_path, capsys):
    assert harness.main(["--cpu-smoke", "--m", "1,3", "--providers", "fused,unfused_w8a8,scaled_mm",
                   "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("bench-smoke_cpu_*.json")
    record = records.load_record(path)
    assert record["kind"] == "cpu-smoke" and record["ceilings"] is None and record["complete"]
    assert [(r["m"], r["provider"]) for r in record["results"]] == [
        (1, "fused"), (1, "unfused_w8a8"), (3, "fused"), (3, "unfused_w8a8")]
    assert all(r["ok"] and r["median_ms"] is None for r in record["results"])    # nothing timed on a CPU
    assert [(r["m"], r["launch"]) for r in record["launches"]][:3] == [
        (1, "rmsnorm_quant"), (1, "fp8_gate_up_swiglu_quant"), (1, "fp8_down_residual")]
    assert all(r["median_ms"] is None for r in record["launches"])
    if not torch.cuda.is_available():
        assert record["providers"]["scaled_mm"]["available"] is False
    # the unfused baseline quantizes with chapter 7's one-launch kernel when there is one
    used = record["providers"]["unfused_w8a8"]["act_quant"]
    assert used.startswith("kimi_mlp.kernels.act_quant") == hasattr(harness.kernels, "act_quant")
    assert path.with_suffix(".log").read_text().startswith("bench: ")
    out = capsys.readouterr().out
    assert "wrote" in out
    if not torch.cuda.is_available():       # the summary counts the table's skipped cells
        cells = sum(line.split().count("skipped") for line in out.splitlines()
                    if line.split()[:1] in (["1"], ["3"]))
        assert cells == 2 and "; 2 skipped (scaled_mm: not available here)" in out


def test_budget_stops_the_sweep_and_says_so():
    record = harness.bench([1, 2, 3], ("fused",), cpu_smoke=True, budget_s=0.0, log=lambda line: None)
    assert record["not_run_m"] == [1, 2, 3] and not record["complete"] and record["results"] == []


def test_cli_refuses_without_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert harness.main([]) == 3
    assert "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        harness.main(["--providers", "cublas"])
    with pytest.raises(SystemExit):
        harness.main(["--m", "0,1"])


def test_cli_dispatch_from_the_package_command_line(tmp_path):
    "`python -m kimi_mlp bench ...` reaches kimi_mlp.apparatus.harness.main through Appendix B's main()."
    from kimi_mlp.cli import main
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench"]) == 3


def test_pad_rows_for_cublas_scales():
    a = torch.randn(3, 256).to(torch.float8_e4m3fn)
    s = torch.rand(3, 2)
    pa, ps = harness.pad_rows(a, s, 4)
    assert pa.shape == (4, 256) and ps.shape == (4, 2)
    assert torch.equal(pa[:3].view(torch.uint8), a.view(torch.uint8)) and torch.equal(ps[:3], s)
    assert (pa[3].view(torch.uint8) == 0).all() and (ps[3] == 1).all()
    same = torch.randn(8, 256).to(torch.float8_e4m3fn)
    assert harness.pad_rows(same, torch.rand(8, 2))[0] is same


# --- the per-GPU datasheet figures (appendix G's registry; chapter 11's floors on other GPUs) ---------------------

RATE_KEYS = ("bf16_flop_per_s", "fp16_flop_per_s", "fp8_flop_per_s", "fp32_flop_per_s")


def _in_words(x: float, unit: float, text: str) -> bool:
    "Is x / unit written in `text`, as a datasheet writes it (1,979 or 989.5 or 4.5)?"
    return f"{x / unit:,g}" in text


def test_the_registrys_gpus_are_datasheet_figures_with_sources():
    gpus = {g["name"]: g for g in B.datasheet_gpus()}
    assert set(gpus) >= {"T4", "A10G", "A100 40GB", "A100 80GB", "L4", "L40S",
                         "RTX 4090", "H100 SXM", "H200", "B200"}
    for g in gpus.values():
        assert g["source"].startswith("NVIDIA")
        assert g["url"].startswith("https://") and "nvidia.com" in g["url"]
        # the floor moves the 396,361,728 weight bytes and little else (scales, gain, h)
        moved = B.decode_floor_s(1, g["hbm_bytes_per_s"]) * g["hbm_bytes_per_s"]
        assert 396_361_728 < moved < 1.01 * 396_361_728
        # every stored figure is written in its source's words (GB/s, TB/s; TFLOPS, PFLOPS)
        bw = g["hbm_bytes_per_s"]
        assert _in_words(bw, 1e9, g["source"]) or _in_words(bw, 1e12, g["source"]), g["name"]
        for key in RATE_KEYS:
            if g[key] is not None:
                assert _in_words(g[key], 1e12, g["source"]) or _in_words(
                    g[key], 1e15, g["source"]), (g["name"], key)
        # dense FP8 is twice dense bf16 wherever both are stored (the datasheets round: the
        # L40S gives 733 and 362.05): both halved from sparse figures, or neither
        if g["fp8_flop_per_s"] and g["bf16_flop_per_s"]:
            assert g["fp8_flop_per_s"] / g["bf16_flop_per_s"] == pytest.approx(2, rel=0.03)
    # FP8 tensor cores exactly where the kernels take the W8A8 path (sm_89 on); the rate
    # the kernels use is stored for every GPU but the A10G and the RTX 5090
    no_rate = {"A10G", "RTX 5090"}
    for g in gpus.values():
        path, key = g["mode"], g["rate_key"]
        assert (g["fp8_flop_per_s"] is not None) == (path == "w8a8") or g["name"] in no_rate
        assert (g[key] is None) == (g["name"] in no_rate), g["name"]
    t4 = gpus["T4"]
    assert t4["bf16_flop_per_s"] is None and "no bf16" in t4["note"]
    assert t4["fp16_flop_per_s"] == 65e12 and t4["fp32_flop_per_s"] == 8.1e12
    # the A10G has no NVIDIA datasheet of its own: no rate is stored, and the note says why
    a10g = gpus["A10G"]
    assert all(a10g[k] is None for k in RATE_KEYS) and "no NVIDIA" in a10g["note"]
    # the torch names that match a benchmark record to its entry are distinct
    names = [n.lower() for g in gpus.values() for n in g["device_names"]]
    assert len(names) == len(set(names))


def test_floors_per_gpu_use_the_kernels_matrix_unit():
    gpus = {g["name"]: g for g in B.datasheet_gpus()}
    t4, a100, h200, a10g = (gpus[n] for n in ("T4", "A100 80GB", "H200", "A10G"))
    for m in (1, 16, 4096):      # the FLOP of chapter 10's three launches: 2 M (3 d F)
        assert sum(c["flop"] for c in FU.fused_launch_costs(m)) == B.ffn_flop(m)
        assert B.ffn_flop(m) == 2 * m * 3 * 7168 * 18432
    # the T4's kernels run on FMA units: 8.1 TFLOP/s, not its tensor cores' 65
    assert B.prefill_floor_s(t4, 16) == pytest.approx(2 * 16 * 396_361_728 / 8.1e12)
    assert B.prefill_floor_s(a100, 4096) == pytest.approx(B.ffn_flop(4096) / 312e12)  # bf16
    assert B.prefill_floor_s(h200, 4096) == pytest.approx(B.ffn_flop(4096) / 1979e12)  # FP8
    # no rate recorded: no arithmetic floor, and the bandwidth floor alone
    assert B.prefill_floor_s(a10g, 1) is None
    assert B.gpu_floor_s(a10g, 4096) == B.decode_floor_s(4096, 600e9)
    # at M = 1 every GPU is bound by its bandwidth; the T4 by its FMA units from M = 13
    for g in gpus.values():
        assert B.gpu_floor_s(g, 1) == B.decode_floor_s(1, g["hbm_bytes_per_s"])
    assert B.gpu_floor_s(t4, 12) == B.decode_floor_s(12, 320e9)
    assert B.gpu_floor_s(t4, 13) == B.prefill_floor_s(t4, 13)
    with pytest.raises(KeyError):
        B.prefill_floor_s(dict(t4, rate_key="fp4_flop_per_s"), 1)


# --- targets 6 to 8 (the W8A16 path) on SYNTHETIC records: invented times, never stored -------

def w8a16_record(fused_us=None, bf16_ratio=2.0, unfused_ratio=1.1, gpu="NVIDIA A100-SXM4-80GB",
                 capability="8.0", path=None, ms=(1, 4, 16, 4096)):
    """A made-up bench record of the W8A16 path (kind "synthetic-test"): the fused time at
    each M is the given multiple of the A100 80GB's datasheet floor (default 1.2x), torch_bf16
    and unfused_w8a16 slower by the given ratios. The numbers mean nothing."""
    a100 = {g["name"]: g for g in B.datasheet_gpus()}["A100 80GB"]
    fused_us = fused_us or {m: 1.2 * B.gpu_floor_s(a100, m) * 1e6 for m in ms}
    p = B.W8A16_PROVIDERS
    times = {p["fused"]: fused_us,
             p["bf16"]: {m: t * bf16_ratio for m, t in fused_us.items()},
             p["unfused"]: {m: t * unfused_ratio for m, t in fused_us.items()}}
    results = [{"provider": name, "m": m, "median_ms": t * 1e-3, "ok": True}
               for name, by_m in times.items() for m, t in by_m.items()]
    r = fake_record()
    r.update(results=results, skipped=[], launches=[],
             providers={name: {"label": name, "available": True, "reason": None}
                        for name in times})
    r["environment"].update(gpu=gpu, capability=capability)
    if path:
        r["providers"][p["fused"]]["path"] = path
    return records.validate_record(r)


def _verdicts(record):
    gpus = B.datasheet_gpus()
    return [t["verdict"] for t in B.w8a16_targets(record, gpus)]


def test_w8a16_path_from_the_record_or_its_compute_capability():
    assert B.fused_path(w8a16_record(capability="8.0")) == "w8a16"
    assert B.fused_path(w8a16_record(capability="7.5")) == "w8a16"
    assert B.fused_path(w8a16_record(capability="8.9")) == "w8a8"
    assert B.fused_path(w8a16_record(capability="10.0")) == "w8a8"   # not a string compare
    # the W8A16 kernels on an H200 count when the record says so
    assert B.fused_path(w8a16_record(capability="9.0", path="w8a16")) == "w8a16"
    assert B.fused_path(fake_record()) is None        # no capability, no path: not judged
    gpus = B.datasheet_gpus()
    assert B.find_gpu(gpus, "Tesla T4")["name"] == "T4"
    assert B.find_gpu(gpus, " nvidia a100-sxm4-80gb ")["name"] == "A100 80GB"
    assert B.find_gpu(gpus, "NVIDIA A100 80GB PCIe") is None   # another bandwidth: no entry
    assert B.find_gpu(gpus, None) is None


def test_w8a16_targets_met_and_missed():
    met = B.w8a16_targets(w8a16_record(), B.datasheet_gpus())
    assert [t["verdict"] for t in met] == ["met", "met", "met"]
    assert met[0]["worst"] == pytest.approx(1.2)      # every M at 1.2x its floor (decode M)
    assert met[1]["worst"] == pytest.approx(2.0) and met[2]["worst"] == pytest.approx(1.1)
    # 1.35x the floor at one decode M: target 6 missed, by the worst M
    a100 = B.find_gpu(B.datasheet_gpus(), "NVIDIA A100-SXM4-80GB")
    slow = {m: (1.35 if m == 4 else 1.0) * B.decode_floor_s(m, a100["hbm_bytes_per_s"]) * 1e6
            for m in (1, 4, 16)}
    assert _verdicts(w8a16_record(fused_us=slow))[0] == "missed"
    # target 6 counts only decode M: a second at M = 4096, far above its floor, is not its
    # business (the W8A16 targets set no prefill bar)
    far = {1: B.decode_floor_s(1, a100["hbm_bytes_per_s"]) * 1e6, 4096: 1e6}
    assert _verdicts(w8a16_record(fused_us=far))[0] == "met"
    assert _verdicts(w8a16_record(bf16_ratio=1.6)) == ["met", "missed", "met"]
    assert _verdicts(w8a16_record(unfused_ratio=0.99)) == ["met", "met", "missed"]
    assert _verdicts(w8a16_record(unfused_ratio=1.0))[2] == "met"     # never slower: a tie is met


def test_w8a16_targets_without_the_measurements_they_need():
    none = ["no measurement stored"] * 3
    assert _verdicts(None) == none
    assert _verdicts(w8a16_record(capability="9.0")) == none       # a W8A8 record is not judged
    assert _verdicts(fake_record()) == none
    # unfused_w8a16 not timed at one M: a pass is not judged, a miss still counts
    r = w8a16_record()
    r["results"] = [x for x in r["results"]
                    if not (x["provider"] == "unfused_w8a16" and x["m"] == 4096)]
    assert _verdicts(r)[2] == "no measurement stored"
    for x in r["results"]:
        if x["provider"] == "unfused_w8a16" and x["m"] == 1:
            x["median_ms"] *= 0.5
    assert _verdicts(r)[2] == "missed"
    # a failed check removes torch_bf16 at M = 16: target 7 has no full decode range
    r = w8a16_record()
    for x in r["results"]:
        if x["provider"] == "torch_bf16" and x["m"] == 16:
            x["ok"] = False
    assert _verdicts(r)[1] == "no measurement stored"
    # a GPU with no datasheet entry in the registry: target 6 says so instead of guessing
    v = _verdicts(w8a16_record(gpu="NVIDIA A100 80GB PCIe"))
    assert v[0] == "not judged: no datasheet entry for 'NVIDIA A100 80GB PCIe'"
    assert v[1:] == ["met", "met"]
