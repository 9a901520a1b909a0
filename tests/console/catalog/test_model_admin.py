"""Editing a model or a deployment in the Django admin keeps the memory figures the scheduler reserves by true.

The probe: a model's directory changed in the admin kept the old model's parameters and estimate, and each of its
deployments kept reserving the old model's memory; a deployment's batch or sequence length changed in the admin
kept the estimate made for the old ones (the API never changes serving settings after creation)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from console.catalog.models import Model
from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from tests.conftest import write_model_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    get_user_model().objects.create_superuser("root", password="a-long-password")
    client.login(username="root", password="a-long-password")
    return client


def _change_model(admin_client, model: Model, **fields):
    return admin_client.post(f"/admin/catalog/model/{model.pk}/change/", {"name": model.name, "path": model.path}
                             | fields)


def test_a_models_new_directory_is_read_and_its_deployments_reserve_the_new_models_memory(admin_client, model,
                                                                                         tmp_path):
    dep = create_deployment("chat", "tiny", batch=2)
    bigger = write_model_dir(tmp_path / "bigger", inter=64)
    answer = _change_model(admin_client, model, path=str(bigger))
    assert answer.status_code == 302, answer.content.decode()[:2000]
    moved = Model.objects.get(pk=model.pk)
    assert moved.path == str(bigger) and moved.parameters > model.parameters
    assert moved.estimate_bytes > model.estimate_bytes
    after = Deployment.objects.get(pk=dep.pk).estimates
    assert after["cuda"]["total_bytes"] > dep.estimates["cuda"]["total_bytes"]
    assert after["cuda"]["weights_bytes"] == moved.weights_bytes
    assert Deployment.objects.get(pk=dep.pk).revision == dep.revision + 1  # its replicas roll onto it, as a PATCH's


def test_a_directory_that_holds_no_model_is_refused_naming_the_path_and_nothing_changes(admin_client, model,
                                                                                        tmp_path):
    dep = create_deployment("chat", "tiny")
    (tmp_path / "empty").mkdir()
    answer = _change_model(admin_client, model, path=str(tmp_path / "empty"))
    assert answer.status_code == 200  # the form again, with the error
    errors = answer.context["adminform"].form.errors
    assert "config.json" in " ".join(errors["path"]), errors
    assert Model.objects.get(pk=model.pk).path == model.path
    assert Deployment.objects.get(pk=dep.pk).estimates == dep.estimates


def test_a_new_directory_a_deployment_cannot_be_served_from_is_refused_naming_the_deployment(admin_client, model,
                                                                                            tmp_path):
    create_deployment("chat", "tiny", seq=64)
    short = write_model_dir(tmp_path / "short")
    config = short / "config.json"
    config.write_text(config.read_text().replace("{", '{"max_position_embeddings": 32, ', 1))
    answer = _change_model(admin_client, model, path=str(short))
    assert answer.status_code == 200
    message = " ".join(answer.context["adminform"].form.errors["path"])
    assert "chat" in message and "seq 64" in message, message
    assert Model.objects.get(pk=model.pk).path == model.path


def test_a_new_directory_of_another_shape_is_refused_naming_the_deployment_as_the_api_does(admin_client, model,
                                                                                           tmp_path):
    dep = create_deployment("chat", "tiny")
    answer = _change_model(admin_client, model, path=str(write_model_dir(tmp_path / "wide", hidden=32)))
    assert answer.status_code == 200
    message = " ".join(answer.context["adminform"].form.errors["path"])
    assert "hidden size 16 -> 32" in message and "deployment(s) chat" in message, message
    assert Model.objects.get(pk=model.pk).path == model.path
    assert Deployment.objects.get(pk=dep.pk).revision == dep.revision


def test_a_models_figures_read_from_its_files_cannot_be_typed_in(admin_client, model):
    answer = _change_model(admin_client, model, parameters="1", estimate_bytes="1")
    assert answer.status_code == 302
    kept = Model.objects.get(pk=model.pk)
    assert (kept.parameters, kept.estimate_bytes) == (model.parameters, model.estimate_bytes)


def test_a_deployments_serving_settings_and_estimate_are_read_only_once_it_exists(admin_client, model):
    dep = create_deployment("chat", "tiny")
    page = admin_client.get(f"/admin/deployments/deployment/{dep.pk}/change/")
    form = page.context["adminform"].form
    for field in ("model", "dtype", "batch", "seq", "estimates"):
        assert field not in form.fields, field
    assert "replicas" in form.fields and "priority" in form.fields  # its policy stays editable


def test_a_model_added_in_the_admin_is_read_from_its_directory(admin_client, tmp_path):
    path = write_model_dir(tmp_path / "added", hidden=32)
    answer = admin_client.post("/admin/catalog/model/add/", {"name": "added", "path": str(path)})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    added = Model.objects.get(name="added")
    assert added.architecture == "LlamaForCausalLM" and added.parameters > 0 and added.estimate["total_bytes"] > 0
