"""POST/DELETE /api/v1/adapters: adapters are checked against the deployment's base model."""

import json

import pytest

from console.catalog.models import Adapter
from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from tests.adapter_files import write_adapter
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
UP = "model.layers.0.mlp.up_proj"  # the conftest model's [32, 16] weight


@pytest.fixture
def chat(model):
    return create_deployment("chat", "tiny")


def test_it_registers_an_adapter_and_grows_the_deployments_pool(api, chat, tmp_path):
    path = write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})
    r = api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path)})
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["deployment"], body["rank"], body["modules"]) == ("chat", 8, 1)
    assert body["nbytes"] == 8 * (16 + 32) * 4  # float32, as the base model is stored
    before = chat.estimates["cuda"]
    after = Deployment.objects.get().estimates["cuda"]
    assert after["adapter_pool_bytes"] == body["nbytes"]
    assert after["total_bytes"] == before["total_bytes"] + body["nbytes"]
    assert [a["name"] for a in api.get("/api/v1/adapters").json()] == ["sql"]


def test_deleting_an_adapter_shrinks_the_pool_again(api, chat, tmp_path):
    path = write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})
    api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path)})
    assert api.delete("/api/v1/adapters/sql").status_code == 204
    assert Deployment.objects.get().estimates["cuda"]["adapter_pool_bytes"] == 0
    assert api.delete("/api/v1/adapters/sql").status_code == 404


def not_lora(tmp_path):
    path = write_adapter(tmp_path / "ia3", {UP: (8, 16, 32)})
    config = json.loads((path / "adapter_config.json").read_text()) | {"peft_type": "IA3"}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path, "IA3"


@pytest.mark.parametrize("case", [
    lambda tmp: (tmp / "nowhere", "no such directory in the model roots"),
    not_lora,
    lambda tmp: (write_adapter(tmp / "wide", {UP: (8, 64, 32)}), f"adapter targets {UP} with in=64"),
    lambda tmp: (write_adapter(tmp / "other", {"model.layers.9.mlp.up_proj": (8, 16, 32)}), "has no tensor"),
])
def test_a_refused_adapter_is_a_422_with_the_reason_and_nothing_is_stored(api, chat, tmp_path, case):
    path, message = case(tmp_path)
    r = api.post("/api/v1/adapters", {"name": "bad", "deployment": "chat", "path": str(path)})
    assert r.status_code == 422, r.content
    assert message in refusal(r)
    assert not Adapter.objects.exists()
    assert Deployment.objects.get().estimates == chat.estimates


def test_it_refuses_an_unknown_deployment_and_a_taken_name(api, chat, tmp_path):
    path = write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})
    r = api.post("/api/v1/adapters", {"name": "sql", "deployment": "ghost", "path": str(path)})
    assert r.status_code == 422 and "no deployment named 'ghost'" in refusal(r)
    assert api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path)}).status_code == 201
    r = api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path)})
    assert r.status_code == 409 and Adapter.objects.count() == 1


def test_it_refuses_a_name_with_a_trailing_newline_and_stores_nothing(api, chat, tmp_path):
    path = write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})
    r = api.post("/api/v1/adapters", {"name": "sql\n", "deployment": "chat", "path": str(path)})
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["loc"] == ["body", "name"]
    assert "ends with a newline" in refusal(r)
    assert not Adapter.objects.exists()


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_it_refuses_pinned_that_is_not_a_json_boolean(api, chat, tmp_path, value):
    path = write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})
    r = api.post("/api/v1/adapters", {"name": "sql", "deployment": "chat", "path": str(path), "pinned": value})
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["loc"] == ["body", "pinned"]
    assert not Adapter.objects.exists()
