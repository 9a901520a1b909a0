"""Open Inference Protocol (v2) JSON tensors to numpy and back, with 400-worthy messages."""

from __future__ import annotations

import math
import uuid
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


class BadRequest(ValueError):
    """A request that does not follow the protocol or the model's signature; the message names the field."""


@dataclass(frozen=True)
class InferRequest:
    id: str
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]  # requested outputs; empty means all
    adapter: str | None = None  # parameters.adapter: the LoRA adapter to run with


def parse_infer_request(body: Any, signature: Signature) -> InferRequest:
    """Validate a v2 infer body against the model's signature and build its numpy inputs."""
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
        name, array = _parse_input(raw, position, specs)
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


def _parse_input(raw: Any, position: int, specs: dict) -> tuple[str, np.ndarray]:
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
    if "data" not in raw:
        raise BadRequest(f"input {name!r} has no 'data'")
    flat = _flatten(raw["data"], name)
    if len(flat) != math.prod(shape):
        raise BadRequest(f"input {name!r} has {len(flat)} values but shape {shape} needs {math.prod(shape)}")
    if not all(type(v) is int for v in flat):  # bools and floats are not INT64
        raise BadRequest(f"input {name!r} ({expected}) must hold integers only")
    try:
        array = np.array(flat, dtype=np.int64).reshape(shape)
    except OverflowError:
        raise BadRequest(f"input {name!r} holds a value outside the INT64 range") from None
    return name, array


def _flatten(data: Any, name: str) -> list:
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r}: 'data' must be a list (flat row-major, or nested by shape)")
    if not any(isinstance(v, list) for v in data):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack:  # iterative, so a deeply nested body cannot exhaust the recursion limit
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
    names = requested or (signature.output.name,)
    return [
        {
            "name": name,
            "datatype": signature.output.datatype,
            "shape": list(outputs[name].shape),
            "data": np.asarray(outputs[name], dtype=np.float32).ravel().tolist(),
        }
        for name in dict.fromkeys(names)
    ]
