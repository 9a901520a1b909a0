"""Estimates per deployment, measured loads, and calibration feeding later admissions."""

import logging

import pytest

from agent.protocol import Measurement, ReplicaStatus
from console.catalog.loads import LOGGED_LOADS, Load, record_loads
from console.catalog.models import Calibration, MemorySample
from console.control.desired import desired_state
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment, update_deployment
from console.errors import Invalid
from console.fleet.models import Gpu, Host
from console.intake.stages import apply_one

pytestmark = pytest.mark.django_db
GiB = 1024**3


def ready(replica, measured: int, pid: int = 4242) -> ReplicaStatus:
    m = Measurement(device="cpu", batch=1, seq=replica.deployment.seq or 2048, weights_bytes=4096,
                    peak_bytes=measured, total_bytes=measured)
    return ReplicaStatus(replica_id=replica.pk, state="ready", measured_bytes=measured, pid=pid, measurement=m)


def test_a_deployment_stores_its_estimate_for_each_device_kind(model):
    dep = create_deployment("chat", "tiny", dtype="fp16", batch=4, seq=128)
    assert dep.dtype == "float16"
    assert set(dep.estimates) == {"cpu", "cuda"}
    cpu, cuda = dep.estimates["cpu"], dep.estimates["cuda"]
    assert (cpu["batch"], cpu["seq"], cpu["dtype"]) == (4, 128, "float16")
    assert cpu["weights_bytes"] == model.weights_bytes // 2  # stored float32, served float16
    assert cuda["total_bytes"] - cpu["total_bytes"] == cuda["overhead_bytes"] > 0


@pytest.mark.parametrize("dtype, message", [
    ("float8", "dtype 'float8' is not one ModelGrid can serve in"),
    ("int8", "dtype 'int8' cannot be served yet"),
])
def test_a_dtype_the_workers_cannot_serve_is_refused_and_nothing_stored(model, dtype, message):
    with pytest.raises(Invalid, match=message):
        create_deployment("chat", "tiny", dtype=dtype)
    assert not Deployment.objects.exists()


def test_a_measured_load_is_kept_beside_its_estimate_once(host, model):
    create_deployment("chat", "tiny", seq=64)
    reconcile_once()
    replica = Replica.objects.get()
    estimated = replica.deployment.estimates["cpu"]["total_bytes"]
    apply_one(host, ready(replica, estimated + 1000))
    apply_one(host, ready(replica, estimated + 1000))  # the same load, reported again
    sample = MemorySample.objects.get()
    assert (sample.estimated_bytes, sample.measured_bytes, sample.device) == (estimated, estimated + 1000, "cpu")
    assert sample.calibrated_bytes == estimated  # nothing was calibrated before this load
    assert sample.family == "llama" and sample.seq == 64
    calibration = Calibration.objects.get()
    assert (calibration.family, calibration.device, calibration.samples) == ("llama", "cpu", 1)
    assert calibration.factor == pytest.approx((estimated + 1000) / estimated)


def test_later_admissions_reserve_the_calibrated_estimate(host, model):
    create_deployment("chat", "tiny", seq=64)
    reconcile_once()
    first = Replica.objects.get()
    estimated = first.deployment.estimates["cpu"]["total_bytes"]
    apply_one(host, ready(first, 2 * estimated))
    update_deployment("chat", {"replicas": 2})
    reconcile_once()
    second = Replica.objects.get(index=1)
    assert second.reserved_bytes == 2 * estimated
    assert second.reservation["calibrated_from"] == 1
    assert [r.reserved_bytes for r in desired_state(host).replicas] == [estimated, 2 * estimated]


def test_a_restarted_worker_is_a_new_load(host, model):
    create_deployment("chat", "tiny", seq=64)
    reconcile_once()
    replica = Replica.objects.get()
    estimated = replica.deployment.estimates["cpu"]["total_bytes"]
    apply_one(host, ready(replica, estimated, pid=1))
    apply_one(host, ready(replica, estimated, pid=2))
    assert MemorySample.objects.count() == 2
    assert Calibration.objects.get().samples == 2


def test_a_rollouts_loads_are_each_kept_and_logged_in_a_bounded_number_of_lines(host, model, caplog):
    # A rollout of 10,000 replicas has as many loads: a line each flooded the log, on intake's thread.
    create_deployment("chat", "tiny", seq=64, replicas=LOGGED_LOADS + 5)
    reconcile_once()
    replicas = list(Replica.objects.order_by("pk"))
    estimated = replicas[0].deployment.estimates["cpu"]["total_bytes"]
    loads = [Load("h1", r.pk, ready(r, estimated + 10 * i).measurement, 100 + i) for i, r in enumerate(replicas)]
    with caplog.at_level(logging.INFO, logger="modelgrid.memory"):
        assert len(record_loads(loads)) == len(replicas)
        assert record_loads(loads) == []  # kept once
    assert MemorySample.objects.count() == len(replicas)
    lines = [r.getMessage() for r in caplog.records if r.name == "modelgrid.memory"]
    assert len(lines) == LOGGED_LOADS + 1
    assert lines[-1].startswith("and 5 more loads (error: median ")


def test_a_status_without_a_measurement_calibrates_nothing(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    replica = Replica.objects.get()
    apply_one(host, ReplicaStatus(replica_id=replica.pk, state="ready", measured_bytes=10, pid=7))
    assert not MemorySample.objects.exists() and not Calibration.objects.exists()


def test_real_gpus_reserve_the_cuda_estimate_with_its_runtime_overhead(model):
    h = Host.objects.create(name="g1", endpoint="http://127.0.0.1:9", connected=True)
    Gpu.objects.create(host=h, index=0, uuid="GPU-0", name="H100", total_bytes=80 * GiB, simulated=False)
    dep = create_deployment("chat", "tiny")
    reconcile_once()
    replica = Replica.objects.get()
    assert replica.reserved_bytes == dep.estimates["cuda"]["total_bytes"]
    assert replica.reservation["device"] == "cuda"


def test_a_model_whose_directory_vanished_is_not_placed_and_says_why(host, model, model_dir):
    create_deployment("chat", "tiny")
    Deployment.objects.update(estimates={})  # as a deployment stored before estimates were kept
    (model_dir / "config.json").unlink()
    reconcile_once()
    replica = Replica.objects.get()
    assert replica.host is None
    assert replica.reason.startswith("cannot estimate its memory:") and "no config.json" in replica.reason


def test_creating_deployments_of_one_model_reads_its_files_once_the_scheduler_reads_them_afresh(
        host, model, model_dir, monkeypatch):
    from console.catalog import memory

    reads = []
    real = memory.engines.estimate_model
    monkeypatch.setattr(memory.engines, "estimate_model", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(memory, "_kept", {})
    create_deployment("one", "tiny")
    per_create = len(reads)  # one read per device kind
    create_deployment("two", "tiny")
    assert per_create > 0 and len(reads) == per_create  # the second create reused the first's answers
    Deployment.objects.update(estimates={})  # the pass rebuilds them: from the files, now
    reconcile_once()
    assert len(reads) > per_create


def test_creating_deployments_with_a_sequence_length_reads_the_models_positions_once(host, model, monkeypatch):
    from console.catalog import memory

    reads = []
    real = memory.read_config
    monkeypatch.setattr(memory, "read_config", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(memory, "_kept", {})
    create_deployment("one", "tiny", seq=64)
    create_deployment("two", "tiny", seq=64)
    create_deployment("three", "tiny")  # the model's default sequence: nothing to check
    assert len(reads) == 1
