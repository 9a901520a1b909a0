"""Triton's binary tensor extension on v2 infer: a JSON header (its length in Inference-Header-Content-Length)
followed by raw little-endian tensor bytes, in requests and answers, built and read here as tritonclient.http
builds and reads them; and every way such a body is refused, naming the tensor and the numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.http import InferInput, InferRequestedOutput, InferResult
from tritonclient.http._utils import _get_inference_request

from agent.serving.tensors import (
    HEADER_LENGTH,
    MAX_REQUEST_TOKENS,
    BadRequest,
    encode_binary_response,
    parse_infer_request,
    split_binary_body,
)
from agent.workers.spec import SIGNATURES

CAUSAL, ENCODER = SIGNATURES["causal-lm"], SIGNATURES["encoder"]


def triton_request(inputs: dict[str, np.ndarray], outputs=None, binary=True, **parameters) -> tuple[bytes, int | None]:
    """The body and header length tritonclient.http's `infer` sends for these numpy inputs."""
    tensors = []
    for name, array in inputs.items():
        tensor = InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    return _get_inference_request(tensors, "", outputs, 0, False, False, 0, None, parameters or None)


def parse_binary(body: bytes, header_length: int | None, signature=CAUSAL, **limits):
    if header_length is None:
        return parse_infer_request(json.loads(body), signature, **limits)
    header, binary = split_binary_body(body, str(header_length))
    return parse_infer_request(json.loads(header), signature, binary=binary, **limits)


def binary_input(name="input_ids", shape=(1, 3), size=None, **extra) -> dict:
    size = 8 * int(np.prod(shape)) if size is None else size
    return {"name": name, "shape": list(shape), "datatype": "INT64", "parameters": {"binary_data_size": size}} | extra


def raw_request(header: dict, tensor_bytes: bytes) -> tuple[bytes, int]:
    text = json.dumps(header).encode()
    return text + tensor_bytes, len(text)


def le(*values: int) -> bytes:
    return np.array(values, dtype="<i8").tobytes()


# -- requests ---------------------------------------------------------------------------------------------------


def test_a_binary_body_splits_at_its_header_length():
    header, binary = split_binary_body(b'{"inputs": []}' + b"\x01\x02", "14")
    assert header == b'{"inputs": []}' and bytes(binary) == b"\x01\x02"


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("abc", "the Inference-Header-Content-Length header must be the JSON header's length in bytes, got 'abc'"),
        ("-1", "got '-1'"),
        ("1" * 5000, "got '1111111111"),
        ("17", "the Inference-Header-Content-Length header says the JSON header is 17 bytes, but the body is "
               "16 bytes"),
    ],
)
def test_a_header_length_that_is_not_a_count_or_past_the_body_is_refused_naming_the_numbers(declared, message):
    with pytest.raises(BadRequest) as refused:
        split_binary_body(b'{"inputs": []}' + b"\x01\x02", declared)
    assert message in str(refused.value)


def test_tritonclients_binary_inputs_are_read_little_endian_and_row_major():
    ids = np.array([[1, 5, 42], [7, 300, -2]], dtype=np.int64)
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=np.int64)
    body, length = triton_request({"input_ids": ids, "attention_mask": mask})
    assert length is not None  # tritonclient's default: binary inputs
    parsed = parse_binary(body, length)
    assert np.array_equal(parsed.inputs["input_ids"], ids) and np.array_equal(parsed.inputs["attention_mask"], mask)
    for array in parsed.inputs.values():
        assert array.dtype == np.int64 and array.dtype.isnative and array.flags.writeable and array.flags.owndata
    assert parsed.binary_outputs == frozenset({"logits"})  # no outputs named: binary_data_output


def test_binary_and_json_inputs_mix_in_one_request():
    header = {"inputs": [
        {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 0]},
        binary_input("input_ids"),
        binary_input("token_type_ids"),
    ]}
    parsed = parse_binary(*raw_request(header, le(4, 5, 6) + le(0, 0, 1)), signature=ENCODER)
    assert parsed.inputs["input_ids"].tolist() == [[4, 5, 6]]
    assert parsed.inputs["token_type_ids"].tolist() == [[0, 0, 1]]
    assert parsed.inputs["attention_mask"].tolist() == [[1, 1, 0]]
    assert parsed.binary_outputs == frozenset()


def test_a_json_request_is_read_as_before():
    body, length = triton_request({"input_ids": np.array([[3, 4]])}, binary=False,
                                  outputs=[InferRequestedOutput("logits", binary_data=False)])
    assert length is None
    parsed = parse_binary(body, length)
    assert parsed.inputs["input_ids"].tolist() == [[3, 4]] and parsed.binary_outputs == frozenset()


