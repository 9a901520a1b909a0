"""The shapes GuideLLM 0.8.1 cannot express, driven here: a LoRA split (one request in several goes to each of
several model names, where a target has no route to do the split for it; GuideLLM sends one model name per run)
and a cold start (one request timed from a deployment with no replica). Streamed /v1/completions, the tokens
counted by the server's `usage`."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import aiohttp

from bench.standard.results import Record

COLD_TIMEOUT_S = 900.0  # a vLLM replica's cold start on two shared cores: 60-150 s, more under load


def prompts(tokenizer_dir: Path, tokens: int, count: int, seed: int = 0) -> list[str]:
    """`count` different prompts of about `tokens` tokens each (random words, cut at a token boundary): no two
    share a prefix a cache could reuse."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2] or ["token"]
    words.sort()
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        text = " ".join(rng.choices(words, k=tokens))
        ids = tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
        made.append(tokenizer.decode(ids))
    return made


async def one_request(http: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int) -> Record:
    """One streamed completion of exactly `max_tokens` tokens (ignore_eos), timed to its first text and its end."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    began = time.monotonic()
    first, tokens = None, 0
    try:
        async with http.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                return Record(time.monotonic() - began, time.monotonic() - began, 0, f"{response.status} {text}")
            async for line in response.content:
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    return Record(first or 0.0, time.monotonic() - began, tokens, str(event["error"])[:200])
                if first is None and any(c.get("text") for c in event.get("choices") or ()):
                    first = time.monotonic() - began
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except (TimeoutError, aiohttp.ClientError) as e:
        return Record(time.monotonic() - began, time.monotonic() - began, 0, f"{type(e).__name__}: {e}")
    end = time.monotonic() - began
    return Record(first if first is not None else end, end, tokens)


async def split_load(url: str, key: str, models: list[tuple[str, int]], texts: list[str], max_tokens: int,
                     streams: int, seconds: float, seed: int = 0) -> tuple[list[Record], float]:
    """`streams` clients sending back to back for `seconds`, each request to a model drawn by weight; what was
    in flight at the end is finished and counted. Returns the records and the wall time."""
    rng = random.Random(seed)
    names, weights = [m for m, _ in models], [w for _, w in models]
    records: list[Record] = []
    timeout = aiohttp.ClientTimeout(total=COLD_TIMEOUT_S)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        began = time.monotonic()
        deadline = began + seconds

        async def client(i: int) -> None:
            n = i
            while time.monotonic() < deadline:
                model = rng.choices(names, weights)[0]
                records.append(await one_request(http, url, model, texts[n % len(texts)], max_tokens))
                n += streams

        await asyncio.gather(*(client(i) for i in range(streams)))
        return records, time.monotonic() - began


async def cold_request(url: str, key: str, model: str, prompt: str, max_tokens: int) -> Record:
    """One streamed request to a model that has no replica yet: its TTFT includes the scheduler's placement and
    the replica's load (or a server's whole start)."""
    timeout = aiohttp.ClientTimeout(total=COLD_TIMEOUT_S)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}, timeout=timeout) as http:
        return await one_request(http, url, model, prompt, max_tokens)
