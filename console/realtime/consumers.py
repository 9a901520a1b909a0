"""Websocket consumers: the agent link (token auth, no browser origin check) and the live
dashboard (session auth, origin-checked)."""

from __future__ import annotations

import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string
from pydantic import ValidationError

from agent.protocol import (
    PROTOCOL_VERSION,
    Ack,
    ErrorReply,
    Hello,
    HostReport,
    ReplicaStatus,
    dump,
    parse_agent_message,
)
from console.deployments.desired import desired_state
from console.fleet import intake
from console.fleet.models import AgentCredential, Host
from console.fleet.views import grid_context
from console.realtime.notify import DASHBOARD_GROUP, host_group, refresh_dashboards, refresh_gateways

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


class AgentConsumer(AsyncWebsocketConsumer):
    """One connected agent. The first message must be a hello; then reports, statuses, acks."""

    host: Host | None = None
    credential: AgentCredential | None = None

    async def connect(self):
        token = bearer_token(self.scope)
        self.credential = await database_sync_to_async(AgentCredential.authenticate)(token) if token else None
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
            await self.channel_layer.group_discard(host_group(self.host.pk), self.channel_name)
            await database_sync_to_async(intake.mark_disconnected)(self.host)
            log.info("agent %s disconnected (code %s)", self.host.name, code)
            await refresh_gateways()
            await refresh_dashboards()

    async def receive(self, text_data=None, bytes_data=None):
        raw = text_data if text_data is not None else bytes_data
        if raw is None or len(raw) > MAX_MESSAGE_BYTES:
            await self.reply_error("message missing or larger than 1 MiB")
            return
        try:
            message = parse_agent_message(raw)
        except ValidationError as e:
            await self.reply_error(_validation_summary(e))
            return
        try:
            await self._apply(message)
        except intake.Refused as e:
            await self.reply_error(str(e))
        except Exception as e:
            # A message that passed validation and still could not be applied (a database error): the log
            # keeps the traceback, the agent hears which message failed, and the link stays open for the next.
            log.exception("agent %s: applying its %s failed", self._name(), message.type)
            await self.reply_error(f"the console could not apply this {message.type} ({type(e).__name__}); "
                                   "its log has the details")

    async def _apply(self, message: Hello | HostReport | ReplicaStatus | Ack) -> None:
        # Private: channel-layer events dispatch to public methods by name, and none may reach this one.
        if isinstance(message, Hello):
            await self.on_hello(message)
        elif self.host is None:
            await self.reply_error(f"send a hello first (got {message.type})")
        elif isinstance(message, HostReport):
            await database_sync_to_async(intake.apply_report)(self.host, message)
            await refresh_dashboards()
        elif isinstance(message, ReplicaStatus):
            await database_sync_to_async(intake.apply_replica_status)(self.host, message)
            if not message.loaded_bytes or message.state != "loading":  # not every progress tick
                await refresh_gateways()  # a replica that became ready takes the requests waiting for it
            await refresh_dashboards()
        elif isinstance(message, Ack):
            await database_sync_to_async(intake.apply_ack)(self.host, message)

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
            self.host = await database_sync_to_async(intake.register_hello)(self.credential, hello)
        except intake.RefusedHello as e:
            await self.reply_error(str(e))
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(host_group(self.host.pk), self.channel_name)
        log.info("agent %s connected from %s with %d GPU(s)", hello.host, hello.endpoint, len(hello.gpus))
        await self.desired_push({})
        await refresh_dashboards()

    async def desired_push(self, event):
        """Channel-layer event: read this host's desired state from the database and send it whole."""
        state = await database_sync_to_async(self._desired)()
        await self.send(text_data=dump(state))

    def _desired(self):
        self.host.refresh_from_db(fields=["generation"])
        return desired_state(self.host)


class DashboardConsumer(AsyncWebsocketConsumer):
    """Pushes the re-rendered GPU grid to logged-in browsers whenever the fleet changes."""

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        await self.dashboard_update({})

    async def disconnect(self, code):
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        pass  # the dashboard only listens

    async def dashboard_update(self, event):
        html = await database_sync_to_async(lambda: render_to_string("fleet/_live.html", grid_context()))()
        await self.send(text_data=html)
