"""Requests and tokens per minute per token and per team, and a team's token quota: past each, 429 with Retry-After
(the seconds until the window or period resets) and a message naming the limit; a refused request reaches no agent
and is counted nowhere. Counts are shared through the database: a second gateway (another console process) sees
the first's after a sync. The clock is pinned inside one minute, so no window turns over mid-test."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async

from console.accounts.models import DEFAULT_TEAM, ApiToken, LimitCounter, Team
from console.gateway import limits
from tests.console.gateway.test_gateway import INFER, _client, _gateway
from tests.console.gateway.test_gateway import fleet as fleet  # noqa: F401  (the fixture)

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

    real = counters.add_and_read

    def added_then_lost(deltas, now):
        real(deltas, now)
        raise ConnectionError("the connection dropped after the upsert")

    limiter = limits.Limiter()
    assert limiter.admit(5, "t", 10, None, 1) is None
    monkeypatch.setattr(counters, "add_and_read", added_then_lost)
    with pytest.raises(ConnectionError):
        await limiter.sync()
    assert limiter._used((limits.token_key(5), int(NOW // 60) * 60))[0] == 1  # still counted here
    monkeypatch.setattr(counters, "add_and_read", real)
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
