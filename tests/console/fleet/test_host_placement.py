"""A host's labels and taints, set from the API and from its page, and what the scheduler does with them (and with
a deployment's tolerations and spread)."""

import pytest

from console.control.reconcile import reconcile_once
from console.deployments.models import Deployment, Replica
from console.events.models import Event
from console.fleet.models import Gpu, Host
from tests.refusals import refusal, refused_fields

pytestmark = pytest.mark.django_db
GiB = 1024**3


@pytest.fixture
def two_hosts(db):
    for name in ("h1", "h2"):
        h = Host.objects.create(name=name, endpoint="http://127.0.0.1:9", connected=True)
        Gpu.objects.create(host=h, index=0, uuid=f"{name}-0", name="sim", total_bytes=24 * GiB, simulated=True)
    return Host.objects.order_by("name")


@pytest.fixture
def registered(admin_api, model_dir):
    assert admin_api.post("/api/v1/models", {"name": "tiny", "path": str(model_dir)}).status_code == 201


def placed_on(name):
    return sorted(r.gpus.get().host.name for r in Replica.objects.filter(deployment__name=name) if r.gpus.exists())


def test_the_api_sets_labels_and_taints_and_shows_them(admin_api, two_hosts):
    r = admin_api.patch("/api/v1/hosts/h1", {"labels": {"zone": "east"}, "taints": {"pool": "ml"}})
    assert r.status_code == 200, r.content
    assert (r.json()["labels"], r.json()["taints"]) == ({"zone": "east"}, {"pool": "ml"})
    assert admin_api.get("/api/v1/hosts/h1").json()["taints"] == {"pool": "ml"}
    r = admin_api.patch("/api/v1/hosts/h1", {"taints": {}})  # one field given: only it is replaced
    assert (r.json()["labels"], r.json()["taints"]) == ({"zone": "east"}, {})
    event = Event.objects.filter(reason="HostPlacementChanged").order_by("pk").first()
    assert "taints none → pool=ml" in event.message and "labels none → zone=east" in event.message


@pytest.mark.parametrize("body, field, words", [
    ({"taints": {"pool": 3}}, "taints", "input should be a valid string"),
    ({"labels": {"": "x"}}, "labels", "at least 1 character"),
    ({"labels": {"zone": "east"}, "owner": "me"}, "owner", "extra inputs are not permitted"),
])
def test_a_bad_change_names_the_field_and_stores_nothing(admin_api, two_hosts, body, field, words):
    r = admin_api.patch("/api/v1/hosts/h1", body)
    assert r.status_code == 422 and refused_fields(r)[0] == field and words in refusal(r).lower(), r.content
    assert Host.objects.get(name="h1").labels == {}


def test_an_unknown_host_is_a_404(admin_api, two_hosts):
    r = admin_api.patch("/api/v1/hosts/ghost", {"labels": {}})
    assert r.status_code == 404 and "no host named 'ghost'" in r.content.decode()


def test_a_taint_keeps_a_host_for_deployments_that_tolerate_it(admin_api, two_hosts, registered):
    admin_api.patch("/api/v1/hosts/h1", {"taints": {"pool": "ml"}})
    admin_api.post("/api/v1/deployments", {"name": "web", "model": "tiny", "replicas": 2})
    admin_api.post("/api/v1/deployments", {"name": "train", "model": "tiny", "selector": {"gpu": "sim"},
                                     "tolerations": {"pool": "ml"}})
    reconcile_once()
    assert placed_on("web") == ["h2", "h2"]  # both on the untainted host, as apart as it allows
    assert Deployment.objects.get(name="train").tolerations == {"pool": "ml"}
    reason = Replica.objects.get(deployment__name="web", index=1).reason
    assert "sharing h2/0 with another replica: no GPU without one has room" in reason


def test_replicas_of_a_deployment_land_on_different_hosts_by_default(admin_api, two_hosts, registered):
    admin_api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "replicas": 2, "priority": "critical"})
    reconcile_once()
    assert placed_on("chat") == ["h1", "h2"]
    assert admin_api.get("/api/v1/deployments/chat").json()["spread"] == "preferred"


def test_required_spread_refuses_a_second_replica_on_one_gpu_and_says_why(admin_api, two_hosts, registered):
    admin_api.patch("/api/v1/hosts/h2", {"taints": {"pool": "ml"}})
    r = admin_api.post("/api/v1/deployments", {"name": "chat", "model": "tiny", "replicas": 2, "spread": "required"})
    assert r.status_code == 201, r.content
    reconcile_once()
    assert placed_on("chat") == ["h1"]
    reason = admin_api.get("/api/v1/deployments/chat").json()["reason"]
    assert "each holds a replica of it already (spread required)" in reason
    assert "1 GPU excluded by taint pool=ml (not tolerated)" in reason


def test_the_host_page_sets_labels_and_taints_and_shows_the_taint(admin_client, two_hosts):
    r = admin_client.post("/hosts/h1/placement/", {"labels": "zone=east", "taints": "pool=ml"}, follow=True)
    html = r.content.decode()
    assert Host.objects.get(name="h1").taints == {"pool": "ml"}
    assert "Saved labels and taints" in html and 'data-taint="pool=ml"' in html and 'value="zone=east"' in html
    r = admin_client.post("/hosts/h1/placement/", {"labels": "zone", "taints": ""}, follow=True)
    assert "labels: &#x27;zone&#x27; is not key=value" in r.content.decode()
    assert Host.objects.get(name="h1").taints == {"pool": "ml"}  # nothing of the refused change was stored


def test_only_admins_set_a_hosts_labels_and_taints_by_api_or_page(api, user_client, two_hosts):
    r = api.patch("/api/v1/hosts/h1", {"taints": {"pool": "ml"}})
    assert r.status_code == 403
    assert "only staff users may set a host's labels and taints" in r.json()["detail"][0]["msg"]
    page = user_client.post("/hosts/h1/placement/", {"labels": "zone=east", "taints": "pool=ml"}, follow=True)
    assert "only staff users may set a host&#x27;s labels and taints" in page.content.decode()
    assert 'action="/hosts/h1/placement/"' not in page.content.decode()  # a member is shown no form to try
    assert Host.objects.filter(name="h1", labels={}, taints={}).exists()
