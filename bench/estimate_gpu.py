"""The torch-free estimator (agent.artifacts.estimate, device="cuda") against what a replica really takes on the
GPU, measured the worker's and the agent's way: runtime.load + LoadedModel.measure() (warm-up forward at the
declared shape; torch's allocator peak and reserved bytes), then NVML's per-process memory for the worker's
pid (agent.gpus.NvmlBackend.process_memory, context included), which is what the agent records as the
replica's total. Each case runs in its own fresh process, so NVML's figure is that replica alone. Needs a GPU
(bench/estimate_accuracy.py is the CPU's counterpart); figures in docs/benchmarks.md.

    .venv/bin/python bench/estimate_gpu.py [--models DIR] [--big decoder-1b] [--device cuda:N]

The checkpoints are built in bfloat16 (the float16 case loads that checkpoint converted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import command_line, print_header, print_table  # noqa: E402

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MiB = 2**20


def one(path: str, task: str, dtype: str, batch: int, seq: int | None, device: str) -> dict:
    import torch

    from agent.artifacts import estimate
    from agent.gpus import NvmlBackend
    from agent.workers import runtime
    from agent.workers.spec import WorkerSpec

    spec = WorkerSpec(1, path, task, device, dtype, batch=batch, seq=seq)
    model = runtime.load(spec)
    m = model.measure()
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    time.sleep(0.3)
    proc = NvmlBackend().process_memory(os.getpid()) if device.startswith("cuda") else None
    est = estimate(path, dtype=dtype, batch=batch, seq=seq, device="cuda" if device.startswith("cuda") else "cpu")
    return {"measure": m, "nvml_process": proc, "estimate": est.as_dict()}


def main() -> int:
    parser = command_line(__doc__)
    parser.add_argument("--models", default="/tmp/models", help="where the seeded models are built (kept)")
    parser.add_argument("--big", default="decoder-1b", help="the big decoder (decoder-270m for a CPU dry run)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--one", nargs=5, metavar=("PATH", "TASK", "DTYPE", "BATCH", "SEQ"))
    args = parser.parse_args()
    if args.one:
        path, task, dtype, batch, seq = args.one
        print("RESULT " + json.dumps(one(path, task, dtype, int(batch), int(seq) or None, args.device)))
        return 0

    import torch
    import transformers

    from bench import sleep_wake  # the same seeded model builders

    print_header(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}"
                 + (f" ({torch.cuda.get_device_name(torch.device(args.device))})" if torch.cuda.is_available() else ""))
    models = Path(args.models)
    cases = [("minilm", "bfloat16", 8, 128), ("decoder-270m", "bfloat16", 1, 0), (args.big, "bfloat16", 1, 0),
             (args.big, "bfloat16", 8, 512), (args.big, "float16", 32, 256)]
    rows = []
    for name, dtype, batch, seq in cases:
        task, build = sleep_wake.MODELS[name]
        path = models / name
        if not (path / "config.json").exists():
            began = time.monotonic()
            build(path, "bfloat16")
            print(f"built {name} in {time.monotonic() - began:.1f} s", flush=True)
        began = time.monotonic()
        out = subprocess.run([sys.executable, __file__, "--device", args.device, "--one", str(path), task, dtype,
                              str(batch), str(seq)], capture_output=True, text=True, timeout=300)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            print(f"{name} {dtype} {batch}x{seq}: FAILED rc={out.returncode}\n{out.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        m, e = r["measure"], r["estimate"]
        print(f"{name} {dtype} {batch}x{seq or 'default'}: {time.monotonic() - began:.1f} s; est total "
              f"{e['total_bytes'] / MiB:.1f} MiB, NVML proc {r['nvml_process'] and r['nvml_process'] / MiB} MiB, "
              f"peak alloc {m['peak_bytes'] / MiB:.1f} MiB, reserved {m.get('reserved_bytes', 0) / MiB:.1f} MiB",
              flush=True)
        rows.append((name, r))

    head = ("model", "dtype", "shape", "w est", "w meas", "kv+act est", "fwd peak-w", "est w+kv+act",
            "peak alloc", "err vs peak", "reserved", "NVML proc", "NVML-reserved", "total est", "err vs NVML")
    table = []
    for name, r in rows:
        m, e, proc = r["measure"], r["estimate"], r["nvml_process"]
        transient = e["kv_cache_bytes"] + e["activation_bytes"]
        no_overhead = e["weights_bytes"] + transient
        peak = m["peak_bytes"]
        reserved = m.get("reserved_bytes")
        table.append([name, e["dtype"], f"{m['batch']}x{m['seq']}", f"{e['weights_bytes'] / MiB:.1f}",
                      f"{m['weights_bytes'] / MiB:.1f}", f"{transient / MiB:.1f}",
                      f"{(peak - m['weights_bytes']) / MiB:.1f}", f"{no_overhead / MiB:.1f}", f"{peak / MiB:.1f}",
                      f"{100 * (no_overhead - peak) / peak:+.1f}%",
                      "-" if reserved is None else f"{reserved / MiB:.1f}",
                      "-" if proc is None else f"{proc / MiB:.1f}",
                      "-" if proc is None or reserved is None else f"{(proc - reserved) / MiB:.1f}",
                      f"{e['total_bytes'] / MiB:.1f}",
                      "-" if proc is None else f"{100 * (e['total_bytes'] - proc) / proc:+.1f}%"])
    print_table("Estimator (device=cuda) vs the GPU: MiB; errors relative to the measurement", table, columns=head)
    print("\nw meas: unique parameter+buffer bytes on the device; peak alloc: torch.cuda.max_memory_allocated over the"
          " warm-up forward (weights included); reserved: torch.cuda.memory_reserved after it; NVML proc: NVML's"
          " per-process memory for the worker's pid (what the agent records as the replica's total); total est ="
          " w + kv + act + the 512 MiB CUDA overhead constant.")
    for name, r in rows:
        notes = [n for n in r["estimate"]["notes"] if "overhead" not in n]
        if notes:
            print(f"notes {name} {r['measure']['batch']}x{r['measure']['seq']}: " + "; ".join(notes))
    return 0 if len(rows) == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
