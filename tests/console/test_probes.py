"""/livez and /readyz: open, answered before Django (a kubelet probes the pod's IP, which ALLOWED_HOSTS does not
name), ready only while the database answers, and saying nothing but the verdict."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from console import probes
from console.probes import DatabaseCheck, Probes

pytestmark = pytest.mark.django_db(transaction=True)


async def downstream(scope, receive, send):
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def client(app, host: str = "10.42.0.17:8000") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}")


async def test_it_is_live_and_ready_on_the_full_console_app_addressed_by_a_pod_ip():
    from console.asgi import application

    async with client(application) as c:
        live, ready = await c.get("/livez"), await c.get("/readyz")
        page = await c.get("/login/")  # Django itself refuses the pod IP: the probes are not Django's
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert ready.headers["cache-control"] == "no-store"
    assert page.status_code == 400


async def test_a_database_that_fails_makes_it_unready_saying_nothing_more(monkeypatch, caplog):
    def broken() -> None:
        raise RuntimeError("connection to server at 10.0.0.5 failed: password authentication failed")

    monkeypatch.setattr(probes, "_select_one", broken)
    async with client(Probes(downstream, DatabaseCheck())) as c:
        ready, live = await c.get("/readyz"), await c.get("/livez")
    assert (ready.status_code, ready.json()) == (503, {"ready": False})
    assert live.status_code == 200  # a restart would not bring the database back
    assert "not ready: the database cannot be queried: RuntimeError" in caplog.text  # the log says why


async def test_a_hung_database_costs_one_query_however_often_it_is_probed(monkeypatch):
    release, calls = threading.Event(), []

    def hung() -> None:
        calls.append(1)
        release.wait(10)

    monkeypatch.setattr(probes, "_select_one", hung)
    check = DatabaseCheck(timeout=0.2)
    try:
        async with client(Probes(downstream, check)) as c:
            answers = [await c.get("/readyz") for _ in range(3)]
            assert [a.status_code for a in answers] == [503, 503, 503]
            assert len(calls) == 1
            release.set()
            await asyncio.sleep(0.3)  # the hung query returns: the next probe asks again, and is answered
            assert (await c.get("/readyz")).status_code == 200
            assert len(calls) == 2
    finally:
        release.set()


async def test_other_paths_and_methods_pass_or_are_refused():
    async with client(Probes(downstream, DatabaseCheck())) as c:
        other, posted, head = await c.get("/readyz/x"), await c.post("/livez"), await c.head("/readyz")
    assert (other.status_code, other.text) == (299, "app")
    assert posted.status_code == 405 and posted.headers["allow"] == "GET, HEAD"
    assert head.status_code == 200 and head.content == b""
