import numpy as np
import pytest

from console.catalog.models import Model
from tests.model_files import with_tensor
from tests.refusals import refusal

pytestmark = pytest.mark.django_db


def test_it_registers_a_model_and_returns_its_estimate(api, model_dir):
    r = api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["architecture"] == "LlamaForCausalLM"
    assert body["weights_bytes"] == 4096
    assert body["estimate_bytes"] == body["estimate"]["total_bytes"] > 4096
    assert Model.objects.get(name="tiny").path == str(model_dir.resolve())


@pytest.mark.parametrize(
    "path, message",
    [("/definitely/not/here", "path is outside the model roots"), ("", "path is empty")],
)
def test_it_refuses_a_missing_path_and_stores_nothing(api, path, message):
    r = api.post("/api/v1/models", {"name": "x", "path": path})
    assert r.status_code == 422
    assert message in refusal(r)
    assert not Model.objects.exists()


def test_it_refuses_a_directory_that_is_not_a_model(api, tmp_path):
    r = api.post("/api/v1/models", {"name": "x", "path": str(tmp_path)})
    assert r.status_code == 422
    assert "no config.json" in refusal(r)
    assert not Model.objects.exists()


def test_it_refuses_weights_an_i64_tensor_at_half_width_stands_for_naming_the_tensor(api, model_dir, tmp_path):
    # Its bytes are those of the F32 tensor it replaces; the worker crash-looped on it, registered.
    lying = with_tensor(model_dir, tmp_path / "lying", "model.embed_tokens.weight", np.zeros((32, 8), np.int64))
    r = api.post("/api/v1/models", {"name": "x", "path": str(lying)})
    assert r.status_code == 422, r.content
    assert "tensor 'model.embed_tokens.weight' is stored as I64 [32, 8]" in refusal(r)
    assert r.json()["detail"][0]["loc"] == ["body", "path"]
    assert not Model.objects.exists()


def test_it_refuses_a_bad_name(api, model_dir):
    r = api.post("/api/v1/models", {"name": "Bad Name!", "path": str(model_dir)})
    assert r.status_code == 422
    assert "model name 'Bad Name!' is not valid" in refusal(r)


def test_it_refuses_a_duplicate_name(api, model_dir):
    assert api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)}).status_code == 201
    r = api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)})
    assert r.status_code == 409
    assert Model.objects.count() == 1


def test_it_requires_a_valid_token(client, model_dir):
    r = client.post("/api/v1/models", {"name": "x", "path": str(model_dir)}, content_type="application/json",
                    HTTP_AUTHORIZATION="Bearer mg_api_wrong")
    assert r.status_code == 401
    assert not Model.objects.exists()


def test_it_will_not_delete_a_model_in_use(api, model_dir):
    api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)})
    api.post("/api/v1/deployments", {"name": "d", "model": "tiny"})
    r = api.delete("/api/v1/models/tiny")
    assert r.status_code == 409
    assert "used by deployment(s) d" in refusal(r)


@pytest.mark.parametrize("name", ["ghost\n", "ghost\r\n", "gho\nst"])
def test_it_refuses_a_name_with_a_newline_and_stores_nothing(api, model_dir, name):
    r = api.post("/api/v1/models", {"name": name, "path": str(model_dir)})
    assert r.status_code == 422, r.content
    assert r.json()["detail"][0]["loc"] == ["body", "name"]
    assert f"model name {name!r} is not valid" in refusal(r)
    assert not Model.objects.exists()


@pytest.mark.parametrize("body", [{"name": 1, "path": "x"}, {"name": "tiny", "path": ["x"]}])
def test_it_refuses_a_name_or_path_that_is_not_a_json_string(api, body):
    r = api.post("/api/v1/models", body)
    assert r.status_code == 422, r.content
    assert not Model.objects.exists()
