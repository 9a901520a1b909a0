"""Serving the inference application: a bounded number of connections, idle ones closed (agent.serving.connections)."""

from __future__ import annotations

from aiohttp import web

from agent.serving.connections import GuardedRunner

KEEPALIVE_S = 30.0


async def start_server(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `app` on host:port (port 0 picks a free one); returns the runner and the real port."""
    # handler_cancellation: a client that goes away cancels its handler, and so its generation in the worker.
    # keepalive_timeout also closes a connection that sends no complete request within it (aiohttp's default is an
    # hour); the gateway's pool drops its idle connections after 15 s, well before.
    runner = GuardedRunner(app, access_log=None, handler_cancellation=True, keepalive_timeout=KEEPALIVE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, runner.addresses[0][1]

