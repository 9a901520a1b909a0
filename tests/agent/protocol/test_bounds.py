"""Every number an agent sends is bounded to what the console's columns hold and every float is finite, so a
message the schema accepts can always be stored; strings are bounded too."""

import json

import pytest
from pydantic import ValidationError

from agent.protocol import (
    AdapterStatus,
    DeploymentServing,
    GpuInfo,
    HostReport,
    Measurement,
    ReplicaStatus,
    parse_agent_message,
)
from agent.protocol.messages import BIG, MAX_GPU_BYTES, MAX_GPUS, MAX_TEXT, SMALL

GiB = 1 << 30
GPU = {"index": 0, "uuid": "GPU-0", "name": "H100", "total_bytes": 80 * GiB, "used_bytes": 0, "simulated": False}
MEASUREMENT = {"device": "cuda", "batch": 1, "seq": 128, "weights_bytes": GiB, "peak_bytes": GiB, "total_bytes": GiB}
SERVING = {"deployment": "chat", "requests": 3, "request_rate": 0.05, "error_rate": 0.0, "p95_ms": 12.5}


def report(**fields) -> dict:
    return {"type": "report", "gpus": [GPU]} | fields


def status(**fields) -> dict:
    return {"type": "replica_status", "replica_id": 1, "state": "ready"} | fields


def parse(message: dict | str):
    return parse_agent_message(message if isinstance(message, str) else json.dumps(message))


HOSTILE = {
    "a byte count of 2**63": report(gpus=[GPU | {"used_bytes": BIG + 1}]),
    "a gpu index past a 32-bit column": report(gpus=[GPU | {"index": SMALL + 1}]),
    "a negative gpu index": report(gpus=[GPU | {"index": -1}]),
    "room for sleeping replicas past 64 bits": report(ram_free_bytes=2**64),
    "a pid past a 32-bit column": status(pid=SMALL + 1),
    "a negative pid": status(pid=-5),
    "a replica id past 64 bits": status(replica_id=2**63),
    "a negative replica id": status(replica_id=-1),
    "an ack of generation 2**63": {"type": "ack", "generation": BIG + 1},
    "a measured batch past a 32-bit column": status(measurement=MEASUREMENT | {"batch": SMALL + 1}),
    "a measured seq past a 32-bit column": status(measurement=MEASUREMENT | {"seq": SMALL + 1}),
    "a measurement of 2**63 bytes": status(measurement=MEASUREMENT | {"total_bytes": BIG + 1}),
    "adapter hits past 64 bits": status(adapters=[{"name": "a", "tier": "gpu", "nbytes": 1, "hits": BIG + 1}]),
    "a 5,000-digit integer": json.dumps(report(gpus=[GPU | {"total_bytes": 7}])).replace("7", "9" * 5000),
    "an infinite p95": report(serving=[SERVING | {"p95_ms": float("inf")}]),
    "a NaN p95": report(serving=[SERVING | {"p95_ms": float("nan")}]),
    "an infinite request rate": report(serving=[SERVING | {"request_rate": float("inf")}]),
    "a NaN utilisation": report(gpus=[GPU | {"utilization": float("nan")}]),
    "an infinite sleep bandwidth": status(sleep_wake={"direction": "wake", "bytes": 1, "seconds": 0.1,
                                                      "bandwidth": float("inf")}),
    "an infinite load time": status(measurement=MEASUREMENT | {"load_seconds": float("inf")}),
    "a GPU uuid longer than its column": report(gpus=[GPU | {"uuid": "G" * 101}]),
    "a GPU name longer than its column": report(gpus=[GPU | {"name": "n" * 201}]),
    "an agent version longer than its column": {"type": "hello", "protocol": 1, "host": "h1",
                                                "agent_version": "v" * 51, "endpoint": "http://h1:8100",
                                                "gpus": []},
    "an endpoint longer than its column": {"type": "hello", "protocol": 1, "host": "h1", "agent_version": "1",
                                           "endpoint": "http://" + "e" * 300, "gpus": []},
    "a NUL in a host name": {"type": "hello", "protocol": 1, "host": "h\x001", "agent_version": "1",
                             "endpoint": "http://h1:8100", "gpus": []},
    "a NUL in a deployment name": report(serving=[SERVING | {"deployment": "chat\x00"}]),
    "more GPUs than a host has": report(gpus=[GPU | {"index": i} for i in range(MAX_GPUS + 1)]),
    "a GPU larger than any machine": report(gpus=[GPU | {"total_bytes": MAX_GPU_BYTES + 1}]),
    "a GPU using more than any machine has": report(gpus=[GPU | {"used_bytes": MAX_GPU_BYTES + 1}]),
    "a hello with more GPUs than a host has": {"type": "hello", "protocol": 1, "host": "h1", "agent_version": "1",
                                               "endpoint": "", "gpus": [GPU] * (MAX_GPUS + 1)},
}


