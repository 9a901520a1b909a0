"""Placement benchmark of the scheduler core (issue 4). Prints three tables; deterministic (seeded).

    .venv/bin/python bench/placement.py [--instances 15] [--skip-speed] [--only 1|1b|2|3]

1. Quality on generated instances of 200 single-GPU models each:
   * uniform: sizes uniform in [10.7, 53.3] GiB (whole MiB) on 80 GiB GPUs: Falkenauer's "u" class of
     bin-packing instances (20..100 for bins of 150), whose optimum is almost always the sum bound;
   * exact-fit: 40 GPUs of 80 GiB, each cut at random into 3-7 models (whole MiB, at least 256 MiB), so the
     optimum fills every GPU exactly;
   * catalog: models drawn from a catalog of public architectures estimated by agent.artifacts.estimate at
     several dtypes and batch sizes, on a fleet that cycles 80, 40, 24 GiB GPUs.
   "opt" GPUs: the known optimum for exact-fit; for the others the sum bound (the fewest GPUs whose memory
   holds all the bytes: the optimum may need more). "+1": one more GPU (80 GiB; the next of the cycle for
   catalog). 15% of the models are latency-critical with a random profile, which latency-sensitive honours.
   Baselines: plain best-fit decreasing (the ModelGrid paper's Algorithm 2, buffer 0, implemented here
   apart from the core), and the LP bound: the optimum of the linear relaxation with models split freely,
   i.e. for models, the most of the smallest fitting models whose sizes sum within the fleet's memory; for
   bytes, the smaller of the fitting models' bytes and the fleet's memory (an upper bound, not a plan).
   memory-optimized runs with an iteration budget (deterministic) and a 0.9 s time budget as a backstop;
   "max ms" is the slowest whole plan() of the instance set, improvement search included.
1b. Exact bytes (issue 12): fleets of 8 or 40 GPUs whose total is arbitrary bytes, each GPU cut at random byte
   offsets into 2, 3, 4 or 2-4 models, shuffled, so placing everything means filling every GPU to the byte;
   memory-optimized against best-fit decreasing (`--only 1b`).
2. Speed: 10,000 replicas (2,2xx deployments, 90% one GPU, 10% gangs of 2/4/8) onto 1,000 hosts x 8 GPUs
   of 80 GiB: a full plan per strategy, then the re-plan after one host disappears (its replicas move, the
   rest stay). Median wall time of 5 runs.
3. The ModelGrid paper's own evaluation: its model mix estimated at its serving settings (fp32, batch 1 and
   batch 32, the ends of the range it lists; 224x224 images, 512-token BERTs, 1024-token GPT-2s;
   MobileNetV3-Large by proxy, see MIX), deployed
   round-robin in the paper's order onto its five GPU configurations until the first refusal; models placed
   and memory utilisation (reserved bytes / all GPU memory of the configuration). The optimum is bounded by
   the sum bound (the longest prefix whose bytes fit the configuration); "=" marks it reached, so proved.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.artifacts import estimate  # noqa: E402
from bench.harness import command_line, print_header, print_table, timings  # noqa: E402
from console.scheduler import STRATEGIES, Deployment, Gpu, PlanInput, Replica, Settings, plan  # noqa: E402
from console.scheduler.types import PROFILES  # noqa: E402

GiB, MiB = 1024**3, 1024**2
SEARCH = Settings(search_budget_s=0.9, search_iterations=4000)

# --- instances ------------------------------------------------------------------------------------


def fleet(sizes_gib: list[float], per_host: int = 8) -> list[Gpu]:
    return [Gpu(f"h{i // per_host:03d}/{i % per_host}", f"h{i // per_host:03d}", int(s * GiB))
            for i, s in enumerate(sizes_gib)]


def models(sizes: list[int], rng: random.Random) -> list[Deployment]:
    """One deployment per model; 15% latency-critical with a random profile."""
    return [Deployment(f"m{i:03d}", s, latency_critical=rng.random() < 0.15, profile=rng.choice(PROFILES))
            for i, s in enumerate(sizes)]


def uniform(seed: int) -> tuple[list[int], list[float], list[float]]:
    """Falkenauer's "u" class (sizes uniform in 20..100 for bins of 150) scaled to 80 GiB GPUs."""
    rng = random.Random(seed)
    sizes = [rng.randint(80 * 1024 * 20 // 150, 80 * 1024 * 100 // 150) * MiB for _ in range(200)]
    n = math.ceil(sum(sizes) / (80 * GiB))
    return sizes, [80.0] * n, [80.0] * (n + 1)


def exact_fit(seed: int) -> tuple[list[int], list[float], list[float]]:
    rng = random.Random(seed)
    counts = [5] * 40
    for _ in range(200):  # reshuffle the 200 models over the 40 GPUs, 3 to 7 each
        a, b = rng.randrange(40), rng.randrange(40)
        if counts[a] > 3 and counts[b] < 7:
            counts[a] -= 1
            counts[b] += 1
    sizes = []
    for k in counts:
        while True:
            cuts = sorted(rng.sample(range(1, 80 * 1024), k - 1))
            parts = [b - a for a, b in zip([0, *cuts], [*cuts, 80 * 1024], strict=True)]
            if min(parts) >= 256:
                break
        sizes += [p * MiB for p in parts]
    rng.shuffle(sizes)
    return sizes, [80.0] * 40, [80.0] * 41


CYCLE = (80.0, 40.0, 24.0)


def catalog_instance(seed: int, catalog: list[tuple[str, int]]) -> tuple[list[int], list[float], list[float]]:
    rng = random.Random(seed)
    sizes = [rng.choice(catalog)[1] for _ in range(200)]
    gpus: list[float] = []
    while sum(gpus) * GiB < sum(sizes):
        gpus.append(CYCLE[len(gpus) % 3])
    return sizes, gpus, gpus + [CYCLE[len(gpus) % 3]]


def estimated(name: str, config: dict, dtype: str, batch: int, seq: int | None = None) -> tuple[str, int]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        return f"{name} {dtype} b{batch}", estimate(d, dtype=dtype, batch=batch, seq=seq).total_bytes


_VIT_L = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
_BERT_L = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
_LLAMA3 = {"vocab_size": 128256, "max_position_embeddings": 8192, "num_key_value_heads": 8, "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32}
# The paper's mix, in its order. MobileNetV3-Large: the estimator has no mobilenet_v3 formula; a MobileNetV2
# config with depth multiplier 1.3 has 5.39 M parameters (MobileNetV3-Large: 5.48 M) and stands in for it.
MIX: dict[str, dict] = {
    "ViT-B/16": {"model_type": "vit", "architectures": ["ViTForImageClassification"], "num_labels": 1000},
    "ViT-L/16": {"model_type": "vit", "architectures": ["ViTForImageClassification"], **_VIT_L, "num_labels": 1000},
    "ViT-H/14": {"model_type": "vit", "architectures": ["ViTModel"], "hidden_size": 1280, "num_hidden_layers": 32,
                 "num_attention_heads": 16, "intermediate_size": 5120, "patch_size": 14},
    "BERT-base": {"model_type": "bert", "architectures": ["BertModel"]},
    "BERT-large": {"model_type": "bert", "architectures": ["BertModel"], **_BERT_L},
    "DistilBERT": {"model_type": "distilbert", "architectures": ["DistilBertModel"]},
    "GPT-2 small": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12,
                    "n_head": 12},
    "GPT-2 medium": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1024, "n_layer": 24,
                     "n_head": 16},
    "GPT-2 large": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280, "n_layer": 36,
                    "n_head": 20},
    "ResNet-18": {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "layer_type": "basic",
                  "depths": [2, 2, 2, 2], "hidden_sizes": [64, 128, 256, 512], "num_labels": 1000},
    "ResNet-50": {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "num_labels": 1000},
    "ResNet-101": {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "depths": [3, 4, 23, 3],
                   "num_labels": 1000},
    "ResNet-152": {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "depths": [3, 8, 36, 3],
                   "num_labels": 1000},
    "MobileNetV2": {"model_type": "mobilenet_v2", "architectures": ["MobileNetV2ForImageClassification"],
                    "num_labels": 1001},
    "MobileNetV3 (proxy)": {"model_type": "mobilenet_v2", "architectures": ["MobileNetV2ForImageClassification"],
                            "num_labels": 1000, "depth_multiplier": 1.3},
}
LLMS: dict[str, dict] = {
    "Llama-3-8B": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_LLAMA3},
    "Mistral-7B": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 32000,
                   "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768},
    "Qwen2-7B": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064,
                 "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                 "num_key_value_heads": 4, "max_position_embeddings": 131072, "tie_word_embeddings": False},
    "Pythia-410M": {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 50304,
                    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                    "num_attention_heads": 16, "rotary_pct": 0.25},
}
# Serving settings of the paper's evaluation: fp32 (PyTorch 2.0 defaults), the smallest and largest batch it lists.
PAPER_BATCHES = (1, 32)


