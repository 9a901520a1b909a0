"""A fleet caught mid-flight, written straight into the database: replicas loading, ready, preloaded,
asleep and waking, a deployment violating its SLO, one that fits nowhere. The page tests read it, and
`scene` below seeds a scratch console for screenshots:

    MODELGRID_DATA_DIR=/tmp/uiscratch python manage.py shell -c \
        "from tests.console.fleet_scene import scene; scene('/tmp/uiscratch/models/tiny-llama')"
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from console.catalog.models import Adapter, Model
from console.catalog.services import register_model
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.fleet.models import Gpu, Host

GiB, MiB = 1 << 30, 1 << 20


def _deployment(name: str, model: str, **fields) -> Deployment:
    policy = {k: fields.pop(k) for k in ("priority", "min_replicas", "max_replicas", "slo_latency_ms",
                                         "latency_critical", "profile", "selector") if k in fields}
    create_deployment(name, model, **policy)
    Deployment.objects.filter(name=name).update(**fields)
    return Deployment.objects.get(name=name)


def _replica(dep: Deployment, index: int, gpus: list[Gpu] = (), host: Host | None = None, **fields) -> Replica:
    host = host or (gpus[0].host if gpus else None)
    reserved = fields.pop("reserved_bytes", 0)
    reservation = {"device": "cuda", "estimated_bytes": int(reserved / 1.08), "factor": 1.08,
                   "calibrated_from": 6} if reserved else {}
    row = Replica.objects.create(deployment=dep, index=index, host=host, reserved_bytes=reserved,
                                 reservation=reservation, **fields)
    row.gpus.set(gpus)
    return row


def scene(model_path: str, *, adapter_error: str = "") -> dict:
    """Write the fleet; returns its rows by name. `model_path` is a servable model directory."""
    now = timezone.now()
    model = Model.objects.filter(name="tiny").first() or register_model("tiny", model_path)
    a = Host.objects.create(name="gpu-a", endpoint="http://10.0.0.11:8100", agent_version="0.4.0", connected=True,
                            last_seen=now, generation=12, acked_generation=12, labels={"zone": "eu-1"},
                            ram_free_bytes=41 * GiB)
    b = Host.objects.create(name="gpu-b", endpoint="http://10.0.0.12:8100", agent_version="0.4.0", connected=True,
                            last_seen=now, generation=7, acked_generation=6, labels={"zone": "eu-2"},
                            ram_free_bytes=12 * GiB)
    a0 = Gpu.objects.create(host=a, index=0, uuid="GPU-a0", name="NVIDIA H100 80GB HBM3", total_bytes=80 * GiB,
                            used_bytes=int(25.5 * GiB), utilization=71)
    a1 = Gpu.objects.create(host=a, index=1, uuid="GPU-a1", name="NVIDIA H100 80GB HBM3", total_bytes=80 * GiB,
                            used_bytes=int(6.8 * GiB), utilization=12)
    b0 = Gpu.objects.create(host=b, index=0, uuid="GPU-b0", name="NVIDIA A100-SXM4-40GB", total_bytes=40 * GiB,
                            used_bytes=int(18.9 * GiB), utilization=55)

    chat = _deployment("chat", model.name, priority="critical", min_replicas=1, max_replicas=4, slo_latency_ms=200,
                       latency_critical=True, profile="compute", replicas=3, traffic_rps=48.2, observed_p95_ms=340.0,
                       violating=True, status_since=now - timedelta(minutes=3),
                       last_scale_at=now - timedelta(minutes=3), state="loading", reason="loading weights")
    Deployment.objects.filter(pk=chat.pk).update(created=now - timedelta(days=2))
    _replica(chat, 0, [a0], reserved_bytes=20 * GiB, measured_bytes=int(18.4 * GiB), observed_state="ready",
             action="keep", mps_percentage=72, pid=4121, created=now - timedelta(days=2),
             reason="kept on gpu-a/0: it still fits; MPS 72% of SMs: weight 130 (critical, latency-critical) of 180 "
                    "on gpu-a/0, shared by 2 replicas",
             adapter_stats=[{"name": "sql", "tier": "gpu", "pinned": True, "nbytes": 12 * MiB, "requests": 1200,
                             "hits": 80, "misses": 3},
                            {"name": "support", "tier": "cpu", "pinned": False, "nbytes": 24 * MiB, "requests": 40,
                             "hits": 2, "misses": 5}])
    _replica(chat, 1, [b0], reserved_bytes=20 * GiB, measured_bytes=int(18.1 * GiB), observed_state="ready",
             action="place", pid=991, created=now - timedelta(minutes=20),
             reason="best fit: needs 20.00 GiB; gpu-b/0 had 40.00 GiB free, 20.00 GiB left after",
             adapter_stats=[{"name": "sql", "tier": "gpu", "pinned": True, "nbytes": 12 * MiB, "requests": 900,
                             "hits": 60, "misses": 2}],
             adapter_error=adapter_error)
    _replica(chat, 2, [a1], reserved_bytes=20 * GiB, observed_state="loading", action="place", pid=5230,
             created=chat.last_scale_at + timedelta(milliseconds=200),  # the scale-up's pass made it
             loaded_bytes=int(7.5 * GiB), loading_total_bytes=int(17.8 * GiB),
             reason="added for the SLO (violating its 200 ms p95 SLO at 340 ms): best fit: needs 20.00 GiB; "
                    "gpu-a/1 had 63.00 GiB free, 43.00 GiB left after")
    Adapter.objects.create(name="sql", deployment=chat, path="/adapters/sql-lora", rank=8, modules=14,
                           parameters=6_000_000, nbytes=12 * MiB, pinned=True)
    Adapter.objects.create(name="support", deployment=chat, path="/adapters/support-lora-v2", rank=16, modules=28,
                           parameters=12_000_000, nbytes=24 * MiB)

    embed = _deployment("embed", model.name, priority="standard", min_replicas=2, max_replicas=2, slo_latency_ms=50,
                        profile="memory", replicas=2, traffic_rps=310.0, observed_p95_ms=21.4, violating=False,
                        status_since=now - timedelta(minutes=41), state="ready", reason="")
    _replica(embed, 0, [a0], reserved_bytes=6 * GiB, measured_bytes=int(5.6 * GiB), observed_state="ready",
             action="keep", mps_percentage=28, pid=4180,
             reason="kept on gpu-a/0: it still fits; MPS 28% of SMs: weight 50 (standard) of 180 on gpu-a/0, "
                    "shared by 2 replicas")
    _replica(embed, 1, [a1], reserved_bytes=6 * GiB, measured_bytes=int(5.6 * GiB), observed_state="preloaded",
             desired_state="ready", action="wake", pid=5101,
             reason="woken onto gpu-a/1: best fit: needs 6.00 GiB; gpu-a/1 had 43.00 GiB free, 37.00 GiB left after",
             sleep_wake={"direction": "wake", "bytes": int(5.1 * GiB), "seconds": 0.41, "bandwidth": 13.3e9})

    nightly = _deployment("nightly-batch", model.name, priority="batch", min_replicas=0, max_replicas=2, replicas=1,
                          state="ready", reason="all 1 replica(s) asleep in host memory; a request wakes one")
    _replica(nightly, 0, host=a, desired_state="sleeping", observed_state="sleeping", action="preempt", pid=3310,
             measured_bytes=int(8.2 * GiB),
             host_bytes=8 * GiB, sleep_wake={"direction": "sleep", "bytes": 8 * GiB, "seconds": 2.9,
                                             "bandwidth": 2.96e9},
             reason="preempted by chat#2 (critical, violating its 200 ms p95 SLO at 340 ms); drained, then sleeping "
                    "in gpu-a RAM (8.00 GiB)")

    summarize = _deployment("summarize", model.name, priority="high", min_replicas=1, max_replicas=1,
                            state="pending", reason="waiting for an agent to start the replica")
    _replica(summarize, 0, [b0], reserved_bytes=2 * GiB, observed_state="sleeping", desired_state="ready",
             action="wake", pid=770, host_bytes=int(86.7 * MiB),
             sleep_wake={"direction": "sleep", "bytes": int(86.7 * MiB), "seconds": 0.0331, "bandwidth": 2.74e9},
             reason="woken onto gpu-b/0: best fit: needs 2.00 GiB; gpu-b/0 had 20.00 GiB free, 18.00 GiB left after")

    big = _deployment("big", model.name, priority="standard", min_replicas=1, max_replicas=1,
                      state="unschedulable",
                      reason="needs 92.00 GiB; the largest free space is 63.00 GiB on gpu-a/1; preempting lower "
                             "tiers would not make room on any GPU")
    _replica(big, 0, action="refuse", reason=big.reason)
    return {"hosts": (a, b), "gpus": (a0, a1, b0), "chat": chat, "embed": embed, "nightly": nightly,
            "summarize": summarize, "big": big}
