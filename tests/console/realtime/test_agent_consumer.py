import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection

from agent.protocol import PROTOCOL_VERSION
from console.asgi import application
from console.fleet.models import AgentCredential, Gpu, Host

pytestmark = pytest.mark.django_db(transaction=True)
GiB = 1024**3


def hello(host="h1", total=24 * GiB):
    return {"type": "hello", "protocol": PROTOCOL_VERSION, "host": host, "agent_version": "test",
            "endpoint": "http://127.0.0.1:9999",
            "gpus": [{"index": 0, "uuid": "SIM-h1-0", "name": "Simulated GPU", "total_bytes": total,
                      "used_bytes": 0, "simulated": True}]}


async def connect(token):
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, _ = await comm.connect()
    return comm, connected


@pytest.fixture
def token():
    return AgentCredential.issue("h1")[1]


async def linked_with_chat_placed(token):
    """h1's link has said hello and read its first push, and a pass has placed deployment chat (model tiny) on
    h1: (the link, the host, the pass's result)."""
    from console.control.reconcile import reconcile_once, start_leading
    from console.deployments.services import create_deployment

    start_leading()  # before h1 speaks: else its readings predate this scheduler's term and are stale (by design)
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello()))
    await comm.receive_from(timeout=5)
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    await database_sync_to_async(create_deployment)("chat", "tiny")
    return comm, host, await database_sync_to_async(reconcile_once)()


async def test_it_refuses_a_wrong_token_at_the_handshake(token, caplog):
    comm, connected = await connect("mg_agent_not-the-token")
    assert not connected
    assert "refused agent connection" in caplog.text
    assert not await database_sync_to_async(Host.objects.exists)()


async def test_it_refuses_a_connection_without_a_token():
    comm = WebsocketCommunicator(application, "/ws/agent/")
    connected, _ = await comm.connect()
    assert not connected


async def test_a_hello_registers_the_host_and_gets_the_full_desired_state(token):
    comm, connected = await connect(token)
    assert connected
    await comm.send_to(text_data=json.dumps(hello()))
    reply = json.loads(await comm.receive_from(timeout=5))
    credential = await database_sync_to_async(AgentCredential.objects.get)(host_name="h1")
    # With the secret its inference port will accept from the console's gateway (and no one else).
    assert reply == {"type": "desired_state", "generation": 0, "replicas": [],
                     "gateway_secret": credential.gateway_secret}
    assert len(credential.gateway_secret) == 64
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    assert host.connected and host.endpoint == "http://127.0.0.1:9999"
    assert await database_sync_to_async(Gpu.objects.filter(host=host, simulated=True).count)() == 1
    await comm.disconnect()
    await database_sync_to_async(host.refresh_from_db)()
    assert not host.connected


async def test_a_malformed_message_gets_an_error_and_the_link_stays_up(token):
    comm, _ = await connect(token)
    await comm.send_to(text_data="{this is not json")
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "invalid message" in reply["reason"]
    await comm.send_to(text_data=json.dumps({"type": "report", "gpus": "lots"}))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply["type"] == "error" and "gpus" in reply["reason"]
    await comm.send_to(text_data=json.dumps(hello()))  # still connected and usable
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "desired_state"
    await comm.disconnect()


async def test_messages_before_the_hello_are_refused(token):
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 1}))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert reply == {"type": "error", "reason": "send a hello first (got ack)"}
    await comm.disconnect()


async def test_a_token_cannot_speak_for_another_host(token):
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello(host="someone-else")))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert "this token is for host 'h1'" in reply["reason"]
    assert not await database_sync_to_async(Host.objects.filter(name="someone-else").exists)()
    await comm.disconnect()


async def test_a_hello_under_a_host_name_the_rule_refuses_is_refused_saying_why(db):
    # A token stored under such a name before the rule (it is issued no longer): its agent is told, not linked.
    token, fields = AgentCredential.new_secret("agent")
    await database_sync_to_async(AgentCredential.objects.create)(host_name="gpu-\u0430", **fields)
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello(host="gpu-\u0430")))
    reply = json.loads(await comm.receive_from(timeout=5))
    assert "host name 'gpu-а' is not valid" in reply["reason"] and "CYRILLIC SMALL LETTER A" in reply["reason"]
    assert (await comm.receive_output(timeout=5))["type"] == "websocket.close"
    assert not await database_sync_to_async(Host.objects.exists)()
    await comm.disconnect()


