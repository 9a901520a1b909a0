"""PATCH /api/v1/models/{name}: a model's directory is changed (or read again) as registration reads it, refused
with the same reasons and nothing stored, and a changed artifact gets a new estimate for the model and every
deployment of it, whose placed replicas then restart one at a time (console/control/rollout.py). The probe: PATCH
answered 405."""

import numpy as np
import pytest

from console.catalog.models import Model
from console.deployments.models import Deployment, Replica
from console.deployments.services import create_deployment
from console.events.models import Event
from console.fleet.models import Host
from tests.conftest import write_model_dir
from tests.model_files import with_tensor
from tests.refusals import refusal

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(host, model):
    """A deployment of the model with a replica on the host, running (as its agent would report)."""
    dep = create_deployment("chat", "tiny", batch=2)
    Replica.objects.create(deployment=dep, index=0, host=host, observed_state="ready", pid=41)
    Replica.objects.create(deployment=dep, index=1)  # not placed: it runs nothing, so nothing holds it
    return dep


def test_a_new_directory_is_read_and_its_deployments_get_new_estimates_and_a_rollout(api, model, placed, tmp_path):
    bigger = write_model_dir(tmp_path / "bigger", inter=64)  # the same shape, a wider MLP
    r = api.patch("/api/v1/models/tiny", {"path": str(bigger)})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["name"] == "tiny" and body["path"] == str(bigger.resolve())
    assert body["parameters"] > model.parameters and body["estimate_bytes"] > model.estimate_bytes
    dep = Deployment.objects.get()
    assert dep.estimates["cuda"]["weights_bytes"] == body["weights_bytes"]
    assert dep.estimates["cuda"]["total_bytes"] > placed.estimates["cuda"]["total_bytes"]
    assert dep.revision == placed.revision + 1
    running, unplaced = Replica.objects.order_by("index")
    # The running replica keeps the old directory until the rollout reaches it; the unplaced one starts new.
    assert running.held == {"revision": placed.revision, "model_path": model.path, "adapters": {}}
    assert unplaced.held == {}
    assert Host.objects.get().desired_digest == ""  # its host gets its desired state rebuilt
    [event] = Event.objects.filter(object="model/tiny", reason="Updated")
    assert model.path in event.message and str(bigger.resolve()) in event.message and "chat" in event.message


def test_the_same_directory_unchanged_is_no_change(api, model, placed):
    r = api.patch("/api/v1/models/tiny", {"path": model.path})
    assert r.status_code == 200, r.content
    assert Deployment.objects.get().revision == placed.revision
    assert not Replica.objects.exclude(held={}).exists()
    assert not Event.objects.filter(reason="Updated").exists()


def test_files_replaced_at_the_same_path_are_read_again_and_roll_out(api, model, placed, model_dir):
    write_model_dir(model_dir, inter=64)  # new weights where the old ones were
    r = api.patch("/api/v1/models/tiny", {"path": model.path})
    assert r.status_code == 200, r.content
    assert r.json()["parameters"] > model.parameters
    assert Deployment.objects.get().revision == placed.revision + 1
    assert Replica.objects.get(index=0).held["model_path"] == model.path


@pytest.mark.parametrize("case", [
    lambda tmp: (str(tmp / "nowhere"), "no such"),
    lambda tmp: ((tmp / "empty").mkdir() or str(tmp / "empty"), "config.json"),
    lambda tmp: ("", "path is empty"),
])
def test_a_refused_directory_is_a_422_naming_the_path_and_nothing_changes(api, model, placed, tmp_path, case):
    path, message = case(tmp_path)
    r = api.patch("/api/v1/models/tiny", {"path": path})
    assert r.status_code == 422, r.content
    assert message in refusal(r) and r.json()["detail"][0]["loc"] == ["body", "path"]
    assert Model.objects.get().path == model.path
    dep = Deployment.objects.get()
    assert (dep.estimates, dep.revision) == (placed.estimates, placed.revision)
    assert not Replica.objects.exclude(held={}).exists()


def test_a_directory_a_deployment_cannot_be_served_from_is_refused_naming_it(api, model, host, tmp_path):
    create_deployment("long", "tiny", seq=64)
    short = write_model_dir(tmp_path / "short")
    config = short / "config.json"
    config.write_text(config.read_text().replace("{", '{"max_position_embeddings": 32, ', 1))
    r = api.patch("/api/v1/models/tiny", {"path": str(short)})
    assert r.status_code == 422, r.content
    assert "deployment 'long' could not be served from it" in refusal(r)
    assert Model.objects.get().path == model.path


def test_weights_an_i64_tensor_at_half_width_stands_for_are_refused_naming_the_tensor(api, model, placed, model_dir,
                                                                                     tmp_path):
    lying = with_tensor(model_dir, tmp_path / "lying", "model.embed_tokens.weight", np.zeros((32, 8), np.int64))
    r = api.patch("/api/v1/models/tiny", {"path": str(lying)})
    assert r.status_code == 422, r.content
    assert "tensor 'model.embed_tokens.weight' is stored as I64 [32, 8]" in refusal(r)
    assert Model.objects.get().path == model.path
    assert Deployment.objects.get().revision == placed.revision


