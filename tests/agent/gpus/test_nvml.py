"""This machine has no NVIDIA driver: NVML must say so cleanly instead of failing the agent."""

from types import SimpleNamespace

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


class FakeNvml:
    """Just enough of pynvml for per-process memory: two GPUs, one process on both, one that says nothing."""

    class NVMLError(Exception):
        pass

    def __init__(self, processes):
        self.processes = processes

    def nvmlDeviceGetCount(self):
        return len(self.processes)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.processes[handle] is None:
            raise self.NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes[handle]]


def fake_backend(processes) -> NvmlBackend:
    backend = NvmlBackend()
    backend._nvml, backend._initialised = FakeNvml(processes), True
    return backend


def test_it_reads_a_processes_gpu_memory_across_gpus():
    backend = fake_backend([[(10, 500), (11, 7)], [(10, 300)], None])
    assert backend.process_memory(10) == 800
    assert backend.process_memory(11) == 7


def test_a_process_nvml_cannot_see_or_measure_has_no_reading():
    backend = fake_backend([[(10, None)], [(12, 5)]])
    assert backend.process_memory(10) is None  # MPS clients and some drivers report no per-process use
    assert backend.process_memory(99) is None  # another PID namespace, or not on a GPU


def test_without_nvml_there_is_no_process_reading(no_gpu):
    assert no_gpu.process_memory(1) is None
