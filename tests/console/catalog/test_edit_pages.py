"""Editing a model's directory on the models page and an adapter's directory or pin on its deployment's page, as
the API's PATCH does: a refusal says why and changes nothing; a changed artifact says its replicas roll onto it."""

import pytest

from console.catalog.models import Adapter, Model
from console.deployments.models import Deployment
from console.deployments.services import create_deployment
from tests.adapter_files import write_adapter
from tests.conftest import write_model_dir

pytestmark = pytest.mark.django_db
UP = "model.layers.0.mlp.up_proj"


def test_the_models_page_offers_to_change_a_models_directory(user_client, model):
    html = user_client.get("/models/").content.decode()
    assert 'action="/models/tiny/edit/"' in html and f'value="{model.path}"' in html


def test_a_models_new_directory_is_read_and_its_deployments_roll_onto_it(user_client, model, tmp_path):
    create_deployment("chat", "tiny")
    bigger = write_model_dir(tmp_path / "bigger", inter=64)
    r = user_client.post("/models/tiny/edit/", {"path": str(bigger)}, follow=True)
    assert "Model tiny changed" in r.content.decode() and "one replica at a time" in r.content.decode()
    assert Model.objects.get().path == str(bigger.resolve())
    assert Deployment.objects.get().revision == 1


def test_a_refused_directory_says_why_and_changes_nothing(user_client, model, tmp_path):
    r = user_client.post("/models/tiny/edit/", {"path": str(tmp_path / "nowhere")}, follow=True)
    assert "Not changed: " in r.content.decode() and "no such" in r.content.decode()
    assert Model.objects.get().path == model.path


def test_a_directory_of_another_shape_says_what_would_break_and_changes_nothing(user_client, model, tmp_path):
    create_deployment("chat", "tiny")
    other = write_model_dir(tmp_path / "other", arch="BertModel", model_type="bert")
    page = user_client.post("/models/tiny/edit/", {"path": str(other)}, follow=True).content.decode()
    assert "Not changed: " in page and "task causal-lm -&gt; encoder" in page and "deployment(s) chat" in page
    assert Model.objects.get().path == model.path and Deployment.objects.get().revision == 0


def test_an_adapter_is_changed_from_its_deployments_page(user_client, model, tmp_path):
    create_deployment("chat", "tiny")
    v1 = write_adapter(tmp_path / "v1", {UP: (4, 16, 32)}, r=4)
    assert user_client.post("/deployments/chat/adapters/", {"name": "sql", "path": str(v1)}).status_code == 302
    page = user_client.get("/deployments/chat/").content.decode()
    assert 'action="/adapters/sql/edit/"' in page and f'value="{v1.resolve()}"' in page

    v2 = write_adapter(tmp_path / "v2", {UP: (8, 16, 32)}, r=8, seed=2)
    r = user_client.post("/adapters/sql/edit/", {"path": str(v2), "pinned": "on"}, follow=True)
    assert r.redirect_chain[-1][0] == "/deployments/chat/"
    assert "Adapter sql changed (rank 8" in r.content.decode()
    adapter = Adapter.objects.get()
    assert (adapter.path, adapter.rank, adapter.pinned) == (str(v2.resolve()), 8, True)
    assert Deployment.objects.get().revision == 1

    bad = user_client.post("/adapters/sql/edit/", {"path": str(tmp_path / "none"), "pinned": "on"}, follow=True)
    assert "Adapter not changed" in bad.content.decode() and "no such directory" in bad.content.decode()
    assert Adapter.objects.get().path == str(v2.resolve())
