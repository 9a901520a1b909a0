"""The REST lists a page at a time: ?page and ?per_page, the total and RFC 8288 links in headers, the body
still a plain list; name search and state filters; refusals naming the parameter; and a page's queries not
growing with its rows."""

import re
from datetime import timedelta
from urllib.parse import parse_qsl

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.catalog.models import Adapter, Model
from console.deployments.models import Deployment, DeploymentState, Replica
from console.deployments.schemas import DeploymentListQuery
from console.fleet.models import Gpu, Host
from console.fleet.presenters import HOST_STATES, in_state
from console.pagination import Page, page_within
from tests.refusals import refused_fields

pytestmark = pytest.mark.django_db
GiB = 1 << 30


def links(response) -> dict[str, dict]:
    """The Link header as {rel: the URL's query parameters}."""
    return {rel: dict(parse_qsl(url.split("?", 1)[1]))
            for url, rel in re.findall(r'<([^>]+)>; rel="(\w+)"', response["Link"])}


def at(page: int, **params) -> dict:
    return {"page": str(page)} | {k: str(v) for k, v in params.items()}


def a_model(name: str = "tiny") -> Model:
    return Model.objects.create(name=name, path=f"/models/{name}", architecture="LlamaForCausalLM",
                                model_type="llama", task="generate", stored_dtype="float32", parameters=1,
                                weights_bytes=1, estimate_bytes=1)


def deployments(n: int, replicas: int = 2, prefix: str = "dep", **fields) -> list[Deployment]:
    """`n` deployments with `replicas` placed replicas each, on GPUs of one host per deployment."""
    model = Model.objects.first() or a_model()
    rows = []
    for i in range(n):
        dep = Deployment.objects.create(name=f"{prefix}-{i:03d}", model=model, **fields)
        host = Host.objects.create(name=f"{prefix}-host-{i:03d}", connected=True, endpoint="http://10.0.0.1:8100")
        gpu = Gpu.objects.create(host=host, index=0, uuid=f"{dep.name}-0", name="NVIDIA H100", total_bytes=80 * GiB)
        for r in range(replicas):
            Replica.objects.create(deployment=dep, index=r, host=host, reserved_bytes=GiB).gpus.add(gpu)
        Adapter.objects.create(name=f"{dep.name}-lora", deployment=dep, path="/a", rank=8, modules=2, parameters=1,
                               nbytes=1)
        rows.append(dep)
    return rows


def test_a_list_is_still_a_json_list_with_its_total_and_links_in_headers(api):
    deployments(5, replicas=1)
    r = api.get("/api/v1/deployments?per_page=2&page=2")
    assert r.status_code == 200
    assert [d["name"] for d in r.json()] == ["dep-002", "dep-003"]
    assert r["X-Total-Count"] == "5"
    assert links(r) == {"first": at(1, per_page=2), "prev": at(1, per_page=2), "next": at(3, per_page=2),
                        "last": at(3, per_page=2)}
    assert r["Link"].startswith("<http://testserver/api/v1/deployments?")


def test_the_first_page_has_no_prev_and_the_last_no_next(api):
    deployments(3, replicas=0)
    first = api.get("/api/v1/deployments?per_page=2")
    assert set(links(first)) == {"first", "next", "last"} and len(first.json()) == 2
    last = api.get("/api/v1/deployments?per_page=2&page=2")
    assert set(links(last)) == {"first", "prev", "last"} and [d["name"] for d in last.json()] == ["dep-002"]


def test_the_defaults_are_page_1_of_100(api):
    deployments(101, replicas=0)
    r = api.get("/api/v1/deployments")
    assert len(r.json()) == 100 and r["X-Total-Count"] == "101" and links(r)["last"] == at(2)


def test_a_page_past_the_end_is_empty_and_points_back_to_the_last(api):
    deployments(3, replicas=0)
    r = api.get("/api/v1/deployments?per_page=2&page=9")
    assert r.status_code == 200 and r.json() == []
    assert links(r)["prev"] == at(2, per_page=2) and "next" not in links(r)


@pytest.mark.parametrize("query, field", [
    ("page=0", "page"), ("page=-3", "page"), ("page=two", "page"), ("page=1000001", "page"),
    ("per_page=0", "per_page"), ("per_page=501", "per_page"), ("state=sleepy", "state"), ("q=" + "x" * 201, "q"),
])
def test_an_out_of_range_parameter_is_refused_naming_it(api, query, field):
    r = api.get(f"/api/v1/deployments?{query}")
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["query", field]]


@pytest.mark.parametrize("path", ["/api/v1/hosts", "/api/v1/models", "/api/v1/adapters"])
def test_every_list_refuses_a_bad_page_size(api, path):
    r = api.get(f"{path}?per_page=1000")
    assert r.status_code == 422 and refused_fields(r) == ["per_page"]