def paper_mix(batch: int) -> list[tuple[str, int]]:
    return [(name, estimate_dir(cfg, "float32", batch)) for name, cfg in MIX.items()]


def estimate_dir(cfg: dict, dtype: str, batch: int) -> int:
    return estimated("", cfg, dtype, batch)[1]


def catalog() -> list[tuple[str, int]]:
    """Public architectures at a few serving settings: 0.5 to 35 GiB."""
    found = []
    for name, cfg in MIX.items():
        for batch in (1, 32):
            found.append(estimated(name, cfg, "float32", batch))
        found.append(estimated(name, cfg, "float16", 8))
    for name, cfg in LLMS.items():
        for batch in (1, 4, 16):
            found.append(estimated(name, cfg, "float16", batch))
    return found


# --- baselines ------------------------------------------------------------------------------------


def best_fit_decreasing(sizes: list[int], capacities: list[int]) -> tuple[int, int]:
    """The paper's Algorithm 2 (buffer 0), with its reservations kept: (models placed, bytes placed)."""
    free, placed, placed_bytes = list(capacities), 0, 0
    for s in sorted(sizes, reverse=True):
        fits = [j for j, f in enumerate(free) if f >= s]
        if fits:
            j = min(fits, key=lambda j: free[j])
            free[j] -= s
            placed, placed_bytes = placed + 1, placed_bytes + s
    return placed, placed_bytes


