"""Agent messages are applied in batches: the statements a tick costs do not grow with the number of hosts,
and a steady scheduler pass rebuilds no host's desired state."""

import hashlib
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.protocol import Ack, GpuInfo, HostReport, ReplicaStatus
from console.control.desired import bump_generations
from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.fleet.models import Gpu, Host
from console.intake import stages as intake
from console.intake.stages import Closed, Item, LeaseChecks, apply_batch, apply_hosts, apply_readings
from tests.queries import statements as logged

pytestmark = pytest.mark.django_db
GiB = 1024**3


def fleet(n: int, model, first: int = 0) -> list[tuple[Host, list[Replica]]]:
    out = []
    for i in range(first, first + n):
        h = Host.objects.create(name=f"b{i}", endpoint="http://127.0.0.1:9", connected=True, last_seen=timezone.now())
        for g in range(2):
            Gpu.objects.create(host=h, index=g, uuid=f"SIM-{i}-{g}", name="sim", total_bytes=24 * GiB, simulated=True)
        dep = Deployment.objects.create(name=f"d{i}", model=model, estimates={})
        out.append((h, [Replica.objects.create(deployment=dep, index=k, host=h) for k in range(2)]))
    return out


def report(i: int, replicas: list[Replica], used: int) -> HostReport:
    gpus = [GpuInfo(index=g, uuid=f"SIM-{i}-{g}", name="sim", total_bytes=24 * GiB, used_bytes=used, simulated=True)
            for g in range(2)]
    return HostReport(gpus=gpus, replicas=[ReplicaStatus(replica_id=r.pk, state="ready", pid=100 + k)
                                           for k, r in enumerate(replicas)])


def tick_queries(hosts, used: int) -> int:
    items = [Item(h.pk, h.name, report(int(h.name[1:]), rs, used)) for h, rs in hosts]
    with CaptureQueriesContext(connection) as ctx:
        outcomes = apply_batch(items)
    assert all(o.error is None for o in outcomes)
    return len(ctx.captured_queries)


def test_a_ticks_statements_do_not_grow_with_the_hosts(model):
    few, many = fleet(3, model), fleet(37, model, first=3)
    assert tick_queries(few, 1 * GiB) == tick_queries(many, 1 * GiB)
    assert Gpu.objects.filter(used_bytes=1 * GiB).count() == 2 * 40
    assert Replica.objects.filter(observed_state="ready", pid__isnull=False).count() == 2 * 40


def test_a_batch_applies_each_hosts_messages_to_its_own_rows_only(model, host):
    (h, replicas), = fleet(1, model)
    theirs = Replica.objects.create(deployment=Deployment.objects.get(name="d0"), index=5, host=host)
    outcomes = apply_batch([
        Item(h.pk, h.name, ReplicaStatus(replica_id=replicas[0].pk, state="loading", loaded_bytes=5)),
        Item(h.pk, h.name, ReplicaStatus(replica_id=theirs.pk, state="failed", reason="not yours")),
        Item(h.pk, h.name, Ack(generation=7)),  # never sent: refused, the rest still applied
        Item(h.pk, h.name, ReplicaStatus(replica_id=replicas[0].pk, state="ready", pid=42)),
    ])
    assert outcomes[2].error and "generation 7" in outcomes[2].error
    assert [o.error for o in (outcomes[0], outcomes[1], outcomes[3])] == [None, None, None]
    assert outcomes[3].observed and not outcomes[1].observed
    theirs.refresh_from_db()
    assert theirs.observed_state == "pending" and theirs.observed_reason == ""
    mine = Replica.objects.get(pk=replicas[0].pk)
    assert (mine.observed_state, mine.pid, mine.loaded_bytes) == ("ready", 42, 5)  # in order, the last wins


def ack_tick(hosts, generations: dict[str, list[int]]) -> tuple[list, int]:
    items = [Item(h.pk, h.name, Ack(generation=g)) for h, _ in hosts for g in generations.get(h.name, [])]
    with CaptureQueriesContext(connection) as ctx:
        outcomes = apply_batch(items)
    return outcomes, len(ctx.captured_queries)


