"""First memory estimate: exact weight bytes from safetensors headers, times a margin.

The margin stands in for activations and allocator slack until the term-by-term estimator
(KV cache, activations, runtime overhead) replaces it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from agent.artifacts.model_dir import ModelArtifact

WEIGHTS_MARGIN = 1.2
RUNTIME_OVERHEAD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Estimate:
    weights_bytes: int
    overhead_bytes: int
    total_bytes: int
    parameters: int
    architecture: str
    notes: tuple[str, ...]

    def as_dict(self) -> dict:
        return asdict(self) | {"notes": list(self.notes)}


def estimate_model(artifact: ModelArtifact) -> Estimate:
    """Bytes one replica of the model should reserve."""
    margin = int(artifact.weights_bytes * (WEIGHTS_MARGIN - 1)) + RUNTIME_OVERHEAD_BYTES
    return Estimate(
        weights_bytes=artifact.weights_bytes,
        overhead_bytes=margin,
        total_bytes=artifact.weights_bytes + margin,
        parameters=artifact.parameters,
        architecture=artifact.architecture,
        notes=(f"weights from safetensors headers x {WEIGHTS_MARGIN} + {RUNTIME_OVERHEAD_BYTES >> 20} MiB runtime",),
    )