def lp_bound(sizes: list[int], capacities: list[int]) -> tuple[int, int]:
    """(models, bytes) upper bounds of the linear relaxation (models split freely over GPUs)."""
    room = sum(capacities)
    fitting = sorted(s for s in sizes if s <= max(capacities, default=0))
    n, left = 0, room
    for s in fitting:
        if s > left:
            break
        left -= s
        n += 1
    return n, min(sum(fitting), room)


def run_strategy(strategy: str, deployments: list[Deployment], gpus: list[Gpu]) -> tuple[int, int, float, str]:
    """(models placed, bytes placed, ms, how the search stopped) of one plan."""
    started = time.perf_counter()
    result = plan(PlanInput(tuple(gpus), tuple(deployments), strategy=strategy, settings=SEARCH))
    ms = 1000 * (time.perf_counter() - started)
    ready = [r for r in result.replicas if r.state == "ready"]
    stopped = result.search.stopped_by if result.search else ""
    return len(ready), sum(r.reserved_bytes for r in ready), ms, stopped


# --- 1. quality -----------------------------------------------------------------------------------

METHODS = (*STRATEGIES, "best-fit decreasing", "LP bound")


def table_quality(instances: int, cat: list[tuple[str, int]]) -> None:
    families = (("uniform", uniform), ("exact-fit", exact_fit),
                ("catalog", lambda seed: catalog_instance(seed, cat)))
    budget_stops, rows = 0, []
    for family, make in families:
        for which in ("opt", "+1"):
            models_pct: dict[str, list[float]] = {m: [] for m in METHODS}
            bytes_pct: dict[str, list[float]] = {m: [] for m in METHODS}
            slowest = dict.fromkeys(METHODS, 0.0)
            counts = []
            for seed in range(instances):
                sizes, opt, spare = make(seed)
                sizes_gib = opt if which == "opt" else spare
                gpus = fleet(sizes_gib)
                counts.append(len(gpus))
                deployments = models(sizes, random.Random(seed))
                caps = [g.total_bytes for g in gpus]
                n, total = len(sizes), sum(sizes)
                for strategy in STRATEGIES:
                    placed, placed_bytes, ms, stopped = run_strategy(strategy, deployments, gpus)
                    budget_stops += stopped == "time budget"
                    models_pct[strategy].append(100 * placed / n)
                    bytes_pct[strategy].append(100 * placed_bytes / total)
                    slowest[strategy] = max(slowest[strategy], ms)
                started = time.perf_counter()
                bfd_models, bfd_bytes = best_fit_decreasing(sizes, caps)
                models_pct["best-fit decreasing"].append(100 * bfd_models / n)
                bytes_pct["best-fit decreasing"].append(100 * bfd_bytes / total)
                slowest["best-fit decreasing"] = max(slowest["best-fit decreasing"],
                                                     1000 * (time.perf_counter() - started))
                lp_models, lp_bytes = lp_bound(sizes, caps)
                models_pct["LP bound"].append(100 * lp_models / n)
                bytes_pct["LP bound"].append(100 * lp_bytes / total)
            gpus_text = f"{which} ({min(counts)}-{max(counts)})" if min(counts) != max(counts) else \
                f"{which} ({counts[0]})"
            for method in METHODS:
                m, b = models_pct[method], bytes_pct[method]
                full = sum(1 for x in m if x >= 100 - 1e-9)
                ms = "-" if method == "LP bound" else f"{slowest[method]:.0f}"
                rows.append({"instances": family, "GPUs": gpus_text, "method": method,
                             "models placed (median)": f"{statistics.median(m):.1f}%", "worst": f"{min(m):.1f}%",
                             "bytes placed (median)": f"{statistics.median(b):.1f}%", "all placed": f"{full}/{len(m)}",
                             "max ms": ms})
    print_table(f"1. Quality: {instances} instances of 200 models per family", rows,
                notes=(f"memory-optimized's search hit its 0.9 s time budget (not its iteration budget) in "
                       f"{budget_stops} plans: the other plans are reproducible to the replica on any machine.",))


