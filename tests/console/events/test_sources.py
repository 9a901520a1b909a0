"""Who writes the timeline: the scheduler (each decision that changed a replica, with its reason, the preemptor
named), agents (each replica state change, the worker's own error, hosts coming and going), and people and
tokens (what they changed, before and after)."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from agent.protocol import GpuInfo, Hello, Measurement, ReplicaStatus
from console.accounts.tokens import token_prefix
from console.control import reconcile
from console.control.reconcile import reconcile_once
from console.deployments.models import Replica
from console.deployments.services import create_deployment, update_deployment
from console.events.models import Event
from console.fleet.models import AgentCredential, Host
from console.intake.stages import Closed, Item, apply_batch, apply_one, register_hello
from tests.console.control.test_reconcile import sized

pytestmark = pytest.mark.django_db
GiB = 1024**3


def events(**filters) -> list[tuple[str, str, str]]:
    return list(Event.objects.filter(**filters).order_by("id").values_list("object", "reason", "message"))


def test_a_preemption_is_told_with_its_preemptor_and_outlives_later_passes(host, model):
    sized("cheap", 20, priority="batch")
    reconcile_once()
    sized("vital", 20, priority="critical")
    reconcile_once()
    for _ in range(3):
        reconcile_once()  # the replica's own reason moves on ("stays ..."); the event does not
    (preempted,) = Event.objects.filter(reason="Preempted")
    assert preempted.object == "replica/cheap#0" and preempted.type == "Warning"
    assert "preempted by vital#0 (critical" in preempted.message
    assert (preempted.deployment, preempted.host, preempted.actor) == ("cheap", "h1", "scheduler")
    assert ("replica/vital#0", "Placed") in [(o, r) for o, r, _ in events(deployment="vital")]


def test_a_refusal_is_told_once_not_every_pass(host, model):
    sized("huge", 100)
    for _ in range(3):
        reconcile_once()
    (refused,) = Event.objects.filter(reason="Refused")
    assert refused.object == "replica/huge#0" and refused.type == "Warning" and "100.00 GiB" in refused.message


def test_agent_reports_become_replica_events_with_measurements_and_the_workers_error(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    r = Replica.objects.get()
    estimated = r.reservation["estimated_bytes"]
    m = Measurement(device="cpu", batch=1, seq=64, weights_bytes=4096, peak_bytes=estimated,
                    total_bytes=estimated // 2, load_seconds=0.25)
    for status in (ReplicaStatus(replica_id=r.pk, state="loading", total_bytes=3 * GiB),
                   ReplicaStatus(replica_id=r.pk, state="ready", pid=42, measured_bytes=estimated // 2, measurement=m),
                   ReplicaStatus(replica_id=r.pk, state="failed", pid=42,
                                 reason="CUDA out of memory. Tried to allocate 2.00 GiB"),
                   ReplicaStatus(replica_id=r.pk, state="starting", pid=43)):
        apply_one(host, status)
    told = {reason: (message, obj) for obj, reason, message in events(actor="agent h1")}
    assert told["Loading"][0] == "loading weights: 3.00 GiB of weights"
    assert told["Ready"][0].startswith("loaded: measured ") and "(error +100.0%) in 0.25 s" in told["Ready"][0]
    assert told["OutOfMemory"] == ("CUDA out of memory. Tried to allocate 2.00 GiB", "replica/chat#0")
    assert told["Restarted"][0] == "its agent started the worker again after its failure (with backoff)"
    # The same status again is no news.
    apply_one(host, ReplicaStatus(replica_id=r.pk, state="starting", pid=43))
    assert Event.objects.filter(reason="Restarted").get().count == 1


def test_a_replica_stopped_instead_of_sleeping_is_told_as_stopped_not_asleep(host, model):
    create_deployment("chat", "tiny")
    reconcile_once()
    r = Replica.objects.get()
    apply_one(host, ReplicaStatus(replica_id=r.pk, state="ready", pid=42))
    apply_one(host, ReplicaStatus(replica_id=r.pk, state="stopped", reason="stopped instead of sleeping: vLLM "
                                  "cannot sleep on CPU (its sleep mode needs CUDA)"))
    told = {reason: message for _, reason, message in events(actor="agent h1")}
    assert told["Exited"] == ("stopped instead of sleeping: vLLM cannot sleep on CPU (its sleep mode needs CUDA); "
                              "nothing is kept in host memory: a request starts it again from disk")
    assert "Asleep" not in told


def test_hosts_connecting_going_silent_and_coming_back_are_told(host, settings):
    settings.MODELGRID_RECONNECT_GRACE_SECONDS = 0
    settings.MODELGRID_HOST_LEASE_SECONDS = 20
    reconcile.start_leading()
    credential, _ = AgentCredential.issue("h2")
    gpu = GpuInfo(index=0, uuid="SIM-x", name="sim", total_bytes=GiB, used_bytes=0, simulated=True)
    h2, epoch = register_hello(credential, Hello(protocol=1, host="h2", agent_version="0.9", endpoint="http://x:1",
                                                 gpus=[gpu]))
    apply_batch([Item(h2.pk, "h2", Closed(epoch))])
    Host.objects.filter(pk=host.pk).update(last_seen=timezone.now() - timedelta(seconds=30))
    reconcile_once()
    apply_one(host, ReplicaStatus(replica_id=999, state="ready"))  # any message renews the lease
    assert [r for _, r, _ in events(object="host/h2")] == ["TokenCreated", "Connected", "Disconnected"]
    assert "agent 0.9 connected with 1 GPU(s), serving at http://x:1" in events(object="host/h2")[1][2]
    assert [r for _, r, _ in events(object="host/h1")] == ["Unknown", "Reconnected"]


def test_changes_by_people_and_tokens_say_who_and_what_before_and_after(api, model):
    r = api.post("/api/v1/deployments", {"name": "chat", "model": "tiny"})
    assert r.status_code == 201
    update_deployment("chat", {"priority": "critical", "max_replicas": 3}, actor="user ann")
    assert api.delete("/api/v1/deployments/chat").status_code == 204
    told = events(object="deployment/chat")
    assert [reason for _, reason, _ in told] == ["Created", "PolicyChanged", "Deleted"]
    assert "priority standard → critical" in told[1][2] and "max" in told[1][2]
    actors = list(Event.objects.filter(object="deployment/chat").order_by("id").values_list("actor", flat=True))
    assert actors == ["token cli (ops)", "user ann", "token cli (ops)"]


def test_a_refused_change_tells_nothing(api, model):
    Event.objects.all().delete()
    assert api.post("/api/v1/deployments", {"name": "chat", "model": "missing"}).status_code == 422
    assert not Event.objects.exists()


def test_token_creation_is_told_with_the_command_that_made_it(db, capsys):
    call_command("createapitoken", "carol", "--name", "ci")
    (e,) = Event.objects.filter(reason="TokenCreated")
    assert e.object == "token/carol/ci" and e.actor.startswith("manage.py createapitoken (")
    token = capsys.readouterr().out.strip()
    # Named by its lookup prefix, as the admin lists it; the secret itself never lands on the timeline.
    assert token_prefix(token) + "…" in e.message and token not in e.message