@pytest.mark.parametrize(
    ("inputs", "tensor_bytes", "message"),
    [
        ([binary_input(size=16)], le(1, 2), "input 'input_ids' has binary_data_size 16, but shape [1, 3] of INT64 "
                                            "needs 24 bytes"),
        ([binary_input(size="24")], le(1, 2, 3), "input 'input_ids': parameters.binary_data_size must be a "
                                                 "non-negative integer, got '24'"),
        ([binary_input(size=True)], le(1, 2, 3), "binary_data_size must be a non-negative integer, got True"),
        ([binary_input(size=-24)], le(1, 2, 3), "got -24"),
        ([binary_input(data=[1, 2, 3])], le(1, 2, 3), "input 'input_ids' has both 'data' and "
                                                      "parameters.binary_data_size"),
        ([binary_input()], le(1, 2), "input 'input_ids' has binary_data_size 24, but only 16 bytes of tensor "
                                     "data are left after the JSON header"),
        ([binary_input(), binary_input("attention_mask")], le(1, 2, 3) + le(1, 1), "input 'attention_mask' has "
         "binary_data_size 24, but only 16 bytes of tensor data are left after the JSON header"),
        ([binary_input()], le(1, 2, 3, 4), "the body has 8 bytes after the last input's binary data (24 bytes "
                                           "of tensor data were declared, 32 came)"),
        ([binary_input(), binary_input("attention_mask")], le(1, 2, 3) + le(1, 2, 1),
         "input 'attention_mask' holds 2; its values must be 0 (padding) or 1 (a token)"),
        ([binary_input(datatype="BYTES")], b"\x03\x00\x00\x00abc", "input 'input_ids' is a BYTES tensor"),
        ([binary_input(datatype="FP32", size=12)], le(1, 2, 3)[:12], "input 'input_ids' must have datatype INT64, "
                                                                     "got 'FP32'"),
        ([binary_input(shape=(1, MAX_REQUEST_TOKENS + 1))], b"", f"{MAX_REQUEST_TOKENS + 1} tokens, over the "
                                                                 f"{MAX_REQUEST_TOKENS} tokens"),
    ],
)
def test_a_malformed_binary_request_is_refused_naming_the_tensor_and_the_numbers(inputs, tensor_bytes, message):
    with pytest.raises(BadRequest) as refused:
        parse_binary(*raw_request({"inputs": inputs}, tensor_bytes))
    assert message in str(refused.value)


def test_binary_data_in_a_body_without_the_header_is_refused_naming_the_header():
    body = json.dumps({"inputs": [binary_input()]}).encode()
    with pytest.raises(BadRequest) as refused:
        parse_binary(body, None)
    assert ("input 'input_ids' has binary_data_size 24, but the request carries no tensor data (it has no "
            "Inference-Header-Content-Length header)") in str(refused.value)


def test_tensor_bytes_after_a_header_with_no_binary_input_are_refused():
    header = {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]}
    with pytest.raises(BadRequest, match="the body has 8 bytes after the last input's binary data"):
        parse_binary(*raw_request(header, le(9)))


def test_a_sequence_past_the_models_positions_is_refused_before_its_bytes_are_read():
    header = {"inputs": [binary_input(shape=(1, 300))]}
    with pytest.raises(BadRequest, match="sequences of 300 tokens, but this model takes at most 256"):
        parse_binary(*raw_request(header, b""), max_positions=256)


# -- which outputs are binary -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outputs", "parameters", "binary"),
    [
        (None, {"binary_data_output": True}, {"logits"}),
        (None, {"binary_data_output": False}, set()),
        (None, {}, set()),
        ([{"name": "logits", "parameters": {"binary_data": True}}], {}, {"logits"}),
        ([{"name": "logits", "parameters": {"binary_data": False}}], {"binary_data_output": True}, set()),
        ([{"name": "logits"}], {"binary_data_output": True}, {"logits"}),
        ([{"name": "logits"}], {}, set()),
    ],
)
def test_outputs_are_binary_as_triton_decides(outputs, parameters, binary):
    body = {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]}
    body |= ({"outputs": outputs} if outputs is not None else {}) | ({"parameters": parameters} if parameters else {})
    assert parse_infer_request(body, CAUSAL).binary_outputs == frozenset(binary)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"outputs": [{"name": "logits", "parameters": {"binary_data": "yes"}}]},
         "output 'logits': parameters.binary_data must be true or false, got 'yes'"),
        ({"parameters": {"binary_data_output": 1}}, "parameters.binary_data_output must be true or false, got 1"),
    ],
)
def test_a_binary_flag_that_is_not_a_boolean_is_refused(body, message):
    body = {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]} | body
    with pytest.raises(BadRequest) as refused:
        parse_infer_request(body, CAUSAL)
    assert message in str(refused.value)


# -- answers ----------------------------------------------------------------------------------------------------


def test_a_binary_answer_reads_back_through_tritonclient_as_the_same_floats():
    logits = (np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5) - 7.25) / 3
    header, pieces = encode_binary_response({"model_name": "chat", "id": "r1"}, {"logits": logits}, CAUSAL,
                                            ("logits",), frozenset({"logits"}))
    head = json.loads(header)
    assert head == {"model_name": "chat", "id": "r1", "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [2, 3, 5], "parameters": {"binary_data_size": 120}}]}
    body = header + b"".join(pieces)
    assert body[len(header):] == logits.astype("<f4").tobytes()  # little-endian, row-major
    result = InferResult.from_response_body(body, header_length=len(header))
    assert np.array_equal(result.as_numpy("logits"), logits)


def test_a_big_endian_or_strided_output_is_sent_little_endian_and_row_major():
    embeddings = np.arange(12, dtype=">f8").reshape(4, 3).T  # float64, big-endian, column-major
    header, pieces = encode_binary_response({}, {"embeddings": embeddings}, ENCODER, (), frozenset({"embeddings"}))
    assert b"".join(pieces) == np.ascontiguousarray(embeddings, dtype="<f4").tobytes()
    result = InferResult.from_response_body(header + b"".join(pieces), header_length=len(header))
    assert np.array_equal(result.as_numpy("embeddings"), embeddings.astype(np.float32))


def test_an_empty_output_is_zero_bytes():
    header, pieces = encode_binary_response({}, {"logits": np.zeros((1, 0, 8), np.float32)}, CAUSAL, (),
                                            frozenset({"logits"}))
    assert json.loads(header)["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert b"".join(pieces) == b""
    assert InferResult.from_response_body(header, header_length=len(header)).as_numpy("logits").shape == (1, 0, 8)


def test_the_header_name_is_tritons():
    assert HEADER_LENGTH == "Inference-Header-Content-Length"
