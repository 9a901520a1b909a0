"""Model directories altered for tests, with numpy (no torch): a checkpoint that disagrees with its config.json."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.numpy import load_file, save_file


def with_reshaped_tensor(source: Path, target: Path, key: str, shape: tuple[int, ...]) -> Path:
    """A copy of the model directory `source` at `target` whose checkpoint holds tensor `key` reshaped to `shape`
    (same values, same count), as a checkpoint of another architecture would: config.json is unchanged."""
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    tensors[key] = tensors[key].reshape(shape)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def with_tensor(source: Path, target: Path, key: str, value) -> Path:
    """A copy of the model directory `source` at `target` whose checkpoint holds `value` (a numpy array of any dtype
    and shape) as tensor `key`; config.json is unchanged."""
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    tensors[key] = value
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target
