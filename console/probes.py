"""The console's liveness and readiness probes, `/livez` and `/readyz`, for orchestrators and load balancers.

Open (a kubelet has no token) and answered before Django, so ALLOWED_HOSTS, SSL redirects and sessions do not
apply to a probe addressed to the pod's IP; the bodies say nothing but the verdict.

- `/livez`: the process's event loop answers. Restarting a console whose database is down would not help it.
- `/readyz`: this console can serve: its database answers `SELECT 1` within READY_TIMEOUT_S. (The gateway's
  `/v2/health/ready` says only that its first fleet snapshot was read, and stays ready after the database goes.)
  The query runs on a thread of its own, so it never queues behind a scheduler pass, and at most one runs at a
  time: probes that arrive while one is under way wait for its answer, so a hung database costs one thread.
"""

from __future__ import annotations

import asyncio
import json
import logging

from django.db import connection

from console.dbthreads import apart, dedicated_thread

LIVE_PATH, READY_PATH = "/livez", "/readyz"
READY_TIMEOUT_S = 2.0  # below the readiness probe's timeoutSeconds (3 in the Helm chart)

log = logging.getLogger("modelgrid.probes")


def _select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


class DatabaseCheck:
    """Whether the database answers; one query in flight at most."""

    def __init__(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._query = apart(_select_one, dedicated_thread("readyz"))
        self._inflight: asyncio.Future | None = None
        self._was_ready = True  # log each change of verdict once, not every probe

    async def __call__(self) -> bool:
        if (self._inflight is None or self._inflight.done()
                or self._inflight.get_loop() is not asyncio.get_running_loop()):
            self._inflight = asyncio.ensure_future(self._query())
        try:
            await asyncio.wait_for(asyncio.shield(self._inflight), self.timeout)
            ready, why = True, ""
        except TimeoutError:
            ready, why = False, f"the database did not answer within {self.timeout:g} s"
        except Exception as e:  # noqa: BLE001 (any failure to query is "not ready"; the log says which)
            ready, why = False, f"the database cannot be queried: {type(e).__name__}: {e}"
        if ready != self._was_ready:
            (log.info if ready else log.warning)("readiness: %s", "ready" if ready else f"not ready: {why}")
            self._was_ready = ready
        return ready


class Probes:
    """An ASGI wrapper: GET or HEAD /livez and /readyz are answered here, everything else goes to `app`."""

    def __init__(self, app, ready: DatabaseCheck | None = None) -> None:
        self.app = app
        self.ready = ready or DatabaseCheck()

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in (LIVE_PATH, READY_PATH):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, {"error": "method not allowed"}, scope["method"], (b"allow", b"GET, HEAD"))
        elif path == LIVE_PATH:
            await _answer(send, 200, {"live": True}, scope["method"])
        elif await self.ready():
            await _answer(send, 200, {"ready": True}, scope["method"])
        else:
            await _answer(send, 503, {"ready": False}, scope["method"])


async def _answer(send, status: int, body: dict, method: str, *headers: tuple[bytes, bytes]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"), *headers]})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else data})
