"""Open Inference Protocol (v2) JSON tensors to numpy and back, with 400-worthy messages."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.workers.spec import Signature

# The JSON datatypes a v2 client may send, for the message when one is wrong.
V2_DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
)

# Rows x sequence of one request: [64, 256] fits. The worker's forward holds about this many tokens' hidden
# states per layer, and a causal LM's answer is tokens x vocabulary floats (64 MB for 16384 x 1024).
MAX_REQUEST_TOKENS = 16384
ENCODE_CHUNK_VALUES = 1 << 14  # floats per json.dumps call: ~10 ms holding the GIL here


class BadRequest(ValueError):
    """A request that does not follow the protocol or the model's signature; the message names the field."""


@dataclass(frozen=True)
class InferRequest:
    id: str
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]  # requested outputs; empty means all
    adapter: str | None = None  # parameters.adapter: the LoRA adapter to run with


def parse_infer_request(
    body: Any, signature: Signature, *, max_positions: int | None = None, max_tokens: int = MAX_REQUEST_TOKENS
) -> InferRequest:
    """Validate a v2 infer body against the model's signature and build its numpy inputs. Each input's shape
    is checked against `max_positions` (the model's longest sequence; None: no limit) and `max_tokens` (rows
    x sequence) before its data is read, so an oversized request costs no more than its refusal."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with an 'inputs' list")
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list of tensors")
    specs = {t.name: t for t in signature.inputs}
    inputs: dict[str, np.ndarray] = {}
    for position, raw in enumerate(raw_inputs):
        name, array = _parse_input(raw, position, specs, max_positions, max_tokens)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = array
    for spec in signature.inputs:
        if spec.required and spec.name not in inputs:
            raise BadRequest(f"missing input {spec.name!r}")
    ids_shape = inputs[next(s.name for s in signature.inputs if s.required)].shape
    for name, array in inputs.items():
        if array.shape != ids_shape:
            raise BadRequest(f"input {name!r} has shape {list(array.shape)} but input_ids has {list(ids_shape)}")
    return InferRequest(
        id=request_id or uuid.uuid4().hex,
        inputs=inputs,
        outputs=_requested(body, signature),
        adapter=_adapter(body),
    )


def _adapter(body: dict) -> str | None:
    parameters = body.get("parameters")
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    adapter = parameters.get("adapter")
    if adapter is not None and (not isinstance(adapter, str) or not adapter):
        raise BadRequest("parameters.adapter must be an adapter's name (a non-empty string)")
    return adapter


def _parse_input(
    raw: Any, position: int, specs: dict, max_positions: int | None, max_tokens: int
) -> tuple[str, np.ndarray]:
    if not isinstance(raw, dict):
        raise BadRequest(f"inputs[{position}] must be an object with name, shape, datatype and data")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{position}].name must be a non-empty string")
    if name not in specs:
        raise BadRequest(f"unknown input {name!r}; this model takes {', '.join(specs)}")
    parameters = raw.get("parameters") or {}
    if isinstance(parameters, dict) and parameters.get("binary_data_size") is not None:
        raise BadRequest(f"input {name!r}: the binary tensor extension is not supported; send 'data' as JSON")
    datatype = raw.get("datatype")
    expected = specs[name].datatype
    if datatype != expected:
        known = "" if datatype in V2_DATATYPES else " (not a v2 datatype)"
        raise BadRequest(f"input {name!r} must have datatype {expected}, got {datatype!r}{known}")
    shape = raw.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of non-negative integers")
    if len(shape) != 2 or 0 in shape:
        raise BadRequest(f"input {name!r} must have shape [batch, sequence] with both above zero, got {shape}")
    rows, sequence = shape
    if max_positions and sequence > max_positions:
        raise BadRequest(
            f"input {name!r} has shape {shape}: sequences of {sequence} tokens, but this model takes at most "
            f"{max_positions} (its max_position_embeddings)"
        )
    if rows * sequence > max_tokens:
        raise BadRequest(
            f"input {name!r} has shape {shape}: {rows * sequence} tokens, over the {max_tokens} tokens "
            "(rows x sequence) one request may carry; split it into smaller requests"
        )
    if "data" not in raw:
        raise BadRequest(f"input {name!r} has no 'data'")
    needed = rows * sequence
    flat = _flatten(raw["data"], name, needed)
    if len(flat) != needed:
        counted = f"{len(flat)} values" if len(flat) <= needed else f"more than {needed} values"
        raise BadRequest(f"input {name!r} has {counted} but shape {shape} needs {needed}")
    if not all(type(v) is int for v in flat):  # bools and floats are not INT64
        raise BadRequest(f"input {name!r} ({expected}) must hold integers only")
    try:
        array = np.array(flat, dtype=np.int64).reshape(shape)
    except OverflowError:
        raise BadRequest(f"input {name!r} holds a value outside the INT64 range") from None
    if name == "attention_mask" and ((array < 0) | (array > 1)).any():
        bad = int(array[(array < 0) | (array > 1)][0])
        raise BadRequest(f"input 'attention_mask' holds {bad}; its values must be 0 (padding) or 1 (a token)")
    return name, array


def _flatten(data: Any, name: str, needed: int) -> list:
    """The values of `data` in row-major order; stops once there are more than `needed` of them."""
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r}: 'data' must be a list (flat row-major, or nested by shape)")
    if not any(isinstance(v, list) for v in data):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack and len(flat) <= needed:  # iterative, so a deeply nested body cannot exhaust the recursion limit
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _requested(body: dict, signature: Signature) -> tuple[str, ...]:
    raw = body.get("outputs")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list of {\"name\": ...} objects")
    names = []
    for position, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        if name != signature.output.name:
            raise BadRequest(
                f"outputs[{position}]: unknown output {name!r}; this model gives {signature.output.name!r}"
            )
        parameters = item.get("parameters") or {}
        if isinstance(parameters, dict) and parameters.get("binary_data"):
            raise BadRequest(f"output {name!r}: the binary tensor extension is not supported")
        names.append(name)
    return tuple(names)


def encode_outputs(outputs: dict[str, np.ndarray], signature: Signature, requested: tuple[str, ...]) -> list[dict]:
    """The worker's outputs as v2 JSON tensors: FP32, flat row-major data."""
    datatype = signature.output.datatype
    return [
        {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel().tolist()}
        for name, array in _outputs(outputs, signature, requested)
    ]


