"""Socket helpers shared by the connection-bound tests."""

import asyncio


async def closed(reader: asyncio.StreamReader, within: float = 5) -> bool:
    """Whether the server closed this connection within `within` seconds (a read still waiting then: open)."""
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def serve_on_loopback(runner) -> str:
    """Start an aiohttp AppRunner on a free loopback port; its base URL."""
    from aiohttp import web

    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