def test_a_ticks_acks_cost_statements_that_do_not_grow_with_them_and_never_go_back(model):
    hosts = fleet(12, model)
    Host.objects.update(generation=5, acked_generation=2)
    _, few = ack_tick(hosts[:2], {"b0": [3], "b1": [3]})
    outcomes, many = ack_tick(hosts, {h.name: [4, 3] for h, _ in hosts} | {"b0": [5, 9, 4]})
    assert few == many
    assert [o.error for o in outcomes[:3]] == [None, outcomes[1].error, None] and "generation 9" in outcomes[1].error
    assert all(o.error is None for o in outcomes[3:])
    acked = dict(Host.objects.values_list("name", "acked_generation"))
    assert acked == {h.name: 4 for h, _ in hosts} | {"b0": 5}  # the newest valid ack; an older one never lowers it


def test_a_ticks_acks_are_checked_and_recorded_in_one_round_trip_on_postgresql(model):
    """Each return from the database waits for the interpreter lock in a busy console: on PostgreSQL the hosts'
    generations are read, and the acks they allow written, by one statement (elsewhere a read, then an UPDATE)."""
    hosts = fleet(3, model)
    Host.objects.update(generation=5, acked_generation=2)
    with CaptureQueriesContext(connection) as ctx:
        outcomes = apply_batch([Item(h.pk, h.name, Ack(generation=g)) for h, _ in hosts for g in (4, 9)])
    assert [o.error is None for o in outcomes] == [True, False] * 3  # 9 was never sent: refused
    acks = [sql for sql in logged(ctx.captured_queries) if "generation" in sql]
    assert len(acks) == (1 if connection.vendor == "postgresql" else 2), acks
    assert set(Host.objects.values_list("acked_generation", flat=True)) == {4}


def test_a_steady_pass_rebuilds_no_desired_state(host, model):
    from console.deployments.services import create_deployment

    for name in ("a", "b", "c"):
        create_deployment(name, "tiny")
    reconcile_once()
    reconcile_once()
    with CaptureQueriesContext(connection) as ctx:
        result = reconcile_once()
    assert result.changed_hosts == ()
    # Building a desired state reads replicas joined with their deployment's model: a steady pass never does.
    assert not any('FROM "deployments_replica"' in q["sql"] and 'INNER JOIN "catalog_model"' in q["sql"]
                   for q in ctx.captured_queries)


def test_a_lease_renewed_lately_is_not_written_again(model, settings):
    # A wave brings each host's acks and statuses many times a second; writing last_seen for every batch made half
    # of an ack's batch, and locked host rows a pass writes. A lease is written again once a quarter of it passed.
    settings.MODELGRID_HOST_LEASE_SECONDS = 20.0
    (fresh, fresh_replicas), (stale, stale_replicas) = fleet(2, model)
    now = timezone.now()
    Host.objects.filter(pk=fresh.pk).update(last_seen=now - timezone.timedelta(seconds=4))
    Host.objects.filter(pk=stale.pk).update(last_seen=now - timezone.timedelta(seconds=6))
    quiet = HostReport(gpus=[], replicas=[], serving=None, ram_free_bytes=None)
    outcomes = apply_batch([Item(fresh.pk, fresh.name, quiet), Item(stale.pk, stale.name, quiet)])
    assert [o.error for o in outcomes] == [None, None]
    fresh.refresh_from_db()
    stale.refresh_from_db()
    assert now - fresh.last_seen >= timezone.timedelta(seconds=4)  # not written
    assert timezone.now() - stale.last_seen < timezone.timedelta(seconds=2)  # renewed


def lease_statements(captured) -> list[str]:
    return [q for q in logged(captured) if "last_seen" in q or '"connected"' in q]


