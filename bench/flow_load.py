"""bench/flow_control.py's client side: one streamed completion as a Record (status, error code, the gateway's
headers, TTFT), closed-loop and open-loop drivers on aiohttp, how an answer counts (served, shed, the caller's own
limit, error), and the rows of its tables. Torch-free, and no stack: tests/bench/test_flow_load.py runs it against a
fake server."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp

from bench.harness import percentile

BAND_HEADER = "x-modelgrid-criticality"
BANDS = ("critical", "standard", "sheddable")
VOCAB_FILLER = (1500, 4096)  # the word tokenizer's filler words w<id>: one token each (bench/generation_models.py)
NAN = float("nan")


@dataclass
class Record:
    """One request as the client saw it; times in seconds, `sent` since the run's origin."""

    key: str
    band: str
    sent: float
    status: int = 0
    code: str = ""
    message: str = ""
    retry_after: str | None = None
    ttft: float = NAN
    total: float = NAN
    replica: str = ""
    routing: str = ""
    queue_ms: float = NAN
    predicted_ms: float = NAN

    @property
    def kind(self) -> str:
        """served, shed (429 "saturated"), own limit (429 for the token's own requests in flight) or error."""
        if self.status == 200 and not self.code:
            return "served"
        if self.status == 429 and self.code == "saturated":
            return "shed"
        if self.status == 429 and self.code == "rate_limited" and "in flight" in self.message:
            return "own limit"
        return "error"

    @property
    def ended(self) -> float:
        return self.sent + (0.0 if math.isnan(self.total) else self.total)

def prompts(count: int, words: int, seed: int) -> list[str]:
    """`count` prompts of `words` filler words (one token each), seeded."""
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(*VOCAB_FILLER)}" for _ in range(words)) for _ in range(count)]


def _number(value: str | None) -> float:
    try:
        return float(value) if value is not None else NAN
    except ValueError:
        return NAN


def session(token: str) -> aiohttp.ClientSession:
    """A client session with no connection cap (aiohttp's default of 100 would queue a flood in the client)."""
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"},
                                 connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=900))


async def request(http: aiohttp.ClientSession, url: str, key: str, prompt: str, new_tokens: int, origin: float,
                  band: str | None = None, model: str = "chat") -> Record:
    """One streamed completion of exactly `new_tokens` tokens; TTFT is the time to its first token's event."""
    record = Record(key, band or "-", time.perf_counter() - origin)
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}
    began = time.perf_counter()
    try:
        async with http.post(url + "v1/completions", json=body,
                             headers={BAND_HEADER: band} if band else None) as r:
            record.status = r.status
            record.retry_after = r.headers.get("Retry-After")
            record.replica = r.headers.get("x-modelgrid-replica", "")
            record.routing = r.headers.get("x-modelgrid-routing", "")
            record.queue_ms = _number(r.headers.get("x-modelgrid-queue-ms"))
            record.predicted_ms = _number(r.headers.get("x-modelgrid-predicted-ttft-ms"))
            if r.status != 200:
                record.code, record.message = _error(await r.text())
            else:
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:  # the stream broke after its 200
                        record.code, record.message = "stream_error", str(event["error"])
                        break
                    if math.isnan(record.ttft) and event.get("choices"):
                        record.ttft = time.perf_counter() - began
    except (aiohttp.ClientError, TimeoutError) as e:
        record.code, record.message = "transport", repr(e)
    record.total = time.perf_counter() - began
    return record


def _error(text: str) -> tuple[str, str]:
    """(code, message) of an error body, OpenAI's shape or not."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return "", text[:200]
    if isinstance(error, dict):
        return error.get("code") or "", error.get("message") or ""
    return "", str(error)[:200]


async def closed_loop(http: aiohttp.ClientSession, url: str, key: str, texts: list[str], clients: int,
                      new_tokens: int, origin: float, until: Callable[[], bool] | None = None,
                      band: str | None = None) -> list[Record]:
    """`clients` clients, each sending its next request when its last one ended: through `texts` once, or (with
    `until`) round and round them until `until()` says stop."""
    records: list[Record] = []
    turn = iter(range(1 << 62))

    async def client() -> None:
        while True:
            i = next(turn)
            if (until is None and i >= len(texts)) or (until is not None and until()):
                return
            records.append(await request(http, url, key, texts[i % len(texts)], new_tokens, origin, band))

    await asyncio.gather(*(client() for _ in range(clients)))
    return records


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the start) at `rate` per second for `seconds`, seeded."""
    rng, at, times = random.Random(seed), 0.0, []
    while (at := at + rng.expovariate(rate)) < seconds:
        times.append(at)
    return times