@pytest.mark.parametrize("body, field", [({"name": "other"}, "name"), ({"path": "/x", "weights": 1}, "weights"),
                                         ({"path": 3}, "path")])
def test_the_name_and_read_figures_cannot_be_changed(api, model, body, field):
    r = api.patch("/api/v1/models/tiny", body)
    assert r.status_code == 422, r.content
    assert field in str(r.json()["detail"][0]["loc"])
    assert Model.objects.get().name == "tiny"


def test_an_unknown_model_is_a_404(api, db, model_dir):
    r = api.patch("/api/v1/models/ghost", {"path": str(model_dir)})
    assert r.status_code == 404
    assert "no model named 'ghost'" in refusal(r)


# --- edits that would break what serves (issue 45: they answered 200 and rolled out; the deployments then answered
# 400 and the adapters could not load) ---------------------------------------------------------------------------

UP = "model.layers.0.mlp.up_proj"


@pytest.fixture
def served(model, placed, tmp_path):
    """The placed deployment with a LoRA adapter on its base model."""
    from console.catalog.adapters import register_adapter
    from tests.adapter_files import write_adapter

    register_adapter("sql", "chat", str(write_adapter(tmp_path / "sql", {UP: (4, 16, 32)}, r=4)))
    return Deployment.objects.get()


@pytest.mark.parametrize("kind, changed", [
    (dict(arch="Qwen2ForCausalLM", model_type="qwen2"), "architecture LlamaForCausalLM -> Qwen2ForCausalLM"),
    (dict(arch="BertModel", model_type="bert"), "task causal-lm -> encoder"),
    (dict(hidden=32), "hidden size 16 -> 32"),
    (dict(vocab=64), "vocabulary size 32 -> 64"),
    (dict(layers=2), "layers 1 -> 2"),
])
def test_a_directory_of_another_shape_is_refused_naming_the_deployments_adapters_and_what_changed(
        api, model, served, tmp_path, kind, changed):
    other = write_model_dir(tmp_path / "other", **kind)
    r = api.patch("/api/v1/models/tiny", {"path": str(other)})
    assert r.status_code == 422, r.content
    said = refusal(r)
    assert changed in said and "deployment(s) chat" in said and "adapter(s) sql" in said, said
    assert "register it under a new name" in said
    assert r.json()["detail"][0]["loc"] == ["body", "path"]
    assert Model.objects.get().path == model.path
    dep = Deployment.objects.get()
    assert (dep.revision, dep.estimates) == (served.revision, served.estimates)
    assert not Replica.objects.exclude(held={}).exists()
    assert not Event.objects.filter(reason="Updated").exists()


def test_the_same_shape_that_an_adapter_no_longer_fits_is_refused_naming_the_adapter(api, model, served, tmp_path):
    wider = write_model_dir(tmp_path / "wider", inter=64)  # up_proj [64, 16]: the adapter's B is [32, 4]
    r = api.patch("/api/v1/models/tiny", {"path": str(wider)})
    assert r.status_code == 422, r.content
    said = refusal(r)
    assert "adapter 'sql' of deployment 'chat' would not fit it" in said and "up_proj" in said, said
    assert Model.objects.get().path == model.path and Deployment.objects.get().revision == served.revision


def test_a_model_no_deployment_uses_may_change_its_shape(api, model, tmp_path):
    other = write_model_dir(tmp_path / "other", arch="BertModel", model_type="bert", hidden=32)
    r = api.patch("/api/v1/models/tiny", {"path": str(other)})
    assert r.status_code == 200, r.content
    assert (r.json()["architecture"], r.json()["task"]) == ("BertModel", "encoder")


def test_files_replaced_in_place_by_another_shape_are_refused_too(api, model, served, model_dir):
    write_model_dir(model_dir, hidden=32)  # its own directory, rewritten: the shape it had is the stored one
    r = api.patch("/api/v1/models/tiny", {"path": model.path})
    assert r.status_code == 422, r.content
    assert "hidden size 16 -> 32" in refusal(r)
    assert Model.objects.get().fingerprint == model.fingerprint


def test_a_model_registered_before_shapes_were_stored_is_held_to_its_architecture_and_task(api, model, placed,
                                                                                          tmp_path):
    Model.objects.update(shape={})  # as a row from before the field: architecture and task are all it knows
    r = api.patch("/api/v1/models/tiny", {"path": model.path})  # files as they were: the shape is stored, quietly
    assert r.status_code == 200, r.content
    assert Model.objects.get().shape["hidden_size"] == 16
    assert Deployment.objects.get().revision == placed.revision and not Event.objects.filter(reason="Updated")
    Model.objects.update(shape={})
    other = write_model_dir(tmp_path / "other", arch="BertModel", model_type="bert")
    r = api.patch("/api/v1/models/tiny", {"path": str(other)})
    assert r.status_code == 422 and "task causal-lm -> encoder" in refusal(r)
