"""The agent's HTTP inference server (Open Inference Protocol v2 REST, OpenAI-style /v1, /metrics), open only to
the console's gateway (agent.serving.auth).

Its names are imported when first used: the agent's text processes (agent.serving.textproc) import the chat and
tokenization modules of this package, and should not pay for aiohttp and the inference app on the way."""

from __future__ import annotations

from typing import Any

__all__ = ["GatewayAuth", "make_app", "start_server"]


def __getattr__(name: str) -> Any:
    if name == "make_app":
        from agent.serving.app import make_app

        return make_app
    if name == "GatewayAuth":
        from agent.serving.auth import GatewayAuth

        return GatewayAuth
    if name == "start_server":
        from agent.serving.server import start_server

        return start_server
    raise AttributeError(f"module 'agent.serving' has no attribute {name!r}")
