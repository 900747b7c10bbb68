"""Chapter 6's load benchmark: load_dense_block against plain file reads of the same bytes.

    python tools/bench_load.py                  # writes book/data/06_load_bench.json
    python tools/bench_load.py --reps 10 --out FILE --ckpt /scratch/full   # keep the checkpoint

Writes a FULL-size synthetic checkpoint (layer 0's MLP, 378 MiB, in one shard beside a 2.19 GiB
embedding-shaped bf16 tensor, as in the real first shard; about 2.6 GB, a minute to write) to a
temporary directory (or to --ckpt, kept for reuse), then:

- time: with the shard in the page cache for everyone (it is read once before timing), the median
  and the minimum over --reps repetitions, interleaved in a rotating order, of
  (a) `raw`: readinto of the seven tensors' byte ranges into fresh numpy buffers, nothing else;
  (b) `load_dense_block`: the whole loader, modules included;
  (b') `raw_torch_empty`: (a) with torch.empty buffers instead of numpy's (4 KiB pages, see below);
  (c) `safe_open_copy`: safetensors' get_tensor on the same seven tensors, copied out of the mapping;
  (d) `safe_open_mmap`: the same tensors left in safetensors' mapping, each page touched once (as a
      first forward pass would);
- memory: each method once more in a fresh Python process that first imports everything, records
  its resident set (VmRSS), loads, and reports the resident-set high-water mark (VmHWM); the peak
  rise is compared with the tensors' bytes.

numpy backs large arrays with transparent huge pages (madvise), torch.empty does not; with the file
in the page cache the page faults of the destination dominate, hence (b').

Targets (issue 4): load_dense_block <= 1.3 x raw time; peak rise <= 1.25 x the tensors' bytes.
Not a test: timings depend on the machine (and on what else runs on it).
"""
import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from kimi_mlp.checkpoint import (dense_block_tensors, load_dense_block,  # noqa: E402
                                 write_synthetic_checkpoint)
from kimi_mlp.config import KimiK2Config  # noqa: E402
from kimi_mlp.safetensors_io import read_safetensors_layout, resolve_tensor_files  # noqa: E402



class LoadBenchMethod(TypedDict):
    "One method's times (seconds) and memory (bytes), and their ratios to `raw`'s."
    times_s: list[float]
    median_s: float
    time_vs_raw: float
    min_s: float
    min_vs_raw_min: float
    rss_before_bytes: int
    peak_bytes: int
    peak_rise_bytes: int
    memory_vs_bytes: float


class LoadBench(TypedDict):
    "book/data/06_load_bench.json: one run of this script (no schema field)."
    what: str
    date: str                    # ISO date
    machine: dict                # platform, cpus, memory_gib, python, torch, safetensors
    reps: int
    page_cache: str
    shard_bytes: int
    tensor_bytes: int
    targets: dict                # time_vs_raw, memory_vs_bytes
    results: dict[str, LoadBenchMethod]      # METHODS' names


_NUM, _COUNT = {"type": "number", "minimum": 0}, {"type": "integer", "minimum": 0}
LOAD_BENCH_JSON_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "chapter 6's load benchmark", "type": "object", "additionalProperties": False,
    "required": ["what", "date", "machine", "reps", "page_cache", "shard_bytes",
                 "tensor_bytes", "targets", "results"],
    "properties": {
        "what": {"type": "string"}, "date": {"type": "string", "format": "date"},
        "machine": {"type": "object"}, "reps": {"type": "integer", "minimum": 1},
        "page_cache": {"type": "string"}, "shard_bytes": _COUNT, "tensor_bytes": _COUNT,
        "targets": {"type": "object", "required": ["time_vs_raw", "memory_vs_bytes"],
                    "additionalProperties": _NUM},
        "results": {"type": "object", "required": ["raw"], "additionalProperties": {
            "type": "object", "additionalProperties": False,
            "required": ["times_s", "median_s", "time_vs_raw", "min_s", "min_vs_raw_min",
                         "rss_before_bytes", "peak_bytes", "peak_rise_bytes",
                         "memory_vs_bytes"],
            "properties": {"times_s": {"type": "array", "items": _NUM, "minItems": 1},
                           "median_s": _NUM, "time_vs_raw": _NUM, "min_s": _NUM,
                           "min_vs_raw_min": _NUM, "rss_before_bytes": _COUNT,
                           "peak_bytes": _COUNT, "peak_rise_bytes": {"type": "integer"},
                           "memory_vs_bytes": {"type": "number"}}}},
    },
}

