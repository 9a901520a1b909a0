"""A changed artifact rolls across a deployment's replicas one at a time: each pass releases one held replica (its
desired state then names the new revision and paths, and its agent restarts it, drained) only once the one before
is back and ready under a new worker; the others keep serving the old artifact meanwhile. A replica that fails to
start from the new artifact halts the rollout, saying so, and the rest keep serving."""

import pytest

from console.catalog.services import update_model
from console.control.desired import desired_rows_by_host
from console.control.reconcile import reconcile_once
from console.deployments.models import Replica
from console.deployments.services import create_deployment
from console.events.models import Event
from tests.conftest import write_model_dir

pytestmark = pytest.mark.django_db


def running(host):
    """Each replica's (revision, model path) as its host is told."""
    return {r["id"]: (r.get("revision", 0), r["model_path"]) for r in desired_rows_by_host([host.pk])[host.pk]}


def report(index, **fields):
    """What the replica's agent reports (observed state, pid)."""
    Replica.objects.filter(index=index).update(**fields)


@pytest.fixture
def pair(host, model):
    create_deployment("chat", "tiny", replicas=2)
    reconcile_once()
    report(0, observed_state="ready", pid=41)
    report(1, observed_state="ready", pid=42)
    return list(Replica.objects.order_by("index").values_list("pk", flat=True))


def test_replicas_restart_with_the_new_artifact_one_at_a_time(host, model, pair, tmp_path):
    old = model.path
    new = str(write_model_dir(tmp_path / "v2", inter=64).resolve())
    update_model("tiny", new)
    first, second = pair
    assert running(host) == {first: (0, old), second: (0, old)}  # nothing restarts before the scheduler rolls

    reconcile_once()
    assert running(host) == {first: (1, new), second: (0, old)}
    [began] = Event.objects.filter(reason="Restarting")
    assert began.object == "replica/chat#0" and "revision 1" in began.message

    # Its agent has not restarted it yet (the same worker still reports ready): the second one waits.
    reconcile_once()
    reconcile_once()
    assert running(host) == {first: (1, new), second: (0, old)}
    report(0, observed_state="loading", pid=51)
    reconcile_once()
    assert running(host)[second] == (0, old)

    report(0, observed_state="ready")  # back, under its new worker
    reconcile_once()
    assert running(host) == {first: (1, new), second: (1, new)}
    report(1, observed_state="ready", pid=52)
    reconcile_once()
    assert not Replica.objects.exclude(held={}).exists()
    assert not Replica.objects.filter(restarting_pid__isnull=False).exists()
    [done] = Event.objects.filter(reason="RolledOut")
    assert done.object == "deployment/chat" and "2 replica(s)" in done.message and "revision 1" in done.message
    reconcile_once()
    assert Event.objects.filter(reason="RolledOut").count() == 1


def test_a_replica_that_fails_on_the_new_artifact_halts_the_rollout_and_the_rest_keep_serving(host, model, pair,
                                                                                              tmp_path):
    old = model.path
    update_model("tiny", str(write_model_dir(tmp_path / "v2", inter=64)))
    first, second = pair
    reconcile_once()
    report(0, observed_state="failed", pid=None, observed_reason="cannot load")
    reconcile_once()
    reconcile_once()
    assert running(host)[second] == (0, old)
    [halted] = Event.objects.filter(reason="RolloutHalted")
    assert halted.type == "Warning" and "chat#0" in halted.message and "cannot load" in halted.message


def test_a_replica_that_serves_nothing_is_released_at_once_and_the_serving_one_waits_for_it(host, model, pair,
                                                                                            tmp_path):
    report(0, observed_state="loading", pid=41)
    update_model("tiny", str(write_model_dir(tmp_path / "v2", inter=64)))
    reconcile_once()
    # The loading one starts again from the new artifact straight away; the ready one, the only one serving, goes
    # once another serves.
    revisions = lambda: {pk: rev for pk, (rev, _) in running(host).items()}  # noqa: E731
    assert revisions() == {pair[0]: 1, pair[1]: 0}
    report(0, observed_state="ready", pid=51)
    reconcile_once()
    assert revisions() == {pair[0]: 1, pair[1]: 1}
