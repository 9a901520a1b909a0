"""Requests and tokens per minute per token and per team, and a team's token quota: past each, 429 with Retry-After
(the seconds until the window or period resets) and a message naming the limit; a refused request reaches no agent
and is counted nowhere. Counts are shared through the database: a second gateway (another console process) sees
the first's after a sync. The clock is pinned inside one minute, so no window turns over mid-test."""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import SimpleNamespace

import pytest
from aiohttp import web
from asgiref.sync import sync_to_async

from console.accounts.models import DEFAULT_TEAM, ApiToken, LimitCounter, Team
from console.catalog.services import register_model
from console.deployments.services import create_deployment
from console.gateway import limits
from tests.console.gateway.test_gateway import INFER, _client, _gateway, _host, _ready_replica, _token
from tests.console.gateway.test_gateway import fleet as fleet  # noqa: F401  (the fixture)
from tests.sockets import serve_on_loopback

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 1_800_000_010.0  # 10 s into a minute (2027-01-15T08:00:10Z), a Friday


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    monkeypatch.setattr(limits, "time", SimpleNamespace(time=lambda: NOW))


def _limit_token(token: str, **fields) -> int:
    row = ApiToken.objects.get(prefix=ApiToken.lookup(token).prefix)
    ApiToken.objects.filter(pk=row.pk).update(**fields)
    return row.pk


def _limit_team(**fields) -> int:
    Team.objects.filter(name=DEFAULT_TEAM).update(**fields)
    return Team.objects.get(name=DEFAULT_TEAM).pk


async def _calls(gateway, token: str, n: int) -> list:
    async with _client(gateway, token) as client:
        return [await client.post("/v2/models/chat/infer", json=INFER) for _ in range(n)]


def _seen(agents) -> int:
    return sum(len(a.seen) for a in agents)


async def test_a_tokens_requests_per_minute_past_its_limit_get_429_naming_it(fleet):  # noqa: F811
    agents, _, token = fleet
    await sync_to_async(_limit_token)(token, rpm_limit=2)
    gateway = _gateway()
    async with _client(gateway, token) as client:
        answers = [await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}) for _ in range(3)]
    await gateway.close()
    assert [r.status_code for r in answers] == [200, 200, 429]
    refused = answers[2]
    assert refused.headers["retry-after"] == "50"
    error = refused.json()["error"]
    assert error["code"] == "rate_limited" and error["type"] == "rate_limit_error"
    assert error["message"].startswith("rate limit: token 'cli', ") and "2 requests per minute (its rpm_limit)" \
        in error["message"]
    assert _seen(agents) == 2


async def test_a_teams_requests_per_minute_count_all_its_tokens_together(fleet):  # noqa: F811
    agents, _, token = fleet
    await sync_to_async(_limit_team)(rpm_limit=3)
    other = await sync_to_async(lambda: ApiToken.issue(ApiToken.lookup(token).user, "other")[1])()
    gateway = _gateway()
    first = await _calls(gateway, token, 2)
    second = await _calls(gateway, other, 2)
    await gateway.close()
    assert [r.status_code for r in first + second] == [200, 200, 200, 429]
    assert second[1].headers["retry-after"] == "50"
    assert "team 'default' may make 3 requests per minute (its rpm_limit)" in second[1].json()["error"]
    assert _seen(agents) == 3


async def test_tokens_per_minute_refuse_once_a_minutes_finished_requests_used_them(fleet):  # noqa: F811
    agents, _, token = fleet
    token_id = await sync_to_async(_limit_token)(token, tpm_limit=100)
    team = await sync_to_async(_limit_team)(tpm_limit=500)
    gateway = _gateway()
    (before,) = await _calls(gateway, token, 1)
    caller = await gateway.authenticate(token)
    gateway.account("chat", team, caller, 200, 0.0, prompt=30, completion=70)  # a finished request's usage
    (mine,) = await _calls(gateway, token, 1)
    other = await sync_to_async(lambda: ApiToken.issue(ApiToken.lookup(token).user, "other")[1])()
    (theirs,) = await _calls(gateway, other, 1)  # the team's 500 are not spent yet
    gateway.limiter.charge(token_id, team, 400, NOW)
    (team_over,) = await _calls(gateway, other, 1)
    await gateway.close()
    assert (before.status_code, mine.status_code, theirs.status_code, team_over.status_code) == (200, 429, 200, 429)
    assert mine.headers["retry-after"] == team_over.headers["retry-after"] == "50"
    assert "may use 100 tokens per minute (its tpm_limit) and used 100" in mine.json()["error"]
    assert "team 'default' may use 500 tokens per minute (its tpm_limit) and used 500" in team_over.json()["error"]
    assert _seen(agents) == 2


