"""GPU discovery behind one interface: NVML for real GPUs, or simulated ones (`sim:2x24GiB`)."""

from __future__ import annotations

from agent.gpus.base import GpuBackend, GpuBackendUnavailable
from agent.gpus.nvml import NvmlBackend
from agent.gpus.simulated import SimulatedBackend, parse_sim_spec


def make_backend(spec: str, host: str | None = None) -> GpuBackend:
    """Build the backend for `nvml` or `sim:...`; raises GpuBackendUnavailable or ValueError with the reason."""
    if spec == "nvml":
        backend = NvmlBackend()
        if not backend.is_available():
            raise GpuBackendUnavailable(
                f"no NVIDIA GPU can be used ({backend.unavailable_reason}; is the NVIDIA driver installed?). "
                "To run without GPUs, simulate some with --gpus sim:2x24GiB"
            )
        return backend
    if spec.startswith("sim:"):
        return SimulatedBackend(spec, host)
    raise ValueError(f"unknown GPU backend {spec!r}: use 'nvml' or a simulation like 'sim:2x24GiB'")


__all__ = ["GpuBackend", "GpuBackendUnavailable", "NvmlBackend", "SimulatedBackend", "make_backend", "parse_sim_spec"]
