"""The browsers' websocket: the live dashboard (session auth, origin-checked). The agent link is
console/control/agent_link.py."""

from __future__ import annotations

import logging

from channels.exceptions import StopConsumer
from django.conf import settings

from console.control.consumer import Consumer
from console.realtime import browsers

log = logging.getLogger("modelgrid.realtime")


class DashboardConsumer(Consumer):
    """A logged-in browser's live dashboard: the page of hosts and deployments it is viewing (its websocket URL's
    query string is the page's own), pushed again whenever the fleet changes. It listens on no channel of its own:
    its process hears changes once and renders each page once for all its sockets (console/realtime/browsers.py),
    which also admits it under the caps and checks its access again when membership or the session changes."""

    channel_layer_alias = None  # no channel per socket (browsers.py hears for every socket of the process)
    session_key: str = ""
    access: browsers.Access
    query: str = ""

    async def connect(self):
        key = self.scope.get("cookies", {}).get(settings.SESSION_COOKIE_NAME)
        await browsers.listening()
        since = browsers.rechecks()  # a change of access announced while this one is read is not missed
        access = await browsers.access(key)
        if access is None:
            await self.close()  # before accept: the handshake is refused with HTTP 403
            return
        self.session_key, self.access = key, access
        self.query = self.scope.get("query_string", b"").decode("latin-1")
        await self.accept()
        # Admitted after the accept: its first page may be pushed the moment it is seated.
        refusal = browsers.admit(self, since)
        if refusal is not None:
            # Accepted to be closed with a code and a reason: a refused handshake reads as an abnormal closure
            # (1006), which the page would retry without end, and which carries no reason to show.
            log.info("browser socket of user %d refused: %s", access.user_id, refusal)
            await self.close(code=browsers.TOO_MANY, reason=refusal)

    async def websocket_disconnect(self, message):
        # Not Channels' own: that one sweeps stale database connections on its one database thread, per socket.
        browsers.leave(self)
        raise StopConsumer()

    async def receive(self, text_data=None, bytes_data=None):
        pass  # the dashboard only listens

    async def show(self, html: str) -> None:
        """Push a rendered page (browsers.py)."""
        await self.send(text_data=html)

    async def end(self, code: int, reason: str) -> None:
        """Close the socket for `reason` (browsers.py: its session signs no one in any more)."""
        log.info("browser socket of user %d closed: %s", self.access.user_id, reason)
        await self.close(code=code, reason=reason)
