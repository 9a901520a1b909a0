"""Open Inference Protocol (v2) tensors to numpy and back, with 400-worthy messages: JSON tensors, and Triton's
binary tensor extension (a JSON header, its length in the Inference-Header-Content-Length HTTP header, followed
by each binary tensor's raw little-endian, row-major bytes), as tritonclient.http writes and reads it."""

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

HEADER_LENGTH = "Inference-Header-Content-Length"
# The fixed-size datatypes as raw bytes: always little-endian, whatever this host's byte order. (BYTES tensors are
# length-prefixed strings: no model here takes or gives them.)
BINARY_DTYPES = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


class BadRequest(ValueError):
    """A request that does not follow the protocol or the model's signature; the message names the field."""


@dataclass(frozen=True)
class InferRequest:
    id: str
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]  # requested outputs; empty means all
    adapter: str | None = None  # parameters.adapter: the LoRA adapter to run with
    binary_outputs: frozenset[str] = frozenset()  # outputs to answer as raw bytes (the binary tensor extension)


def split_binary_body(raw: bytes, header_length: str) -> tuple[bytes, memoryview]:
    """A binary-extension body split into its JSON header and the tensor bytes after it, as the request's
    Inference-Header-Content-Length says; BadRequest naming the numbers when it cannot be."""
    text = header_length.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 20):
        raise BadRequest(f"the {HEADER_LENGTH} header must be the JSON header's length in bytes, "
                         f"got {_clip(header_length)!r}")
    length = int(text)
    if length > len(raw):
        raise BadRequest(f"the {HEADER_LENGTH} header says the JSON header is {length} bytes, but the body is "
                         f"{len(raw)} bytes")
    view = memoryview(raw)
    return bytes(view[:length]), view[length:]


class _TensorBytes:
    """The tensor bytes after a binary request's JSON header (None: the request had no such header), taken by
    the inputs that carry parameters.binary_data_size, in the order the inputs are listed (as Triton reads them)."""

    def __init__(self, data: memoryview | bytes | None) -> None:
        self.data = None if data is None else memoryview(data)
        self.offset = 0

    def take(self, name: str, size: Any, shape: list[int], datatype: str) -> np.ndarray:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(f"input {name!r}: parameters.binary_data_size must be a non-negative integer, "
                             f"got {_clip(size)!r}")
        dtype = BINARY_DTYPES[datatype]
        needed = dtype.itemsize * int(np.prod(shape))
        if size != needed:
            raise BadRequest(f"input {name!r} has binary_data_size {size}, but shape {shape} of {datatype} needs "
                             f"{needed} bytes")
        if self.data is None:
            raise BadRequest(f"input {name!r} has binary_data_size {size}, but the request carries no tensor data "
                             f"(it has no {HEADER_LENGTH} header)")
        left = len(self.data) - self.offset
        if size > left:
            raise BadRequest(f"input {name!r} has binary_data_size {size}, but only {left} bytes of tensor data "
                             "are left after the JSON header")
        piece = self.data[self.offset : self.offset + size]
        self.offset += size
        # astype copies into a native, writable array that owns its memory: nothing keeps the body alive.
        return np.frombuffer(piece, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=True)

    def check_used(self) -> None:
        if self.data is not None and self.offset != len(self.data):
            raise BadRequest(f"the body has {len(self.data) - self.offset} bytes after the last input's binary data "
                             f"({self.offset} bytes of tensor data were declared, {len(self.data)} came)")


def parse_infer_request(
    body: Any,
    signature: Signature,
    *,
    binary: memoryview | bytes | None = None,
    max_positions: int | None = None,
    max_tokens: int = MAX_REQUEST_TOKENS,
) -> InferRequest:
    """Validate a v2 infer body against the model's signature and build its numpy inputs. Each input's shape
    is checked against `max_positions` (the model's longest sequence; None: no limit) and `max_tokens` (rows
    x sequence) before its data is read, so an oversized request costs no more than its refusal. `binary`:
    the tensor bytes after a binary-extension body's JSON header (split_binary_body), every one of them used."""
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
    tensor_bytes = _TensorBytes(binary)
    for position, raw in enumerate(raw_inputs):
        name, array = _parse_input(raw, position, specs, max_positions, max_tokens, tensor_bytes)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = array
    tensor_bytes.check_used()
    for spec in signature.inputs:
        if spec.required and spec.name not in inputs:
            raise BadRequest(f"missing input {spec.name!r}")
    ids_shape = inputs[next(s.name for s in signature.inputs if s.required)].shape
    for name, array in inputs.items():
        if array.shape != ids_shape:
            raise BadRequest(f"input {name!r} has shape {list(array.shape)} but input_ids has {list(ids_shape)}")
    outputs, binary_outputs = _requested(body, signature)
    return InferRequest(
        id=request_id or uuid.uuid4().hex,
        inputs=inputs,
        outputs=outputs,
        adapter=_adapter(body),
        binary_outputs=binary_outputs,
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
    raw: Any, position: int, specs: dict, max_positions: int | None, max_tokens: int, tensor_bytes: _TensorBytes
) -> tuple[str, np.ndarray]:
    if not isinstance(raw, dict):
        raise BadRequest(f"inputs[{position}] must be an object with name, shape, datatype and data")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{position}].name must be a non-empty string")
    if name not in specs:
        raise BadRequest(f"unknown input {name!r}; this model takes {', '.join(specs)}")
    parameters = raw.get("parameters") or {}
    binary_size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    datatype = raw.get("datatype")
    expected = specs[name].datatype
    if datatype == "BYTES" and expected != "BYTES":
        raise BadRequest(f"input {name!r} is a BYTES tensor, but this model takes {expected} token ids; tokenize "
                         "the text first, or send it to /v1")
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
    if binary_size is not None:
        if "data" in raw:
            raise BadRequest(f"input {name!r} has both 'data' and parameters.binary_data_size; send one")
        array = tensor_bytes.take(name, binary_size, shape, expected)
    else:
        array = _json_data(raw, name, shape, expected)
    if name == "attention_mask" and ((array < 0) | (array > 1)).any():
        bad = int(array[(array < 0) | (array > 1)][0])
        raise BadRequest(f"input 'attention_mask' holds {bad}; its values must be 0 (padding) or 1 (a token)")
    return name, array