def test_a_batcher_looks_at_a_hosts_lease_once_a_renewal_interval_and_at_those_due_together(
        model, settings, monkeypatch, django_capture_on_commit_callbacks):
    # In a 1,000-host wave every batch looked at its hosts' leases, an ack's batch too: two statements locking host
    # rows, most of the hosts stage's time. A host looked at within a renewal interval cannot have lapsed since.
    settings.MODELGRID_HOST_LEASE_SECONDS = 20.0  # renewal interval: 5 s
    (h, _), (other, _) = fleet(2, model)
    Host.objects.filter(pk__in=[h.pk, other.pk]).update(generation=3,
                                                        last_seen=timezone.now() - timezone.timedelta(seconds=30))
    leases, clock = LeaseChecks(), [1000.0]
    monkeypatch.setattr(intake.time, "monotonic", lambda: clock[0])

    def batch(message, host=h):
        with CaptureQueriesContext(connection) as ctx, django_capture_on_commit_callbacks(execute=True):
            staged = apply_hosts([Item(host.pk, host.name, message)], leases)
        assert all(o is None or o.error is None for o in staged.outcomes)
        return lease_statements(ctx.captured_queries)

    def age(host) -> float:
        return (timezone.now() - Host.objects.get(pk=host.pk).last_seen).total_seconds()

    assert batch(Ack(generation=1))  # looked at, and written
    assert age(h) < 2
    clock[0] += 0.5
    assert batch(Ack(generation=1), other) == []  # due, but a sweep just looked: it waits for the next
    assert age(other) > 20
    clock[0] += 0.5
    assert batch(Ack(generation=2))  # the next sweep, a second after the last: the one waiting is looked at too
    assert age(other) < 2
    assert Host.objects.get(pk=h.pk).acked_generation == 2
    clock[0] += 3.9
    assert batch(Ack(generation=3)) == []  # within the renewal interval: the ack alone

    # Past the interval it is looked at again: a host that went unknown meanwhile (as it cannot unless its agent
    # fell silent) comes back.
    Host.objects.filter(pk=h.pk).update(connected=False, unknown_since=timezone.now())
    clock[0] += 0.2
    assert batch(Ack(generation=3))
    assert Host.objects.get(pk=h.pk).lifecycle == "connected"

    # A closed link is forgotten: no sweep brings its host back, and the host's next link is looked at.
    Host.objects.filter(pk=other.pk).update(link_epoch=4)
    clock[0] += 5.5
    assert batch(Ack(generation=3), other)  # due, and a sweep
    clock[0] += 5.1
    assert batch(Ack(generation=3), h)  # due, and a sweep
    clock[0] += 0.1
    assert batch(Ack(generation=3), other) == []  # due, waiting for the next sweep
    batch(Closed(epoch=4), other)  # ... when its link closes
    clock[0] += 1.0
    assert batch(Ack(generation=3), h) == []  # that sweep has nothing to look at: the closed host is not brought back
    assert Host.objects.get(pk=other.pk).lifecycle == "unknown"
    assert batch(Ack(generation=3), other)  # its next link's first message is looked at
    assert Host.objects.get(pk=other.pk).lifecycle == "connected"

    # What a batch that failed looked at is not learnt: nothing it wrote was committed.
    clock[0] += 10
    monkeypatch.setattr(intake, "_apply_acks", lambda *a: 1 / 0)
    with django_capture_on_commit_callbacks(execute=True):
        apply_hosts([Item(h.pk, h.name, Ack(generation=3))], leases)
    clock[0] += 1
    assert h.pk in leases.due(set(), clock[0])
    assert leases._at == {}  # a sweep keeps only hosts looked at within the interval: none here


