import logging

import pytest

from console.control.desired import desired_state
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment, delete_deployment, update_deployment
from console.fleet.models import Gpu, Host
from console.scheduler.strategies import PLACERS
from tests.queries import statements as logged

pytestmark = pytest.mark.django_db
GiB = 1024**3


def test_it_places_a_new_replica_and_bumps_the_host_generation(host, model):
    create_deployment("chat", "tiny")
    result = reconcile_once()
    assert result.changed_hosts == (host.pk,)
    replica = Replica.objects.get()
    assert replica.host == host
    assert [g.index for g in replica.gpus.all()] == [1]  # best fit: the smaller GPU
    # Simulated GPUs: the worker runs on the CPU, so the CPU estimate is reserved (nothing calibrated yet).
    estimate = replica.deployment.estimates["cpu"]
    assert replica.reserved_bytes == estimate["total_bytes"]
    assert replica.reservation == {"device": "cpu", "estimated_bytes": estimate["total_bytes"], "factor": 1.0,
                                   "calibrated_from": 0}
    host.refresh_from_db()
    state = desired_state(host)
    assert state.generation == 1
    assert [(r.deployment, r.model_path, r.gpus) for r in state.replicas] == [("chat", model.path, [1])]


def test_a_pass_with_nothing_new_changes_nothing(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    assert reconcile_once().changed_hosts == ()
    host.refresh_from_db()
    assert host.generation == 1


def test_deleting_a_deployment_changes_the_desired_state(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    delete_deployment("chat")
    assert reconcile_once().changed_hosts == (host.pk,)
    host.refresh_from_db()
    assert desired_state(host).replicas == [] and host.generation == 2


def test_replicas_never_land_on_offline_hosts(host, model):
    Host.objects.filter(pk=host.pk).update(connected=False)
    create_deployment("chat", "tiny")
    reconcile_once()
    assert Replica.objects.get().host is None


def test_a_model_too_big_for_every_gpu_is_unschedulable(host, model):
    dep = create_deployment("huge", "tiny")
    dep.estimates["cpu"]["total_bytes"] = 30 * GiB
    dep.save()
    reconcile_once()
    dep.refresh_from_db()
    assert dep.state == "unschedulable"
    assert dep.reason == "needs 30.00 GiB; the largest free space is 24.00 GiB on h1/0"


def test_foreign_memory_on_a_gpu_is_not_placed_over(host, model):
    # Something outside ModelGrid uses all of GPU 1 but a few bytes.
    Gpu.objects.filter(host=host, index=1).update(used_bytes=8 * GiB - 10)
    create_deployment("chat", "tiny")
    reconcile_once()
    assert [g.index for g in Replica.objects.get().gpus.all()] == [0]


def test_memory_the_agent_says_its_own_workers_hold_is_never_foreign(host, model):
    # GPU 1 is all but full with a worker that is draining (its row no longer points at the GPU): the agent
    # says the bytes are its own, so the GPU is free for placement once the drain ends, not foreign forever.
    Gpu.objects.filter(host=host, index=1).update(used_bytes=8 * GiB - 10, own_bytes=8 * GiB - 10)
    create_deployment("chat", "tiny")
    reconcile_once()
    assert [g.index for g in Replica.objects.get().gpus.all()] == [1]


def test_scaling_down_removes_the_highest_replicas(host, model):
    create_deployment("chat", "tiny", replicas=3)
    reconcile_once()
    update_deployment("chat", {"replicas": 1})
    reconcile_once()
    assert list(Replica.objects.values_list("index", flat=True)) == [0]


def sized(name: str, gib: float, **policy):
    """A deployment of the tiny model whose replicas need `gib` GiB (as if estimated so)."""
    dep = create_deployment(name, "tiny", **policy)
    dep.estimates["cpu"]["total_bytes"] = int(gib * GiB)
    dep.save()
    return dep


def test_a_critical_deployment_takes_the_room_of_a_batch_one(host, model):
    sized("cheap", 20, priority="batch")
    reconcile_once()
    assert Replica.objects.get(deployment__name="cheap").host == host
    sized("vital", 20, priority="critical")
    reconcile_once()
    vital, cheap = Replica.objects.get(deployment__name="vital"), Replica.objects.get(deployment__name="cheap")
    assert [g.index for g in vital.gpus.all()] == [0]
    assert cheap.host is None and cheap.action == "preempt"
    assert "vital#0" in cheap.reason and "critical" in cheap.reason
    dep = Deployment.objects.get(name="cheap")
    assert dep.state == "unschedulable"


def test_replicas_of_a_host_that_went_offline_move_to_another(host, model):
    other = Host.objects.create(name="h2", endpoint="http://127.0.0.1:8", connected=True)
    Gpu.objects.create(host=other, index=0, uuid="SIM-2", name="sim", total_bytes=24 * GiB, simulated=True)
    sized("chat", 10)
    reconcile_once()
    first = Replica.objects.get().host
    Host.objects.filter(pk=first.pk).update(connected=False)
    result = reconcile_once()
    replica = Replica.objects.get()
    assert replica.host not in (None, first)
    assert replica.action == "move" and "is gone" in replica.reason
    assert replica.observed_state == "pending"
    assert set(result.changed_hosts) >= {replica.host.pk}


def test_a_selector_no_gpu_matches_says_which_labels_excluded_them(host, model):
    dep = sized("picky", 1, selector={"gpu": "h100"})
    reconcile_once()
    dep.refresh_from_db()
    assert dep.state == "unschedulable"
    assert "excluded by label gpu=h100" in dep.reason


def test_replicas_sharing_a_gpu_get_mps_shares_by_tier(host, model):
    Gpu.objects.filter(host=host, index=1).delete()
    sized("vital", 5, priority="critical")
    sized("bulk", 5, priority="batch")
    reconcile_once()
    shares = {r.deployment.name: r.mps_percentage for r in Replica.objects.select_related("deployment")}
    gpus = {r.deployment.name: [g.index for g in r.gpus.all()] for r in Replica.objects.all()}
    assert gpus["vital"] == gpus["bulk"]
    assert shares["vital"] > shares["bulk"] and 95 <= shares["vital"] + shares["bulk"] <= 105


def test_an_autoscaled_deployment_starts_at_its_minimum(host, model):
    dep = sized("elastic", 1, min_replicas=1, max_replicas=3, slo_latency_ms=100)
    reconcile_once()
    dep.refresh_from_db()
    assert dep.replicas == 1 and Replica.objects.count() == 1


def test_the_desired_state_carries_shares_batching_and_adapters(host, model, tmp_path):
    from console.catalog.adapters import register_adapter
    from tests.adapter_files import write_adapter

    Gpu.objects.filter(host=host, index=1).delete()
    sized("vital", 5, priority="critical")
    bulk = sized("bulk", 5, priority="batch")
    Deployment.objects.filter(pk=bulk.pk).update(max_batch_size=32, max_batch_delay_ms=2.5)
    register_adapter("sql", "bulk", str(write_adapter(tmp_path / "sql", {"model.layers.0.mlp.up_proj": (8, 16, 32)})),
                     pinned=True)
    reconcile_once()
    host.refresh_from_db()
    by_name = {r.deployment: r for r in desired_state(host).replicas}
    assert by_name["vital"].mps_percentage > by_name["bulk"].mps_percentage
    assert (by_name["bulk"].max_batch_size, by_name["bulk"].max_batch_delay_ms) == (32, 2.5)
    [adapter] = by_name["bulk"].adapters
    assert (adapter.name, adapter.pinned) == ("sql", True)
    assert by_name["bulk"].adapter_pool_bytes == 8 * (16 + 32) * 4 and by_name["vital"].adapters == []


def test_a_standby_deployment_is_loaded_but_not_serving_until_switched_on(host, model):
    from console.deployments.services import update_deployment

    create_deployment("v2", "tiny", standby=True)
    reconcile_once()
    host.refresh_from_db()
    [desired] = desired_state(host).replicas
    assert desired.state == "preloaded" and desired.gpus  # it holds its GPU, staged for the switch
    Replica.objects.update(observed_state="preloaded")
    reconcile_once()
    dep = Deployment.objects.get()
    assert dep.state == "ready" and dep.reason.startswith("standing by")
    update_deployment("v2", {"standby": False})
    reconcile_once()
    host.refresh_from_db()
    assert [r.state for r in desired_state(host).replicas] == ["ready"]  # the agent promotes it in place


def test_a_pass_with_nothing_new_writes_no_replica_row(host, model):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    create_deployment("chat", "tiny", replicas=2)
    reconcile_once()
    reconcile_once()
    with CaptureQueriesContext(connection) as queries:
        assert not reconcile_once().changed
    writes = [q for q in logged(queries) if q.startswith(("UPDATE", "INSERT", "DELETE"))
              and "deployments_replica" in q]
    assert writes == []


def _pass_statements() -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        reconcile_once()
    return [q["sql"] for q in queries]


def test_a_pass_costs_as_many_statements_for_many_replicas_as_for_few(host, model):
    # At 1,000 hosts a pass that placed 8,000 replicas wrote each existing row with a statement of its own, and the
    # pass after it (every reason "placed" -> "kept") 10,000 of them: 8 s of a 14 s pass.
    counts = {}
    for n in (2, 12):
        for i in range(n):
            create_deployment(f"first-{i}", "tiny")
        placing = _pass_statements()
        after = _pass_statements()  # every reason goes from "placed" to "kept"
        for i in range(n):
            create_deployment(f"second-{i}", "tiny")
        beside = _pass_statements()  # every replica placed before gets a smaller MPS share
        assert Replica.objects.filter(host=host).count() == 2 * n
        assert set(Replica.objects.values_list("action", flat=True)) == {"keep", "place"}
        counts[n] = (len(placing), len(after), len(beside))
        Deployment.objects.all().delete()
        reconcile_once()
    assert counts[2] == counts[12]


def _told(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "modelgrid.scheduler" and r.levelno == logging.INFO]


def test_a_pass_logs_each_of_its_first_actions_and_counts_the_rest_in_one_line(host, model, caplog, monkeypatch):
    # A rollout's pass places a thousand replicas: a log line each cost the pass 0.7 s in 25 s of a wave.
    monkeypatch.setattr("console.control.reconcile.LOGGED_ACTIONS", 3)
    caplog.set_level(logging.INFO, logger="modelgrid.scheduler")
    for i in range(5):
        create_deployment(f"chat-{i}", "tiny")
    reconcile_once()
    told = _told(caplog)
    assert [line.split(":")[0] for line in told[:3]] == [f"placed replica/chat-{i}#0" for i in range(3)]
    assert told[3:] == ["and 2 more actions this pass (2 placed): the events list each"]
    assert Replica.objects.filter(host=host).count() == 5


def test_a_small_pass_logs_every_action_and_no_count(host, model, caplog):
    caplog.set_level(logging.INFO, logger="modelgrid.scheduler")
    create_deployment("chat", "tiny")
    reconcile_once()
    told = _told(caplog)
    assert len(told) == 1 and told[0].startswith("placed replica/chat#0: ")
    update_deployment("chat", {"replicas": 3})
    caplog.clear()
    reconcile_once()
    assert [line.split(":")[0] for line in _told(caplog)] == ["placed replica/chat#1", "placed replica/chat#2"]


@pytest.mark.parametrize("strategy", sorted(PLACERS))  # their placers' index keys differ (a bound method of their own)
def test_a_planning_pass_leaves_its_working_set_to_reference_counting_not_the_cyclic_collector(
        host, model, settings, strategy):
    """A cycle anywhere in a pass's call stack (an exception kept in a local, as Django's JSON key lookups in
    values_list keep one) holds every frame of the stack with its locals, so the pass's whole plan waited for the
    collector: at 1,000 hosts, 250,000 objects a pass, walked by every collection of a wave (docs/benchmarks.md)."""
    import gc

    from console.scheduler.units import Unit

    settings.MODELGRID_STRATEGY = strategy
    for name in ("chat", "embed"):
        create_deployment(name, "tiny")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage, for this test to see
    try:
        assert reconcile_once().changed_hosts == (host.pk,)
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage if isinstance(o, (Unit, Deployment, Replica))})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