def test_q_keeps_names_containing_it_whatever_the_case_and_the_links_keep_it(api):
    deployments(3, replicas=0, prefix="chat")
    deployments(2, replicas=0, prefix="embed")
    r = api.get("/api/v1/deployments?q=EMB&per_page=1")
    assert [d["name"] for d in r.json()] == ["embed-000"] and r["X-Total-Count"] == "2"
    assert links(r)["next"] == at(2, q="EMB", per_page=1)


def test_q_takes_like_wildcards_literally(api):
    deployments(2, replicas=0, prefix="a-b")
    assert api.get("/api/v1/deployments?q=%25").json() == []  # "%" matches no name, not every name
    assert api.get("/api/v1/deployments?q=_").json() == []


@pytest.mark.parametrize("path", ["/api/v1/deployments", "/api/v1/hosts", "/api/v1/models", "/api/v1/adapters"])
def test_q_with_a_nul_finds_nothing_instead_of_failing(api, path):
    """Schemathesis found it on PostgreSQL, which refuses a NUL in a query: a 500."""
    deployments(1, replicas=0, prefix="chat")
    r = api.get(f"{path}?q=ch%00at")
    assert r.status_code == 200 and r.json() == [] and r["X-Total-Count"] == "0"


def test_state_filters_deployments(api):
    deployments(2, replicas=0, prefix="up", state="ready")
    deployments(1, replicas=0, prefix="stuck", state="unschedulable")
    r = api.get("/api/v1/deployments?state=unschedulable")
    assert [d["name"] for d in r.json()] == ["stuck-000"] and r["X-Total-Count"] == "1"


def test_the_state_filter_knows_every_deployment_state():
    assert set(DeploymentListQuery.model_fields["state"].annotation.__args__[0].__args__) == set(
        DeploymentState.values)


def hosts_in_every_state() -> dict[str, list[str]]:
    now = timezone.now()
    Host.objects.create(name="up-1", connected=True)
    Host.objects.create(name="up-2", connected=True, unknown_since=now)  # reconnected: its old lapse is moot
    Host.objects.create(name="lapsed", connected=False, unknown_since=now - timedelta(minutes=2))
    Host.objects.create(name="evicted", connected=False, unknown_since=now - timedelta(hours=1), evicted_at=now)
    Host.objects.create(name="never-leased", connected=False)
    return {"connected": ["up-1", "up-2"], "unknown": ["lapsed"], "offline": ["evicted", "never-leased"]}


def test_state_filters_hosts_by_their_lifecycle(api):
    expected = hosts_in_every_state()
    for state, names in expected.items():
        r = api.get(f"/api/v1/hosts?state={state}")
        assert sorted(h["name"] for h in r.json()) == names, state
        assert all(h["state"] == state for h in r.json())


def test_the_host_state_filter_agrees_with_host_lifecycle():
    hosts_in_every_state()
    for state in HOST_STATES:
        assert {h.name for h in in_state(Host.objects.all(), state)} == {
            h.name for h in Host.objects.all() if h.lifecycle == state}


def test_hosts_models_and_adapters_page_and_search(api):
    deployments(3, replicas=1, prefix="chat")
    a_model("llama-7b")
    hosts = api.get("/api/v1/hosts?per_page=2&page=2&q=HOST")
    assert [h["name"] for h in hosts.json()] == ["chat-host-002"] and hosts["X-Total-Count"] == "3"
    assert hosts.json()[0]["gpus"][0]["replicas"][0]["deployment"] == "chat-002"
    models = api.get("/api/v1/models?q=llama")
    assert [m["name"] for m in models.json()] == ["llama-7b"] and models["X-Total-Count"] == "1"
    adapters = api.get("/api/v1/adapters?per_page=1&page=3")
    assert [(a["name"], a["deployment"]) for a in adapters.json()] == [("chat-002-lora", "chat-002")]
    assert adapters["X-Total-Count"] == "3"


def queries_for(api, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert api.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", ["/api/v1/deployments", "/api/v1/hosts", "/api/v1/adapters", "/api/v1/models"])
def test_a_pages_queries_do_not_grow_with_its_rows(api, url):
    deployments(2, replicas=1, prefix="few")
    api.get(url)  # the token's first use is recorded (then at most once a minute): not the page's cost
    few = queries_for(api, url)
    deployments(20, replicas=3, prefix="many")
    many = queries_for(api, url)
    assert many == few, f"{url}: {few} queries for 2 rows, {many} for 22"
    assert few <= 12  # auth, a count, the page, and one per prefetched relation


def test_a_listed_deployment_reads_as_the_single_one_does(api):
    deployments(1, replicas=2)
    listed = api.get("/api/v1/deployments").json()[0]
    single = api.get("/api/v1/deployments/dep-000").json()
    assert listed == single


def test_a_page_past_the_end_of_a_dashboard_list_shows_the_last_one():
    deployments(3, replicas=0)
    page, rows, note = page_within(Deployment.objects.all(), 5, 2, "dpage")
    assert page == Page(2, 2, 3) and [d.name for d in rows] == ["dep-002"]
    assert note == "dpage 5 is past the last page (2); showing page 2"