# --- 1b. exact bytes ------------------------------------------------------------------------------

EXACT_SHAPES = ((8, 2, 2), (8, 3, 3), (8, 4, 4), (8, 2, 4), (40, 4, 4), (40, 2, 4))  # GPUs, models per GPU


def exact_bytes(seed: int, gpus: int, fewest: int, most: int) -> tuple[list[int], int]:
    """(model sizes, GPU total) of an instance whose optimum fills every GPU to the byte: one GPU total in
    arbitrary bytes (a little under 80 GiB), each GPU cut at random byte offsets into `fewest`..`most` models
    of at least 1 GiB, the models shuffled over the fleet. Sizes and total share no useful common divisor."""
    rng = random.Random(seed)
    total = 80 * GiB - rng.randrange(1, 64 * MiB)
    sizes = []
    for _ in range(gpus):
        k = rng.randint(fewest, most)
        while True:
            cuts = sorted(rng.sample(range(1, total), k - 1))
            parts = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
            if min(parts) >= GiB:
                break
        sizes += parts
    rng.shuffle(sizes)
    return sizes, total


def table_exact_bytes(instances: int) -> None:
    rows = []
    for count, fewest, most in EXACT_SHAPES:
        placed: dict[str, list[float]] = {"memory-optimized": [], "best-fit decreasing": []}
        slowest = dict.fromkeys(placed, 0.0)
        models_per_instance = []
        for seed in range(instances):
            sizes, total = exact_bytes(seed, count, fewest, most)
            models_per_instance.append(len(sizes))
            gpus = fleet([total / GiB] * count)
            gpus = [replace(g, total_bytes=total) for g in gpus]  # to the byte
            n, _, ms, _ = run_strategy("memory-optimized", models(sizes, random.Random(seed)), gpus)
            placed["memory-optimized"].append(100 * n / len(sizes))
            slowest["memory-optimized"] = max(slowest["memory-optimized"], ms)
            started = time.perf_counter()
            bfd, _ = best_fit_decreasing(sizes, [total] * count)
            slowest["best-fit decreasing"] = max(slowest["best-fit decreasing"], 1000 * (time.perf_counter() - started))
            placed["best-fit decreasing"].append(100 * bfd / len(sizes))
        shape = f"{fewest}" if fewest == most else f"{fewest}-{most}"
        lo, hi = min(models_per_instance), max(models_per_instance)
        models_text = f"{lo}" if lo == hi else f"{lo}-{hi}"
        for method, pct in placed.items():
            full = sum(1 for x in pct if x >= 100 - 1e-9)
            rows.append({"GPUs": count, "models per GPU": shape, "models": models_text, "method": method,
                         "models placed (median)": f"{statistics.median(pct):.1f}%", "worst": f"{min(pct):.1f}%",
                         "all placed": f"{full}/{len(pct)}", "max ms": f"{slowest[method]:.0f}"})
    print_table(f"1b. Exact bytes: {instances} instances per row whose optimum fills every GPU to the byte", rows)