async def open_loop(http: aiohttp.ClientSession, url: str, key: str, texts: list[str], times: list[float],
                    new_tokens: int, origin: float, bands: tuple[str, ...] = BANDS) -> list[Record]:
    """A request at each of `times` whether or not earlier ones ended; their bands in turn (a third each)."""
    began = time.perf_counter()
    tasks = []
    for i, at in enumerate(times):
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - began)))
        tasks.append(asyncio.create_task(request(http, url, key, texts[i % len(texts)], new_tokens, origin,
                                                 bands[i % len(bands)])))
    return list(await asyncio.gather(*tasks))


# -- table rows ----------------------------------------------------------------------------------------------


def _kinds(records: Iterable[Record]) -> dict[str, int]:
    counts = {"served": 0, "shed": 0, "own limit": 0, "error": 0}
    for r in records:
        counts[r.kind] += 1
    return counts


def errors_text(records: Iterable[Record]) -> str:
    """The errors' statuses and codes, counted ("503 model_not_ready x2"), or "" for none."""
    found: dict[str, int] = {}
    for r in records:
        if r.kind == "error":
            what = f"{r.status} {r.code or '-'}"
            found[what] = found.get(what, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(found.items()))


def _queued(records: Iterable[Record]) -> list[float]:
    return [r.queue_ms for r in records if not math.isnan(r.queue_ms)]


def fairness_row(run: str, b: list[Record], a: list[Record], window: tuple[float, float] | None) -> dict:
    """A row of the fairness table: key B's TTFT and errors, and key A's flood (if any) over B's window."""
    ttft = [r.ttft for r in b if r.kind == "served"]
    a_served = [r for r in a if r.kind == "served" and window and window[0] <= r.ended <= window[1]]
    a_kinds = _kinds(a)
    span = window[1] - window[0] if window else 0.0
    return {"run": run, "B requests": len(b), "B TTFT p50 s": percentile(ttft, 0.5),
            "B TTFT p90 s": percentile(ttft, 0.9),
            "B queue p50 ms": percentile(_queued(b), 0.5), "B queue p90 ms": percentile(_queued(b), 0.9),
            "B errors": len(b) - len(ttft), "A requests": len(a),
            "A req/s": len(a_served) / span if span > 0 else NAN,
            "A queue p50 ms": percentile(_queued(a_served), 0.5), "A errors": a_kinds["error"] + a_kinds["shed"],
            "A own-limit 429": a_kinds["own limit"]}


def overload_rows(records: list[Record], slo_ms: float) -> list[dict]:
    """A row per band: sent, served, shed (and with Retry-After), other errors, TTFT, share within the SLO, the
    longest wait of a served request (its queue header) and the longest time to a 503 (the client's clock)."""
    rows = []
    for band in sorted({r.band for r in records}, key=lambda b: BANDS.index(b) if b in BANDS else 9):
        mine = [r for r in records if r.band == band]
        kinds = _kinds(mine)
        ttft = [r.ttft for r in mine if r.kind == "served"]
        within = sum(t * 1e3 <= slo_ms for t in ttft)
        rows.append({"band": band, "sent": len(mine), "served": kinds["served"], "shed 429": kinds["shed"],
                     "shed with Retry-After": sum(r.kind == "shed" and r.retry_after is not None for r in mine),
                     "other errors": kinds["error"] + kinds["own limit"],
                     "TTFT p50 s": percentile(ttft, 0.5), "TTFT p90 s": percentile(ttft, 0.9),
                     "served within SLO": f"{100 * within / len(ttft):.1f}%" if ttft else "-",
                     "served wait p90 s": percentile([q / 1e3 for q in _queued(r for r in mine if r.kind == "served")],
                                                     0.9),
                     "longest served wait s": max((r.queue_ms / 1e3 for r in mine if r.kind == "served"
                                                   and not math.isnan(r.queue_ms)), default=NAN),
                     "longest 503 s": max((r.total for r in mine if r.status == 503), default=NAN),
                     "errors": errors_text(mine)})
    return rows


def timeline_rows(records: list[Record]) -> list[dict]:
    """The wake burst, a row per request in the order sent."""
    return [{"t s": r.sent, "request": i + 1, "burst": r.key, "status": r.status, "replica": r.replica or "-",
             "routing": r.routing or "-", "predicted TTFT ms": r.predicted_ms, "actual TTFT ms": r.ttft * 1e3,
             "first token at s": r.sent + r.ttft,
             "queue ms": r.queue_ms} for i, r in enumerate(sorted(records, key=lambda r: r.sent))]
