"""A browser socket shows what its user may see now, not what they could see when it opened: taken out of a team,
the page on an open socket loses that team's deployments at once; deactivated, signed out or after a password
change, the socket is closed with code 4401 and a reason the page shows."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from console.accounts import teams
from console.control.hub import refresh_dashboards
from console.realtime import browsers
from tests.console.realtime.browser_sockets import cookie_of, opened
from tests.console.team_scene import team_scene

pytestmark = pytest.mark.django_db(transaction=True)
SIGNED_OUT = 4401
REASON = "Signed out (session ended, password changed or account disabled): sign in again."


@pytest.fixture
async def scene(tmp_path):
    """Team a (alice: deployment chat-a) and team b (bob: chat-b), and an admin, root."""
    return await database_sync_to_async(team_scene)(tmp_path)


async def alices_socket():
    comm = await opened(await cookie_of("alice"))
    first = await comm.receive_from(timeout=5)
    assert "chat-a" in first and "chat-b" not in first
    return comm


def admin():
    return get_user_model().objects.get(username="root")


async def test_a_member_taken_out_of_a_team_stops_seeing_its_deployments_on_an_open_socket(scene):
    comm = await alices_socket()
    await database_sync_to_async(lambda: teams.remove_member(admin(), "team-a", "alice"))()
    now = await comm.receive_from(timeout=5)  # pushed at once, without a change of the fleet
    assert "chat-a" not in now and 'id="fleet-grid"' in now
    await refresh_dashboards()
    await comm.receive_nothing(timeout=0.5)  # the same page: nothing to push, and never team a's again
    await comm.disconnect()


async def test_a_member_put_in_a_team_sees_its_deployments_without_reloading(scene):
    comm = await alices_socket()
    await database_sync_to_async(lambda: teams.add_member(admin(), "team-b", "alice"))()
    now = await comm.receive_from(timeout=5)
    assert "chat-a" in now and "chat-b" in now
    await comm.disconnect()


async def test_a_deactivated_users_sockets_are_closed_with_the_reason(scene):
    comm = await alices_socket()
    await database_sync_to_async(get_user_model().objects.filter(username="alice").update)(is_active=False)
    # update() sends no signal: the socket stays until something re-checks it; a save does.
    alice = await database_sync_to_async(get_user_model().objects.get)(username="alice")
    await database_sync_to_async(alice.save)()
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": SIGNED_OUT, "reason": REASON}
    await comm.disconnect()


async def test_a_password_change_closes_the_sockets_of_the_sessions_made_before_it(scene):
    comm = await alices_socket()

    def change():
        alice = get_user_model().objects.get(username="alice")
        alice.set_password("another-long-password")
        alice.save()

    await database_sync_to_async(change)()
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": SIGNED_OUT, "reason": REASON}
    await comm.disconnect()


async def test_signing_out_closes_that_sessions_sockets_and_no_others(scene):
    def signed_in() -> Client:
        client = Client()
        client.force_login(get_user_model().objects.get(username="alice"))
        return client

    leaving = await database_sync_to_async(signed_in)()
    gone = await opened(f"sessionid={leaving.cookies['sessionid'].value}".encode())
    await gone.receive_from(timeout=5)
    staying = await alices_socket()
    await database_sync_to_async(leaving.logout)()
    assert await gone.receive_output(timeout=5) == {"type": "websocket.close", "code": SIGNED_OUT, "reason": REASON}
    await staying.receive_nothing(timeout=0.5)  # still open, and its session still shows team a
    await database_sync_to_async(lambda: teams.remove_member(admin(), "team-a", "alice"))()
    assert "chat-a" not in await staying.receive_from(timeout=5)
    await gone.disconnect()
    await staying.disconnect()


async def test_a_change_of_access_announced_while_a_socket_connects_is_not_missed(scene, monkeypatch):
    real, changed = browsers.access_of, []

    def read_then_removed(session_key):
        seen = real(session_key)
        if not changed:  # while this socket's access is read, alice leaves team a (announced at once)
            changed.append(teams.remove_member(admin(), "team-a", "alice"))
        return seen

    monkeypatch.setattr(browsers, "access_of", read_then_removed)
    comm = await opened(await cookie_of("alice"))
    page = await comm.receive_from(timeout=5)
    if "chat-a" in page:  # the page of what was read, then at once the page of what holds
        page = await comm.receive_from(timeout=5)
    assert "chat-a" not in page and 'id="fleet-grid"' in page
    await comm.disconnect()