# --- 2. speed -------------------------------------------------------------------------------------


def speed_instance() -> tuple[list[Gpu], list[Deployment]]:
    rng = random.Random(2024)
    gpus = fleet([80.0] * 8000)
    deployments, replicas = [], 0
    while replicas < 10_000:
        width = rng.choices((1, 2, 4, 8), (90, 6, 3, 1))[0]
        count = min(rng.randint(1, 8), 10_000 - replicas)
        per_gpu = rng.uniform(1, 40) if width == 1 else rng.uniform(20, 70)
        deployments.append(Deployment(f"d{len(deployments):04d}", int(per_gpu * GiB) * width, replicas=count,
                                      gpus_per_replica=width, priority=rng.choice(("critical", "high", "standard",
                                                                                   "batch"))))
        replicas += count
    return gpus, deployments


def timed(request: PlanInput, runs: int = 5):
    """Median ms of `runs` plans, and the last plan."""
    plans = []
    took = timings(lambda: plans.append(plan(request)), runs)
    return 1000 * statistics.median(took), plans[-1]


def table_speed() -> None:
    gpus, deployments = speed_instance()
    n = sum(d.replicas for d in deployments)
    rows = []
    for strategy in STRATEGIES:
        request = PlanInput(tuple(gpus), tuple(deployments), strategy=strategy)
        full_ms, first = timed(request)
        current = tuple(Replica(r.deployment, r.index, r.gpus, r.reserved_bytes) for r in first.replicas
                        if r.state == "ready")
        again = replace(request, gpus=tuple(g for g in gpus if g.host != "h500"), replicas=current)
        replan_ms, second = timed(again)
        ready = sum(1 for r in first.replicas if r.state == "ready")
        rows.append((strategy, f"{full_ms:.0f}", f"{ready:,}", len(first.unplaced), f"{replan_ms:.0f}",
                     len(second.moves), len(second.unplaced)))
    print_table(f"2. Speed: {n:,} replicas of {len(deployments):,} deployments onto 1,000 hosts x 8 GPUs "
                "(median of 5 runs)", rows,
                columns=("strategy", "full plan ms", "ready", "unplaced", "re-plan without host h500 ms", "moves",
                         "unplaced"))


# --- 3. the paper's evaluation ---------------------------------------------------------------------

CONFIGS = (("4x A100-80GB", 4, 80), ("4x A100-40GB", 4, 40), ("2x V100-32GB", 2, 32), ("2x V100-16GB", 2, 16),
           ("2x RTX 3090 24GB", 2, 24))
LATENCY_CRITICAL = {"BERT-base": "compute", "MobileNetV2": "io"}  # the online models of the mix
PROFILE = {"GPT-2": "memory", "Mobile": "io"}
PAPER_CLAIMS = {"4x A100-80GB": "conv. 12, memory-opt. 45, fill 39, balance 37, latency 32"}
PAPER_GPUS_FOR_100 = {80: "9 / 3", 40: "15 / 4", 32: "20 / 6", 16: "34 / 10", 24: "25 / 8"}