async def test_reports_update_gpu_memory_and_acks_are_recorded(token):
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello()))
    await comm.receive_from(timeout=5)
    report = {"type": "report", "gpus": [hello()["gpus"][0] | {"used_bytes": 5 * GiB}], "replicas": []}
    await comm.send_to(text_data=json.dumps(report))
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))
    # The consumer handles messages in order; a final hello round trip proves the report was applied.
    await comm.send_to(text_data=json.dumps(hello() | {"gpus": report["gpus"]}))
    await comm.receive_from(timeout=5)
    gpu = await database_sync_to_async(Gpu.objects.get)(host__name="h1", index=0)
    assert gpu.used_bytes == 5 * GiB
    await comm.disconnect()


async def test_a_second_link_supersedes_the_first_and_the_old_ones_close_changes_nothing(token):
    """The probe: a second websocket with a host's token, once closed, took the host offline and the real
    agent's replicas moved. Each hello opens a new link epoch; the older link is closed by the console, and
    its close leaves the host connected."""
    first, _ = await connect(token)
    await first.send_to(text_data=json.dumps(hello()))
    assert json.loads(await first.receive_from(timeout=5))["type"] == "desired_state"
    second, _ = await connect(token)
    await second.send_to(text_data=json.dumps(hello()))
    assert json.loads(await second.receive_from(timeout=5))["type"] == "desired_state"
    closed = await first.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4409}
    await first.disconnect()
    await second.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))  # the live link still works
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    assert host.connected and host.link_epoch == 2
    await second.disconnect()
    await database_sync_to_async(host.refresh_from_db)()
    assert host.lifecycle == "unknown"  # the current link's close: unknown, its replicas kept, not gone


async def test_a_hello_the_channel_layer_cannot_take_ends_the_link_so_the_agent_reconnects(token, monkeypatch):
    from channels.layers import get_channel_layer

    layer = get_channel_layer()

    async def down(*args, **kwargs):
        raise ConnectionError("Connection closed by server")  # as redis-py's, with Redis restarting

    monkeypatch.setattr(type(layer), "group_add", down)
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello()))
    closed = await comm.receive_output(timeout=5)
    # Closed (to be tried again), not left open outside its host's group where no desired state reaches it.
    assert closed == {"type": "websocket.close", "code": 1011}


async def test_a_committed_change_stands_when_the_channel_layer_is_down(token, monkeypatch, model_dir):
    from channels.layers import get_channel_layer

    from console.catalog.services import register_model
    from console.deployments.models import Deployment
    from console.deployments.services import create_deployment, update_deployment

    async def down(*args, **kwargs):
        raise ConnectionError("Connection closed by server")

    monkeypatch.setattr(type(get_channel_layer()), "group_send", down)

    def change():
        register_model("tiny", str(model_dir))
        create_deployment("chat", "tiny")  # wakes the scheduler on commit: lost, and no error
        update_deployment("chat", {"replicas": 3})

    await database_sync_to_async(change)()
    assert await database_sync_to_async(Deployment.objects.filter(name="chat", replicas=3).exists)()


