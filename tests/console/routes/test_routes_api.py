"""/api/v1/routes: a public model name sent to deployments by weight, with an adapter per branch and a fallback."""

import pytest

from console.catalog.adapters import register_adapter
from console.deployments.services import create_deployment
from console.events.models import Event
from console.routes.models import Route
from tests.adapter_files import write_adapter
from tests.refusals import refusal

pytestmark = pytest.mark.django_db
UP = "model.layers.0.mlp.up_proj"
CANARY = {"name": "assistant", "branches": [{"deployment": "chat", "weight": 95},
                                            {"deployment": "chat-v2", "weight": 5}], "fallback": "spare"}


@pytest.fixture
def deployments(model):
    return [create_deployment(name, "tiny") for name in ("chat", "chat-v2", "spare")]


def test_it_creates_a_route_and_records_who_did(api, deployments):
    r = api.post("/api/v1/routes", CANARY)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["name"] == "assistant" and body["fallback"] == "spare"
    assert [(b["deployment"], b["weight"], b["adapter"]) for b in body["branches"]] == [
        ("chat", 95, None), ("chat-v2", 5, None)]
    assert [b["share"] for b in body["branches"]] == [0.95, 0.05]
    assert api.get("/api/v1/routes/assistant").json() == body
    assert [x["name"] for x in api.get("/api/v1/routes").json()] == ["assistant"]
    event = Event.objects.get(object="route/assistant")
    assert event.reason == "Created" and "ops" in event.actor and "chat-v2" in event.message


def test_a_branch_may_name_an_adapter_of_its_deployment(api, deployments, tmp_path):
    register_adapter("sql", "chat", str(write_adapter(tmp_path / "sql", {UP: (8, 16, 32)})))
    r = api.post("/api/v1/routes", {"name": "sql-latest", "branches": [{"deployment": "chat", "adapter": "sql"}]})
    assert r.status_code == 201, r.content
    assert r.json()["branches"] == [{"deployment": "chat", "adapter": "sql", "weight": 1, "share": 1.0}]
    wrong = api.post("/api/v1/routes", {"name": "other", "branches": [{"deployment": "spare", "adapter": "sql"}]})
    assert wrong.status_code == 422 and "belongs to deployment 'chat'" in refusal(wrong)
    assert wrong.json()["detail"][0]["loc"] == ["body", "branches", 0, "adapter"]


def test_changing_a_route_replaces_its_branches_and_is_on_the_timeline(api, deployments):
    api.post("/api/v1/routes", CANARY)
    r = api.patch("/api/v1/routes/assistant", {"branches": [{"deployment": "chat-v2", "weight": 1}]})
    assert r.status_code == 200, r.content
    assert [b["deployment"] for b in r.json()["branches"]] == ["chat-v2"] and r.json()["fallback"] == "spare"
    r = api.patch("/api/v1/routes/assistant", {"fallback": None})
    assert r.json()["fallback"] is None
    assert list(Event.objects.filter(object="route/assistant").values_list("reason", flat=True).order_by("id")) == [
        "Created", "Changed", "Changed"]
    assert api.delete("/api/v1/routes/assistant").status_code == 204
    assert api.get("/api/v1/routes/assistant").status_code == 404
    assert Event.objects.filter(object="route/assistant", reason="Deleted").exists()
    listed = api.get("/api/v1/events?object=route/assistant").json()["events"]
    assert [e["reason"] for e in listed] == ["Deleted", "Changed", "Changed", "Created"]


@pytest.mark.parametrize(("change", "loc", "words"), [
    ({"name": "Bad Name"}, ["body", "name"], "lowercase"),
    ({"name": "chat"}, ["body", "name"], "a deployment is already named 'chat'"),
    ({"branches": []}, ["body", "branches"], "at least one"),
    ({"branches": [{"deployment": "nope"}]}, ["body", "branches", 0, "deployment"], "no deployment named 'nope'"),
    ({"branches": [{"deployment": "chat", "weight": 0}]}, ["body", "branches", 0, "weight"], "greater than"),
    ({"branches": [{"deployment": "chat"}, {"deployment": "chat"}]}, ["body", "branches", 1, "deployment"],
     "twice"),
    ({"fallback": "nope"}, ["body", "fallback"], "no deployment named 'nope'"),
    ({"fallback": "chat", "branches": [{"deployment": "chat"}]}, ["body", "fallback"], "already a branch"),
])
def test_a_refused_route_names_the_field_and_nothing_is_stored(api, deployments, change, loc, words):
    r = api.post("/api/v1/routes", CANARY | change)
    assert r.status_code == 422 if loc != ["body", "name"] or "already" not in words else r.status_code == 409
    assert r.status_code in (409, 422), r.content
    assert r.json()["detail"][0]["loc"] == loc, r.content
    assert words in refusal(r)
    assert not Route.objects.exists() and not Event.objects.filter(object__startswith="route/").exists()


def test_a_route_name_is_taken_for_deployments_and_adapters_too(api, deployments, tmp_path):
    api.post("/api/v1/routes", CANARY)
    r = api.post("/api/v1/deployments", {"name": "assistant", "model": "tiny"})
    assert r.status_code == 409 and "a route is already named 'assistant'" in refusal(r)
    path = write_adapter(tmp_path / "a", {UP: (8, 16, 32)})
    r = api.post("/api/v1/adapters", {"name": "assistant", "deployment": "chat", "path": str(path)})
    assert r.status_code == 409 and "a route is already named 'assistant'" in refusal(r)
    assert api.post("/api/v1/routes", CANARY).status_code == 409


def test_a_failed_change_leaves_the_route_as_it_was(api, deployments):
    api.post("/api/v1/routes", CANARY)
    r = api.patch("/api/v1/routes/assistant", {"branches": [{"deployment": "chat", "weight": 1},
                                                            {"deployment": "gone", "weight": 1}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "branches", 1, "deployment"]
    assert [b["deployment"] for b in api.get("/api/v1/routes/assistant").json()["branches"]] == ["chat", "chat-v2"]
    assert api.patch("/api/v1/routes/nope", {"fallback": None}).status_code == 404


def test_deleting_a_deployment_drops_its_branches_and_the_fallback(api, deployments):
    api.post("/api/v1/routes", CANARY)
    assert api.delete("/api/v1/deployments/chat-v2").status_code == 204
    assert api.delete("/api/v1/deployments/spare").status_code == 204
    body = api.get("/api/v1/routes/assistant").json()
    assert [b["deployment"] for b in body["branches"]] == ["chat"] and body["fallback"] is None