async def test_a_teams_quota_refuses_until_its_period_resets_naming_when(fleet):  # noqa: F811
    agents, _, token = fleet
    team = await sync_to_async(_limit_team)(token_quota=1000, quota_period="day")
    gateway = _gateway()
    async with _client(gateway, token) as client:
        ok = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
        gateway.limiter.charge(0, team, 1000, NOW)
        over = await client.post("/v1/completions", json={"model": "chat", "prompt": "hi"})
        v2 = await client.post("/v2/models/chat/infer", json=INFER)
    await gateway.close()
    assert (ok.status_code, over.status_code, v2.status_code) == (200, 429, 429)
    assert over.headers["retry-after"] == str(16 * 3600 - 10)  # until 2027-01-16T00:00:00Z
    error = over.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "team 'default' has used 1000 tokens of its 1000-token daily token_quota" in error["message"]
    assert "it resets at 2027-01-16T00:00:00Z" in error["message"]
    assert "resets at 2027-01-16T00:00:00Z" in v2.json()["error"]
    assert _seen(agents) == 1


async def test_two_gateways_count_one_tokens_requests_together_through_the_database(fleet):  # noqa: F811
    agents, _, token = fleet
    await sync_to_async(_limit_token)(token, rpm_limit=3)
    one, two = _gateway(), _gateway()
    first = await _calls(one, token, 2)
    await one.limiter.sync()
    await two.ensure_started()
    await two.limiter.sync()
    second = await _calls(two, token, 2)
    await two.limiter.sync()
    await one.limiter.sync()
    (third,) = await _calls(one, token, 1)
    await one.close()
    await two.close()
    assert [r.status_code for r in first + second + [third]] == [200, 200, 200, 429, 429]
    assert _seen(agents) == 3
    rows = await sync_to_async(lambda: list(LimitCounter.objects.filter(key__startswith="token:")
                                            .values_list("requests", flat=True)))()
    assert rows == [3]  # refusals counted nowhere


async def test_a_teams_limit_changed_meanwhile_binds_after_the_next_sync(fleet):  # noqa: F811
    _, _, token = fleet
    gateway = _gateway()
    before = await _calls(gateway, token, 2)
    await sync_to_async(_limit_team)(rpm_limit=2)
    await gateway.limiter.sync()
    after = await _calls(gateway, token, 1)
    await gateway.close()
    assert [r.status_code for r in before + after] == [200, 200, 429]


def test_quota_periods_are_utc_calendar_days_weeks_from_monday_and_months():
    from console.accounts.counters import period_bounds

    assert period_bounds("day", NOW) == (1_799_971_200, 1_800_057_600)  # 2027-01-15 .. 16
    assert period_bounds("week", NOW) == (1_799_625_600, 1_800_230_400)  # Monday 2027-01-11 .. 18
    assert period_bounds("month", NOW) == (1_798_761_600, 1_801_440_000)  # 2027-01-01 .. 02-01


async def test_a_closing_gateway_shares_the_counts_it_has_not_synced_yet(fleet):  # noqa: F811
    _, _, token = fleet
    token_id = await sync_to_async(_limit_token)(token, rpm_limit=10)
    gateway = _gateway()
    await _calls(gateway, token, 2)  # counted in memory; the next sync is half a second away
    await gateway.close()
    rows = await sync_to_async(lambda: list(LimitCounter.objects.filter(key=limits.token_key(token_id))
                                            .values_list("requests", flat=True)))()
    assert rows == [2]