EMBED = ("model.embed_tokens.weight", (163840, 7168), torch.bfloat16)   # the real shape: 2.19 GiB


def byte_ranges(ckpt: Path):
    "(file, [(absolute offset, nbytes), ...]) for layer 0's seven tensors."
    specs = dense_block_tensors(KimiK2Config.from_json(ckpt / "config.json"), 0)
    (file, names), = resolve_tensor_files(ckpt, specs).items()
    header, start = read_safetensors_layout(file)
    return file, [(start + header[n]["data_offsets"][0],
                   header[n]["data_offsets"][1] - header[n]["data_offsets"][0]) for n in names], names


def _read_ranges(ckpt: Path, new_buffer):
    """Read each tensor's byte range with plain readinto calls into `new_buffer(n)`, a fresh
    buffer of n bytes exposing the buffer protocol (numpy array) or a `.numpy()` view (tensor)."""
    file, ranges, _ = byte_ranges(ckpt)
    out = []
    with open(file, "rb", buffering=0) as f:
        for offset, n in ranges:
            buf = new_buffer(n)
            f.seek(offset)
            view, got = memoryview(buf.numpy() if isinstance(buf, torch.Tensor) else buf), 0
            while got < n:
                got += f.readinto(view[got:])
            out.append(buf)
    return out


def raw(ckpt: Path):
    "Plain reads of the same byte ranges into fresh buffers: the floor for any loader."
    return _read_ranges(ckpt, lambda n: np.empty(n, dtype=np.uint8))


def raw_torch_empty(ckpt: Path):
    "The same plain reads into torch.empty buffers (4 KiB pages: no transparent-huge-page madvise)."
    return _read_ranges(ckpt, lambda n: torch.empty(n, dtype=torch.uint8))


def safe_open_copy(ckpt: Path):
    "safetensors' memory-mapped reader, each tensor copied out of the mapping (get_tensor().clone())."
    file, _, names = byte_ranges(ckpt)
    with safe_open(file, "pt") as f:
        return [f.get_tensor(n).clone() for n in names]


def safe_open_mmap(ckpt: Path):
    "safetensors' tensors left in the mapping (no copy), every page touched once as a forward would."
    file, _, names = byte_ranges(ckpt)
    with safe_open(file, "pt") as f:
        out = [f.get_tensor(n) for n in names]
    for t in out:
        t.view(torch.uint8).view(-1)[::4096].sum()
    return out


METHODS = {"raw": raw, "load_dense_block": lambda ckpt: load_dense_block(ckpt),
           "raw_torch_empty": raw_torch_empty, "safe_open_copy": safe_open_copy,
           "safe_open_mmap": safe_open_mmap}


def proc_status(field: str) -> int:
    "A memory field of /proc/self/status (VmRSS, VmHWM) in bytes. VmHWM starts afresh at exec."
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def child(method: str, ckpt: Path) -> None:
    "Run in a fresh process: report the resident set before and the high-water mark after one load."
    gc.collect()
    before = proc_status("VmRSS")
    result = METHODS[method](ckpt)
    # (getrusage's ru_maxrss would not do: Linux carries it over from the parent through fork/exec)
    print(json.dumps({"rss_before": before, "peak": proc_status("VmHWM"), "rss_after": proc_status("VmRSS")}))
    del result


