"""Torch-free reading of model artifacts and memory estimation (importable by the console)."""

from agent.artifacts.adapters import AdapterArtifact, AdapterFit, check_adapter_matches, read_adapter_dir
from agent.artifacts.dtypes import canonical_dtype, dtype_bytes
from agent.artifacts.errors import ArtifactError
from agent.artifacts.estimate import Estimate, estimate, estimate_model
from agent.artifacts.model_dir import ModelArtifact, inspect_model_dir, read_model_dir
from agent.artifacts.roots import OUTSIDE_ROOTS, OutsideModelRoots, resolve_in_roots
from agent.artifacts.safetensors_header import TensorInfo, read_safetensors_header

__all__ = [
    "AdapterArtifact",
    "AdapterFit",
    "ArtifactError",
    "Estimate",
    "ModelArtifact",
    "OUTSIDE_ROOTS",
    "OutsideModelRoots",
    "TensorInfo",
    "canonical_dtype",
    "check_adapter_matches",
    "dtype_bytes",
    "estimate",
    "estimate_model",
    "inspect_model_dir",
    "read_adapter_dir",
    "read_model_dir",
    "read_safetensors_header",
    "resolve_in_roots",
]