def test_a_quiet_report_renews_the_lease_and_keeps_what_it_leaves_out(model):
    (h, replicas), = fleet(1, model)
    tick_queries([(h, replicas)], 1 * GiB)  # the first report on the link: whole
    Host.objects.filter(pk=h.pk).update(serving={"d0": {"requests": 3}}, ram_free_bytes=5 * GiB,
                                        last_seen=timezone.now() - timezone.timedelta(seconds=30))
    quiet = HostReport(gpus=[], replicas=[], serving=None, ram_free_bytes=None)  # "nothing changed"
    with CaptureQueriesContext(connection) as ctx:
        (outcome,) = apply_batch([Item(h.pk, h.name, quiet)])
    assert outcome.error is None and not outcome.observed and not outcome.news  # the scheduler sleeps on
    statements = [q for q in logged(ctx.captured_queries) if q.startswith(("UPDATE", "INSERT", "SELECT"))]
    # The lease, nothing else: its host row, locked first (in key order, as every writer of host rows) and written.
    locks = ('SELECT "fleet_host"."id" AS "pk" FROM "fleet_host"', 'FOR UPDATE OF "fleet_host"')
    assert statements and all(q.startswith('UPDATE "fleet_host"') or (
        connection.vendor == "postgresql" and q.startswith(locks[0]) and q.endswith(locks[1])) for q in statements)
    h.refresh_from_db()
    assert (h.serving, h.ram_free_bytes) == ({"d0": {"requests": 3}}, 5 * GiB)
    assert timezone.now() - h.last_seen < timezone.timedelta(seconds=5)
    assert Gpu.objects.filter(host=h, used_bytes=1 * GiB).count() == 2  # the GPUs' last readings stay

    # An explicit empty list and a number are news: the host served nothing lately and has that much room.
    (outcome,) = apply_batch([Item(h.pk, h.name, HostReport(gpus=[], serving=[], ram_free_bytes=GiB))])
    assert outcome.news
    h.refresh_from_db()
    assert (h.serving, h.ram_free_bytes) == ({}, GiB)


def test_the_first_stage_commits_leases_and_acks_and_leaves_readings_to_the_second(model):
    # An ack waits for nothing but host rows: not for the GPU readings and replica states that came with it (at
    # 100 hosts a wave's readings held each tick's acks 0.2-0.3 s).
    (h, replicas), = fleet(1, model)
    Host.objects.filter(pk=h.pk).update(generation=3)
    items = [Item(h.pk, h.name, report(0, replicas, 2 * GiB)), Item(h.pk, h.name, Ack(generation=3))]
    with CaptureQueriesContext(connection) as ctx:
        staged = apply_hosts(items)
    assert Host.objects.get(pk=h.pk).acked_generation == 3
    assert not any(table in q["sql"] for q in ctx.captured_queries for table in ("fleet_gpu", "deployments_replica"))
    assert not Gpu.objects.filter(host=h, used_bytes=2 * GiB).exists()
    outcomes = apply_readings(items, staged)
    assert [(o.error, o.news) for o in outcomes] == [(None, True), (None, True)]
    assert outcomes[0].observed and not outcomes[1].observed
    assert Gpu.objects.filter(host=h, used_bytes=2 * GiB).count() == 2
    assert Replica.objects.filter(host=h, observed_state="ready").count() == 2


def test_reports_of_one_host_in_one_tick_each_keep_what_they_say(model):
    # Reports list only what changed since the last: a tick holding two of one host's reports must apply both,
    # or a reading only the first listed is lost until the next whole report (30 s later).
    (h, replicas), = fleet(1, model)
    tick_queries([(h, replicas)], 1 * GiB)
    changed = HostReport(gpus=[GpuInfo(index=1, uuid="SIM-0-1", name="sim", total_bytes=24 * GiB, used_bytes=3 * GiB,
                                       simulated=True)], serving=[], ram_free_bytes=7 * GiB)
    then = HostReport(gpus=[GpuInfo(index=0, uuid="SIM-0-0", name="sim", total_bytes=24 * GiB, used_bytes=2 * GiB,
                                    simulated=True)], serving=None, ram_free_bytes=None)
    outcomes = apply_batch([Item(h.pk, h.name, changed), Item(h.pk, h.name, then)])
    assert all(o.error is None and o.news for o in outcomes)
    used = dict(Gpu.objects.filter(host=h).values_list("index", "used_bytes"))
    assert used == {0: 2 * GiB, 1: 3 * GiB}
    h.refresh_from_db()
    assert (h.serving, h.ram_free_bytes) == ({}, 7 * GiB)
    # The later word on the same GPU wins.
    apply_batch([Item(h.pk, h.name, then.model_copy(update={"gpus": [then.gpus[0].model_copy(
        update={"used_bytes": 4 * GiB})]})), Item(h.pk, h.name, then)])
    assert Gpu.objects.get(host=h, index=0).used_bytes == 2 * GiB


