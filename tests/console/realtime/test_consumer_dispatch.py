"""The consumers' receive loop (Channels' own, console/control/consumer.Consumer dispatching without its
stale-connection sweep): one handler at a time, each source in its order, an error in either ends the connection,
and a closed socket ends the channel layer's receive too."""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import WebsocketCommunicator

from console.control.consumer import Consumer

# The channel layer of the run: in memory, or Redis in the PostgreSQL pass. The database: Channels' disconnect
# handler closes stale connections.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.db_stack]

BOUND = 10.0


class Recording(Consumer):
    """Records what its handlers did; a socket message "hold" waits for `release` before it returns."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.done: list[str] = []
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def connect(self):
        await self.accept()
        await self.send(text_data=self.channel_name)  # so the test can address it through the channel layer

    async def receive(self, text_data=None, bytes_data=None):
        if text_data == "hold":
            self.holding.set()
            await self.release.wait()
        self.done.append(f"socket {text_data}")
        await self.send(text_data=f"socket {text_data}")

    async def note(self, event):
        if event.get("fail"):
            raise RuntimeError("a channel-layer handler failed")
        self.done.append(f"layer {event['n']}")
        await self.send(text_data=f"layer {event['n']}")


async def _connected() -> tuple[WebsocketCommunicator, Recording, str]:
    consumer = Recording()

    async def app(scope, receive, send):  # this very instance, so the test can look at it
        await consumer(scope, receive, send)

    communicator = WebsocketCommunicator(app, "/ws/test/")
    connected, _ = await communicator.connect(timeout=BOUND)
    assert connected
    return communicator, consumer, await communicator.receive_from(timeout=BOUND)


async def test_a_channel_layer_event_waits_for_the_socket_handler_running_and_each_source_keeps_its_order():
    communicator, consumer, channel = await _connected()
    await communicator.send_to(text_data="hold")
    await asyncio.wait_for(consumer.holding.wait(), BOUND)
    for n in (1, 2):
        await consumer.channel_layer.send(channel, {"type": "note", "n": n})
    await communicator.send_to(text_data="after")
    await asyncio.sleep(0.2)  # time enough for the events to arrive, and for a handler to run if none held it back
    assert consumer.done == []
    consumer.release.set()
    said = [await communicator.receive_from(timeout=BOUND) for _ in range(4)]
    assert said[0] == "socket hold"
    # The socket's messages in their order, the layer's in theirs; how the two interleave is the event loop's.
    assert [s for s in said if s.startswith("socket")] == ["socket hold", "socket after"]
    assert [s for s in said if s.startswith("layer")] == ["layer 1", "layer 2"]
    await communicator.disconnect(timeout=BOUND)


async def test_closing_the_socket_ends_the_channel_layer_loop_too():
    communicator, consumer, _ = await _connected()
    await communicator.disconnect(timeout=BOUND)  # times out if the consumer never returns
    assert communicator.future.done() and communicator.future.exception() is None


async def test_an_error_in_a_channel_layer_handler_ends_the_connection():
    communicator, consumer, channel = await _connected()
    await consumer.channel_layer.send(channel, {"type": "note", "fail": True})
    with pytest.raises(RuntimeError, match="a channel-layer handler failed"):
        await communicator.wait(timeout=BOUND)
