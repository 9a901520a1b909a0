"""Generation engine benchmarks (issue 10): continuous batching as a client of a real `manage.py up` sees it.

Completions are streamed with the official `openai` client through the console's gateway to a real agent and
its worker processes (loopback only).

    .venv/bin/python bench/generation.py                    # every section: 2.5-4.5 min on 2 cores (busy: longer)
    .venv/bin/python bench/generation.py --quick            # a smoke run (about 1 min): fewer streams and tokens
    .venv/bin/python bench/generation.py --device cuda --big-layers   # on a GPU host: a ~1.1B decoder

Two models, one replica (one worker) each: the demo tiny-llama (2 layers) and a decoder built from a Llama config
with seed-0 random weights (~271M parameters; ~1.1B with --big-layers), with a word-level tokenizer of its exact
vocabulary. Sections:
  concurrency  one stream alone (tokens/s, TTFT), then --streams streams at once of --new-tokens each (aggregate
               tokens/s, TTFT and inter-token latency percentiles); the issue's targets checked
  correctness  --correct-prompts prompts streamed at once, base model and two LoRA adapters mixed, each text
               against the same request non-streamed and alone (greedy); tiny-llama also against transformers'
               own generate (PEFT for the adapters)
  health       the agent's /v2/health/live latency, idle and while a [64, 256] v2 infer on tiny-llama runs
  engine       in this process, no server: the worker's loader and batcher on the same files and thread count,
               each step split into the model's forward and the rest (the engine's Python)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench import generation_cpu  # noqa: E402
from bench import generation_streams as streams  # noqa: E402
from bench.generation_health import HEALTH_SHAPE, health  # noqa: E402
from bench.generation_stack import DECODER, TINY, Model, endpoint, replica_pid, serve, up_args  # noqa: E402
from bench.harness import command_line, gateway_secret, percentile, print_header, print_table, running_stack, say  # noqa: E402
from tests.e2e.stack import Stack  # noqa: E402

ADAPTERS = ("lora-a", "lora-b")  # on each model: "<model>-lora-a", "<model>-lora-b"
TARGET_RATIO = {TINY: 6.0, DECODER: 3.0}  # aggregate tokens/s at load over one stream's (the issue's)
TARGET_TTFT_RATIO = 3.0  # TTFT p50 under load over idle TTFT
JOIN_PROBES = 8  # requests sent, one after another, into a running batch
JOIN_LOAD_TOKENS = 200  # tokens per stream of tiny-llama's running batch while the probes join it
SEEDED_TEMPERATURE = 0.8


def prompts(count: int) -> list[str]:
    """`count` distinct English prompts of 4 to 14 words, from the demo corpus (both tokenizers know its words)."""
    from agent.workers.demo_tokenizer import CORPUS

    lines = [line.split() for line in CORPUS.splitlines() if len(line.split()) >= 14]
    return [" ".join(lines[i % len(lines)][: 4 + (i // len(lines) * 3 + i) % 11]) for i in range(count)]


# -- section 1: concurrency ----------------------------------------------------------------------------------


async def concurrency(api: streams.Api, models: list[Model], args, stack: Stack) -> tuple[list[dict], list[dict]]:
    """The concurrency table's rows (alone, at once per model), and the CPU and TTFT split of each run."""
    rows, usage = [], []
    texts = prompts(max(args.streams, args.solo_runs))
    for model in models:
        say(f"concurrency: {model.name}: warm-up")
        await streams.stream(api, model.name, texts[0], 8)
        await streams.together(api, [(model.name, t) for t in texts[:4]], 8)
        accounted = generation_cpu.roles(stack, replica_pid(stack, model.name))
        say(f"concurrency: {model.name}: {args.solo_runs} streams one at a time, {args.new_tokens} tokens")
        before = accounted.cpu_seconds()
        solo = [await streams.stream(api, model.name, texts[i], args.new_tokens) for i in range(args.solo_runs)]
        after = accounted.cpu_seconds()
        base = {"model": model.name, "params": f"{model.params:,}", "threads": model.threads}
        rows.append(base | {"streams": "1 (alone)"} | streams.solo_row(solo))
        wall = sum(s.end - s.sent for s in solo)
        usage.append({"model": model.name, "streams": "1 (alone)"} | streams.ttft_split(solo)
                     | generation_cpu.usage_row(before, after, wall, sum(s.tokens for s in solo)))
        say(f"concurrency: {model.name}: {args.streams} streams at once, {args.new_tokens} tokens")
        before = accounted.cpu_seconds()
        load = await streams.together(api, [(model.name, t) for t in texts[: args.streams]], args.new_tokens)
        after = accounted.cpu_seconds()
        rows.append(base | {"streams": args.streams} | streams.load_row(load))
        rows[-1]["joining TTFT p50 ms"] = await joining_ttft(api, model.name, texts, args, rows[-1]["TTFT p50 ms"])
        usage.append({"model": model.name, "streams": args.streams} | streams.ttft_split(load)
                     | generation_cpu.usage_row(before, after, rows[-1]["wall s"], rows[-1]["tokens"]))
        if model.name == TINY:  # admission alone: what each request costs before its first token
            say(f"concurrency: {model.name}: {args.streams} streams at once, 1 token each")
            before = accounted.cpu_seconds()
            first = await streams.together(api, [(model.name, t) for t in texts[: args.streams]], 1)
            after = accounted.cpu_seconds()
            wall = max(s.end for s in first) - min(s.sent for s in first)
            usage.append({"model": model.name, "streams": f"{args.streams}, 1 token each"} | streams.ttft_split(first)
                         | generation_cpu.usage_row(before, after, wall, sum(s.tokens for s in first)))
            load += first
        for s in (*solo, *load):
            if s.error:
                say(f"  failed: {s.error}")
    return rows, usage