async def test_a_push_carrying_the_passs_state_is_sent_as_it_is_and_an_older_one_is_dropped(token, model,
                                                                                           monkeypatch):
    """The pass's own desired state goes out without being read back, with the secret of the link's token; a push
    of a generation older than one already sent is dropped."""
    from channels.layers import get_channel_layer

    from console.control.hub import hub
    from console.control.layer import host_group

    comm, host, result = await linked_with_chat_placed(token)
    assert result.changed_hosts == (host.pk,)
    generation, replicas = result.states[host.pk]
    from console.control import agent_link as consumers

    def no_read(host):
        raise AssertionError("the pass's state was read back")

    monkeypatch.setattr(consumers, "desired_text", no_read)
    await hub().push_desired([host.pk], result.states)
    raw = await comm.receive_from(timeout=5)
    assert f'"replicas":{replicas},' in raw  # the pass's very text, spliced in
    sent = json.loads(raw)
    assert sent == {"type": "desired_state", "generation": generation, "replicas": json.loads(replicas),
                    "gateway_secret": (await database_sync_to_async(AgentCredential.objects.get)(host_name="h1"))
                    .gateway_secret}
    assert [r["deployment"] for r in sent["replicas"]] == ["chat"]
    await get_channel_layer().group_send(host_group(host.pk), {"type": "desired.push", "generation": generation - 1,
                                                               "replicas_json": "[]"})
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_a_new_link_is_sent_the_state_as_stored_and_a_host_marked_stale_its_state_built_now(token, model):
    """A hello's first push is the stored JSON text spliced in as it is (a fleet reconnecting after a console restart
    costs no validating and serializing of every host's replicas); a host marked stale has its state built now,
    under the generation it has."""
    from console.control.desired import stored_states

    comm, host, result = await linked_with_chat_placed(token)
    generation, _ = result.states[host.pk]
    await comm.disconnect()
    _, stored = (await database_sync_to_async(stored_states)([host.pk]))[host.pk]

    async def first_push() -> str:
        comm, _ = await connect(token)
        await comm.send_to(text_data=json.dumps(hello()))
        raw = await comm.receive_from(timeout=5)
        await comm.disconnect()
        return raw

    raw = await first_push()
    assert f'"generation":{generation},"replicas":{stored},' in raw
    assert [r["deployment"] for r in json.loads(raw)["replicas"]] == ["chat"]
    await database_sync_to_async(Host.objects.filter(pk=host.pk).update)(desired_digest="")  # as mark_stale
    rebuilt = json.loads(await first_push())
    assert (rebuilt["generation"], rebuilt["replicas"]) == (generation, json.loads(stored))


async def test_rotating_a_hosts_token_ends_its_links_and_the_new_token_gets_the_new_secret(token):
    """A link carries the gateway secret of the token it authenticated with: once that token is rotated, the link
    ends (its pushes would carry a secret the gateway no longer uses), and the old token is refused."""
    old, _ = await connect(token)
    await old.send_to(text_data=json.dumps(hello()))
    first = json.loads(await old.receive_from(timeout=5))
    _, new_token = await database_sync_to_async(AgentCredential.issue)("h1")
    assert await old.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await old.disconnect()
    assert not (await connect(token))[1]
    comm, connected = await connect(new_token)
    assert connected
    await comm.send_to(text_data=json.dumps(hello()))
    state = json.loads(await comm.receive_from(timeout=5))
    credential = await database_sync_to_async(AgentCredential.objects.get)(host_name="h1")
    assert state["gateway_secret"] == credential.gateway_secret != first["gateway_secret"]
    await comm.disconnect()


async def test_issuing_a_token_for_a_new_host_ends_no_other_hosts_link(token):
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello()))
    await comm.receive_from(timeout=5)
    await database_sync_to_async(AgentCredential.issue)("h2")
    assert await comm.receive_nothing(timeout=0.5)
    await comm.send_to(text_data=json.dumps({"type": "ack", "generation": 0}))
    assert await comm.receive_nothing(timeout=0.3)  # no error: the link still works
    await comm.disconnect()


async def test_a_push_reaches_the_agent_while_the_database_thread_is_busy(token):
    """Channels' consumers close stale connections on its one thread-sensitive database thread before every
    message: a push then waited behind whatever ran there (a scheduler pass of a second or more at fleet size).
    Here that thread is held until the push has arrived; a push that queued behind it would never arrive."""
    import threading

    from asgiref.sync import sync_to_async
    from channels.layers import get_channel_layer

    from console.control.layer import host_group

    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello()))
    await comm.receive_from(timeout=5)
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)(10))  # the thread-sensitive thread, as a pass holds it
    try:
        await asyncio.sleep(0.1)
        await get_channel_layer().group_send(host_group(host.pk), {"type": "desired.push", "generation": 7,
                                                                   "replicas_json": "[]"})
        sent = json.loads(await comm.receive_from(timeout=5))
        assert sent["generation"] == 7 and not busy.done()
    finally:
        release.set()
        await busy
    await comm.disconnect()


