"""A replica's worker log, read from its agent over the agent's own link (nothing new is opened to the network).

The caller makes a channel of its own on the channel layer, sends a logs request with that channel to its host's
group, and waits for the one answer the agent's link (console/control/agent_link.py) forwards there. A channel from
`new_channel()` belongs to the process that made it: with the Redis layer the answer comes back to the requesting
process whichever console process holds the agent's link, and with the in-memory layer both are the one process.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from channels.layers import get_channel_layer

from agent.protocol import MAX_LOG_LINES
from console.control.layer import host_group
from console.dbthreads import own_thread
from console.deployments.models import Replica
from console.deployments.services import get_deployment
from console.errors import AgentRefused, AgentTimeout, Conflict, NotFound, Unavailable

log = logging.getLogger("modelgrid.realtime")

REPLY_TIMEOUT = 5.0  # seconds an agent has to answer
LOGS_REQUEST = "logs.request"  # channel-layer event to an agent's link: AgentConsumer.logs_request
LOGS_REPLY = "logs.reply"  # what the link sends to the caller's channel


async def replica_logs(deployment: str, index: int, tail: int = 100) -> list[str]:
    """The last `tail` lines (1 to 1,000) the workers of replica `index` of `deployment` wrote, oldest first.
    Raises a DomainError that says why not: no such replica (404), not placed (409), its host not connected (503),
    its agent refused (502) or did not answer in time (504)."""
    replica_id, host_id, host = await own_thread(_placement)(deployment, index)
    layer = get_channel_layer()
    request_id = uuid.uuid4().hex
    try:
        reply_channel = await layer.new_channel()
        await layer.group_send(host_group(host_id), {
            "type": LOGS_REQUEST, "request_id": request_id, "replica_id": replica_id,
            "tail": max(1, min(int(tail), MAX_LOG_LINES)), "reply_channel": reply_channel,
        })
        async with asyncio.timeout(REPLY_TIMEOUT):
            while (reply := await layer.receive(reply_channel)).get("request_id") != request_id:
                pass  # not ours: a channel is never reused, so this cannot happen, but a stray is never taken
    except TimeoutError:
        raise AgentTimeout(f"the agent on {host} did not answer within {REPLY_TIMEOUT:g} s: it may be busy or "
                           "reconnecting (try again), or older than this console and unable to serve logs") from None
    except Exception as e:  # the channel layer is down (Redis restarting)
        log.warning("logs of %s#%d: channel layer error (%s: %s)", deployment, index, type(e).__name__, e)
        raise Unavailable(f"the console cannot reach the agent on {host} now: its channel layer failed "
                          f"({type(e).__name__}); try again shortly") from None
    if reply["busy"]:
        raise Unavailable(reply["busy"])
    if reply["error"]:
        raise AgentRefused(f"the agent on {host} says: {reply['error']}")
    return list(reply["lines"])


def _placement(deployment: str, index: int) -> tuple[int, int, str]:
    """(replica id, host id, host name) of a replica whose host is connected, or the refusal that says why not."""
    dep = get_deployment(deployment)
    replica = Replica.objects.select_related("host").filter(deployment=dep, index=index).first()
    if replica is None:
        indexes = list(dep.replica_set.order_by("index").values_list("index", flat=True))
        have = f"its replicas are {', '.join(map(str, indexes))}" if indexes else "it has no replicas now"
        raise NotFound(f"deployment {deployment!r} has no replica {index} ({have})")
    host = replica.host
    if host is None:
        raise Conflict(f"replica {index} of {deployment!r} is not placed on any host, so no worker of it has written "
                       f"a log yet{': ' + replica.reason if replica.reason else ''}")
    if not host.connected:
        raise Unavailable(f"host {host.name} is {host.lifecycle}: its agent is not connected, so the log of replica "
                          f"{index} of {deployment!r} cannot be read until it reconnects")
    return replica.pk, host.pk, host.name
