"""Limits counted across console processes: two `manage.py up --no-agent` on one PostgreSQL database, one real agent
serving a tiny model. A token's requests per minute spent through the first console are refused by the second; a
team's tokens per minute and its daily quota, used by a completion through the first, are refused by the second
(polled with v2 requests, which cost no tokens, so only the first console's count can have tripped them). A
completion waiting through the first console holds its reservation there, which the second sees in flight; and a
burst through both at once stays within the documented bound (docs/teams.md, "Across console processes")."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.stack import _database_env, kill_all, said, wait_for
from tests.e2e.test_consoles import console, consoles_env, link_agent, services_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]

RPM = 12
PROMPT = "the cat sat on the mat and looked at the dog"
INFER = {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 5, 9]}]}


def early_in_a_minute() -> None:
    """Wait, if need be, for a minute's first 40 seconds, so that one step's counts stay in one window."""
    if time.time() % 60 > 40:
        time.sleep(60.5 - time.time() % 60)


def refused_by(gateway: httpx.Client, what: str, says: str = "") -> tuple[int, httpx.Response]:
    """Poll with v2 requests until the gateway answers 429 saying `says` (bounded); how many it admitted first, and
    the 429."""
    admitted = []

    def refused():
        r = gateway.post("/v2/models/chat/infer", json=INFER)
        if r.status_code == 429:
            return r if says in r.json()["error"] else None
        admitted.append(r.status_code)
        return None

    return len(admitted), wait_for(refused, 15, interval=0.1, what=what)


def test_two_consoles_count_a_tokens_rpm_and_a_teams_tpm_and_quota_together(tiny_llama, tmp_path):
    services_or_skip()
    db_env, drop_db = _database_env()
    env = consoles_env(db_env, tiny_llama, tmp_path)
    started: list[subprocess.Popen] = []
    logs: dict[str, list[str]] = {}
    try:
        first = console(env)  # alone first: it migrates the fresh database
        started.append(first.proc)
        logs["first console"] = first.lines
        wait_for(lambda: said(first, "leading scheduler"), 15, what="the first console to lead")
        second = console(env)
        started.append(second.proc)
        logs["second console"] = second.lines
        first.token = second.token = first.manage("createapitoken", "admin")  # the admin: may set team limits
        agent, agent_lines = link_agent(first, env)
        started.append(agent)
        logs["agent"] = agent_lines
        api = first.api()
        assert api.post("/models", json={"name": "tiny", "path": str(tiny_llama)}).status_code == 201
        assert api.post("/deployments", json={"name": "chat", "model": "tiny", "replicas": 1}).status_code == 201
        wait_for(lambda: api.get("/deployments/chat").json()["state"] == "ready", 120, what="chat to be ready")

        # A token's requests per minute: spent through the first console, refused by the second.
        made = api.post("/tokens", json={"name": "rpm", "scope": "inference", "rpm_limit": RPM})
        assert made.status_code == 201, made.text
        token = made.json()["token"]
        early_in_a_minute()
        with first.gateway(token) as one, second.gateway(token) as two:
            assert [one.post("/v2/models/chat/infer", json=INFER).status_code for _ in range(RPM)] == [200] * RPM
            admitted, refusal = refused_by(two, "the second console to refuse the token's RPM")
        assert admitted < RPM  # the second console's own requests alone could not have reached the limit
        assert 1 <= int(refusal.headers["retry-after"]) <= 60
        assert f"may make {RPM} requests per minute (its rpm_limit)" in refusal.json()["error"]

        # The team's tokens per minute: a completion through the first console uses them, then a limit of what it
        # used is spent (set after it: admission would refuse a limit below its reservation, the body's bytes).
        early_in_a_minute()
        with first.gateway() as one, second.gateway() as two:
            done = one.post("/v1/completions", json={"model": "chat", "prompt": PROMPT, "max_tokens": 4})
            assert done.status_code == 200, done.text
            used = done.json()["usage"]["total_tokens"]
            assert api.patch("/teams/default", json={"tpm_limit": used}).status_code == 200
            _, refusal = refused_by(two, "the second console to refuse the team's TPM")
            assert f"team 'default' may use {used} tokens per minute (its tpm_limit)" in refusal.json()["error"]
            refused_by(one, "the first console to refuse the team's TPM")

            # The team's daily quota: no more than what that completion used so far today.
            limits = {"tpm_limit": None, "token_quota": used, "quota_period": "day"}
            assert api.patch("/teams/default", json=limits).status_code == 200
            _, refusal = refused_by(two, "the second console to refuse the team's quota", "quota exceeded")
            error = refusal.json()["error"]
            tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
            assert f"of its {used}-token daily token_quota; it resets at {tomorrow}T00:00:00Z" in error
            assert 1 <= int(refusal.headers["retry-after"]) <= 86400
        assert second.api().get("/teams/default").json()["quota_used"] >= used

        reservations_are_shared_and_a_burst_stays_within_the_bound(api, first, second)
    finally:
        kill_all(started)
        drop_db()
        for name, lines in logs.items():
            print(f"--- {name}\n" + "".join(lines[-40:]))


def reservations_are_shared_and_a_burst_stays_within_the_bound(api: httpx.Client, first, second) -> None:
    """The second step of the test above, on its stack (the team's daily quota set, the chat deployment ready)."""
    body = json.dumps({"model": "cold", "prompt": PROMPT, "max_tokens": 8}).encode()
    reserved = len(body) + 8  # what admission holds: the body's bytes and max_tokens (inside the model's context)
    made = api.post("/deployments", json={"name": "cold", "model": "tiny", "min_replicas": 0, "max_replicas": 1})
    assert made.status_code == 201, made.text
    base = shared_quota_used(second)
    assert api.patch("/teams/default", json={"token_quota": base + reserved}).status_code == 200
    headers = {"content-type": "application/json"}
    with first.gateway() as one, second.gateway() as two, ThreadPoolExecutor(1) as pool:
        admits(one, two, "both consoles to read the new quota")
        # Scaled to zero, `cold` keeps the request waiting while its replica is placed and loaded (a worker starts):
        # its reservation is held through the first console all that while, and the second counts it once synced.
        waiting = pool.submit(one.post, "/v1/completions", content=body, headers=headers)
        _, refusal = refused_by(two, "the second console to count the first's reservation in flight",
                                f"{reserved} more are reserved by requests in flight")
        assert refusal.json()["error"].startswith(f"quota exceeded: team 'default' has used {base} tokens")
        done = waiting.result(timeout=180)
        assert done.status_code == 200, done.text
        usage = done.json()["usage"]
        assert usage["total_tokens"] < reserved
        # Settled to what it used: the room it held is free again once both consoles synced.
        wait_for(lambda: two.post("/v2/models/chat/infer", json=INFER).status_code == 200, 15,
                 what="the second console to admit again once the reservation settled")
    base = shared_quota_used(second, base + usage["total_tokens"])

    # A burst through both consoles at once, with room for 2 reservations: each console admits at most the room it
    # saw, so together they overshoot by at most what the other admitted before the next syncs, here the room again.
    room = 2 * reserved
    assert 24 * usage["prompt_tokens"] > room  # so some are refused, however the burst is timed
    burst = json.dumps({"model": "chat", "prompt": PROMPT, "max_tokens": 8}).encode()
    with first.gateway() as one, second.gateway() as two, ThreadPoolExecutor(24) as pool:
        assert api.patch("/teams/default", json={"token_quota": base}).status_code == 200  # full: v2 refused
        for gateway in (one, two):
            refused_by(gateway, "both consoles to read the full quota")
        assert api.patch("/teams/default", json={"token_quota": base + room}).status_code == 200
        admits(one, two, "both consoles to read the new quota")
        answers = list(pool.map(lambda i: (one, two)[i % 2].post("/v1/completions", content=burst, headers=headers),
                                range(24)))
    statuses = [r.status_code for r in answers]
    assert set(statuses) == {200, 429}, {r.text for r in answers}
    charged = sum(r.json()["usage"]["total_tokens"] for r in answers if r.status_code == 200)
    print(f"burst: {statuses.count(200)} of 24 admitted through two consoles, {charged} tokens charged against a "
          f"room of {room} (overshoot {max(0, charged - room)}; the documented bound: {room})")
    assert charged <= 2 * room
    shared_quota_used(second, base + charged)  # settled to the engines' usage, every reservation released


def admits(one: httpx.Client, two: httpx.Client, what: str) -> None:
    """Wait until both consoles admit a v2 request (which reserves nothing) for the team."""
    for gateway in (one, two):
        wait_for(lambda g=gateway: g.post("/v2/models/chat/infer", json=INFER).status_code == 200, 15, what=what)


def shared_quota_used(stack, expected: int | None = None) -> int:
    """The default team's quota_used as the consoles shared it: once it reads `expected` (when given), or the same
    twice a sync apart."""
    def read():
        return stack.api().get("/teams/default").json()["quota_used"]

    if expected is not None:
        wait_for(lambda: read() == expected, 15, what=f"quota_used to read {expected}")
        return expected
    before = read()
    time.sleep(1.2)  # past a sync of each console: anything counted before is shared by now
    after = read()
    assert before == after, (before, after)
    return after
