"""One row per shape and target, from GuideLLM's JSON report or from the driver's own request records, and the
tables and ratios made of them. Pure: no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bench.harness import percentile

NAN = float("nan")


@dataclass(frozen=True)
class Result:
    shape: str
    target: str
    ttft_p50_ms: float = NAN
    ttft_p90_ms: float = NAN
    itl_p50_ms: float = NAN
    output_tokens_per_s: float = NAN
    requests_per_s: float = NAN
    tokens_per_request: float = NAN
    requests: int = 0
    errors: int = 0
    tool: str = ""
    note: str = ""

    def row(self) -> dict:
        """The printed table's row."""
        return {"shape": self.shape, "target": self.target, "TTFT p50 ms": self.ttft_p50_ms,
                "TTFT p90 ms": self.ttft_p90_ms, "ITL p50 ms": self.itl_p50_ms,
                "output tok/s": self.output_tokens_per_s, "req/s": self.requests_per_s,
                "out tok/req": self.tokens_per_request, "requests": self.requests, "errors": self.errors,
                "by": self.tool}

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Record:
    """One request as the driver saw it: seconds to its first token and to its end, completion tokens, and the
    error that ended it, if one did."""

    ttft_s: float
    total_s: float
    tokens: int
    error: str = ""


def from_guidellm(report: dict, shape: str, target: str) -> Result:
    """The row for GuideLLM's JSON report (`--output kind=json`) of one benchmark: its own p50/p90 of TTFT, p50 of
    inter-token latency, its mean output tokens and requests per second, and mean output tokens per request, of
    successful requests."""
    benchmarks = report.get("benchmarks") or []
    if len(benchmarks) != 1:
        raise ValueError(f"expected one benchmark in GuideLLM's report, found {len(benchmarks)}")
    metrics = benchmarks[0]["metrics"]
    totals = metrics["request_totals"]

    def stat(name: str, key: str) -> float:
        ok = metrics[name]["successful"]
        if not ok.get("count"):
            return NAN
        return float(ok["percentiles"][key] if key.startswith("p") else ok[key])

    return Result(shape, target, ttft_p50_ms=stat("time_to_first_token_ms", "p50"),
                  ttft_p90_ms=stat("time_to_first_token_ms", "p90"),
                  itl_p50_ms=stat("inter_token_latency_ms", "p50"),
                  output_tokens_per_s=stat("output_tokens_per_second", "mean"),
                  requests_per_s=stat("requests_per_second", "mean"),
                  tokens_per_request=stat("output_token_count", "mean"),
                  requests=int(totals["successful"]), errors=int(totals["errored"]), tool="GuideLLM")


def from_records(records: list[Record], wall_s: float, shape: str, target: str, note: str = "") -> Result:
    """The row for the driver's requests over `wall_s` seconds. ITL is each request's mean gap between tokens,
    counted once per gap (as GuideLLM counts it), so long requests weigh as much as their tokens."""
    ok = [r for r in records if not r.error]
    gaps = [(r.total_s - r.ttft_s) / (r.tokens - 1) for r in ok if r.tokens > 1 for _ in range(r.tokens - 1)]
    return Result(shape, target, ttft_p50_ms=1000 * percentile([r.ttft_s for r in ok], 0.5),
                  ttft_p90_ms=1000 * percentile([r.ttft_s for r in ok], 0.9),
                  itl_p50_ms=1000 * percentile(gaps, 0.5),
                  output_tokens_per_s=sum(r.tokens for r in ok) / wall_s if wall_s > 0 else NAN,
                  requests_per_s=len(ok) / wall_s if wall_s > 0 else NAN,
                  tokens_per_request=sum(r.tokens for r in ok) / len(ok) if ok else NAN,
                  requests=len(ok), errors=len(records) - len(ok), tool="driver", note=note)


def ratios(results: list[Result], ours: str, theirs: str) -> list[dict]:
    """ModelGrid over vLLM reached directly, shape by shape, where both ran: throughput (above 1 is faster) and
    TTFT p50 (above 1 is slower)."""
    by = {(r.shape, r.target): r for r in results}
    rows = []
    for shape in dict.fromkeys(r.shape for r in results):
        mine, direct = by.get((shape, ours)), by.get((shape, theirs))
        if mine is None or direct is None:
            continue
        rows.append({"shape": shape, "output tok/s ratio": _over(mine.output_tokens_per_s, direct.output_tokens_per_s),
                     "TTFT p50 ratio": _over(mine.ttft_p50_ms, direct.ttft_p50_ms),
                     "ITL p50 ratio": _over(mine.itl_p50_ms, direct.itl_p50_ms)})
    return rows


def _over(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else NAN
