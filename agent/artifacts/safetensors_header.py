"""Read a safetensors header without loading a single weight.

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw data. We check every offset against the file size so a truncated or lying file
is refused here, not when a worker tries to load it.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from agent.artifacts.errors import ArtifactError

DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1,
}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_safetensors_header(path: str | os.PathLike) -> list[TensorInfo]:
    """Return the tensors a safetensors file declares, validated against the file size."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise ArtifactError(f"{path}: too short to be a safetensors file")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > _MAX_HEADER or 8 + header_len > size:
                raise ArtifactError(f"{path}: header length {header_len} runs past the end of the file")
            header = json.loads(f.read(header_len))
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read ({e.strerror})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: header is not a JSON object")

    data_size = size - 8 - header_len
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"{path}: tensor {name!r} has a malformed header entry") from e
        if dtype not in DTYPE_BYTES:
            raise ArtifactError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        if not (0 <= start <= end <= data_size) or end - start != nbytes:
            raise ArtifactError(
                f"{path}: tensor {name!r} data_offsets [{start}, {end}] do not match its shape "
                f"{list(shape)} or run past the end of the file ({data_size} data bytes)"
            )
        tensors.append(TensorInfo(name, dtype, shape, nbytes))
    return tensors