async def joining_ttft(api: streams.Api, model: str, texts: list[str], args, started_ms: float) -> float:
    """TTFT p50 of requests that join a batch of args.streams running streams: sent one after another once
    the batch is decoding (after its own TTFT p50), kept only when answered before the batch ended."""
    say(f"concurrency: {model}: requests joining {args.streams} running streams")
    jobs = [(model, t) for t in texts[: args.streams]]
    # tiny-llama's batch of 64 tokens is over in well under a second: a longer one leaves room for the probes.
    tokens = JOIN_LOAD_TOKENS if model == TINY else args.new_tokens
    load = asyncio.ensure_future(streams.together(api, jobs, tokens))
    await asyncio.sleep(1.2 * started_ms / 1e3)
    joined = []
    while not load.done() and len(joined) < JOIN_PROBES:
        probe = await streams.stream(api, model, texts[len(joined) % len(texts)], 4)
        if not load.done() and probe.error is None:
            joined.append(probe.ttft * 1e3)
    load.cancel()  # the probes are in: the clients hang up and the worker drops their sequences
    with contextlib.suppress(asyncio.CancelledError):
        await load
    return percentile(joined, 0.5)


def targets(rows: list[dict], streams_n: int) -> list[dict]:
    out = []
    for alone, loaded in zip(rows[::2], rows[1::2], strict=True):
        name = alone["model"]
        ratio = loaded["tokens/s"] / alone["tokens/s"]
        ttft = loaded["TTFT p50 ms"] / alone["TTFT p50 ms"]
        joining = loaded["joining TTFT p50 ms"] / alone["TTFT p50 ms"]
        out.append({"model": name, f"tokens/s {streams_n} / 1": ratio, "target": f">= {TARGET_RATIO[name]:g}",
                    "met": _ok(ratio >= TARGET_RATIO[name]), "TTFT p50 loaded / idle": ttft,
                    "target ": f"<= {TARGET_TTFT_RATIO:g}", "met ": _ok(ttft <= TARGET_TTFT_RATIO),
                    "joining TTFT p50 / idle": joining, "met  ": _ok(joining <= TARGET_TTFT_RATIO)})
    return out


def _ok(flag: bool) -> str:
    return "yes" if flag else "NO"


# -- section 2: correctness ----------------------------------------------------------------------------------