def loads_queries(hosts) -> int:
    from agent.protocol import Measurement

    def ready(r, k):
        m = Measurement(device="cpu", batch=1, seq=2048, weights_bytes=4096, peak_bytes=GiB, total_bytes=GiB)
        return ReplicaStatus(replica_id=r.pk, state="ready", pid=500 + k, measured_bytes=GiB, measurement=m)

    items = [Item(h.pk, h.name, ready(r, k)) for h, rs in hosts for k, r in enumerate(rs)]
    with CaptureQueriesContext(connection) as ctx:
        assert all(o.error is None for o in apply_batch(items))
    return len(ctx.captured_queries)


def test_replicas_becoming_ready_together_are_kept_as_loads_in_statements_that_do_not_grow_with_them(model):
    from console.catalog.models import MemorySample

    few, many = fleet(2, model), fleet(20, model, first=2)
    assert loads_queries(few) == loads_queries(many)
    assert MemorySample.objects.count() == 2 * 22  # one per worker
    assert not MemorySample.objects.filter(estimated_bytes=0).exists()  # each beside the model's estimate
    loads_queries(many)  # the same workers again: nothing new kept
    assert MemorySample.objects.count() == 2 * 22


def test_a_pass_creates_the_rows_of_new_deployments_together(host, model):
    from console.deployments.services import create_deployment

    for k in range(12):
        create_deployment(f"n{k}", "tiny", replicas=2)
    with CaptureQueriesContext(connection) as ctx:
        reconcile_once()
    inserts = [q for q in logged(ctx.captured_queries) if q.startswith(("INSERT", "COPY"))]  # COPY: PostgreSQL
    assert sum('"deployments_replica"' in q.split("(")[0] for q in inserts) == 1  # all 24 rows, one statement
    assert sum('"deployments_replica_gpus"' in q.split("(")[0] for q in inserts) == 1  # and their GPUs
    placed = Replica.objects.filter(deployment__name__startswith="n", host=host)
    assert placed.count() == 24 and all(r.gpus.count() == 1 for r in placed)


def bump_queries(hosts) -> tuple[dict, list[str]]:
    Host.objects.filter(pk__in=[h.pk for h, _ in hosts]).update(desired_digest="")  # stale: rebuilt
    with CaptureQueriesContext(connection) as ctx:
        states = bump_generations([h.pk for h, _ in hosts])
    return states, logged(ctx.captured_queries)


def test_a_pass_gives_hosts_new_generations_in_statements_that_do_not_grow_with_them(model):
    """The host rows a pass bumps stay locked until it commits, and intake's leases and acks wait for them."""
    from console.fleet.models import HostDesired

    few, many = fleet(2, model), fleet(20, model, first=2)
    assert len(bump_generations(None)) == 22  # every host's first generation
    _, statements_few = bump_queries(few)
    states, statements_many = bump_queries(many)
    assert len(statements_few) == len(statements_many)
    assert sorted(states) == sorted(h.pk for h, _ in many)
    for h, replicas in many:
        h.refresh_from_db()
        generation, text = states[h.pk]
        assert generation == h.generation == 2
        # One serialization: the text pushed is the one hashed into the digest, and the one stored.
        assert h.desired_digest == hashlib.sha256(text.encode()).hexdigest()
        desired = json.loads(text)
        assert sorted(r["id"] for r in desired) == sorted(r.pk for r in replicas)
        assert HostDesired.objects.get(host=h).replicas == desired
    assert bump_generations([h.pk for h, _ in many]) == {}  # rebuilt and unchanged: no new generation


def test_a_bump_writes_the_host_rows_last(model):
    """From their UPDATE until the pass commits, the bumped host rows are locked and intake's leases and acks wait:
    nothing is written after them (storing what is pushed came after them, and held 1,000 hosts' rows longer)."""
    states, statements = bump_queries(fleet(3, model))
    assert len(states) == 3
    writes = [q for q in statements if not q.startswith("SELECT")]
    assert writes[-1].startswith('UPDATE "fleet_host"') and "generation" in writes[-1]
    assert any(q.startswith('INSERT INTO "fleet_hostdesired"') for q in writes[:-1])