def mix_sequence(mix: list[tuple[str, int]], rounds: int, largest: int) -> list[Deployment]:
    """The mix round-robin in the paper's order, without models that fit no GPU of the configuration."""
    found = []
    for r in range(rounds):
        for name, size in mix:
            if size > largest:
                continue
            profile = next((p for k, p in PROFILE.items() if name.startswith(k)), "compute")
            found.append(Deployment(f"{name} #{r}", size, latency_critical=name in LATENCY_CRITICAL,
                                    profile=LATENCY_CRITICAL.get(name, profile)))
    return found


def placed_prefix(strategy: str, sequence: list[Deployment], gpus: list[Gpu]) -> tuple[int, int]:
    """Deploy the sequence one more model at a time (a full plan each time) until the first refusal."""
    n, used = 0, 0
    while n < len(sequence):
        result = plan(PlanInput(tuple(gpus), tuple(sequence[: n + 1]), strategy=strategy, settings=SEARCH))
        if result.unplaced:
            break
        n += 1
        used = sum(r.reserved_bytes for r in result.replicas)
    return n, used


def table_paper(mix: list[tuple[str, int]], batch: int) -> None:
    print(f"\n## 3. ModelGrid's evaluation, reproduced (fp32, batch {batch})\n")
    print("Estimated bytes per replica: " + ", ".join(f"{name} {size / GiB:.2f} GiB" for name, size in mix))
    print(f"Latency-critical for latency-sensitive: {', '.join(LATENCY_CRITICAL)}.\n")
    rows = []
    for label, count, size in CONFIGS:
        gpus = fleet([float(size)] * count)
        capacity = count * size * GiB
        sequence = mix_sequence(mix, 60, size * GiB)
        skipped = sorted({name for name, s in mix if s > size * GiB})
        cells = []
        one = sequence[:count]
        cells.append(f"{len(one)} ({100 * sum(d.bytes for d in one) / capacity:.0f}%)")
        best = 0
        for strategy in STRATEGIES:
            n, used = placed_prefix(strategy, sequence, gpus)
            best = max(best, n)
            cells.append(f"{n} ({100 * used / capacity:.0f}%)")
        bound, total = 0, 0
        for d in sequence:
            if total + d.bytes > capacity:
                break
            total += d.bytes
            bound += 1
        mark = "=" if best == bound else "<="
        claim = PAPER_CLAIMS.get(label, "3.3-3.8x conv.")
        rows.append((label, ", ".join(skipped) or "-", *cells, f"{mark} {bound} ({100 * total / capacity:.0f}%)",
                     f"{claim}; util. 41-44% conv., 87-91% ModelGrid"))
    print_table(None, rows, columns=("configuration", "skipped (fit no GPU)", "one model per GPU", *STRATEGIES,
                                     "optimum (sum bound)", "paper's claim"))
    print(f"\nGPUs needed for 100 models of the mix (round-robin, batch {batch}), one model per GPU vs "
          "memory-optimized:\n")
    rows = []
    for label, _, size in CONFIGS:
        sequence = mix_sequence(mix, 60, size * GiB)[:100]
        bound = math.ceil(sum(d.bytes for d in sequence) / (size * GiB))
        n = bound
        while True:
            result = plan(PlanInput(tuple(fleet([float(size)] * n)), tuple(sequence), settings=SEARCH))
            if not result.unplaced:
                break
            n += 1
        rows.append({"GPU": label.split(" ", 1)[1], "one model per GPU": 100, "memory-optimized": n,
                     "sum bound": bound, "paper's claim (conv. / ModelGrid)": PAPER_GPUS_FOR_100[size]})
    print_table(None, rows)


def main() -> None:
    parser = command_line(__doc__)
    parser.add_argument("--instances", type=int, default=15, help="instances per family in table 1")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--only", choices=("1", "1b", "2", "3"), help="print one table")
    args = parser.parse_args()
    print("# Placement benchmark")
    print_header()
    if args.only in (None, "1"):
        table_quality(args.instances, catalog())
    if args.only in (None, "1b"):
        table_exact_bytes(args.instances)
    if args.only in (None, "2") and not args.skip_speed:
        table_speed()
    if args.only in (None, "3"):
        for batch in PAPER_BATCHES:
            table_paper(paper_mix(batch), batch)


if __name__ == "__main__":
    main()
