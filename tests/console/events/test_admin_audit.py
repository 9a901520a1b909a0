"""Changes made in the Django admin are told on the timeline like anyone's, with who made them."""

from types import SimpleNamespace

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import RequestFactory

from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from console.events.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def request_by_root():
    request = RequestFactory().post("/admin/")
    request.user = get_user_model().objects.create_superuser("root", password="a-long-password")
    return request


def test_a_policy_change_in_the_admin_says_who_and_before_and_after(model, request_by_root):
    dep = create_deployment("chat", "tiny")
    dep.priority = "critical"
    form = SimpleNamespace(changed_data=["priority"], initial={"priority": "standard"},
                           cleaned_data={"priority": "critical"})
    admin.site._registry[Deployment].save_model(request_by_root, dep, form, change=True)
    e = Event.objects.get(reason="Changed")
    assert (e.object, e.deployment, e.actor) == ("deployment/chat", "chat", "user root (admin)")
    assert e.message == "priority 'standard' → 'critical'"
    assert Deployment.objects.get(name="chat").priority == "critical"


def test_a_save_that_changed_nothing_tells_nothing_and_a_delete_does(model, request_by_root):
    dep = create_deployment("chat", "tiny")
    registered = admin.site._registry[Deployment]
    registered.save_model(request_by_root, dep, SimpleNamespace(changed_data=[], initial={}, cleaned_data={}), True)
    assert not Event.objects.filter(reason="Changed").exists()
    registered.delete_model(request_by_root, dep)
    assert Event.objects.get(reason="Deleted", actor="user root (admin)").object == "deployment/chat"


def test_an_admin_edit_wakes_the_scheduler_and_rebuilds_its_hosts_desired_states(model, request_by_root,
                                                                                   monkeypatch, host):
    from console.deployments import admin as deployments_admin
    from console.deployments.models import Replica

    woken = []
    monkeypatch.setattr(deployments_admin, "wake_scheduler", lambda: woken.append(1))
    dep = create_deployment("chat", "tiny")
    Replica.objects.create(deployment=dep, index=0, host=host)
    type(host).objects.filter(pk=host.pk).update(desired_digest="x")
    dep.max_batch_size = 64
    form = SimpleNamespace(changed_data=["max_batch_size"], initial={"max_batch_size": 8},
                           cleaned_data={"max_batch_size": 64})
    with pytest.MonkeyPatch.context() as m:
        m.setattr("django.db.transaction.on_commit", lambda fn, *a, **k: fn())
        admin.site._registry[Deployment].save_model(request_by_root, dep, form, change=True)
        assert woken and type(host).objects.get(pk=host.pk).desired_digest == ""
        type(host).objects.filter(pk=host.pk).update(desired_digest="x")
        admin.site._registry[Deployment].delete_model(request_by_root, dep)
    assert len(woken) == 2 and type(host).objects.get(pk=host.pk).desired_digest == ""


def test_a_model_edit_in_the_admin_rebuilds_the_desired_states_of_its_deployments_hosts(model, request_by_root,
                                                                                        monkeypatch, host, client,
                                                                                        tmp_path):
    # The model's path is in every desired replica of its deployments: an edit must reach their hosts now, not
    # at the scheduler's next resync.
    import shutil

    from console.catalog import admin as catalog_admin
    from console.control.desired import bump_generations
    from console.deployments.models import Replica

    woken = []
    monkeypatch.setattr(catalog_admin, "wake_scheduler", lambda: woken.append(1))
    monkeypatch.setattr("django.db.transaction.on_commit", lambda fn, *a, **k: fn())
    dep = create_deployment("chat", "tiny")
    Replica.objects.create(deployment=dep, index=0, host=host, desired_state="ready")
    bump_generations()
    before = type(host).objects.get(pk=host.pk).generation
    moved = shutil.copytree(model.path, tmp_path / "tiny-moved")
    client.force_login(request_by_root.user)
    change = f"/admin/catalog/model/{model.pk}/change/"
    assert client.post(change, {"name": "tiny", "path": str(moved)}).status_code == 302
    assert woken == [1] and type(host).objects.get(pk=host.pk).desired_digest == ""
    assert bump_generations([]) and type(host).objects.get(pk=host.pk).generation == before + 1  # the pass's push
    assert client.post(change, {"name": "tiny", "path": str(moved)}).status_code == 302
    assert woken == [1]  # a save that changed nothing wakes nothing
