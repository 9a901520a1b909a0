"""safetensors headers that lie about their data are refused at registration, as the loader would refuse them.

Before the fix two tensors over the same bytes, gaps, trailing data and a non-string `__metadata__`
value were accepted, and the worker then crash-looped on `safe_open` ("invalid offset for tensor",
"file not fully covered"). Each case is also checked against the safetensors library itself, so the
rules here are the format's rules, not stricter ones.
"""

import json
import struct

import numpy as np
import pytest
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from agent.artifacts import ArtifactError, inspect_model_dir, read_safetensors_header
from tests.conftest import write_model_dir


def raw_file(path, header: dict, data_bytes: int):
    """A safetensors file written by hand: the header exactly as given, then `data_bytes` zero bytes."""
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * data_bytes)
    return path


def f32(start: int, end: int, shape=(4,)) -> dict:
    return {"dtype": "F32", "shape": list(shape), "data_offsets": [start, end]}


def loader_refuses(path) -> bool:
    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except SafetensorError:
        return True
    return False


LIES = {
    "duplicate offsets": ({"a": f32(0, 16), "b": f32(0, 16)}, 16,
                          r"tensor 'b' data_offsets \[0, 16\] overlap tensor 'a' \[0, 16\]"),
    "overlapping offsets": ({"a": f32(0, 16), "b": f32(8, 24)}, 24,
                            r"tensor 'b' data_offsets \[8, 24\] overlap tensor 'a' \[0, 16\]"),
    "a gap": ({"a": f32(0, 16), "b": f32(32, 48)}, 48,
              r"tensor 'b' data_offsets \[32, 48\] leave bytes 16 to 32 of the data section uncovered"),
    "a gap before the first tensor": ({"a": f32(16, 32)}, 32,
                                      r"tensor 'a' data_offsets \[16, 32\] leave bytes 0 to 16"),
    "trailing data": ({"a": f32(0, 16)}, 48, r"32 bytes of trailing data after the last tensor 'a' \(the data "
                                              r"section is 48 bytes, the tensors cover 16\)"),
    "data but no tensors": ({}, 8, r"8 bytes of trailing data after the header, which declares no tensors"),
}


@pytest.mark.parametrize("case", LIES)
def test_a_header_whose_tensors_do_not_tile_the_data_section_exactly_is_refused(tmp_path, case):
    header, data_bytes, message = LIES[case]
    path = raw_file(tmp_path / "w.safetensors", header, data_bytes)
    assert loader_refuses(path)
    with pytest.raises(ArtifactError, match=rf"w\.safetensors: {message}"):
        read_safetensors_header(path)


@pytest.mark.parametrize(("metadata", "why"), [
    ({"format": 1}, r"field '__metadata__' must map names to strings; 'format' is 1"),
    ({"format": None}, r"field '__metadata__' must map names to strings; 'format' is None"),
    ({"nested": {"a": "b"}}, r"field '__metadata__' must map names to strings; 'nested' is \{'a': 'b'\}"),
    (["pt"], r"field '__metadata__' must be an object of strings, got \['pt'\]"),
    ("pt", r"field '__metadata__' must be an object of strings, got 'pt'"),
])
def test_metadata_that_is_not_an_object_of_strings_is_refused(tmp_path, metadata, why):
    path = raw_file(tmp_path / "w.safetensors", {"__metadata__": metadata, "a": f32(0, 16)}, 16)
    assert loader_refuses(path)
    with pytest.raises(ArtifactError, match=rf"w\.safetensors: header {why}"):
        read_safetensors_header(path)


@pytest.mark.parametrize(("entry", "message"), [
    ({"dtype": "F16", "shape": [4], "data_offsets": [0, 16]},
     r"tensor 'a' data_offsets \[0, 16\] cover 16 bytes, but its dtype F16 and shape \[4\] make 8 bytes"),
    ({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]},
     r"tensor 'a' data_offsets \[0, 16\] cover 16 bytes, but its dtype F32 and shape \[2, 3\] make 24 bytes"),
    # issue 45's wording of its probe: an I64 tensor whose offsets span half of what it needs
    ({"dtype": "I64", "shape": [4], "data_offsets": [0, 16]},
     r"tensor 'a' data_offsets \[0, 16\] cover 16 bytes, but its dtype I64 and shape \[4\] make 32 bytes"),
])
def test_a_dtype_and_shape_that_disagree_with_the_offsets_name_expected_and_found_bytes(tmp_path, entry, message):
    path = raw_file(tmp_path / "w.safetensors", {"a": entry}, 16)
    assert loader_refuses(path)
    with pytest.raises(ArtifactError, match=rf"w\.safetensors: {message}"):
        read_safetensors_header(path)


@pytest.mark.parametrize(("offsets", "message"), [
    ([0, 16], r"tensor 'a' data_offsets \[0, 16\] run past the end of the file \(its data section is 8 bytes\)"),
    ([16, 0], r"tensor 'a' data_offsets \[16, 0\] end before they start"),
])
def test_offsets_beyond_the_file_or_backwards_are_refused(tmp_path, offsets, message):
    path = raw_file(tmp_path / "w.safetensors", {"a": f32(*offsets)}, 8)
    assert loader_refuses(path)
    with pytest.raises(ArtifactError, match=rf"w\.safetensors: {message}"):
        read_safetensors_header(path)


def test_what_the_safetensors_library_writes_is_accepted_with_metadata_and_empty_tensors(tmp_path):
    path = tmp_path / "w.safetensors"
    tensors = {"empty": np.zeros((0, 4), np.float32), "b": np.ones(3, np.float16), "a": np.ones((2, 2), np.int64),
               "none": np.zeros(0, np.uint8)}
    save_file(tensors, str(path), metadata={"format": "pt", "note": "x"})
    assert not loader_refuses(path)
    assert {t.name: t.nbytes for t in read_safetensors_header(path)} == {"a": 32, "b": 6, "empty": 0, "none": 0}


def test_a_header_without_tensors_or_data_and_null_metadata_is_accepted(tmp_path):
    assert read_safetensors_header(raw_file(tmp_path / "e.safetensors", {}, 0)) == []
    path = raw_file(tmp_path / "n.safetensors", {"__metadata__": None, "a": f32(0, 16)}, 16)
    assert not loader_refuses(path)
    assert [t.name for t in read_safetensors_header(path)] == ["a"]


def test_registration_refuses_a_model_whose_weights_overlap_naming_the_file_and_tensors(tmp_path):
    model = write_model_dir(tmp_path / "m")
    raw_file(model / "model.safetensors", {"model.embed_tokens.weight": f32(0, 2048, (32, 16)),
                                           "lm_head.weight": f32(0, 2048, (32, 16))}, 2048)
    with pytest.raises(ArtifactError, match=r"m/model\.safetensors: tensor 'model\.embed_tokens\.weight' "
                                            r"data_offsets \[0, 2048\] overlap tensor 'lm_head\.weight'"):
        inspect_model_dir(model)