async def test_a_sync_that_fails_after_adding_stores_nothing_and_the_next_sends_it_once(monkeypatch):
    from console.accounts import counters

    real = counters.add

    def added_then_lost(deltas):
        real(deltas)
        raise ConnectionError("the connection dropped after the upsert")

    limiter = limits.Limiter()
    assert isinstance(limiter.admit(5, "t", 10, None, 1), limits.Hold)
    monkeypatch.setattr(counters, "add", added_then_lost)
    with pytest.raises(ConnectionError):
        await limiter.sync()
    assert limiter._used((limits.token_key(5), int(NOW // 60) * 60))[0] == 1  # still counted here
    monkeypatch.setattr(counters, "add", real)
    await limiter.sync()
    rows = await sync_to_async(lambda: list(LimitCounter.objects.filter(key=limits.token_key(5))
                                            .values_list("requests", flat=True)))()
    assert rows == [1]




async def test_a_sync_cancelled_while_its_database_call_waits_for_a_thread_still_stores_what_it_took(monkeypatch):
    queued, free = asyncio.Event(), asyncio.Event()

    def own_thread(fn):  # a call that waits for a free database thread first: cancelled then, it never runs
        async def call(*args):
            queued.set()
            await free.wait()
            return await sync_to_async(fn)(*args)
        return call

    monkeypatch.setattr(limits, "own_thread", own_thread)
    limiter = limits.Limiter()
    limiter.admit(5, "t", 10, None, 1)
    syncing = asyncio.ensure_future(limiter.sync())
    await queued.wait()
    syncing.cancel()  # the gateway closing
    await asyncio.sleep(0)
    free.set()
    with pytest.raises(asyncio.CancelledError):
        await syncing
    rows = await sync_to_async(lambda: list(LimitCounter.objects.filter(key=limits.token_key(5))
                                            .values_list("requests", flat=True)))()
    assert rows == [1]

# --- reservations: admission holds what a request may use, its end settles what it used -----------------------------

class UsageEngine:
    """An agent's inference port answering as an engine that spends all it may: one prompt token per byte of its
    prompt (a byte-level tokenizer's most), and max_tokens (else 16) for its completion. Answers wait for `gate`."""

    def __init__(self) -> None:
        self.secret, self.seen, self.gate = "", 0, asyncio.Event()
        self.overloaded: set[str] = set()  # models it answers 503 for, having run nothing
        self.gate.set()
        app = web.Application()
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v2/models/{name}/infer", self.infer)
        self.runner = web.AppRunner(app)

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen += 1
        if body["model"] in self.overloaded:
            return web.json_response({"error": f"model {body['model']!r} is overloaded"}, status=503)
        with contextlib.suppress(TimeoutError):  # bounded: a gateway that let a request through still ends the test
            await asyncio.wait_for(self.gate.wait(), 5)
        await asyncio.sleep(0.02)  # a little work: requests sent together are in flight together
        usage = {"prompt_tokens": len(body["prompt"].encode()), "completion_tokens": body.get("max_tokens", 16)}
        return web.json_response({"choices": [{"text": "baa"}], "usage": usage | {"total_tokens": sum(usage.values())}})

    async def infer(self, request: web.Request) -> web.Response:
        return web.json_response({"outputs": []})


@pytest.fixture
async def engine(model_dir):
    """Deployments `chat` and `spare` (team default), each with one ready replica whose agent is a UsageEngine; a
    token."""
    agent = UsageEngine()
    endpoint = await serve_on_loopback(agent.runner)

    def rows() -> str:
        host, agent.secret = _host("h1", endpoint)
        register_model("tiny", str(model_dir))
        for name in ("chat", "spare"):
            _ready_replica(create_deployment(name, "tiny"), 0, host)
        return _token()

    yield agent, await sync_to_async(rows)()
    await agent.runner.cleanup()


def _completion(max_tokens: int, prompt: str = "count the sheep") -> tuple[bytes, int]:
    """A completion's body as sent, and its reservation: the body's bytes and its max_tokens."""
    body = json.dumps({"model": "chat", "prompt": prompt, "max_tokens": max_tokens}).encode()
    return body, len(body) + max_tokens


async def _post(client, body: bytes):
    return await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})


def _tokens_in(key: str, start: int) -> int:
    return sum(LimitCounter.objects.filter(key=key, start=start).values_list("tokens", flat=True))


@pytest.mark.parametrize("limit", ["token tpm_limit", "team tpm_limit", "team token_quota"])
async def test_48_requests_at_once_spend_no_more_than_a_limit_and_one_reservation(engine, limit):
    agent, token = engine
    body, one = _completion(max_tokens=40)
    if limit == "token tpm_limit":
        owner = await sync_to_async(_limit_token)(token, tpm_limit=1000)
        window = (limits.token_key(owner), int(NOW // 60) * 60)
    elif limit == "team tpm_limit":
        owner = await sync_to_async(_limit_team)(tpm_limit=1000)
        window = (limits.team_key(owner), int(NOW // 60) * 60)
    else:
        owner = await sync_to_async(_limit_team)(token_quota=1000, quota_period="day")
        window = (limits.quota_key(owner, "day"), 1_799_971_200)
    gateway = _gateway()
    async with _client(gateway, token) as client:
        answers = await asyncio.gather(*(_post(client, body) for _ in range(48)))
    await gateway.close()
    spent = await sync_to_async(_tokens_in)(*window)
    assert {r.status_code for r in answers} == {200, 429}, {r.text for r in answers}
    assert spent == sum(r.status_code == 200 for r in answers) * (len("count the sheep") + 40)  # settled as used
    assert spent <= 1000 + one  # before reservations: 48 admitted at once, 2,640 spent
    assert not gateway.limiter.held  # every reservation settled


async def test_a_request_in_flight_holds_its_reservation_and_its_end_swaps_it_for_what_it_used(engine):
    agent, token = engine
    team = await sync_to_async(_limit_team)(tpm_limit=200)
    body, one = _completion(max_tokens=100)  # reserves 164 of the 200; uses 115
    gateway = _gateway()
    async with _client(gateway, token) as client:
        agent.gate.clear()
        first = asyncio.create_task(_post(client, body))
        await _until(lambda: agent.seen == 1)
        second = await _post(client, body)
        v2 = await client.post("/v2/models/chat/infer", json=INFER)  # reserves nothing: 36 tokens are left
        agent.gate.set()
        first = await first
        held = {w: list(h) for w, h in gateway.limiter.held.items()}
        third = await _post(client, _completion(max_tokens=20)[0])  # 115 used: 84 reserved fit
    await gateway.close()
    assert (first.status_code, second.status_code, v2.status_code, third.status_code) == (200, 429, 200, 200)
    error = second.json()["error"]
    assert error["code"] == "rate_limited" and second.headers["retry-after"] == "1"  # in flight: settles soon
    assert (f"team 'default' may use 200 tokens per minute (its tpm_limit) and used 0, {one} more are reserved by "
            f"requests in flight; this request may use up to {one}; retry in 1 s") in error["message"]
    assert held == {}
    assert gateway.limiter._used((limits.team_key(team), int(NOW // 60) * 60))[1] == 115 + 35


async def test_a_request_that_could_never_fit_a_limit_gets_400_saying_so_and_counts_nowhere(engine):
    agent, token = engine
    await sync_to_async(_limit_team)(tpm_limit=100, rpm_limit=1)
    body, one = _completion(max_tokens=500)
    gateway = _gateway()
    async with _client(gateway, token) as client:
        never = await _post(client, body)
        fits = await _post(client, _completion(max_tokens=10)[0])  # the team's one request a minute
    await gateway.close()
    assert (never.status_code, fits.status_code) == (400, 200), fits.text
    assert "retry-after" not in never.headers
    error = never.json()["error"]
    assert error["code"] == "exceeds_limit" and error["type"] == "invalid_request_error"
    assert error["message"] == (
        f"this request may use up to {one} tokens ({one - 500} for its prompt, counted as its body's bytes, and 500 "
        "for its completion), more than the 100 tokens per minute of team 'default''s whole tpm_limit, so it can never "
        f"be admitted: ask for at most {100 - (one - 500)} completion tokens (max_tokens), or have the limit raised "
        "(PATCH /api/v1/teams/default)")
    assert agent.seen == 1


async def test_another_gateway_counts_a_reservation_in_flight_once_both_synced(engine):
    agent, token = engine
    await sync_to_async(_limit_team)(token_quota=200, quota_period="day")
    body, reserved = _completion(max_tokens=100)
    one_gw, two_gw = _gateway(), _gateway()
    async with _client(one_gw, token) as one, _client(two_gw, token) as two:
        agent.gate.clear()
        first = asyncio.create_task(_post(one, body))
        await _until(lambda: agent.seen == 1)
        await one_gw.limiter.sync()
        await two_gw.ensure_started()  # its first sync
        refused = await _post(two, body)
        agent.gate.set()
        await first
        await one_gw.limiter.sync()
        await two_gw.limiter.sync()
        after = await _post(two, _completion(max_tokens=20)[0])  # 115 used, its 84 fit
    await one_gw.close()
    await two_gw.close()
    assert (refused.status_code, after.status_code) == (429, 200)
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert f"has used 0 tokens of its 200-token daily token_quota, {reserved} more are reserved by requests in flight" \
        in refused.json()["error"]["message"]


async def test_a_routes_fallback_holds_one_reservation_at_a_time_and_settles_what_it_used(engine):
    from console.routes.services import create_route

    agent, token = engine
    team = await sync_to_async(_limit_team)(tpm_limit=1000)
    await sync_to_async(create_route)("assistant", [{"deployment": "chat"}], fallback="spare")
    agent.overloaded = {"chat"}
    gateway = _gateway()
    async with _client(gateway, token) as client:
        agent.gate.clear()
        routed = asyncio.create_task(_post(client, json.dumps({"model": "assistant", "prompt": "count the sheep",
                                                               "max_tokens": 40}).encode()))
        await _until(lambda: agent.seen == 2)  # the branch's 503 (nothing run), then the fallback, in flight
        held = {w: list(h) for w, h in gateway.limiter.held.items()}
        agent.gate.set()
        routed = await routed
    await gateway.close()
    window = (limits.team_key(team), int(NOW // 60) * 60)
    assert routed.status_code == 200 and "fallback: chat answered 503" in routed.headers["x-modelgrid-route"]
    fallback = len(json.dumps({"model": "spare", "prompt": "count the sheep", "max_tokens": 40})) + 40  # as sent on
    assert held == {window: [fallback, window[1] + 60]}
    assert not gateway.limiter.held
    assert gateway.limiter._used(window) == (1, len("count the sheep") + 40)  # one request; the fallback's tokens


async def _until(condition, tries: int = 500) -> None:
    for _ in range(tries):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_a_routes_fallback_after_its_branch_is_at_its_concurrency_limit_meets_the_callers_limits(engine):
    from console.routes.services import create_route

    agent, token = engine
    token_id = await sync_to_async(_limit_token)(token, rpm_limit=1)
    await sync_to_async(create_route)("assistant", [{"deployment": "chat"}], fallback="spare")
    gateway = _gateway(deployment_concurrency=1)
    async with _client(gateway, token) as client:
        agent.gate.clear()
        first = asyncio.create_task(_post(client, _completion(max_tokens=4)[0]))  # the token's one request a minute
        await _until(lambda: agent.seen == 1)  # holds chat's one slot
        routed = await client.post("/v1/completions", json={"model": "assistant", "prompt": "hi"})
        agent.gate.set()
        first = await first
    await gateway.close()
    assert first.status_code == 200
    # chat is full (429, the deployment's limit, not the caller's): its fallback is the caller's second request
    assert routed.status_code == 429, routed.text
    assert "1 requests per minute (its rpm_limit)" in routed.json()["error"]["message"]
    assert agent.seen == 1
    assert gateway.limiter._used((limits.token_key(token_id), int(NOW // 60) * 60))[0] == 1


async def _leave(gateway, token: str, body: bytes, gone) -> None:
    """POST `body` to /v1/completions as a server sees a client that hangs up once `gone()` holds, before its answer:
    a disconnect, as uvicorn delivers one (the application is not cancelled)."""
    from console.gateway.app import make_app

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "server": ("gw", 80), "client": ("127.0.0.1", 5000),
             "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await _until(gone)
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    await make_app(gateway)(scope, receive, send)


async def test_a_client_that_leaves_before_its_answer_is_charged_its_reservation_not_nothing(engine):
    agent, token = engine
    team = await sync_to_async(_limit_team)(tpm_limit=10_000)
    body, reserved = _completion(max_tokens=400)
    gateway = _gateway()
    await gateway.ensure_started()
    agent.gate.clear()  # the engine works on it; the client hangs up first
    await _leave(gateway, token, body, lambda: agent.seen == 1)
    agent.gate.set()
    await gateway.close()
    assert not gateway.limiter.held
    assert gateway.limiter._used((limits.team_key(team), int(NOW // 60) * 60)) == (1, reserved)


async def test_a_client_that_leaves_while_its_request_waits_for_a_replica_is_charged_nothing_and_sends_nothing(engine):
    agent, token = engine
    team = await sync_to_async(_limit_team)(tpm_limit=10_000)
    await sync_to_async(create_deployment)("later", "tiny")  # no replica yet: its requests wait for one
    body = json.dumps({"model": "later", "prompt": "count the sheep", "max_tokens": 400}).encode()
    gateway = _gateway()
    await gateway.ensure_started()
    leaving = asyncio.create_task(_leave(gateway, token, body, lambda: True))
    await _until(lambda: "later" in gateway.waiters)

    def ready() -> None:
        from console.deployments.models import Deployment, Replica

        Replica.objects.create(deployment=Deployment.objects.get(name="later"), index=0, desired_state="ready",
                               observed_state="ready", host=Replica.objects.filter(host__isnull=False).first().host)

    await sync_to_async(ready)()
    gateway.poke()
    await asyncio.wait_for(leaving, 10)
    await gateway.close()
    assert agent.seen == 0
    assert not gateway.limiter.held
    assert gateway.limiter._used((limits.team_key(team), int(NOW // 60) * 60)) == (1, 0)
