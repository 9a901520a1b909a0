"""safetensors header entries of the wrong type or out of bounds are refused, naming file, tensor and field.

Before the fix: string offsets and float shapes raised TypeError (a 500, and for `shape: [2.5]`
the model row was stored anyway), a list dtype raised "unhashable", a negative shape was accepted.
"""

import json
import struct

import pytest

from agent.artifacts import ArtifactError, read_safetensors_header
from agent.artifacts.limits import MAX_DIM, MAX_RANK


def _write(tmp_path, entry: dict, data_bytes: int = 16):
    f = tmp_path / "w.safetensors"
    body = json.dumps({"w": entry}).encode()
    f.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * data_bytes)
    return f


GOOD = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


def test_a_well_formed_header_is_read(tmp_path):
    (t,) = read_safetensors_header(_write(tmp_path, GOOD))
    assert (t.name, t.dtype, t.shape, t.nbytes) == ("w", "F32", (4,), 16)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("data_offsets", ["0", "16"]),
        ("data_offsets", [0.0, 16.0]),
        ("data_offsets", [True, 16]),
        ("data_offsets", [0, 8, 16]),
        ("data_offsets", {"start": 0}),
        ("data_offsets", [-16, 0]),
        ("dtype", ["F32"]),
        ("dtype", {"F32": 1}),
        ("dtype", "F128"),
        ("shape", [2.5]),
        ("shape", [-4]),
        ("shape", [True, 4]),
        ("shape", "4"),
        ("shape", [1] * (MAX_RANK + 1)),
        ("shape", [MAX_DIM + 1]),
        ("shape", [0, 2**40, 2**40]),  # zero bytes but absurd dimensions
    ],
)
def test_it_refuses_a_header_field_of_the_wrong_type_or_out_of_bounds(tmp_path, field, value):
    f = _write(tmp_path, GOOD | {field: value})
    with pytest.raises(ArtifactError, match=rf"w\.safetensors: tensor 'w' field '{field}' is "):
        read_safetensors_header(f)


@pytest.mark.parametrize("entry", [["F32", [4], [0, 16]], "F32", {"dtype": "F32", "shape": [4]}])
def test_it_refuses_an_entry_that_is_not_an_object_with_the_three_fields(tmp_path, entry):
    with pytest.raises(ArtifactError, match=r"tensor 'w' has a malformed header entry \(needs dtype, shape"):
        read_safetensors_header(_write(tmp_path, entry))


def test_it_refuses_a_header_that_is_not_an_object(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ArtifactError, match="header is not a JSON object"):
        read_safetensors_header(f)


def test_it_refuses_a_tensor_name_longer_than_any_real_one(tmp_path):
    f = tmp_path / "w.safetensors"
    body = json.dumps({"n" * 5000: GOOD}).encode()
    f.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 16)
    with pytest.raises(ArtifactError, match=r"has a name of 5,000 characters \(at most 1,024\)") as e:
        read_safetensors_header(f)
    assert len(str(e.value)) < 600  # the name is quoted cut short, not in full


def test_the_header_may_carry_metadata(tmp_path):
    f = tmp_path / "w.safetensors"
    body = json.dumps({"__metadata__": {"format": "pt"}, "w": GOOD}).encode()
    f.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 16)
    assert [t.name for t in read_safetensors_header(f)] == ["w"]