async def test_a_push_to_a_link_this_process_holds_skips_the_channel_layer(token, monkeypatch):
    """A link held here gets its push handed over directly; once it has ended, the channel layer carries the push
    (to a link another console process may hold)."""
    from channels.layers import get_channel_layer

    from console.control.hub import hub

    layer = get_channel_layer()
    sent_through_layer = []
    group_send = type(layer).group_send

    async def recording(self, group, message):
        sent_through_layer.append((group, message["type"]))
        await group_send(self, group, message)

    monkeypatch.setattr(type(layer), "group_send", recording)
    comm, _ = await connect(token)
    await comm.send_to(text_data=json.dumps(hello()))
    await comm.receive_from(timeout=5)
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    await hub().push_desired([host.pk], {host.pk: (3, "[]")})
    assert json.loads(await comm.receive_from(timeout=5))["generation"] == 3
    assert [m for m in sent_through_layer if m[1] == "desired.push"] == []
    await comm.disconnect()
    await hub().push_desired([host.pk], {host.pk: (4, "[]")})
    assert [m for m in sent_through_layer if m[1].startswith("desired.")] == [("pushes", "desired.pushes")]


async def test_a_push_named_by_another_process_sends_the_link_held_here_its_stored_state(token, model):
    """A scheduler in another console process names the hosts it pushed in one message; the process holding a
    host's link sends it the state the pass stored (read for all its hosts at once). Hosts it holds no link of
    are left to the process that does."""
    from channels.layers import get_channel_layer

    from console.control.layer import PUSH_GROUP

    comm, host, result = await linked_with_chat_placed(token)
    generation, replicas = result.states[host.pk]
    await get_channel_layer().group_send(PUSH_GROUP, {"type": "desired.pushes", "hosts": [host.pk + 1000, host.pk]})
    sent = json.loads(await comm.receive_from(timeout=5))
    assert (sent["type"], sent["generation"], sent["replicas"]) == ("desired_state", generation, json.loads(replicas))
    assert [r["deployment"] for r in sent["replicas"]] == ["chat"]
    # Named again as new, the state it already sent is dropped; named as a resend (never acknowledged), it goes out.
    await get_channel_layer().group_send(PUSH_GROUP, {"type": "desired.pushes", "hosts": [host.pk]})
    assert await comm.receive_nothing(timeout=0.3)
    await get_channel_layer().group_send(PUSH_GROUP, {"type": "desired.pushes", "hosts": [], "again": [host.pk]})
    again = json.loads(await comm.receive_from(timeout=5))
    assert (again["generation"], again["replicas"]) == (generation, json.loads(replicas))
    await comm.disconnect()


async def test_a_superseded_link_here_hands_the_pushes_to_the_newer_one(token):
    from console.control.hub import hub

    first, _ = await connect(token)
    await first.send_to(text_data=json.dumps(hello()))
    await first.receive_from(timeout=5)
    second, _ = await connect(token)
    await second.send_to(text_data=json.dumps(hello()))
    await second.receive_from(timeout=5)
    assert await first.receive_output(timeout=5) == {"type": "websocket.close", "code": 4409}
    host = await database_sync_to_async(Host.objects.get)(name="h1")
    await hub().push_desired([host.pk], {host.pk: (9, [])})
    assert json.loads(await second.receive_from(timeout=5))["generation"] == 9
    await first.disconnect()  # the old link's end leaves the newer one held
    await hub().push_desired([host.pk], {host.pk: (10, [])})
    assert json.loads(await second.receive_from(timeout=5))["generation"] == 10
    await second.disconnect()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: on SQLite every database call shares "
                    "that one thread (runs in the PostgreSQL + Redis pass)")
async def test_an_agent_connects_and_says_hello_while_the_database_thread_is_busy(token):
    """A reconnecting fleet's handshakes and hellos do not queue behind a scheduler pass on Channels' one
    thread-sensitive database thread (held here until the hello is answered)."""
    import threading

    from asgiref.sync import sync_to_async

    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)(10))
    try:
        await asyncio.sleep(0.1)
        comm, connected = await connect(token)
        assert connected
        await comm.send_to(text_data=json.dumps(hello()))
        assert json.loads(await comm.receive_from(timeout=5))["type"] == "desired_state" and not busy.done()
    finally:
        release.set()
        await busy
    await comm.disconnect()