def output_values(outputs: dict[str, np.ndarray], signature: Signature, requested: tuple[str, ...]) -> int:
    """How many floats the response to `requested` carries."""
    return sum(array.size for _name, array in _outputs(outputs, signature, requested))


def encode_response_chunks(
    head: dict[str, Any], outputs: dict[str, np.ndarray], signature: Signature, requested: tuple[str, ...]
) -> Iterator[bytes]:
    """The text json.dumps gives for `head | {"outputs": encode_outputs(...)}`, in pieces of at most
    ENCODE_CHUNK_VALUES floats: each piece is one short C call, so a thread producing them leaves the
    event loop its turns (one json.dumps of 16M floats holds the GIL for ~16 s)."""
    yield (json.dumps(head)[:-1] + (", " if head else "") + '"outputs": [').encode()
    for index, (name, array) in enumerate(_outputs(outputs, signature, requested)):
        meta = {"name": name, "datatype": signature.output.datatype, "shape": list(array.shape)}
        yield ((", " if index else "") + json.dumps(meta)[:-1] + ', "data": [').encode()
        flat = array.ravel()
        for start in range(0, flat.size, ENCODE_CHUNK_VALUES):
            text = json.dumps(flat[start : start + ENCODE_CHUNK_VALUES].tolist())[1:-1]
            yield ((", " if start else "") + text).encode()
        yield b"]}"
    yield b"]}"


def _outputs(
    outputs: dict[str, np.ndarray], signature: Signature, requested: tuple[str, ...]
) -> Iterator[tuple[str, np.ndarray]]:
    for name in dict.fromkeys(requested or (signature.output.name,)):
        yield name, np.asarray(outputs[name], dtype=np.float32)
