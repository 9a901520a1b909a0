"""Limits counted across console processes: two `manage.py up --no-agent` on one PostgreSQL database, one real agent
serving a tiny model. A token's requests per minute spent through the first console are refused by the second; a
team's tokens per minute and its daily quota, used by a completion through the first, are refused by the second
(polled with v2 requests, which cost no tokens, so only the first console's count can have tripped them)."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from tests.e2e.stack import _database_env, kill_all, said, wait_for
from tests.e2e.test_consoles import console, consoles_env, link_agent, services_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.db_stack]

RPM = 12
TPM = 8
PROMPT = "the cat sat on the mat and looked at the dog"  # more tokens than TPM alone
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

        # The team's tokens per minute: a completion through the first console uses them.
        assert api.patch("/teams/default", json={"tpm_limit": TPM}).status_code == 200
        early_in_a_minute()
        with first.gateway() as one, second.gateway() as two:
            done = one.post("/v1/completions", json={"model": "chat", "prompt": PROMPT, "max_tokens": 4})
            assert done.status_code == 200, done.text
            used = done.json()["usage"]["total_tokens"]
            assert used >= TPM
            _, refusal = refused_by(two, "the second console to refuse the team's TPM")
            assert f"team 'default' may use {TPM} tokens per minute (its tpm_limit)" in refusal.json()["error"]
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
    finally:
        kill_all(started)
        drop_db()
        for name, lines in logs.items():
            print(f"--- {name}\n" + "".join(lines[-40:]))
