"""Browser sockets cost what their pages cost, not what their number does: a console process admits them under a
cap per user and one in all (the refusal closes with code 4429 and a reason the page shows), renders each page
once for every socket that shows it, and agent links and the gateway go on while many sockets are pushed to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from console.accounts.scope import TeamScope
from console.asgi import application
from console.control.hub import refresh_dashboards
from console.fleet import views
from console.fleet.models import AgentCredential, Gpu, Host
from console.realtime import browsers
from console.realtime.access import Access
from tests.console.gateway.test_gateway import FakeAgent, _client, _gateway
from tests.console.realtime.agent_link import GPU, HELLO, GiB
from tests.console.realtime.browser_sockets import cookie_of, opened
from tests.console.team_scene import served_scene

pytestmark = pytest.mark.django_db(transaction=True)
BOUND = 10.0  # seconds within which what must happen happens: generous, far above what it takes


async def closed_with(comm) -> dict:
    """The close a socket was sent, past the pages sent before it."""
    while True:
        out = await comm.receive_output(timeout=5)
        if out["type"] == "websocket.close":
            return out


async def test_a_users_socket_past_the_per_user_cap_is_closed_with_the_reason_and_others_still_connect(settings):
    settings.MODELGRID_BROWSER_SOCKETS_PER_USER = 2
    ann, bob = await cookie_of("ann"), await cookie_of("bob")
    first, second = await opened(ann), await opened(ann)
    assert 'id="fleet-grid"' in await first.receive_from(timeout=5)
    assert 'id="fleet-grid"' in await second.receive_from(timeout=5)

    third = await opened(ann)
    close = await closed_with(third)
    assert close["code"] == browsers.TOO_MANY
    assert close["reason"] == "You have 2 live pages open, the limit per user. Close some tabs, then reload."
    assert len(close["reason"].encode()) <= 123  # what a close frame can carry

    other = await opened(bob)  # the cap is per user
    assert 'id="fleet-grid"' in await other.receive_from(timeout=5)
    await second.disconnect()  # a closed socket gives its seat back
    again = await opened(ann)
    assert 'id="fleet-grid"' in await again.receive_from(timeout=5)
    for comm in (first, third, other, again):
        await comm.disconnect()


async def test_a_socket_past_the_cap_in_all_is_closed_with_the_reason(settings):
    settings.MODELGRID_BROWSER_SOCKETS = 2
    first, second = await opened(await cookie_of("ann")), await opened(await cookie_of("bob"))
    late = await opened(await cookie_of("cy"))
    close = await closed_with(late)
    assert close["code"] == browsers.TOO_MANY
    assert close["reason"] == "This console already holds 2 live pages, its limit. Reload in a few minutes."
    for comm in (first, second, late):
        await comm.disconnect()


async def test_sockets_showing_one_page_share_one_render_per_change(settings, monkeypatch):
    renders = []
    real = views.summary_view

    def counted(*args, **kwargs):
        renders.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(views, "summary_view", counted)
    cookie = await cookie_of("ann")
    socks = [await opened(cookie) for _ in range(5)]
    other = await opened(cookie, "page=2")
    for comm in [*socks, other]:
        await comm.receive_from(timeout=5)
    assert len(renders) == 2  # page 1 and page 2

    renders.clear()
    await database_sync_to_async(Host.objects.create)(name="gpu-box", connected=True)
    await refresh_dashboards()
    for comm in socks:
        assert "gpu-box" in await comm.receive_from(timeout=5)
    await other.receive_from(timeout=5)
    assert len(renders) == 2  # one per page, however many sockets show it
    for comm in [*socks, other]:
        await comm.disconnect()


@pytest.fixture
async def served(tmp_path):
    """The team scene (alice in team a) with chat-a's replica ready on h1 behind a fake agent; h1's agent token."""
    credential, token = await sync_to_async(AgentCredential.issue)("h1")
    agent = FakeAgent(credential.gateway_secret, "h1")
    endpoint = await agent.start()
    scene = await sync_to_async(served_scene)(tmp_path, endpoint)
    yield scene, token
    await agent.runner.cleanup()


async def test_an_agent_link_and_the_gateway_are_answered_while_many_browser_sockets_are_pushed_to(
        served, settings, monkeypatch):
    """The probe: 1,500 dashboard sockets of one member held completions 45-90 s and timed the agent link out.
    Here 150 sockets whose page takes 0.1 s to render (a big fleet's) are pushed to as fast as the fleet changes,
    and an agent's hello and report, and a completion, still go through."""
    scene, token = served
    settings.MODELGRID_BROWSER_SOCKETS_PER_USER = settings.MODELGRID_BROWSER_SOCKETS = 150
    settings.MODELGRID_DASHBOARD_REFRESH_SECONDS = 0.05
    real = views.summary_view

    def slow(*args, **kwargs):
        time.sleep(0.1)
        return real(*args, **kwargs)

    monkeypatch.setattr(views, "summary_view", slow)
    cookie = await cookie_of("alice")
    socks = [await opened(cookie) for _ in range(150)]
    stop = asyncio.Event()

    async def keep_changing() -> None:
        while not stop.is_set():
            await refresh_dashboards()
            await asyncio.sleep(0.05)

    async def drain(comm) -> None:
        with contextlib.suppress(Exception):
            while True:
                await comm.receive_from(timeout=60)

    busy = [asyncio.create_task(keep_changing()), *(asyncio.create_task(drain(c)) for c in socks)]
    link = None
    try:
        async def agent_round() -> None:
            nonlocal link
            link = WebsocketCommunicator(application, "/ws/agent/",
                                         headers=[(b"authorization", f"Bearer {token}".encode())])
            assert (await link.connect(timeout=BOUND))[0]
            await link.send_to(text_data=json.dumps(HELLO))
            assert json.loads(await link.receive_from(timeout=BOUND))["type"] == "desired_state"
            report = {"type": "report", "gpus": [GPU | {"used_bytes": 5 * GiB}], "replicas": []}
            await link.send_to(text_data=json.dumps(report))
            while (await database_sync_to_async(Gpu.objects.get)(host__name="h1", index=0)).used_bytes != 5 * GiB:
                await asyncio.sleep(0.05)

        async def completion() -> int:
            gateway = _gateway()
            try:
                async with _client(gateway, scene.tokens["alice"]) as alice:
                    return (await alice.post("/v1/completions", json={"model": "chat-a", "prompt": "hi"})).status_code
            finally:
                await gateway.close()

        _, status = await asyncio.wait_for(asyncio.gather(agent_round(), completion()), BOUND)
        assert status == 200
    finally:
        stop.set()
        for task in busy:
            task.cancel()
        if link is not None:
            await link.disconnect()
        for comm in socks:
            await comm.disconnect()


class FakeBrowser:
    """A socket as the hub drives it; `stuck` ones never finish a push until released (a reader that stopped)."""

    def __init__(self, user_id: int, stuck: bool = False) -> None:
        self.session_key, self.query = f"session-{user_id}", ""
        self.access = Access(user_id, TeamScope())
        self.pages: list[str] = []
        self.arrived = asyncio.Event()
        self.released = asyncio.Event()
        if not stuck:
            self.released.set()

    async def show(self, html: str) -> None:
        self.pages.append(html)
        self.arrived.set()
        await self.released.wait()

    async def end(self, code: int, reason: str) -> None:
        pass

    async def next_page(self) -> str:
        await asyncio.wait_for(self.arrived.wait(), BOUND)
        self.arrived.clear()
        return self.pages[-1]


async def test_a_socket_that_stops_reading_holds_up_no_other_sockets_pushes_and_is_owed_only_the_newest():
    await browsers.listening()
    stuck, reader = FakeBrowser(1, stuck=True), FakeBrowser(2)
    for browser in (stuck, reader):
        assert browsers.admit(browser, browsers.rechecks()) is None
    assert "No hosts yet" in await stuck.next_page() and "No hosts yet" in await reader.next_page()

    for name in ("gpu-a", "gpu-b"):
        await database_sync_to_async(Host.objects.create)(name=name, connected=True)
        await refresh_dashboards()
        assert name in await reader.next_page()  # pushed while the stuck socket's first push still waits
    assert len(stuck.pages) == 1

    stuck.released.set()
    assert "gpu-b" in await stuck.next_page()  # the newest page, not each one it missed
    assert len(stuck.pages) == 2
    for browser in (stuck, reader):
        browsers.leave(browser)
