"""The client side of bench/generation.py: completions streamed with the official `openai` client, timed per
chunk, and the figures made of them (torch-free)."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from dataclasses import dataclass, field

import httpx
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from bench.harness import percentile

CLIENT_TIMEOUT_S = 600.0
STREAM_HEADER = "X-Bench-Stream"  # names a request, so the send hook can time it


def openai_version() -> str:
    import openai

    return openai.__version__


@dataclass
class Api:
    """An AsyncOpenAI client, and when each of its requests left the client's hands for httpx (by stream id)."""

    openai: AsyncOpenAI
    wire: dict[str, float] = field(default_factory=dict)
    ids: itertools.count = field(default_factory=itertools.count)

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.openai.close()


def client(base_url: str, token: str) -> Api:
    """An AsyncOpenAI client of `base_url` (the console or an agent, without /v1); no retries, so every
    failure shows."""
    wire: dict[str, float] = {}

    async def sent(request: httpx.Request) -> None:
        if STREAM_HEADER.lower() in request.headers:
            wire[request.headers[STREAM_HEADER]] = time.perf_counter()

    http = DefaultAsyncHttpxClient(event_hooks={"request": [sent]}, timeout=CLIENT_TIMEOUT_S)
    openai = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=token, max_retries=0, http_client=http)
    return Api(openai, wire)


@dataclass
class Stream:
    """One streamed completion: when it was sent, when each chunk with text arrived, and what it said."""

    model: str
    prompt: str
    sent: float
    wire: float = math.nan  # when httpx took the request from the openai client
    first: float = math.nan  # the first chunk with a choice in it (text, or the finish of a stream without text)
    last: float = math.nan  # the last one
    chunks: list[float] = field(default_factory=list)  # perf_counter times of chunks that carried text
    text: str = ""
    tokens: int = 0  # completion tokens, from the usage chunk
    finish: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.first - self.sent

    @property
    def end(self) -> float:
        return self.sent if math.isnan(self.last) else self.last

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]


async def stream(api: Api, model: str, prompt: str, max_tokens: int, temperature: float = 0.0,
                 seed: int | None = None) -> Stream:
    """Stream one completion to its end; a failure is kept in `error`, not raised."""
    extra = {} if seed is None else {"seed": seed}
    ident = str(next(api.ids))
    result = Stream(model, prompt, time.perf_counter())
    try:
        response = await api.openai.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                        temperature=temperature, stream=True,
                                                        stream_options={"include_usage": True},
                                                        extra_headers={STREAM_HEADER: ident}, **extra)
        async for chunk in response:
            now = time.perf_counter()
            if chunk.usage is not None:
                result.tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if math.isnan(result.first):
                    result.first = now
                result.last = now
                if choice.text:
                    result.chunks.append(now)
                    result.text += choice.text
                if choice.finish_reason:
                    result.finish = choice.finish_reason
    except Exception as e:  # noqa: BLE001 (reported in the table)
        result.error = f"{type(e).__name__}: {e}"
    result.wire = api.wire.pop(ident, math.nan)
    return result


async def complete(api: Api, model: str, prompt: str, max_tokens: int, temperature: float = 0.0,
                   seed: int | None = None) -> tuple[str, int]:
    """One non-streamed completion: (text, completion tokens)."""
    extra = {} if seed is None else {"seed": seed}
    response = await api.openai.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                   temperature=temperature, **extra)
    return response.choices[0].text, response.usage.completion_tokens


async def together(api: Api, jobs: list[tuple[str, str]], max_tokens: int, temperature: float = 0.0,
                   seed: int | None = None) -> list[Stream]:
    """Every (model, prompt) streamed at once."""
    return list(await asyncio.gather(*(stream(api, m, p, max_tokens, temperature, seed) for m, p in jobs)))


def load_row(streams: list[Stream]) -> dict[str, float | int]:
    """Streams that ran together: tokens, wall time from the first send to the last chunk, aggregate tokens/s,
    TTFT and inter-chunk gaps (p50 and p95, in ms, pooled over the streams)."""
    ok = [s for s in streams if s.error is None]
    wall = max(s.end for s in ok) - min(s.sent for s in ok) if ok else math.nan
    tokens = sum(s.tokens for s in ok)
    ttfts = [s.ttft * 1e3 for s in ok if not math.isnan(s.ttft)]
    gaps = [g * 1e3 for s in ok for g in s.gaps]
    return {"failed": len(streams) - len(ok), "tokens": tokens, "chunks": sum(len(s.chunks) for s in ok),
            "wall s": wall,
            "tokens/s": tokens / wall if ok and wall > 0 else math.nan,
            "TTFT p50 ms": percentile(ttfts, 0.5), "TTFT p95 ms": percentile(ttfts, 0.95),
            "ITL p50 ms": percentile(gaps, 0.5), "ITL p95 ms": percentile(gaps, 0.95)}


def solo_row(runs: list[Stream]) -> dict[str, float | int]:
    """One stream at a time, several runs: the median run's figures (tokens/s, TTFT), gaps pooled."""
    ok = [s for s in runs if s.error is None]
    rates = [s.tokens / (s.end - s.sent) for s in ok if s.end > s.sent]
    gaps = [g * 1e3 for s in ok for g in s.gaps]
    ttfts = [s.ttft * 1e3 for s in ok if not math.isnan(s.ttft)]
    return {"failed": len(runs) - len(ok), "tokens": statistics.median([s.tokens for s in ok]) if ok else 0,
            "chunks": statistics.median([len(s.chunks) for s in ok]) if ok else 0,
            "wall s": statistics.median([s.end - s.sent for s in ok]) if ok else math.nan,
            "tokens/s": statistics.median(rates) if rates else math.nan,
            "TTFT p50 ms": percentile(ttfts, 0.5), "TTFT p95 ms": percentile(ttfts, 0.95),
            "ITL p50 ms": percentile(gaps, 0.5), "ITL p95 ms": percentile(gaps, 0.95)}


def ttft_split(streams: list[Stream]) -> dict[str, float]:
    """TTFT p50 in two parts: the client's own (send to httpx taking the request) and the rest (the server,
    the network stack, and the client reading the first chunk)."""
    ok = [s for s in streams if s.error is None and not math.isnan(s.first)]
    return {"TTFT p50 ms": percentile([s.ttft * 1e3 for s in ok], 0.5),
            "client ms p50": percentile([(s.wire - s.sent) * 1e3 for s in ok], 0.5),
            "then to first chunk ms p50": percentile([(s.first - s.wire) * 1e3 for s in ok], 0.5)}
