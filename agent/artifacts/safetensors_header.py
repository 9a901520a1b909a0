"""Read a safetensors header without loading a single weight.

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw data. The header is held to the format's own rules (those `safe_open` enforces): each
tensor's offsets span exactly its dtype x shape bytes, the tensors tile the data section with no
gap, overlap or trailing byte, and `__metadata__` maps names to strings. A lying file is refused
here, naming the tensor, instead of crash-looping the worker that tries to load it.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.artifacts import strict_json
from agent.artifacts.errors import ArtifactError, shown
from agent.artifacts.files import open_regular
from agent.artifacts.limits import MAX_DIM, MAX_NUMEL, MAX_RANK, MAX_SAFETENSORS_HEADER, MAX_TENSOR_NAME

DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_safetensors_header(
    path: str | os.PathLike, roots: Sequence[str | os.PathLike] | None = None
) -> list[TensorInfo]:
    """Return the tensors a safetensors file declares, validated against the file size.

    With `roots`, the file must resolve inside them (see files.open_regular).
    """
    path = Path(path)
    with open_regular(path, roots) as (f, size):
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise ArtifactError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > MAX_SAFETENSORS_HEADER or 8 + header_len > size:
            raise ArtifactError(f"{path}: header length {header_len} runs past the end of the file")
        raw = f.read(header_len)
    if len(raw) < header_len:
        raise ArtifactError(f"{path}: header length {header_len} runs past the end of the file")
    header = strict_json.loads(raw, str(path), "header")
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: header is not a JSON object")

    data_size = size - 8 - header_len
    _check_metadata(path, header.get("__metadata__"))
    tensors, spans = [], []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (start, end) = _entry(path, name, entry)
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        where = f"{path}: tensor {shown(name)}"
        if end < start:
            raise ArtifactError(f"{where} data_offsets [{start}, {end}] end before they start")
        if end > data_size:
            raise ArtifactError(f"{where} data_offsets [{start}, {end}] run past the end of the file "
                                f"(its data section is {data_size:,} bytes)")
        if end - start != nbytes:
            raise ArtifactError(f"{where} data_offsets [{start}, {end}] cover {end - start:,} bytes, but its dtype "
                                f"{dtype} and shape {list(shape)} make {nbytes:,} bytes")
        tensors.append(TensorInfo(name, dtype, shape, nbytes))
        spans.append((start, end, name))
    _check_tiling(path, spans, data_size)
    return tensors


def _check_metadata(path: Path, metadata: Any) -> None:
    """`__metadata__` is absent, null or an object of strings: the loader refuses anything else."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise ArtifactError(f"{path}: header field '__metadata__' must be an object of strings, got {shown(metadata)}")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise ArtifactError(f"{path}: header field '__metadata__' must map names to strings; {shown(key)} is "
                                f"{shown(value)}")


_TILING = "safetensors requires the tensors to cover the data section exactly, without gaps or overlaps"


def _check_tiling(path: Path, spans: list[tuple[int, int, str]], data_size: int) -> None:
    """The tensors, sorted by offsets, cover [0, data_size) end to end, as `safe_open` checks.

    Two tensors over the same bytes would alias in the loaded model; a gap or trailing data is
    bytes no tensor declares, which the loader refuses outright ("file not fully covered").
    """
    covered, previous = 0, None
    for start, end, name in sorted(spans):
        where = f"{path}: tensor {shown(name)} data_offsets [{start}, {end}]"
        if start < covered:
            (p_start, p_end, p_name) = previous
            raise ArtifactError(f"{where} overlap tensor {shown(p_name)} [{p_start}, {p_end}]; {_TILING}")
        if start > covered:
            after = f"after tensor {shown(previous[2])}" if previous else "before it"
            raise ArtifactError(f"{where} leave bytes {covered} to {start} of the data section uncovered ({after}); "
                                f"{_TILING}")
        covered, previous = end, (start, end, name)
    if covered != data_size:
        trailing = f"{data_size - covered:,} bytes of trailing data"
        if previous is None:
            raise ArtifactError(f"{path}: {trailing} after the header, which declares no tensors; {_TILING}")
        raise ArtifactError(f"{path}: {trailing} after the last tensor {shown(previous[2])} (the data section is "
                            f"{data_size:,} bytes, the tensors cover {covered:,}); {_TILING}")


def _entry(path: Path, name: str, entry: Any) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """(dtype, shape, data_offsets) of one header entry, each checked for type and bounds."""
    where = f"{path}: tensor {shown(name)}"
    if len(name) > MAX_TENSOR_NAME:
        raise ArtifactError(f"{where} has a name of {len(name):,} characters (at most {MAX_TENSOR_NAME:,})")
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise ArtifactError(f"{where} has a malformed header entry (needs dtype, shape and data_offsets)")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ArtifactError(f"{where} field 'dtype' is {shown(dtype)}; expected one of {', '.join(DTYPE_BYTES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape)
        or math.prod(max(d, 1) for d in shape) > MAX_NUMEL  # a zero dimension must not hide absurd others
    ):
        raise ArtifactError(
            f"{where} field 'shape' is {shown(shape)}; expected a list of at most {MAX_RANK} integers from 0 to "
            f"{MAX_DIM:,} with at most {MAX_NUMEL:,} elements in all"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        raise ArtifactError(f"{where} field 'data_offsets' is {shown(offsets)}; expected [start, end] as two "
                            "integers from 0")
    return dtype, tuple(shape), (offsets[0], offsets[1])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
