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
