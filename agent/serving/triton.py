"""Triton's model configuration and repository index extensions over the agent's replicas, and the one model
version each deployment has: what `perf_analyzer` and `tritonclient`'s `get_model_config` and
`get_model_repository_index` read.

A deployment is one version of its model ("1"), as a Triton repository with one version directory: the
`/versions/1/...` routes answer as the plain ones, any other version is a 404 naming the one there is.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agent.protocol import LOADING, MODEL_VERSION, unknown_version
from agent.serving.batching import BatchSettings
from agent.serving.body import parse_json, read_body
from agent.serving.dispatch import DISPATCHER, BadInput, ServingError, UnknownModel, not_ready_text, serves
from agent.serving.tensors import MAX_REQUEST_TOKENS
from agent.workers.spec import SIGNATURES, Signature

MAX_INDEX_BODY = 4096  # an index request is {"ready": true} at most


def check_version(request: web.Request, name: str) -> None:
    """UnknownModel (404) when the path names a version other than the one each model has."""
    refused = unknown_version(name, request.match_info.get("version"))
    if refused is not None:
        raise UnknownModel(refused)


def describing(replicas: tuple[Any, ...]) -> Any:
    """The replica that describes the model: a ready one (it knows its output width), else any."""
    return next((h for h in replicas if h.state == "ready"), replicas[0])


def output_shape(signature: Signature, width: int) -> list[int]:
    """The output's v2 shape, batch first: [-1, -1, width] for a causal LM's logits, [-1, width] for embeddings."""
    return [-1, -1, width] if signature.output_rank == 3 else [-1, width]


def max_rows(max_positions: int | None) -> int:
    """Rows one request may carry at the model's full sequence length (rows x sequence is what is bounded)."""
    return max(1, MAX_REQUEST_TOKENS // max_positions) if max_positions else MAX_REQUEST_TOKENS


def config_type(datatype: str) -> str:
    """A v2 datatype as model_config.proto names it (BYTES is TYPE_STRING there)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model_config(name: str, task: str, width: int, max_positions: int | None, batching: BatchSettings) -> dict:
    """The model's configuration as Triton's ModelConfig in JSON. With max_batch_size above 0 every dims
    leaves out the batch dimension, as Triton's do; the sequence dimension is variable (-1)."""
    signature = SIGNATURES[task]
    rows = max_rows(max_positions)
    parameters = {"task": task, "max_request_tokens": str(MAX_REQUEST_TOKENS)}
    if max_positions:
        parameters["max_sequence_length"] = str(max_positions)
    return {
        "name": name,
        "platform": "pytorch",
        "backend": "pytorch",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": rows,
        "input": [{"name": t.name, "data_type": config_type(t.datatype), "format": "FORMAT_NONE", "dims": [-1],
                   "is_shape_tensor": False, "optional": not t.required} for t in signature.inputs],
        "output": [{"name": signature.output.name, "data_type": config_type(signature.output.datatype),
                    "dims": output_shape(signature, width)[1:], "is_shape_tensor": False}],
        # The replica's batcher: a batch is cut at this many rows or this long after its first request.
        "dynamic_batching": {"preferred_batch_size": [min(batching.max_batch_size, rows)],
                             "max_queue_delay_microseconds": round(batching.max_delay * 1_000_000)},
        "model_transaction_policy": {"decoupled": False},
        "parameters": {key: {"string_value": value} for key, value in parameters.items()},
    }


def index_entry(name: str, replicas: tuple[Any, ...]) -> dict:
    """One model in the repository index: READY when a replica here serves it, LOADING while one is on its
    way, else UNAVAILABLE; the reason names each replica's state."""
    if any(serves(h) for h in replicas):
        state, reason = "READY", ""
    else:
        state = "LOADING" if any(h.state in LOADING for h in replicas) else "UNAVAILABLE"
        reason = not_ready_text(name, replicas)
    return {"name": name, "version": MODEL_VERSION, "state": state, "reason": reason}


async def ready_only(request: web.Request) -> bool:
    """An index request's "ready" (false when the body is empty, as tritonclient sends it); BadInput otherwise."""
    raw = await read_body(request, max_bytes=MAX_INDEX_BODY)
    if not raw.strip():
        return False
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise BadInput('the index request body must be a JSON object, such as {"ready": true}, or empty')
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise BadInput(f"'ready' must be true or false, got {str(ready)[:40]!r}")
    return ready


async def repository_index(request: web.Request) -> web.Response:
    """POST /v2/repository/index: the models this agent serves (deployments and adapters), by name."""
    only_ready = await ready_only(request)
    dispatcher = request.app[DISPATCHER]
    entries = []
    for name, _ in dispatcher.models():
        try:
            replicas = dispatcher.route(name).replicas
        except ServingError:  # an adapter's name that several models share: no one model answers to it
            continue
        entries.append(index_entry(name, replicas))
    entries.sort(key=lambda e: e["name"])
    return web.json_response([e for e in entries if e["state"] == "READY" or not only_ready])
