"""This machine has no NVIDIA driver: NVML must say so cleanly instead of failing the agent."""

import pytest

from agent.gpus import GpuBackendUnavailable, NvmlBackend, make_backend


@pytest.fixture
def no_gpu():
    backend = NvmlBackend()
    if backend.is_available():
        pytest.skip("this machine has an NVIDIA GPU")
    return backend


def test_it_reports_not_available_with_the_reason(no_gpu):
    assert not no_gpu.is_available()
    assert "NVML is not available" in no_gpu.unavailable_reason or "not installed" in no_gpu.unavailable_reason


def test_it_collects_nothing_instead_of_raising(no_gpu):
    assert no_gpu.collect({}) == []
    assert no_gpu.collect({0: 1}) == []  # repeated calls stay cheap and quiet


def test_make_backend_points_to_simulation(no_gpu):
    with pytest.raises(GpuBackendUnavailable, match="--gpus sim:2x24GiB"):
        make_backend("nvml")


def test_it_reads_real_gpus_when_there_are_some():
    backend = NvmlBackend()
    if not backend.is_available():
        pytest.skip("no NVIDIA GPU here")
    gpus = backend.collect({})
    assert gpus and all(not g.simulated and g.total_bytes > 0 for g in gpus)
