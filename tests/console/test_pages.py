import pytest

from console.catalog.models import Model
from console.deployments.models import Deployment
from tests.conftest import write_model_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(settings, tmp_path):
    settings.MODEL_STORE = tmp_path / "store"
    write_model_dir(settings.MODEL_STORE / "tiny-llama")
    (settings.MODEL_STORE / "junk").mkdir()
    return settings.MODEL_STORE


def test_the_dashboard_needs_a_login(client):
    r = client.get("/")
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_the_dashboard_shows_an_empty_fleet(user_client):
    r = user_client.get("/")
    assert r.status_code == 200
    assert b"No hosts yet" in r.content and b'ws-connect="/ws/dashboard/"' in r.content


def test_the_models_page_lists_the_store_and_what_is_not_a_model(user_client, store):
    r = user_client.get("/models/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-store-entry="tiny-llama"' in html and ">Register</button>" in html
    assert 'data-store-entry="junk"' in html and "not a servable model" in html


def test_one_click_register_then_deploy(user_client, store):
    r = user_client.post("/models/register/", {"name": "tiny-llama", "path": str(store / "tiny-llama")}, follow=True)
    assert b"Registered tiny-llama" in r.content
    assert Model.objects.filter(name="tiny-llama").exists()
    r = user_client.post("/models/tiny-llama/deploy/", follow=True)
    assert r.redirect_chain[-1][0] == "/deployments/tiny-llama/"
    assert Deployment.objects.get().model.name == "tiny-llama"
    r = user_client.post("/models/tiny-llama/deploy/", follow=True)  # a second click, a second deployment
    assert r.redirect_chain[-1][0] == "/deployments/tiny-llama-2/"
    assert Deployment.objects.count() == 2


def test_a_refused_registration_says_why_and_stores_nothing(user_client, store):
    r = user_client.post("/models/register/", {"name": "junk", "path": str(store / "junk")}, follow=True)
    assert b"Not registered" in r.content and b"no config.json" in r.content
    assert not Model.objects.exists()


def test_the_estimate_preview_shows_the_breakdown(user_client, store):
    r = user_client.post("/models/estimate/", {"path": str(store / "tiny-llama"), "dtype": "bf16", "batch": "2",
                                               "seq": "16", "device": "cpu"})
    html = r.content.decode()
    assert r.status_code == 200 and 'class="estimate"' in html
    assert "bfloat16, batch 2, seq 16, cpu" in html and "KV cache" in html and "uncalibrated" in html


@pytest.mark.parametrize("form, message", [
    ({"path": "/nowhere"}, "path is outside the model roots"),
    ({"model": "tiny-llama", "batch": "many"}, "batch must be a whole number"),
])
def test_the_estimate_preview_explains_bad_input(user_client, store, form, message):
    r = user_client.post("/models/estimate/", form)
    assert r.status_code == 200 and message in r.content.decode() and 'role="alert"' in r.content.decode()


def test_deploy_with_settings_stores_them_and_the_page_shows_the_estimate(user_client, store):
    user_client.post("/models/register/", {"name": "tiny-llama", "path": str(store / "tiny-llama")})
    r = user_client.post("/models/tiny-llama/deploy/", {"replicas": "2", "dtype": "float16", "batch": "4",
                                                        "seq": "64"}, follow=True)
    dep = Deployment.objects.get()
    assert (dep.replicas, dep.dtype, dep.batch, dep.seq) == (2, "float16", 4, 64)
    html = r.content.decode()
    assert "serving float16, batch 4, seq 64" in html and "Memory estimate per replica" in html
    assert '<span class="stat-value">2 <span class="target">fixed</span></span>' in html


def test_deploy_with_a_bad_setting_says_why_and_stores_nothing(user_client, store):
    user_client.post("/models/register/", {"name": "tiny-llama", "path": str(store / "tiny-llama")})
    r = user_client.post("/models/tiny-llama/deploy/", {"dtype": "int8"}, follow=True)
    assert b"Not deployed: dtype &#x27;int8&#x27; cannot be served yet" in r.content
    assert not Deployment.objects.exists()


def test_an_adapter_is_added_and_removed_from_the_deployment_page(user_client, store, tmp_path):
    from tests.adapter_files import write_adapter

    user_client.post("/models/register/", {"name": "tiny-llama", "path": str(store / "tiny-llama")})
    user_client.post("/models/tiny-llama/deploy/")
    bad = user_client.post("/deployments/tiny-llama/adapters/", {"name": "sql", "path": str(tmp_path / "none")},
                           follow=True)
    assert b"Adapter not added" in bad.content and b"no such directory" in bad.content
    path = write_adapter(tmp_path / "sql", {"model.layers.0.mlp.up_proj": (4, 16, 32)}, r=4)
    r = user_client.post("/deployments/tiny-llama/adapters/", {"name": "sql", "path": str(path), "pinned": "on"},
                         follow=True)
    assert b"Adapter sql added (rank 4" in r.content and b'data-adapter="sql"' in r.content
    r = user_client.post("/adapters/sql/delete/", follow=True)
    assert b"Adapter sql removed" in r.content and b'data-adapter="sql"' not in r.content
