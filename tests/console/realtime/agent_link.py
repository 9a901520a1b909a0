"""An agent host `h1` as the consumer tests speak it: its GPU, its hello, and a link past the hello."""

from __future__ import annotations

import json

from channels.testing import WebsocketCommunicator

from agent.protocol import PROTOCOL_VERSION
from console.asgi import application

GiB = 1024**3
GPU = {"index": 0, "uuid": "SIM-h1-0", "name": "Simulated GPU", "total_bytes": 24 * GiB, "used_bytes": 0,
       "simulated": True}
HELLO = {"type": "hello", "protocol": PROTOCOL_VERSION, "host": "h1", "agent_version": "test",
         "endpoint": "http://127.0.0.1:9999", "gpus": [GPU]}


async def linked(token: str) -> WebsocketCommunicator:
    """An agent link with `token`, past its hello (the console answered with the desired state)."""
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, _ = await comm.connect()
    assert connected
    await comm.send_to(text_data=json.dumps(HELLO))
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "desired_state"
    return comm