async def correctness(api: streams.Api, models: list[Model], args, references: dict[str, list[str]]) -> list[dict]:
    rows = []
    for model in models:
        names = [model.name, *model.adapters]
        count = args.correct_prompts if model.name == TINY else args.correct_prompts_decoder
        jobs = [(names[i % len(names)], text) for i, text in enumerate(prompts(count))]
        n = args.correct_tokens
        say(f"correctness: {model.name}: {len(jobs)} requests non-streamed one at a time, then streamed at once")
        alone = [await streams.complete(api, m, p, n, seed=0) for m, p in jobs]
        together = await streams.together(api, jobs, n, seed=0)
        seeded_alone = seeded_together = None
        if model.name == TINY:  # each sequence samples from its own seeded generator, whatever shares its batch
            seeds = [100 + i for i in range(len(jobs))]
            seeded_alone = [(await streams.complete(api, m, p, n, SEEDED_TEMPERATURE, seed))[0]
                            for (m, p), seed in zip(jobs, seeds, strict=True)]
            seeded_together = await asyncio.gather(*(streams.stream(api, m, p, n, SEEDED_TEMPERATURE, seed)
                                                     for (m, p), seed in zip(jobs, seeds, strict=True)))
        reference = references.get(model.name)
        for i, ((name, prompt), (text, tokens), streamed) in enumerate(zip(jobs, alone, together, strict=True)):
            row = {"model": model.name, "#": i, "served as": name, "prompt": _short(prompt), "tokens": tokens,
                   "greedy: streamed at once = alone": _same(streamed, text),
                   "greedy: alone = transformers": _ok(text == reference[i]) if reference else "-",
                   "seeded: streamed at once = alone": _same(seeded_together[i], seeded_alone[i])
                   if seeded_alone else "-"}
            rows.append(row)
    return rows


def _same(streamed: streams.Stream, text: str) -> str:
    if streamed.error:
        say(f"  stream failed: {streamed.error}")
        return "failed"
    return _ok(streamed.text == text)


def correctness_jobs(model: Model, args) -> list[tuple[str | None, str]]:
    """(adapter or None, prompt) of each correctness request, for the transformers reference."""
    names = [None, *model.adapters]
    return [(names[i % len(names)], text) for i, text in enumerate(prompts(args.correct_prompts))]


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# -- section 4: the engine alone -----------------------------------------------------------------------------


def engine(models: list[Model], args) -> list[dict]:
    from tokenizers import Tokenizer

    from bench import generation_engine

    rows = []
    for model in models:
        threads = int(model.threads) if model.threads.isdigit() else None
        loaded = generation_engine.load(model.path, "cuda:0" if args.device == "cuda" else "cpu", args.dtype, threads)
        tokenizer = Tokenizer.from_file(str(model.path / "tokenizer.json"))
        ids = [e.ids for e in tokenizer.encode_batch(prompts(args.streams))]
        tokens = args.new_tokens if model.name == TINY else args.engine_tokens
        generation_engine.profile(loaded, ids[:4], 4)  # warm-up
        for group in (ids[:1], ids):
            say(f"engine: {model.name}: {len(group)} sequences x {tokens} tokens in this process")
            rows.append({"model": model.name, "threads": model.threads, "new tokens": tokens}
                        | generation_engine.profile(loaded, group, tokens))
        del loaded
    return rows


# -- running -------------------------------------------------------------------------------------------------


def build(tmp: Path, args) -> list[Model]:
    from agent.workers.demo_models import build_tiny_llama
    from bench.generation_models import DECODER_1B, DECODER_270M, DECODER_QUICK, build_decoder, write_adapters

    say("building tiny-llama and the decoder (seed 0)")
    tiny = Model(TINY, build_tiny_llama(tmp / "models" / TINY), 0)
    import transformers

    tiny.params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(tiny.path).parameters())
    shape = DECODER_1B if args.big_layers else DECODER_QUICK if args.quick else DECODER_270M
    decoder = Model(DECODER, tmp / "models" / DECODER, 0)
    decoder.params = build_decoder(decoder.path, shape)
    for model in (tiny, decoder):
        paths = write_adapters(tmp / "adapters" / model.name, model.path, [f"{model.name}-{a}" for a in ADAPTERS])
        model.adapters = paths
    return [tiny, decoder]


SERVED = ("concurrency", "correctness", "health")  # the sections that need the running stack
SECTIONS = (*SERVED, "engine")


