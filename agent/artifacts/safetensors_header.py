"""Read a safetensors header without loading a single weight.

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw data. We check every offset against the file size so a truncated or lying file
is refused here, not when a worker tries to load it.
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
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (start, end) = _entry(path, name, entry)
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        if not (0 <= start <= end <= data_size) or end - start != nbytes:
            raise ArtifactError(
                f"{path}: tensor {shown(name)} data_offsets [{start}, {end}] do not match its shape "
                f"{list(shape)} or run past the end of the file ({data_size} data bytes)"
            )
        tensors.append(TensorInfo(name, dtype, shape, nbytes))
    return tensors


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
