"""bench/flow_load.py against a fake gateway (aiohttp, loopback): a streamed answer's TTFT and headers, a shed
request's code and Retry-After, how answers count, the drivers' request counts, the tables' rows; and
bench/flow_control.py's --quick command line."""

import asyncio
import json
import time

import pytest
from aiohttp import web

from bench import flow_load
from bench.flow_load import Record


def sse(*events) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.fixture
async def fake():
    """/v1/completions: a sheddable request is shed (429 saturated, Retry-After); prompt "limit" meets the token's
    own in-flight limit; "broken" breaks its stream; anything else streams two tokens after 20 ms, with the
    gateway's headers. It keeps the criticality header of every request."""
    bands = []

    async def completions(request):
        body = await request.json()
        band = request.headers.get(flow_load.BAND_HEADER)
        bands.append(band)
        if band == "sheddable":
            return web.json_response({"error": {"message": "saturated: try later", "code": "saturated"}}, status=429,
                                     headers={"Retry-After": "2"})
        if body["prompt"] == "limit":
            return web.json_response({"error": {"message": "this token already has 64 requests in flight (the "
                                                "limit)", "code": "rate_limited"}}, status=429)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-modelgrid-replica": "chat#1",
                                               "x-modelgrid-routing": "wake: faster than queueing",
                                               "x-modelgrid-queue-ms": "12.5",
                                               "x-modelgrid-predicted-ttft-ms": "40"})
        await response.prepare(request)
        await asyncio.sleep(0.02)
        if body["prompt"] == "broken":
            await response.write(sse({"error": {"message": "worker died"}}))
            return response
        await response.write(sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}))
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/", bands
    await runner.cleanup()


async def test_a_streamed_answer_is_timed_to_its_first_token_with_the_gateways_headers(fake):
    url, bands = fake
    async with flow_load.session("k") as http:
        record = await flow_load.request(http, url, "A", "hello", 2, time.perf_counter(), band="critical")
    assert record.kind == "served" and 0.02 <= record.ttft <= record.total
    assert (record.replica, record.routing, record.queue_ms, record.predicted_ms) == \
        ("chat#1", "wake: faster than queueing", 12.5, 40.0)
    assert bands == ["critical"]


async def test_shed_own_limit_and_a_broken_stream_count_apart(fake):
    url, bands = fake
    async with flow_load.session("k") as http:
        shed, limit, broken = await asyncio.gather(
            flow_load.request(http, url, "A", "x", 2, 0.0, band="sheddable"),
            flow_load.request(http, url, "A", "limit", 2, 0.0),
            flow_load.request(http, url, "A", "broken", 2, 0.0))
    assert (shed.kind, shed.code, shed.retry_after) == ("shed", "saturated", "2")
    assert limit.kind == "own limit"
    assert broken.kind == "error" and "worker died" in broken.message
    assert None in bands  # no band: no header


async def test_the_loops_send_what_they_are_told(fake):
    url, bands = fake
    async with flow_load.session("k") as http:
        closed = await flow_load.closed_loop(http, url, "B", ["p1", "p2", "p3"], 2, 2, time.perf_counter())
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.15, stop.set)
        endless = await flow_load.closed_loop(http, url, "A", ["p"], 3, 2, time.perf_counter(), until=stop.is_set)
        times = flow_load.arrivals(50, 0.3, seed=1)
        opened = await flow_load.open_loop(http, url, "A", ["p"], times, 2, time.perf_counter())
    assert len(closed) == 3 and all(r.kind == "served" for r in closed)
    assert len(endless) >= 3
    assert len(opened) == len(times) > 0
    assert [r.band for r in opened[:3]] == list(flow_load.BANDS)


def _record(band="-", kind="served", **fields) -> Record:
    status, code = {"served": (200, ""), "shed": (429, "saturated"), "error": (503, "model_not_ready")}[kind]
    return Record("A", band, fields.pop("sent", 0.0), status=status, code=code, **fields)


def test_the_overload_rows_count_each_band():
    records = [_record("critical", ttft=0.1, total=0.5, queue_ms=200.0),
               _record("critical", ttft=0.9, total=1.0, queue_ms=800.0),
               _record("sheddable", "shed", retry_after="1", total=0.01),
               _record("sheddable", "shed", total=0.01),
               _record("standard", "error", total=30.2)]
    rows = {r["band"]: r for r in flow_load.overload_rows(records, slo_ms=500)}
    assert list(rows) == ["critical", "standard", "sheddable"]
    assert rows["critical"]["served"] == 2 and rows["critical"]["served within SLO"] == "50.0%"
    assert rows["critical"]["longest served wait s"] == 0.8
    assert (rows["sheddable"]["shed 429"], rows["sheddable"]["shed with Retry-After"]) == (2, 1)
    assert rows["standard"]["other errors"] == 1 and rows["standard"]["longest 503 s"] == 30.2
    assert rows["standard"]["errors"] == "503 model_not_ready x1"


def test_the_fairness_row_counts_a_only_over_bs_window(capsys):
    b = [_record(ttft=t, total=t) for t in (0.1, 0.2, 0.3)]
    a = [_record(sent=s, total=1.0) for s in (0.0, 1.0, 5.0)] + [_record(kind="error", total=1.0)]
    row = flow_load.fairness_row("with flood", b, a, (0.5, 2.5))
    assert (row["B requests"], row["B errors"], row["B TTFT p90 s"]) == (3, 0, 0.3)
    assert row["A req/s"] == 1.0 and row["A errors"] == 1
    from bench.harness import print_table

    print_table("t", [flow_load.fairness_row("alone", b, [], None), row])
    assert "with flood" in capsys.readouterr().out


def test_the_timeline_is_in_the_order_sent():
    rows = flow_load.timeline_rows([_record(sent=0.2, replica="chat#1"), _record(sent=0.1, replica="chat#0")])
    assert [(r["request"], r["replica"]) for r in rows] == [(1, "chat#0"), (2, "chat#1")]


def test_quick_shortens_every_section():
    from bench.flow_control import arguments

    args = arguments(["--quick"])
    assert (args.b_requests, args.seconds, args.burst, args.flood) == (10, 10.0, 12, 16)
    full = arguments(["--fairness"])
    assert (full.fairness, full.flood, full.b_requests, full.seconds) == (True, 48, 40, 60.0)