def warm(file: Path) -> None:
    with open(file, "rb", buffering=0) as f:
        while f.read(64 * 2**20):
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dir", default=None, help="scratch directory (default: the system temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "book" / "data" / "06_load_bench.json")
    ap.add_argument("--ckpt", type=Path, default=None,
                    help="use (or create and keep) this full-size checkpoint instead of a temporary one")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "CKPT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], Path(args.child[1]))

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ckpt = args.ckpt or Path(tmp) / "full"
        if not ckpt.exists():
            t0 = time.perf_counter()
            write_synthetic_checkpoint(ckpt, full_size=True, extra_tensors={EMBED[0]: EMBED[1:]}, progress=True)
            print(f"written in {time.perf_counter() - t0:.0f} s", flush=True)
        file, ranges, _ = byte_ranges(ckpt)
        tensor_bytes = sum(n for _, n in ranges)
        print(f"shard {file.stat().st_size / 2**30:.2f} GiB, block tensors {tensor_bytes / 2**20:.1f} MiB", flush=True)

        warm(file)
        for fn in METHODS.values():                    # warm-up: imports, allocator, page cache
            fn(ckpt)
        times = {name: [] for name in METHODS}
        names = list(METHODS)
        for rep in range(args.reps):                   # interleaved, the order rotated every repetition,
            k = rep % len(names)                       # so drift and order hit all methods alike
            for name in names[k:] + names[:k]:
                fn = METHODS[name]
                gc.collect()
                t0 = time.perf_counter()
                result = fn(ckpt)
                times[name].append(time.perf_counter() - t0)
                del result
            print(f"rep {rep + 1}: " + ", ".join(f"{n} {t[-1] * 1e3:.0f} ms" for n, t in times.items()), flush=True)

        memory = {}
        for name in METHODS:
            warm(file)
            out = subprocess.run([sys.executable, __file__, "--child", name, str(ckpt)],
                                 check=True, capture_output=True, text=True).stdout
            memory[name] = json.loads(out.strip().splitlines()[-1])
            print(f"{name}: peak rise {(memory[name]['peak'] - memory[name]['rss_before']) / 2**20:.0f} MiB", flush=True)
        shard_bytes = file.stat().st_size

    raw_median = statistics.median(times["raw"])
    results: dict[str, LoadBenchMethod] = {}
    for name in METHODS:
        med = statistics.median(times[name])
        rise = memory[name]["peak"] - memory[name]["rss_before"]
        best = min(times[name])
        results[name] = {"times_s": [round(t, 4) for t in times[name]], "median_s": round(med, 4),
                         "time_vs_raw": round(med / raw_median, 3), "min_s": round(best, 4),
                         "min_vs_raw_min": round(best / min(times["raw"]), 3),
                         "rss_before_bytes": memory[name]["rss_before"], "peak_bytes": memory[name]["peak"],
                         "peak_rise_bytes": rise, "memory_vs_bytes": round(rise / tensor_bytes, 3)}
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    data: LoadBench = {
        "what": "chapter 6 load benchmark (tools/bench_load.py): layer 0 of a full-size synthetic "
                "checkpoint, one shard with the MLP and a 2.19 GiB embedding-shaped tensor; warm page cache",
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(terse=True), "cpus": os.cpu_count(),
                    "memory_gib": round(mem_kib / 2**20, 1), "python": platform.python_version(),
                    "torch": torch.__version__, "safetensors": safetensors.__version__},
        "reps": args.reps, "page_cache": "warm: the shard is read once before timing; runs interleaved, order rotated",
        "shard_bytes": shard_bytes, "tensor_bytes": tensor_bytes,
        "targets": {"time_vs_raw": 1.3, "memory_vs_bytes": 1.25},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    for name, r in results.items():
        print(f"{name:18s} median {r['median_s'] * 1e3:7.0f} ms  x raw {r['time_vs_raw']:.2f}  "
              f"min {r['min_s'] * 1e3:7.0f} ms  x raw {r['min_vs_raw_min']:.2f}  "
              f"peak rise {r['peak_rise_bytes'] / 2**20:6.0f} MiB  x bytes {r['memory_vs_bytes']:.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
