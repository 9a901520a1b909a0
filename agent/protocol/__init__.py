"""The wire protocol between console and agent (pydantic, a `type` discriminator, versioned).

Imports nothing else from the project so the console can depend on it alone.
"""

from agent.protocol.messages import (
    PROTOCOL_VERSION,
    REPLICA_STATES,
    Ack,
    AdapterStatus,
    AgentMessage,
    ConsoleMessage,
    DeploymentServing,
    DesiredAdapter,
    DesiredReplica,
    DesiredState,
    ErrorReply,
    GpuInfo,
    Hello,
    HostReport,
    Measurement,
    ReplicaStatus,
    SleepWake,
    dump,
    parse_agent_message,
    parse_console_message,
)

__all__ = [
    "PROTOCOL_VERSION",
    "REPLICA_STATES",
    "Ack",
    "AdapterStatus",
    "AgentMessage",
    "ConsoleMessage",
    "DeploymentServing",
    "DesiredAdapter",
    "DesiredReplica",
    "DesiredState",
    "ErrorReply",
    "GpuInfo",
    "Hello",
    "HostReport",
    "Measurement",
    "ReplicaStatus",
    "SleepWake",
    "dump",
    "parse_agent_message",
    "parse_console_message",
]
