"""The wire protocol between console and agent (pydantic, a `type` discriminator, versioned).

Imports nothing else from the project so the console can depend on it alone.
"""

from agent.protocol.messages import (
    BUILTIN_ENGINE,
    ENDED,
    LIVE_STATES,
    LOADED,
    LOADING,
    MAX_LOG_LINES,
    ON_DEVICE,
    PROTOCOL_VERSION,
    REPLICA_STATES,
    RESTING,
    Ack,
    AdapterStatus,
    AgentMessage,
    ConsoleMessage,
    DeploymentServing,
    DesiredAdapter,
    DesiredReplica,
    DesiredState,
    EngineInfo,
    ErrorReply,
    GpuInfo,
    Hello,
    HostReport,
    LogsReply,
    LogsRequest,
    Measurement,
    ReplicaStatus,
    SleepWake,
    dump,
    parse_agent_message,
    parse_console_message,
)

# On an agent's refusal that no replica of that model here acted on (none serves it now: sleeping, draining,
# loading): the gateway may send the request to another replica instead.
UNSERVED_HEADER = "X-ModelGrid-Unserved"
# On each request the gateway sends: the replica it picked. The agent serves that one or refuses, unserved.
REPLICA_HEADER = "X-ModelGrid-Replica-Id"
# The one version of every model that v2 paths may name (/v2/models/{name}/versions/1/...), as in a Triton
# repository with one version directory; the gateway and the agent refuse any other in unknown_version's words.
MODEL_VERSION = "1"
# Triton's extensions that the agents and the gateway serve ("model_repository" is not claimed: its index is served,
# its load and unload are not: the scheduler decides what loads).
TRITON_EXTENSIONS = ("binary_tensor_data", "model_configuration")


def unknown_version(name: str, version: str | None) -> str | None:
    """Why a v2 path's version of model `name` is refused; None when it names none, or the one there is."""
    if version is None or version == MODEL_VERSION:
        return None
    return f"model {name!r} has no version {version[:40]!r}: each model here has one version, {MODEL_VERSION!r}"


__all__ = [
    "UNSERVED_HEADER",
    "REPLICA_HEADER",
    "MODEL_VERSION",
    "TRITON_EXTENSIONS",
    "unknown_version",
    "ENDED",
    "BUILTIN_ENGINE",
    "LIVE_STATES",
    "LOADED",
    "LOADING",
    "MAX_LOG_LINES",
    "ON_DEVICE",
    "PROTOCOL_VERSION",
    "REPLICA_STATES",
    "RESTING",
    "Ack",
    "AdapterStatus",
    "AgentMessage",
    "ConsoleMessage",
    "DeploymentServing",
    "DesiredAdapter",
    "DesiredReplica",
    "DesiredState",
    "EngineInfo",
    "ErrorReply",
    "GpuInfo",
    "Hello",
    "HostReport",
    "LogsReply",
    "LogsRequest",
    "Measurement",
    "ReplicaStatus",
    "SleepWake",
    "dump",
    "parse_agent_message",
    "parse_console_message",
]