@pytest.mark.parametrize("message", HOSTILE.values(), ids=HOSTILE.keys())
def test_values_the_database_cannot_hold_fail_validation(message):
    with pytest.raises(ValidationError):
        parse(message)


@pytest.mark.parametrize("text", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_non_finite_json_numbers_are_refused(text):
    with pytest.raises(ValidationError):
        parse('{"type": "report", "gpus": [], "serving": [{"deployment": "d", "requests": 1, "request_rate": 1, '
              f'"error_rate": 0, "p95_ms": {text}}}]}}')


def test_deeply_nested_json_is_refused_without_a_crash():
    with pytest.raises(ValidationError):
        parse('{"type": "report", "gpus": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


def test_the_largest_values_the_columns_hold_are_accepted():
    gpu = GPU | {"index": SMALL, "total_bytes": MAX_GPU_BYTES, "used_bytes": MAX_GPU_BYTES, "own_bytes": MAX_GPU_BYTES}
    msg = parse(report(gpus=[gpu | {"index": i} for i in range(MAX_GPUS)], ram_free_bytes=BIG))
    assert msg.gpus[0].total_bytes == MAX_GPU_BYTES and msg.ram_free_bytes == BIG
    msg = parse(status(replica_id=BIG, pid=SMALL, measured_bytes=BIG, measurement=MEASUREMENT | {"batch": SMALL}))
    assert (msg.replica_id, msg.pid, msg.measurement.batch) == (BIG, SMALL, SMALL)


def test_free_text_is_cut_to_its_bound_and_loses_nul_characters():
    msg = parse(status(state="failed", reason="x\x00y" + "z" * (2 * MAX_TEXT), adapter_error="e" * (2 * MAX_TEXT)))
    assert len(msg.reason) == MAX_TEXT and msg.reason.startswith("xy") and msg.reason.endswith("…")
    assert len(msg.adapter_error) == MAX_TEXT


def test_what_a_busy_agent_reports_stays_within_the_bounds():
    # Built the way agent.daemon and agent.workers.handle build them: 141 GiB GPUs, a pid from a kernel with
    # pid_max at its 64-bit maximum (2**22), a sleeping 70 GiB model, a one-hour load, 5,000 adapters.
    gpus = [GpuInfo(index=i, uuid=f"GPU-{i:08x}-1111-2222-3333-444444444444", name="NVIDIA H200",
                    total_bytes=141 * GiB, used_bytes=140 * GiB, own_bytes=139 * GiB, utilization=100.0,
                    simulated=False) for i in range(8)]
    measurement = Measurement(device="cuda", batch=4096, seq=1 << 20, weights_bytes=70 * GiB, peak_bytes=80 * GiB,
                              total_bytes=80 * GiB, load_seconds=3600.0, load_bandwidth=70 * GiB / 3600)
    adapters = [AdapterStatus(name=f"adapter-{i}", tier="cpu", nbytes=64 << 20, requests=10**12, hits=10**12,
                              misses=10**12) for i in range(5000)]
    replica = ReplicaStatus(replica_id=10**12, state="sleeping", pid=2**22, measured_bytes=80 * GiB,
                            measurement=measurement, host_bytes=70 * GiB, mps_percentage=100, adapters=adapters,
                            reason="RuntimeError: " + "x" * 999)
    serving = [DeploymentServing(deployment="d" * 63, requests=10**9, request_rate=1e6, error_rate=1.0,
                                 p50_ms=1e9, p95_ms=1e12, queue_depth=10**6)]
    sent = HostReport(gpus=gpus, replicas=[replica], serving=serving, ram_free_bytes=2 * 1024 * GiB)
    assert parse(sent.model_dump_json()) == sent
