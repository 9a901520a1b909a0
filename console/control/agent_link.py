"""The agent link: one websocket per connected agent (token auth, no browser origin check), its messages handed to
intake in order, and its host's desired state pushed to it (console/control/hub.py)."""

from __future__ import annotations

import asyncio
import json
import logging

from pydantic import ValidationError

from agent.protocol import (
    PROTOCOL_VERSION,
    Ack,
    ErrorReply,
    Hello,
    HostReport,
    LogsReply,
    LogsRequest,
    ReplicaStatus,
    dump,
    parse_agent_message,
)
from console.control.consumer import Consumer
from console.control.desired import desired_text, stored_states
from console.control.hub import hub, refresh_dashboards, wake_scheduler_async
from console.control.layer import host_group, refresh_gateways
from console.dbthreads import own_thread
from console.fleet.logs import LOGS_REPLY
from console.fleet.models import AgentCredential, Host
from console.intake import stages as intake
from console.intake.batcher import batcher

log = logging.getLogger("modelgrid.realtime")
MAX_MESSAGE_BYTES = 1 << 20


def bearer_token(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _validation_summary(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "message"
    return f"invalid message: {where}: {first['msg']} ({error.error_count()} error(s))"


IN_FLIGHT = 32  # an agent link's messages handed to the batcher and not yet applied; more waits
LOG_REQUESTS = 64  # logs requests one link may have waiting for its agent's answer; more are refused at once
LOG_REQUEST_TTL = 30.0  # seconds a logs request is remembered (its caller waits far less: console/fleet/logs.py)


class AgentConsumer(Consumer):
    """One connected agent. The first message must be a hello; then reports, statuses, acks, and answers to the
    logs requests this link sent it. Each hello opens a new link epoch for its host: an older link of the same
    host is closed, and its close changes nothing."""

    host: Host | None = None
    credential: AgentCredential | None = None
    epoch: int = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._in_flight = asyncio.Semaphore(IN_FLIGHT)
        self._replies: set[asyncio.Task] = set()
        self._last: asyncio.Future | None = None  # the link's latest message handed to the batcher
        # Logs requests sent to the agent and not answered: request id -> (reply channel, replica id, expiry).
        self._log_requests: dict[str, tuple[str, int, float]] = {}
        self._sent_generation = -1  # the newest desired state this link sent its agent

    async def connect(self):
        token = bearer_token(self.scope)
        # Its own thread (PostgreSQL): a reconnecting fleet's handshakes do not queue behind a scheduler pass.
        self.credential = await own_thread(AgentCredential.authenticate)(token) if token else None
        if self.credential is None:
            client = self.scope.get("client") or ("?", 0)
            log.warning(
                "refused agent connection from %s:%s: %s",
                client[0],
                client[1],
                "bad token" if token else "no bearer token",
            )
            await self.close()  # before accept: the handshake is refused with HTTP 403
            return
        await self.accept()

    async def disconnect(self, code):
        if self.host is not None:
            hub().release(self.host.pk, self)
            try:
                await self.channel_layer.group_discard(host_group(self.host.pk), self.channel_name)
            except Exception as e:  # the channel layer is down: its group entry expires on its own
                log.warning("agent %s: cannot leave its host's group (%s: %s)", self.host.name, type(e).__name__, e)
            # Through the batcher: ordered after this link's last messages, and a no-op if a newer link of
            # the host took over. The host becomes unknown (its lease lapsed early), never gone: its replicas
            # stay where they are until the eviction timeout.
            await batcher().submit(intake.Item(self.host.pk, self.host.name, intake.Closed(self.epoch)))
            log.info("agent %s disconnected (code %s, link epoch %d)", self.host.name, code, self.epoch)
            await refresh_gateways()
            await refresh_dashboards()

    async def receive(self, text_data=None, bytes_data=None):
        raw = text_data if text_data is not None else bytes_data
        if raw is None or len(raw) > MAX_MESSAGE_BYTES:
            await self._reply_in_order("message missing or larger than 1 MiB")
            return
        try:
            message = parse_agent_message(raw)
        except ValidationError as e:
            await self._reply_in_order(_validation_summary(e))
            return
        try:
            await self._apply(message)
        except Exception as e:
            # A message that passed validation and still could not be applied (a database error): the log
            # keeps the traceback, the agent hears which message failed, and the link stays open for the next.
            log.exception("agent %s: applying its %s failed", self._name(), message.type)
            await self.reply_error(f"the console could not apply this {message.type} ({type(e).__name__}); "
                                   "its log has the details")

    async def _apply(self, message: Hello | HostReport | ReplicaStatus | Ack) -> None:
        # Private: channel-layer events dispatch to public methods by name, and none may reach this one.
        if isinstance(message, Hello):
            await self._drained()
            await self.on_hello(message)
        elif self.host is None:
            await self.reply_error(f"send a hello first (got {message.type})")
        elif isinstance(message, LogsReply):
            await self._answer_logs(message)  # an answer to one caller, nothing to store: not through the batcher
        else:
            # Handed over without waiting for it to be applied: the next message is read at once (an ack is
            # not held up behind a report's batch). The batcher keeps the link's order; a bound on messages in
            # flight keeps a link that outruns the database from queueing without limit.
            if isinstance(message, Ack):
                hub().acknowledged(self.host.pk, message.generation)
            await self._in_flight.acquire()
            applied = batcher().enqueue(intake.Item(self.host.pk, self.host.name, message))
            applied.add_done_callback(self._applied)
            self._last = applied

    async def _drained(self) -> None:
        """Until the link's messages handed to the batcher are applied: what the batcher never sees (a hello,
        a refusal) then happens in the order the agent sent it."""
        if self._last is not None and not self._last.done():
            await asyncio.wait([self._last])

    async def _reply_in_order(self, reason: str) -> None:
        await self._drained()
        await self.reply_error(reason)

    def _applied(self, applied) -> None:
        self._in_flight.release()
        if not applied.cancelled() and applied.result().error:
            task = asyncio.ensure_future(self.reply_error(applied.result().error))
            self._replies.add(task)  # held until done, or it could be collected mid-send
            task.add_done_callback(self._replies.discard)

    def _name(self) -> str:
        return self.host.name if self.host else (self.credential.host_name if self.credential else "?")

    async def reply_error(self, reason: str) -> None:
        log.warning("agent %s: %s", self._name(), reason)
        await self.send(text_data=dump(ErrorReply(reason=reason)))

    async def on_hello(self, hello: Hello) -> None:
        if hello.protocol != PROTOCOL_VERSION:
            await self.reply_error(
                f"protocol {hello.protocol} is not supported; this console speaks {PROTOCOL_VERSION}"
            )
            await self.close(code=4400)
            return
        try:
            # Host and GPU rows only, as intake's hosts stage (console/dbthreads.py): its own thread is safe.
            self.host, self.epoch = await own_thread(intake.register_hello)(self.credential, hello)
        except intake.RefusedHello as e:
            await self.reply_error(str(e))
            await self.close(code=4403)
            return
        group = host_group(self.host.pk)
        try:
            await self.channel_layer.group_send(group, {"type": "link.superseded", "epoch": self.epoch})
            await self.channel_layer.group_add(group, self.channel_name)
        except Exception as e:
            # Outside its host's group the link would never hear a desired state: end it, and the agent
            # reconnects (the channel layer is down, say Redis restarting).
            log.warning("agent %s: cannot join its host's group (%s: %s); closing the link", hello.host,
                        type(e).__name__, e)
            await self.close(code=1011)
            return
        await hub().listen_for_pushes(deliver)  # this process hears the pushes another process's scheduler names
        hub().hold(self.host.pk, self)
        log.info("agent %s connected from %s with %d GPU(s) (link epoch %d)", hello.host, hello.endpoint,
                 len(hello.gpus), self.epoch)
        await self.desired_push({})
        await wake_scheduler_async()  # a host (back) with its GPUs: room the scheduler may plan with
        await refresh_dashboards()

    async def link_superseded(self, event):
        """Channel-layer event: a newer link of this host said hello (on any console process); this one ends."""
        if self.host is not None and event["epoch"] > self.epoch:
            log.warning("agent %s: link epoch %d superseded by epoch %d; closing the old link", self.host.name,
                        self.epoch, event["epoch"])
            hub().release(self.host.pk, self)
            await self.close(code=4409)

    async def link_revoked(self, event):
        """Channel-layer event: this host's agent token was rotated (on any console process). A link that
        authenticated with the token before ends; the agent must come back with the new one."""
        if self.credential is None:
            return
        current = await own_thread(AgentCredential.objects.filter(pk=self.credential.pk,
                                                                  token_hash=self.credential.token_hash).exists)()
        if not current:
            log.warning("agent %s: its token was rotated; closing the link made with the old one", self._name())
            if self.host is not None:
                hub().release(self.host.pk, self)
            await self.close(code=4401)

    async def logs_request(self, event):
        """Channel-layer event (console/fleet/logs.py): ask this link's agent for a replica's log; its answer goes to
        the event's reply channel."""
        loop = asyncio.get_running_loop()
        self._log_requests = {k: v for k, v in self._log_requests.items() if v[2] > loop.time()}
        if len(self._log_requests) >= LOG_REQUESTS:
            await self._deliver_logs(event["reply_channel"], event["request_id"], [], busy=(
                f"the link to the agent on {self.host.name} already has {LOG_REQUESTS} logs requests waiting for "
                "an answer; try again in a few seconds"))
            return
        request = LogsRequest(request_id=event["request_id"], replica_id=event["replica_id"], tail=event["tail"])
        self._log_requests[request.request_id] = (event["reply_channel"], request.replica_id,
                                                  loop.time() + LOG_REQUEST_TTL)
        await self.send(text_data=dump(request))

    async def _answer_logs(self, reply: LogsReply) -> None:
        # Only an answer to a request this link sent is passed on, and only to the channel that asked: an agent
        # names neither the channel nor the event type, so it cannot write anywhere else.
        asked = self._log_requests.get(reply.request_id)
        if asked is None or asked[1] != reply.replica_id:
            log.warning("agent %s: dropped a logs reply to no request of this link (request id %r, replica %d)",
                        self._name(), reply.request_id, reply.replica_id)
            return
        del self._log_requests[reply.request_id]
        await self._deliver_logs(asked[0], reply.request_id, reply.lines, reply.error)

    async def _deliver_logs(self, channel: str, request_id: str, lines: list[str], error: str = "",
                            busy: str = "") -> None:
        # `error` is the agent's word; `busy` the console's own refusal, the request never having reached the agent.
        try:
            await self.channel_layer.send(channel, {"type": LOGS_REPLY, "request_id": request_id, "lines": lines,
                                                    "error": error, "busy": busy})
        except Exception as e:  # the channel layer is down: the caller times out and says so
            log.warning("agent %s: cannot pass a logs reply on (%s: %s)", self._name(), type(e).__name__, e)

    async def desired_push(self, event):
        """A push (handed over by the hub, console/control/hub.py, or a channel-layer event to the host's group): send
        this host's desired state, whole: the one the event carries (the replicas' JSON text as the pass built or
        stored it: no read of it), unless this link sent that generation or a newer one already; else the one stored,
        read now and sent whatever was sent before (a resend)."""
        if "replicas_json" in event:
            generation, replicas = event["generation"], event["replicas_json"]
            if generation <= self._sent_generation:
                return
        else:
            generation, replicas = await own_thread(desired_text)(self.host)  # a read: it need not wait for a pass
        # The secret of the token this link authenticated with: a rotation ends the link (link_revoked), so it is
        # the one the gateway reads too, and no push reads the database for it.
        secret = json.dumps(self.credential.gateway_secret)
        # The replicas are the JSON text of DesiredReplica models the pass stored, spliced in as it is: not
        # validated or serialized again here, on the loop every agent's messages need.
        text = (f'{{"type":"desired_state","generation":{int(generation)},"replicas":{replicas},'
                f'"gateway_secret":{secret}}}')
        self._sent_generation = max(self._sent_generation, generation)
        if self.host is not None:
            # Due from before the send: the ack may be read while this send still waits to drain.
            hub().sent(self.host.pk, generation)
        await self.send(text_data=text)


async def deliver(host_ids: list[int], again: list[int] = ()) -> None:
    """Pushes named by another console process: send the links held here of `host_ids` their stored desired states,
    read for all of them at once, and have those of `again` read and send theirs whole (a link drops a stored state
    it has sent already; a resend must go out regardless)."""
    links = hub()
    here = [h for h in host_ids if links.held(h) is not None]
    try:
        states = await own_thread(stored_states)(here) if here else {}
    except Exception as e:  # the database is down, say: each link reads its own (and fails alike, or not)
        log.warning("reading stored desired states failed (%s: %s); each link reads its own", type(e).__name__, e)
        states = {}
    await asyncio.gather(*(links.push(h, states.get(h)) for h in here),
                         *(links.push(h) for h in again if links.held(h) is not None))