def test_a_host_marked_stale_while_a_pass_builds_it_is_left_for_the_next_pass(model, monkeypatch):
    """A deployment edited between a pass's read of a host and its bump marks the host stale: the pass gives it no
    generation, and the host stays stale, so the next pass rebuilds it from the edit."""
    from console.control import desired
    from console.fleet.models import HostDesired

    hosts = fleet(2, model)
    bump_generations(None)
    (edited, _), (other, _) = hosts
    build = desired.desired_rows_by_host

    def build_then_edit(host_ids):
        rows = build(host_ids)
        Host.objects.filter(pk=edited.pk).update(desired_digest="")  # mark_stale, committed by the edit meanwhile
        return {pk: [r | {"max_batch_size": 99} for r in rs] for pk, rs in rows.items()}  # a state to push

    monkeypatch.setattr(desired, "desired_rows_by_host", build_then_edit)
    Host.objects.filter(pk=edited.pk).update(desired_digest="before")
    states = bump_generations([edited.pk, other.pk])
    assert sorted(states) == [other.pk]
    edited.refresh_from_db()
    assert edited.desired_digest == "" and edited.generation == 1  # stale: the next pass bumps it
    assert HostDesired.objects.get(host=other).replicas == json.loads(states[other.pk][1])
    monkeypatch.setattr(desired, "desired_rows_by_host", build)
    assert edited.pk in bump_generations([])  # stale hosts are rebuilt whatever the pass touched


def test_a_status_that_cannot_be_applied_costs_only_its_own_message(model, monkeypatch):
    from django.db import DatabaseError

    from console.intake import stages as intake

    (h, (good, bad)), = fleet(1, model)
    apply = intake._apply_statuses

    def failing_for_bad(items, statuses):
        if any(s.replica_id == bad.pk for _, _, s in statuses):
            raise DatabaseError("value out of range")
        return apply(items, statuses)

    monkeypatch.setattr(intake, "_apply_statuses", failing_for_bad)
    outcomes = apply_batch([Item(h.pk, h.name, ReplicaStatus(replica_id=good.pk, state="ready", pid=1)),
                            Item(h.pk, h.name, ReplicaStatus(replica_id=bad.pk, state="ready", pid=2)),
                            Item(h.pk, h.name, Ack(generation=0))])
    assert outcomes[0].error is None and outcomes[0].observed
    assert "DatabaseError" in outcomes[1].error and outcomes[2].error is None
    assert Replica.objects.get(pk=good.pk).observed_state == "ready"
    assert Replica.objects.get(pk=bad.pk).observed_state == "pending"


def test_statuses_write_only_the_fields_they_change(model):
    # A wave's statuses (starting -> loading -> ready on every replica) wrote all ten observed fields of every row,
    # the JSON ones included, whatever changed.
    (h, replicas), = fleet(1, model)
    Replica.objects.filter(pk=replicas[1].pk).update(sleep_wake={"seconds": 1.5})
    with CaptureQueriesContext(connection) as ctx:
        (outcome,) = apply_batch([Item(h.pk, h.name, HostReport(gpus=[], replicas=[
            ReplicaStatus(replica_id=replicas[0].pk, state="loading", loaded_bytes=5),
            ReplicaStatus(replica_id=replicas[1].pk, state="loading", loaded_bytes=7)]))])
    assert outcome.error is None and outcome.observed
    updates = [q for q in logged(ctx.captured_queries) if q.startswith('UPDATE "deployments_replica"')]
    assert len(updates) == 1
    assert '"observed_state"' in updates[0] and '"loaded_bytes"' in updates[0]
    assert '"sleep_wake"' not in updates[0] and '"adapter_stats"' not in updates[0]
    assert list(Replica.objects.filter(pk__in=[r.pk for r in replicas]).order_by("pk").values_list(
        "observed_state", "loaded_bytes", "sleep_wake")) == [("loading", 5, {}), ("loading", 7, {"seconds": 1.5})]


def test_a_replicas_state_is_news_for_the_plan_only_where_the_plan_reads_it(model):
    (h, replicas), = fleet(1, model)
    Gpu.objects.filter(host=h).update(own_bytes=0)  # the agent says what its workers hold on each GPU
    (outcome,) = apply_batch([Item(h.pk, h.name, ReplicaStatus(replica_id=replicas[0].pk, state="loading"))])
    assert outcome.observed and not outcome.news  # the deployment's state follows; there is nothing to plan
    # An agent that does not say: the plan credits it with what its ready replicas measured (snapshot.gpu_specs).
    Gpu.objects.filter(host=h).update(own_bytes=None)
    (outcome,) = apply_batch([Item(h.pk, h.name, ReplicaStatus(replica_id=replicas[0].pk, state="ready", pid=7,
                                                               measured_bytes=GiB))])
    assert outcome.observed and outcome.news


