"""One deployment policy: the API, the services, the SLO form and the Django admin all refuse the same
things, with the field named, and a refusal stores nothing."""

import json

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth import get_user_model
from django.test import RequestFactory

from console.deployments.models import Deployment
from console.deployments.policy import Policy, creation_defaults, merged, validate_policy
from console.deployments.services import create_deployment, update_deployment
from console.errors import Invalid


def test_replicas_alone_is_a_fixed_count_and_a_range_alone_keeps_the_count_inside():
    stored = Policy(min_replicas=1, max_replicas=4, replicas=2).model_dump()
    assert {k: merged(stored, {"replicas": 3})[k] for k in ("min_replicas", "max_replicas", "replicas")} == {
        "min_replicas": 3, "max_replicas": 3, "replicas": 3}
    assert merged(stored, {"max_replicas": 1})["replicas"] == 1
    assert merged(stored, {"min_replicas": 3})["replicas"] == 3


def test_a_count_and_a_range_together_are_taken_as_given_and_checked():
    stored = Policy().model_dump()
    with pytest.raises(Invalid) as e:
        validate_policy(merged(stored, {"replicas": 3, "min_replicas": 1}))
    assert e.value.fields == ["replicas"]
    assert str(e.value) == "replicas 3 is outside [min_replicas 1, max_replicas 1]"


def test_creating_with_a_minimum_alone_is_that_many_fixed():
    chosen = validate_policy(merged(creation_defaults({"min_replicas": 2}), {"min_replicas": 2}))
    assert (chosen.min_replicas, chosen.max_replicas, chosen.replicas) == (2, 2, 2)


@pytest.mark.parametrize("changes, field", [
    ({"slo_latency_ms": 0}, "slo_latency_ms"),
    ({"min_replicas": 5, "max_replicas": 1}, "max_replicas"),
    ({"max_batch_delay_ms": float("inf")}, "max_batch_delay_ms"),
    ({"idle_timeout_s": True}, "idle_timeout_s"),
    ({"selector": {"gpu": ""}}, "selector"),
    ({"priority": "urgent"}, "priority"),
    ({"replicas": None}, "replicas"),
])
def test_each_bad_value_is_refused_naming_its_field(changes, field):
    with pytest.raises(Invalid) as e:
        validate_policy(merged(Policy().model_dump(), changes))
    assert e.value.fields[0] == field
    assert all(item["loc"][0] == "body" and item["type"] for item in e.value.errors)


@pytest.mark.django_db
def test_the_service_refuses_a_count_outside_the_range_and_changes_nothing(model):
    create_deployment("chat", "tiny", replicas=1)
    before = Deployment.objects.values().get()
    with pytest.raises(Invalid, match="replicas 3 is outside"):
        update_deployment("chat", {"replicas": 3, "min_replicas": 1})
    assert Deployment.objects.values().get() == before


@pytest.mark.django_db
def test_an_explicit_null_target_removes_the_slo(model):
    create_deployment("chat", "tiny", slo_latency_ms=200)
    assert update_deployment("chat", {"slo_latency_ms": None}).slo_latency_ms is None


@pytest.mark.django_db
def test_the_django_admin_validates_through_the_policy(model):
    dep = create_deployment("chat", "tiny")
    admin = site._registry[Deployment]
    request = RequestFactory().post("/admin/")
    request.user = get_user_model().objects.create_superuser("root", password="a-long-password")
    form_class = admin.get_form(request, dep, change=True)
    data = {f: getattr(dep, f) for f in form_class.base_fields if getattr(dep, f, None) is not None}
    data |= {"model": dep.model.pk, "selector": "{}", "tolerations": "{}", "engine_args": "[]",
             "estimates": json.dumps(dep.estimates), "gateway_stats": "{}",
             "created_0": dep.created.date().isoformat(), "created_1": dep.created.time().strftime("%H:%M:%S"),
             "min_replicas": 5, "max_replicas": 1}
    form = form_class(data, instance=dep)
    assert not form.is_valid()
    assert "max_replicas 1 is below min_replicas 5" in form.errors["max_replicas"][0]
    assert Deployment.objects.get().min_replicas == 1
    form = form_class(data | {"min_replicas": 1, "max_replicas": 2, "replicas": 2}, instance=dep)
    assert form.is_valid(), form.errors  # the same form saves a good policy


@pytest.mark.django_db
def test_a_one_click_deploy_keeps_zero_replicas(model, user_client):
    r = user_client.post("/models/tiny/deploy/", {"name": "cold", "replicas": "0"})
    assert r.status_code == 302
    assert Deployment.objects.get(name="cold").replicas == 0