def _json_data(raw: dict, name: str, shape: list[int], expected: str) -> np.ndarray:
    if "data" not in raw:
        raise BadRequest(f"input {name!r} has no 'data'")
    needed = shape[0] * shape[1]
    flat = _flatten(raw["data"], name, needed)
    if len(flat) != needed:
        counted = f"{len(flat)} values" if len(flat) <= needed else f"more than {needed} values"
        raise BadRequest(f"input {name!r} has {counted} but shape {shape} needs {needed}")
    if not all(type(v) is int for v in flat):  # bools and floats are not INT64
        raise BadRequest(f"input {name!r} ({expected}) must hold integers only")
    try:
        return np.array(flat, dtype=np.int64).reshape(shape)
    except OverflowError:
        raise BadRequest(f"input {name!r} holds a value outside the INT64 range") from None


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


def _requested(body: dict, signature: Signature) -> tuple[tuple[str, ...], frozenset[str]]:
    """The outputs asked for (empty: all) and which of them to answer as raw bytes: an output's own
    parameters.binary_data when it has one, else the request's parameters.binary_data_output (as Triton)."""
    parameters = body.get("parameters")
    default = _flag(parameters.get("binary_data_output"), "parameters.binary_data_output", False) if isinstance(
        parameters, dict) else False
    raw = body.get("outputs")
    if raw is None:
        return (), frozenset({signature.output.name} if default else ())
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list of {\"name\": ...} objects")
    names, binary = [], set()
    for position, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        if name != signature.output.name:
            raise BadRequest(
                f"outputs[{position}]: unknown output {name!r}; this model gives {signature.output.name!r}"
            )
        parameters = item.get("parameters") or {}
        own = parameters.get("binary_data") if isinstance(parameters, dict) else None
        if _flag(own, f"output {name!r}: parameters.binary_data", default):
            binary.add(name)
        names.append(name)
    return tuple(names), frozenset(binary)


def _flag(value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{field} must be true or false, got {_clip(value)!r}")
    return value


def _clip(value: Any) -> Any:
    """A client's value short enough to quote in a message."""
    text = value if isinstance(value, str) else repr(value)
    return value if len(text) <= 40 else text[:40] + "..."


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


def encode_binary_response(
    head: dict[str, Any],
    outputs: dict[str, np.ndarray],
    signature: Signature,
    requested: tuple[str, ...],
    binary: frozenset[str],
) -> tuple[bytes, list[memoryview]]:
    """The binary extension's answer: its JSON header (each binary output with parameters.binary_data_size and
    no data) and, in the header's order, each binary output's bytes, little-endian and row-major. Views, not
    copies, where the worker's array already is that; JSON outputs are encoded whole (blocking: large answers
    belong in a thread)."""
    tensors, pieces = [], []
    for name, array in _outputs(outputs, signature, requested):
        tensor: dict[str, Any] = {"name": name, "datatype": signature.output.datatype, "shape": list(array.shape)}
        if name in binary:
            raw = np.ascontiguousarray(array, dtype=BINARY_DTYPES[signature.output.datatype])
            tensor["parameters"] = {"binary_data_size": raw.nbytes}
            pieces.append(memoryview(raw.reshape(-1).view(np.uint8)))
        else:
            tensor["data"] = array.ravel().tolist()
        tensors.append(tensor)
    return json.dumps(head | {"outputs": tensors}).encode(), pieces


def _outputs(
    outputs: dict[str, np.ndarray], signature: Signature, requested: tuple[str, ...]
) -> Iterator[tuple[str, np.ndarray]]:
    for name in dict.fromkeys(requested or (signature.output.name,)):
        yield name, np.asarray(outputs[name], dtype=np.float32)