def test_a_busy_hosts_readings_are_written_but_wake_the_scheduler_only_when_what_it_plans_with_moves(model):
    # A busy GPU's utilisation and its own workers' memory (their KV cache) move in every report, and so do the
    # host's serving figures: waking a pass for each was a pass per report. Other processes' memory is what the plan
    # reads of a reading.
    from agent.protocol import DeploymentServing

    (h, replicas), = fleet(1, model)

    def gpu(used, own, utilization):
        return GpuInfo(index=0, uuid="SIM-0-0", name="sim", total_bytes=24 * GiB, used_bytes=used, own_bytes=own,
                       utilization=utilization, simulated=True)

    def serving(rate):
        return [DeploymentServing(deployment="d0", requests=10, request_rate=rate, error_rate=0.0)]

    apply_batch([Item(h.pk, h.name, HostReport(gpus=[gpu(2 * GiB, 2 * GiB, 10.0)], serving=serving(1.0),
                                               ram_free_bytes=GiB))])
    busier = HostReport(gpus=[gpu(2 * GiB + (60 << 20), 2 * GiB + (60 << 20), 93.5)], serving=serving(4.0),
                        ram_free_bytes=None)
    (outcome,) = apply_batch([Item(h.pk, h.name, busier)])
    assert outcome.error is None and not outcome.news
    row = Gpu.objects.get(host=h, index=0)
    assert (row.used_bytes, row.utilization) == (2 * GiB + (60 << 20), 93.5)  # written all the same
    assert Host.objects.get(pk=h.pk).serving["d0"]["request_rate"] == 4.0
    foreign = HostReport(gpus=[gpu(3 * GiB, 2 * GiB, 93.5)], serving=None, ram_free_bytes=None)  # 1 GiB not ours
    (outcome,) = apply_batch([Item(h.pk, h.name, foreign)])
    assert outcome.news


def test_batches_staged_apart_are_read_together_in_order(model):
    # Readings held back while passes run are applied together, as one: positions are offset batch by batch, and a
    # replica's later status wins over its earlier one, as when they came in separate batches.
    (h, replicas), = fleet(1, model)
    first = [Item(h.pk, h.name, ReplicaStatus(replica_id=replicas[0].pk, state="loading"))]
    second = [Item(h.pk, h.name, Ack(generation=0)),
              Item(h.pk, h.name, ReplicaStatus(replica_id=replicas[0].pk, state="ready", pid=4))]
    joined = intake.Staged.joined([(0, apply_hosts(first)), (1, apply_hosts(second))])
    assert [i for i, _, _ in joined.statuses] == [0, 2]
    outcomes = apply_readings(first + second, joined)
    assert [o.observed for o in outcomes] == [True, False, True]
    assert Replica.objects.values_list("observed_state", "pid").get(pk=replicas[0].pk) == ("ready", 4)


def test_a_replicas_measured_load_time_is_kept_while_it_is_stopped(model):
    """What a request that must start it again waits: its last load's seconds, as its worker measured them."""
    from agent.protocol import Measurement

    ((h, (r, _)),) = fleet(1, model)
    m = Measurement(device="cpu", batch=1, seq=2048, weights_bytes=4096, peak_bytes=GiB, total_bytes=GiB,
                    load_seconds=59.4)
    apply_batch([Item(h.pk, h.name, ReplicaStatus(replica_id=r.pk, state="ready", pid=500, measurement=m))])
    apply_batch([Item(h.pk, h.name, ReplicaStatus(replica_id=r.pk, state="stopped", reason="stopped instead of "
                                                  "sleeping: vLLM cannot sleep on CPU (its sleep mode needs CUDA)"))])
    r.refresh_from_db()
    assert (r.observed_state, r.start_seconds) == ("stopped", 59.4)