def main() -> None:
    parser = command_line(__doc__, quick="a smoke run: fewer streams, tokens and prompts, and a 4-layer decoder "
                          "(~117M parameters) unless --big-layers")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: simulated GPUs, CPU workers; cuda: the host's GPUs through NVML")
    parser.add_argument("--big-layers", action="store_true", help="a ~1.1B decoder (hidden 2048, 22 layers) "
                        "instead of ~270M: for GPU hosts")
    parser.add_argument("--dtype", default="float32", help="the deployments' dtype (default float32)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of: {', '.join(SECTIONS)}")
    parser.add_argument("--via", choices=("gateway", "agent"), default="gateway",
                        help="stream through the console's gateway (default) or straight to the agent's port")
    parser.add_argument("--streams", type=int, help="concurrent streams (default 32; quick 8)")
    parser.add_argument("--new-tokens", type=int, help="tokens per stream (default 64; quick 16)")
    parser.add_argument("--solo-runs", type=int, help="streams run alone, one after another (default 3; quick 1)")
    parser.add_argument("--correct-prompts", type=int, help="tiny-llama correctness prompts (default 16; quick 6)")
    parser.add_argument("--correct-prompts-decoder", type=int, help="decoder correctness prompts (default 8; quick 3)")
    parser.add_argument("--correct-tokens", type=int, help="tokens per correctness request (default 24; quick 8)")
    parser.add_argument("--health-runs", type=int, help="[64, 256] v2 requests, one after another (default 2; quick 1)")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="health probes before the big request")
    parser.add_argument("--probe-interval", type=float, default=0.01, help="seconds between health probes")
    parser.add_argument("--engine-tokens", type=int, help="decoder tokens per sequence in the engine section "
                        "(default 16; quick 4)")
    args = parser.parse_args()
    chosen = args.sections.split(",")
    if unknown := [s for s in chosen if s not in SECTIONS]:
        parser.error(f"unknown section {unknown[0]!r}; known: {', '.join(SECTIONS)}")
    q = args.quick
    args.streams = args.streams or (8 if q else 32)
    args.new_tokens = args.new_tokens or (16 if q else 64)
    args.solo_runs = args.solo_runs or (1 if q else 3)
    args.correct_prompts = args.correct_prompts or (6 if q else 16)
    args.correct_prompts_decoder = args.correct_prompts_decoder or (3 if q else 8)
    args.correct_tokens = args.correct_tokens or (8 if q else 24)
    args.health_runs = args.health_runs or (1 if q else 2)
    args.engine_tokens = args.engine_tokens or (4 if q else 16)

    import torch

    began = time.monotonic()
    print_header(f"torch {torch.__version__}, device {args.device}, dtype {args.dtype}, "
                 f"1-minute load average {os.getloadavg()[0]:.2f} at the start; all traffic on 127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp_name:
        tmp = Path(tmp_name)
        models = build(tmp, args)
        references = {}
        if "correctness" in chosen:
            say("correctness: transformers' generate on tiny-llama (the reference)")
            from bench import generation_engine

            references[TINY] = generation_engine.transformers_texts(
                models[0].path, models[0].adapters, correctness_jobs(models[0], args), args.correct_tokens,
                "cuda:0" if args.device == "cuda" else "cpu", args.dtype)
        if any(section in chosen for section in SERVED):
            gpus, extra = up_args(args.device)
            with running_stack(tmp / "data", gpus=gpus, args=extra) as stack:
                serve(stack, models, args)
                via = (f"through the console's gateway ({stack.url})" if args.via == "gateway" else
                       "straight to the agent's port with its gateway secret")
                base_url, token = ((stack.url, stack.token) if args.via == "gateway"
                                   else (endpoint(stack, TINY), gateway_secret(stack)))
                print(f"measured path: `manage.py up --gpus {gpus}{' ' + ' '.join(extra) if extra else ''}`, one "
                      f"replica (one worker process) per model, streams sent {via} with the openai client "
                      f"{streams.openai_version()}; worker torch threads: "
                      + ", ".join(f"{m.name} {m.threads}" for m in models)
                      + ("" if extra or args.device == "cuda" else " (`manage.py up` has no --cpu-threads: the "
                         "agent's share, its cores over its simulated GPUs)"))
                sys.stdout.flush()
                run_served(stack, models, args, chosen, base_url, token, references)
        elif args.device == "cpu":
            for model in models:
                model.threads = "1"  # what the agent gives each worker here (2 cores, 2 simulated GPUs)
        if "engine" in chosen:
            clock = Clock("engine")
            rows = engine(models, args)
            print_table("Engine alone: one step's time, the model's forward vs the rest (this process, no server)",
                        rows, notes=("step ms p50 and forward ms p50: medians over the decoding steps (the first "
                                     "step, which prefills every prompt, is apart); other ms p50: the median of each "
                                     "step less its forward, the batcher's Python (cache bookkeeping, padding, "
                                     "sampling). tokens/s: every token over the run's wall time, first step "
                                     "included, without the worker's pipe, the agent, the gateway and the client "
                                     "(the decoder's runs are shorter than the served ones, so its prefill weighs "
                                     "more).",))
            clock.done()
    print(f"\n(ran in {time.monotonic() - began:.0f} s; 1-minute load average {os.getloadavg()[0]:.2f} at the end, "
          f"on {os.cpu_count()} cores)")


def run_served(stack: Stack, models: list[Model], args, chosen: list[str], base_url: str, token: str,
               references: dict[str, list[str]]) -> None:
    def run(section, *extra):
        async def go():
            async with streams.client(base_url, token) as api:
                return await section(api, models, args, *extra)

        return asyncio.run(go())

    if "concurrency" in chosen:
        clock = Clock("concurrency")
        rows, usage = run(concurrency, stack)
        print_table(f"Concurrency: one stream alone vs {args.streams} at once, {args.new_tokens} new tokens each "
                    "(greedy)", rows,
                    notes=("tokens/s: completion tokens over the time from sending to the last chunk (alone: the "
                           f"median of {args.solo_runs} runs; at once: all tokens over the first send to the last "
                           "chunk); TTFT: send to the first chunk; ITL: the gaps between a stream's chunks with text, "
                           "pooled over the streams (a chunk is one token, but for a token that ends inside a "
                           "character, held until the next: compare chunks with tokens).",))
        print_table("Concurrency: against the issue's targets", targets(rows, args.streams))
        print_table("Concurrency: where the time goes (TTFT split; CPU per generated token by process)", usage,
                    notes=("client ms: from the call to the openai client to httpx taking the request (the client's "
                           "own work, and its wait for the one event loop that all streams share); the rest of the "
                           "TTFT is the gateway, the agent, the worker and the client reading the first chunk. "
                           "CPU: user + system time (psutil, 10 ms ticks) of each process over the run, per completion "
                           "token (per request in the 1-token row): client = this process, console = manage.py up "
                           "(the gateway, and the scheduler loop every 0.5 s), agent = the agent daemon, worker = the "
                           "measured replica's worker, other workers = the other replica and the warm spare. cores "
                           f"busy = their sum over the run's wall time (this machine has {os.cpu_count()}; other "
                           "work on it shows as less).",))
        clock.done()
    if "correctness" in chosen:
        clock = Clock("correctness")
        rows = run(correctness, references)
        equal = sum(r["greedy: streamed at once = alone"] == "yes" for r in rows)
        seeded = [r["seeded: streamed at once = alone"] for r in rows if r["seeded: streamed at once = alone"] != "-"]
        print_table(f"Correctness: streamed at once vs alone, {args.correct_tokens} tokens each", rows,
                    notes=(f"{equal} of {len(rows)} greedy streams and {seeded.count('yes')} of {len(seeded)} seeded "
                           "ones equal the same request sent non-streamed with nothing else running (greedy: "
                           f"temperature 0, seed 0; seeded: temperature {SEEDED_TEMPERATURE}, seed 100 + #, "
                           "tiny-llama only). Each model serves its base and two LoRA adapters (rank 8 on q_proj and "
                           "up_proj, seeded) in the same batches. 'transformers' is tiny-llama continued greedily by "
                           "transformers' generate (PEFT for the adapters), one prompt at a time. The decoder's "
                           "word-level tokenizer gives every id its own word, so its texts are equal exactly when "
                           "the tokens are.",))
        clock.done()
    if "health" in chosen:
        clock = Clock("health")
        rows, notes = health(endpoint(stack, TINY), gateway_secret(stack), TINY, args)
        print_table(f"Health: the agent's GET /v2/health/live while a {list(HEALTH_SHAPE)} v2 infer on tiny-llama "
                    "runs", rows,
                    notes=(f"a separate process probes on one keep-alive connection every {args.probe_interval:g} s; "
                           "the v2 request goes straight to the agent with its gateway secret and its answer (the "
                           "logits, [64, 256, 1024] floats as JSON) is read to the end and discarded.", *notes))
        clock.done()


class Clock:
    """A section's time and the machine's load around it: other work on this machine shows in the figures."""

    def __init__(self, name: str) -> None:
        self.name, self.began, self.load = name, time.monotonic(), os.getloadavg()[0]

    def done(self) -> None:
        print(f"\n(section {self.name}: {time.monotonic() - self.began:.0f} s; 1-minute load average {self.load:.2f} "
              f"before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
